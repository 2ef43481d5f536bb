"""Partitioning a net within a worker group (SINGA's ``partition_dim``).

The ``K`` workers of a group compute one net together, each layer partitioned on

* ``partition_dim: 0``, the batch: worker ``k`` computes the layer for its share of the
  batch (its rows; the net's default), with all of the layer's Params;
* ``partition_dim: 1``, the features: worker ``k`` computes part ``k`` of the layer's output
  features (an inner product's outputs, a convolution's filters, an activation's or a
  pooling's channels) for the whole batch, with its part of the Params (rows of the
  weight, of the bias).

Where a layer reads a source partitioned otherwise, connection layers join the parts as
SINGA's bridge, concate and slice layers do (SINGA's NeuralNet inserts them; so does
:meth:`~paramserver.train.net.Net` here): :class:`Gather` brings every worker's part
(``kBridgeSrc``/``kBridgeDst`` and ``kConcate`` on the batch or the features), and
:class:`Narrow` keeps this worker's part (``kSlice``). Their backward passes send the
gradient back: a gathered tensor's gradient is the sum over the workers of theirs, of
which each keeps its part.

Each worker's loss is the mean over its share of the batch, and the servers take the mean
of the group's gradients; so a Param of a batch-partitioned layer gets the mean of the
workers' gradients, and a feature-partitioned layer's part — computed by one worker on the
whole batch, from every worker's loss — the same value: the partitioned job computes what
the unpartitioned one does (:mod:`tests.test_partition` checks it to float tolerance).

The workers exchange the parts through a :class:`GroupExchange`, in memory: feature
partitioning runs on the embedded cluster (a Ray job may partition on the batch only; a
Ray worker's first exchange fails after ``cluster.timeout``, naming the workers it waited
for).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import LayerConf
from .layers.base import Layer, require_torch

#: Layer types that can be partitioned on the features: those that read their whole input
#: (their Params are split by rows) ...
SPLIT_PARAMS = {"kInnerProduct", "kConvolution", "kCConvolution", "kCudnnConv"}
#: ... and those that compute each feature (channel) from the same feature of their input.
PER_FEATURE = {"kReLU", "kSigmoid", "kTanh", "kSTanh", "kActivation", "kCudnnActivation",
               "kDropout", "kPooling", "kCPooling", "kCudnnPool"}


class GroupExchange:
    """Where the workers of a group hand each other their parts: :meth:`all_gather` returns
    every worker's tensor for the same call (calls are numbered the same on every worker,
    as they run the same layers in the same order)."""

    def __init__(self, size: int, timeout: float = 60.0):
        self.size = size
        self.timeout = timeout
        self._slots: dict[int, list[Any]] = {}
        self._taken: dict[int, int] = {}
        self._cond = threading.Condition()

    def all_gather(self, seq: int, rank: int, tensor: Any, what: str) -> list[Any]:
        with self._cond:
            slot = self._slots.setdefault(seq, [None] * self.size)
            slot[rank] = tensor
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: all(x is not None for x in slot),
                                       self.timeout):
                missing = [r for r, x in enumerate(slot) if x is None]
                raise ParamError(f"worker {rank} of the group waited {self.timeout:g} s "
                                 f"(cluster.timeout) for the parts of {what} from workers "
                                 f"{missing}: partition_dim 1 needs the workers of a group "
                                 "in one process (the embedded cluster)")
            out = list(slot)
            self._taken[seq] = self._taken.get(seq, 0) + 1
            if self._taken[seq] == self.size:
                del self._slots[seq], self._taken[seq]
            return out


#: The exchanges of the groups whose workers run in this process, while their nets live.
_exchanges: weakref.WeakValueDictionary[str, GroupExchange] = weakref.WeakValueDictionary()
_exchanges_lock = threading.Lock()


def group_exchange(key: str, size: int, timeout: float) -> GroupExchange:
    """The exchange of the group ``key`` (a run and a worker group) in this process, made by
    its first worker. The workers of a group must share the process (the embedded
    cluster); a worker alone in its process (a Ray actor) waits for the others in vain, and
    its first exchange fails after ``timeout`` naming them."""
    with _exchanges_lock:
        found = _exchanges.get(key)
        if found is None or found.size != size:
            found = _exchanges[key] = GroupExchange(size, timeout)
        return found


class Comm:
    """A worker's place in its group: its index, the group's size and exchange, and the
    number of the next exchange."""

    def __init__(self, index: int, size: int, exchange: GroupExchange):
        self.index = index
        self.size = size
        self.exchange = exchange
        self.seq = 0

    def all_gather(self, tensor: Any, what: str) -> list[Any]:
        seq = self.seq
        self.seq += 1
        return self.exchange.all_gather(seq, self.index, tensor, what)


def _conf(name: str, src: str) -> LayerConf:
    return LayerConf.parse({"name": name, "type": "kSplit", "srclayers": [src]})


class Gather(Layer):
    """Every worker's part of its source, joined along ``axis`` (0: the batch, 1: the
    features): SINGA's bridges and concate layer."""

    collective = True

    def __init__(self, src: Layer, axis: int, comm: Comm, **kwargs: Any):
        what = "batch" if axis == 0 else "features"
        super().__init__(_conf(f"concate({src.name})@{what}", src.name), [src], **kwargs)
        self.type = "kConcate"
        self.axis = axis
        self.comm = comm
        self.sizes: list[int] = []

    def setup(self) -> None:
        super().setup()
        self.int_output = self.srcs[0].int_output
        if self.axis == 1:
            shape = self.srcs[0].out_shape
            self.out_shape = (shape[0] * self.comm.size, *shape[1:])
        self.gives_labels = getattr(self.srcs[0], "gives_labels", False)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        torch = require_torch()
        src = self.srcs[0]
        parts = self.comm.all_gather(src.data, f"layer '{src.name}' (forward)")
        self.sizes = [int(p.shape[self.axis]) for p in parts]
        self.data = torch.cat([p.to(src.data.device) for p in parts], self.axis)
        labels = getattr(src, "labels", None)
        if labels is not None and self.axis == 0:
            got = self.comm.all_gather(labels, f"the labels of '{src.name}'")
            self.labels = torch.cat([y.to(labels.device) for y in got])

    def backward(self) -> None:
        torch = require_torch()
        g = self.grad if self.grad is not None else torch.zeros_like(self.data)
        grads = self.comm.all_gather(g.clone(), f"the gradient of '{self.name}'")
        total = grads[0].to(g.device)
        for other in grads[1:]:
            total = total + other.to(g.device)
        k = self.comm.index
        start = sum(self.sizes[:k])
        self.give_grad(0, total.narrow(self.axis, start, self.sizes[k]).contiguous())


