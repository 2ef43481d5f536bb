"""Training a torch module with several workers on paramserver's cluster (SPEC §7).

:class:`TorchCluster` binds the module to a ParamSet (server group 0 holds and updates its
values: the module *is* the model being trained) and gives every worker of the
:class:`~paramserver.cluster.Cluster` a replica of the module whose parameters view that
worker's :class:`~paramserver.params.ParamSet` replica: its server group's values and
gradients of its own. A worker's step zeroes its gradients, calls the user's
``loss_fn(model, step, rank, num_workers)``, back-propagates into the replica's gradient
buffer, and the cluster pushes that buffer to the servers as it is (nothing is copied in one
process). Within a worker group the servers wait for every worker and update once with the
mean gradient (BSP); worker groups run asynchronously to each other.

A module's ``nn.Embedding(sparse=True)`` weights are row-sparse tables (SPEC §10,
:mod:`paramserver.torch._tables`): the servers hold them, sliced by rows; a worker's replica
holds none of them, pulls the rows of its batch and pushes their gradient as rows by id.

Replicas are made on a worker's first step, in the process that runs it: with the embedded
cluster that is this process (threads); a backend that runs workers elsewhere (Ray) ships
the grad function, which then needs a picklable module and ``loss_fn``.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ParamError
from ..config.job import ClusterConf, JobConf, UpdaterConf, read_job_text
from ..config.tree import Block, Entry
from ..params import ParamSet
from ..updaters import Updater
from ._bind import TorchParams, _named
from ._rules import ParamRule, RulesLike, parse_rules, resolve, split_job_text
from ._tables import row_embeddings, sparse_embeddings, without_tables

_CHECKPOINT_FORMAT = "paramserver-torch-cluster/1"

#: ``loss_fn(model, step, rank, num_workers)``: the loss of this worker's share of the step's
#: batch (a scalar tensor), or ``(loss, metrics_dict)``.
LossFn = Callable[[torch.nn.Module, int, int, int], Any]


@dataclass
class TorchJob:
    """A job file for a torch model: SINGA's job fields, with ``param { }`` rules.

    Attributes:
        conf: the job (``updater``, ``cluster``, ``train_steps``, ``seed``, ...). Its
            ``neuralnet`` may be left out: the network is the torch module.
        params: the ``param { name: "<pattern>" ... }`` rules, top-level or in layers.
    """

    conf: JobConf
    params: list[ParamRule] = field(default_factory=list)


def parse_job(text: str, filename: str = "<string>") -> TorchJob:
    """Read a torch job from a job file's text; errors name ``filename:line:column``."""
    rules, rest = split_job_text(text, filename)
    if not any(e.key == "neuralnet" for e in rest.entries):
        rest = Block([*rest.entries, Entry("neuralnet", Block([], rest.where), rest.where)],
                     rest.where)
    return TorchJob(JobConf._build(rest), rules)


def load_job(path: str | os.PathLike[str]) -> TorchJob:
    """Read a torch job file (see :func:`parse_job`)."""
    return parse_job(read_job_text(path), str(path))


class _GradFn:
    """The cluster's ``grad_fn(worker, step)`` for a torch module; see the module docstring.

    Holds the module to copy for replicas and the user's loss function; the replicas
    themselves are per process (dropped when pickled).
    """

    def __init__(self, template: torch.nn.Module, loss_fn: LossFn, num_workers: int,
                 replicas: dict[int, tuple[torch.nn.Module, TorchParams]] | None = None):
        self.template = template
        self.loss_fn = loss_fn
        self.num_workers = num_workers
        self.replicas = replicas if replicas is not None else {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"template": self.template, "loss_fn": self.loss_fn,
                "num_workers": self.num_workers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["template"], state["loss_fn"], state["num_workers"])  # type: ignore[misc]

    def replica(self, pset: ParamSet, rank: int) -> tuple[torch.nn.Module, TorchParams]:
        """Rank ``rank``'s module, bound to ``pset`` (made on first use)."""
        found = self.replicas.get(rank)
        if found is not None and found[1].pset is pset:
            return found
        with self._lock:  # deepcopy reads the template, which other threads may be copying
            module = copy.deepcopy(self.template)
        tp = _bind_replica(pset, module)
        self.replicas[rank] = (module, tp)
        return module, tp

    def __call__(self, worker: Any, step: int) -> dict[str, Any]:
        module, tp = self.replica(worker.params, worker.rank)
        tp.check()
        tp.zero_grad(set_to_none=False)  # the views, zeroed: autograd adds into the buffer
        got = tp.watch_grads()
        tables = list(row_embeddings(module))
        for r in tables:
            r.clear()
        with torch.enable_grad():
            out = self.loss_fn(module, step, worker.rank, self.num_workers)
            loss, metrics = (out if isinstance(out, tuple) else (out, {}))
            loss.backward()
        missing = tp.attach_grads()  # gradients torch allocated anew are copied in
        # a parameter backward did not reach is not updated (torch's .grad is None)
        worker.params.idle = tp.idle_owners(got, missing)
        for r in tables:
            r.push_grads()
        return {"loss": float(loss.detach()), **dict(metrics)}


