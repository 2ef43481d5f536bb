"""The Ray backend: servers and workers as Ray actors, the same code beneath (SPEC §7).

``Cluster(job, params)`` with ``cluster { backend: "ray" }`` makes a :class:`RayCluster`:

- every server of every server group is a :class:`~paramserver.cluster.ray_actors.ServerActor`
  holding the embedded :class:`~paramserver.cluster.server.Server`, and every worker a
  :class:`~paramserver.cluster.ray_actors.WorkerActor` holding the embedded
  :class:`~paramserver.cluster.worker.Worker` stub; they exchange the same messages, through
  Ray's object store (:mod:`paramserver.cluster.ray_transport`);
- actors are built from plain data (configurations as JSON, ranges and Params as arrays,
  user modules by name; :mod:`paramserver.cluster.ray_wire`), never from pickled objects of
  ours; the gradient function is the user's callable (pickled by Ray) or a
  :class:`~paramserver.cluster.ray_wire.RemoteGradFn` that each worker builds itself;
- this process (the driver) runs no step: it asks each worker actor for its steps, a few
  ahead, collects the metrics and calls ``on_step`` in step order, as the embedded cluster
  does. Groups are synchronous or asynchronous exactly as embedded, since the servers'
  code decides.

Fault tolerance:

- A run is cut into parts every ``checkpoint_freq`` steps; between parts every worker has
  stopped. At the end of every part (and at the start of a run with no checkpoint of its
  first step yet) the servers write their slices (values, updater state, versions;
  :func:`~paramserver.checkpoint.save_checkpoint`: atomic, no pickle). A server actor that
  dies is restarted by Ray (``max_restarts``); the driver then brings every server back to
  its checkpoint of the part's first step and runs the part again: everything a step
  computes is a function of (seed, step, worker), so the result is the one of a run without
  failure. ``on_step`` is not called twice for a step.
- A worker actor that dies is seen at once (its step's reference fails) and any wait ends
  within ``cluster.timeout``: under ``on_worker_failure: stop`` the run stops with a
  :class:`ClusterError` naming the worker and the step; under ``continue`` the driver tells
  its servers that it left (a ``Leave``) and the group goes on without it.
"""

from __future__ import annotations

import builtins
import collections
import itertools
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import list_checkpoints
from ..config import ParamError
from ..config.job import ClusterConf, JobConf, UpdaterConf
from ..params import ParamSet
from ..updaters import Updater
from .errors import ClusterError
from .layout import ServerLayout, plan_servers
from .messages import Address, Get, GetReply, Leave, Put, Request
from .ray_wire import (
    RemoteGradFn,
    ServerLost,
    layout_to_data,
    main_components,
    params_to_data,
    user_modules,
)
from .runtime import Cluster, GradFn, OnStep, _check_conf, _cluster_conf, _updater_of
from .server import Server
from .state import join_state, owner_versions, split_state
from .transport import Transport


def _rewarn(caught: Any) -> None:
    """Warnings of a worker actor's step, raised again here (``(category, message)``)."""
    for category, text in caught:
        cls = getattr(builtins, category, None)
        warnings.warn(text, cls if isinstance(cls, type) and issubclass(cls, Warning)
                      else UserWarning, stacklevel=6)


