"""The cluster (SPEC §7): servers and workers built from a job, and the runs that train.

:class:`Cluster` builds the slices, the servers of every server group and the workers of
every worker group from a :class:`~paramserver.config.job.ClusterConf`, a
:class:`~paramserver.params.ParamSet` and an :class:`~paramserver.updaters.Updater`, and
:meth:`Cluster.run` runs training steps with a user's gradient function::

    cluster = Cluster(job, params)                  # job.cluster, job.updater
    def grad_fn(worker, step):
        loss = model_grads(worker.params, batch(worker.rank, step))   # fills .grad
        return {"loss": loss}
    metrics = cluster.run(grad_fn, steps=100)       # metrics[i][rank]

Where the servers and workers live is the backend, chosen by ``cluster.backend``: ``local``
(embedded: :mod:`~paramserver.cluster.local`, threads of this process) or ``ray``
(:mod:`~paramserver.cluster.ray_backend`, Ray actors). A run is the same on both: the
:class:`~paramserver.cluster.driver.Driver` gives the servers their values, starts the
workers and gathers their outcomes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import ClusterConf, JobConf, UpdaterConf
from ..params import ParamSet
from ..updaters import Updater, create_updater
from .driver import Backend, Driver, checkpoint_folder
from .gradfn import GradFn, OnStep, RemoteGradFn
from .layout import ServerLayout, plan_servers
from .local import LocalBackend
from .messages import Address


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


def _make_ray(conf: ClusterConf, params: ParamSet, layouts: list[ServerLayout],
              updater: Updater, checkpoint_dir: Any, restarts: int,
              options: dict[str, Any]) -> Backend:
    from .ray_backend import RayBackend  # imports Ray: only when chosen

    return RayBackend(conf, params, layouts, updater, checkpoint_dir, actor_restarts=restarts,
                      **options)


def workers_share_process(conf: ClusterConf) -> bool:
    """Whether the backend ``conf`` names runs the workers of a group in one process (they
    can then exchange data in memory, as layers partitioned on the features do): known
    before anything is started, so that a job that needs it is refused at once."""
    if conf.backend == "ray":
        from .ray_backend import RayBackend  # does not import Ray itself

        return RayBackend.one_process
    return LocalBackend.one_process


class Cluster:
    """Parameter servers and workers; see the module docstring.

    Args:
        job: a job (its ``cluster`` and, unless ``updater`` is given, its ``updater``), a
            cluster configuration, or a dict of one.
        params: the Params; server group 0 holds (and updates) ``params.values`` itself
            embedded, and copies its values back into them after each run on Ray.
        updater: the update method, or its configuration; by default the job's.
        max_restarts: how many times a lost server is brought back within one part of a
            run (default: 3 on Ray, 0 embedded, where a server is lost only with the
            process). With restarts, the servers keep checkpoints of their own.
        checkpoint_dir: the folder of those checkpoints (default: a temporary folder,
            removed by :meth:`close`); on several machines, one every node can reach.
        checkpoint_freq: steps between those checkpoints within a run (default: the job's
            ``checkpoint_freq``; 0: at the start and the end of every run only).
        transport: (embedded) makes the transport from the servers; the seam for tests.
        **options: the backend's own options (Ray: ``placement``, ``server_options``,
            ``worker_options``, ``modules``; see :mod:`~paramserver.cluster.ray_backend`).

    Attributes:
        conf: the cluster configuration.
        params, updater: as given.
        layouts: the range of each server of a group (the same in every server group).
        backend: where the servers and workers are.
        servers: ``{(server group, index): server}`` (embedded: :class:`Server` objects;
            Ray: actor handles, for servers with something to hold).
        workers: every worker, by rank (embedded: :class:`Worker` objects).
        step: the next step :meth:`run` starts at.
    """

    def __init__(self, job: JobConf | ClusterConf | Mapping[str, Any], params: ParamSet,
                 updater: Updater | UpdaterConf | Mapping[str, Any] | str | None = None, *,
                 max_restarts: int | None = None,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_freq: int | None = None,
                 transport: Callable[[Mapping[Address, Any]], Any] | None = None,
                 **options: Any):
        conf = _cluster_conf(job)
        updater = _updater_of(job, updater)
        _check_conf(conf)
        self.conf = conf
        self.params = params
        self.updater = updater
        self.layouts: list[ServerLayout] = plan_servers(params, conf.nservers_per_group)
        if checkpoint_freq is None:
            checkpoint_freq = job.checkpoint_freq if isinstance(job, JobConf) else 0
        if isinstance(max_restarts, bool) or (max_restarts is not None and (
                not isinstance(max_restarts, int) or max_restarts < 0)):
            raise ParamError(f"max_restarts must be an integer >= 0, not {max_restarts!r}")
        restarts = (max_restarts if max_restarts is not None
                    else 3 if conf.backend == "ray" else LocalBackend.default_restarts)
        folder, temp = checkpoint_folder(
            None if checkpoint_dir is None else os.fspath(checkpoint_dir), restarts > 0)
        backend: Backend
        try:
            if conf.backend == "ray":
                if transport is not None:
                    raise ParamError("the Ray backend has its own transport; 'transport' is "
                                     "for the embedded cluster")
                backend = _make_ray(conf, params, self.layouts, updater, folder, restarts,
                                    options)
            else:
                if options:
                    raise ParamError(f"unknown options for the embedded cluster: "
                                     f"{sorted(options)} (they are the Ray backend's)")
                backend = LocalBackend(conf, params, self.layouts, updater, folder, transport)
        except BaseException:
            if temp and folder is not None:
                import shutil

                shutil.rmtree(folder, ignore_errors=True)
            raise
        self.backend = backend
        self._driver = Driver(conf, params, self.layouts, backend, max_restarts=restarts,
                              checkpoint_dir=folder, temp_dir=temp,
                              checkpoint_freq=checkpoint_freq)
        try:
            self._driver._put_values(0)  # so that the state of a new cluster can be read
        except BaseException:
            self.close()
            raise

    # -- what it is made of -----------------------------------------------------------------

    @property
    def servers(self) -> Mapping[Address, Any]:
        return self.backend.servers

    @property
    def workers(self) -> list[Any]:
        return list(self.backend.workers)

    @property
    def local_workers(self) -> list[Any]:
        """The :class:`Worker` objects that live in this process (all embedded, none on
        Ray), e.g. to prepare something for each before a run."""
        return list(self.backend.local_workers)

    @property
    def transport(self) -> Any:
        return self.backend.transport

    @property
    def step(self) -> int:
        return self._driver.step

    @step.setter
    def step(self, value: int) -> None:
        self._driver.step = int(value)

    @property
    def checkpoint_dir(self) -> Any:
        """The folder of the servers' own checkpoints (None: they keep none)."""
        return self._driver.checkpoint_dir

    @property
    def skipped_pushes(self) -> int:
        """Pushes dropped for non-finite gradients (``nonfinite: skip``), all workers."""
        return sum(self._driver.skipped.values())

    # -- running ----------------------------------------------------------------------------

    def run(self, grad_fn: GradFn | RemoteGradFn, steps: int, start_step: int | None = None,
            on_step: OnStep | None = None, *, pauses: Collection[int] = (),
            stop: Callable[[], bool] | None = None) -> list[list[Mapping[str, Any] | None]]:
        """Run ``steps`` training steps on every worker, from ``start_step`` (default: where
        the last run stopped).

        Args:
            grad_fn: ``grad_fn(worker, step)`` fills every gradient of ``worker.params``
                (gradients are not zeroed between steps) and returns a dict of metrics or
                None. It runs where the worker is (a thread here; a Ray actor, which gets it
                pickled), concurrently with other workers; or a :class:`RemoteGradFn` that
                every worker builds for itself.
            steps: number of steps.
            start_step: the first step (the learning rate is a function of the step).
            on_step: ``on_step(step, metrics_by_rank)``, in the caller's thread, in step
                order. An exception in it stops the run and is raised.
            pauses: steps where the run may end early: when it reaches one of them and
                ``stop()`` says True (asked there, from any thread of this process), it
                ends before that step, every worker having finished the steps before it
                (the servers hold exactly their values: a checkpoint taken then resumes
                exactly). :attr:`step` says where it ended. The workers do not wait at a
                pause that nothing asks to stop at (a compiled Ray graph goes on; the
                others end a part of the run there and start the next).
            stop: says whether the run should end at the pause it reached (e.g. a Ctrl-C
                was pressed); with ``pauses`` only.

        Returns:
            For each step run, each worker's metrics by rank (None for a worker gone).

        Raises:
            ClusterError: a worker failed (its exception chained) under
                ``on_worker_failure: stop``, every worker failed, a wait timed out, or a
                gradient was non-finite under ``nonfinite: error``.
        """
        return self._driver.run(grad_fn, steps, start_step, on_step, pauses, stop)

    def kill_server(self, address: Address) -> None:
        """Lose server ``address`` as a crash of its process would (Ray: its actor is killed
        and restarted; embedded: it is replaced by a fresh one). For tests of fault
        tolerance: with ``max_restarts``, the run goes back to the servers' checkpoints."""
        self.backend.kill_server(tuple(address))  # type: ignore[arg-type]

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything a resume needs, as flat arrays (no pickle): see
        :mod:`paramserver.cluster.statedict`."""
        return self._driver.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output; checked whole (by every server) before
        anything changes; ``params.values`` then hold the loaded values."""
        self._driver.load_state_dict(state)

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the backend (Ray: its actors, and Ray if this cluster started it); remove a
        temporary checkpoint folder. Idempotent."""
        driver = getattr(self, "_driver", None)
        if driver is not None:
            driver.close()
        else:
            self.backend.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.conf
        return (f"Cluster({c.nworker_groups}×{c.nworkers_per_group} workers, "
                f"{c.nserver_groups}×{c.nservers_per_group} servers, {c.backend}, "
                f"step {self.step})")


__all__ = ["Cluster", "GradFn", "OnStep", "RemoteGradFn", "workers_share_process"]
