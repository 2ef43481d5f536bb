"""Connection layers: slice, concatenate, split, bridges, and SINGA's dummy layer.

Shapes here count the batch: ``slice_dim: 0`` and ``concate_dim: 0`` are the batch axis,
``1`` the first axis of a sample (as in SINGA, whose blobs carry the batch on axis 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config.job import LayerConf
from ...singa.confs import ConcateConf, DummyConf, SliceConf, SplitConf
from .base import Layer, as_tensor, register_layer, require_torch, shape_text


@register_layer("kSlice")
class SliceLayer(Layer):
    """Cuts its source into ``num_slices`` equal pieces along ``slice_dim``; the layers that
    read it get one piece each, in the order they are written in the net (SINGA's). The
    gradient of each piece goes back to its part of the source."""

    Config = SliceConf

    def setup(self) -> None:
        super().setup()
        dim, n = int(self.own.slice_dim), int(self.own.num_slices)
        shape = self.srcs[0].out_shape
        if dim > len(shape):
            raise self.error(f"slice_dim {dim} is beyond the axes of shape (batch,) + "
                             f"{shape_text(shape)}")
        if dim > 0 and shape[dim - 1] % n:
            raise self.error(f"num_slices {n} does not divide axis {dim} of size "
                             f"{shape[dim - 1]}")
        self.part_shape = shape if dim == 0 else (
            *shape[:dim - 1], shape[dim - 1] // n, *shape[dim:])
        self.readers: list[str] = []

    def piece_for(self, reader: str) -> int:
        """The piece the layer named ``reader`` gets (its position among the readers, in
        net order)."""
        if reader not in self.readers:
            if len(self.readers) == int(self.own.num_slices):
                raise self.error(f"has {self.own.num_slices} slices, all taken: layer "
                                 f"'{reader}' is one reader too many")
            self.readers.append(reader)
        return self.readers.index(reader)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.srcs[0].data

    def part(self, k: int) -> Any:
        x = self.data
        dim = int(self.own.slice_dim)
        size = x.shape[dim] // int(self.own.num_slices)
        return x.narrow(dim, k * size, size)

    def add_part_grad(self, k: int, g: Any) -> None:
        """Add the gradient of piece ``k``."""
        if self.grad is None:
            self.grad = require_torch().zeros_like(self.data)
        dim = int(self.own.slice_dim)
        size = self.grad.shape[dim] // int(self.own.num_slices)
        self.grad.narrow(dim, k * size, size).add_(g)

    def backward(self) -> None:
        self.give_grad(0, self.grad)


class SlicePart(Layer):
    """One piece of a kSlice, as its reader sees it (the net puts it between them)."""

    def __init__(self, slice_layer: SliceLayer, reader_conf: LayerConf, k: int, **kwargs: Any):
        conf = LayerConf.parse({"name": f"{slice_layer.name}[{k}]", "type": "kSplit",
                                "srclayers": [slice_layer.name]})
        super().__init__(conf, [slice_layer], **kwargs)
        self.k = k
        self.type = "kSlice"

    def setup(self) -> None:
        super().setup()
        src = self.srcs[0]
        assert isinstance(src, SliceLayer)
        self.out_shape = src.part_shape
        self.int_output = src.int_output

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        src = self.srcs[0]
        assert isinstance(src, SliceLayer)
        self.data = src.part(self.k)

    def backward(self) -> None:
        src = self.srcs[0]
        assert isinstance(src, SliceLayer)
        if self.wants_grad(0):
            src.add_part_grad(self.k, self.grad)


@register_layer("kConcate")
class ConcateLayer(Layer):
    """Joins its sources along ``concate_dim`` (their other axes must agree); each source
    gets its part of the gradient back. ``num_concates`` must be the number of sources."""

    Config = ConcateConf
    max_srcs = None

    def setup(self) -> None:
        super().setup()
        dim, n = int(self.own.concate_dim), int(self.own.num_concates)
        if n != len(self.srcs):
            raise self.error(f"num_concates is {n} but it reads {len(self.srcs)} srclayers")
        first = self.srcs[0].out_shape
        if dim > len(first):
            raise self.error(f"concate_dim {dim} is beyond the axes of shape (batch,) + "
                             f"{shape_text(first)}")
        total = 0
        for src in self.srcs:
            shape = src.out_shape
            same = [a for i, a in enumerate(shape) if i != dim - 1]
            if len(shape) != len(first) or same != [a for i, a in enumerate(first)
                                                     if i != dim - 1]:
                raise self.error(f"srclayer '{src.name}' gives shape {shape_text(shape)}, "
                                 f"which does not join '{self.srcs[0].name}''s "
                                 f"{shape_text(first)} on axis {dim}")
            total += shape[dim - 1] if dim > 0 else 0
        self.out_shape = first if dim == 0 else (*first[:dim - 1], total, *first[dim:])
        self.int_output = self.srcs[0].int_output

    def compute(self, *xs: Any) -> Any:
        return require_torch().cat(list(xs), int(self.own.concate_dim))

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.compute(*(s.data for s in self.srcs))

    def backward(self) -> None:
        dim, start = int(self.own.concate_dim), 0
        for i, src in enumerate(self.srcs):
            size = src.data.shape[dim]
            self.give_grad(i, self.grad.narrow(dim, start, size))
            start += size


class _Identity(Layer):
    """Passes its source on; the gradients of its readers go back to the source."""

    def setup(self) -> None:
        super().setup()
        self.int_output = self.srcs[0].int_output

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.srcs[0].data
        self.labels = getattr(self.srcs[0], "labels", None)

    def backward(self) -> None:
        self.give_grad(0, self.grad)


@register_layer("kSplit")
class SplitLayer(_Identity):
    """Gives its source to several layers (``num_splits``); their gradients add up. (Any
    layer may be read by several; SINGA inserts kSplit for that, here it is optional.)"""

    Config = SplitConf


@register_layer("kBridgeSrc")
class BridgeSrcLayer(_Identity):
    """The sending end of a connection between the partitions of a layer on different
    workers of a group (SINGA inserts it); within one net it passes its source on."""


@register_layer("kBridgeDst")
class BridgeDstLayer(_Identity):
    """The receiving end of a connection between partitions (see kBridgeSrc)."""


@register_layer("kDummy")
class DummyLayer(Layer):
    """SINGA's stand-in layer for tests: with ``input``, random values in [0, 1) of
    ``shape`` (the batch first); else its source passed on (``output`` marks the end of a
    net and changes nothing)."""

    Config = DummyConf
    min_srcs = 0

    def setup(self) -> None:
        if self.own.input:
            if self.srcs:
                raise self.error("an input kDummy reads no srclayers")
            if len(self.own.shape) < 1:
                raise self.error("an input kDummy needs dummy_conf shape (batch first)")
            self.out_shape = tuple(int(s) for s in self.own.shape[1:])
            return
        if not self.srcs:
            raise self.error("a kDummy that is not an input reads one srclayer")
        super().setup()

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        if self.own.input:
            gen = rng if rng is not None else np.random.default_rng(self.seed)
            x = gen.random(tuple(int(s) for s in self.own.shape)).astype(self.dtype)
            self.data = as_tensor(x)
            if self.device is not None:
                self.data = self.data.to(self.device)
        else:
            self.data = self.srcs[0].data

    def backward(self) -> None:
        if not self.own.input:
            self.give_grad(0, self.grad)


__all__ = ["BridgeDstLayer", "BridgeSrcLayer", "ConcateLayer", "DummyLayer", "SliceLayer",
           "SlicePart", "SplitLayer"]
