"""The message vocabulary between worker stubs and servers (SPEC §7).

Every exchange is a request and one reply. The messages are plain frozen data (integers,
flags and numpy arrays), so a transport only has to move them: the local transport hands
them over as they are (arrays are views of the sender's memory: nothing is copied), a
transport between processes serialises the arrays.

Requests, worker → server (→ the reply):
    :class:`Put`     start serving these values from this step → :class:`PutReply`
    :class:`Get`     the values, once a version / staleness clock is reached → :class:`GetReply`
    :class:`Update`  one worker's gradients of one step → :class:`UpdateReply`, once applied
    :class:`Leave`   a worker is gone from a step on → :class:`Ack`
Request, server → master server (server groups):
    :class:`Sync`    the change since the last sync → :class:`SyncReply`
Any request may instead be answered with :class:`ErrorReply`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Where a request goes: (server group, server index within the group).
Address = tuple[int, int]


@dataclass(frozen=True, eq=False)
class Put:
    """Start (or restart) serving from these values.

    Attributes:
        values: the server's range of values. The server keeps the array as it is: inside
            one process it is the worker group's own memory, which the server then updates.
        num_shares: per segment, the number of Params sharing it (SPEC §3).
        step: the training step the run starts at; every worker group's clock starts there.
    """

    values: np.ndarray
    num_shares: np.ndarray
    step: int


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
        flush: sync with the master server group after this update, whatever ``sync_freq``
            says (sent with the last step of a run).
    """

    group: int
    worker: int
    step: int
    grads: np.ndarray | None
    flush: bool = False


@dataclass(frozen=True, eq=False)
class Leave:
    """Worker ``worker`` of group ``group`` sends no update for ``step`` or later."""

    group: int
    worker: int
    step: int


@dataclass(frozen=True, eq=False)
class Sync:
    """A non-master server's change since its last sync (SINGA's server-group sync)."""

    server_group: int
    delta: np.ndarray


Request = Put | Get | Update | Leave | Sync


@dataclass(frozen=True, eq=False)
class PutReply:
    versions: np.ndarray


@dataclass(frozen=True, eq=False)
class GetReply:
    """The values (a view of the server's memory inside one process) and slice versions."""

    values: np.ndarray
    versions: np.ndarray


@dataclass(frozen=True, eq=False)
class UpdateReply:
    """The values after the step's update and the slice versions.

    ``applied`` is False when every gradient of the step was dropped (nothing changed).
    """

    values: np.ndarray
    versions: np.ndarray
    applied: bool


@dataclass(frozen=True, eq=False)
class SyncReply:
    """The master's values after adding the delta (a copy: the master goes on changing)."""

    values: np.ndarray


@dataclass(frozen=True, eq=False)
class Ack:
    pass


@dataclass(frozen=True, eq=False)
class ErrorReply:
    """The request failed, or the run was stopped; ``message`` says why."""

    message: str


Reply = PutReply | GetReply | UpdateReply | SyncReply | Ack | ErrorReply

__all__ = ["Ack", "Address", "ErrorReply", "Get", "GetReply", "Leave", "Put", "PutReply",
           "Reply", "Request", "Sync", "SyncReply", "Update", "UpdateReply"]