def import_ray() -> Any:
    """The ``ray`` module, or a ParamError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ParamError("cluster.backend 'ray' needs Ray: pip install 'paramserver[ray]' "
                         "(or 'ray>=2.9')") from None
    return ray


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect this process to Ray; returns True when this call started it.

    With Ray already connected (``ray.init`` called by you, with the options you need),
    that connection is used. Otherwise, with ``address``, this joins the existing cluster
    there (``HOST:6379`` or ``ray://HOST:10001``); without, it starts a local instance whose
    processes listen on 127.0.0.1 only, without a dashboard.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, logging_level="WARNING")
        except Exception as e:
            hint = ("; it uses token authentication: set RAY_AUTH_MODE=token here, with the "
                    "cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN)"
                    if "auth" in f"{type(e).__name__} {e!r} {e.__cause__!r}".lower() else "")
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ClusterError(f"cannot join the Ray cluster at {address}: {first}{hint}"
                               ) from e
    else:
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                 num_cpus=num_cpus, logging_level="WARNING")
    return True


class RemoteWorker:
    """A worker of the Ray backend, seen from the driver: who it is and its actor."""

    def __init__(self, group: int, index: int, rank: int, actor: Any):
        self.group = group
        self.index = index
        self.rank = rank
        self.actor = actor
        self.name = f"worker {index} of group {group}"

    def __repr__(self) -> str:
        return f"RemoteWorker({self.name}, rank={self.rank})"


class _Failure(Exception):
    """The first failure of a part of a run (message, cause, and whether a server died)."""

    def __init__(self, message: str, cause: BaseException | None = None,
                 server_lost: bool = False):
        super().__init__(message)
        self.message = message
        self.cause = cause
        self.server_lost = server_lost

    def error(self) -> ClusterError:
        if isinstance(self.cause, ClusterError) and str(self.cause) == self.message:
            return self.cause
        err = ClusterError(self.message)
        err.__cause__ = self.cause
        return err


class RayCluster(Cluster):
    """Parameter servers and workers as Ray actors; see the module docstring.

    Made by ``Cluster(job, params)`` when ``job.cluster.backend`` is ``"ray"``, with the
    arguments of :class:`~paramserver.cluster.Cluster` and these:

    Args:
        placement: ``"spread"`` places the actors on as many nodes as Ray can (Ray's
            ``SPREAD`` strategy); ``None`` (default) leaves it to Ray.
        server_options, worker_options: options for Ray's ``.options()`` of every server /
            worker actor (``num_cpus``, ``resources``, ``scheduling_strategy`` — e.g. a
            placement group or a node —, ``runtime_env``...), or a function of the server's
            address ``(group, index)`` / the worker's rank returning them.
        checkpoint_dir: the folder of the servers' checkpoints (default: a temporary folder,
            removed by :meth:`close`). On several machines, a folder every node can reach.
        checkpoint_freq: steps between server checkpoints within a run (default: the job's
            ``checkpoint_freq``; 0: at the end of every run only).
        max_restarts: restarts of a server actor (and recoveries of one run) allowed.
        modules: more modules for every actor to import (those that registered a user's
            components are imported without being named).
        window: steps each worker is given ahead of the one it runs.

    Attributes:
        servers: the server actors, ``{(server group, index): actor}`` (servers with no
            slice have none); ``workers``: every :class:`RemoteWorker`, by rank.
        checkpoint_dir: where the servers' checkpoints are.
    """

    def __init__(self, job: JobConf | ClusterConf | Mapping[str, Any], params: ParamSet,
                 updater: Updater | UpdaterConf | Mapping[str, Any] | str | None = None, *,
                 transport: Callable[[Mapping[Address, Server]], Transport] | None = None,
                 placement: str | None = None,
                 server_options: Mapping[str, Any] | Callable[[Address], Mapping[str, Any]]
                 | None = None,
                 worker_options: Mapping[str, Any] | Callable[[int], Mapping[str, Any]]
                 | None = None,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_freq: int | None = None, max_restarts: int = 3,
                 modules: tuple[str, ...] | list[str] = (), window: int = 2):
        conf = _cluster_conf(job)
        if transport is not None:
            raise ParamError("the Ray backend has its own transport; 'transport' is for the "
                             "embedded cluster")
        if placement not in (None, "spread"):
            raise ParamError(f"placement must be None or 'spread', not {placement!r}")
        self._ray = import_ray()
        self.conf = conf
        self.updater = _updater_of(job, updater)
        _check_conf(conf)
        self.params = params
        self.layouts: list[ServerLayout] = plan_servers(params, conf.nservers_per_group)
        self.step = 0
        self.max_restarts = int(max_restarts)
        self.window = max(1, int(window))
        if checkpoint_freq is None:
            checkpoint_freq = job.checkpoint_freq if isinstance(job, JobConf) else 0
        self.checkpoint_freq = int(checkpoint_freq)
        self._temp_dir = checkpoint_dir is None
        self.checkpoint_dir = Path(checkpoint_dir if checkpoint_dir is not None  # absolute:
                                   else tempfile.mkdtemp(prefix="paramserver-servers-")
                                   ).absolute()  # actors may have another working folder
        self._owns_ray = False
        self.servers: dict[Address, Any] = {}
        self.workers: list[RemoteWorker] = []  # type: ignore[assignment]
        self._closed = False
        # Servers with nothing to hold take no part; they are kept here for state_dict.
        self._idle: dict[Address, Server] = {}
        self._dead: dict[int, int] = {}  # workers whose actor died: rank -> step
        self._busy: list[Any] = []  # step references of a run that did not finish
        self._skipped: dict[int, int] = {}
        self._fresh = True  # the servers have not yet started from params.values
        self._checkpointed: int | None = None  # the step of the servers' newest checkpoint
        self._incarnations: dict[Address, str] = {}
        failure: _Failure | None = None
        try:
            self._owns_ray = start_ray(conf.ray_address)
            self._start(placement, server_options, worker_options, list(modules))
        except _Failure as f:
            failure = f
        except BaseException:
            self.close()
            raise
        if failure is not None:
            self.close()
            raise failure.error()

    # -- actors -----------------------------------------------------------------------------

    def _names(self, group: int) -> dict[Address, str]:
        c = self.conf
        return {(group, L.index): (f"server {L.index}" if c.nserver_groups == 1 else
                                   f"server {L.index} of server group {group}")
                for L in self.layouts}

    def _start(self, placement: str | None, server_options: Any, worker_options: Any,
               modules: list[str]) -> None:
        from .ray_actors import ServerActor, WorkerActor, server_folder
        from .ray_transport import RayTransport

        ray, c, params = self._ray, self.conf, self.params
        main = main_components()
        if main:
            warnings.warn(f"components registered in __main__ ({', '.join(main)}) cannot be "
                          "imported by Ray actors; define them in a module (paramserver "
                          "--import MODULE)", RuntimeWarning, stacklevel=3)
        common = {"cluster": c.to_json(), "modules": sorted({*user_modules(), *modules}),
                  "sys_path": [os.getcwd(), *(p for p in sys.path if isinstance(p, str))]}

        def options(base: dict[str, Any], extra: Any, key: Any) -> dict[str, Any]:
            opts = dict(base)
            if placement == "spread":
                opts["scheduling_strategy"] = "SPREAD"
            opts.update((extra(key) if callable(extra) else extra) or {})
            return opts

        server_cls = ray.remote(ServerActor)
        # Requests that can wait in a server at once: one per worker it serves, their
        # diagnoses, the syncs of the other server groups, and the driver's.
        threads = 2 * c.nworker_groups * c.nworkers_per_group + c.nserver_groups + 16
        for g in range(c.nserver_groups):
            for L in self.layouts:
                address = (g, L.index)
                if L.size == 0:  # as embedded: no actor, no put, only its (empty) state
                    self._idle[address] = Server(L, self.updater, c, g)
                    continue
                folder = server_folder(self.checkpoint_dir, address)
                for _, old in list_checkpoints(folder):  # of an earlier run of this folder
                    old.unlink()
                spec = {**common, "group": g, "layout": layout_to_data(L),
                        "updater": self.updater.conf.to_json(),
                        "checkpoint_dir": str(self.checkpoint_dir), "names": self._names(0)}
                self.servers[address] = server_cls.options(**options(
                    {"max_restarts": self.max_restarts, "max_task_retries": 0,
                     "max_concurrency": threads}, server_options, address)).remote(spec)
        worker_cls = ray.remote(WorkerActor)
        spec_params = params_to_data(params)
        layouts = [layout_to_data(L) for L in self.layouts]
        for g in range(c.nworker_groups):
            s = g % c.nserver_groups
            handles = {(s, L.index): self.servers[(s, L.index)]
                       for L in self.layouts if L.size > 0}
            for i in range(c.nworkers_per_group):
                rank = g * c.nworkers_per_group + i
                spec = {**common, "group": g, "index": i, "params": spec_params,
                        "layouts": layouts, "names": self._names(s)}
                actor = worker_cls.options(**options(
                    {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 1},
                    worker_options, rank)).remote(spec, handles)
                self.workers.append(RemoteWorker(g, i, rank, actor))
        self._server_names = {a: n for g in range(c.nserver_groups)
                              for a, n in self._names(g).items()}
        self.transport = RayTransport(self.servers, self._server_names)
        wait = max(60.0, c.timeout)
        pings = {a: h.ping.remote() for a, h in self.servers.items()}
        try:
            self._ray.get([w.actor.ping.remote() for w in self.workers], timeout=wait)
            self._incarnations = {a: self._ray.get(r, timeout=wait) for a, r in pings.items()}
        except self._ray.exceptions.GetTimeoutError:
            raise ClusterError(f"the {len(self.servers) + len(self.workers)} Ray actors of the "
                               f"cluster did not start within {wait:g} s; does the Ray "
                               "cluster have room for them (resources, placement)?") from None
        except self._ray.exceptions.RayActorError as e:
            raise ClusterError(f"a Ray actor of the cluster could not start: {e}") from None
        self._connect()
        self._put_values(0)

    def _connect(self) -> None:
        """Servers of groups > 0 get the master group's actors (for their syncs)."""
        masters = {a: h for a, h in self.servers.items() if a[0] == 0}
        self._ask({a: h.connect.remote(masters) for a, h in self.servers.items() if a[0] > 0},
                  "a connect")

    # -- messages from the driver -----------------------------------------------------------

    def _ask(self, calls: Mapping[Address, Any], what: str, timeout: float | None = None
             ) -> dict[Address, Any]:
        """The results of one call per server actor (references), or a ClusterError."""
        ray = self._ray
        timeout = self.conf.timeout if timeout is None else timeout
        out = {}
        for address, ref in calls.items():
            name = self._server_names[address]
            try:
                out[address] = ray.get(ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise _Failure(f"the driver waited {timeout:g} s for {what} of {name}"
                               ) from None
            except ray.exceptions.RayActorError as e:
                raise _Failure(f"{name} was lost during {what}: its Ray actor died "
                               f"({type(e).__name__})", server_lost=True) from None
            except ray.exceptions.RayTaskError as e:
                raise _Failure(f"{what} failed on {name}: {type(e.cause).__name__}: "
                               f"{e.cause}", e.cause) from None
            if isinstance(out[address], tuple) and out[address][:1] == ("error",):
                raise _Failure(str(out[address][1]))
        return out

    def _send_all(self, requests: Mapping[Address, Request], what: str) -> dict[Address, Any]:
        pendings = {a: self.transport.send(a, r, what) for a, r in requests.items()}
        return {a: p.wait(self.conf.timeout, "the driver") for a, p in pendings.items()}

    def _put_values(self, step: int) -> None:
        """Every server group starts from ``params.values`` (the first run; construction)."""
        vals = self.params.values
        self._send_all({a: Put(vals[L.start:L.stop], self.params.num_shares[L.owners], step)
                        for a in self.servers for L in (self.layouts[a[1]],)}, "a put")

    def _begin(self, step: int, gone: Mapping[int, int]) -> None:
        """Servers start a part of a run at ``step``: values, clocks, who is gone; and
        their checkpoint of that step, unless the end of the part before wrote it."""
        if self._fresh:
            self._put_values(step)
            self._fresh = False
            self._checkpointed = None
        else:
            self._ask({a: h.restart.remote(step) for a, h in self.servers.items()},
                      "a restart")
        self._leave(gone, step)
        if self._checkpointed != step:
            self._checkpoint(step)

    def _checkpoint(self, step: int) -> None:
        """Every server writes its slices as of ``step`` (between parts: nothing moves)."""
        self._checkpointed = None
        self._ask({a: h.checkpoint.remote(step) for a, h in self.servers.items()},
                  "a checkpoint", max(60.0, self.conf.timeout))
        self._checkpointed = step

    def _leave(self, gone: Mapping[int, int], step: int) -> None:
        """The servers hear that the workers ``gone`` send nothing from ``step`` on."""
        c = self.conf
        for rank in sorted(gone):
            w = self.workers[rank]
            s = w.group % c.nserver_groups
            self._send_all({(s, L.index): Leave(w.group, w.index, step)
                            for L in self.layouts if L.size > 0}, "a leave")

    def _recover(self, step: int, gone: Mapping[int, int]) -> None:
        """Wait for every server actor to be up, and bring each back to its checkpoint of
        ``step`` (the restarted ones, and the others with them)."""
        ray = self._ray
        deadline = time.monotonic() + max(60.0, 2 * self.conf.timeout)
        for address, h in self.servers.items():
            name = self._server_names[address]
            while True:
                try:
                    ray.get(h.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
                    break
                except ray.exceptions.ActorDiedError:
                    raise ClusterError(f"{name} died and Ray did not restart it (max_restarts "
                                       f"{self.max_restarts})") from None
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{name} was not back within "
                                           f"{max(60.0, 2 * self.conf.timeout):g} s after its "
                                           "actor died") from None
                    time.sleep(0.2)
        self._connect()
        self._incarnations = self._ask(
            {a: h.restore.remote(step) for a, h in self.servers.items()}, "a restore",
            max(60.0, self.conf.timeout))
        self._leave(gone, step)

    def _servers_restarted(self) -> bool:
        """Whether a server actor died (and is restarting or restarted) since we looked."""
        ray = self._ray
        for address, h in self.servers.items():
            try:
                now = ray.get(h.ping.remote(), timeout=self.conf.timeout)
            except ray.exceptions.RayActorError:
                return True
            except ray.exceptions.GetTimeoutError:
                continue
            if now != self._incarnations.get(address):
                return True
        return False

    # -- running ----------------------------------------------------------------------------

    @property
    def skipped_pushes(self) -> int:
        return sum(self._skipped.values())

    def _ship(self, grad_fn: GradFn | RemoteGradFn) -> Any:
        if isinstance(grad_fn, RemoteGradFn):
            return ("remote-grad-fn", *grad_fn.to_data())
        if not callable(grad_fn):
            raise ParamError(f"grad_fn must be callable, not {type(grad_fn).__name__}")
        try:
            return self._ray.put(grad_fn)
        except Exception as e:
            raise ClusterError(f"the gradient function cannot be sent to the Ray workers (it "
                               f"must pickle): {type(e).__name__}: {e}") from e

    def _parts(self, start: int, stop: int) -> list[tuple[int, int]]:
        f = self.checkpoint_freq
        cuts = [start, *(s for s in range(start + 1, stop) if f and s % f == 0), stop]
        return list(itertools.pairwise(cuts))

    def run(self, grad_fn: GradFn | RemoteGradFn, steps: int,  # type: ignore[override]
            start_step: int | None = None, on_step: OnStep | None = None
            ) -> list[list[Mapping[str, Any] | None]]:
        """Run ``steps`` steps on every worker actor; see
        :meth:`paramserver.cluster.Cluster.run`.

        ``grad_fn`` runs in the worker actors: a callable (Ray pickles it, with what it
        refers to) or a :class:`RemoteGradFn`. ``worker.params`` there is the worker's own
        replica.
        """
        if self._closed:
            raise ClusterError("the cluster was closed")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ParamError(f"steps must be an integer >= 0, not {steps!r}")
        if self._busy:
            _, self._busy = self._ray.wait(self._busy, num_returns=len(self._busy), timeout=0)
            if self._busy:
                raise ClusterError("a worker of the previous run is still busy (in its "
                                   "gradient function); cannot start another run")
        if self._dead and self.conf.on_worker_failure != "continue":
            rank, step = min(self._dead.items())
            raise ClusterError(f"{self.workers[rank].name} (rank {rank}) died at step {step}; "
                               "with cluster.on_worker_failure 'stop' this cluster does not "
                               "run without it (make a new one)")
        start = self.step if start_step is None else int(start_step)
        stop = start + int(steps)
        n = len(self.workers)
        results: list[list[Mapping[str, Any] | None]] = [[None] * n for _ in range(start, stop)]
        failure: _Failure | None = None
        try:
            if steps == 0:
                self._begin(start, self._dead)
            else:
                fn = self._ship(grad_fn)
                left: dict[int, int] = {}
                reported = [start]
                for first, last in self._parts(start, stop):
                    self._run_part(fn, first, last, start, results, left, reported, on_step)
            self._pull_values()
        except _Failure as f:
            failure = f
        if failure is not None:  # raised here, with its cause and without this context
            raise failure.error()
        self.step = stop
        return results

    def _run_part(self, fn: Any, first: int, last: int, run_start: int,
                  results: list[list[Mapping[str, Any] | None]], left: dict[int, int],
                  reported: list[int], on_step: OnStep | None) -> None:
        """Steps ``[first, last)``; on the loss of a server, restore and run them again."""
        for attempt in range(self.max_restarts + 1):
            try:
                if attempt == 0:
                    self._begin(first, {**self._dead, **left})
                else:
                    self._recover(first, {**self._dead, **left})
                self._drive(fn, first, last, run_start, results, left, reported, on_step)
                # Written at the end of a part, the checkpoint also serves a server that
                # dies before the next part (or run) begins.
                self._checkpoint(last)
                return
            except (_Failure, ClusterError) as e:
                f = e if isinstance(e, _Failure) else _Failure(str(e), e,
                                                               isinstance(e, ServerLost))
                if self._busy or not (f.server_lost or self._servers_restarted()):
                    raise f from None  # a worker stuck in its step cannot run it again
                if attempt == self.max_restarts:
                    raise _Failure(f"{f.message} (gave up after {attempt} recoveries)",
                                   f.cause) from None
                warnings.warn(f"a server actor was lost at {f.message!r}; the servers go back "
                              f"to their checkpoint of step {first} and steps {first} to "
                              f"{last - 1} run again", RuntimeWarning, stacklevel=4)
                # A worker whose gradient function failed runs again (and fails again, at
                # the same step); a dead one stays gone.
                for rank in [r for r, s in left.items() if s >= first]:
                    del left[rank]
                self._recover(first, {**self._dead, **left})

    def _drive(self, fn: Any, first: int, last: int, run_start: int,
               results: list[list[Mapping[str, Any] | None]], left: dict[int, int],
               reported: list[int], on_step: OnStep | None) -> None:
        """Give the live workers their steps, gather what they report, call ``on_step``."""
        ray, c = self._ray, self.conf
        served = {g: len(range(g % c.nserver_groups, c.nworker_groups, c.nserver_groups))
                  for g in range(c.nworker_groups)}
        # Workers gone before this part, or whose actor died in a failed try of it (they do
        # not run it again), take no part from its first step.
        gone = {r: min(s, first) for r, s in {**self._dead, **left}.items()}
        live = [w for w in self.workers if w.rank not in gone]
        n = len(self.workers)
        queues: dict[int, collections.deque[tuple[int, Any]]] = {
            w.rank: collections.deque() for w in live}
        next_step = {w.rank: first for w in live}
        counts = [0] * (last - first)
        orphans: list[Any] = []  # references of workers that stopped
        failure: _Failure | None = None

        def clock(w: RemoteWorker, step: int) -> int | None:
            s = c.staleness if served[w.group] > 1 else None
            return step - s if s is not None and step - s > first else None

        def submit(w: RemoteWorker) -> None:
            q = queues[w.rank]
            while len(q) < self.window and next_step[w.rank] < last:
                s = next_step[w.rank]
                q.append((s, w.actor.step.remote(s, s == last - 1, clock(w, s), s == first)))
                next_step[w.rank] = s + 1

        def stop_worker(rank: int) -> None:
            orphans.extend(ref for _, ref in queues.pop(rank, ()))

        def live_at(step: int) -> int:
            return sum(1 for r in range(n) if gone.get(r, last) > step)

        if not live:
            raise _Failure("no worker is left: every worker's actor died")
        self._set_grad_fn(live, fn)
        for w in live:
            submit(w)
        limit = 2 * c.timeout
        last_event = time.monotonic()
        first_left: tuple[str, BaseException | None] | None = None
        try:
            while failure is None and any(queues.values()):
                heads = {q[0][1]: rank for rank, q in queues.items() if q}
                ready, _ = ray.wait(list(heads), num_returns=1, timeout=min(1.0, limit / 4))
                if not ready:
                    if time.monotonic() - last_event > limit:
                        busy = ", ".join(f"{self.workers[r].name} (rank {r}) at step {q[0][0]}"
                                         for r, q in queues.items() if q)
                        failure = _Failure(f"the run waited {limit:g} s (twice cluster.timeout)"
                                           f" without a step finishing; still running: {busy}")
                    continue
                last_event = time.monotonic()
                rank = heads[ready[0]]
                w = self.workers[rank]
                step, ref = queues[rank].popleft()
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # e.g. metrics that do not pickle
                    stop_worker(rank)
                    failure = _Failure(f"{w.name} (rank {rank}) failed at step {step}: "
                                       f"{type(e.cause).__name__}: {e.cause}", e.cause)
                    break
                except ray.exceptions.RayActorError as e:
                    message = (f"{w.name} (rank {rank}) died at step {step}: its Ray actor is "
                               f"gone ({type(e).__name__})")
                    stop_worker(rank)
                    self._dead[rank] = gone[rank] = step
                    if c.on_worker_failure != "continue":
                        failure = _Failure(message, e)
                        break
                    warnings.warn(f"{message}; the run goes on without it "
                                  "(cluster.on_worker_failure is 'continue')", RuntimeWarning,
                                  stacklevel=5)
                    first_left = first_left or (message, e)
                    try:
                        self._leave({rank: step}, step)
                    except ClusterError as err:
                        failure = _Failure(str(err), err)
                        break
                    out = {"kind": "skipped", "warnings": []}
                _rewarn(out.get("warnings", ()))
                if isinstance(out.get("skipped"), int):
                    self._skipped[rank] = out["skipped"]
                kind = out["kind"]
                if kind == "ok":
                    results[step - run_start][rank] = out["metrics"]
                    counts[step - first] += 1
                    submit(w)
                elif kind == "left":
                    stop_worker(rank)
                    left[rank] = gone[rank] = step
                    warnings.warn(f"{out['message']}; the run goes on without it "
                                  "(cluster.on_worker_failure is 'continue')", RuntimeWarning,
                                  stacklevel=5)
                    first_left = first_left or (out["message"], out.get("cause"))
                elif kind in ("failed", "error"):
                    stop_worker(rank)
                    failure = _Failure(out["message"], out.get("cause"),
                                       bool(out.get("server_lost")))
                    break
                if len(gone) == n and first_left is not None:
                    failure = _Failure(f"every worker failed; the first: {first_left[0]}",
                                       first_left[1])
                    break
                while reported[0] < last and counts[reported[0] - first] >= live_at(
                        reported[0]):
                    if on_step is not None:
                        on_step(reported[0], results[reported[0] - run_start])
                    reported[0] += 1
        except BaseException as e:  # on_step raised, or KeyboardInterrupt
            self._stop(f"the run was stopped in the caller: {type(e).__name__}: {e}",
                       [ref for q in queues.values() for _, ref in q] + orphans)
            raise
        if failure is not None:
            self._stop(f"the run was stopped: {failure.message}",
                       [ref for q in queues.values() for _, ref in q] + orphans)
            raise failure
        self._drain(orphans)

    def _set_grad_fn(self, live: list[RemoteWorker], fn: Any) -> None:
        refs = {w.rank: w.actor.set_grad_fn.remote(fn) for w in live}
        for rank, ref in refs.items():
            w = self.workers[rank]
            try:
                self._ray.get(ref, timeout=max(60.0, self.conf.timeout))
            except self._ray.exceptions.RayTaskError as e:
                raise _Failure(f"{w.name} (rank {rank}) could not make its gradient function: "
                               f"{type(e.cause).__name__}: {e.cause}", e.cause) from None
            except self._ray.exceptions.RayActorError as e:
                raise _Failure(f"{w.name} (rank {rank}) died before its first step: its Ray "
                               f"actor is gone ({type(e).__name__})", e) from None
            except self._ray.exceptions.GetTimeoutError:
                raise _Failure(f"{w.name} (rank {rank}) did not take its gradient function "
                               "in time") from None

    def _stop(self, reason: str, refs: list[Any]) -> None:
        """Answer every waiting request with ``reason``; wait for the workers' steps."""
        self.transport.abort(reason)
        self._drain(refs)

    def _drain(self, refs: list[Any]) -> None:
        if not refs:
            return
        _, pending = self._ray.wait(refs, num_returns=len(refs), timeout=self.conf.timeout)
        self._busy = list(pending)

    def _pull_values(self) -> None:
        """``params.values`` and the owners' versions from server group 0."""
        replies = self._send_all({(0, L.index): Get(0, 0, self.step, 0, None)
                                  for L in self.layouts if L.size > 0}, "a get")
        versions: dict[int, np.ndarray] = {}
        for (_, index), reply in replies.items():
            assert isinstance(reply, GetReply)
            L = self.layouts[index]
            np.copyto(self.params.values[L.start:L.stop], reply.values)
            versions[index] = reply.versions
        per_owner = owner_versions(self.layouts, lambda L: versions[L.index] if L.index in
                                   versions else self._idle[(0, L.index)].versions)
        for owner, version in per_owner.items():
            self.params.owners[owner].version = version

    # -- checkpoints ------------------------------------------------------------------------

    def _server_states(self) -> dict[Address, dict[str, np.ndarray]]:
        remote = self._ask({a: h.state_dict.remote() for a, h in self.servers.items()},
                           "its state")
        return {a: remote[a] if a in remote else self._idle[a].state_dict()
                for a in self._addresses()}

    def _addresses(self) -> list[Address]:
        return [(g, L.index) for g in range(self.conf.nserver_groups) for L in self.layouts]

    def state_dict(self) -> dict[str, np.ndarray]:
        """As :meth:`paramserver.cluster.Cluster.state_dict`, gathered from the actors."""
        try:
            states = self._server_states()
        except _Failure as f:
            raise f.error() from None
        return join_state(self.step, self.layouts, states)

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """As :meth:`paramserver.cluster.Cluster.load_state_dict`, into the actors."""
        problems, parts = split_state(state, self.layouts, self._addresses())
        try:
            remote = self._ask({a: h.check_state.remote(parts[a], f"server/{a[0]}/{a[1]}/")
                                for a, h in self.servers.items()}, "a check of a state")
        except _Failure as f:
            raise f.error() from None
        for (g, s) in self._addresses():
            problems += (remote[(g, s)] if (g, s) in remote else
                         self._idle[(g, s)].check_state(parts[(g, s)], f"server/{g}/{s}/"))
        if problems:
            raise ParamError(problems)
        try:
            self._ask({a: h.load_state_dict.remote(parts[a]) for a, h in self.servers.items()},
                      "a load of a state")
        except _Failure as f:
            raise f.error() from None
        for address, server in self._idle.items():
            server.load_state_dict(parts[address])
        for L in self.layouts:
            np.copyto(self.params.values[L.start:L.stop], parts[(0, L.index)]["values"])
        self.step = int(state["step"])
        self._fresh = False
        self._checkpointed = None
        per_owner = owner_versions(self.layouts, lambda L: parts[(0, L.index)]["versions"])
        for owner, version in per_owner.items():
            self.params.owners[owner].version = version

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the actors, remove a temporary checkpoint folder, and stop Ray if this
        cluster started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray = getattr(self, "_ray", None)
        if ray is not None and ray.is_initialized():
            for actor in [*self.servers.values(), *(w.actor for w in self.workers)]:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # gone already
                    pass
            if self._owns_ray:
                ray.shutdown()
        if self._temp_dir:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.conf
        return (f"RayCluster({c.nworker_groups}×{c.nworkers_per_group} worker actors, "
                f"{c.nserver_groups}×{c.nservers_per_group} servers, step {self.step})")


__all__ = ["RayCluster", "RemoteGradFn", "RemoteWorker", "import_ray", "start_ray"]
