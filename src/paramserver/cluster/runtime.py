"""The embedded cluster: servers and workers in this process, workers as threads (SPEC §7).

:class:`Cluster` builds the slices, the servers of every server group and the workers of
every worker group from a :class:`~paramserver.config.job.ClusterConf`, a
:class:`~paramserver.params.ParamSet` and an :class:`~paramserver.updaters.Updater`, and
:meth:`Cluster.run` runs training steps with a user's gradient function::

    cluster = Cluster(job, params)                  # job.cluster, job.updater
    def grad_fn(worker, step):
        loss = model_grads(worker.params, batch(worker.rank, step))   # fills .grad
        return {"loss": loss}
    metrics = cluster.run(grad_fn, steps=100)       # metrics[i][rank]

Server group 0 holds the ParamSet's own values (``params.values`` is the model, updated in
place); every further server group holds a copy. Workers talk to servers only through the
messages of :mod:`~paramserver.cluster.messages` over a :class:`LocalTransport`.

With ``cluster.backend: "ray"``, ``Cluster(...)`` makes a
:class:`~paramserver.cluster.ray_backend.RayCluster` instead: the same servers and workers
as Ray actors, with the same ``run``, ``state_dict`` and ``load_state_dict``.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import ClusterConf, JobConf, UpdaterConf
from ..params import ParamSet
from ..updaters import Updater, create_updater
from .errors import ClusterError
from .layout import ServerLayout, plan_servers
from .messages import Address
from .server import Server
from .state import join_state, owner_versions, split_state
from .transport import LocalTransport, Transport
from .worker import Worker

#: ``grad_fn(worker, step)``: fill ``worker.params``' gradients, return metrics (or None).
GradFn = Callable[[Worker, int], "Mapping[str, Any] | None"]
#: ``on_step(step, metrics)``: called in the caller's thread, in step order, once every
#: live worker has finished the step; ``metrics`` by rank (None for a worker gone).
OnStep = Callable[[int, "list[Mapping[str, Any] | None]"], None]


class _GradFnFailed(Exception):
    """The user's gradient function raised (its exception is the cause)."""


def _cluster_conf(job: JobConf | ClusterConf | Mapping[str, Any]) -> ClusterConf:
    if isinstance(job, JobConf):
        return job.cluster
    if isinstance(job, ClusterConf):
        return job
    if isinstance(job, Mapping):
        return ClusterConf.parse(job)
    raise ParamError(f"expected a JobConf, a ClusterConf or a dict, not {type(job).__name__}")


def _updater_of(job: JobConf | ClusterConf | Mapping[str, Any],
                updater: Updater | UpdaterConf | Mapping[str, Any] | str | None) -> Updater:
    if updater is None:
        if not isinstance(job, JobConf):
            raise ParamError("Cluster needs an updater: pass one, or a JobConf with one")
        updater = job.updater
    if not isinstance(updater, Updater):
        updater = create_updater(updater if not isinstance(updater, Mapping)
                                 else dict(updater))
    return updater


def _check_conf(conf: ClusterConf) -> None:
    if conf.nserver_groups > conf.nworker_groups:
        raise ParamError(f"nserver_groups ({conf.nserver_groups}) is more than "
                         f"nworker_groups ({conf.nworker_groups}): server groups without "
                         "a worker group would hold values nobody trains")