class TorchCluster:
    """A torch module trained by paramserver's servers and workers.

    Args:
        module: the model. Its parameters are bound to the ParamSet that server group 0
            updates in place, so after :meth:`run` the module holds the trained values.
        job: a :class:`TorchJob` (or the text of a job file, or a path to one), a
            ``JobConf``, or a ``ClusterConf`` / dict of one (then ``updater`` is needed).
        updater: the updater (conf, dict or ``updater { }`` text); by default the job's.
        param_conf: per-parameter rules by name pattern, after the job's own ``param``
            rules (see :func:`paramserver.torch.bind`).
        seed: seed of paramserver's initialisation, for parameters given an ``init``
            (default: the job's seed, else 0).
        replica: makes a worker's module (default: a deep copy of ``module``).

    Attributes:
        module: as given; ``params`` its binding; ``cluster`` the
            :class:`~paramserver.cluster.Cluster`; ``num_workers`` all workers of all groups.
    """

    def __init__(self, module: torch.nn.Module,
                 job: TorchJob | JobConf | ClusterConf | Mapping[str, Any] | str
                 | os.PathLike[str],
                 updater: Updater | UpdaterConf | Mapping[str, Any] | str | None = None, *,
                 param_conf: RulesLike = None, seed: int | None = None,
                 replica: Callable[[], torch.nn.Module] | None = None):
        from ..cluster import Cluster

        read = _read_job(job)
        rules: list[ParamRule] = []
        conf_of_job: JobConf | ClusterConf | Mapping[str, Any] = read
        if isinstance(read, TorchJob):
            rules, conf_of_job = list(read.params), read.conf
        rules += parse_rules(param_conf)
        if seed is None:
            seed = conf_of_job.seed if isinstance(conf_of_job, JobConf) else 0
        named = _named(module)
        resolved = resolve([n for n, _ in named], rules)
        self.module = module
        sparse = sparse_embeddings(module)
        self.params = TorchParams(named, resolved.confs, initialise=resolved.initialised,
                                  seed=seed, tables=set(sparse))
        held = {t.name for t in self.params.pset.tables}  # a shared embedding stays dense
        self._tables = {n: m for n, m in sparse.items() if n in held}
        self.cluster = Cluster(conf_of_job, self.params.pset, updater)
        conf = self.cluster.conf
        self.num_workers = conf.nworker_groups * conf.nworkers_per_group
        self._replica = replica
        self._replicas: dict[int, tuple[torch.nn.Module, TorchParams]] = {}
        for w in self.cluster.local_workers:  # made here, in order, for those in this process
            m = self._template()
            self._replicas[w.rank] = (m, _bind_replica(w.params, m))

    def _template(self) -> torch.nn.Module:
        """A new worker's module: without the tables' weights (it reads their rows)."""
        m = self._replica() if self._replica is not None else self.module
        if self._tables:
            return without_tables(m, self._tables)
        return m if self._replica is not None else copy.deepcopy(m)

    @property
    def updater(self) -> Updater:
        return self.cluster.updater

    @property
    def step(self) -> int:
        """The next step :meth:`run` starts at."""
        return int(self.cluster.step)

    def replica(self, rank: int) -> torch.nn.Module:
        """The module of worker ``rank``."""
        return self._replicas[rank][0]

    def run(self, loss_fn: LossFn, steps: int, start_step: int | None = None,
            on_step: Callable[[int, list[Mapping[str, Any] | None]], None] | None = None
            ) -> list[list[Mapping[str, Any] | None]]:
        """Train ``steps`` steps on every worker; see :meth:`paramserver.cluster.Cluster.run`.

        Args:
            loss_fn: ``loss_fn(model, step, rank, num_workers)`` returns the loss (a scalar
                tensor; or ``(loss, metrics)``) of worker ``rank``'s share of the batch of
                ``step``. With losses that are means over equal shares, the servers'
                mean over workers is the gradient of the whole batch's mean loss.
            steps: the number of steps.
            start_step: the first step (default: where the last run stopped).
            on_step: ``on_step(step, metrics_by_rank)`` in this thread, in step order;
                every worker's metrics hold its ``loss``.

        Returns:
            Each step's metrics, by rank.
        """
        template = (self.module if self._replica is None and not self._tables
                    else self._template())
        grad_fn = _GradFn(template, loss_fn, self.num_workers, dict(self._replicas))
        return self.cluster.run(grad_fn, steps, start_step, on_step)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The cluster's state (values, updater state, versions, step) as flat arrays;
        write it with :func:`paramserver.save_checkpoint` (no pickle)."""
        return self.cluster.state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output (the module's values included)."""
        self.cluster.load_state_dict(state)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`state_dict` to a paramserver checkpoint (atomic, no pickle), with
        the parameters' names and shapes and the module's ``state_dict`` names, so that
        ``paramserver export`` can write the model for ``module.load_state_dict``."""
        from ..checkpoint import save_checkpoint
        from ..export import TABLE, param_table

        meta = {"format": _CHECKPOINT_FORMAT, "step": self.step,
                TABLE: param_table(self.params.pset, self.module)}
        return save_checkpoint(path, self.state_dict(), meta)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore :meth:`save_checkpoint`'s file; refused whole if it does not fit."""
        from ..checkpoint import CheckpointError, load_checkpoint

        arrays, meta = load_checkpoint(path)
        if meta.get("format") != _CHECKPOINT_FORMAT:
            raise CheckpointError(f"{path}: not a checkpoint of a TorchCluster")
        try:
            self.load_state_dict(arrays)
        except ParamError as e:
            raise CheckpointError([f"{path}: {p}" for p in e.problems]) from None

    def __repr__(self) -> str:
        return f"TorchCluster({self.cluster!r}, {self.params!r})"


