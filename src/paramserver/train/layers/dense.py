"""Dense layers: fully connected, activations, dropout, softmax, embedding.

The fully connected layer, the activations and dropout write their backward pass with torch
operations (one fused ``addmm_`` per gradient, no autograd graph): they are most of the
main job, whose tensors are so small that autograd's bookkeeping would cost more than the
arithmetic (see :mod:`.base`). Their tests check every backward against autograd and
central differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...config.job import LayerConf, ParamConf
from ...params import TableParam
from ...singa.confs import (
    ActivationConf,
    DropoutConf,
    EmbeddingConf,
    InnerProductConf,
    ReLUConf,
    SoftmaxConf,
)
from .base import Layer, as_tensor, register_layer, require_torch, shape_text

# -- inner product --------------------------------------------------------------------------


@register_layer("kInnerProduct", aliases=("fc", "dense", "linear"))
class InnerProductLayer(Layer):
    """``y = x · Wᵀ + b``: a fully connected layer.

    Each sample's input is flattened (as SINGA does), ``num_input`` features. Params:
    weight ``W`` of shape ``(num_output, num_input)``, so that its fan_in (``shape[1]``) is
    the number of inputs; with ``transpose: true`` it is stored ``(num_input, num_output)``
    and ``y = x · W``. Then, with ``bias_term``, ``b`` of shape ``(num_output,)``.
    Defaults for missing ``param`` entries: W kUniformSqrtFanInOut, b kConstant 0.
    """

    Config = InnerProductConf
    writes_whole_grads = True
    _ones: Any = None

    def setup(self) -> None:
        super().setup()
        src = self.float_source()
        self.num_input = int(np.prod(src.out_shape, dtype=np.int64))
        if self.num_input == 0:
            raise self.error(f"srclayer '{src.name}' gives shape {shape_text(src.out_shape)}, "
                             "which has no features")
        self.out_shape = (int(self.own.num_output),)

    def param_shapes(self) -> list[tuple[int, ...]]:
        n_in, n_out = self.num_input, int(self.own.num_output)
        shapes: list[tuple[int, ...]] = [(n_in, n_out) if self.own.transpose
                                         else (n_out, n_in)]
        return [*shapes, (n_out,)] if self.own.bias_term else shapes

    def default_param_conf(self, index: int) -> ParamConf:
        init = ({"type": "kUniformSqrtFanInOut"} if index == 0
                else {"type": "kConstant", "value": 0})
        return ParamConf.parse({"init": init})

    def compute(self, x: Any) -> Any:
        torch = require_torch()
        if x.dim() != 2:
            x = x.reshape(x.shape[0], -1)
        w = self.weights[0]
        b = self.weights[1] if self.own.bias_term else None
        if self.own.transpose:
            return torch.addmm(b, x, w) if b is not None else x @ w
        return torch.nn.functional.linear(x, w, b)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.compute(self.srcs[0].data)

    def backward(self) -> None:
        g = self.grad
        x = self.srcs[0].data
        if x.dim() != 2:
            x = x.reshape(x.shape[0], -1)
        w = self.weights[0]
        gt = g.t()
        fresh = self.fresh_grads
        if self.own.transpose:
            add_product(w.grad, x, g, fresh)
        else:
            add_product(w.grad, g, x, fresh)
        if self.own.bias_term:  # Σ over the batch, in one fused call
            ones = self._ones
            if ones is None or ones.shape[0] != g.shape[0] or ones.dtype != g.dtype \
                    or ones.device != g.device:
                ones = self._ones = g.new_ones(g.shape[0])
            self.weights[1].grad.addmv_(gt, ones, beta=0 if fresh else 1)
        if self.wants_grad(0):
            self.give_grad(0, g @ (w.t() if self.own.transpose else w))


#: The rows of a weight gradient :func:`add_product` writes per GEMM call on the CPU: about
#: this many bytes of it.
PRODUCT_BLOCK_BYTES = 1 << 20


def add_product(out: Any, a: Any, b: Any, fresh: bool = False) -> Any:
    """``out += aᵀ · b`` (``fresh``: ``out = aᵀ · b``, ``out``'s old values unread): a
    weight's gradient from a batch, ``a`` ``(batch, m)`` and ``b`` ``(batch, n)``.

    On the CPU, in blocks of about :data:`PRODUCT_BLOCK_BYTES` of ``out``'s rows, one GEMM
    call each. Hand-written because it is measurably faster than one call: written fresh
    that way, each block is still in the cache when the GEMM adds into it, where MKL's one
    call with ``beta = 0`` zeroes the whole output in a pass of its own first. Measured on
    SINGA's MNIST MLP (a batch of 64, 12M weights, one thread, medians of 60 interleaved
    training steps): 72–77 ms a step for blocks of 64 rows to 2 MiB, against 82 ms for one
    call adding into gradients the net zeroed first (one call writing them was no faster).
    Adding (not ``fresh``) is blocked alike, so that both give the same bits."""
    if out.device.type != "cpu":
        return out.addmm_(a.t(), b, beta=0 if fresh else 1)
    rows = max(1, PRODUCT_BLOCK_BYTES // max(1, out.shape[1] * out.element_size()))
    beta = 0 if fresh else 1
    for i in range(0, out.shape[0], rows):
        out[i:i + rows].addmm_(a[:, i:i + rows].t(), b, beta=beta)
    return out


# -- activations ----------------------------------------------------------------------------


class ActivationLayer(Layer):
    """``y = f(x)`` element by element; the backward pass is torch's fused derivative of
    ``f`` (``tanh_backward``, ``sigmoid_backward``, ``threshold_backward``) from the
    output."""

    #: The function, by SINGA's ``ActivationType`` name.
    function = "RELU"

    def setup(self) -> None:
        super().setup()
        self.float_source()
        self._tanh: Any = None

    def compute(self, x: Any) -> Any:
        return apply_activation(self.activation(), x)

    def activation(self) -> str:
        return self.function

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        if self.activation() == "STANH":  # keep tanh(Bx) for the backward pass
            torch = require_torch()
            self._tanh = torch.tanh(x * STANH_B)
            self.data = self._tanh * STANH_A
        else:
            self.data = self.compute(x)

    def backward(self) -> None:
        if not self.wants_grad(0):
            return
        aten = require_torch().ops.aten
        function = self.activation()
        if function == "STANH":
            g = aten.tanh_backward(self.grad, self._tanh).mul_(STANH_A * STANH_B)
        elif function == "TANH":
            g = aten.tanh_backward(self.grad, self.data)
        elif function == "SIGMOID":
            g = aten.sigmoid_backward(self.grad, self.data)
        else:
            g = aten.threshold_backward(self.grad, self.data, 0)
        self.give_grad(0, g)


#: LeCun's scaled tanh, ``A · tanh(B · x)``, with SINGA's constants.
STANH_A, STANH_B = 1.7159047, 2.0 / 3.0


def apply_activation(function: str, x: Any) -> Any:
    """RELU, SIGMOID, TANH or STANH of ``x`` (differentiable)."""
    torch = require_torch()
    if function == "RELU":
        return torch.relu(x)
    if function == "SIGMOID":
        return torch.sigmoid(x)
    if function == "TANH":
        return torch.tanh(x)
    return torch.tanh(x * STANH_B) * STANH_A


@register_layer("kReLU")
class ReLULayer(ActivationLayer):
    """``max(x, 0)``. ``relu_conf { negative_slope }`` is read and has no effect, as in
    SINGA."""

    Config = ReLUConf
    function = "RELU"


@register_layer("kSigmoid", aliases=("logistic",))
class SigmoidLayer(ActivationLayer):
    """``1 / (1 + exp(-x))``."""

    function = "SIGMOID"


@register_layer("kTanh")
class TanhLayer(ActivationLayer):
    """``tanh(x)``."""

    function = "TANH"


@register_layer("kSTanh", aliases=("scaled_tanh",))
class STanhLayer(ActivationLayer):
    """LeCun's scaled tanh, ``1.7159047 · tanh(2x/3)`` (SINGA's constants)."""

    function = "STANH"


@register_layer("kActivation")
class ChosenActivationLayer(ActivationLayer):
    """The activation ``activation_conf { type }`` names: RELU, SIGMOID, TANH or STANH
    (SINGA v0.3)."""

    Config = ActivationConf

    def activation(self) -> str:
        return str(self.own.type)


@register_layer("kCudnnActivation")
class CudnnActivationLayer(ChosenActivationLayer):
    """SINGA's cuDNN activation: as kActivation, on the GPU when the job's ``gpu`` asks for
    one and torch sees one, else on the CPU."""


# -- dropout --------------------------------------------------------------------------------


@register_layer("kDropout")
class DropoutLayer(Layer):
    """Inverted dropout: in training, each element is kept with probability ``1 - ratio``
    and scaled by ``1 / (1 - ratio)``; in tests the layer passes its input on unchanged.

    The mask comes from the generator given to :meth:`forward`, so it is deterministic.
    """

    Config = DropoutConf

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.mask: Any = None

    def setup(self) -> None:
        super().setup()
        self.float_source()

    def compute(self, x: Any) -> Any:
        return x if self.mask is None else x * self.mask

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        ratio = float(self.own.dropout_ratio)
        if phase != "train" or ratio == 0.0:
            self.mask = None
        else:
            if rng is None:
                raise self.error("needs a random generator in training")
            keep = rng.random(tuple(x.shape)) >= ratio
            mask = keep.astype(self.dtype) * self.dtype.type(1.0 / (1.0 - ratio))
            self.mask = as_tensor(mask).to(x.device)
        self.data = self.compute(x)

    def backward(self) -> None:
        self.give_grad(0, self.grad if self.mask is None else self.grad * self.mask)


# -- softmax --------------------------------------------------------------------------------


@register_layer("kSoftmax")
class SoftmaxLayer(Layer):
    """Softmax of each sample's features, in ``num_softmax_per_instance`` equal groups
    (one softmax per group, e.g. per channel). Its gradient is autograd's."""

    Config = SoftmaxConf

    def setup(self) -> None:
        super().setup()
        self.float_source()
        size = int(np.prod(self.out_shape, dtype=np.int64))
        groups = int(self.own.num_softmax_per_instance)
        if size % groups:
            raise self.error(f"num_softmax_per_instance {groups} does not divide the "
                             f"{size} features of a sample")

    def compute(self, x: Any) -> Any:
        groups = int(self.own.num_softmax_per_instance)
        return x.reshape(x.shape[0], groups, -1).softmax(-1).reshape(x.shape)


