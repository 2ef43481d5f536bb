"""Loss and output layers: softmax cross-entropy, Euclidean loss, accuracy, arg-sort and the
layers that write their sources' data to files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...config.job import LayerConf
from ...paths import open_output, path_error
from ...singa.confs import ArgSortConf, EuclideanLossConf, SoftmaxLossConf, StoreConf
from .base import Layer, LossLayer, label_source, register_layer, require_torch, shape_text


def _check_labels(layer: Layer, labels: Any, n: int, classes: int) -> None:
    if labels is None or tuple(labels.shape) != (n,):
        got = "none" if labels is None else f"{labels.shape[0]}"
        raise layer.error(f"has {n} score rows but {got} labels")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise layer.error(f"a label is outside [0, {classes})")


def topk_hits(scores: Any, labels: Any, topk: int) -> Any:
    """Per sample, whether fewer than ``topk`` classes score strictly higher than its label
    (ties count in its favour)."""
    mine = scores.gather(1, labels[:, None])
    return (scores > mine).sum(1) < topk


@register_layer("kSoftmaxLoss", aliases=("softmax_cross_entropy",))
class SoftmaxLossLayer(LossLayer):
    """Softmax, then the mean cross-entropy against the labels, and top-k accuracy.

    srclayers: the first gives the scores (logits), one per class; the labels come from the
    second when given (a layer that gives labels), else from the one layer upstream of the
    first that gives labels. ``data`` is the softmax probabilities.
    ``loss = scale · mean(-log p[label])``; ``accuracy`` counts a sample as correct when
    fewer than ``topk`` classes score strictly higher than its label (ties count in its
    favour). The backward pass is written out: ``(p - onehot(label)) · scale / batch``.
    """

    Config = SoftmaxLossConf
    max_srcs = 2

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.hits: Any = None
        self._n = 0
        self._minus: Any = None

    def setup(self) -> None:
        super().setup()
        logits = self.float_source()
        size = int(np.prod(logits.out_shape, dtype=np.int64))
        if len(logits.out_shape) != 1:
            raise self.error(f"srclayer '{logits.name}' gives shape "
                             f"{shape_text(logits.out_shape)}; {self.type} needs one score "
                             "per class, a 1-D shape (num_classes,)")
        self.label_layer = label_source(self, 1 if len(self.srcs) == 2 else None)
        classes = getattr(self.label_layer, "num_classes", lambda: None)()
        if classes is not None and classes > size:
            raise self.error(f"the labels of '{self.label_layer.name}' go up to {classes - 1} "
                             f"({classes} classes) but srclayer '{logits.name}' gives "
                             f"{size} scores")
        self._checked_labels = classes is not None
        if self.own.topk > size:
            raise self.error(f"topk {self.own.topk} is more than the {size} classes")
        self.out_shape = (size,)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        torch = require_torch()
        z = self.srcs[0].data
        y = self.label_layer.labels
        n, classes = z.shape
        if not self._checked_labels or y is None or y.shape[0] != n:
            _check_labels(self, y, n, classes)
        logp = torch.log_softmax(z, 1)
        self.data = logp.exp()
        scale = float(self.own.scale)
        loss = torch.nn.functional.nll_loss(logp, y)  # the mean of -log p[label]
        self.loss = loss if scale == 1.0 else loss.mul_(scale)
        if self.own.topk == 1:  # right when no class scores higher (logp keeps z's order)
            hits = (logp.gather(1, y[:, None]) >= logp.amax(1, keepdim=True)).sum(
                dtype=z.dtype)
        else:
            hits = topk_hits(z, y, int(self.own.topk)).sum(dtype=z.dtype)
        self._n = n
        self.hits = hits

    def backward(self) -> None:
        if not self.wants_grad(0):
            return
        y = self.label_layer.labels
        n = self.data.shape[0]
        k = float(self.own.scale) / max(n, 1)
        if self._minus is None or self._minus.shape[0] != n or \
                self._minus.dtype != self.data.dtype or self._minus.device != y.device:
            self._minus = self.data.new_full((n, 1), -k)
        g = self.data.mul(k) if k != 1.0 else self.data.clone()
        self.give_grad(0, g.scatter_add_(1, y[:, None], self._minus))

    @property
    def accuracy(self) -> float:
        """The share of the batch counted as correct (see the class docstring)."""
        return float(self.hits) / self._n if self._n else float("nan")

    def metrics(self) -> dict[str, float]:
        loss, hits = require_torch().stack([self.loss, self.hits]).tolist()
        return {"loss": loss, "accuracy": hits / self._n if self._n else float("nan")}


@register_layer("kCudnnSoftmaxLoss")
class CudnnSoftmaxLossLayer(SoftmaxLossLayer):
    """SINGA's cuDNN softmax loss: as kSoftmaxLoss, on the GPU when the job's ``gpu`` asks
    for one and torch sees one, else on the CPU."""


@register_layer("kEuclideanLoss")
class EuclideanLossLayer(LossLayer):
    """The squared distance between its two sources, per sample: ``loss = Σ(a − b)² /
    batch``, with ``a`` the first source (a reconstruction) and ``b`` the second (the input).

    As SINGA's, the gradient into ``a`` is ``(a − b) / batch`` (that of half the loss) and
    the second source gets none.
    """

    Config = EuclideanLossConf
    min_srcs = 2
    max_srcs = 2

    def setup(self) -> None:
        super().setup()
        a, b = self.float_source(0), self.float_source(1)
        na = int(np.prod(a.out_shape, dtype=np.int64))
        nb = int(np.prod(b.out_shape, dtype=np.int64))
        if na != nb:
            raise self.error(f"srclayer '{a.name}' gives {na} values per sample but "
                             f"'{b.name}' {nb}")

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        a, b = self.flat_input(0), self.flat_input(1)
        self.data = a
        diff = a - b
        self._diff = diff
        self.loss = (diff * diff).sum() / max(a.shape[0], 1)

    def backward(self) -> None:
        if self.wants_grad(0):
            self.give_grad(0, self._diff / max(self._diff.shape[0], 1))


class _TopKLayer(Layer):
    """Reads scores (one per class) and keeps the ids of the ``topk`` highest."""

    Config = ArgSortConf

    def setup(self) -> None:
        super().setup()
        scores = self.float_source(0)
        self.num_scores = int(np.prod(scores.out_shape, dtype=np.int64))
        if self.own.topk > self.num_scores:
            raise self.error(f"topk {self.own.topk} is more than the {self.num_scores} "
                             "scores")
        self.out_shape = (int(self.own.topk),)
        self.int_output = True

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        torch = require_torch()
        x = self.flat_input(0)
        # Stable, highest first; equal scores keep the lower id first.
        order = torch.sort(x, dim=1, descending=True, stable=True).indices
        self.data = order[:, :int(self.own.topk)]


@register_layer("kArgSort")
class ArgSortLayer(_TopKLayer):
    """The ids of each sample's ``topk`` highest scores, highest first (integers). It gives
    no gradient."""


@register_layer("kAccuracy")
class AccuracyLayer(_TopKLayer):
    """Top-k accuracy of its first source's scores against the labels of its second: a
    sample is correct when its label is among the ``topk`` highest scores. Reports
    ``accuracy`` (a test net's measure, with no loss)."""

    min_srcs = 2
    max_srcs = 2

    def setup(self) -> None:
        super().setup()
        self.label_layer = label_source(self, 1)
        self.accuracy: Any = float("nan")

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        super().forward(phase, rng)
        y = self.label_layer.labels
        _check_labels(self, y, self.data.shape[0], self.num_scores)
        hits = (self.data == y[:, None]).any(1)
        self.accuracy = hits.sum() / max(hits.shape[0], 1)

    def metrics(self) -> dict[str, float]:
        return {"accuracy": float(self.accuracy)}


class OutputLayer(Layer):
    """Writes its source's data (and labels, when the source has them) to a file, in every
    phase it runs in. A run (``paramserver train``) places the file inside its workspace
    (:func:`~paramserver.train.workspace.place_outputs`); built alone, a relative path
    starts at the working folder, as SINGA's did. The file is written through no link, and
    only if it is a regular file or a new one."""

    Config = StoreConf

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.count = 0
        self._opened = False

    def setup(self) -> None:
        super().setup()
        if not self.own.path:
            raise self.error("store_conf path is not given: where to write")

    @property
    def path(self) -> Path:
        return Path(os.fspath(self.own.path))

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        src = self.srcs[0]
        x = src.data.detach().to("cpu").reshape(src.data.shape[0], -1).numpy()
        labels = getattr(src, "labels", None)
        y = None if labels is None else labels.to("cpu").numpy()
        what = f"layer '{self.name}': store_conf path"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_output(self.path, what, append=self._opened)
            with open(fd, "wb") as f:
                self.write(x, y, f)
        except OSError as e:
            raise path_error(e, self.path, what) from None
        self._opened = True
        self.count += x.shape[0]
        self.data = src.data

    def write(self, x: np.ndarray, y: np.ndarray | None, f: BinaryIO) -> None:
        raise NotImplementedError


@register_layer("kCSVOutput")
class CSVOutputLayer(OutputLayer):
    """Appends one line per sample to ``store_conf { path }``: the label (when the source
    has labels), then the values, comma-separated (``separator``). The file is started
    anew when the net is built."""

    def write(self, x: np.ndarray, y: np.ndarray | None, f: BinaryIO) -> None:
        sep = self.own.separator
        lines = []
        for k in range(x.shape[0]):
            values = [repr(float(v)) if x.dtype.kind == "f" else str(int(v)) for v in x[k]]
            lines.append(sep.join(([str(int(y[k]))] if y is not None else []) + values) + "\n")
        f.write("".join(lines).encode("utf-8"))


@register_layer("kRecordOutput")
class RecordOutputLayer(OutputLayer):
    """Appends one SINGA record per sample to the kvfile ``store_conf { path }`` (float
    ``data``, the label when the source has labels); keys are the sample numbers."""

    def write(self, x: np.ndarray, y: np.ndarray | None, f: BinaryIO) -> None:
        from ...singa import stores

        records = [(stores.KEY_FORMAT.format(self.count + k),
                    stores.encode_sample(np.asarray(x[k], np.float32),
                                         None if y is None else int(y[k])))
                   for k in range(x.shape[0])]
        f.write(stores.encode_kvfile(records, str(self.path)))


__all__ = ["AccuracyLayer", "ArgSortLayer", "CSVOutputLayer", "CudnnSoftmaxLossLayer",
           "EuclideanLossLayer", "OutputLayer", "RecordOutputLayer", "SoftmaxLossLayer",
           "topk_hits"]
