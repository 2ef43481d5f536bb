"""The life of a step and the bookkeeping of a run, written once for every backend.

- :func:`work` is the life of one worker's steps, wherever the worker runs (a thread of
  this process, a Ray actor): pull the values, wait for the staleness clock, call the
  gradient function, push, collect the new values — or, when the gradient function raises,
  leave (``on_worker_failure: continue``) or stop. It yields one :class:`Outcome` per step.
- :class:`Driver` runs in the caller's process: it gives the servers their values and
  clocks (messages, through the backend's transport), starts the live workers on a range
  of steps, and turns their outcomes into the run: metrics by step and rank, ``on_step`` in
  step order, workers gone, "no step finished for twice the timeout", "every worker
  failed", the first failure stopping everyone. It cuts a run into parts at the servers'
  checkpoints when servers can be lost (Ray), and runs a part again after a server was.
  At the end of a run every server group holds the final values, and ``params`` the
  master group's.

A backend (:class:`Backend`) only makes the servers and workers, starts workers on steps
and delivers their outcomes; a failure is the same outcome on every backend, so it behaves
the same.
"""

from __future__ import annotations

import itertools
import queue
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..checkpoint import list_checkpoints
from ..config import ParamError
from ..config.job import ClusterConf
from ..params import ParamSet
from .errors import ClusterError, ServerLost
from .gradfn import OnStep
from .layout import ServerLayout
from .messages import (
    Address,
    Flush,
    Get,
    GetState,
    Leave,
    Problems,
    Put,
    Request,
    Restore,
    Save,
    SetState,
    State,
    Values,
)
from .server import server_name
from .statedict import join_state, owner_versions, split_state
from .transport import Transport
from .worker import Worker

#: Outcome kinds: a step done; the worker left (its gradient function raised, and the
#: cluster goes on without it); it failed (the same, and the run stops); an error of the
#: cluster (a timeout, a stop, a lost server); its thread or process died; it sent its last.
DONE, LEFT, FAILED, ERROR, DEAD, ENDED = "done", "left", "failed", "error", "dead", "ended"


@dataclass
class Outcome:
    """What happened to one worker at one step; the one vocabulary of a step's result.

    Attributes:
        rank, step: the worker and the step.
        kind: :data:`DONE`, :data:`LEFT`, :data:`FAILED`, :data:`ERROR`, :data:`DEAD` or
            :data:`ENDED` (see the module's constants).
        metrics: what the gradient function returned (``done``).
        message: what went wrong, in words.
        cause: the exception behind it, when there is one (chained to the run's error).
        server_lost: the error was the loss of a server (a backend may bring it back).
        notes: warnings of the step, ``(category name, text)``, raised again by the driver.
        skipped: the pushes this worker has dropped so far (``nonfinite: skip``).
    """

    rank: int
    step: int
    kind: str
    metrics: Mapping[str, Any] | None = None
    message: str = ""
    cause: BaseException | None = None
    server_lost: bool = False
    notes: list[tuple[str, str]] = field(default_factory=list)
    skipped: int = 0

    def to_data(self) -> tuple[Any, ...]:
        """As a tuple of plain fields (what a worker in another process sends)."""
        return (self.rank, self.step, self.kind, self.metrics, self.message, self.cause,
                self.server_lost, self.notes, self.skipped)

    @classmethod
    def from_data(cls, data: Sequence[Any]) -> Outcome:
        return cls(*data)


def notes_of(worker: Worker) -> list[tuple[str, str]]:
    """The worker's warnings since the last outcome, as an outcome's notes."""
    notes = [("RuntimeWarning", text) for text in worker.notes]
    worker.notes.clear()
    return notes


def failure(worker: Worker, step: int, e: Exception) -> Outcome:
    """The outcome of an error of the cluster (or of the worker's own code) at ``step``."""
    if isinstance(e, ServerLost):
        return Outcome(worker.rank, step, ERROR, message=str(e), server_lost=True)
    if isinstance(e, ClusterError):
        return Outcome(worker.rank, step, ERROR, message=str(e), cause=e)
    return Outcome(worker.rank, step, ERROR, cause=e, message=(
        f"{worker.name} (rank {worker.rank}) failed at step {step}: {type(e).__name__}: {e}"))


