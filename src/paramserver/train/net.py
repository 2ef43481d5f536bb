"""The neural net of a job: its layers, their Params, forward and backward passes.

A :class:`Net` is built from ``neuralnet { layer { ... } ... }`` for one or more phases
(SINGA's ``Phase``: ``kTrain``, ``kTest``, ``kVal``): the net of a phase has the layers that
``include``/``exclude`` put in it, in the file's order, each reading layers listed before it
(an RBM's visible layer also reads its hidden layer, written after it). Layers of different
phases may share a name (SINGA's two data layers ``data``, one for training, one for tests);
each phase has its own layer objects, and all of them use the same Params, by name. The
first phase is the net's main one (:attr:`Net.layers`, :attr:`Net.data_layer`,
:meth:`Net.batch`); :meth:`Net.train_step` runs ``kTrain`` and :meth:`Net.evaluate` a test
or validation phase.

Unrolling (kBPTT, SINGA's): a layer with ``unroll_len`` n (the net's ``unroll_len`` unless
the layer gives its own) becomes n copies ``0#name`` ... ``n-1#name``, all with the same
Params, connected to the copies of their sources by ``unroll_conn_type`` (kUnrollOneToOne,
the default, copy t reads copy t - ``shift`` of the source; kUnrollOneToAll, every copy of
the source; kUnrollFirstToLast, copy 0 reads the source's last copy), and copy t of a kGRU
reads copy t - 1 as its context. Their gradients add up into the one set of Params.

The net names the Params every layer needs (:meth:`Net.param_specs`), is bound to a
:class:`~paramserver.params.ParamSet` that holds them (:meth:`Net.bind`: torch tensors that
view its flat values and gradients), and computes gradients (:meth:`Net.train_step`, or the
step of another algorithm, :mod:`paramserver.train.algorithms`).

Several workers each build their own Net from the same configuration and seed, bind it to
their own ParamSet replica, and take disjoint shards of every step's batch with
``net.batch(step, rank, num_workers)``. Everything random (the split, the order of each
epoch, dropout masks) is a function of the seed, the step and the worker's rank.

The net computes with PyTorch on the CPU; with ``device`` (the job's ``gpu``, when torch
sees a GPU) on that GPU: the Params stay in the flat buffers on the host, and each step
copies their values to the device and the gradients back.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.components import layers as layer_registry
from ..config.job import LayerConf, NetConf, conf_from, unbuilt_error
from ..config.singa_enums import PHASE
from ..init import init_params
from ..params import Param, ParamSet, ParamSpec, TableParam
from .data import Batch, Dataset, derive_rng
from .layers.base import Layer, phase_name, require_torch
from .layers.connection import SliceLayer, SlicePart
from .layers.input import DataLayer, InputLayer
from .partition import (
    SPLIT_PARAMS,
    Comm,
    Gather,
    Narrow,
    check_feature_partition,
    effective_dim,
    param_parts,
    part_conf,
)

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class _Node:
    """A layer of a phase's net after unrolling: its configuration, name and sources."""

    conf: LayerConf
    name: str
    index: int
    srcs: list[str]


