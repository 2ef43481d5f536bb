"""The message vocabulary of the cluster (SPEC §7).

Every exchange is a request and one reply. The messages are plain frozen data (integers,
flags, strings, numpy arrays and dicts of arrays), so a transport only has to move them: the
local transport hands them over as they are (arrays are views of the sender's memory:
nothing is copied), a transport between processes serialises them field by field
(:mod:`paramserver.cluster.ray_wire`: a new message is a new dataclass here, nothing else).

Requests, worker → server (→ the reply):
    :class:`Get`      the values, once a version / staleness clock is reached → :class:`Values`
    :class:`Update`   one worker's gradients of one step → :class:`Values`, once applied
                      (with ``clip_norm``: → :class:`Norm`, this server's part of the norm)
    :class:`Clip`     the step's global gradient norm (``clip_norm``) → :class:`Values`
    :class:`Leave`    a worker is gone from a step on → :class:`Ack`
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

from dataclasses import dataclass

import numpy as np

#: Where a request goes: (server group, server index within the group).
Address = tuple[int, int]


# -- worker → server ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Get:
    """Ask for the values once the server has reached ``version`` and every live worker
    group it serves has finished ``clock`` steps (bounded staleness; ``None``: no bound)."""

    group: int
    worker: int
    step: int
    version: int = 0
    clock: int | None = None


@dataclass(frozen=True, eq=False)
class Update:
    """One worker's gradients of one step for the server's range.

    Attributes:
        grads: the gradients (the sum of every share already), or ``None`` for a push that
            was dropped (a non-finite gradient under ``nonfinite: skip``): the server counts
            the worker in for the step without its gradients.
    """

    group: int
    worker: int
    step: int
    grads: np.ndarray | None


@dataclass(frozen=True, eq=False)
class Clip:
    """The global L2 norm of a step's gradients (``clip_norm``), from one worker of the
    group: the square root of the sum, in server order, of every server's :class:`Norm`.
    Every live worker of the group sends the same; the server then applies the step, its
    gradients scaled by :func:`~paramserver.gradnorm.clip_factor` of it."""

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


Request = Get | Update | Clip | Leave | Sync | Put | Flush | GetState | SetState | Save | Restore


# -- replies -----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Values:
    """The values and the slice versions (the values a view of the server's memory inside
    one process; of the master's for a :class:`Sync`).

    ``applied`` (for an :class:`Update`) is False when every gradient of the step was
    dropped (nothing changed).
    """

    values: np.ndarray
    versions: np.ndarray
    applied: bool = True


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


Reply = Values | Norm | State | Problems | Ack | ErrorReply

#: Every message kind, by name (what a transport between processes sends).
KINDS: dict[str, type] = {cls.__name__: cls for cls in (
    Get, Update, Clip, Leave, Sync, Put, Flush, GetState, SetState, Save, Restore,
    Values, Norm, State, Problems, Ack, ErrorReply)}

__all__ = ["KINDS", "Ack", "Address", "Clip", "ErrorReply", "Flush", "Get", "GetState", "Leave",
           "Norm", "Problems", "Put", "Reply", "Request", "Restore", "Save", "SetState", "State",
           "Sync", "Update", "Values"]
