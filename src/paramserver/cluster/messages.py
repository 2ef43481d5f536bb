"""The message vocabulary of the cluster (SPEC §7).

Every exchange is a request and one reply. The messages are plain frozen data (integers,
flags, strings, numpy arrays and dicts of arrays), so a transport only has to move them: the
local transport hands them over as they are (arrays are views of the sender's memory:
nothing is copied), a transport between processes serialises them field by field
(:mod:`paramserver.cluster.ray_wire`: a new message is a new dataclass here, nothing else).

Requests, worker → server (→ the reply):
    :class:`Get`      the values (or some rows of a table), once a version / staleness clock
                      is reached → :class:`Values`
    :class:`Update`   one worker's gradients of one step (dense, and rows of tables)
                      → :class:`Values`, once applied (with ``clip_norm``: → :class:`Norm`,
                      this server's part of the norm)
    :class:`Clip`     the step's global gradient norm (``clip_norm``) → :class:`Values`
    :class:`Leave`    a worker is gone from a step on → :class:`Ack`
Requests of a key-value store's clients (SPEC §10) to its servers
(:class:`~paramserver.cluster.keys.KeyServer`, one :class:`~.server.Server` per key piece):
    :class:`KeyInit`  hold this piece of a key (rank 0's value, or fill it) → :class:`Ack`
    :class:`KeyInits` several keys' KeyInits in one message (an init of a list) → :class:`Ack`
    :class:`Describe` a key's shape and type, once it is initialised → :class:`KeyInfo`
    :class:`DescribeKeys` several keys' → :class:`KeyInfos`
    :class:`Keyed`    a request (get, update, state) for one key's piece → its reply
    :class:`KeyBatch` a get or an update of several keys' pieces held by one server, their
                      values or gradients in one buffer (ps-lite's key ranges: one message
                      per server per call) → :class:`Values` (a get's, every key's values
                      one after the other) or :class:`Ack` (an update's, once applied)
    :class:`SetUpdater` the update method of every key → :class:`Ack`
    :class:`Barrier`  wait until every live worker has come to this barrier → :class:`Ack`
Request, server → master server (server groups):
    :class:`Sync`     the change since the last sync → :class:`Values` (the master's)
Requests, the run's driver → server (the life of the servers, the same on every backend):
    :class:`Put`      serve these values (or the values held) from this step → :class:`Ack`
    :class:`Flush`    sync with the master now (end of a run) → :class:`Ack`
    :class:`GetState` values, versions, updater state → :class:`State`
    :class:`SetState` check, and unless told not to load, such a state → :class:`Problems`
    :class:`Save`     write this server's checkpoint of a step → :class:`Ack`
    :class:`Restore`  serve from this server's checkpoint of a step → :class:`Ack`
Any request may instead be answered with :class:`ErrorReply`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

#: Where a request goes: (server group, server index within the group).
Address = tuple[int, int]


# -- worker → server ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Get:
    """Ask for the values once the server has reached ``version`` and every live worker
    group it serves has finished ``clock`` steps (bounded staleness; ``None``: no bound).

    Attributes:
        ids: with ``segment``, only these rows of that table segment (any order, repeats
            allowed): the reply's values are ``len(ids) × dim``, a copy.
        segment: the table segment ``ids`` index (its rows from 0 within this server).
        whole: the whole range; by default a server with tables answers with its dense part
            only (workers pull the rows they need), the driver asks for the whole.
        lag: in place of ``clock``, the asker's own group's clock less ``lag`` (a key-value
            client's bounded staleness: its group's pushes of the key, less the bound).
        after: (a key-value client's) answered only once every push the asker sent this
            server before it has been answered: a pull sent right behind a push, on a
            channel that keeps their order, sees the push applied without waiting for its
            reply first.
    """

    group: int
    worker: int
    step: int
    version: int = 0
    clock: int | None = None
    ids: np.ndarray | None = None
    segment: int = -1
    whole: bool = False
    lag: int | None = None
    after: bool = False


@dataclass(frozen=True, eq=False)
class Update:
    """One worker's gradients of one step for the server's range.

    Attributes:
        step: the step; -1 (a key-value client's push) for its group's next.
        grads: the gradients of the dense segments (the sum of every share already; the
            whole range when it holds no table), or ``None`` for a push that was dropped (a
            non-finite gradient under ``nonfinite: skip``; ``ids`` is then None too): the
            server counts the worker in for the step without its gradients.
        ids: the row-sparse gradients' row ids, the server's table segments one after the
            other (each part strictly increasing, rows from 0 within the segment), or None.
        rows: their rows, ``len(ids) × dim`` values.
        splits: the bounds of each table segment's part of ``ids`` (None: one table).
        codec: how ``grads`` and ``rows`` are compressed (:mod:`.compression`; ``""``: not),
            and ``ids`` are then varints.
        threshold: the 2-bit codes' value.
        count: the number of ids (needed to decode compressed ones).
        idle: None, or per dense segment of the server's range whether this worker's Param
            there got no gradient (torch's ``.grad is None``): a segment idle in every
            push of the step is not updated (SPEC section 5).
    """

    group: int
    worker: int
    step: int
    grads: np.ndarray | None
    ids: np.ndarray | None = None
    rows: np.ndarray | None = None
    splits: np.ndarray | None = None
    codec: str = ""
    threshold: float = 0.0
    count: int = 0
    idle: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Clip:
    """The global L2 norm of a step's gradients (``clip_norm``), from one worker of the
    group: the square root of the sum, in server order, of every server's :class:`Norm`.
    Every live worker of the group sends the same; the server then applies the step, its
    gradients scaled by :func:`~paramserver.numerics.norm.clip_factor` of it."""

    group: int
    worker: int
    step: int
    norm: float


@dataclass(frozen=True, eq=False)
class Leave:
    """Worker ``worker`` of group ``group`` sends no update for ``step`` or later."""

    group: int
    worker: int
    step: int


# -- server → master ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Sync:
    """A non-master server's change since its last sync (SINGA's server-group sync)."""

    server_group: int
    delta: np.ndarray


# -- driver → server ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Put:
    """Serve from ``step`` on: every worker group's clock starts there, every worker is live.

    Attributes:
        values: the server's range of values, kept as they are (inside one process the
            server then updates that very memory); ``None``: the values it holds.
        num_shares: per segment, the number of Params sharing it (SPEC §3).
        step: the training step the run starts at.
    """

    values: np.ndarray | None
    num_shares: np.ndarray
    step: int


@dataclass(frozen=True, eq=False)
class Flush:
    """A server of a group > 0 sends its change since its last sync to the master and takes
    the master's values (at the end of a run; a master server answers at once)."""

    step: int


@dataclass(frozen=True, eq=False)
class GetState:
    """Ask for the server's values, slice versions and updater state."""


@dataclass(frozen=True, eq=False)
class SetState:
    """Check ``arrays`` (keys as :class:`State` gives them) and, unless ``check_only``,
    load them when they fit; ``prefix`` is how the problems name the keys."""

    arrays: dict[str, np.ndarray]
    check_only: bool = False
    prefix: str = ""


@dataclass(frozen=True, eq=False)
class Save:
    """Write the server's checkpoint of ``step`` (values, updater state, versions) into its
    folder, atomically, keeping the newest few."""

    step: int


@dataclass(frozen=True, eq=False)
class Restore:
    """Take the values, updater state and versions of the server's checkpoint of ``step``
    and serve from that step (after a restart, or to roll back with a restarted one)."""

    step: int


# -- key-value clients → key servers ----------------------------------------------------------

@dataclass(frozen=True, eq=False)
class KeyInit:
    """Initialise a key: its description, and the piece this server holds.

    Attributes:
        key: the key's name (``str(key)``).
        shape, dtype: the whole value's.
        row_sparse: a table whose rows are pulled and pushed by id (sliced by rows).
        int_key: the key was an int (for :class:`KeyInfo`).
        home: this server keeps the key's description (and refuses a second init).
        piece: ``(lo, hi)``: the rows (a table) or values held here; None: none.
        values: the piece's values (flat, rank 0's), or None to fill it.
        fill: the init method (``init { }``'s JSON) that fills the piece on the server, as a
            fill of the whole key would (element ``i`` a function of the seed, the key's
            name and ``i``).
        seed: the fill's seed.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    row_sparse: bool
    int_key: bool
    home: bool
    piece: tuple[int, int] | None
    values: np.ndarray | None = None
    fill: str = ""
    seed: int = 0


@dataclass(frozen=True, eq=False)
class KeyInits:
    """Several keys' :class:`KeyInit` for one server in one message (an init of a list of
    keys: one message per server, not one per key). The server refuses the whole message
    (nothing made) when one of its keys is initialised already.

    Attributes:
        inits: per key, the fields of its :class:`KeyInit` but ``values``, as JSON: a list
            of ``[key, shape, dtype, row_sparse, int_key, home, piece, fill, seed]``.
        offsets: per key, the first and the end byte of its values in ``data`` (``len × 2``;
            the same for a key that is filled, or holds no piece here).
        data: every key's values' bytes, each part from a multiple of 8 bytes.
    """

    inits: str
    offsets: np.ndarray
    data: np.ndarray


@dataclass(frozen=True, eq=False)
class DescribeKeys:
    """What several keys are (:class:`Describe` of each, one message), answered once every
    one is initialised with :class:`KeyInfos`; ``wait`` as Describe's."""

    keys: str
    wait: bool = True