@dataclass
class _Phase:
    """The net of one phase: its layers and what the steps need to know about them."""

    name: str                                   # SINGA's name, "kTrain"
    layers: list[Layer]
    by_name: dict[str, Layer]
    data_layer: InputLayer
    loss_layers: list[Layer]
    specs: dict[str, list[ParamSpec]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.losses_checked = False
        #: the layers that write their weights' gradients whole in a step whose gradients
        #: start at zero (Layer.fresh_grads); set by Net.bind
        self.fresh: list[Layer] = []
        self.short = phase_name(self.name)
        base = Layer.metrics
        self.reporting = [x for x in self.layers if type(x).metrics is not base]


class Net:
    """Layers built from a :class:`~paramserver.config.job.NetConf`; see the module docstring.

    Args:
        netconf: the ``neuralnet`` configuration (a NetConf, a nested dict, or its text).
        seed: the job seed; it fixes the train/test split (unless ``data_conf.split_seed``
            is set), the order of every epoch, and the dropout masks.
        dtype: float32 (default) or float64 for outputs, gradients and Params.
        base_dir: the folder relative ``kData`` paths start from (default: the working
            folder; SINGA's store paths always start at the working folder).
        phases: the phases to build nets for, the main one first (default ``kTrain`` and
            ``kTest``); any spelling of SINGA's Phase (``"train"``, ``"kVal"``, ``4``).
        device: the torch device to compute on (``"cuda:0"``); None: the CPU.
        comm: the exchange of the workers of a group (layers partitioned on the features).
        read_data: False builds the net to be checked, not run: input layers tell their
            data's layout (sample shape, type) without reading its values (an ``.npz``
            file's array headers, a store's first record), and it cannot feed batches.

    Raises:
        ParamError: for layer types not built yet (all of them named), an unknown, later or
            own layer in ``srclayers``, a name used twice in a phase, layers whose shapes do
            not fit (naming the layer), not exactly one input layer in a phase, no loss
            layer in the kTrain net, a layer reading one that its phase leaves out, or a
            Param name whose shape differs between phases.

    Attributes:
        layers: the layers of the main phase, in order (unrolled copies in SINGA's order).
        data_layer: the main phase's input layer; ``loss_layer`` its first loss layer.
        params: the bound Params, in the order of :meth:`param_specs` (after :meth:`bind`).
    """

    def __init__(self, netconf: NetConf | dict[str, Any] | str, seed: int = 0,
                 dtype: Any = np.float32, *, base_dir: str | os.PathLike[str] | None = None,
                 phases: Sequence[str] = ("kTrain", "kTest"), device: Any = None,
                 comm: Comm | None = None, read_data: bool = True):
        self.conf: NetConf = conf_from(NetConf, netconf, "neuralnet")
        self.read_data = read_data
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
        self.device = device
        self.comm = comm if comm is not None and comm.size > 1 else None
        self._by_spelling: dict[str, _Phase] = {}
        self._phases = {p: self._build(p, base_dir) for p in names}
        self._main = self._phases[names[0]]
        self.layers: list[Layer] = self._main.layers
        self.data_layer: InputLayer = self._main.data_layer
        self.loss_layer: Layer | None = (self._main.loss_layers[0]
                                         if self._main.loss_layers else None)
        self._specs = self._merge_specs()
        self._has_params = bool(self._specs)
        self.params: list[Param] = []
        self._pset: ParamSet | None = None
        self._weights: Any = None

    @property
    def phases(self) -> list[str]:
        """The phases this net is built for, the main one first."""
        return list(self._phases)

    # -- construction -----------------------------------------------------------------------

    def _build(self, phase: str, base_dir: str | os.PathLike[str] | None) -> _Phase:
        confs = self.conf.phase_layers(phase)
        position = {c.name: i for i, c in enumerate(confs)}
        every = [c.name for c in self.conf.layer]
        known = set(every)
        problems: list[str] = self.conf.phase_problems(phase)
        for i, c in enumerate(confs):
            for src in c.srclayers:
                if src == c.name:
                    problems.append(f"layer '{c.name}' reads itself")
                elif src not in known:
                    close = difflib.get_close_matches(src, every, n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    problems.append(f"layer '{c.name}' reads unknown layer '{src}'{hint}")
                elif src in position and position[src] > i and not getattr(
                        layer_registry.get(c.component), "reads_later", False):
                    problems.append(f"layer '{c.name}' reads '{src}', which comes later; list "
                                    "every layer after the layers it reads (a net has no "
                                    "cycles)")
        if problems:
            raise ParamError(problems)
        nodes = _unroll(confs, int(self.conf.unroll_len))
        built: dict[str, Layer] = {}
        later: dict[str, list[str]] = {}
        for node in nodes:
            cls = layer_registry.get(node.conf.component)
            need = self._partition_of(node.conf, cls)
            srcs: list[Layer] = []
            for s in node.srcs:
                if s not in built:  # a layer written later (reads_later)
                    later.setdefault(node.name, []).append(s)
                    continue
                reads = built[s]
                if isinstance(reads, SliceLayer):
                    reads = self._slice_part(reads, node, built)
                if self.comm is not None:
                    reads = self._connect(reads, need, built)
                srcs.append(reads)
            conf = node.conf
            template = None
            if need == "whole" and self.comm is not None:  # one part of its Params here
                template = self._make(cls, conf, srcs, node, base_dir)
                conf = part_conf(conf, self.comm.size)
            layer = self._make(cls, conf, srcs, node, base_dir)
            layer.partition = "cols" if need == "whole" else need  # type: ignore[attr-defined]
            layer.template = template  # type: ignore[attr-defined]
            built[node.name] = layer
        layers = list(built.values())
        for i, layer in enumerate(layers):
            layer.srcs += [built[s] for s in later.get(layer.name, [])]
            if type(layer).link is not Layer.link:  # (the layers after it: n² for them all)
                layer.link(layers[i + 1:])
        inputs = [x for x in layers if isinstance(x, InputLayer)]
        if len(inputs) != 1:
            names_ = ", ".join(f"'{x.name}'" for x in inputs)
            raise ParamError(f"a net needs exactly one input layer (kData, kRecordInput, "
                             f"kShardData, kCSVInput, kCharRNN, ...); found {len(inputs)}"
                             + (f": {names_}" if names_ else "") + f" in phase {phase}")
        losses = [x for x in layers if x.is_loss]
        net = _Phase(phase, layers, built, inputs[0], losses)
        for layer in layers:  # which layers' outputs depend on Params (only they need grads)
            layer.requires_grad = bool(layer.param_shapes()) or any(
                s.requires_grad for s in layer.srcs if not s.is_loss)
        first: dict[str, str] = {}
        for layer in layers:
            if layer.unroll_index and layer.conf.name in first:  # a copy: its first's Params
                net.specs[layer.name] = net.specs[first[layer.conf.name]]
                continue
            first.setdefault(layer.conf.name, layer.name)
            out = []
            whole = getattr(layer, "template", None) or layer  # a split layer: all its Params
            for i, (shape, pc) in enumerate(zip(whole.param_shapes(), whole.param_confs(),
                                                strict=True)):
                name = pc.name or f"{layer.conf.name}_{i}"
                if pc.shape and tuple(pc.shape) != tuple(shape):
                    raise layer.error(f"param {i} ('{name}') has shape {tuple(shape)}; its "
                                      f"param {{ shape }} says {tuple(pc.shape)}")
                conf = pc.copy()
                conf.__dict__["name"] = name
                out.append(ParamSpec(name, tuple(shape), conf,
                                     f"layer '{layer.conf.name}', param {i}",
                                     whole is layer and i in layer.row_sparse_params))
            net.specs[layer.name] = out
        return net

    def _make(self, cls: type, conf: LayerConf, srcs: list[Layer], node: _Node,
              base_dir: str | os.PathLike[str] | None) -> Layer:
        layer: Layer = cls(conf, srcs, dtype=self.dtype, seed=self.seed, base_dir=base_dir)
        layer.name = node.name
        layer.unroll_index = node.index
        layer.device = self.device
        layer.read_data = self.read_data
        layer.setup()
        return layer

    def _partition_of(self, conf: LayerConf, cls: type) -> str:
        """What part of its input a layer of this worker reads (:mod:`.partition`): its
        rows of the batch, its part of the features, or the whole (a layer whose Params
        are split)."""
        if self.comm is None or issubclass(cls, InputLayer) or getattr(cls, "is_loss", False):
            return "rows"
        if effective_dim(conf, int(self.conf.partition_dim)) == 0:
            return "rows"
        check_feature_partition(conf, cls, self.comm.size)
        return "whole" if conf.component in SPLIT_PARAMS else "cols"

    def partitioned_on_features(self) -> list[str]:
        """The layers of the training phase partitioned on the features (``partition_dim
        1``, theirs or the net's) when a group has several workers: their parts are exchanged
        between the workers of the group, in memory (:mod:`.partition`)."""
        found = []
        for conf in self.conf.phase_layers("kTrain"):
            cls = layer_registry.get(conf.component)
            if issubclass(cls, InputLayer) or getattr(cls, "is_loss", False):
                continue
            if effective_dim(conf, int(self.conf.partition_dim)) == 1:
                found.append(conf.name)
        return found

    def _connect(self, src: Layer, need: str, built: dict[str, Layer]) -> Layer:
        """``src`` as a layer that needs ``need`` of it reads it: through the connection
        layers that gather the workers' parts and keep this worker's (built once)."""
        have = getattr(src, "partition", "rows")
        if have == need:
            return src
        assert self.comm is not None
        steps: list[tuple[type, int]] = []
        if have != "whole":
            steps.append((Gather, 0 if have == "rows" else 1))
        if need != "whole":
            steps.append((Narrow, 0 if need == "rows" else 1))
        for kind, axis in steps:
            key = f"{kind.__name__}:{axis}:{src.name}"
            if key not in built:
                layer = kind(src, axis, self.comm, dtype=self.dtype, seed=self.seed)
                layer.device = self.device
                layer.setup()
                layer.partition = ("whole" if kind is Gather else
                                   "rows" if axis == 0 else "cols")
                built[key] = layer
            src = built[key]
        return src

    def _slice_part(self, src: SliceLayer, node: _Node, built: dict[str, Layer]) -> Layer:
        """The piece of kSlice ``src`` that ``node`` reads: a :class:`SlicePart` put between
        them (built once per reader)."""
        k = src.piece_for(node.name)
        name = f"{src.name}[{k}]"
        if name not in built:
            part = SlicePart(src, node.conf, k, dtype=self.dtype, seed=self.seed)
            part.device = self.device
            part.setup()
            built[name] = part
        return built[name]

    def _merge_specs(self) -> list[ParamSpec]:
        """The Params of every phase: a name in several phases is one Param (the first
        phase's configuration), of one shape."""
        merged: list[ParamSpec] = []
        first: dict[str, tuple[str, ParamSpec]] = {}
        for phase, net in self._phases.items():
            seen_lists: set[int] = set()
            mine = []
            for specs in net.specs.values():
                if id(specs) not in seen_lists:  # unrolled copies share their first's list
                    seen_lists.add(id(specs))
                    mine += specs
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
        one); an unrolled layer's first copy by its own name."""
        for net in self._phases.values():
            for key in (name, f"0#{name}"):
                if key in net.by_name:
                    return net.by_name[key]
        every = [n for net in self._phases.values() for n in net.by_name]
        close = difflib.get_close_matches(name, every, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ParamError(f"no layer named '{name}'{hint}")

    @property
    def dataset(self) -> Dataset:
        """The main kData layer's dataset (train, test and validation splits)."""
        if not isinstance(self.data_layer, DataLayer):
            raise ParamError(f"the input layer '{self.data_layer.name}' is "
                             f"{self.data_layer.type}, which has no dataset (kData has)")
        return self.data_layer.dataset

    @property
    def batchsize(self) -> int:
        """The global batch size of a step (all workers together)."""
        return self.data_layer.batchsize

    @property
    def steps_per_epoch(self) -> int:
        return self.data_layer.steps_per_epoch

    def phase_layers(self, phase: str) -> list[Layer]:
        """The layers of the net of ``phase`` ("train"/"kTrain", "test"/"kTest", "kVal"),
        in order."""
        return list(self._net(phase).layers)

    def reporting_layers(self, phase: str = "kTrain") -> list[Layer]:
        """The layers of ``phase`` that report metrics (loss layers, kAccuracy, ...), in
        order."""
        return list(self._net(phase).reporting)

    def data_layer_of(self, phase: str) -> InputLayer:
        """The input layer of the net of ``phase``."""
        return self._net(phase).data_layer

    # -- Params -----------------------------------------------------------------------------

    def param_specs(self) -> list[ParamSpec]:
        """Every Param the layers of every phase need, in layer order, then ``param`` order
        (the main phase first).

        A ``param`` without a name is named ``<layer>_<index>``; a layer with fewer
        ``param`` entries than Params gets its defaults for the rest (see each layer).
        """
        return list(self._specs)

    def check_trainable(self, alg: str = "kBP") -> None:
        """Refuse a kTrain net that training algorithm ``alg`` cannot train: back-propagation
        (kBP, kBPTT) needs a loss layer, kCD an RBM (a job that only tests needs
        neither)."""
        layers = self._net("kTrain").layers
        if alg == "kCD":
            if not any(getattr(x, "is_rbm", False) for x in layers):
                raise ParamError("kCD trains RBMs: the kTrain net has no kRBMVis/kRBMHid "
                                 "layers")
        elif not any(x.is_loss for x in layers):
            raise ParamError("a net needs a loss layer (kSoftmaxLoss, kEuclideanLoss, ...) "
                             f"in phase kTrain to train by {alg}; found none")

    def layer_params(self, layer: Layer, phase: str = "kTrain") -> list[ParamSpec]:
        """The Params of ``layer`` of the net of ``phase``, in order."""
        return list(self._net(phase).specs.get(layer.name, []))

    def bind(self, pset: ParamSet) -> None:
        """Use the Params of ``pset`` (by name) from now on, in every phase: each layer gets
        them and torch tensors viewing their values and gradients
        (:mod:`paramserver.torch`'s binding). :meth:`train_step` writes their gradients:
        it zeroes those of ``pset`` first, but for the ones that a layer, their only writer,
        writes whole (:attr:`Layer.fresh_grads`)."""
        if pset.dtype != self.dtype:
            raise ParamError(f"the ParamSet is {pset.dtype.name} but the net computes in "
                             f"{self.dtype.name}")
        missing = [f"'{s.name}' ({s.place})" for s in self._specs if s.name not in pset]
        if missing:
            raise ParamError(f"the ParamSet has no Param {', '.join(missing)}")
        weights = Weights(pset, self.device)
        params: list[Param] = []
        for net in self._phases.values():
            for layer in net.layers:
                names = [s.name for s in net.specs.get(layer.name, [])]
                mine = [pset[n] for n in names]
                tensors = [weights[n] for n in names]
                template = getattr(layer, "template", None)
                if template is not None:
                    assert self.comm is not None
                    template.bind(mine, tensors)
                    tensors = param_parts(layer, tensors, self.comm.index, self.comm.size)
                    layer.bind(mine, tensors, whole=False)
                    continue
                layer.bind(mine, tensors)
                params += [p for p in mine if all(p is not q for q in params)]
            _find_fresh(net, on_host=not weights.dev)
        self.params = params
        self._pset = pset
        self._weights = weights

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
        """The generator of ``step`` on worker ``rank`` (dropout masks, crops); made when a
        layer first draws from it (most steps of most nets draw nothing)."""
        return LazyRng(self.seed, "forward", step, rank)  # type: ignore[return-value]

    def forward(self, batch: Batch, phase: str = "train",
                rng: np.random.Generator | None = None, *, backward: bool = False
                ) -> dict[str, float]:
        """Run the net of ``phase`` on ``batch``; the metrics of its layers (a metric
        reported by several layers, e.g. the loss of every unrolled copy, is their mean).

        With ``backward`` (a training step follows) the layers keep what their backward
        passes need."""
        torch = require_torch()
        net = self._net(phase)
        self._check_bound()
        self._weights.to_device()
        if rng is None:
            rng = self.step_rng(batch.step, batch.rank)
        short = net.short
        with torch.no_grad():
            net.data_layer.feed(batch)
            for layer in net.layers:
                layer.training = backward and layer.requires_grad
                layer.forward(short, rng)
        return self.metrics(phase)

    def metrics(self, phase: str = "train") -> dict[str, float]:
        """The metrics of the layers of ``phase`` after a forward pass."""
        totals: dict[str, list[float]] = {}
        for layer in self._net(phase).reporting:
            for k, v in layer.metrics().items():
                totals.setdefault(k, []).append(v)
        return {k: sum(v) / len(v) for k, v in totals.items()}

    def backward(self, phase: str = "train", *, zero_grads: bool = True) -> None:
        """Back-propagate through the net of ``phase`` after a :meth:`forward` with
        ``backward``: every loss layer's objective, down to the Params' gradients (added to
        what is there unless ``zero_grads``)."""
        torch = require_torch()
        net = self._net(phase)
        fresh = net.fresh if zero_grads else []
        if zero_grads:  # but not the gradients their only writers write whole
            self.zero_grads(keep=[p for x in fresh for p in x.params])
        for layer in fresh:
            layer.fresh_grads = True
        try:
            with torch.no_grad():
                for layer in net.layers:
                    layer.grad = None
                for layer in reversed(net.layers):
                    if layer.requires_grad and (layer.is_loss or layer.grad is not None
                                                or getattr(layer, "collective", False)):
                        layer.backward()
                        layer.fresh_grads = False
        finally:
            for layer in fresh:  # skipped (no gradient reached it), or the pass failed
                if layer.fresh_grads:
                    layer.fresh_grads = False
                    for w in layer.weights:
                        w.grad.zero_()
        self.grads_to_host()

    def zero_grads(self, keep: Sequence[Param] = ()) -> None:
        """Zero the bound Params' gradients (and their device copies), except those of
        ``keep`` (:meth:`ParamSet.zero_grads`)."""
        if self._pset is not None:
            self._pset.zero_grads(keep)
        if self._weights is not None:
            self._weights.zero_device_grads()

    def grads_to_host(self) -> None:
        """Add the gradients computed on the device into the Params' (no-op on the CPU)."""
        if self._weights is not None:
            self._weights.grads_to_host()

    def train_step(self, batch: Batch | int, rng: np.random.Generator | None = None, *,
                   zero_grads: bool = True) -> dict[str, float]:
        """Forward and backward of the kTrain net on one batch (back-propagation, kBP and
        kBPTT); the bound Params' ``grad`` then hold d loss / d values (the mean over the
        batch's samples).

        Args:
            batch: a Batch (e.g. from :meth:`batch`), or a step: that step's whole batch.
            rng: the generator for dropout; default :meth:`step_rng` of the batch.
            zero_grads: zero every gradient of the bound ParamSet first (otherwise the
                gradients add to what is there).

        Returns:
            The metrics of this batch (``{"loss": ..., "accuracy": ...}``). Sharers'
            gradients are left in their own slots (summing them is the caller's step, as
            SPEC §7 has it).
        """
        net = self._net("kTrain")
        if not net.losses_checked:
            self.check_trainable()
            net.losses_checked = True
        if not isinstance(batch, Batch):
            batch = net.data_layer.batch(int(batch))
        metrics = self.forward(batch, "kTrain", rng, backward=True)
        self.backward("kTrain", zero_grads=zero_grads)
        return metrics

    def eval_batches(self, phase: str = "kTest", batchsize: int | None = None,
                     steps: int = 0, index: int = 0) -> Iterator[Batch]:
        """The batches :meth:`evaluate` reads in ``phase`` (its ``index``-th evaluation in a
        run: see :meth:`~paramserver.train.layers.input.InputLayer.eval_pass`)."""
        net = self._net(phase)
        if index:
            return net.data_layer.eval_pass(net.name, index, batchsize, steps)
        return net.data_layer.eval_batches(net.name, batchsize, steps)

    def eval_count(self, phase: str = "kTest", batchsize: int | None = None,
                   steps: int = 0) -> int:
        """How many batches :meth:`evaluate` reads in ``phase``."""
        net = self._net(phase)
        return net.data_layer.eval_count(net.name, batchsize, steps)

    def evaluate(self, steps: int = 0, batchsize: int | None = None,
                 phase: str = "kTest", index: int = 0) -> dict[str, float]:
        """The metrics of the net of ``phase`` (kTest or kVal: no dropout) over its input
        layer's data for that phase.

        Args:
            steps: the number of batches (0: all of them).
            batchsize: samples per batch (default the phase's input layer's).
            phase: ``kTest`` (the test split) or ``kVal`` (the validation split).
            index: which evaluation of ``phase`` in a run this is, from 0: SINGA's stores
                read on from where the one before stopped.

        Returns:
            Each metric (``loss``, ``accuracy``, ...), averaged over the samples seen.
        """
        torch = require_torch()
        net = self._net(phase)
        totals: dict[str, float] = {}
        count = 0
        rng = derive_rng(self.seed, phase_name(net.name))
        for layer in net.layers:
            reset = getattr(layer, "reset_state", None)
            if reset is not None:
                reset()
        with torch.inference_mode():
            for batch in self.eval_batches(net.name, batchsize, steps, index):
                metrics = self.forward(batch, net.name, rng)
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v * batch.size
                count += batch.size
        for layer in net.layers:
            end = getattr(layer, "end_evaluation", None)
            if end is not None:
                end()
        return {k: v / max(count, 1) for k, v in totals.items()}

    # -- helpers ----------------------------------------------------------------------------

    def _net(self, phase: str) -> _Phase:
        net = self._by_spelling.get(phase)
        if net is not None:
            return net
        name = _canonical(phase)
        net = self._phases.get(name)
        if net is None:
            raise ParamError(f"this net is built for {', '.join(self._phases)}, not {name}")
        self._by_spelling[phase] = net
        return net

    def _check_bound(self) -> None:
        if self._pset is None and self._has_params:
            raise ParamError("the net has no Params yet: call bind(pset) or make_params()")
        if self._weights is None:
            self._weights = Weights(None, self.device)

    def __repr__(self) -> str:
        inner = ", ".join(f"{layer.name}:{layer.type}" for layer in self.layers)
        return f"Net([{inner}], seed={self.seed}, dtype={self.dtype.name})"


class Weights:
    """The torch tensors of a ParamSet's Params, by name: on the CPU they view the flat
    values and gradients (:mod:`paramserver.tensors`, as the torch adaptor's do); on a GPU
    they are device copies, refreshed from the values before a forward pass, their
    gradients copied back after a backward pass."""

    def __init__(self, pset: ParamSet | None, device: Any):
        self.device = device
        self.host: dict[str, Any] = {}
        self.dev: dict[str, Any] = {}
        self.tables: dict[str, Any] = {}
        if pset is None or not len(pset):
            return
        torch = require_torch()
        from ..tensors import param_tensors

        self.host = dict(param_tensors(pset))
        self.tables = {t.name: t for t in pset.tables}  # rows by id: the layers read them
        if device is not None and torch.device(device).type != "cpu":
            for n, t in self.host.items():
                d = torch.nn.Parameter(t.detach().to(device))
                d.grad = torch.zeros_like(d)
                self.dev[n] = d

    def __getitem__(self, name: str) -> Any:
        if name in self.tables:
            return self.tables[name]
        return self.dev.get(name) if self.dev else self.host[name]

    def to_device(self) -> None:
        if self.dev:
            with require_torch().no_grad():
                for n, d in self.dev.items():
                    d.copy_(self.host[n], non_blocking=True)

    def zero_device_grads(self) -> None:
        for d in self.dev.values():
            d.grad.zero_()

    def grads_to_host(self) -> None:
        for n, d in self.dev.items():
            self.host[n].grad.add_(d.grad.to("cpu"))


def _find_fresh(net: _Phase, on_host: bool) -> None:
    """Set ``net.fresh``: the layers of ``net`` that may write their weights' gradients
    whole in a step whose gradients start at zero (:attr:`Layer.fresh_grads`): layers that
    write every element of them (:attr:`Layer.writes_whole_grads`), bound to whole dense
    Params no other layer of the phase uses; none when the layers compute on a device (the
    host's gradients are added from the device's copies)."""
    uses: dict[int, int] = {}
    for layer in net.layers:
        for p in layer.params:
            uses[id(p)] = uses.get(id(p), 0) + 1
    net.fresh = [
        x for x in net.layers
        if on_host and x.writes_whole_grads and x.params
        and getattr(x, "template", None) is None
        and all(uses[id(p)] == 1 and not isinstance(p, TableParam) for p in x.params)]


def _unroll(confs: list[LayerConf], net_unroll: int) -> list[_Node]:
    """The layers after SINGA's unrolling (see the module docstring), in SINGA's order: all
    copies of a layer, then the next layer's."""
    lengths = {c.name: _unroll_len(c, net_unroll) for c in confs}
    nodes: list[_Node] = []
    names: dict[str, list[str]] = {}
    for c in confs:
        n = lengths[c.name]
        names[c.name] = [c.name] if n == 1 else [f"{i}#{c.name}" for i in range(n)]
    for c in confs:
        n = lengths[c.name]
        for i in range(n):
            srcs: list[str] = []
            for k, s in enumerate(c.srclayers):
                copies = names.get(s, [s])  # a source the phase lacks was reported
                kind = c.unroll_conn_type[k] if k < len(c.unroll_conn_type) else \
                    "kUnrollOneToOne"
                shift = int(c.shift[k]) if k < len(c.shift) else 0
                if kind == "kUnrollOneToAll" or len(copies) == 1:
                    srcs += copies if kind == "kUnrollOneToAll" or i >= shift else []
                elif kind == "kUnrollFirstToLast":
                    srcs += [copies[-1]] if i == 0 else []
                elif i >= shift and i - shift < len(copies):
                    srcs.append(copies[i - shift])
            if i > 0 and c.component == "kGRU":
                srcs.append(names[c.name][i - 1])
            nodes.append(_Node(c, names[c.name][i], i, srcs))
    return nodes


def _unroll_len(conf: LayerConf, net_unroll: int) -> int:
    """A layer's ``unroll_len``: its own when given, else the net's (SINGA's rule)."""
    return int(conf.unroll_len) if conf.unroll_len is not None else net_unroll


class LazyRng:
    """A NumPy generator of :func:`~paramserver.train.data.derive_rng`, made on first use."""

    def __init__(self, seed: int, *tags: int | str):
        self._seed = seed
        self._tags = tags
        self._gen: np.random.Generator | None = None

    def __getattr__(self, name: str) -> Any:
        if self._gen is None:
            self._gen = derive_rng(self._seed, *self._tags)
        return getattr(self._gen, name)


def _canonical(phase: str) -> str:
    """SINGA's name of a phase (``kTrain``) for any spelling (``train``, ``1``)."""
    return PHASE.lookup(phase_name(phase))


__all__ = ["LazyRng", "Net", "Weights"]
