"""Convolution, pooling and local response normalisation, with PyTorch's kernels.

SINGA's three implementations of each (``kConvolution`` with mshadow, ``kCConvolution``
with Caffe's im2col, ``kCudnnConv`` with cuDNN; likewise pooling and LRN) compute the same
function; here each family is one class on ``torch.nn.functional``. Convolution and max
pooling call torch's backward kernels directly (:meth:`ConvolutionLayer.backward`,
:meth:`PoolingLayer.forward` say which, and why); average pooling and LRN take autograd's
gradient. The cuDNN-named types run on the GPU when the job's ``gpu`` asks for one and
torch sees one (cuDNN is then torch's), else on the CPU.

On the CPU, convolution and max pooling work on images laid out **channels-last** (each
pixel's channels side by side in memory: torch's ``channels_last``), and hand their outputs
and their sources' gradients on in that layout; torch's kernels for it (oneDNN's for
convolution) are the faster ones. LeNet's step on one thread, 64 images, medians of 200
interleaved calls: conv2's backward 10.4 against 13.3 ms planar, its forward 3.6 against
4.4, pool1's forward 1.0 against 2.6 (no conversion there and back), conv1's weight gradient
1.9 against 2.5 ms for the im2col + GEMM kernel planar (7.1 for oneDNN's planar): the conv
stack's step 25.4 against 31.6 ms (300 interleaved steps). The layout is only the
memory's: every value, index and shape is the planar one's, and a layer that needs planar
memory gets it from ``reshape``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config.job import ParamConf
from ...singa.confs import ConvolutionConf, LRNConf, PoolingConf
from .base import Layer, register_layer, require_torch, shape_text


def _pair(conf: Any, name: str, default: int) -> tuple[int, int]:
    """``(y, x)`` of a square field (``kernel``) and its ``_y``/``_x`` forms: the square one
    unless it is left at its default and the other two are given."""
    both = int(getattr(conf, name))
    y, x = int(getattr(conf, f"{name}_y")), int(getattr(conf, f"{name}_x"))
    if both == default and (y, x) != (default, default):
        return y, x
    return both, both


def _image_shape(layer: Layer) -> tuple[int, int, int]:
    """``(channels, height, width)`` of the source's samples (2-D samples: one channel)."""
    shape = layer.srcs[0].out_shape
    if len(shape) == 3:
        return shape[0], shape[1], shape[2]
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    raise layer.error(f"srclayer '{layer.srcs[0].name}' gives shape {shape_text(shape)}; "
                      f"{layer.type} reads images (channels, height, width)")


def _channels_last(x: Any) -> Any:
    """``x`` (n, c, h, w) laid out channels-last: a copy unless it is already; one channel's
    planar memory is channels-last memory as it lies (only the strides say which, and
    torch's kernels read them), so it is given those strides without a copy."""
    torch = require_torch()
    if x.shape[1] == 1:
        x = x.contiguous()
        return x.as_strided(x.shape, (x.stride(0), 1, x.shape[3], 1))
    return x.contiguous(memory_format=torch.channels_last)


def _on_cpu(x: Any) -> Any:
    """``x`` channels-last where it is on the CPU (see the module's docstring); on a GPU as
    it is (cuDNN's choice is torch's)."""
    return _channels_last(x) if x.device.type == "cpu" else x


def _images(x: Any, channels: int) -> Any:
    """A source's data ``x`` as ``(batch, channels, h, w)`` (2-D samples: one channel),
    channels-last on the CPU."""
    return _on_cpu(x.reshape(x.shape[0], channels, *x.shape[-2:]))


def _out_size(layer: Layer, size: int, kernel: int, pad: int, stride: int, what: str) -> int:
    if kernel < 1 or stride < 1:
        raise layer.error(f"kernel and stride must be at least 1 (got {kernel}, {stride})")
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise layer.error(f"the {what} {size} (padding {pad}) is smaller than the kernel "
                          f"{kernel}")
    return out