@dataclass(frozen=True, eq=False)
class Describe:
    """What a key is, once it is initialised (a worker that did not make it); ``wait``
    False: an error at once when it is not (a store with one worker)."""

    key: str
    wait: bool = True


@dataclass(frozen=True, eq=False)
class Keyed:
    """``request`` (a :class:`Get`, :class:`Update`, :class:`GetState` or
    :class:`SetState`) for the piece of ``key`` this server holds; waits for the key's
    init when it has not come yet."""

    key: str
    request: Get | Update | GetState | SetState


#: What joins the key names of a :class:`KeyBatch` (a key is printable text: never holds it).
KEY_SEPARATOR = "\n"


@dataclass(frozen=True, eq=False)
class KeyBatch:
    """``request`` (a :class:`Get`, or an :class:`Update`) for the pieces of ``keys`` this
    server holds, in one message: ps-lite's push or pull of the key ranges a server holds.
    Each key's piece is served as a :class:`Keyed` request would be (its rounds, versions
    and staleness); the reply comes once every key's has. A key may be a table's piece
    (``tables``): its part is rows by id — the rows pushed, or the rows asked for (the
    reply's values then hold those rows where the key's values would be).

    Attributes:
        keys: the key names, joined by :data:`KEY_SEPARATOR` (a key may come more than once
            in a get: each is answered).
        request: what is asked of each piece; an update's ``grads``, ``ids`` and ``rows``
            are None here (they are ``data`` and ``ids``).
        offsets: (an update) the bounds of each key's gradient (or rows) in ``data``
            (``len + 1``).
        data: (an update) every key's gradient or rows, one after the other, in one buffer.
        tables: None (every key's part is dense), or per key whether its part is rows by id.
        ids: the row ids of the table keys' parts, one after the other (each strictly
            increasing for an update, any order for a get; rows from 0 within the piece).
        id_offsets: the bounds of each key's part of ``ids`` (``len + 1``; a dense key's is
            empty).
    """

    keys: str
    request: Get | Update
    offsets: np.ndarray | None = None
    data: np.ndarray | None = None
    tables: np.ndarray | None = None
    ids: np.ndarray | None = None
    id_offsets: np.ndarray | None = None

    @property
    def names(self) -> list[str]:
        return self.keys.split(KEY_SEPARATOR)