@register_layer("kCudnnSoftmax")
class CudnnSoftmaxLayer(SoftmaxLayer):
    """SINGA's cuDNN softmax: as kSoftmax, on the GPU when the job's ``gpu`` asks for one
    and torch sees one, else on the CPU."""


# -- embedding ------------------------------------------------------------------------------


@register_layer("kEmbedding", aliases=("lookup_table",))
class EmbeddingLayer(Layer):
    """Looks up one row of a table per integer id: input ids of shape ``s`` give outputs of
    shape ``s + (feature_dim,)``.

    Param: the table, shape ``(vocab_size, feature_dim)``; default init kGaussian (std 1).
    Gradients of repeated ids add up; the ids get none.

    In a training job the table is row-sparse (SPEC §10): a worker pulls the rows of its
    batch's ids from the servers and pushes their gradient as rows by id; it never holds
    the table, and the servers update only those rows (lazily, for stateful updaters).
    """

    Config = EmbeddingConf
    row_sparse_params = (0,)

    def setup(self) -> None:
        super().setup()
        src = self.srcs[0]
        if not src.int_output:
            raise self.error(f"srclayer '{src.name}' gives floats; {self.type} reads integer "
                             "ids")
        vocab = int(self.own.vocab_size)
        if vocab < 1:
            raise self.error("embedding_conf vocab_size is not set (it must be at least 1)")
        ids = getattr(src, "id_range", lambda: None)()
        if ids is not None:
            lo, hi = ids
            if lo < 0 or hi >= vocab:
                raise self.error(f"the ids of '{src.name}' are in [{lo}, {hi}], outside "
                                 f"[0, vocab_size) = [0, {vocab})")
        self.out_shape = (*src.out_shape, int(self.own.feature_dim))

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(int(self.own.vocab_size), int(self.own.feature_dim))]

    def default_param_conf(self, index: int) -> ParamConf:
        return ParamConf.parse({"init": {"type": "kGaussian"}})

    def compute(self, ids: Any) -> Any:
        table = self.weights[0]
        if not isinstance(table, TableParam):
            return table[ids]
        torch = require_torch()  # a table's rows by id, from where it is held
        unique, at = np.unique(ids.reshape(-1).cpu().numpy(), return_inverse=True)
        rows = torch.from_numpy(table.rows(unique)).to(ids.device)
        self._rows = (unique, torch.from_numpy(at.reshape(-1)).to(ids.device))
        return rows[self._rows[1]].reshape(*ids.shape, table.dim)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        ids = self.srcs[0].data
        vocab = int(self.own.vocab_size)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise self.error(f"an id is outside [0, {vocab})")
        self.data = self.compute(ids)

    def backward(self) -> None:
        if isinstance(self.weights[0], TableParam):
            table = self.weights[0]
            unique, at = self._rows
            g = self.grad.new_zeros((len(unique), table.dim))
            g.index_add_(0, at, self.grad.reshape(-1, table.dim))
            table.add_grad_rows(unique, g.cpu().numpy())
            return
        table = self.weights[0].grad
        ids = self.srcs[0].data.reshape(-1)
        table.index_add_(0, ids, self.grad.reshape(-1, table.shape[1]))


__all__ = ["STANH_A", "STANH_B", "ActivationLayer", "ChosenActivationLayer",
           "CudnnActivationLayer", "CudnnSoftmaxLayer", "DropoutLayer", "EmbeddingLayer",
           "InnerProductLayer", "ReLULayer", "STanhLayer", "SigmoidLayer", "SoftmaxLayer",
           "TanhLayer", "apply_activation"]