@register_layer("kConvolution")
class ConvolutionLayer(Layer):
    """2-D convolution (cross-correlation, as SINGA's and every framework's) of ``(c, h, w)``
    images with ``num_filters`` kernels; out ``(num_filters, h', w')`` with ``h' = (h + 2·pad
    − kernel) / stride + 1`` (integer division).

    Params, as SINGA lays them out: the weight ``(num_filters, c·kernel_y·kernel_x)`` (so
    SINGA's fan-in methods see ``c·k·k`` inputs; its rows are the filters, row-major
    ``(c, ky, kx)``) and, with ``bias_term``, the bias ``(num_filters,)``. Defaults for
    missing ``param`` entries: weight kUniformSqrtFanIn, bias kConstant 0.
    """

    Config = ConvolutionConf
    writes_whole_grads = True

    def setup(self) -> None:
        super().setup()
        self.float_source()
        c = self.own
        if c.num_filters < 1:
            raise self.error("convolution_conf num_filters must be set (at least 1)")
        self.channels, h, w = _image_shape(self)
        self.kernel = _pair(c, "kernel", 3)
        self.pad = _pair(c, "pad", 0)
        self.stride = _pair(c, "stride", 1)
        oh = _out_size(self, h, self.kernel[0], self.pad[0], self.stride[0], "height")
        ow = _out_size(self, w, self.kernel[1], self.pad[1], self.stride[1], "width")
        self.out_shape = (int(c.num_filters), oh, ow)

    def param_shapes(self) -> list[tuple[int, ...]]:
        f = int(self.own.num_filters)
        shapes: list[tuple[int, ...]] = [(f, self.channels * self.kernel[0] * self.kernel[1])]
        return [*shapes, (f,)] if self.own.bias_term else shapes

    def default_param_conf(self, index: int) -> ParamConf:
        init = ({"type": "kUniformSqrtFanIn"} if index == 0
                else {"type": "kConstant", "value": 0})
        return ParamConf.parse({"init": init})

    #: The source's images as the last training forward pass convolved them (channels-last
    #: on the CPU), kept for :meth:`backward`.
    _x: Any = None

    def images(self) -> Any:
        """The source's data as ``(batch, channels, h, w)``, channels-last on the CPU."""
        return _images(self.srcs[0].data, self.channels)

    def compute(self, x: Any) -> Any:
        return self._convolve(_images(x, self.channels))

    def _convolve(self, x: Any) -> Any:
        """The convolution of images ``x`` as :meth:`images` gives them."""
        w = self.weights[0].view(-1, self.channels, *self.kernel)
        bias = self.weights[1] if self.own.bias_term else None
        return require_torch().nn.functional.conv2d(x, w, bias, self.stride, self.pad)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.images()
        self._x = x if self.training else None
        self.data = self._convolve(x)

    def backward(self) -> None:
        """The gradients of the input, the weight and the bias in one call of torch's
        convolution backward (what autograd would call), put into the weights' ``.grad``
        without an autograd graph; on the CPU channels-last, oneDNN's kernel for every
        number of channels (planar, one input channel's weight gradient was 3× slower there
        than im2col + GEMM; channels-last it is the faster: the module's docstring)."""
        torch = require_torch()
        x = self._x if self._x is not None else self.images()
        self._x = None
        w = self.weights[0]
        w4 = w.view(-1, self.channels, *self.kernel)
        bias = self.own.bias_term
        mask = [self.wants_grad(0), True, bool(bias)]
        g = _on_cpu(self.grad)
        gx, gw, gb = torch.ops.aten.convolution_backward(
            g, x, w4, [w4.shape[0]] if bias else None, list(self.stride), list(self.pad),
            [1, 1], False, [0, 0], 1, mask)
        self.put_grad(0, gw)
        if bias:
            self.put_grad(1, gb)
        if gx is not None:
            self.give_grad(0, gx)


@register_layer("kCConvolution")
class CConvolutionLayer(ConvolutionLayer):
    """SINGA's convolution by Caffe's im2col: the same function as kConvolution."""


@register_layer("kCudnnConv")
class CudnnConvLayer(ConvolutionLayer):
    """SINGA's cuDNN convolution: as kConvolution, on the GPU when the job's ``gpu`` asks for
    one and torch sees one, else on the CPU. ``workspace_byte_limit`` has no effect."""