class Narrow(Layer):
    """This worker's part of its source along ``axis``: its rows of the batch (axis 0, the
    shares of ``numpy.array_split``) or its part of the features (axis 1): SINGA's slice
    layer."""

    def __init__(self, src: Layer, axis: int, comm: Comm, **kwargs: Any):
        what = "batch" if axis == 0 else "features"
        super().__init__(_conf(f"slice({src.name})@{what}", src.name), [src], **kwargs)
        self.type = "kSlice"
        self.axis = axis
        self.comm = comm

    def setup(self) -> None:
        super().setup()
        self.int_output = self.srcs[0].int_output
        if self.axis == 1:
            shape = self.srcs[0].out_shape
            if not shape or shape[0] % self.comm.size:
                raise ParamError(f"layer '{self.srcs[0].name}': its {shape[0] if shape else 0}"
                                 f" features do not split among the {self.comm.size} "
                                 "workers of the group (partition_dim 1)")
            self.out_shape = (shape[0] // self.comm.size, *shape[1:])

    def span(self, n: int) -> tuple[int, int]:
        sizes = [len(a) for a in np.array_split(np.arange(n), self.comm.size)]
        k = self.comm.index
        return sum(sizes[:k]), sizes[k]

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        start, size = self.span(int(x.shape[self.axis]))
        self.data = x.narrow(self.axis, start, size)
        labels = getattr(self.srcs[0], "labels", None)
        if labels is not None and self.axis == 0:
            self.labels = labels.narrow(0, start, size)

    def backward(self) -> None:
        torch = require_torch()
        src = self.srcs[0]
        full = torch.zeros_like(src.data)
        start, size = self.span(int(src.data.shape[self.axis]))
        full.narrow(self.axis, start, size).copy_(self.grad)
        self.give_grad(0, full)


def effective_dim(conf: LayerConf, net_dim: int) -> int:
    """A layer's partition dimension: its own, else the net's (-1 and input and loss layers:
    the batch)."""
    dim = conf.partition_dim if conf.partition_dim >= 0 else net_dim
    return 1 if dim == 1 else 0


def check_feature_partition(conf: LayerConf, cls: type, size: int) -> None:
    """Refuse partitioning ``conf``'s layer on the features where it cannot be."""
    name = conf.component
    if name in SPLIT_PARAMS:
        own = conf.own
        key = "num_output" if name == "kInnerProduct" else "num_filters"
        n = int(getattr(own, key))
        if n % size:
            raise ParamError(f"layer '{conf.name}' ({name}): {key} {n} does not split "
                             f"among the {size} workers of the group (partition_dim 1)")
        return
    if name not in PER_FEATURE:
        raise ParamError(f"layer '{conf.name}' ({name}) cannot be partitioned on the "
                         "features (partition_dim 1); those that can: "
                         + ", ".join(sorted(SPLIT_PARAMS | PER_FEATURE)))


def part_conf(conf: LayerConf, size: int) -> LayerConf:
    """The configuration of one worker's part of a layer whose Params are split."""
    part = conf.copy()
    own = conf.own.copy()
    field = "num_output" if conf.component == "kInnerProduct" else "num_filters"
    own.__dict__[field] = int(getattr(own, field)) // size
    key = part.registry.conf_name(conf.component)
    assert key is not None
    part.__dict__[key] = own
    return part


def param_parts(layer: Layer, full: Sequence[Any], index: int, size: int) -> list[Any]:
    """Worker ``index``'s part of each of a split layer's Params (tensors that view the
    whole Params' values and gradients): rows of the weight (columns of a transposed
    inner product's) and of the bias."""
    torch = require_torch()
    out = []
    for i, t in enumerate(full):
        axis = 1 if (i == 0 and getattr(layer.own, "transpose", False)) else 0
        n = int(t.shape[axis]) // size
        view = torch.nn.Parameter(t.data.narrow(axis, index * n, n))
        view.grad = t.grad.narrow(axis, index * n, n)
        out.append(view)
    return out


__all__ = ["PER_FEATURE", "SPLIT_PARAMS", "Comm", "Gather", "GroupExchange", "Narrow",
           "check_feature_partition", "effective_dim", "group_exchange", "param_parts",
           "part_conf"]