def gradients(worker: Worker, grad_fn: Callable[..., Any], step: int
              ) -> tuple[Mapping[str, Any] | None, Outcome | None]:
    """The first half of a step: the gradient function fills the worker's gradients and
    returns its metrics; when it raises, the worker leaves (``on_worker_failure:
    continue``, the servers told) or fails: that outcome instead."""
    worker.step = step
    try:
        return grad_fn(worker, step), None
    except Exception as e:
        message = f"{worker.name} (rank {worker.rank}) failed at step {step}: " \
                  f"{type(e).__name__}: {e}"
        if worker.conf.on_worker_failure == "continue":
            worker.leave(step)
            return None, Outcome(worker.rank, step, LEFT, message=message, cause=e,
                                 notes=notes_of(worker))
        return None, Outcome(worker.rank, step, FAILED, message=message, cause=e,
                             notes=notes_of(worker))


def done(worker: Worker, step: int, metrics: Mapping[str, Any] | None) -> Outcome:
    """The outcome of a step whose new values the worker has (after its push's replies)."""
    return Outcome(worker.rank, step, DONE, metrics, notes=notes_of(worker),
                   skipped=worker.skipped)


def work(worker: Worker, grad_fn: Callable[..., Any], first: int, last: int
         ) -> Iterator[Outcome]:
    """The life of one worker's steps ``[first, last)``; one :class:`Outcome` per step,
    ending after the first that is not ``done``.

    The first step pulls the values (the servers were put or restored by the driver); a
    worker group that shares its server group with others waits, with ``staleness``, until
    the slowest of them is close enough. A :class:`BaseException` that is not an
    ``Exception`` (``SystemExit``) is not caught: it ends the worker as a death would.
    (The Ray backend's compiled steps, :mod:`~paramserver.cluster.ray_compiled`, run the
    same phases: :func:`gradients`, the push, the replies, :func:`done`.)
    """
    c = worker.conf
    served = len(range(worker.server_group, c.nworker_groups, c.nserver_groups))
    staleness = c.staleness if served > 1 else None
    step = first
    try:
        worker.pull(first)
        for step in range(first, last):
            if staleness is not None and step - staleness > first:
                worker.pull(step, clock=step - staleness)
            metrics, stopped = gradients(worker, grad_fn, step)
            if stopped is not None:
                yield stopped
                return
            worker.collect(worker.push(step), step)
            yield done(worker, step, metrics)
    except Exception as e:
        yield failure(worker, step, e)


