"""SINGA's training algorithms (``train_one_batch { alg }``): how a worker's step computes
the gradients it pushes to the servers.

* ``kBP``: back-propagation — forward through the kTrain net, then backward from its loss
  layers (:meth:`~paramserver.train.net.Net.train_step`).
* ``kBPTT``: back-propagation through time — the same on the unrolled net (the net unrolls
  the layers by ``unroll_len``; the copies' gradients add up in their one set of Params).
* ``kCD`` (``kContrastiveDivergence``): contrastive divergence for RBMs
  (:func:`contrastive_divergence`, ``cd_conf { cd_k }``). Only the RBM layers' Params get
  gradients; the other Params of the net (the layers below, trained before and loaded with
  ``checkpoint_path``) are frozen, as SINGA's CD worker updates only the RBM layers.

Every algorithm's gradients reach the servers through the same cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import TrainOneBatchConf
from .data import Batch
from .layers.base import require_torch
from .net import Net

#: The algorithms built, by SINGA's name.
ALGORITHMS = ("kBP", "kBPTT", "kCD")


def train_step(net: Net, alg: TrainOneBatchConf, batch: Batch,
               rng: np.random.Generator | None = None) -> Mapping[str, Any]:
    """One worker's step of ``alg`` on ``batch``: fills the gradients of the net's Params
    (zeroed first) and returns the step's metrics."""
    if alg.alg == "kCD":
        return contrastive_divergence(net, batch, int(alg.cd_conf.cd_k), rng)
    if alg.alg in ("kBP", "kBPTT"):
        return net.train_step(batch, rng)
    raise ParamError(f"training algorithm {alg.alg} is not built")


def trained_layers(net: Net, alg: TrainOneBatchConf) -> list[Any]:
    """The layers of the kTrain net whose Params ``alg`` trains."""
    layers = net.phase_layers("kTrain")
    if alg.alg == "kCD":
        return [x for x in layers if getattr(x, "is_rbm", False)]
    return layers


def frozen_params(net: Net, alg: TrainOneBatchConf) -> set[str]:
    """The Params no step of ``alg`` changes (kCD: those of the layers that are not RBM
    layers; any algorithm: those a layer does not train, a batch normalisation's running
    statistics); the trainer gives them ``lr_scale`` and ``wd_scale`` 0."""
    trained = {p.name for layer in trained_layers(net, alg)
               for i, p in enumerate(net.layer_params(layer))
               if i not in getattr(layer, "untrained_params", ())}
    return {s.name for s in net.param_specs()} - trained


def contrastive_divergence(net: Net, batch: Batch, k: int = 1,
                           rng: np.random.Generator | None = None) -> Mapping[str, Any]:
    """A CD-k step (SINGA's CDWorker): the positive phase through every layer, then ``k``
    Gibbs steps between each RBM's visible and hidden layers (the negative phase), then the
    RBM layers' gradients ``(negative statistics - positive statistics) / batch``."""
    if k < 1:
        raise ParamError(f"cd_k must be at least 1, got {k}")
    metrics = net.forward(batch, "kTrain", rng)
    layers: list[Any] = [x for x in net.phase_layers("kTrain") if getattr(x, "is_rbm", False)]
    if not layers:
        raise ParamError("kCD trains RBM layers (kRBMVis, kRBMHid); the kTrain net has none")
    gen = rng if rng is not None else net.step_rng(batch.step, batch.rank)
    with require_torch().no_grad():
        for i in range(k):
            for layer in layers:
                layer.negative(gen, first=i == 0)
        net.zero_grads()
        for layer in layers:
            layer.cd_gradient()
    net.grads_to_host()
    return {**metrics, **net.metrics("kTrain")}


__all__ = ["ALGORITHMS", "contrastive_divergence", "frozen_params", "train_step",
           "trained_layers"]