@dataclass(frozen=True, eq=False)
class SetUpdater:
    """The update method of every key (``updater { }``'s JSON; ``""``: none, a push then
    replaces the values by the sum of the step's gradients, as MXNet's KVStore without an
    optimizer). Another method than the one held starts every key's state from zero."""

    updater: str


@dataclass(frozen=True, eq=False)
class Barrier:
    """Worker ``worker`` of ``group`` comes to its ``count``-th barrier; answered once every
    live worker has."""

    group: int
    worker: int
    count: int


Request = (Get | Update | Clip | Leave | Sync | Put | Flush | GetState | SetState | Save | Restore
           | KeyInit | KeyInits | Describe | DescribeKeys | Keyed | KeyBatch | SetUpdater
           | Barrier)


# -- replies -----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Values:
    """The values and the slice versions (the values a view of the server's memory inside
    one process; of the master's for a :class:`Sync`).

    ``applied`` (for an :class:`Update`) is False when every gradient of the step was
    dropped (nothing changed). ``bfloat16``: the values are bfloat16 numbers held in float32
    (``value_dtype: bfloat16``), so that between processes they travel as bfloat16, 2 bytes
    each (:mod:`~paramserver.cluster.ray_wire`).
    """

    values: np.ndarray
    versions: np.ndarray
    applied: bool = True
    bfloat16: bool = False


