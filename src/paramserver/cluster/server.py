"""A server: holds a range of the values and the updater state, applies updates (SPEC §7).

The server is a message handler and nothing else: :meth:`Server.handle` takes a request of
:mod:`paramserver.cluster.messages` and a ``reply`` callback, and calls it once — at once,
or later from the thread that completes the work (in the embedded cluster, the thread of
the worker whose update completes a step). It never waits for workers itself, so any
transport can drive it; the one wait it does is for the master's reply to a sync.

Consistency:
- *within a worker group* (BSP): an update of step ``t`` waits until every live worker of
  the group has sent its update of ``t``; their gradients are then summed in worker order
  (worker 0 + worker 1 + …, never by arrival), and the range updated once with
  ``grad_scale = 1 / (num_shares × contributions)`` per segment: the mean over workers and
  shares. One contribution is used where it lies: no sum, no copy.
- *between worker groups* (Downpour / Hogwild): each group's step is applied as it comes,
  under the server's lock, exactly once; the version goes up by one per applied step.
- *bounded staleness*: the server keeps every worker group's clock (steps completed);
  a :class:`Get` with ``clock = c`` is answered once every live group it serves is at ``c``.
- *server groups*: a server of a group other than 0 sends, every ``sync_freq`` of its
  updates (and when the driver flushes it at the end of a run), its change since the last
  sync to the same server of group 0 (the master), which adds it and answers with its
  values; the server then takes those values (SINGA's scheme, with the server locked
  meanwhile so no update is lost).
- *non-finite gradients*: under ``nonfinite: error`` a step whose gradient (or the sum of its
  workers' gradients) holds a NaN or an Inf is refused before anything is written: the
  values and the updater state stay as they were, and every waiter of the step hears why.
  The check is fused into the fixed-order sum (several workers: free), or is a read-only pass
  over the one gradient inside the update's own kernel call.

Checkpoints of its own (for a backend whose servers can be lost and restarted):
:class:`Save` writes its values, updater state and versions to ``folder`` (atomically, no
pickle), :class:`Restore` serves from such a file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from ..config import ParamError
from ..config.job import ClusterConf
from ..updaters import Updater
from .errors import ClusterError
from .layout import ServerLayout
from .messages import (
    Ack,
    Address,
    ErrorReply,
    Flush,
    Get,
    GetState,
    Leave,
    Problems,
    Put,
    Reply,
    Request,
    Restore,
    Save,
    SetState,
    State,
    Sync,
    Update,
    Values,
)
from .numerics import kernel_guard, nonfinite_counts, sum_into
from .transport import Pending, ReplyFn

Send = Callable[[Address, Request, str], Pending]

SERVER_FORMAT = "paramserver-server-checkpoint/1"
#: Checkpoints kept per server (the newest ones).
KEEP = 2
#: Requests a stopped (aborted) server still answers: the driver's.
_CONTROL = (Put, GetState, SetState, Save, Restore)


@dataclass
class _Round:
    """The updates of one step of one worker group, until all have come."""

    step: int
    grads: dict[int, np.ndarray | None] = field(default_factory=dict)
    replies: list[ReplyFn] = field(default_factory=list)


def server_name(index: int, group: int, nserver_groups: int) -> str:
    """How messages name a server: "server 1", or "server 1 of server group 2"."""
    return (f"server {index}" if nserver_groups == 1
            else f"server {index} of server group {group}")


class Server:
    """One server of one server group; see the module docstring.

    Args:
        layout: the range it holds (the same for this index in every server group).
        updater: the update method; its state for the range lives here.
        conf: the cluster configuration (groups, ``sync_freq``, ``timeout``, ``nonfinite``).
        group: the server group this server belongs to (0: the master group).
        folder: where :class:`Save` writes its checkpoints (None: it writes none).

    Attributes:
        values: its range of the values (None until the first put).
        state: the updater's state for the range (:class:`~paramserver.state.UpdaterState`).
        versions: per slice, the number of updates applied to it.
    """

    def __init__(self, layout: ServerLayout, updater: Updater, conf: ClusterConf,
                 group: int = 0, folder: str | Path | None = None):
        self.layout = layout
        self.updater = updater
        self.conf = conf
        self.group = group
        self.folder = Path(folder) if folder is not None else None
        self.name = server_name(layout.index, group, conf.nserver_groups)
        #: The worker groups this server's group serves.
        self.worker_groups = [g for g in range(conf.nworker_groups)
                              if g % conf.nserver_groups == group]
        self.values: np.ndarray | None = None
        self.num_shares = np.ones(layout.num_segments, np.int64)
        self.state = updater.init_state(layout.offsets, layout.dtype)
        if updater.keeps_master and conf.nserver_groups > 1:
            raise ParamError("updater.value_dtype bfloat16 keeps the float32 master copy on "
                             "the servers of one group: it needs cluster.nserver_groups 1, "
                             f"not {conf.nserver_groups}")
        self.versions = np.zeros(layout.num_slices, np.int64)
        self._lock = threading.Lock()
        self._live = self._everyone()
        self._clock = dict.fromkeys(self.worker_groups, 0)
        self._rounds: dict[int, _Round] = {}
        self._gets: list[tuple[Get, ReplyFn]] = []
        self._acc: np.ndarray | None = None
        self._aborted: str | None = None
        self._send: Send | None = None
        self._last_sync: np.ndarray | None = None
        self._since_sync = 0

    def _everyone(self) -> dict[int, set[int]]:
        return {g: set(range(self.conf.nworkers_per_group)) for g in self.worker_groups}

    def connect(self, send: Send) -> None:
        """How to reach the master server group (needed by servers of groups > 0)."""
        self._send = send

    @property
    def is_master(self) -> bool:
        return self.group == 0

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Request, reply: ReplyFn) -> None:
        """Handle one request; ``reply`` is called once, now or when the work is done."""
        out: list[tuple[ReplyFn, Reply]]
        with self._lock:
            if self._aborted is not None and not isinstance(request, _CONTROL):
                out = [(reply, ErrorReply(self._aborted))]
            else:
                try:
                    out = self._dispatch(request, reply)
                except (ClusterError, ParamError) as e:  # the sender hears of it
                    out = [(reply, ErrorReply(f"{self.name}: {e}"))]
                except Exception as e:
                    out = [(reply, ErrorReply(f"{self.name}: {type(request).__name__} "
                                              f"failed: {type(e).__name__}: {e}"))]
        for fn, answer in out:  # outside the lock: a reply may run the caller's code
            fn(answer)

    def _dispatch(self, request: Request, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        if isinstance(request, Update):
            return self._update(request, reply)
        if isinstance(request, Get):
            self._gets.append((request, reply))
            return self._ready_gets()
        if isinstance(request, Leave):
            return self._leave(request, reply)
        if isinstance(request, Sync):
            return [(reply, self._sync_in(request))]
        if isinstance(request, Put):
            return self._put(request, reply)
        if isinstance(request, Flush):
            if not self.is_master and self._send is not None and self.values is not None:
                self._sync_out(request.step)
            return [(reply, Ack())]
        if isinstance(request, GetState):
            return [(reply, State(self._state_arrays()))]
        if isinstance(request, SetState):
            return [(reply, self._set_state(request))]
        if isinstance(request, Save):
            self._save(request.step)
            return [(reply, Ack())]
        if isinstance(request, Restore):
            return self._restore(request.step, reply)
        raise ClusterError(f"unknown request {type(request).__name__}")

    def _put(self, msg: Put, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        size, nseg = self.layout.size, self.layout.num_segments
        shares = np.asarray(msg.num_shares, np.int64)
        values = msg.values if msg.values is not None else self.values
        if values is None:
            raise ClusterError("a put without values, and none held (a restarted server "
                               "needs its checkpoint restored)")
        if values.shape != (size,) or values.dtype != self.layout.dtype:
            raise ClusterError(f"put of {values.dtype} values of shape {values.shape}, "
                               f"expected {self.layout.dtype} of shape ({size},)")
        if shares.shape != (nseg,) or np.any(shares < 1):
            raise ClusterError(f"put with num_shares {shares}, expected {nseg} counts >= 1")
        failed = self._drop_waiters("the server was restarted by a put")
        if not values.flags.writeable:  # it arrived from another process: ours to update
            values = values.copy()
        self.values, self.num_shares = values, shares
        self.updater.adopt(values, self.state)  # value_dtype bfloat16: the master copy
        self._aborted = None
        self._live = self._everyone()
        self._clock = dict.fromkeys(self.worker_groups, int(msg.step))
        if not self.is_master:
            self._last_sync = values.copy()
            self._since_sync = 0
        return [*failed, (reply, Ack()), *self._ready_gets()]

    def _check_worker(self, group: int, worker: int) -> None:
        if group not in self._live:
            raise ClusterError(f"worker group {group} is not served here (server group "
                               f"{self.group} serves groups {self.worker_groups})")
        if worker not in self._live[group]:
            raise ClusterError(f"worker {worker} of group {group} is not a live worker here")

    def _update(self, msg: Update, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        self._check_worker(msg.group, msg.worker)
        if self.values is None:
            raise ClusterError("no values yet: the driver has not put them")
        if msg.grads is not None and (msg.grads.shape != self.values.shape
                                      or msg.grads.dtype != self.values.dtype):
            raise ClusterError(f"gradients of shape {msg.grads.shape} and dtype "
                               f"{msg.grads.dtype}, expected {self.values.shape} "
                               f"{self.values.dtype}")
        rnd = self._rounds.setdefault(msg.group, _Round(msg.step))
        if rnd.step != msg.step or msg.worker in rnd.grads:
            what = ("a second update" if rnd.step == msg.step
                    else f"an update while step {rnd.step} is open")
            raise ClusterError(f"{what} of step {msg.step} from worker {msg.worker} of "
                               f"group {msg.group}")
        rnd.grads[msg.worker] = msg.grads
        rnd.replies.append(reply)
        return self._complete(msg.group) if rnd.grads.keys() >= self._live[msg.group] else []

    def _complete(self, group: int) -> list[tuple[ReplyFn, Reply]]:
        """Apply the open step of a worker group once, answer its updates and ready gets."""
        rnd = self._rounds.pop(group)
        try:
            applied = self._apply(rnd, group)
            self._clock[group] = rnd.step + 1
            if (self._send is not None and not self.is_master
                    and self._since_sync >= self.conf.sync_freq):
                self._sync_out(rnd.step)
        except Exception as e:  # every waiter of the step must hear of it
            error = ErrorReply(f"{self.name}: {e}" if isinstance(e, ClusterError) else
                               f"{self.name}: update of step {rnd.step} of group {group} "
                               f"failed: {type(e).__name__}: {e}")
            return [(fn, error) for fn in rnd.replies]
        assert self.values is not None
        answer = Values(self.values, self.versions.copy(), applied)
        return [*((fn, answer) for fn in rnd.replies), *self._ready_gets()]

    def _total(self, grads: list[np.ndarray]) -> tuple[np.ndarray, bool]:
        """The fixed-order sum ``((g0 + g1) + g2) + ...`` and whether it is finite (counted
        in the sum's own pass; one gradient alone is the total, checked by the update)."""
        if len(grads) == 1:
            return grads[0], True
        assert self.values is not None
        if self._acc is None:
            self._acc = np.empty_like(self.values)
        total = self._acc
        bad = sum_into(total, grads[0], grads[1])
        for g in grads[2:]:
            bad = sum_into(total, total, g)
        return total, bad == 0

    def _apply(self, rnd: _Round, group: int) -> bool:
        grads = [g for w in sorted(rnd.grads) if (g := rnd.grads[w]) is not None]
        if not grads or self.values is None or self.layout.size == 0:
            return False
        total, finite = self._total(grads)
        if not finite:  # refused before anything is written
            raise ClusterError(self._nonfinite_message(rnd, total, group))
        L = self.layout
        scale = 1.0 / (self.num_shares * len(grads))
        # One gradient under 'error' is read first in the update's own kernel call, which
        # writes nothing when it holds NaN or Inf (under 'skip' its worker checked it).
        refuse = len(grads) == 1 and self.conf.nonfinite == "error"
        with kernel_guard():
            nonfinite = self.updater.apply(rnd.step, self.values, total, self.state,
                                           L.lr_scale, L.wd_scale, scale,
                                           refuse_nonfinite=refuse)
        if nonfinite and refuse:
            raise ClusterError(self._nonfinite_message(rnd, total, group))
        self.versions += 1
        self._since_sync += 1
        return True

    def _nonfinite_message(self, rnd: _Round, total: np.ndarray, group: int) -> str:
        """Which Params and workers sent NaN or Inf (the slow account, on the error path)."""
        L = self.layout
        params = []
        for i, name in enumerate(L.names):
            nan, inf = nonfinite_counts(total[L.offsets[i]:L.offsets[i + 1]])
            if nan or inf:
                counts = ", ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf"))
                                   if n)
                params.append(f"'{name}' ({counts})")
        senders = [w for w in sorted(rnd.grads) if rnd.grads[w] is not None]
        workers = [w for w in senders if sum(nonfinite_counts(rnd.grads[w])) > 0]  # type: ignore[arg-type]
        what = (f"non-finite gradient at step {rnd.step} from workers {workers} of group "
                f"{group}: Params {', '.join(params)}" if workers else
                f"the sum of the finite gradients of workers {senders} of group {group} at "
                f"step {rnd.step} overflowed (float {np.finfo(total.dtype).bits}-bit): "
                f"Params {', '.join(params)}")
        return (f"{what}; this step's update is refused and the run stops (the values and "
                "the updater state are as they were before the step; "
                + ("cluster.nonfinite 'skip' drops such pushes instead)" if workers else
                   "lower the learning rate or scale the loss)"))

    def _leave(self, msg: Leave, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        self._check_worker(msg.group, msg.worker)
        self._live[msg.group].discard(msg.worker)
        rnd = self._rounds.get(msg.group)
        out: list[tuple[ReplyFn, Reply]] = [(reply, Ack())]
        if rnd is not None and rnd.grads.keys() >= self._live[msg.group]:
            out += self._complete(msg.group)
        return [*out, *self._ready_gets()]

    # -- gets and clocks --------------------------------------------------------------------

    def _min_clock(self) -> int | None:
        """The clock of the slowest worker group with a live worker (None: none is left)."""
        clocks = [self._clock[g] for g in self.worker_groups if self._live[g]]
        return min(clocks) if clocks else None

    def _ready(self, get: Get) -> bool:
        if self.values is None or (len(self.versions) and self.versions.min() < get.version):
            return False
        if get.clock is None:
            return True
        slowest = self._min_clock()
        return slowest is None or slowest >= get.clock

    def _ready_gets(self) -> list[tuple[ReplyFn, Reply]]:
        if not self._gets:
            return []
        ready = [(g, fn) for g, fn in self._gets if self._ready(g)]
        if not ready:
            return []
        self._gets = [(g, fn) for g, fn in self._gets if not self._ready(g)]
        assert self.values is not None
        answer = Values(self.values, self.versions.copy())
        return [(fn, answer) for _, fn in ready]

    # -- server groups ----------------------------------------------------------------------

    def _sync_out(self, step: int) -> None:
        """Send the change since the last sync to the master; take its values."""
        assert self._send is not None and self.values is not None
        assert self._last_sync is not None
        delta = self.values - self._last_sync
        master = (0, self.layout.index)
        pending = self._send(master, Sync(self.group, delta),
                             f"the reply of server {self.layout.index} of server group 0 "
                             "to a sync")
        reply = pending.wait(self.conf.timeout, f"{self.name} at step {step}")
        assert isinstance(reply, Values)
        # The server is locked since the delta was taken: no update of its own came in
        # between, so SINGA's ``values += master - last_sync`` is exactly the master's.
        np.copyto(self.values, reply.values)
        np.copyto(self._last_sync, reply.values)
        self._since_sync = 0

    def _sync_in(self, msg: Sync) -> Reply:
        if not self.is_master:
            raise ClusterError("a sync request reached a server outside the master group")
        if self.values is None:
            raise ClusterError("a sync request came before the values were put")
        if msg.delta.shape != self.values.shape or msg.delta.dtype != self.values.dtype:
            raise ClusterError(f"sync delta of shape {msg.delta.shape}, expected "
                               f"{self.values.shape}")
        np.add(self.values, msg.delta, out=self.values)
        return Values(self.values.copy(), self.versions.copy())

    # -- stopping and diagnosis -------------------------------------------------------------

    def _drop_waiters(self, reason: str, lost: bool = False) -> list[tuple[ReplyFn, Reply]]:
        error = ErrorReply(reason, lost)
        out: list[tuple[ReplyFn, Reply]] = [
            (fn, error) for rnd in self._rounds.values() for fn in rnd.replies]
        out += [(fn, error) for _, fn in self._gets]
        self._rounds.clear()
        self._gets = []
        return out

    def abort(self, reason: str, lost: bool = False) -> None:
        """Answer every waiting and later request with ``reason``, until the next put
        (``lost``: as a server that was lost)."""
        with self._lock:
            self._aborted = reason
            out = self._drop_waiters(reason, lost)
        for fn, answer in out:
            fn(answer)

    def waiting_for(self) -> str:
        """What this server is waiting for, in words (for timeout messages)."""
        if not self._lock.acquire(timeout=1.0):
            return f"{self.name} is busy (an update or sync holds it)"
        try:
            if self.values is None:
                return f"{self.name} has no values yet (no put)"
            parts = []
            for g, rnd in sorted(self._rounds.items()):
                missing = sorted(self._live[g] - rnd.grads.keys())
                parts.append(f"{self.name} waits for updates from workers {missing} of group "
                             f"{g} for step {rnd.step}")
            if self._gets:
                slowest = self._min_clock()
                slow = [g for g in self.worker_groups if self._live[g]
                        and self._clock[g] == slowest]
                parts.append(f"{self.name} is at version {self.version}, its slowest worker "
                             f"groups {slow} have finished {slowest} steps")
            return "; ".join(parts) or f"{self.name} is at version {self.version}, not waiting"
        finally:
            self._lock.release()

    @property
    def version(self) -> int:
        """The number of updates applied (the smallest slice version)."""
        return int(self.versions.min()) if len(self.versions) else 0

    # -- state and checkpoints --------------------------------------------------------------

    def _state_arrays(self) -> dict[str, np.ndarray]:
        out = {"versions": self.versions.copy(),
               **{f"state/{k}": v for k, v in self.state.export(self.layout.names).items()}}
        if self.values is not None:
            out["values"] = self.values.copy()
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Values, slice versions and updater state (``state/<param>/<role>``), as copies."""
        with self._lock:
            return self._state_arrays()

    def check_state(self, state: dict[str, np.ndarray], prefix: str = "") -> list[str]:
        """The problems :meth:`load_state_dict` would refuse ``state`` for (keys shown with
        ``prefix``)."""
        want: dict[str, tuple[tuple[int, ...], Any]] = {"versions": (self.versions.shape,
                                                                     np.int64)}
        if self.values is not None:
            want["values"] = (self.values.shape, self.values.dtype)
        problems = [f"'{prefix}{k}' is missing" for k in want if k not in state]
        problems += [f"'{prefix}{k}' is not state of {self.name}" for k in state
                     if k not in want and not k.startswith("state/")]
        for k, (shape, dtype) in want.items():
            if k in state:
                arr = np.asarray(state[k])
                if arr.shape != shape or arr.dtype != np.dtype(dtype):
                    problems.append(f"'{prefix}{k}' is {arr.dtype} of shape {arr.shape}, "
                                    f"expected {np.dtype(dtype)} of shape {shape}")
                elif k == "versions" and arr.size and int(arr.min()) < 0:
                    problems.append(f"'{prefix}{k}' holds {int(arr.min())}: a version "
                                    "(updates applied) is >= 0")
        updater = {f"{prefix}{k}": v for k, v in state.items() if k.startswith("state/")}
        return problems + self.state.problems(updater, self.layout.names, f"{prefix}state/")

    def _set_state(self, msg: SetState) -> Problems:
        problems = self.check_state(msg.arrays, msg.prefix)
        if not problems and not msg.check_only:
            self._load(msg.arrays)
        return Problems(problems)

    def _load(self, state: dict[str, np.ndarray]) -> None:
        np.copyto(self.versions, state["versions"])
        self.state.load({k: v for k, v in state.items() if k.startswith("state/")},
                        self.layout.names, "state/")
        if self.values is not None:
            np.copyto(self.values, state["values"])
            if self._last_sync is not None:
                np.copyto(self._last_sync, state["values"])

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output (checked whole before anything changes)."""
        with self._lock:
            problems = self.check_state(state)
            if problems:
                raise ParamError(problems)
            self._load(state)

    def _checkpoint_path(self, step: int) -> Path:
        if self.folder is None:
            raise ClusterError("it has no checkpoint folder")
        return self.folder / checkpoint_name(int(step))

    def _save(self, step: int) -> None:
        meta = {"format": SERVER_FORMAT, "address": [self.group, self.layout.index],
                "step": int(step), "start": self.layout.start, "stop": self.layout.stop,
                "num_shares": self.num_shares.tolist()}
        save_checkpoint(self._checkpoint_path(step), self._state_arrays(), meta)
        assert self.folder is not None
        for _, old in list_checkpoints(self.folder)[:-KEEP]:
            old.unlink(missing_ok=True)

    def _restore(self, step: int, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        path = self._checkpoint_path(step)
        arrays, meta = load_checkpoint(path)
        L = self.layout
        if (meta.get("format") != SERVER_FORMAT
                or meta.get("address") != [self.group, L.index]
                or (meta.get("start"), meta.get("stop")) != (L.start, L.stop)):
            raise CheckpointError(f"{path}: not a checkpoint of {self.name}")
        values = np.array(arrays["values"], copy=True)
        if self.values is not None:  # keep serving the memory workers may view
            np.copyto(self.values, values)
            values = self.values
        out = self._put(Put(values, np.asarray(meta["num_shares"], np.int64), int(step)),
                        reply)
        problems = self.check_state(arrays)
        if problems:
            raise CheckpointError([f"{path}: {p}" for p in problems])
        self._load(arrays)
        return out

    def __repr__(self) -> str:
        return f"Server({self.name}, {self.layout!r}, version={self.version})"


__all__ = ["KEEP", "SERVER_FORMAT", "Server", "server_name"]
