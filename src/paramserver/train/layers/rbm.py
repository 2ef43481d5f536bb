"""Restricted Boltzmann machines, trained by contrastive divergence (``alg: kCD``).

An RBM is two layers (SINGA's): ``kRBMVis``, the visible units, which reads its input and
its hidden layer (written after it), and ``kRBMHid``, the hidden units, which reads the
visible layer. The weight ``W`` is ``(hdim, vdim)``: the visible layer owns it and the
hidden layer names it with ``share_from``; each layer has its bias (``vdim`` and ``hdim``).

A CD-k step (:func:`paramserver.train.algorithms.contrastive_divergence`, SINGA's
CDWorker):

* positive phase (the forward pass): ``v⁺`` = the input, ``h⁺ = σ(v⁺ Wᵀ + b)`` (with
  ``gaussian``, ``h⁺ = v⁺ Wᵀ + b``);
* negative phase, ``cd_k`` Gibbs steps: ``v⁻ = σ(s W + c)`` from a sample ``s`` of the
  hidden units (binary units: 1 with probability ``h``; gaussian: ``h`` plus N(0, 1)
  noise), of ``h⁺`` at the first step and of ``h⁻`` after; then ``h⁻ = σ(v⁻ Wᵀ + b)``
  (not sampled, as Hinton's);
* gradients, to be descended: ``∇W = (h⁻ᵀ v⁻ − h⁺ᵀ v⁺) / batch``, ``∇c = mean(v⁻ − v⁺)``,
  ``∇b = mean(h⁻ − h⁺)``.

The visible layer reports ``loss``: the squared reconstruction error ``Σ(v⁺ − v⁻)² /
batch`` of the first Gibbs step (in tests: of one Gibbs step from the test batch). The
samples are drawn from the step's generator (keyed by the seed, step and worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...config.job import LayerConf
from ...singa.confs import RBMConf
from .base import Layer, as_tensor, register_layer, require_torch


class RBMLayer(Layer):
    """What the visible and hidden layers share: positive and negative data, sampling."""

    Config = RBMConf
    is_rbm = True

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.pos: Any = None
        self.neg: Any = None

    def sample(self, probabilities: Any, rng: Any) -> Any:
        """A sample of the units: binary (1 with each probability), or with ``gaussian``
        the values plus N(0, 1) noise."""
        gen = rng if rng is not None else np.random.default_rng(self.seed)
        if self.own.gaussian:
            noise = gen.standard_normal(tuple(probabilities.shape)).astype(self.dtype)
            return probabilities + as_tensor(noise).to(probabilities.device)
        u = gen.random(tuple(probabilities.shape)).astype(self.dtype)
        return (as_tensor(u).to(probabilities.device) < probabilities).to(probabilities.dtype)


@register_layer("kRBMVis")
class RBMVisLayer(RBMLayer):
    """The visible units of an RBM (see the module docstring). srclayers: its input and
    its kRBMHid (in either order). Params: ``W`` ``(hdim, vdim)`` and the visible bias
    ``(vdim,)``."""

    min_srcs = 1
    max_srcs = 2
    reads_later = True

    def setup(self) -> None:
        inputs = [s for s in self.srcs if not isinstance(s, RBMHidLayer)]
        if len(inputs) != 1:
            raise self.error("reads its input and its hidden layer (kRBMHid)")
        self.input = inputs[0]
        if self.input.int_output:
            raise self.error(f"srclayer '{self.input.name}' gives integers; {self.type} "
                             "reads floats")
        self.vdim = int(np.prod(self.input.out_shape, dtype=np.int64))
        self.out_shape = (self.vdim,)
        self.hidden: RBMHidLayer | None = None
        self.error_value: Any = float("nan")

    def link(self, later: Sequence[Layer]) -> None:
        hidden = [s for s in self.srcs if isinstance(s, RBMHidLayer)]
        if len(hidden) != 1 or len(self.srcs) != 2:
            raise self.error("reads its input and its hidden layer (kRBMHid), which comes "
                             "after it: give both as srclayers")
        self.hidden = hidden[0]
        if self.hidden.srcs != [self]:
            raise self.error(f"its hidden layer '{self.hidden.name}' must read it, and only "
                             "it")

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(int(self.own.hdim), self.vdim), (self.vdim,)]

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.input.data
        self.pos = x.reshape(x.shape[0], -1)
        self.data = self.pos

    def negative(self, rng: Any, first: bool) -> None:
        """A Gibbs half-step: the visible units from a sample of the hidden ones."""
        hidden = self.hidden
        assert hidden is not None
        torch = require_torch()
        h = hidden.sample(hidden.pos if first else hidden.neg, rng)
        w, c = self.weights
        self.neg = torch.sigmoid(torch.addmm(c, h, w))
        if first:
            d = self.pos - self.neg
            self.error_value = (d * d).sum() / max(d.shape[0], 1)

    def cd_gradient(self) -> None:
        hidden = self.hidden
        assert hidden is not None
        n = max(self.pos.shape[0], 1)
        w, c = self.weights
        w.grad.addmm_(hidden.neg.t(), self.neg, alpha=1 / n)
        w.grad.addmm_(hidden.pos.t(), self.pos, alpha=-1 / n)
        c.grad.add_((self.neg - self.pos).sum(0), alpha=1 / n)

    def metrics(self) -> dict[str, float]:
        return {"loss": float(self.error_value)}


@register_layer("kRBMHid")
class RBMHidLayer(RBMLayer):
    """The hidden units of an RBM (see the module docstring). srclayer: its kRBMVis.
    Params: ``W`` (shared from the visible layer's, ``share_from``) and the hidden bias
    ``(hdim,)``. With ``gaussian``, the units are linear with Gaussian noise."""

    def setup(self) -> None:
        super().setup()
        vis = self.srcs[0]
        if not isinstance(vis, RBMVisLayer):
            raise self.error(f"srclayer '{vis.name}' is {vis.type}; {self.type} reads its "
                             "kRBMVis")
        self.vis = vis
        self.vdim = vis.vdim
        self.out_shape = (int(self.own.hdim),)

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(int(self.own.hdim), self.vdim), (int(self.own.hdim),)]

    def units(self, v: Any) -> Any:
        torch = require_torch()
        w, b = self.weights
        x = torch.addmm(b, v, w.t())
        return x if self.own.gaussian else torch.sigmoid(x)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.pos = self.units(self.vis.pos)
        self.data = self.pos
        if phase != "train":  # a test measures one reconstruction (SINGA's TestOneBatch)
            self.vis.negative(rng, first=True)

    def negative(self, rng: Any, first: bool) -> None:
        """A Gibbs half-step: the hidden units from the visible layer's reconstruction."""
        self.neg = self.units(self.vis.neg)

    def cd_gradient(self) -> None:
        n = max(self.pos.shape[0], 1)
        self.weights[1].grad.add_((self.neg - self.pos).sum(0), alpha=1 / n)


__all__ = ["RBMHidLayer", "RBMLayer", "RBMVisLayer"]