@register_layer("kPooling")
class PoolingLayer(Layer):
    """Max or average pooling (``pool: MAX | AVG``) over ``kernel`` windows moved by
    ``stride``, each channel alone; out ``(c, h', w')``, ``h' = (h + 2·pad − kernel) /
    stride + 1`` (integer division, as SINGA's set-up). Padding adds zeros to average
    windows (counted in the divisor, as SINGA's) and nothing to max windows."""

    Config = PoolingConf
    #: The indices of the maxima of the last training forward pass (max pooling).
    _where: Any = None

    def setup(self) -> None:
        super().setup()
        self.float_source()
        c = self.own
        self.channels, h, w = _image_shape(self)
        self.kernel = _pair(c, "kernel", 3)
        self.pad = _pair(c, "pad", 0)
        self.stride = _pair(c, "stride", 2)
        for k, p in zip(self.kernel, self.pad, strict=True):
            if 2 * p > k:
                raise self.error(f"pad {p} is more than half the kernel {k}")
        oh = _out_size(self, h, self.kernel[0], self.pad[0], self.stride[0], "height")
        ow = _out_size(self, w, self.kernel[1], self.pad[1], self.stride[1], "width")
        self.out_shape = (self.channels, oh, ow)

    def compute(self, x: Any) -> Any:
        f = require_torch().nn.functional
        x = x.reshape(x.shape[0], self.channels, *x.shape[-2:])
        if self.own.pool == "MAX":
            return f.max_pool2d(x, self.kernel, self.stride, self.pad)
        return f.avg_pool2d(x, self.kernel, self.stride, self.pad, count_include_pad=True)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        """Max pooling keeps the indices of the maxima for its backward pass (torch's
        kernels, no autograd graph); average pooling is autograd's.

        On the CPU the images are pooled channels-last, and the output stays so (the
        module's docstring): torch's kernel then runs along the channels (LeNet's pool1, 64
        × 20 × 24 × 24, one thread: 1.0 ms against 2.6 converting a planar input there and
        back). Values and indices are those of the planar layout (the indices count within
        each channel's image).
        """
        if self.own.pool != "MAX":
            super().forward(phase, rng)
            return
        torch = require_torch()
        x = _images(self.srcs[0].data, self.channels)
        out, where = torch.nn.functional.max_pool2d_with_indices(x, self.kernel, self.stride,
                                                                 self.pad)
        self.data = out
        self._where = where if self.training else None

    def backward(self) -> None:
        if self.own.pool != "MAX":
            super().backward()
            return
        if self._where is None or not self.wants_grad(0):
            return
        torch = require_torch()
        x = _images(self.srcs[0].data, self.channels)
        g = torch.ops.aten.max_pool2d_with_indices_backward(
            self.grad, x, list(self.kernel), list(self.stride), list(self.pad), [1, 1],
            False, self._where)
        self._where = None
        self.give_grad(0, g)


@register_layer("kCPooling")
class CPoolingLayer(PoolingLayer):
    """SINGA's pooling by Caffe's kernels: the same function as kPooling."""


@register_layer("kCudnnPool")
class CudnnPoolLayer(PoolingLayer):
    """SINGA's cuDNN pooling: as kPooling, on the GPU when the job's ``gpu`` asks for one
    and torch sees one, else on the CPU."""


@register_layer("kLRN")
class LRNLayer(Layer):
    """Local response normalisation across channels: ``y = x / (knorm + alpha / local_size
    · Σ x²)^beta``, the sum over the ``local_size`` channels around each one (zeros beyond
    the edges)."""

    Config = LRNConf

    def setup(self) -> None:
        super().setup()
        self.float_source()
        if len(self.out_shape) != 3:
            raise self.error(f"srclayer '{self.srcs[0].name}' gives shape "
                             f"{shape_text(self.out_shape)}; {self.type} reads images "
                             "(channels, height, width)")

    def compute(self, x: Any) -> Any:
        c = self.own
        return require_torch().nn.functional.local_response_norm(
            x, int(c.local_size), float(c.alpha), float(c.beta), float(c.knorm))


@register_layer("kCudnnLRN")
class CudnnLRNLayer(LRNLayer):
    """SINGA's cuDNN LRN: as kLRN, on the GPU when the job's ``gpu`` asks for one and torch
    sees one, else on the CPU."""


__all__ = ["CConvolutionLayer", "CPoolingLayer", "ConvolutionLayer", "CudnnConvLayer",
           "CudnnLRNLayer", "CudnnPoolLayer", "LRNLayer", "PoolingLayer"]