@dataclass(frozen=True, eq=False)
class Norm:
    """A server's part of the squared global gradient norm of a step (``clip_norm``): the
    sum of the squares of its range of the step's gradient (summed over the group's workers,
    scaled as the update scales it). The server holds the step until the :class:`Clip`."""

    sum_squares: float


@dataclass(frozen=True, eq=False)
class State:
    """A server's state as flat arrays: ``values``, ``versions``, ``state/<param>/<role>``."""

    arrays: dict[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class Problems:
    """What is wrong with a state given to :class:`SetState` (nothing: it fits)."""

    problems: list[str]


@dataclass(frozen=True, eq=False)
class Ack:
    pass


@dataclass(frozen=True, eq=False)
class ErrorReply:
    """The request failed, or the run was stopped; ``message`` says why. ``lost``: the server
    was lost (its process died) while the request waited."""

    message: str
    lost: bool = False


@dataclass(frozen=True, eq=False)
class KeyInfo:
    """A key's description (the reply to :class:`Describe`)."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    row_sparse: bool
    int_key: bool


@dataclass(frozen=True, eq=False)
class KeyInfos:
    """Several keys' descriptions (the reply to :class:`DescribeKeys`): a JSON list of
    ``[key, shape, dtype, row_sparse, int_key]``, in the order asked."""

    infos: str


Reply = Values | Norm | State | Problems | Ack | ErrorReply | KeyInfo | KeyInfos

#: Every message kind, by name (what a transport between processes sends).
KINDS: dict[str, type] = {cls.__name__: cls for cls in (
    Get, Update, Clip, Leave, Sync, Put, Flush, GetState, SetState, Save, Restore,
    KeyInit, KeyInits, Describe, DescribeKeys, Keyed, KeyBatch, SetUpdater, Barrier,
    Values, Norm, State, Problems, Ack, ErrorReply, KeyInfo, KeyInfos)}

#: Fields that hold a message themselves (sent as the tuple of that message).
NESTED = {"Keyed": ("request",), "KeyBatch": ("request",)}


def payload_bytes(message: Request | Reply) -> int:
    """The bytes of the arrays a message carries (what it costs on the wire, less a few
    bytes of fields)."""
    total = 0
    for f in fields(message):  # type: ignore[arg-type]
        v = getattr(message, f.name)
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, dict):
            total += sum(a.nbytes for a in v.values() if isinstance(a, np.ndarray))
        elif f.name in NESTED.get(type(message).__name__, ()):
            total += payload_bytes(v)
    return total

__all__ = [
    "KEY_SEPARATOR",
    "KINDS",
    "NESTED",
    "Ack",
    "Address",
    "Barrier",
    "Clip",
    "Describe",
    "DescribeKeys",
    "ErrorReply",
    "Flush",
    "Get",
    "GetState",
    "KeyBatch",
    "KeyInfo",
    "KeyInfos",
    "KeyInit",
    "KeyInits",
    "Keyed",
    "Leave",
    "Norm",
    "Problems",
    "Put",
    "Reply",
    "Request",
    "Restore",
    "Save",
    "SetState",
    "SetUpdater",
    "State",
    "Sync",
    "Update",
    "Values",
    "payload_bytes",
]
