"""Helpers of the layer tests: a source layer set by the test, layers made and bound alone,
and the gradient check of any layer against central differences (float64)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from paramserver.config.components import layers  # noqa: E402
from paramserver.config.job import LayerConf  # noqa: E402
from paramserver.params import ParamSet, ParamSpec  # noqa: E402
from paramserver.train.layers import DataLayer, Layer  # noqa: E402
from paramserver.train.net import Weights  # noqa: E402

F64 = np.float64


class Source(Layer):
    """A layer whose output is set by the test (``arr``, viewed by ``data``)."""

    min_srcs = 0
    max_srcs = 0

    def __init__(self, arr: np.ndarray, name: str = "src", *, needs_grad: bool = True,
                 labels: np.ndarray | None = None):
        dtype = arr.dtype if arr.dtype.kind == "f" else F64
        super().__init__(LayerConf.parse({"name": name, "type": "kReLU"}), [], dtype=dtype)
        self.arr = arr
        self.data = torch.from_numpy(arr)
        self.out_shape = tuple(arr.shape[1:])
        self.int_output = arr.dtype.kind in "iu"
        self.requires_grad = needs_grad and not self.int_output
        if labels is not None:
            self.gives_labels = True
            self.labels = torch.from_numpy(np.asarray(labels, np.int64))

    def forward(self, phase: str, rng: Any) -> None:
        self.data = torch.from_numpy(self.arr)


def make(type_: str, srcs: list[Layer], name: str = "l", *, params: bool = True,
         dtype: Any = F64, seed: int = 7, **own: Any) -> Layer:
    """A set-up layer of ``type_`` reading ``srcs``; its Params (if any) random, in a
    ParamSet of their own, bound through the net's binding."""
    conf = LayerConf.parse({"name": name, "type": type_,
                            "srclayers": [s.name for s in srcs], **own})
    layer: Layer = layers.get(type_)(conf, srcs, dtype=dtype)
    layer.setup()
    if params:
        bind_random(layer, seed)
    return layer


def bind_random(layer: Layer, seed: int = 7) -> ParamSet:
    specs = [ParamSpec(f"{layer.name}_{i}", shape, pc, f"layer '{layer.name}'")
             for i, (shape, pc) in enumerate(zip(layer.param_shapes(), layer.param_confs(),
                                                 strict=True))]
    for s in specs:
        s.conf.__dict__["name"] = s.name
        s.conf.__dict__["share_from"] = None
    pset = ParamSet(specs, layer.dtype)
    pset.values[...] = np.random.default_rng(seed).standard_normal(pset.values.shape)
    weights = Weights(pset, None)
    layer.bind([pset[s.name] for s in specs], [weights[s.name] for s in specs])
    layer.requires_grad = True
    return pset


def data_layer(tmp_path: Path, x: np.ndarray, y: np.ndarray, name: str = "data",
               **own: Any) -> DataLayer:
    path = tmp_path / f"{name}.npz"
    np.savez(path, x=x, y=y)
    own.setdefault("batchsize", 2)
    own.setdefault("test_fraction", 0.0)
    layer = make("kData", [], name, source=str(path), **own)
    assert isinstance(layer, DataLayer)
    return layer


def numeric_grad(f: Callable[[], float], arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros(arr.shape)
    flat, g = arr.reshape(-1), out.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = f()
        flat[i] = old - eps
        lo = f()
        flat[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return out


def run(layer: Layer, phase: str = "train", seed: int = 3, *, training: bool = False) -> None:
    layer.training = training and layer.requires_grad
    with torch.no_grad():
        layer.forward(phase, np.random.default_rng(seed))


def check_gradients(layer: Layer, phase: str = "train", seed: int = 3, rtol: float = 1e-6,
                    atol: float = 1e-8) -> None:
    """``backward`` against central differences of ``sum(data × r)`` (a loss layer: its
    loss), for every float source that wants a gradient and every Param."""
    is_loss = layer.is_loss

    def objective() -> float:
        run(layer, phase, seed)
        if is_loss:
            return float(layer.loss)
        return float((layer.data.double() * r).sum())

    run(layer, phase, seed, training=True)
    r = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(layer.data.shape)))
    for s in layer.srcs:
        s.grad = None
    for w in layer.weights:
        w.grad.zero_()
    layer.grad = None if is_loss else r.to(layer.data.dtype).clone()
    with torch.no_grad():
        layer.backward()
    analytic = {s.name: (None if s.grad is None else s.grad.double().numpy().copy())
                for s in layer.srcs}
    param_grads = [w.grad.double().numpy().copy() for w in layer.weights]
    checked = 0
    for s in layer.srcs:
        if isinstance(s, Source) and s.requires_grad:
            want = numeric_grad(objective, s.arr)
            got = analytic[s.name]
            got = np.zeros_like(want) if got is None else got
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                       err_msg=f"source {s.name}")
            checked += 1
    for p, got in zip(layer.params, param_grads, strict=True):
        np.testing.assert_allclose(got, numeric_grad(objective, p.data), rtol=rtol, atol=atol,
                                   err_msg=f"param {p.name}")
        checked += 1
    assert checked, "nothing to check"


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)
