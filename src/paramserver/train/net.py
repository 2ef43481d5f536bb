"""The neural net of a job: its layers, their Params, and one training step.

A :class:`Net` is built from ``neuralnet { layer { ... } ... }``: layers in the file's order,
each reading layers listed before it. It names the Params every layer needs
(:meth:`Net.param_specs`), is bound to a :class:`~paramserver.params.ParamSet` that holds
them (:meth:`Net.bind`), and computes gradients (:meth:`Net.train_step`).

Several workers each build their own Net from the same configuration and seed, bind it to
their own ParamSet replica, and take disjoint shards of every step's batch with
``net.batch(step, rank, num_workers)``. Everything random (the split, the order of each
epoch, dropout masks) is a function of the seed, the step and the worker's rank.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.components import layers as layer_registry
from ..config.job import NetConf, conf_from
from ..init import init_params
from ..params import Param, ParamSet, ParamSpec
from .data import Batch, Dataset, derive_rng
from .layers import EXCLUDE_NAMES, DataLayer, Layer, LossLayer, phase_name

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class Net:
    """Layers built from a :class:`~paramserver.config.job.NetConf`; see the module docstring.

    Args:
        netconf: the ``neuralnet`` configuration (a NetConf, a nested dict, or its text).
        seed: the job seed; it fixes the train/test split (unless ``data_conf.split_seed``
            is set), the order of every epoch, and the dropout masks.
        dtype: float32 (default) or float64 for outputs, gradients and Params.
        base_dir: the folder relative data paths start from (default: the working folder).

    Raises:
        ParamError: for an unknown, later or own layer in ``srclayers``, layers whose shapes
            do not fit (naming the layer), not exactly one data layer and one loss layer,
            or a layer running in a phase where one of its sources is excluded.

    Attributes:
        layers: every layer, in the file's order.
        data_layer: the one data layer; ``loss_layer`` the one loss layer.
        params: the bound Params, in the order of :meth:`param_specs` (after :meth:`bind`).
    """

    def __init__(self, netconf: NetConf | dict[str, Any] | str, seed: int = 0,
                 dtype: Any = np.float32, *, base_dir: str | os.PathLike[str] | None = None):
        self.conf: NetConf = conf_from(NetConf, netconf, "neuralnet")
        self.seed = int(seed)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _DTYPES:
            raise ParamError(f"a Net computes in float32 or float64, not {self.dtype}")
        self.layers: list[Layer] = self._build(base_dir)
        self._by_name = {layer.name: layer for layer in self.layers}
        self.data_layer: DataLayer = self._one(DataLayer, "data layer (kData)")
        self.loss_layer: LossLayer = self._one(LossLayer, "loss layer (kSoftmaxLoss)")
        self._phases = {p: self._phase_layers(p) for p in ("train", "test")}
        self._requires_grad = self._needs_grad()
        self._specs = self._make_specs()
        self._has_params = any(self._specs.values())
        self.params: list[Param] = []
        self._pset: ParamSet | None = None

    # -- construction -----------------------------------------------------------------------

    def _build(self, base_dir: str | os.PathLike[str] | None) -> list[Layer]:
        confs = self.conf.layer
        position = {c.name: i for i, c in enumerate(confs)}
        problems: list[str] = []
        seen: set[str] = set()
        for i, c in enumerate(confs):
            if c.name in seen:
                problems.append(f"layer name '{c.name}' is used twice")
            seen.add(c.name)
            for src in c.srclayers:
                if src == c.name:
                    problems.append(f"layer '{c.name}' reads itself")
                elif src not in position:
                    close = difflib.get_close_matches(src, list(position), n=1)
                    hint = f"; did you mean '{close[0]}'?" if close else ""
                    problems.append(f"layer '{c.name}' reads unknown layer '{src}'{hint}")
                elif position[src] > i:
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
        return list(built.values())

    def _one(self, kind: type[Any], what: str) -> Any:
        found = [layer for layer in self.layers if isinstance(layer, kind)]
        if len(found) != 1:
            names = ", ".join(f"'{x.name}'" for x in found)
            raise ParamError(f"a net needs exactly one {what}; found {len(found)}"
                             + (f": {names}" if names else ""))
        for phase in ("train", "test"):
            if EXCLUDE_NAMES[phase] in found[0].conf.exclude:
                raise ParamError(f"the {what} '{found[0].name}' must not be excluded from "
                                 f"{EXCLUDE_NAMES[phase]}")
        return found[0]

    def _phase_layers(self, phase: str) -> list[Layer]:
        excluded = EXCLUDE_NAMES[phase]
        active = [layer for layer in self.layers if excluded not in layer.conf.exclude]
        names = {layer.name for layer in active}
        problems = [f"layer '{layer.name}' reads '{src.name}', which is excluded from "
                    f"{excluded}; exclude '{layer.name}' too"
                    for layer in active for src in layer.srcs if src.name not in names]
        if problems:
            raise ParamError(problems)
        return active

    def _needs_grad(self) -> dict[str, bool]:
        """Which layers' outputs depend on Params (only they need a gradient)."""
        needs: dict[str, bool] = {}
        for layer in self.layers:
            needs[layer.name] = bool(layer.param_shapes()) or any(
                needs[s.name] for s in layer.srcs)
        return needs

    def _make_specs(self) -> dict[str, list[ParamSpec]]:
        specs: dict[str, list[ParamSpec]] = {}
        for layer in self.layers:
            out = []
            for i, (shape, pc) in enumerate(zip(layer.param_shapes(), layer.param_confs(),
                                                strict=True)):
                name = pc.name or f"{layer.name}_{i}"
                conf = pc.copy()
                conf.__dict__["name"] = name
                out.append(ParamSpec(name, tuple(shape), conf,
                                     f"layer '{layer.name}', param {i}"))
            specs[layer.name] = out
        return specs

    # -- access -----------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Layer:
        try:
            return self._by_name[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._by_name), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ParamError(f"no layer named '{name}'{hint}") from None

    @property
    def dataset(self) -> Dataset:
        """The data layer's dataset (train and test splits)."""
        return self.data_layer.dataset

    @property
    def batchsize(self) -> int:
        """The global batch size of a step (``data_conf.batchsize``)."""
        return self.data_layer.batchsize

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset.steps_per_epoch(self.batchsize)

    def phase_layers(self, phase: str) -> list[Layer]:
        """The layers that run in ``phase`` ("train"/"kTrain", "test"/"kTest"), in order."""
        return list(self._phases[self._phase(phase)])

    # -- Params -----------------------------------------------------------------------------

    def param_specs(self) -> list[ParamSpec]:
        """Every Param the layers need, in layer order, then ``param`` order.

        A ``param`` without a name is named ``<layer>_<index>``; a layer with fewer
        ``param`` entries than Params gets its defaults for the rest (see each layer).
        """
        return [s for specs in self._specs.values() for s in specs]

    def bind(self, pset: ParamSet) -> None:
        """Use the Params of ``pset`` (by name) from now on; :meth:`train_step` writes their
        gradients and zeroes every gradient of ``pset`` first."""
        if pset.dtype != self.dtype:
            raise ParamError(f"the ParamSet is {pset.dtype.name} but the net computes in "
                             f"{self.dtype.name}")
        params = []
        for layer in self.layers:
            mine = [pset[s.name] for s in self._specs[layer.name]]
            layer.bind(mine)
            params += mine
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
        """Run the layers of ``phase`` on ``batch``; the loss layer's metrics."""
        phase = self._phase(phase)
        self._check_bound()
        self.data_layer.feed(batch)
        if rng is None:
            rng = self.step_rng(batch.step, batch.rank)
        for layer in self._phases[phase]:
            layer.forward(phase, rng)
        return self.loss_layer.metrics()

    def train_step(self, batch: Batch | int, rng: np.random.Generator | None = None, *,
                   zero_grads: bool = True) -> dict[str, float]:
        """Forward and backward on one batch; the bound Params' ``grad`` then hold
        d loss / d values (the mean over the batch's samples).

        Args:
            batch: a Batch (e.g. from :meth:`batch`), or a step: that step's whole batch.
            rng: the generator for dropout; default :meth:`step_rng` of the batch.
            zero_grads: zero every gradient of the bound ParamSet first (otherwise the
                gradients add to what is there).

        Returns:
            ``{"loss": ..., "accuracy": ...}`` of this batch. Sharers' gradients are left
            in their own slots (summing them is the caller's step, as SPEC §7 has it).
        """
        if not isinstance(batch, Batch):
            batch = self.batch(int(batch))
        metrics = self.forward(batch, "train", rng)
        if zero_grads and self._pset is not None:
            self._pset.zero_grads()
        active = self._phases["train"]
        for layer in active:
            if self._requires_grad[layer.name]:
                if layer.grad is None or layer.grad.shape != np.shape(layer.data):
                    layer.grad = np.zeros(np.shape(layer.data), self.dtype)
                else:
                    layer.grad.fill(0)
            else:
                layer.grad = None
        for layer in reversed(active):
            if self._requires_grad[layer.name]:
                layer.backward()
        return metrics

    def evaluate(self, steps: int = 0, batchsize: int | None = None) -> dict[str, float]:
        """Loss and accuracy over the test split (test phase: no dropout).

        Args:
            steps: the number of test batches (0: the whole split).
            batchsize: samples per test batch (default ``data_conf.batchsize``).

        Returns:
            ``{"loss": ..., "accuracy": ...}``, averaged over the samples seen.
        """
        if self.dataset.num_test == 0:
            raise ParamError(f"layer '{self.data_layer.name}': there is no test split "
                             "(test_fraction is 0 and the file holds no x_test/y_test)")
        totals: dict[str, float] = {}
        count = 0
        rng = derive_rng(self.seed, "test")
        for batch in self.dataset.test_batches(batchsize or self.batchsize, steps):
            metrics = self.forward(batch, "test", rng)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v * batch.size
            count += batch.size
        return {k: v / count for k, v in totals.items()}

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _phase(phase: str) -> str:
        p = phase_name(phase)
        if p == "val":
            raise ParamError("the net runs in the phases 'train' and 'test' (kVal is "
                             "accepted in exclude, not run)")
        return p

    def _check_bound(self) -> None:
        if self._pset is None and self._has_params:
            raise ParamError("the net has no Params yet: call bind(pset) or make_params()")

    def __repr__(self) -> str:
        inner = ", ".join(f"{layer.name}:{layer.type}" for layer in self.layers)
        return f"Net([{inner}], seed={self.seed}, dtype={self.dtype.name})"


__all__ = ["Net"]