def train_on_cluster(module: torch.nn.Module, loss_fn: LossFn,
                     job: TorchJob | JobConf | ClusterConf | Mapping[str, Any] | str
                     | os.PathLike[str], steps: int | None = None, **kwargs: Any
                     ) -> list[list[Mapping[str, Any] | None]]:
    """Train ``module`` on paramserver's cluster: :class:`TorchCluster` and one run.

    Args:
        module, job, ``**kwargs``: as for :class:`TorchCluster` (``updater``,
            ``param_conf``, ``seed``, ``replica``).
        loss_fn: as for :meth:`TorchCluster.run`.
        steps: the number of steps (default: the job's ``train_steps``).

    Returns:
        Each step's metrics, by rank. The module holds the trained values.
    """
    on_step = kwargs.pop("on_step", None)
    job = _read_job(job)
    if steps is None:
        conf = job.conf if isinstance(job, TorchJob) else job
        if not isinstance(conf, JobConf):
            raise ParamError("train_on_cluster needs steps, or a job with train_steps")
        steps = conf.train_steps
    return TorchCluster(module, job, **kwargs).run(loss_fn, steps, on_step=on_step)


def _bind_replica(pset: ParamSet, module: torch.nn.Module) -> TorchParams:
    """A worker's module bound to its ParamSet replica, its tables' stand-ins included."""
    tp = TorchParams.on(pset, module)
    for r in row_embeddings(module):
        r.bind(pset)
    return tp


def _read_job(job: Any) -> Any:
    if isinstance(job, os.PathLike):
        return load_job(job)
    if isinstance(job, str):
        return parse_job(job, "<job>")
    return job


__all__ = ["LossFn", "TorchCluster", "TorchJob", "load_job", "parse_job", "train_on_cluster"]
