"""Batch normalisation: SINGA v0.3.0's ``kBM`` and ``kCudnnBM``.

SINGA declared ``kBM`` (its computation left to do) and computed ``kCudnnBM`` with cuDNN's
spatial batch normalisation: each channel normalised by the mean and variance over the batch
and the image, then scaled and shifted by two trained Params. Here both types are one class
on PyTorch (its gradient autograd's), on the GPU when the job's ``gpu`` asks for one and
torch sees one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...config.job import ParamConf
from ...singa.confs import BMConf
from .base import Layer, register_layer, require_torch, shape_text

#: cuDNN's smallest epsilon (``CUDNN_BN_MIN_EPSILON``), which SINGA's layer passed.
EPSILON = 1e-5


@register_layer("kBM")
class BatchNormLayer(Layer):
    """Batch normalisation of each channel over the batch and the image (cuDNN's spatial
    mode): ``y = scale · (x − mean) / sqrt(var + 1e-5) + bias``, the mean and (biased)
    variance of the batch being computed. Images ``(channels, height, width)``, or flat
    features (each its own channel); the output has the input's shape.

    Params, as SINGA lays them out, each ``(1, channels, 1, 1)``: the scale (default
    kConstant 1) and the bias (default kConstant 0), trained; then SINGA's running mean and
    running inverse variance (default kConstant 0), which are kept with the job's Params and
    checkpoints but not trained and not used: every phase normalises by its own batch's
    statistics (**Decision**: SINGA's cuDNN layer kept only the last training batch's, its
    running average factor being 1; a test batch's own are as good an estimate and need no
    state shared between the workers' nets and the test net).
    """

    Config = BMConf
    #: The Params no training step changes (the trainer gives them lr_scale 0).
    untrained_params: ClassVar[tuple[int, ...]] = (2, 3)

    def setup(self) -> None:
        super().setup()
        self.float_source()
        shape = self.out_shape
        if len(shape) not in (1, 3):
            raise self.error(f"srclayer '{self.srcs[0].name}' gives shape {shape_text(shape)};"
                             f" {self.type} reads images (channels, height, width) or "
                             "features")
        self.channels = int(shape[0])

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(1, self.channels, 1, 1)] * 4

    def default_param_conf(self, index: int) -> ParamConf:
        return ParamConf.parse({"init": {"type": "kConstant", "value": 1 if index == 0 else 0}})

    def compute(self, x: Any) -> Any:
        torch = require_torch()
        axes = (0, 2, 3) if x.dim() == 4 else (0,)
        mean = x.mean(axes, keepdim=True)
        var = x.var(axes, unbiased=False, keepdim=True)
        view = (1, self.channels, 1, 1) if x.dim() == 4 else (1, self.channels)
        scale, bias = (w.reshape(view) for w in self.weights[:2])
        return (x - mean) * torch.rsqrt(var + EPSILON) * scale + bias


@register_layer("kCudnnBM")
class CudnnBatchNormLayer(BatchNormLayer):
    """SINGA's cuDNN batch normalisation: as kBM, on the GPU when the job's ``gpu`` asks for
    one and torch sees one, else on the CPU."""


__all__ = ["EPSILON", "BatchNormLayer", "CudnnBatchNormLayer"]
