"""The servers of a key-value store (SPEC §10): keys placed on servers, one Server per piece.

A key's value is placed on the servers by :func:`plan_key`, the same in every client (a pure
function of the key, its shape and the number of servers):

- a small value (fewer than ``bound`` values) lies whole on the key's *home* server
  (``key % num_servers`` for an int key, a CRC-32 of the name for a str key): small keys are
  spread over the servers;
- a large one is cut with SINGA's slicing (:func:`~.slicing.compute_slices`,
  :func:`~.slicing.partition_slices`) into one piece per server it lands on; a row-sparse
  table is cut at row boundaries (its rows are sliced, not its values).

A :class:`KeyServer` is one server of the store: for every piece it holds, a
:class:`~paramserver.cluster.server.Server` of one segment, so that each key has the
server's whole vocabulary of its own — rounds of a worker group's pushes (the sum of a
synchronous step's, or every push at once between asynchronous workers), a clock per worker
group (bounded staleness per key), versions, row-sparse pushes and pulls, its updater state
and its checks of non-finite gradients. It adds what keys need:

- :class:`~.messages.KeyInit`: a key's piece (rank 0's value, or a fill made here) and, on
  its home server, its description — a second init of a key is refused there;
- :class:`~.messages.Describe`: a key's description, answered once the key is initialised;
- :class:`~.messages.Keyed`: a request for one key's piece; one that comes before the key
  waits for it (the other workers' pushes and pulls may come before rank 0's init);
- :class:`~.messages.KeyBatch`: a get or an update of many keys' pieces in one message (one
  per server per call of a client): each piece is served as a ``Keyed`` request would be,
  and one reply (:class:`BatchReply`) answers once every piece's has; the dense pieces of a
  list of keys pushed again are held as one :class:`~.keygroup.KeyGroup` (one buffer, one
  updater call a step, one copy a pull) until anything else reaches one of them;
- :class:`~.messages.SetUpdater`: every key's update method (none: a push replaces the
  values by the sum of the step's gradients);
- :class:`~.messages.Barrier`: every live worker meets.

It answers the driver's requests of a run (put, get, leave, state) as a server holding no
range does, so that a :class:`~paramserver.cluster.driver.Driver` runs the store's workers as
it runs a cluster's.
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import ClusterConf, UpdaterConf
from ..paths import shown
from ..state import UpdaterState
from ..updaters import Updater, create_updater
from .errors import ClusterError
from .keygroup import KeyGroup
from .layout import ServerLayout
from .messages import (
    KEY_SEPARATOR,
    Ack,
    Barrier,
    Describe,
    DescribeKeys,
    ErrorReply,
    Flush,
    Get,
    GetState,
    KeyBatch,
    Keyed,
    KeyInfo,
    KeyInfos,
    KeyInit,
    KeyInits,
    Leave,
    Put,
    Reply,
    Request,
    SetUpdater,
    State,
    Update,
    Values,
)
from .passes import all_finite, sum_all, sum_rows
from .server import Server, failure_reply, server_name
from .slicing import compute_slices, partition_slices
from .transport import ReplyFn

#: Values below which a key lies whole on one server (MXNet's bigarray bound).
BOUND = 1_000_000


# -- placement ---------------------------------------------------------------------------------

#: The longest str key, in characters.
MAX_KEY_LENGTH = 1024
#: Int keys are below this (64-bit integers, as MXNet's and ps-lite's keys are).
MAX_INT_KEY = 2**63


def key_name(key: Any) -> tuple[str, bool]:
    """A key's name and whether it is an int key; refuses other types, and names a file
    could not hold: a str key is 1 to :data:`MAX_KEY_LENGTH` printable characters (no
    control characters, line separators or lone surrogates); an int key is in
    ``[0, 2**63)``."""
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        raise ParamError(f"a key must be an int or a str, not {type(key).__name__} "
                         f"({shown(repr(key))})")
    if isinstance(key, str):
        if not key:
            raise ParamError("a key must not be the empty string")
        if len(key) > MAX_KEY_LENGTH:
            raise ParamError(f"the key {shown(repr(key))} has {len(key):,} characters; a key "
                             f"has at most {MAX_KEY_LENGTH:,}")
        if not key.isprintable():
            bad = next(c for c in key if not c.isprintable())
            raise ParamError(f"the key {shown(repr(key))} holds the character "
                             f"{bad!a}, which does not print: a key is printable text "
                             "(no control characters, line separators or lone surrogates)")
        return key, False
    if not 0 <= key < MAX_INT_KEY:
        raise ParamError(f"an int key must be >= 0 and < 2**63, not {key}")
    return str(int(key)), True


def home_of(name: str, int_key: bool, num_servers: int) -> int:
    """The server that keeps a key's description (and a small key's value)."""
    n = int(name) if int_key else zlib.crc32(name.encode("utf-8"))
    return n % num_servers


def row_dim(shape: tuple[int, ...]) -> int:
    """Values per row of a table of ``shape`` (rows are the first dimension)."""
    return math.prod(int(d) for d in shape[1:])  # (ints: no NumPy call on every push)


def plan_key(name: str, int_key: bool, shape: tuple[int, ...], row_sparse: bool,
             num_servers: int, bound: int = BOUND) -> list[tuple[int, int, int]]:
    """Where a key's value lies: ``(server, lo, hi)`` per piece, in order; ``lo:hi`` are rows
    of a table, values of a dense key."""
    size = int(np.prod(shape, dtype=np.int64))
    units = int(shape[0]) if row_sparse and shape else size
    home = home_of(name, int_key, num_servers)
    if size < bound or num_servers == 1 or units <= 1:
        return [(home, 0, units)]
    pieces = compute_slices([units], num_servers)[0]
    where = partition_slices(pieces, num_servers)
    out: list[tuple[int, int, int]] = []
    lo = 0
    for size_, server in zip(pieces, where, strict=True):
        if out and out[-1][0] == server:
            out[-1] = (server, out[-1][1], lo + size_)
        else:
            out.append((server, lo, lo + size_))
        lo += size_
    return out


def piece_layout(index: int, name: str, shape: tuple[int, ...], dtype: Any,
                 row_sparse: bool, lo: int, hi: int) -> ServerLayout:
    """The layout of a key's piece on server ``index``: one segment (a table's rows
    ``lo:hi``, or values ``lo:hi``), one slice."""
    dim = row_dim(shape) if row_sparse else 0
    size = (hi - lo) * (dim or 1)
    one = np.zeros(1, np.int64)
    return ServerLayout(index=index, start=0, stop=size, slice_ids=one.copy(),
                        slice_offsets=np.array([0, size], np.int64), slice_owners=one.copy(),
                        offsets=np.array([0, size], np.int64), owners=one.copy(),
                        names=(name,), lr_scale=np.ones(1), wd_scale=np.ones(1),
                        dtype=np.dtype(dtype), row_dims=np.array([dim], np.int64),
                        first_rows=np.array([lo if row_sparse else 0], np.int64))


def empty_layout(index: int, dtype: Any = np.float32) -> ServerLayout:
    """A range of nothing: what a key server shows the driver of a run."""
    none = np.zeros(0, np.int64)
    return ServerLayout(index=index, start=0, stop=0, slice_ids=none, slice_offsets=np.zeros(
        1, np.int64), slice_owners=none, offsets=np.zeros(1, np.int64), owners=none, names=(),
        lr_scale=np.zeros(0), wd_scale=np.zeros(0), dtype=np.dtype(dtype))


# -- no update method ---------------------------------------------------------------------------

class Replace(Updater):
    """No update method: a step's (summed) gradient becomes the values, as MXNet's KVStore
    does without an optimizer. Its configuration is the default one; it keeps no state."""

    def __init__(self) -> None:
        super().__init__(UpdaterConf())

    def _run(self, w: np.ndarray, g: np.ndarray, state: UpdaterState, lr: np.ndarray,
             wd: np.ndarray, gscale: np.ndarray, check: bool = False,
             bf16_values: np.ndarray | None = None, skip: np.ndarray | None = None) -> int:
        # bf16_values: never given (its configuration keeps float32 values, no master copy)
        nonfinite = int(g.size - np.count_nonzero(np.isfinite(g)))
        if check and nonfinite:
            return nonfinite
        off = state.offsets
        for i in range(state.num_segments):
            if skip is None or not skip[i]:
                self._segment(w[off[i]:off[i + 1]], g[off[i]:off[i + 1]], float(gscale[i]))
        return nonfinite

    def apply(self, step: int, values: np.ndarray, grads: np.ndarray, state: UpdaterState,
              lr_scale: np.ndarray | float = 1.0, wd_scale: np.ndarray | float = 1.0,
              grad_scale: np.ndarray | float = 1.0, *, refuse_nonfinite: bool = False,
              grad_norm: float | None = None, skip: np.ndarray | None = None) -> int:
        """:meth:`Updater.apply`; for one segment (a key's piece) without the per-segment
        arrays of rates it does not use (a key-value store updates many small keys), and
        reading the gradient for NaN and Inf only to refuse them (``refuse_nonfinite``;
        else it returns 0: its callers check the sums of several gradients themselves)."""
        if (skip is not None or state.num_segments != 1 or values.shape != (state.size,)
                or values.shape != grads.shape or self.conf.clip_norm > 0):
            return super().apply(step, values, grads, state, lr_scale, wd_scale, grad_scale,
                                 refuse_nonfinite=refuse_nonfinite, grad_norm=grad_norm,
                                 skip=skip)
        if refuse_nonfinite:
            nonfinite = int(grads.size - np.count_nonzero(np.isfinite(grads)))
            if nonfinite:
                return nonfinite
        np.add(state.counts, 1, out=state.counts)
        gscale = (grad_scale if isinstance(grad_scale, (int, float))
                  else np.asarray(grad_scale).flat[0])
        self._segment(values, grads, float(gscale))
        return 0

    def _segment(self, w: np.ndarray, g: np.ndarray, gscale: float) -> None:
        """One segment's update: the values become the scaled gradient."""
        if gscale == 1:
            np.copyto(w, g)
        else:
            np.multiply(g, w.dtype.type(gscale), out=w)

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        # read for NaN and Inf only to refuse them (else 0, as apply: the server checked
        # the step's rows as it summed them)
        from ..numerics.rows import replace

        found = replace(w, g.reshape(-1), ids, dim, gscale, check=check)
        return found if check else 0


#: How the updater text of a Python function (``set_updater(fn)``) begins: not a
#: declaration, so never sent, saved or parsed.
FUNCTION = "<python function"


def updater_text_of(fn: Callable[..., Any]) -> str:
    """The updater text that names a Python function (see :data:`FUNCTION`)."""
    return f"{FUNCTION} {getattr(fn, '__qualname__', type(fn).__name__)}>"


class FunctionUpdater(Replace):
    """A Python function as the update method of one key, MXNet's ``set_updater(fn)``:
    ``fn(key, input, stored)`` changes ``stored`` (the piece's values, in place) from
    ``input`` (the sum of the step's pushes). In-process only (the function is not data:
    it never travels); no state of its own."""

    def __init__(self, fn: Callable[[Any, np.ndarray, np.ndarray], None], key: Any,
                 shape: tuple[int, ...] | None):
        super().__init__()
        self.fn, self.key, self.shape = fn, key, shape

    def _segment(self, w: np.ndarray, g: np.ndarray, gscale: float) -> None:
        given = g.copy() if gscale == 1 else g * w.dtype.type(gscale)
        stored = w
        if self.shape is not None and stored.size == int(np.prod(self.shape)):
            given, stored = given.reshape(self.shape), stored.reshape(self.shape)
        self.fn(self.key, given, stored)

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        # the rows gathered, given to the function, put back (Updater's own)
        return Updater._run_rows(self, w, g, ids, dim, state, lr, wd, gscale, check)


def updater_text(updater: Updater | None) -> str:
    """The JSON of an updater's configuration ("" for none)."""
    return "" if updater is None or isinstance(updater, Replace) else updater.conf.to_json()


def make_updater(text: str) -> Updater:
    """The updater of a :class:`~.messages.SetUpdater` (its JSON; "" for none)."""
    return create_updater(json.loads(text)) if text else Replace()


def fill_piece(fill: str, name: str, shape: tuple[int, ...], out: np.ndarray, offset: int,
               seed: int) -> None:
    """Fill ``out``, the values ``offset:offset + out.size`` of a key, as the init method
    ``fill`` (JSON) fills the whole key (element ``i`` a function of the seed, the name, i)."""
    from ..init import create_param_generator, fill_range

    fill_range(create_param_generator(json.loads(fill)), name, shape, out, offset, seed)


# -- the server ---------------------------------------------------------------------------------

class KeyServer:
    """Server ``index`` of a key-value store; see the module docstring.

    Args:
        index: its index among the store's servers.
        conf: the store's cluster configuration (workers, groups, timeout, staleness).
        updater: the update method's JSON ("" for none).
    """

    def __init__(self, index: int, conf: ClusterConf, updater: str = ""):
        self.index = index
        self.conf = conf
        self.name = server_name(index, 0, 1)
        self.layout = empty_layout(index)
        self._updater_text = updater
        self._updater = make_updater(updater)
        self._function: Callable[[Any, np.ndarray, np.ndarray], None] | None = None
        self._keys: dict[str, Server] = {}
        self._meta: dict[str, KeyInfo] = {}
        self._held: dict[str, KeyInfo] = {}  # the keys of the pieces held here
        self._waiting: dict[str, list[tuple[Request, ReplyFn]]] = {}
        self._gone: dict[tuple[int, int], int] = {}
        self._barriers: dict[int, tuple[set[tuple[int, int]], list[ReplyFn]]] = {}
        self._batches: dict[int, _HeldBatch] = {}  # per worker group, its pushes held
        self._groups: dict[str, KeyGroup] = {}  # by list of keys, the groups made
        self._seen: dict[str, int] = {}  # by list of keys, batches of it applied key by key
        self._short: dict[str, int] = {}  # by list of keys, its groups released early
        self._aborted: str | None = None
        # requests handed to a piece's server and not yet taken by it (they go outside this
        # lock): a piece with one on its way is not held in a batch, whatever it says now
        self._sending: dict[Server, int] = {}
        # by worker (group, index): its pushes taken and not yet answered, and its gets
        # sent behind them (Get.after), held until they are
        self._pushing: dict[tuple[int, int], int] = {}
        self._behind: dict[tuple[int, int], list[tuple[Request, ReplyFn]]] = {}
        self._lock = threading.Lock()

    @property
    def keys(self) -> dict[str, Server]:
        """The servers of the pieces held, by key name."""
        return dict(self._keys)

    def connect(self, send: Callable[..., Any]) -> None:
        """(Server groups are not a key-value store's: nothing to connect.)"""

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Request, reply: ReplyFn) -> None:
        """Handle one request; ``reply`` is called once, now or later."""
        out: list[tuple[ReplyFn, Reply]] = []
        forward: list[tuple[Server, Request, ReplyFn]] = []
        asked = _worker_of(request)
        with self._lock:
            if asked is not None:
                asker, message = asked
                if isinstance(message, Update):
                    self._pushing[asker] = self._pushing.get(asker, 0) + 1
                    reply = self._counted(asker, reply)
                elif message.after and self._pushing.get(asker):
                    self._behind.setdefault(asker, []).append((request, reply))
                    return
            try:
                out = self._dispatch(request, reply, forward)
            except Exception as e:  # the sender hears of it
                out = [(reply, failure_reply(self.name, request, e))]
            sending = self._sending
            for server, _, _ in forward:
                sending[server] = sending.get(server, 0) + 1
        for fn, answer in out:  # outside the lock: a reply may run the caller's code
            fn(answer)
        for server, inner, fn in forward:  # a key's own server, with its own lock
            try:
                server.handle(inner, fn)
            finally:
                with self._lock:
                    left = sending[server] - 1
                    if left:
                        sending[server] = left
                    else:
                        del sending[server]

    def _counted(self, asker: tuple[int, int], reply: ReplyFn) -> ReplyFn:
        """``reply`` to a push of ``asker``'s, which then lets its gets held behind the
        push go on once none of its pushes waits for an answer (called outside the lock,
        as every reply)."""

        def answer(r: Reply) -> None:
            with self._lock:
                left = self._pushing.get(asker, 0) - 1
                if left > 0:
                    self._pushing[asker] = left
                    behind: list[tuple[Request, ReplyFn]] = []
                else:
                    self._pushing.pop(asker, None)
                    behind = self._behind.pop(asker, [])
            reply(r)
            for request, fn in behind:
                self.handle(request, fn)

        return answer

    def _on_the_way(self, servers: list[Server],
                    forward: list[tuple[Server, Request, ReplyFn]]) -> bool:
        """Whether a request is on its way to one of ``servers`` (handed over by another
        thread, or by this request before now): such a piece's state is not yet what it
        will be, so its pushes are not held in a batch (they go key by key, after it)."""
        if not self._sending and not forward:
            return False
        busy = self._sending.keys() | {s for s, _, _ in forward}
        return any(s in busy for s in servers)

    def _dispatch(self, request: Request, reply: ReplyFn,
                  forward: list[tuple[Server, Request, ReplyFn]]
                  ) -> list[tuple[ReplyFn, Reply]]:
        if isinstance(request, Keyed):
            if self._aborted is not None:
                return [(reply, ErrorReply(self._aborted))]
            if isinstance(request.request, Update):  # a key's own push: after the batches
                self._spill(forward)
            server = self._keys.get(request.key)
            if server is None:
                self._waiting.setdefault(request.key, []).append((request, reply))
            else:
                forward.append((server, request.request, reply))
            return []
        if isinstance(request, KeyBatch):
            if self._aborted is not None:
                return [(reply, ErrorReply(self._aborted))]
            if isinstance(request.request, Update):
                summed = self._batch_push(request, reply, forward)
                if summed is not None:
                    return summed
            else:
                values = self._batch_get(request)
                if values is not None:
                    return [(reply, values)]
            self._fan_out(request, reply, forward)
            return []
        if isinstance(request, Describe):
            if self._aborted is not None:
                return [(reply, ErrorReply(self._aborted))]
            info = self._meta.get(request.key)
            if info is None and not request.wait:
                raise ClusterError(f"key '{request.key}' is not initialised (init it first)")
            if info is None:
                self._waiting.setdefault(request.key, []).append((request, reply))
                return []
            return [(reply, info)]
        if isinstance(request, KeyInit):
            return self._init(request, reply, forward)
        if isinstance(request, KeyInits):
            return self._inits(request, reply, forward)
        if isinstance(request, DescribeKeys):
            if self._aborted is not None:
                return [(reply, ErrorReply(self._aborted))]
            return self._describe_keys(request, reply)
        if isinstance(request, SetUpdater):
            if request.updater != self._updater_text:
                updater = make_updater(request.updater)
                for server in self._keys.values():
                    server.set_updater(updater)
                self._updater, self._updater_text = updater, request.updater
                self._function = None
            return [(reply, Ack())]
        if isinstance(request, Barrier):
            return self._barrier(request, reply)
        if isinstance(request, Leave):
            self._spill(forward)  # each key's server counts the worker out of its step
            self._gone[(request.group, request.worker)] = request.step
            for server in self._keys.values():
                forward.append((server, request, _ignore))
            return [(reply, Ack()), *self._ready_barriers()]
        if isinstance(request, Put):  # a run begins: every worker is live, nothing waits
            self._gone.clear()
            self._aborted = None
            out: list[tuple[ReplyFn, Reply]] = self._drop_batches("a new run began")
            out.append((reply, Ack()))
            for server in self._keys.values():
                out += server.revive()
            return out
        if isinstance(request, Get):  # the driver's: no range
            return [(reply, Values(np.zeros(0, np.float32), np.zeros(0, np.int64)))]
        if isinstance(request, GetState):  # the driver's (no range), and a list of keys
            arrays = {"versions": np.zeros(0, np.int64),
                      "updater": np.frombuffer(self._updater_text.encode(), np.uint8).copy()}
            arrays.update((f"key/{name}", np.array(info.shape, np.int64))
                          for name, info in self._meta.items())
            return [(reply, State(arrays))]
        if isinstance(request, Flush):
            return [(reply, Ack())]
        raise ClusterError(f"a key-value store's server does not take a "
                           f"{type(request).__name__}")

    # -- batches ----------------------------------------------------------------------------

    def _fan_out(self, msg: KeyBatch, reply: ReplyFn,
                 forward: list[tuple[Server, Request, ReplyFn]]) -> None:
        """A batch as one request per key's piece, to each piece's server (or waiting for
        the key's init), answered once all are (:class:`BatchReply`)."""
        batch = BatchReply(msg, reply)
        for i, name in enumerate(batch.names):
            inner, fn = batch.piece(i), batch.reply_of(i)
            server = self._keys.get(name)
            if server is None:
                self._waiting.setdefault(name, []).append((Keyed(name, inner), fn))
            else:
                forward.append((server, inner, fn))

    def _batch_get(self, msg: KeyBatch) -> Values | None:
        """A batch of gets answered at once, every key's values copied into one buffer —
        when no get has to wait (no version, clock or staleness bound to reach) and every
        key's piece is here and serving; else None (key by key)."""
        get = msg.request
        if not isinstance(get, Get) or get.ids is not None or get.lag is not None \
                or get.clock is not None or get.version > 0:
            return None
        group = self._groups.get(msg.keys)
        if group is not None and group.alive and msg.tables is None:
            # one list of keys held as one: its buffer (a copy unless this store has one
            # worker, whose next push cannot come before it has read its pull)
            values = group.values
            if self.conf.nworker_groups * self.conf.nworkers_per_group > 1:
                values = _own(values.copy())
            return Values(values, group.versions.copy())
        names = msg.names
        servers = [self._keys.get(n) for n in names]
        for s in servers:
            if s is None or not s.serving:
                return None
        versions = np.concatenate([s.versions for s in servers])  # type: ignore[union-attr]
        if msg.tables is not None:
            return self._batch_rows(msg, servers, versions)  # type: ignore[arg-type]
        pieces = [s.values for s in servers]  # type: ignore[union-attr]
        # one piece: its values as they are, as a key's own get answers (a transport between
        # processes copies them as it sends the reply); several: one copy, in one buffer
        return Values(pieces[0] if len(pieces) == 1 else _own(np.concatenate(pieces)),  # type: ignore[arg-type]
                      versions)

    def rows_into(self, key: str, ids: np.ndarray, out: np.ndarray) -> bool:
        """In one process: rows ``ids`` of the table piece of ``key`` gathered straight
        into ``out`` (``len(ids) × dim``, the table's dtype), as a get of them would answer
        at once. False, with nothing written, when that get would not be answered at once
        or an id is outside the piece (the get then goes as a message, which says why)."""
        with self._lock:
            s = self._keys.get(key)
            if (self._aborted is not None or s is None or not s.serving or s.values is None
                    or not s.layout.tables or s.layout.num_segments != 1
                    or s.values.dtype != out.dtype):
                return False
            dim = int(s.layout.dims[0])
            table = s.values.reshape(-1, dim)
            if (out.shape != (ids.size, dim) or (ids.size and (
                    int(ids[0]) < 0 or int(ids[-1]) >= len(table)))):
                return False  # (ids are sorted: the first and the last bound them)
            np.take(table, ids, axis=0, mode="clip", out=out)
            return True

    def push_rows(self, key: str, group: int, worker: int, ids: np.ndarray, rows: np.ndarray
                  ) -> bool:
        """In one process, from a group's only live worker: rows ``rows`` of ids ``ids``
        (strictly increasing and in the piece: the store coalesced them) of the table piece
        of ``key`` applied at once, as a batch of that push alone would be (found finite,
        then :meth:`Server.apply_summed`), without the batch's message, its checks and its
        reply (measured: a push of 4,096 rows of 64 into a table of 1M took 0.27 ms against
        the message's 0.39, medians of 580 interleaved pushes, twice). False, with
        nothing written, when that batch would not be applied at once, or a row is not
        finite: the push then goes as a message, whose path says why."""
        ready: list[tuple[ReplyFn, Reply]] = []
        with self._lock:
            s = self._keys.get(key)
            if (self._aborted is not None or s is None or s.values is None or self._batches
                    or self._pushing.get((group, worker)) or self._live_of(group) != {worker}
                    or s.values.dtype != rows.dtype or not s.takes_summed(group, True)
                    or rows.shape != (ids.size, int(s.layout.dims[0]))
                    or self._on_the_way([s], []) or not all_finite(rows.reshape(-1))):
                return False
            try:
                ready = s.apply_summed(group, rows, ids)
            except Exception as e:  # as the batch's pusher would hear of it
                raise ClusterError(failure_reply(self.name, Update(group, worker, -1, None),
                                                 e).message) from e
        for fn, answer in ready:  # outside the lock, as every reply
            fn(answer)
        return True

    def _batch_rows(self, msg: KeyBatch, servers: list[Server], versions: np.ndarray
                    ) -> Values | None:
        """A batch's gets of rows (and whole pieces) gathered into one buffer, each table's
        rows taken in one pass; None when an id is outside its piece (key by key: that
        key's server says which)."""
        tables, bounds = batch_tables(msg, len(servers))
        assert tables is not None and bounds is not None and msg.ids is not None
        ids = msg.ids
        parts: list[tuple[np.ndarray, np.ndarray | None, int]] = []
        total = 0
        for i, s in enumerate(servers):
            values = s.values
            assert values is not None
            if not tables[i]:
                parts.append((values, None, 0))
                total += values.size
                continue
            if not s.layout.tables or s.layout.num_segments != 1:
                return None
            dim = int(s.layout.dims[0])
            part = ids[bounds[i]:bounds[i + 1]]
            table = values.reshape(-1, dim)
            if part.size and (int(part.min()) < 0 or int(part.max()) >= len(table)):
                return None
            parts.append((table, part, dim))
            total += part.size * dim
        dtype = servers[0].values.dtype  # type: ignore[union-attr]
        if any(v.dtype != dtype for v, _, _ in parts):
            return None
        out = np.empty(total, dtype)
        at = 0
        for src, sel, dim in parts:
            if sel is None:
                out[at:at + src.size] = src
                at += src.size
            else:  # the ids are in range (checked above): no bounds check per row
                np.take(src, sel, axis=0, mode="clip",
                        out=out[at:at + sel.size * dim].reshape(sel.size, dim))
                at += sel.size * dim
        return Values(_own(out), versions)

    def _batch_push(self, msg: KeyBatch, reply: ReplyFn,
                    forward: list[tuple[Server, Request, ReplyFn]]
                    ) -> list[tuple[ReplyFn, Reply]] | None:
        """A batch of pushes taken whole: held until every live worker of the group has
        pushed the same keys, then summed in worker order (a dense key's gradients, a
        table's rows per id) and given to each key's server (:meth:`Server.apply_summed`)
        — what each key's server would have done with the pushes one by one, without a
        request per key. None when the batch must go key by key (a key's server has a step
        open, a get waiting, or is not a plain piece of one segment; the keys are not
        initialised yet; a bad buffer or row id: that key's server then says why)."""
        r = msg.request
        assert isinstance(r, Update)
        g, w = r.group, r.worker
        live = self._live_of(g)
        if w not in live:
            return None
        held = self._batches.get(g)
        if held is not None and (held.keys != msg.keys or w in held.pushes):
            self._spill(forward)
            held = None
        if held is None:
            if (msg.data is None or msg.offsets is None or r.grads is not None or r.codec
                    or r.ids is not None):
                return None
            group = self._groups.get(msg.keys) if msg.tables is None else None
            if (group is not None and group.alive and g in group.clocks
                    and msg.data.dtype == group.values.dtype
                    and not self._on_the_way(group.servers, forward)):
                held = _HeldBatch(msg.keys, group.servers, group.bounds, group)
            else:
                held = self._hold(msg, g, forward)
                if held is None:
                    return None
            self._batches[g] = held
        parts = held.parts_of(msg)
        if parts is None:  # key by key, with the pushes held before it
            if held.pushes:
                self._spill(forward)
            else:
                del self._batches[g]
            return None
        held.pushes[w] = (msg, reply)
        held.parts[w] = parts
        if held.pushes.keys() >= live:
            return self._apply_batch(g, forward)
        return []

    def _hold(self, msg: KeyBatch, g: int, forward: list[tuple[Server, Request, ReplyFn]]
              ) -> _HeldBatch | None:
        """A batch of keys for the pushes of a round of group ``g``, when every key's piece
        takes a summed step (else None: key by key); from the second batch of one list of
        dense keys on, its pieces held as one :class:`~.keygroup.KeyGroup`. Each push is
        then checked against it (:meth:`_HeldBatch.parts_of`)."""
        assert msg.data is not None and msg.offsets is not None
        names = msg.names
        flags: list[bool] | None = None  # checked with each push (_HeldBatch.parts_of)
        if msg.tables is not None:
            tables = np.asarray(msg.tables)
            if tables.dtype != np.bool_ or tables.shape != (len(names),):
                return None  # key by key: that path says what is wrong
            flags = tables.tolist()
        servers = [self._keys.get(n) for n in names]
        dtype = msg.data.dtype
        for i, s in enumerate(servers):
            if (s is None or s.values is None or s.values.dtype != dtype
                    or not s.takes_summed(g, flags is not None and flags[i])):
                return None
        if self._on_the_way(servers, forward):  # type: ignore[arg-type]
            return None
        keys = msg.keys
        if flags is None:
            bounds = np.asarray(msg.offsets, np.int64).tolist()
            if len(bounds) != len(names) + 1 or any(
                    s.values.size != b - a  # type: ignore[union-attr]
                    for s, a, b in zip(servers, bounds, bounds[1:], strict=False)):
                return None
            group = self._group_of(keys, servers, bounds)  # type: ignore[arg-type]
            return _HeldBatch(keys, servers, bounds, group)  # type: ignore[arg-type]
        return _HeldBatch(keys, servers, [], None, flags)  # type: ignore[arg-type]

    #: A list of keys whose groups were made again with a copy (another list took their
    #: pieces) this many times in a row, each released before its second step, is not
    #: held as a group again (key by key is then cheaper). Made again over the buffers
    #: it left (a key's own request released it) costs no copy: always.
    SHORT_LIVED = 3
    #: Lists of keys a server remembers having seen once, or releasing early (more: it
    #: forgets them, and counts again).
    LISTS_KEPT = 256

    def _group_of(self, keys: str, servers: list[Server], bounds: list[int]
                  ) -> KeyGroup | None:
        """The pieces of a list of keys held as one group, made on the second batch of
        that list (a list pushed once is not worth the copy); None: key by key."""
        if len(servers) < 2 or self._function is not None:
            return None
        before = self._groups.get(keys)
        if before is None:
            seen = self._seen.get(keys, 0)
            if seen < 1:
                if len(self._seen) >= self.LISTS_KEPT:  # lists pushed once: forget them
                    self._seen.clear()
                self._seen[keys] = seen + 1
                return None
        elif not before.holds_views():  # made again with a copy: not when that keeps
            short = self._short.get(keys, 0) + 1 if before.steps < 2 else 0  # failing
            if len(self._short) >= self.LISTS_KEPT:
                self._short.clear()
            self._short[keys] = short
            if short >= self.SHORT_LIVED:
                return None
        group = KeyGroup.make(keys, servers, bounds, self._updater,
                              type(self._updater) is Replace, before)
        if group is not None:
            self._groups[keys] = group
            self._seen.pop(keys, None)
            # groups whose pieces another group took since are no use: drop them
            for k in [k for k, old in self._groups.items() if not old.alive
                      and not old.holds_views()]:
                del self._groups[k]
        return group

    def _apply_batch(self, group: int, forward: list[tuple[Server, Request, ReplyFn]]
                     ) -> list[tuple[ReplyFn, Reply]]:
        held = self._batches.pop(group)
        if held.tables is not None:
            return self._apply_rows_batch(held, group, forward)
        total, ok = _summed([held.pushes[w][0].data for w in sorted(held.pushes)])
        if not ok:  # key by key: each key's server refuses or skips it, and says why
            self._batches[group] = held
            self._spill(forward)
            return []
        bounds = held.bounds
        replies = [fn for _, fn in held.pushes.values()]
        if held.group is not None:
            if held.group.apply(group, total):
                ack = Ack()
                return [(fn, ack) for fn in replies]
            # released since the round began (a key's own request came): key by key
            self._batches[group] = held
            self._spill(forward)
            return []
        return self._give(held, group, [(total[bounds[i]:bounds[i + 1]], None)
                                        for i in range(len(held.servers))])

    def _apply_rows_batch(self, held: _HeldBatch, group: int,
                          forward: list[tuple[Server, Request, ReplyFn]]
                          ) -> list[tuple[ReplyFn, Reply]]:
        """A held batch with tables: each key's pushes summed on their own (a dense key's
        in worker order, a table's rows per id), all found finite, then given to each
        key's server; else key by key (each key's server refuses or skips, and says why)."""
        workers = sorted(held.pushes)
        steps: list[tuple[np.ndarray, np.ndarray | None]] = []
        for i, (server, table) in enumerate(zip(held.servers, held.tables,  # type: ignore[arg-type]
                                                strict=True)):
            parts = [held.parts[w][i] for w in workers]
            ids = None
            if table:
                assert server.values is not None
                ids, total, ok = sum_rows(parts,  # type: ignore[arg-type]
                                          int(server.layout.dims[0]), server.values.dtype)
            else:
                total, ok = _summed([d for _, d in parts])
            if not ok:
                self._batches[group] = held
                self._spill(forward)
                return []
            steps.append((total, ids))
        return self._give(held, group, steps)

    def _give(self, held: _HeldBatch, group: int,
              steps: list[tuple[np.ndarray, np.ndarray | None]]
              ) -> list[tuple[ReplyFn, Reply]]:
        """Each key's summed step to its server; every pusher hears the same answer."""
        out: list[tuple[ReplyFn, Reply]] = []
        replies = [fn for _, fn in held.pushes.values()]
        try:
            for server, (total, ids) in zip(held.servers, steps, strict=True):
                out += server.apply_summed(group, total, ids)
        except Exception as e:  # every pusher hears of it
            error = failure_reply(self.name, held.pushes[min(held.pushes)][0], e)
            return [*out, *((fn, error) for fn in replies)]
        ack = Ack()
        return [*out, *((fn, ack) for fn in replies)]

    def _spill(self, forward: list[tuple[Server, Request, ReplyFn]]) -> None:
        """Hand the held batches to each key's server, push by push in worker order (what
        comes next then follows them there)."""
        for group in sorted(self._batches):
            held = self._batches.pop(group)
            for w in sorted(held.pushes):
                msg, fn = held.pushes[w]
                self._fan_out(msg, fn, forward)

    def _drop_batches(self, reason: str, lost: bool = False) -> list[tuple[ReplyFn, Reply]]:
        error = ErrorReply(reason, lost)
        out: list[tuple[ReplyFn, Reply]] = [
            (fn, error) for held in self._batches.values() for _, fn in held.pushes.values()]
        self._batches = {}
        return out

    def _live_of(self, group: int) -> set[int]:
        c = self.conf
        if not 0 <= group < c.nworker_groups:
            return set()
        return {w for w in range(c.nworkers_per_group) if (group, w) not in self._gone}

    def _init(self, msg: KeyInit, reply: ReplyFn, forward: list[tuple[Server, Request, ReplyFn]]
              ) -> list[tuple[ReplyFn, Reply]]:
        shape = tuple(int(x) for x in msg.shape)
        info = KeyInfo(msg.key, shape, str(np.dtype(msg.dtype)), bool(msg.row_sparse),
                       bool(msg.int_key))
        if msg.home and msg.key in self._meta:
            raise ClusterError(f"key '{msg.key}' is initialised already (a second init of a "
                               "key is an error)")
        if msg.piece is not None and msg.key in self._keys:
            raise ClusterError(f"key '{msg.key}' has a piece here already (a second init)")
        server = None
        if msg.piece is not None:
            lo, hi = (int(x) for x in msg.piece)
            layout = piece_layout(self.index, msg.key, shape, msg.dtype, msg.row_sparse, lo, hi)
            values = self._values(msg, layout, lo)
            self._held[msg.key] = info
            server = Server(layout, self._updater_of(msg.key), self.conf, 0, None,
                            average=False)
            server.handle(Put(values, np.ones(1, np.int64), 0), _ignore)
            for (g, w), step in sorted(self._gone.items()):
                server.handle(Leave(g, w, step), _ignore)
        if msg.home:
            self._meta[msg.key] = info
        if server is not None:
            self._keys[msg.key] = server
        out: list[tuple[ReplyFn, Reply]] = [(reply, Ack())]
        still = []
        for request, fn in self._waiting.pop(msg.key, []):
            if isinstance(request, Describe) and msg.key in self._meta:
                out.append((fn, self._meta[msg.key]))
            elif isinstance(request, Keyed) and server is not None:
                forward.append((server, request.request, fn))
            else:
                still.append((request, fn))
        if still:
            self._waiting[msg.key] = still
        return out

    def _inits(self, msg: KeyInits, reply: ReplyFn,
               forward: list[tuple[Server, Request, ReplyFn]]) -> list[tuple[ReplyFn, Reply]]:
        """Several keys' inits: every one checked first (a second init refuses the message,
        nothing made), then each as its own :class:`KeyInit`."""
        try:
            entries = json.loads(msg.inits)
            spans = np.asarray(msg.offsets, np.int64)
            data = np.asarray(msg.data)
            if (not isinstance(entries, list) or spans.shape != (len(entries), 2)
                    or data.dtype != np.uint8 or data.ndim != 1 or np.any(spans < 0)
                    or np.any(spans[:, 1] < spans[:, 0]) or np.any(spans > data.size)):
                raise ClusterError("a damaged init of several keys (its parts do not fit "
                                   "its buffer)")
            inits = []
            for (a, b), (key, shape, dtype, sparse, int_key, home, piece, fill, seed) in \
                    zip(spans.tolist(), entries, strict=True):
                values = data[a:b].view(np.dtype(dtype)) if b > a else None
                inits.append(KeyInit(str(key), tuple(int(x) for x in shape), str(dtype),
                                     bool(sparse), bool(int_key), bool(home),
                                     None if piece is None else (int(piece[0]), int(piece[1])),
                                     values, str(fill), int(seed)))
        except (TypeError, ValueError) as e:
            raise ClusterError(f"a damaged init of several keys ({e})") from None
        names = [m.key for m in inits]
        again = sorted({m.key for m in inits if (m.home and m.key in self._meta)
                        or (m.piece is not None and m.key in self._keys)})
        if again or len(set(names)) != len(names):
            which = again or sorted({n for n in names if names.count(n) > 1})
            raise ClusterError(f"key '{which[0]}' is initialised already (a second init of a "
                               "key is an error)")
        out: list[tuple[ReplyFn, Reply]] = []
        for m in inits:
            out += self._init(m, _ignore, forward)
        return [*out, (reply, Ack())]

    def _describe_keys(self, msg: DescribeKeys, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        """Several keys' descriptions, answered once every key is initialised."""
        names = msg.keys.split(KEY_SEPARATOR)
        missing = [n for n in names if n not in self._meta]
        if missing and not msg.wait:
            raise ClusterError(f"key '{missing[0]}' is not initialised (init it first)")
        infos = _Infos(names, reply)
        out: list[tuple[ReplyFn, Reply]] = []
        for i, name in enumerate(names):
            if name in self._meta:
                out += infos.answered(i, self._meta[name])  # the last one: the reply
            else:
                self._waiting.setdefault(name, []).append((Describe(name), infos.reply_of(i)))
        return out

    def _updater_of(self, key: str) -> Updater:
        """The update method of a key's piece: the store's, or its Python function's."""
        if self._function is None:
            return self._updater
        info = self._held[key]
        return FunctionUpdater(self._function, int(key) if info.int_key else key,
                               tuple(info.shape))

    def set_function(self, fn: Callable[[Any, np.ndarray, np.ndarray], None]) -> None:
        """Update every key (and every key made later) with a Python function (an
        in-process store's ``set_updater(fn)``); a later :class:`~.messages.SetUpdater`
        replaces it."""
        with self._lock:
            self._function = fn
            self._updater, self._updater_text = Replace(), updater_text_of(fn)
            servers = dict(self._keys)
        for key, server in servers.items():
            server.set_updater(self._updater_of(key))

    def _values(self, msg: KeyInit, layout: ServerLayout, lo: int) -> np.ndarray:
        size, dtype = layout.size, layout.dtype
        if msg.values is not None:
            values = np.asarray(msg.values)
            if values.dtype != dtype or values.size != size:
                raise ClusterError(f"init of key '{msg.key}': {values.size} {values.dtype} "
                                   f"values for a piece of {size} {dtype}")
            values = values.reshape(-1)
            return values if values.flags.writeable else values.copy()
        values = np.empty(size, dtype)
        if not msg.fill:
            raise ClusterError(f"init of key '{msg.key}' without values or a fill")
        offset = lo * int(layout.dims[0] or 1)
        fill_piece(msg.fill, msg.key, tuple(msg.shape), values, offset, msg.seed)
        return values

    # -- barriers ---------------------------------------------------------------------------

    def _live(self) -> set[tuple[int, int]]:
        c = self.conf
        return {(g, w) for g in range(c.nworker_groups) for w in range(c.nworkers_per_group)
                if (g, w) not in self._gone}

    def _barrier(self, msg: Barrier, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        if self._aborted is not None:
            return [(reply, ErrorReply(self._aborted))]
        arrived, replies = self._barriers.setdefault(msg.count, (set(), []))
        arrived.add((msg.group, msg.worker))
        replies.append(reply)
        return self._ready_barriers()

    def _ready_barriers(self) -> list[tuple[ReplyFn, Reply]]:
        live = self._live()
        out: list[tuple[ReplyFn, Reply]] = []
        for count in sorted(self._barriers):
            arrived, replies = self._barriers[count]
            if arrived >= live:
                del self._barriers[count]
                out += [(fn, Ack()) for fn in replies]
        return out

    # -- stopping and diagnosis -------------------------------------------------------------

    def abort(self, reason: str, lost: bool = False) -> None:
        """Answer every waiting and later request with ``reason`` (until a run begins)."""
        with self._lock:
            self._aborted = reason
            waiting = [fn for items in self._waiting.values() for _, fn in items]
            waiting += [fn for _, replies in self._barriers.values() for fn in replies]
            waiting += [fn for held in self._batches.values() for _, fn in held.pushes.values()]
            waiting += [fn for items in self._behind.values() for _, fn in items]
            self._waiting, self._barriers, self._batches = {}, {}, {}
            self._behind = {}
            servers = list(self._keys.values())
        error = ErrorReply(reason, lost)
        for fn in waiting:
            fn(error)
        for server in servers:
            server.abort(reason, lost)

    def waiting_for(self) -> str:
        """What this server waits for, in words."""
        with self._lock:
            parts = [f"{self.name} waits for the init of key '{k}'"
                     for k in sorted(self._waiting)]
            parts += [f"{self.name} waits for workers "
                      f"{sorted(self._live() - arrived)} at barrier {count}"
                      for count, (arrived, _) in sorted(self._barriers.items())]
            parts += [f"{self.name} waits for the pushes of {len(held.servers)} keys from "
                      f"workers {sorted(self._live_of(g) - held.pushes.keys())} of group {g}"
                      for g, held in sorted(self._batches.items())]
            servers = sorted(self._keys.items())
        for key, server in servers:
            said = server.waiting_for()
            if "waits" in said or "busy" in said:
                parts.append(f"key '{key}': {said}")
        return "; ".join(parts) or f"{self.name} is not waiting"

    def __repr__(self) -> str:
        return f"KeyServer({self.name}, {len(self._keys)} keys)"


@dataclass
class _HeldBatch:
    """The pushes of one batch of keys by the workers of a group, until every live one's
    came: the keys' servers, and by worker, its batch, its reply and its parts.

    Attributes:
        bounds: (every key dense) each key's part of the buffers, the same in every push.
        group: (every key dense) the keys' pieces held as one.
        tables: (a batch with tables) whether each key's part is rows by id; None: dense.
        parts: by worker, each key's part of its push: ``(None, gradient)`` or
            ``(row ids, rows)`` (checked: strictly increasing ids in the piece).
    """

    keys: str
    servers: list[Server]
    bounds: list[int]
    group: KeyGroup | None = None
    tables: list[bool] | None = None
    pushes: dict[int, tuple[KeyBatch, ReplyFn]] = field(default_factory=dict)
    parts: dict[int, list[tuple[Any, np.ndarray]]] = field(default_factory=dict)

    def parts_of(self, msg: KeyBatch) -> list[tuple[Any, np.ndarray]] | None:
        """A push's parts, each key's, when it fits this batch (the same keys, a buffer of
        the pieces' dtype, each dense part of its piece's size, each table's ids strictly
        increasing and in its piece); None when it does not."""
        r = msg.request
        data, off = msg.data, msg.offsets
        if (data is None or off is None or not isinstance(r, Update) or r.grads is not None
                or r.codec or r.ids is not None or data.ndim != 1):
            return None
        first = self.servers[0].values
        if first is None or data.dtype != first.dtype:
            return None
        if self.tables is None:
            if (msg.tables is not None or data.size != self.bounds[-1] or self.bounds[0]
                    or len(off) != len(self.bounds) or not np.array_equal(off, self.bounds)):
                return None
            return []  # summed whole (the bounds are the batch's)
        n = len(self.servers)
        try:
            tables, id_bounds = batch_tables(msg, n)
        except ClusterError:
            return None
        if tables is None or tables.tolist() != self.tables:
            return None
        bounds = np.asarray(off, np.int64).tolist()
        if len(bounds) != n + 1 or bounds[0] != 0 or bounds[-1] != data.size:
            return None
        assert msg.ids is not None and id_bounds is not None
        from ..numerics.rows import check_rows  # loads numba: only for tables

        parts: list[tuple[Any, np.ndarray]] = []
        for i, s in enumerate(self.servers):
            a, b = bounds[i], bounds[i + 1]
            assert s.values is not None
            if not self.tables[i]:
                if b - a != s.values.size:
                    return None
                parts.append((None, data[a:b]))
                continue
            dim = int(s.layout.dims[0])
            ids = msg.ids[id_bounds[i]:id_bounds[i + 1]]
            if b - a != ids.size * dim:
                return None
            try:
                ids = check_rows(ids, s.values.size // dim)
            except ParamError:
                return None
            parts.append((ids, data[a:b].reshape(ids.size, dim)))
        return parts


class BatchReply:
    """The one reply to a :class:`~.messages.KeyBatch`: each key's piece answers it, from
    whichever thread completes that piece's work; once every piece has, the sender hears
    once — the first error of a piece, or (a get) every key's values in one buffer, in the
    order of the keys, with each key's version, or (an update) :class:`Ack`."""

    __slots__ = ("_answers", "_bounds", "_id_bounds", "_left", "_lock", "_reply", "_tables", "msg",
                 "names")

    def __init__(self, msg: KeyBatch, reply: ReplyFn):
        self.msg = msg
        self.names = msg.names
        self._reply = reply
        self._answers: list[Reply | None] = [None] * len(self.names)
        self._left = len(self.names)
        self._lock = threading.Lock()
        request = msg.request
        n = len(self.names)
        self._tables, self._id_bounds = batch_tables(msg, n)
        if isinstance(request, Update):
            off = msg.offsets
            if (msg.data is None or off is None or len(off) != n + 1
                    or int(off[-1]) != msg.data.size or request.grads is not None
                    or request.ids is not None or request.rows is not None or request.codec):
                raise ClusterError("a batch of updates carries one buffer of uncompressed "
                                   f"gradients and rows and {n + 1} bounds of the keys' parts "
                                   "of it")
            self._bounds = np.asarray(off, np.int64).tolist()
        elif not isinstance(request, Get) or request.ids is not None:
            raise ClusterError(f"a batch carries gets of pieces or their rows, or updates, "
                               f"not a {type(request).__name__}")

    def piece(self, i: int) -> Get | Update:
        """The request of the ``i``-th key's piece."""
        r = self.msg.request
        table = self._tables is not None and bool(self._tables[i])
        ids = None
        if table:
            assert self.msg.ids is not None and self._id_bounds is not None
            ids = self.msg.ids[self._id_bounds[i]:self._id_bounds[i + 1]]
        if isinstance(r, Get):
            return replace(r, ids=ids, segment=0, whole=False) if table else r
        assert self.msg.data is not None
        a, b = self._bounds[i], self._bounds[i + 1]
        if table:
            return Update(r.group, r.worker, r.step, None, ids, self.msg.data[a:b])
        return Update(r.group, r.worker, r.step, self.msg.data[a:b])

    def reply_of(self, i: int) -> ReplyFn:
        return lambda answer: self._answered(i, answer)

    def _answered(self, i: int, answer: Reply) -> None:
        with self._lock:
            if self._answers[i] is not None:
                return
            self._answers[i] = answer
            self._left -= 1
            if self._left:
                return
        self._reply(self._joined())

    def _joined(self) -> Reply:
        answers = self._answers
        for a in answers:
            if isinstance(a, ErrorReply):
                return a
        if isinstance(self.msg.request, Update):
            return Ack()
        parts = [a.values for a in answers if isinstance(a, Values)]
        versions = np.array([int(a.versions.min()) if a.versions.size else 0
                             for a in answers if isinstance(a, Values)], np.int64)
        bf16 = all(a.bfloat16 for a in answers if isinstance(a, Values))
        # one piece: its values as they are (a view, in one process); else one copy
        values = parts[0] if len(parts) == 1 else _own(np.concatenate(parts))
        return Values(values, versions, bfloat16=bf16 and bool(parts))


class _Infos:
    """The one reply to a :class:`~.messages.DescribeKeys`, once every key's description
    has come (or the first error)."""

    def __init__(self, names: list[str], reply: ReplyFn):
        self.names, self._reply = names, reply
        self._infos: list[KeyInfo | None] = [None] * len(names)
        self._left = len(names)
        self._lock = threading.Lock()
        self._done = False

    def answered(self, i: int, info: Reply) -> list[tuple[ReplyFn, Reply]]:
        with self._lock:
            if self._done:
                return []
            if not isinstance(info, KeyInfo):
                self._done = True
                return [(self._reply, info if isinstance(info, ErrorReply) else
                         ErrorReply(f"no description of key '{self.names[i]}'"))]
            if self._infos[i] is None:
                self._infos[i] = info
                self._left -= 1
            if self._left:
                return []
            self._done = True
        text = json.dumps([[k.key, list(k.shape), k.dtype, k.row_sparse, k.int_key]
                           for k in self._infos if k is not None])
        return [(self._reply, KeyInfos(text))]

    def reply_of(self, i: int) -> ReplyFn:
        def answer(info: Reply) -> None:
            for fn, r in self.answered(i, info):
                fn(r)
        return answer


def _summed(pushes: list[Any]) -> tuple[np.ndarray, bool]:
    """The pushes of one batch (or of one key's part of it) summed in worker order, and
    whether the sum is finite. One push is read in this thread: a parallel check waits at
    its end for every thread it started, which a loaded machine may not schedule for
    milliseconds (measured: 20 ms instead of 0.1 ms for 800,000 values at load 14)."""
    if len(pushes) == 1:
        return pushes[0], bool(np.isfinite(pushes[0]).all())
    total = np.empty_like(pushes[0])
    return total, sum_all(total, pushes) == 0


def batch_tables(msg: KeyBatch, n: int) -> tuple[np.ndarray | None, list[int] | None]:
    """A batch's flags of which keys' parts are rows by id, and the bounds of their ids
    (None, None: every part is dense); checked. Read as Python lists (every push and get of
    a table reads them: 2 µs, where NumPy's dozen calls on a few elements took 30)."""
    if msg.tables is None:
        if msg.ids is not None or msg.id_offsets is not None:
            raise ClusterError("a batch with row ids but no flags of its tables")
        return None, None
    tables, ids, bounds = msg.tables, msg.ids, msg.id_offsets
    flags: list[bool] = []
    at: list[int] = []
    if (isinstance(tables, np.ndarray) and tables.dtype == np.bool_ and tables.shape == (n,)
            and isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1
            and isinstance(bounds, np.ndarray) and bounds.shape == (n + 1,)
            and bounds.dtype.kind in "iu"):
        flags, at = tables.tolist(), bounds.tolist()
    if (not at or at[0] != 0 or at[-1] != ids.size  # type: ignore[union-attr]
            or any(b < a or (b > a and not t) for a, b, t in zip(at, at[1:], flags))):
        raise ClusterError(f"a batch of {n} keys with tables carries a bool per key, int64 "
                           f"row ids and {n + 1} bounds of each table's part of them")
    return tables, at


def _own(values: np.ndarray) -> np.ndarray:
    """A reply's values made for it alone, marked read-only: nothing changes them, so a
    transport between processes may send them as they are, without a copy of its own
    first (:meth:`~paramserver.cluster.ray_actors.ServerActor._share`)."""
    values.flags.writeable = False
    return values


def _worker_of(request: Request) -> tuple[tuple[int, int], Get | Update] | None:
    """The worker whose push (or get) of keys ``request`` is, as (group, index), and the
    push or get; None for any other request (the maker's, the driver's)."""
    if not isinstance(request, (KeyBatch, Keyed)):
        return None
    inner = request.request
    if not isinstance(inner, (Update, Get)) or inner.worker < 0:
        return None
    return (inner.group, inner.worker), inner


def _ignore(reply: Reply) -> None:
    """For requests the key server makes itself (their outcome is known)."""


__all__ = [
    "BOUND",
    "FUNCTION",
    "MAX_INT_KEY",
    "MAX_KEY_LENGTH",
    "BatchReply",
    "FunctionUpdater",
    "KeyServer",
    "Replace",
    "empty_layout",
    "fill_piece",
    "home_of",
    "key_name",
    "make_updater",
    "piece_layout",
    "plan_key",
    "row_dim",
    "updater_text",
    "updater_text_of",
]