class WorkerInfo(Protocol):
    """Who a worker is (a :class:`~paramserver.cluster.worker.Worker`, or its stand-in in
    the driver's process)."""

    @property
    def group(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def name(self) -> str: ...


class Backend(Protocol):
    """Where servers and workers live; what the :class:`Driver` needs of it.

    Attributes:
        one_process: whether the workers of a group share one process, so that they can
            exchange data in memory (a capability: layers partitioned on the features need
            it; see :func:`paramserver.cluster.runtime.workers_share_process`).
        transport: reaches every server (empty ones included) with the messages.
        servers: the servers by address, as the backend holds them.
        workers: every worker, by rank.
        local_workers: the :class:`~paramserver.cluster.worker.Worker` objects that live in
            this process (all of them embedded, none on Ray).
    """

    @property
    def one_process(self) -> bool: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def servers(self) -> Mapping[Address, Any]: ...
    @property
    def workers(self) -> Sequence[WorkerInfo]: ...
    @property
    def local_workers(self) -> Sequence[Worker]: ...

    def values_of(self, group: int) -> np.ndarray:
        """The memory a put gives server group ``group`` (embedded: the group's own, which its
        workers view; between processes: the driver's values, which the put copies)."""
        ...

    def prepare(self, grad_fn: Any) -> Any:
        """The gradient function as the workers are given it (shipped once per run)."""
        ...

    @property
    def halts(self) -> bool:
        """Whether :meth:`start` honours ``halt``: the workers can end a part at a step the
        driver names as they reach it (else the driver cuts a run into parts at every place
        where it may stop)."""
        ...

    def start(self, ranks: Sequence[int], fn: Any, first: int, last: int,
              deliver: Callable[[Outcome], None], halt: Pauses | None = None) -> None:
        """Start workers ``ranks`` on steps ``[first, last)``: each runs :func:`work` and
        its outcomes reach ``deliver`` (from any thread), then one ``ended``. With
        ``halt`` (only where :attr:`halts`): a step of ``halt.steps`` is begun only once
        every step before it is done and ``halt(step)`` said False; the part ends at the
        first for which it says True."""
        ...

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for every started worker to send its last outcome."""
        ...

    def busy(self) -> list[str]:
        """The workers still running steps of a stopped run (stuck in their gradient
        function), by name and step."""
        ...

    def revive(self) -> list[Address]:
        """Wait until every server answers; the servers lost and restarted since the last
        call (they have no values until restored)."""
        ...

    def replace_workers(self, ranks: Sequence[int]) -> bool:
        """Put a new worker (a new process, on any node with room) in the place of each of
        the dead workers ``ranks``; False where the backend cannot (embedded)."""
        ...

    def kill_server(self, address: Address) -> None:
        """Lose a server, as a crash of its process would (for tests of fault tolerance)."""
        ...

    def close(self) -> None:
        ...


class Pauses:
    """The places where a run may stop before its end, and what asks it to: called with a
    step, whether the run ends there (the step is one of ``steps`` and ``stop()`` says
    so). A run stops only between steps that every worker finished, where the servers
    hold the values of exactly those steps: a checkpoint written there resumes exactly.

    Where the workers go on through a pause (a backend that :attr:`~Backend.halts`), the
    call at a pause waits until the driver has called ``on_step`` for every step before
    it (:meth:`reported`): a stop asked for in ``on_step`` (or during it: a Ctrl-C) is seen
    at the next pause, as where the run is cut into parts at each.
    """

    def __init__(self, steps: Collection[int], stop: Callable[[], bool]):
        self.steps = frozenset(int(s) for s in steps)
        self.stop = stop
        self.halted: int | None = None  # where the part running ended early
        self._changed = threading.Condition()
        self._reported = -1  # on_step was called for every step before this one
        self._over = True  # no part is running (nothing to wait for)
        self._dropped = False  # the driver gave the part up (it raised): stop anyway

    def __call__(self, step: int) -> bool:
        if step not in self.steps:
            return False
        with self._changed:
            self._changed.wait_for(lambda: self._reported >= step or self._over)
        if self._dropped or self.stop():
            self.halted = step
            return True
        return False

    def reported(self, step: int) -> None:
        """The driver has called ``on_step`` for every step before ``step``."""
        with self._changed:
            self._reported = step
            self._changed.notify_all()

    def part(self, running: bool, dropped: bool = False) -> None:
        """A part of the run begins (True), or ends (False: no more reports in it; with
        ``dropped``, the driver gave it up: the workers stop at the next pause)."""
        with self._changed:
            self._over = not running
            self._dropped = dropped
            if running:
                self.halted = None
            self._changed.notify_all()


class _Stop(ClusterError):
    """The first failure of a part of a run."""

    def __init__(self, message: str, cause: BaseException | None = None,
                 server_lost: bool = False, worker_lost: bool = False):
        super().__init__(message)
        self.message = message
        self.cause = cause
        self.server_lost = server_lost
        self.worker_lost = worker_lost  # a worker's process died (not its own code)

    def error(self) -> ClusterError:
        if isinstance(self.cause, ClusterError) and str(self.cause) == self.message:
            return self.cause
        err = ClusterError(self.message)
        err.__cause__ = self.cause
        return err


_CATEGORIES = {c.__name__: c for c in (UserWarning, RuntimeWarning, DeprecationWarning,
                                       FutureWarning, ResourceWarning)}


def _rewarn(notes: Sequence[tuple[str, str]]) -> None:
    for category, text in notes:
        warnings.warn(text, _CATEGORIES.get(category, UserWarning), stacklevel=5)


class Driver:
    """The servers' life and every run, over a :class:`Backend`; see the module docstring.

    Args:
        conf: the cluster configuration.
        params: the model; server group 0's values are copied back into it after each run
            (inside one process they are its very memory).
        layouts: each server's range.
        backend: where the servers and workers are.
        max_restarts: how many times a part of a run is run again after a lost server.
        checkpoint_dir: the folder of the servers' own checkpoints (used when servers can
            be lost and brought back: ``max_restarts > 0``).
        checkpoint_freq: steps between the servers' checkpoints within a run (0: at the
            start and end of every run only).
    """

    def __init__(self, conf: ClusterConf, params: ParamSet, layouts: Sequence[ServerLayout],
                 backend: Backend, *, max_restarts: int, checkpoint_dir: Path | None,
                 temp_dir: bool, checkpoint_freq: int):
        self.conf = conf
        self.params = params
        self.layouts = list(layouts)
        self.backend = backend
        self.max_restarts = int(max_restarts)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_freq = int(checkpoint_freq)
        self.step = 0
        self.skipped: dict[int, int] = {}
        self.addresses: list[Address] = [(g, L.index) for g in range(conf.nserver_groups)
                                         for L in self.layouts]
        self._names = {a: server_name(a[1], a[0], conf.nserver_groups) for a in self.addresses}
        self.dead: dict[int, int] = {}  # workers whose thread or process died: rank -> step
        self._replaced: dict[int, int] = {}  # workers given a new actor: rank -> step it died
        # A temporary folder goes when the cluster is closed, or forgotten, or at exit.
        self._cleanup = (weakref.finalize(self, shutil.rmtree, str(checkpoint_dir), True)
                         if temp_dir and checkpoint_dir is not None else None)
        self._pristine = True  # the servers hold what was put from params, nothing since
        self._saved: int | None = None  # the step of the servers' newest checkpoint
        self._cleared = False  # the servers' checkpoints of earlier runs are removed
        self._closed = False

    @property
    def saves(self) -> bool:
        """Whether the servers keep checkpoints of their own (to come back after a loss)."""
        return self.max_restarts > 0 and self.checkpoint_dir is not None

    # -- messages to every server -----------------------------------------------------------

    def _ask(self, requests: Mapping[Address, Request], what: str) -> dict[Address, Any]:
        """One request per server, all sent before any reply is waited for."""
        send = self.backend.transport.send
        pendings = {a: send(a, r, f"{self._names[a]}'s reply to {what}")
                    for a, r in requests.items()}
        return {a: p.wait(max(60.0, self.conf.timeout), "the driver")
                for a, p in pendings.items()}

    def _every(self, make: Callable[[Address], Request], what: str) -> dict[Address, Any]:
        return self._ask({a: make(a) for a in self.addresses}, what)

    def _put_values(self, step: int) -> None:
        """Every server group starts from ``params.values``."""
        for g in range(self.conf.nserver_groups):
            values = self.backend.values_of(g)
            if values is not self.params.values:
                np.copyto(values, self.params.values)
        shares = self.params.num_shares
        self._every(lambda a: Put(self.backend.values_of(a[0])[self._range(a)],
                                  shares[self.layouts[a[1]].owners], step), "a put")

    def _range(self, a: Address) -> slice:
        L = self.layouts[a[1]]
        return slice(L.start, L.stop)

    def _leave(self, gone: Mapping[int, int]) -> None:
        """The servers hear that the workers ``gone`` send nothing from their step on."""
        for rank, step in sorted(gone.items()):
            w = self.backend.workers[rank]
            s = w.group % self.conf.nserver_groups
            self._ask({(s, L.index): Leave(w.group, w.index, step) for L in self.layouts},
                      "a leave")

    def _begin(self, step: int, gone: Mapping[int, int], recovering: bool) -> None:
        """The servers start a part of a run at ``step``: their values (a put, a restart
        with the values held, or their checkpoint after a loss), who is gone, and their
        checkpoint of ``step`` when they keep them."""
        # A server lost since the last part (or in it) is back, empty: all go back together.
        lost = self.backend.revive()
        if lost and not recovering:
            warnings.warn(f"a server was lost: {', '.join(self._names[a] for a in lost)} (its "
                          f"process died since the last part); the servers go back to their "
                          f"checkpoint of step {step}", RuntimeWarning, stacklevel=5)
        if lost or recovering:
            if self._saved == step:
                self._every(lambda a: Restore(step), "a restore")
            elif self._pristine:
                self._put_values(step)
            else:
                names = ", ".join(self._names[a] for a in lost) or "a server"
                raise ClusterError(f"{names} was lost, and the servers have no checkpoint of "
                                   f"step {step} to go back to (max_restarts is "
                                   f"{self.max_restarts})")
        elif self._pristine:
            self._put_values(step)
        else:
            shares = self.params.num_shares
            self._every(lambda a: Put(None, shares[self.layouts[a[1]].owners], step),
                        "a restart")
        self._leave(gone)
        if self.saves and self._saved != step:
            self._save(step)

    def _save(self, step: int) -> None:
        if not self._cleared:
            self._clear_earlier()
        self._every(lambda a: Save(step), "a checkpoint")
        self._saved = step

    def _clear_earlier(self) -> None:
        """Remove the servers' checkpoints left in their folders by an earlier cluster (a
        server keeps its newest few by step: older runs' would crowd out this one's). Done
        when this cluster first saves, inside a run, never when it is made: a caller that
        holds its folder for a run (a trainer's workspace lock) holds it by then."""
        for a in self.addresses:
            folder = server_folder(self.checkpoint_dir, a)
            if folder is not None and folder.is_dir():
                for _, old in list_checkpoints(folder):
                    old.unlink(missing_ok=True)
        self._cleared = True

    def _finish(self, step: int) -> None:
        """Every server group takes the final values; ``params`` server group 0's. A server
        lost after the servers saved ``step`` (the run's last checkpoint) is brought back
        to it, and the servers asked again."""
        try:
            self._finish_once(step)
        except ClusterError:
            lost = self.backend.revive() if self.saves and self._saved == step else []
            if not lost:
                raise
            warnings.warn(f"a server was lost: {', '.join(self._names[a] for a in lost)} "
                          f"(after the run's last step); the servers go back to their "
                          f"checkpoint of step {step}", RuntimeWarning, stacklevel=4)
            self._every(lambda a: Restore(step), "a restore")
            self._finish_once(step)

    def _finish_once(self, step: int) -> None:
        if self.conf.nserver_groups > 1:
            # Two rounds: every change reaches the masters, then every group takes them.
            later = [a for a in self.addresses if a[0] > 0]
            for _ in range(2):
                self._ask(dict.fromkeys(later, Flush(step)), "a flush")
        self._refresh(step)

    def _refresh(self, step: int) -> None:
        """``params.values`` and the owners' versions from server group 0."""
        replies = self._ask({(0, L.index): Get(0, 0, step, whole=True) for L in self.layouts},
                           "a get")
        versions: dict[int, np.ndarray] = {}
        for (_, index), reply in replies.items():
            assert isinstance(reply, Values)
            target = self.params.values[self._range((0, index))]
            if not np.shares_memory(target, reply.values):
                np.copyto(target, reply.values)
            versions[index] = reply.versions
        per_owner = owner_versions(self.layouts, lambda L: versions[L.index])
        for owner, version in per_owner.items():
            self.params.owners[owner].version = version

    def _look_after_failure(self) -> None:
        """After a failed run, ``params`` show what server group 0 holds (a stopped server
        still answers for its state); best effort: a lost server has nothing to show."""
        try:
            replies = self._ask({(0, L.index): GetState() for L in self.layouts}, "a look")
        except ClusterError:
            return
        versions: dict[int, np.ndarray] = {}
        for (_, index), reply in replies.items():
            assert isinstance(reply, State)
            target = self.params.values[self._range((0, index))]
            values = reply.arrays.get("values")
            if values is not None and not np.shares_memory(target, values):
                np.copyto(target, values)
            versions[index] = reply.arrays["versions"]
        for owner, version in owner_versions(self.layouts, lambda L: versions[L.index]).items():
            self.params.owners[owner].version = version

    # -- running ----------------------------------------------------------------------------

    def _parts(self, start: int, stop: int, pauses: Collection[int] = ()
               ) -> list[tuple[int, int]]:
        """The parts of a run: cut at the servers' checkpoints (when they keep them) and at
        ``pauses``."""
        f = self.checkpoint_freq if self.saves else 0
        inner = {s for s in range(start + 1, stop) if f and s % f == 0}
        inner.update(s for s in pauses if start < s < stop)
        return list(itertools.pairwise([start, *sorted(inner), stop]))

    def run(self, grad_fn: Any, steps: int, start_step: int | None = None,
            on_step: OnStep | None = None, pauses: Collection[int] = (),
            stop: Callable[[], bool] | None = None) -> list[list[Mapping[str, Any] | None]]:
        """See :meth:`paramserver.cluster.Cluster.run`."""
        if self._closed:
            raise ClusterError("the cluster was closed")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ParamError(f"steps must be an integer >= 0, not {steps!r}")
        if start_step is not None and (isinstance(start_step, bool) or not isinstance(
                start_step, (int, np.integer)) or start_step < 0):
            raise ParamError(f"start_step must be an integer >= 0, not {start_step!r}")
        busy = self.backend.busy()
        if busy:
            raise ClusterError(f"a worker of the previous run is still busy ({busy[0]}, in "
                               "its gradient function); cannot start another run")
        if self.dead and self.conf.on_worker_failure != "continue" and not (
                self._replace_dead()):
            rank, step = min(self.dead.items())
            raise ClusterError(f"{self.backend.workers[rank].name} (rank {rank}) died at step "
                               f"{step}; with cluster.on_worker_failure 'stop' this cluster "
                               "does not run without it (make a new one)")
        start = self.step if start_step is None else int(start_step)
        end = start + int(steps)
        n = len(self.backend.workers)
        results: list[list[Mapping[str, Any] | None]] = [[None] * n for _ in range(start, end)]
        fn = self.backend.prepare(grad_fn) if steps else None
        left: dict[int, int] = {}  # workers whose gradient function failed (continue)
        reported = [start]
        asked = Pauses(pauses, stop) if stop is not None and pauses else None
        # Where the workers can end a part as they go, a run is one part between the servers'
        # checkpoints; elsewhere it is cut at every pause, and asked there.
        halt = asked if asked is not None and self.backend.halts else None
        cuts = asked.steps if asked is not None and halt is None else frozenset()
        try:
            for first, last in self._parts(start, end, cuts):
                reached = self._run_part(fn, first, last, start, results, left, reported,
                                         on_step, halt)
                if reached < last or (reached < end and asked is not None
                                      and asked(reached)):
                    end = reached  # stopped at a pause, as asked
                    break
            self._finish(end)
        except _Stop as f:
            self._look_after_failure()
            err = f.error()
            raise err from err.__cause__  # the cause, not this context
        self.step = end
        return results[:end - start]

    def _run_part(self, fn: Any, first: int, last: int, run_start: int,
                  results: list[list[Mapping[str, Any] | None]], left: dict[int, int],
                  reported: list[int], on_step: OnStep | None, halt: Pauses | None = None
                  ) -> int:
        """Steps ``[first, last)``; after the loss of a server, back to the servers'
        checkpoint of ``first`` and again (at most ``max_restarts`` times). The step the
        part reached: ``last``, or where ``halt`` ended it."""
        recovering = False
        for attempt in range(self.max_restarts + 1):
            try:
                self._begin(first, {**self.dead, **left}, recovering)
                reached = last
                if last > first:
                    self._pristine = False
                    reached = self._drive(fn, first, last, run_start, results, left,
                                          reported, on_step, halt)
                    # A server lost after the workers' last request of the part took the
                    # part's work with it all the same.
                    lost = self.backend.revive()
                    if lost:
                        names = ", ".join(self._names[a] for a in lost)
                        raise _Stop(f"{names} was lost in steps {first} to {reached - 1}",
                                    server_lost=True)
                if self.saves:  # also serves a server lost before the next part begins
                    self._save(reached)
                return reached
            except (_Stop, ClusterError) as e:
                f = e if isinstance(e, _Stop) else _Stop(str(e), e, isinstance(e, ServerLost))
                lost = self.backend.revive() if self.saves else []
                dead = sorted(self.dead) if f.worker_lost else []
                if not (f.server_lost or lost or dead) or self.backend.busy() or (
                        attempt == self.max_restarts == 0):
                    raise f from None  # a worker stuck in its step cannot run it again
                if attempt == self.max_restarts:
                    raise _Stop(f"{f.message} (gave up after {attempt} recoveries)",
                                f.cause) from None
                if dead and not self._replace_dead():
                    if any(self._replaced.get(r) == self.dead[r] for r in dead):
                        raise _Stop(f"{f.message} (it died again at that step after a new "
                                    "actor took its place: the cause is in the worker's "
                                    "step, not its node)", f.cause) from None
                    raise f from None  # a worker that cannot be replaced stops the run
                server = f.server_lost or bool(lost)
                head = ("a server and a worker were lost" if server and dead else
                        "a server was lost" if server else "a worker was lost")
                what = ", ".join([self._names[a] for a in lost]
                                 + [self.backend.workers[r].name for r in dead])
                warnings.warn(
                    f"{head}{f' ({what})' if what else ''}: {f.message}; "
                    + ("new actors took the dead workers' places; " if dead else "")
                    + f"the servers go back to their checkpoint of step {first} and steps "
                    f"{first} to {last - 1} run again", RuntimeWarning, stacklevel=4)
                # A worker whose gradient function failed runs again (and fails again, at
                # the same step); a dead one stays gone.
                for rank in [r for r, s in left.items() if s >= first]:
                    del left[rank]
                recovering = True
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _drive(self, fn: Any, first: int, last: int, run_start: int,
               results: list[list[Mapping[str, Any] | None]], left: dict[int, int],
               reported: list[int], on_step: OnStep | None, halt: Pauses | None = None
               ) -> int:
        """Start the live workers, gather their outcomes, call ``on_step`` in order; the
        step the part reached (``last``, or where ``halt`` ended it)."""
        c = self.conf
        workers = self.backend.workers
        n = len(workers)
        # Workers gone before this part take no part from its first step.
        gone = {r: min(s, first) for r, s in {**self.dead, **left}.items()}
        live = [w.rank for w in workers if w.rank not in gone]
        if not live:
            raise _Stop("no worker is left: every worker failed or died")
        outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        if halt is None:
            self.backend.start(live, fn, first, last, outcomes.put)
        else:
            halt.reported(reported[0])
            halt.part(True)
            self.backend.start(live, fn, first, last, outcomes.put, halt)
        running = set(live)
        at = dict.fromkeys(live, first)  # the step each worker is on
        counts = [0] * (last - first)
        first_left: tuple[str, BaseException | None] | None = None
        failure: _Stop | None = None
        # Workers' own waits time out after `timeout`; this one catches what they cannot:
        # every worker stuck in its gradient function.
        limit = 2 * c.timeout
        last_event = time.monotonic()
        try:
            while running:
                try:
                    o = outcomes.get(timeout=min(1.0, limit / 4))
                except queue.Empty:
                    if time.monotonic() - last_event > limit:
                        busy = ", ".join(f"{workers[r].name} (rank {r}) at step {at[r]}"
                                         for r in sorted(running))
                        failure = _Stop(f"the run waited {limit:g} s (twice cluster.timeout) "
                                        f"without a step finishing; still running: {busy}")
                        break
                    continue
                last_event = time.monotonic()
                _rewarn(o.notes)
                if o.kind == DONE:
                    results[o.step - run_start][o.rank] = o.metrics
                    counts[o.step - first] += 1
                    at[o.rank] = o.step + 1
                    self.skipped[o.rank] = o.skipped
                elif o.kind == ENDED:
                    running.discard(o.rank)
                elif o.kind in (LEFT, DEAD):
                    gone[o.rank] = o.step
                    if o.kind == DEAD:
                        self.dead[o.rank] = o.step
                        running.discard(o.rank)
                        if c.on_worker_failure != "continue":
                            failure = _Stop(o.message, o.cause, worker_lost=True)
                            break
                        self._leave({o.rank: o.step})
                    else:
                        left[o.rank] = o.step
                    warnings.warn(f"{o.message}; the run goes on without it "
                                  "(cluster.on_worker_failure is 'continue')", RuntimeWarning,
                                  stacklevel=4)
                    first_left = first_left or (o.message, o.cause)
                else:  # FAILED, ERROR
                    failure = _Stop(o.message, o.cause, o.server_lost)
                    break
                if len(gone) == n and first_left is not None:
                    failure = _Stop(f"every worker failed; the first: {first_left[0]}",
                                    first_left[1])
                    break
                while reported[0] < last and counts[reported[0] - first] >= sum(
                        1 for r in range(n) if gone.get(r, last) > reported[0]):
                    if on_step is not None:
                        on_step(reported[0], results[reported[0] - run_start])
                    reported[0] += 1
                    if halt is not None:
                        halt.reported(reported[0])
        except BaseException as e:  # on_step raised, or KeyboardInterrupt
            if halt is not None:
                halt.part(False, dropped=True)
            self._stop(f"the run was stopped in the caller: {type(e).__name__}: {e}")
            raise
        if halt is not None:
            halt.part(False, dropped=failure is not None)
        if failure is not None:
            self._stop(f"the run was stopped: {failure.message}")
            raise failure
        # Every live worker ended: at `last`, or where `halt` ended the part (every step
        # before it finished by every worker not gone).
        return last if halt is None or halt.halted is None else halt.halted

    def _replace_dead(self) -> bool:
        """Under ``on_worker_failure: stop``, with the servers' checkpoints to go back to:
        new workers in the places of the dead ones (their part runs again from its first
        step, bit for bit as without the loss). Whether they were replaced."""
        if not (self.dead and self.saves and self.conf.on_worker_failure != "continue"):
            return False
        ranks = sorted(self.dead)
        if any(self._replaced.get(r) == self.dead[r] for r in ranks):
            return False  # its new actor died at the same step: its own doing, not a node's
        if not self.backend.replace_workers(ranks):
            return False
        for rank in ranks:
            self._replaced[rank] = self.dead.pop(rank)
        return True

    def _stop(self, reason: str) -> None:
        """Answer every waiting request with ``reason``; wait for the workers to stop."""
        self.backend.transport.abort(reason)
        self.backend.wait(self.conf.timeout)

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """See :meth:`paramserver.cluster.Cluster.state_dict`."""
        replies = self._every(lambda a: GetState(), "a request for its state")
        states = {}
        for a, reply in replies.items():
            assert isinstance(reply, State)
            states[a] = reply.arrays
        return join_state(self.step, self.layouts, states)

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """See :meth:`paramserver.cluster.Cluster.load_state_dict`."""
        problems, parts = split_state(state, self.layouts, self.addresses)
        checks = self._every(lambda a: SetState(parts[a], True, f"server/{a[0]}/{a[1]}/"),
                             "a check of a state")
        for a in self.addresses:
            reply = checks[a]
            assert isinstance(reply, Problems)
            problems += reply.problems
        if problems:
            raise ParamError(problems)
        self._every(lambda a: SetState(parts[a]), "a load of a state")
        self.step = int(state["step"])
        self._pristine = False
        self._saved = None
        self._refresh(self.step)

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.backend.close()
        finally:
            if self._cleanup is not None:
                self._cleanup()


def checkpoint_folder(checkpoint_dir: str | Path | None, needed: bool) -> tuple[Path | None,
                                                                                bool]:
    """The servers' checkpoint folder (absolute: workers may have another working folder),
    and whether it is a temporary one (made here, removed at the end)."""
    if checkpoint_dir is not None:
        return Path(checkpoint_dir).absolute(), False
    if not needed:
        return None, False
    return Path(tempfile.mkdtemp(prefix="paramserver-servers-")), True


def server_folder(root: Path | None, address: Address) -> Path | None:
    """Where server ``address`` keeps its checkpoints."""
    return None if root is None else root / f"server-{address[0]}-{address[1]}"


__all__ = ["DEAD", "DONE", "ENDED", "ERROR", "FAILED", "LEFT", "Backend", "Driver",
           "Outcome", "Pauses", "WorkerInfo", "checkpoint_folder", "done", "failure",
           "gradients", "notes_of", "server_folder", "work"]
