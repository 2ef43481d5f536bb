"""The neural net of a job: its layers, their Params, and one training step.

A :class:`Net` is built from ``neuralnet { layer { ... } ... }`` for one or more phases
(SINGA's ``Phase``: ``kTrain``, ``kTest``, ``kVal``): the net of a phase has the layers that
``include``/``exclude`` put in it, in the file's order, each reading layers listed before it.
Layers of different phases may share a name (SINGA's two data layers ``data``, one for
training, one for tests); each phase has its own layer objects, and all of them use the same
Params, by name. The first phase is the net's main one (:attr:`Net.layers`,
:attr:`Net.data_layer`, :meth:`Net.batch`); :meth:`Net.train_step` runs ``kTrain`` and
:meth:`Net.evaluate` a test or validation phase.

The net names the Params every layer needs (:meth:`Net.param_specs`), is bound to a
:class:`~paramserver.params.ParamSet` that holds them (:meth:`Net.bind`), and computes
gradients (:meth:`Net.train_step`).

Several workers each build their own Net from the same configuration and seed, bind it to
their own ParamSet replica, and take disjoint shards of every step's batch with
``net.batch(step, rank, num_workers)``. Everything random (the split, the order of each
epoch, dropout masks) is a function of the seed, the step and the worker's rank.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.components import layers as layer_registry
from ..config.job import NetConf, conf_from, unbuilt_error
from ..config.singa_enums import PHASE
from ..init import init_params
from ..params import Param, ParamSet, ParamSpec
from .data import Batch, Dataset, derive_rng
from .layers import DataLayer, Layer, LossLayer, phase_name

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class _Phase:
    """The net of one phase: its layers and what the steps need to know about them."""

    name: str                                   # SINGA's name, "kTrain"
    layers: list[Layer]
    by_name: dict[str, Layer]
    data_layer: DataLayer
    loss_layer: LossLayer
    requires_grad: dict[str, bool] = field(default_factory=dict)
    specs: dict[str, list[ParamSpec]] = field(default_factory=dict)


class Net:
    """Layers built from a :class:`~paramserver.config.job.NetConf`; see the module docstring.

    Args:
        netconf: the ``neuralnet`` configuration (a NetConf, a nested dict, or its text).
        seed: the job seed; it fixes the train/test split (unless ``data_conf.split_seed``
            is set), the order of every epoch, and the dropout masks.
        dtype: float32 (default) or float64 for outputs, gradients and Params.
        base_dir: the folder relative data paths start from (default: the working folder).
        phases: the phases to build nets for, the main one first (default ``kTrain`` and
            ``kTest``); any spelling of SINGA's Phase (``"train"``, ``"kVal"``, ``4``).

    Raises:
        ParamError: for layer types not built yet (all of them named), an unknown, later or
            own layer in ``srclayers``, a name used twice in a phase, layers whose shapes do
            not fit (naming the layer), not exactly one data layer and one loss layer in a
            phase, a layer reading one that its phase leaves out, or a Param name whose
            shape differs between phases.

    Attributes:
        layers: the layers of the main phase, in the file's order.
        data_layer: the main phase's data layer; ``loss_layer`` its loss layer.
        params: the bound Params, in the order of :meth:`param_specs` (after :meth:`bind`).
    """

    def __init__(self, netconf: NetConf | dict[str, Any] | str, seed: int = 0,
                 dtype: Any = np.float32, *, base_dir: str | os.PathLike[str] | None = None,
                 phases: Sequence[str] = ("kTrain", "kTest")):
        self.conf: NetConf = conf_from(NetConf, netconf, "neuralnet")
        self.seed = int(seed)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _DTYPES:
            raise ParamError(f"a Net computes in float32 or float64, not {self.dtype}")
        unbuilt = [f"{what}: layer{'s' if len(names) > 1 else ''} "
                   + ", ".join(f"'{n}'" for n in names)
                   for what, names in self.conf.unbuilt().items()]
        if unbuilt:
            raise unbuilt_error(unbuilt)
        names = list(dict.fromkeys(_canonical(p) for p in phases))
        if not names:
            raise ParamError("a Net is built for at least one phase")
        self._phases = {p: self._build(p, base_dir) for p in names}
        self._main = self._phases[names[0]]
        self.layers: list[Layer] = self._main.layers
        self.data_layer: DataLayer = self._main.data_layer
        self.loss_layer: LossLayer = self._main.loss_layer
        self._specs = self._merge_specs()
        self._has_params = bool(self._specs)
        self.params: list[Param] = []
        self._pset: ParamSet | None = None

    @property
    def phases(self) -> list[str]:
        """The phases this net is built for, the main one first."""
        return list(self._phases)

    # -- construction -----------------------------------------------------------------------

    def _build(self, phase: str, base_dir: str | os.PathLike[str] | None) -> _Phase:
        confs = self.conf.phase_layers(phase)
        position = {c.name: i for i, c in enumerate(confs)}
        every = [c.name for c in self.conf.layer]
        problems: list[str] = self.conf.phase_problems(phase)
        for i, c in enumerate(confs):
            for src in c.srclayers:
                if src == c.name:
                    problems.append(f"layer '{c.name}' reads itself")
                elif src not in every:
                    close = difflib.get_close_matches(src, every, n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    problems.append(f"layer '{c.name}' reads unknown layer '{src}'{hint}")
                elif src in position and position[src] > i:
                    problems.append(f"layer '{c.name}' reads '{src}', which comes later; list "
                                    "every layer after the layers it reads (a net has no "
                                    "cycles)")
        if problems:
            raise ParamError(problems)
        built: dict[str, Layer] = {}
        for c in confs:
            cls = layer_registry.get(c.component)
            layer: Layer = cls(c, [built[s] for s in c.srclayers], dtype=self.dtype,
                               seed=self.seed, base_dir=base_dir)
            layer.setup()
            built[c.name] = layer
        layers = list(built.values())
        net = _Phase(phase, layers, built, _one(layers, DataLayer, "data layer (kData)", phase),
                     _one(layers, LossLayer, "loss layer (kSoftmaxLoss)", phase))
        for layer in layers:  # which layers' outputs depend on Params (only they need grads)
            net.requires_grad[layer.name] = bool(layer.param_shapes()) or any(
                net.requires_grad[s.name] for s in layer.srcs)
        for layer in layers:
            out = []
            for i, (shape, pc) in enumerate(zip(layer.param_shapes(), layer.param_confs(),
                                                strict=True)):
                name = pc.name or f"{layer.name}_{i}"
                if pc.shape and tuple(pc.shape) != tuple(shape):
                    raise layer.error(f"param {i} ('{name}') has shape {tuple(shape)}; its "
                                      f"param {{ shape }} says {tuple(pc.shape)}")
                conf = pc.copy()
                conf.__dict__["name"] = name
                out.append(ParamSpec(name, tuple(shape), conf,
                                     f"layer '{layer.name}', param {i}"))
            net.specs[layer.name] = out
        return net

    def _merge_specs(self) -> list[ParamSpec]:
        """The Params of every phase: a name in several phases is one Param (the first
        phase's configuration), of one shape."""
        merged: list[ParamSpec] = []
        first: dict[str, tuple[str, ParamSpec]] = {}
        for phase, net in self._phases.items():
            mine = [s for specs in net.specs.values() for s in specs]
            for spec in mine:
                seen = first.get(spec.name)
                if seen is None:
                    merged.append(spec)
                    continue
                if seen[0] == phase:
                    merged.append(spec)  # a duplicate within a phase: the ParamSet says so
                elif seen[1].shape != spec.shape:
                    raise ParamError(f"Param '{spec.name}' has shape {seen[1].shape} in "
                                     f"{seen[0]} ({seen[1].place}) but {spec.shape} in "
                                     f"{phase} ({spec.place})")
            for spec in mine:
                first.setdefault(spec.name, (phase, spec))
        return merged

    # -- access -----------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Layer:
        """The layer called ``name`` of the main phase (else of the first phase that has
        one)."""
        for net in self._phases.values():
            if name in net.by_name:
                return net.by_name[name]
        every = [n for net in self._phases.values() for n in net.by_name]
        close = difflib.get_close_matches(name, every, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ParamError(f"no layer named '{name}'{hint}")

    @property
    def dataset(self) -> Dataset:
        """The main data layer's dataset (train, test and validation splits)."""
        return self.data_layer.dataset

    @property
    def batchsize(self) -> int:
        """The global batch size of a step (``data_conf.batchsize``)."""
        return self.data_layer.batchsize

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset.steps_per_epoch(self.batchsize)

    def phase_layers(self, phase: str) -> list[Layer]:
        """The layers of the net of ``phase`` ("train"/"kTrain", "test"/"kTest", "kVal"),
        in order."""
        return list(self._net(phase).layers)

    def data_layer_of(self, phase: str) -> DataLayer:
        """The data layer of the net of ``phase``."""
        return self._net(phase).data_layer

    # -- Params -----------------------------------------------------------------------------

    def param_specs(self) -> list[ParamSpec]:
        """Every Param the layers of every phase need, in layer order, then ``param`` order
        (the main phase first).

        A ``param`` without a name is named ``<layer>_<index>``; a layer with fewer
        ``param`` entries than Params gets its defaults for the rest (see each layer).
        """
        return list(self._specs)

    def bind(self, pset: ParamSet) -> None:
        """Use the Params of ``pset`` (by name) from now on, in every phase;
        :meth:`train_step` writes their gradients and zeroes every gradient of ``pset``
        first."""
        if pset.dtype != self.dtype:
            raise ParamError(f"the ParamSet is {pset.dtype.name} but the net computes in "
                             f"{self.dtype.name}")
        missing = [f"'{s.name}' ({s.place})" for s in self._specs if s.name not in pset]
        if missing:
            raise ParamError(f"the ParamSet has no Param {', '.join(missing)}")
        params: list[Param] = []
        for net in self._phases.values():
            for layer in net.layers:
                mine = [pset[s.name] for s in net.specs[layer.name]]
                layer.bind(mine)
                params += [p for p in mine if all(p is not q for q in params)]
        self.params = params
        self._pset = pset

    def make_params(self, init: bool = True) -> ParamSet:
        """A new ParamSet for :meth:`param_specs`, initialised from the seed, and bound."""
        pset = ParamSet(self.param_specs(), self.dtype)
        if init:
            init_params(pset, self.seed)
        self.bind(pset)
        return pset

    # -- steps ------------------------------------------------------------------------------

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        """Worker ``rank``'s shard of the batch of ``step`` (disjoint across ranks)."""
        return self.data_layer.batch(step, rank, num_workers)

    def step_rng(self, step: int, rank: int = 0) -> np.random.Generator:
        """The generator of ``step`` on worker ``rank`` (dropout masks)."""
        return derive_rng(self.seed, "forward", step, rank)

    def forward(self, batch: Batch, phase: str = "train",
                rng: np.random.Generator | None = None) -> dict[str, float]:
        """Run the net of ``phase`` on ``batch``; its loss layer's metrics."""
        net = self._net(phase)
        self._check_bound()
        net.data_layer.feed(batch)
        if rng is None:
            rng = self.step_rng(batch.step, batch.rank)
        short = phase_name(net.name)
        for layer in net.layers:
            layer.forward(short, rng)
        return net.loss_layer.metrics()

    def train_step(self, batch: Batch | int, rng: np.random.Generator | None = None, *,
                   zero_grads: bool = True) -> dict[str, float]:
        """Forward and backward of the kTrain net on one batch; the bound Params' ``grad``
        then hold d loss / d values (the mean over the batch's samples).

        Args:
            batch: a Batch (e.g. from :meth:`batch`), or a step: that step's whole batch.
            rng: the generator for dropout; default :meth:`step_rng` of the batch.
            zero_grads: zero every gradient of the bound ParamSet first (otherwise the
                gradients add to what is there).

        Returns:
            ``{"loss": ..., "accuracy": ...}`` of this batch. Sharers' gradients are left
            in their own slots (summing them is the caller's step, as SPEC §7 has it).
        """
        net = self._net("kTrain")
        if not isinstance(batch, Batch):
            batch = net.data_layer.batch(int(batch))
        metrics = self.forward(batch, "kTrain", rng)
        if zero_grads and self._pset is not None:
            self._pset.zero_grads()
        for layer in net.layers:
            if net.requires_grad[layer.name]:
                if layer.grad is None or layer.grad.shape != np.shape(layer.data):
                    layer.grad = np.zeros(np.shape(layer.data), self.dtype)
                else:
                    layer.grad.fill(0)
            else:
                layer.grad = None
        for layer in reversed(net.layers):
            if net.requires_grad[layer.name]:
                layer.backward()
        return metrics

    def evaluate(self, steps: int = 0, batchsize: int | None = None,
                 phase: str = "kTest") -> dict[str, float]:
        """Loss and accuracy of the net of ``phase`` (kTest or kVal: no dropout) over its
        data layer's split for that phase.

        Args:
            steps: the number of batches (0: the whole split).
            batchsize: samples per batch (default the phase's ``data_conf.batchsize``).
            phase: ``kTest`` (the test split) or ``kVal`` (the validation split).

        Returns:
            ``{"loss": ..., "accuracy": ...}``, averaged over the samples seen.
        """
        net = self._net(phase)
        totals: dict[str, float] = {}
        count = 0
        rng = derive_rng(self.seed, phase_name(net.name))
        for batch in net.data_layer.eval_batches(net.name, batchsize, steps):
            metrics = self.forward(batch, net.name, rng)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v * batch.size
            count += batch.size
        return {k: v / count for k, v in totals.items()}

    # -- helpers ----------------------------------------------------------------------------

    def _net(self, phase: str) -> _Phase:
        name = _canonical(phase)
        net = self._phases.get(name)
        if net is None:
            raise ParamError(f"this net is built for {', '.join(self._phases)}, not {name}")
        return net

    def _check_bound(self) -> None:
        if self._pset is None and self._has_params:
            raise ParamError("the net has no Params yet: call bind(pset) or make_params()")

    def __repr__(self) -> str:
        inner = ", ".join(f"{layer.name}:{layer.type}" for layer in self.layers)
        return f"Net([{inner}], seed={self.seed}, dtype={self.dtype.name})"


def _canonical(phase: str) -> str:
    """SINGA's name of a phase (``kTrain``) for any spelling (``train``, ``1``)."""
    return PHASE.lookup(phase_name(phase))


def _one(layers: list[Layer], kind: type[Any], what: str, phase: str) -> Any:
    found = [layer for layer in layers if isinstance(layer, kind)]
    if len(found) != 1:
        names = ", ".join(f"'{x.name}'" for x in found)
        raise ParamError(f"a net needs exactly one {what}; found {len(found)}"
                         + (f": {names}" if names else "") + f" in phase {phase}")
    return found[0]


__all__ = ["Net"]