class Cluster:
    """Parameter servers and workers, embedded; see the module docstring. With
    ``backend: "ray"`` in the cluster configuration, ``Cluster(...)`` returns a
    :class:`~paramserver.cluster.ray_backend.RayCluster` (which takes further keyword
    arguments: placement, actor options, checkpoints).

    Args:
        job: a job (its ``cluster`` and, unless ``updater`` is given, its ``updater``), a
            cluster configuration, or a dict of one.
        params: the Params; server group 0 holds (and updates) ``params.values`` itself.
        updater: the update method, or its configuration; by default the job's.
        transport: makes the transport from the servers (default :class:`LocalTransport`);
            the seam for other backends, and for tests.

    Attributes:
        conf: the cluster configuration.
        params, updater: as given.
        layouts: the range of each server of a group (the same in every server group).
        servers: ``{(server group, index): Server}``.
        workers: every worker, by rank.
        step: the next step :meth:`run` starts at.
    """

    def __new__(cls, job: JobConf | ClusterConf | Mapping[str, Any] | None = None, *args: Any,
                **kwargs: Any) -> Cluster:
        if cls is Cluster and job is not None and _cluster_conf(job).backend == "ray":
            from .ray_backend import RayCluster

            return super().__new__(RayCluster)
        return super().__new__(cls)

    def __init__(self, job: JobConf | ClusterConf | Mapping[str, Any], params: ParamSet,
                 updater: Updater | UpdaterConf | Mapping[str, Any] | str | None = None, *,
                 transport: Callable[[Mapping[Address, Server]], Transport] | None = None):
        conf = _cluster_conf(job)
        updater = _updater_of(job, updater)
        if conf.backend != "local":  # Cluster(...) itself makes a RayCluster for 'ray'
            raise ParamError(f"{type(self).__name__} runs servers and workers in this process;"
                             f" cluster.backend '{conf.backend}' is made by Cluster(...)")
        _check_conf(conf)
        self.conf = conf
        self.params = params
        self.updater = updater
        self.layouts: list[ServerLayout] = plan_servers(params, conf.nservers_per_group)
        self._values = [params.values] + [params.values.copy()
                                          for _ in range(1, conf.nserver_groups)]
        self.servers: dict[Address, Server] = {
            (s, L.index): Server(L, updater, conf, s)
            for s in range(conf.nserver_groups) for L in self.layouts}
        self.transport: Transport = (transport or LocalTransport)(self.servers)
        for server in self.servers.values():
            server.connect(self.transport.send)
        self.workers = [
            Worker(g, i, params.replica(self._values[g % conf.nserver_groups]), self.layouts,
                   self.transport, conf)
            for g in range(conf.nworker_groups) for i in range(conf.nworkers_per_group)]
        self.step = 0
        self._replicas_ready = conf.nserver_groups == 1
        self._threads: list[threading.Thread] = []
        self._failure: tuple[str, BaseException] | None = None
        self._failure_lock = threading.Lock()
        self._put(0)

    # -- running ----------------------------------------------------------------------------

    @property
    def skipped_pushes(self) -> int:
        """Pushes dropped for non-finite gradients (``nonfinite: skip``), all workers."""
        return sum(w.skipped for w in self.workers)

    def _put(self, step: int) -> None:
        """The first worker group of each server group gives its servers their values."""
        per_group = self.conf.nworkers_per_group
        for s in range(self.conf.nserver_groups):
            self.workers[s * per_group].put(step)

    def run(self, grad_fn: GradFn, steps: int, start_step: int | None = None,
            on_step: OnStep | None = None) -> list[list[Mapping[str, Any] | None]]:
        """Run ``steps`` training steps on every worker, from ``start_step`` (default: where
        the last run stopped).

        Args:
            grad_fn: ``grad_fn(worker, step)`` fills every gradient of ``worker.params``
                (gradients are not zeroed between steps) and returns a dict of metrics or
                None. It runs in the worker's thread, concurrently with other workers.
            steps: number of steps.
            start_step: the first step (the learning rate is a function of the step).
            on_step: ``on_step(step, metrics_by_rank)``, in the caller's thread, in step
                order. An exception in it stops the run and is raised.

        Returns:
            For each step, each worker's metrics by rank (None for a worker gone).

        Raises:
            ClusterError: a worker failed (its exception chained) under
                ``on_worker_failure: stop``, every worker failed, a wait timed out, or a
                gradient was non-finite under ``nonfinite: error``.
        """
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ParamError(f"steps must be an integer >= 0, not {steps!r}")
        busy = [t.name for t in self._threads if t.is_alive()]
        if busy:
            raise ClusterError(f"a worker of the previous run is still busy ({busy[0]}, in "
                               "its gradient function); cannot start another run")
        start = self.step if start_step is None else int(start_step)
        stop = start + int(steps)
        self._failure = None
        if not self._replicas_ready:  # the values as the first run finds them, everywhere
            for values in self._values[1:]:
                np.copyto(values, self.params.values)
            self._replicas_ready = True
        self._put(start)
        if steps == 0:
            self.step = start
            return []
        events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._threads = [threading.Thread(
            target=self._work, args=(w, grad_fn, start, stop, events), daemon=True,
            name=f"paramserver-worker-{w.group}.{w.index}") for w in self.workers]
        for t in self._threads:
            t.start()
        try:
            results = self._gather(events, start, stop, on_step)
        except BaseException as e:  # on_step raised, or KeyboardInterrupt
            self._fail(f"the run was stopped in the caller: {type(e).__name__}: {e}", e)
            self._join(time.monotonic() + self.conf.timeout)
            raise
        self._join(time.monotonic() + self.conf.timeout)
        self._set_param_versions()
        if self._failure is not None:
            message, cause = self._failure
            if isinstance(cause, ClusterError) and str(cause) == message:
                raise cause
            raise ClusterError(message) from cause
        self.step = stop
        return results

    def _work(self, worker: Worker, grad_fn: GradFn, start: int, stop: int,
              events: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        step = start
        c = self.conf
        served_together = len(range(worker.server_group, c.nworker_groups, c.nserver_groups))
        staleness = c.staleness if served_together > 1 else None
        try:
            worker.pull(step)  # the put is done: for these threads, only a formality
            for step in range(start, stop):
                if staleness is not None and step - staleness > start:
                    worker.pull(step, clock=step - staleness)
                worker.step = step
                try:
                    metrics = grad_fn(worker, step)
                except Exception as e:
                    raise _GradFnFailed() from e
                worker.collect(worker.push(step, flush=step == stop - 1), step)
                events.put(("step", worker.rank, step, metrics))
        except _GradFnFailed as failed:
            cause = failed.__cause__
            assert cause is not None
            message = (f"{worker.name} (rank {worker.rank}) failed at step {step}: "
                       f"{type(cause).__name__}: {cause}")
            if self.conf.on_worker_failure == "continue":
                warnings.warn(f"{message}; the run goes on without it "
                              "(cluster.on_worker_failure is 'continue')", RuntimeWarning,
                              stacklevel=1)
                try:
                    worker.leave(step)
                    events.put(("left", worker.rank, step, message, cause))
                except BaseException as e:
                    self._fail(str(e), e)
            else:
                self._fail(message, cause)
        except BaseException as e:
            self._fail(str(e) if isinstance(e, ClusterError) else
                       f"{worker.name} (rank {worker.rank}) failed at step {step}: "
                       f"{type(e).__name__}: {e}", e)
        finally:
            events.put(("end", worker.rank))

    def _fail(self, message: str, cause: BaseException) -> None:
        """Stop the run; the first failure is the one reported."""
        with self._failure_lock:
            if self._failure is not None:
                return
            self._failure = (message, cause)
        self.transport.abort(f"the run was stopped: {message}")

    def _gather(self, events: queue.SimpleQueue[tuple[Any, ...]], start: int, stop: int,
                on_step: OnStep | None) -> list[list[Mapping[str, Any] | None]]:
        n = len(self.workers)
        results: list[list[Mapping[str, Any] | None]] = [[None] * n for _ in range(start, stop)]
        counts = [0] * (stop - start)
        left_at: dict[int, int] = {}
        left: list[tuple[str, BaseException]] = []
        ended, reported = 0, start

        def complete(step: int) -> bool:
            live = sum(1 for r in range(n) if left_at.get(r, stop) > step)
            return counts[step - start] >= live

        # Workers' own waits time out after `timeout`; this one catches what they cannot:
        # every worker stuck in its gradient function.
        limit = 2 * self.conf.timeout
        last = time.monotonic()
        running = set(range(n))
        while ended < n:
            try:
                event = events.get(timeout=min(1.0, limit / 4))
            except queue.Empty:
                if not any(t.is_alive() for t in self._threads):
                    break  # every thread is gone (they always send "end"; a safeguard)
                if time.monotonic() - last > limit:
                    busy = ", ".join(f"{w.name} (rank {w.rank}) at step {w.step}"
                                     for w in self.workers if w.rank in running)
                    self._fail(f"the run waited {limit:g} s (twice cluster.timeout) without "
                               f"a step finishing; still running: {busy}",
                               ClusterError("no progress"))
                    return results
                continue
            last = time.monotonic()
            kind = event[0]
            if kind == "step":
                _, rank, step, metrics = event
                results[step - start][rank] = metrics
                counts[step - start] += 1
            elif kind == "left":
                _, rank, step, message, cause = event
                left_at[rank] = step
                left.append((message, cause))
            elif kind == "end":
                ended += 1
                running.discard(event[1])
            if self._failure is not None:
                return results
            while reported < stop and complete(reported):
                if on_step is not None:
                    on_step(reported, results[reported - start])
                reported += 1
        if len(left) == n:
            message, cause = left[0]
            self._fail(f"every worker failed; the first: {message}", cause)
        return results

    def _join(self, deadline: float) -> None:
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _set_param_versions(self) -> None:
        """Each owner Param's version: the smallest of its slices' in server group 0."""
        per_owner = owner_versions(self.layouts, lambda L: self.servers[(0, L.index)].versions)
        for owner, version in per_owner.items():
            self.params.owners[owner].version = version

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything a resume needs, as flat arrays (no pickle): see
        :mod:`paramserver.cluster.state`."""
        return join_state(self.step, self.layouts,
                          {a: server.state_dict() for a, server in self.servers.items()})

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output; checked whole before anything changes."""
        problems, parts = split_state(state, self.layouts, self.servers)
        for (g, s), server in self.servers.items():
            problems += server.check_state(parts[(g, s)], f"server/{g}/{s}/")
        if problems:
            raise ParamError(problems)
        for address, server in self.servers.items():
            server.load_state_dict(parts[address])
        self.step = int(state["step"])
        self._replicas_ready = True
        self._set_param_versions()

    def __repr__(self) -> str:
        c = self.conf
        return (f"Cluster({c.nworker_groups}×{c.nworkers_per_group} workers, "
                f"{c.nserver_groups}×{c.nservers_per_group} servers, step {self.step})")


__all__ = ["Cluster", "GradFn", "OnStep"]
