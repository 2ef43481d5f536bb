"""Layers of the net, in NumPy: forward and backward, registered under SINGA's names.

A layer is a registered class (``layers.register("kName", aliases=...)``) with an optional
``Config`` — its ``*_conf`` block (``kInnerProduct`` reads ``innerproduct_conf``). The net
(:class:`~paramserver.train.net.Net`) drives every layer through the same small interface:

1. ``Layer(conf, srcs, dtype=..., seed=..., base_dir=...)`` — ``srcs`` are the layers named
   by ``srclayers``, already set up;
2. :meth:`Layer.setup` — checks the sources and sets :attr:`Layer.out_shape`, the shape of
   one sample's output; a ParamError naming the layer when the sources do not fit;
3. :meth:`Layer.param_shapes` — the shapes of the layer's Params, in the order of its
   ``param { }`` entries; :meth:`Layer.param_confs` — their configurations;
4. :meth:`Layer.bind` — the Params (views into a ParamSet's flat buffers);
5. per batch, :meth:`Layer.forward` reads the sources' ``data`` and sets its own; then
   :meth:`Layer.backward` reads its ``grad`` (d loss / d ``data``), *adds* into each
   source's ``grad`` (when that is not None) and *adds* into its Params' ``grad`` — the
   caller zeroes all of them before the step.

Arrays carry the batch on axis 0: ``data.shape == (batch,) + out_shape``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..config import ParamError, Parameter, field
from ..config.components import layers
from ..config.job import LayerConf, ParamConf
from ..config.singa_enums import PHASE
from ..params import Param
from ..singa.confs import (
    DropoutConf,
    EmbeddingConf,
    InnerProductConf,
    ReLUConf,
    SoftmaxLossConf,
)
from .data import Batch, Dataset, load_dataset

T = TypeVar("T", bound=type)

def phase_name(phase: str) -> str:
    """The short name layers are given their phase by: ``"train"``, ``"test"``, ``"val"``
    (also ``"positive"``, ``"negative"``, ...), for any spelling of SINGA's ``Phase``
    (``kTrain``, ``train``, ``1``)."""
    try:
        canonical = PHASE.lookup(phase) if not str(phase).isdigit() else PHASE.by_number(
            int(phase))
    except ParamError:
        raise ParamError(f"Invalid Input: '{phase}', valid values are: {PHASE.choices()}"
                         ) from None
    return canonical[1:].lower()


def register_layer(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register a layer class under ``name`` (SPEC §8); select it with ``type`` or
    ``user_type`` in a ``layer { }`` block."""
    return layers.register(name, aliases=aliases)  # type: ignore[return-value]


def _shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape))


class Layer:
    """Base of every layer; see the module docstring for the interface.

    Attributes:
        conf: the ``layer { }`` configuration; ``own`` is its ``*_conf`` (or None).
        name: the layer's name; ``type`` its registered type (``"kInnerProduct"``).
        srcs: the source layers, in the order of ``srclayers``.
        dtype: the float dtype of outputs, gradients and Params.
        out_shape: the shape of one sample's output (set by :meth:`setup`).
        int_output: whether ``data`` holds integers (ids) rather than floats.
        data: the output of the last :meth:`forward`, ``(batch,) + out_shape``.
        grad: d loss / d ``data``; None where no gradient is needed (the net decides).
        params: the bound Params, in the order of :meth:`param_shapes`.
    """

    Config: ClassVar[type[Parameter] | None] = None
    #: False for SINGA's layer types that are declared but not computed yet
    #: (:mod:`paramserver.singa.layers`).
    built: ClassVar[bool] = True
    #: How many srclayers the layer reads (``max_srcs`` None: any number).
    min_srcs: ClassVar[int] = 1
    max_srcs: ClassVar[int | None] = 1

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), *, dtype: Any = np.float32,
                 seed: int = 0, base_dir: str | os.PathLike[str] | None = None):
        self.conf = conf
        self.name: str = conf.name
        self.type: str = conf.component
        self.own: Any = conf.own
        self.srcs: list[Layer] = list(srcs)
        self.dtype = np.dtype(dtype)
        self.seed = seed
        self.base_dir = base_dir
        self.out_shape: tuple[int, ...] = ()
        self.int_output = False
        self.data: np.ndarray = np.zeros((0,), self.dtype)
        self.grad: np.ndarray | None = None
        self.params: list[Param] = []

    # -- set-up -----------------------------------------------------------------------------

    def error(self, message: str) -> ParamError:
        """A ParamError naming this layer: ``layer 'fc1' (kInnerProduct): message``."""
        return ParamError(f"layer '{self.name}' ({self.type}): {message}")

    def setup(self) -> None:
        """Check the sources and set :attr:`out_shape`; subclasses call this first."""
        n, lo, hi = len(self.srcs), self.min_srcs, self.max_srcs
        if n < lo or (hi is not None and n > hi):
            want = (f"{lo}" if lo == hi else f"{lo} or more" if hi is None
                    else f"{lo} to {hi}")
            raise self.error(f"has {n} srclayers; {self.type} reads {want}")
        if self.srcs:
            self.out_shape = self.srcs[0].out_shape

    def param_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the layer's Params, in order (after :meth:`setup`)."""
        return []

    def default_param_conf(self, index: int) -> ParamConf:
        """The configuration of Param ``index`` when the layer gives fewer ``param`` entries."""
        return ParamConf()

    def param_confs(self) -> list[ParamConf]:
        """One configuration per Param: the ``param { }`` entries, then defaults.

        Missing entries take :meth:`default_param_conf` (their names are generated later,
        ``<layer>_<index>``); more entries than the layer has Params is an error.
        """
        shapes, given = self.param_shapes(), list(self.conf.param)
        if len(given) > len(shapes):
            raise self.error(f"has {len(shapes)} Param{'s' if len(shapes) != 1 else ''} but "
                             f"{len(given)} param {{ }} entries are given")
        return given + [self.default_param_conf(i) for i in range(len(given), len(shapes))]

    def bind(self, params: Sequence[Param]) -> None:
        """Use ``params`` (one per :meth:`param_shapes`, same shapes) from now on."""
        shapes = self.param_shapes()
        if len(params) != len(shapes):
            raise self.error(f"needs {len(shapes)} Params, {len(params)} given")
        for i, (p, shape) in enumerate(zip(params, shapes, strict=True)):
            if p.shape != shape:
                raise self.error(f"Param {i} ('{p.name}') has shape {_shape(p.shape)}, "
                                 f"expected {_shape(shape)}")
            if p.dtype != self.dtype:
                raise self.error(f"Param '{p.name}' is {p.dtype.name}, the layer computes "
                                 f"in {self.dtype.name}")
        self.params = list(params)

    # -- computation ------------------------------------------------------------------------

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        """Compute :attr:`data` from the sources' ``data``; ``phase`` is "train", "test" or
        "val" (:func:`phase_name`)."""
        raise NotImplementedError

    def backward(self) -> None:
        """Add d loss / d (source data) into the sources' ``grad`` and into the Params'."""

    def metrics(self) -> dict[str, float]:
        """Numbers this layer reports after :meth:`forward` (a loss layer's loss, ...)."""
        return {}

    def _input(self, i: int = 0) -> np.ndarray:
        """Source ``i``'s data in this layer's float dtype."""
        return np.asarray(self.srcs[i].data, dtype=self.dtype)

    @staticmethod
    def _add_grad(src: Layer, g: np.ndarray) -> None:
        if src.grad is not None:
            src.grad += g.reshape(src.grad.shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, out_shape={self.out_shape})"


# -- input ----------------------------------------------------------------------------------

class DataConf(Parameter):
    """The data layer's ``data_conf``."""

    source: str = field("digits", doc="'digits' (scikit-learn's bundled 8x8 digits) or "
                                      "the path of an .npz file.")
    batchsize: int = field(64, lower=1, aliases=("batch_size",),
                           doc="Samples per step, all workers together.")
    test_fraction: float = field(0.2, lower=0.0, upper=1.0,
                                 doc="Share of the samples held out for tests, below 1 (not "
                                     "used when the file holds x_test and y_test).")
    val_fraction: float = field(0.0, lower=0.0, upper=1.0,
                                doc="Share of the samples held out for validation "
                                    "(validate_freq), below 1 with test_fraction (not used "
                                    "when the file holds x_val and y_val).")
    split_seed: int | None = field(None, doc="Seed of the train/test split; None: the job "
                                             "seed.")
    shuffle: bool = field(True, doc="A new order of the training samples every epoch.")
    normalize: bool = field(True, doc="digits: scale pixel values into [0, 1]. Files are "
                                      "read as stored.")
    x_key: str = field("x", doc="Name of the feature array in the .npz file.")
    y_key: str = field("y", doc="Name of the label array in the .npz file.")
    x_test_key: str = field("x_test", doc="Name of an optional test feature array.")
    y_test_key: str = field("y_test", doc="Name of an optional test label array.")
    x_val_key: str = field("x_val", doc="Name of an optional validation feature array.")
    y_val_key: str = field("y_val", doc="Name of an optional validation label array.")

    def check(self) -> list[str]:
        if not self.test_fraction < 1.0:
            return [f"test_fraction must be below 1, got {self.test_fraction:g}"]
        if not self.test_fraction + self.val_fraction < 1.0:
            return [f"test_fraction and val_fraction must leave training samples (sum below "
                    f"1), got {self.test_fraction:g} + {self.val_fraction:g}"]
        return []


@register_layer("kData", aliases=("input",))
class DataLayer(Layer):
    """Feeds batches of a dataset: ``data`` is the features, ``labels`` the class labels.

    It reads no srclayers. The net hands it each batch with :meth:`feed`.
    """

    Config = DataConf
    min_srcs = 0
    max_srcs = 0

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.labels: np.ndarray = np.zeros((0,), np.int64)
        self._dataset: Dataset | None = None
        self._fed = False

    def setup(self) -> None:
        super().setup()
        c = self.own
        try:
            ds = load_dataset(c.source, test_fraction=c.test_fraction,
                              split_seed=self.seed if c.split_seed is None else c.split_seed,
                              normalize=c.normalize, x_key=c.x_key, y_key=c.y_key,
                              x_test_key=c.x_test_key, y_test_key=c.y_test_key,
                              dtype=self.dtype, base_dir=self.base_dir,
                              val_fraction=c.val_fraction, x_val_key=c.x_val_key,
                              y_val_key=c.y_val_key)
        except ParamError as e:
            raise ParamError([f"layer '{self.name}' ({self.type}): {p}"
                              for p in e.problems]) from None
        if ds.num_train < c.batchsize:
            raise self.error(f"batchsize {c.batchsize} is larger than the training split "
                             f"({ds.num_train} samples of {ds.source})")
        self._dataset = ds
        self.out_shape = ds.sample_shape
        self.int_output = ds.integer_input

    @property
    def dataset(self) -> Dataset:
        if self._dataset is None:
            raise self.error("is not set up yet")
        return self._dataset

    @property
    def batchsize(self) -> int:
        return int(self.own.batchsize)

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        """Worker ``rank``'s shard of step ``step``'s batch (see :mod:`.data`)."""
        try:
            return self.dataset.train_batch(step, self.batchsize, seed=self.seed,
                                            shuffle=self.own.shuffle, rank=rank,
                                            num_workers=num_workers)
        except ParamError as e:
            raise ParamError([f"layer '{self.name}' ({self.type}): {p}"
                              for p in e.problems]) from None

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        """The batches the net of ``phase`` (``"test"`` or ``"val"``) evaluates on: that
        split of the dataset, in stored order; at most ``steps`` (0: all)."""
        split = phase_name(phase)
        x, _ = self.dataset.split(split)
        if x.shape[0] == 0:
            what = {"test": "test_fraction is 0 and the file holds no x_test/y_test",
                    "val": "val_fraction is 0 and the file holds no x_val/y_val"}[split]
            raise self.error(f"there is no {'validation' if split == 'val' else 'test'} "
                             f"split ({what})")
        return self.dataset.eval_batches(split, batchsize or self.batchsize, steps)

    def feed(self, batch: Batch) -> None:
        """Make ``batch`` the output of the next :meth:`forward`."""
        x = np.asarray(batch.x)
        if tuple(x.shape[1:]) != self.out_shape:
            raise self.error(f"fed samples of shape {_shape(x.shape[1:])}, the dataset's "
                             f"are {_shape(self.out_shape)}")
        if x.shape[0] != np.shape(batch.y)[0]:
            raise self.error(f"fed {x.shape[0]} samples with {np.shape(batch.y)[0]} labels")
        self.data = x if self.int_output else np.asarray(x, dtype=self.dtype)
        self.labels = np.asarray(batch.y, np.int64)
        self._fed = True

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        if not self._fed:
            raise self.error("has no batch; the net feeds one before forward()")


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

    def setup(self) -> None:
        super().setup()
        self.num_input = int(np.prod(self.srcs[0].out_shape, dtype=np.int64))
        if self.num_input == 0:
            raise self.error(f"srclayer '{self.srcs[0].name}' gives shape "
                             f"{_shape(self.srcs[0].out_shape)}, which has no features")
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

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self._input().reshape(-1, self.num_input)
        w = self.params[0].data
        y = x @ w if self.own.transpose else x @ w.T
        if self.own.bias_term:
            y += self.params[1].data
        self.data = y

    def backward(self) -> None:
        assert self.grad is not None
        g = self.grad
        x = self._input().reshape(-1, self.num_input)
        w = self.params[0]
        if self.own.transpose:
            w.grad += x.T @ g
        else:
            w.grad += g.T @ x
        if self.own.bias_term:
            self.params[1].grad += g.sum(axis=0)
        src = self.srcs[0]
        if src.grad is not None:
            self._add_grad(src, g @ w.data.T if self.own.transpose else g @ w.data)


# -- activations ----------------------------------------------------------------------------

class _Activation(Layer):
    """``y = f(x)`` element by element; the gradient is ``grad × f'(x)``."""

    def f(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def df(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``f'(x)``, given ``x`` and ``y = f(x)``."""
        raise NotImplementedError

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.f(self._input())

    def backward(self) -> None:
        assert self.grad is not None
        src = self.srcs[0]
        if src.grad is not None:
            self._add_grad(src, self.grad * self.df(self._input(), self.data))


@register_layer("kReLU")
class ReLULayer(_Activation):
    """``max(x, 0)``. ``relu_conf { negative_slope }`` is read and has no effect, as in
    SINGA."""

    Config = ReLUConf

    def f(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0)

    def df(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return (x > 0).astype(self.dtype)


@register_layer("kSigmoid", aliases=("logistic",))
class SigmoidLayer(_Activation):
    """``1 / (1 + exp(-x))``."""

    def f(self, x: np.ndarray) -> np.ndarray:
        half = self.dtype.type(0.5)
        return half * (np.tanh(half * x) + 1)  # no overflow for large |x|

    def df(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return y * (1 - y)


@register_layer("kTanh")
class TanhLayer(_Activation):
    """``tanh(x)``."""

    def f(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x)

    def df(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return 1 - y * y


@register_layer("kSTanh", aliases=("scaled_tanh",))
class STanhLayer(_Activation):
    """LeCun's scaled tanh, ``1.7159047 · tanh(2x/3)`` (SINGA's constants)."""

    A = 1.7159047
    B = 2.0 / 3.0

    def f(self, x: np.ndarray) -> np.ndarray:
        return self.dtype.type(self.A) * np.tanh(self.dtype.type(self.B) * x)

    def df(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        t = y / self.dtype.type(self.A)
        return self.dtype.type(self.A * self.B) * (1 - t * t)


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
        self.mask: np.ndarray | None = None

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self._input()
        ratio = float(self.own.dropout_ratio)
        if phase != "train" or ratio == 0.0:
            self.mask = None
            self.data = x
            return
        if rng is None:
            raise self.error("needs a random generator in training")
        keep = rng.random(x.shape) >= ratio
        self.mask = keep.astype(self.dtype) * self.dtype.type(1.0 / (1.0 - ratio))
        self.data = x * self.mask

    def backward(self) -> None:
        assert self.grad is not None
        src = self.srcs[0]
        if src.grad is not None:
            self._add_grad(src, self.grad if self.mask is None else self.grad * self.mask)


# -- loss -----------------------------------------------------------------------------------

class LossLayer(Layer):
    """Base of loss layers: :meth:`metrics` gives ``loss`` (and what else they measure)."""

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.loss = float("nan")


@register_layer("kSoftmaxLoss", aliases=("softmax_cross_entropy",))
class SoftmaxLossLayer(LossLayer):
    """Softmax, then the mean cross-entropy against the labels, and top-k accuracy.

    srclayers: the first gives the scores (logits), one per class; the labels come from the
    second when given (a data layer), else from the one data layer the first depends on.
    ``data`` is the softmax probabilities. ``loss = scale · mean(-log p[label])``;
    ``accuracy`` counts a sample as correct when fewer than ``topk`` classes score strictly
    higher than its label (ties count in its favour).
    """

    Config = SoftmaxLossConf
    max_srcs = 2

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.accuracy = float("nan")

    def setup(self) -> None:
        super().setup()
        logits = self.srcs[0]
        if len(logits.out_shape) != 1:
            raise self.error(f"srclayer '{logits.name}' gives shape "
                             f"{_shape(logits.out_shape)}; {self.type} needs one score per "
                             "class, a 1-D shape (num_classes,)")
        if logits.int_output:
            raise self.error(f"srclayer '{logits.name}' gives integers; {self.type} needs "
                             "float scores")
        self.label_layer = self._find_labels()
        num_classes = logits.out_shape[0]
        labels = self.label_layer.dataset.num_classes
        if labels > num_classes:
            raise self.error(f"the labels of '{self.label_layer.name}' go up to {labels - 1} "
                             f"({labels} classes) but srclayer '{logits.name}' gives "
                             f"{num_classes} scores")
        if self.own.topk > num_classes:
            raise self.error(f"topk {self.own.topk} is more than the {num_classes} classes")
        self.out_shape = (num_classes,)

    def _find_labels(self) -> DataLayer:
        if len(self.srcs) == 2:
            if not isinstance(self.srcs[1], DataLayer):
                raise self.error(f"the second srclayer gives the labels and must be a data "
                                 f"layer; '{self.srcs[1].name}' is {self.srcs[1].type}")
            return self.srcs[1]
        found: dict[str, DataLayer] = {}
        todo, seen = [self.srcs[0]], set()
        while todo:
            layer = todo.pop()
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            if isinstance(layer, DataLayer):
                found[layer.name] = layer
            todo.extend(layer.srcs)
        if len(found) != 1:
            which = (f"{len(found)}: " + ", ".join(f"'{n}'" for n in sorted(found))
                     if found else "none")
            raise self.error(f"cannot tell where the labels come from: srclayer "
                             f"'{self.srcs[0].name}' depends on data layers {which}; name "
                             "the label layer as the second srclayer")
        return next(iter(found.values()))

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        z = self._input()
        y = self.label_layer.labels
        n = z.shape[0]
        if y.shape != (n,):
            raise self.error(f"has {n} score rows but {y.shape[0]} labels")
        if n and (y.min() < 0 or y.max() >= z.shape[1]):
            raise self.error(f"a label is outside [0, {z.shape[1]})")
        rows = np.arange(n)
        shifted = z - z.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        self.data = e / s
        log_p = shifted[rows, y] - np.log(s[:, 0])
        scale = float(self.own.scale)
        self.loss = scale * float(-np.mean(log_p, dtype=np.float64)) if n else float("nan")
        higher = (z > z[rows, y][:, None]).sum(axis=1)
        self.accuracy = float(np.mean(higher < self.own.topk)) if n else float("nan")

    def backward(self) -> None:
        src = self.srcs[0]
        if src.grad is None:
            return
        n = self.data.shape[0]
        g = self.data.copy()
        g[np.arange(n), self.label_layer.labels] -= 1
        g *= self.dtype.type(float(self.own.scale) / max(n, 1))
        self._add_grad(src, g)

    def metrics(self) -> dict[str, float]:
        return {"loss": self.loss, "accuracy": self.accuracy}


# -- embedding ------------------------------------------------------------------------------

@register_layer("kEmbedding", aliases=("lookup_table",))
class EmbeddingLayer(Layer):
    """Looks up one row of a table per integer id: input ids of shape ``s`` give outputs of
    shape ``s + (feature_dim,)``.

    Param: the table, shape ``(vocab_size, feature_dim)``; default init kGaussian (std 1).
    The ids get no gradient.
    """

    Config = EmbeddingConf

    def setup(self) -> None:
        super().setup()
        src = self.srcs[0]
        if not src.int_output:
            raise self.error(f"srclayer '{src.name}' gives floats; {self.type} reads integer "
                             "ids")
        vocab = int(self.own.vocab_size)
        if vocab < 1:
            raise self.error("embedding_conf vocab_size is not set (it must be at least 1)")
        if isinstance(src, DataLayer):
            lo, hi = src.dataset.id_range() or (0, 0)
            if lo < 0 or hi >= vocab:
                raise self.error(f"the ids of '{src.name}' are in [{lo}, {hi}], outside "
                                 f"[0, vocab_size) = [0, {vocab})")
        self.out_shape = (*src.out_shape, int(self.own.feature_dim))

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(int(self.own.vocab_size), int(self.own.feature_dim))]

    def default_param_conf(self, index: int) -> ParamConf:
        return ParamConf.parse({"init": {"type": "kGaussian"}})

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        ids = np.asarray(self.srcs[0].data)
        if ids.size and (ids.min() < 0 or ids.max() >= self.own.vocab_size):
            raise self.error(f"an id is outside [0, {self.own.vocab_size})")
        self.data = self.params[0].data[ids]

    def backward(self) -> None:
        assert self.grad is not None
        ids = np.asarray(self.srcs[0].data).reshape(-1)
        table = self.params[0].grad
        np.add.at(table, ids, self.grad.reshape(-1, table.shape[1]))


__all__ = ["DataConf", "DataLayer", "DropoutConf", "DropoutLayer",
           "EmbeddingConf", "EmbeddingLayer", "InnerProductConf", "InnerProductLayer", "Layer",
           "LossLayer", "ReLULayer", "STanhLayer", "SigmoidLayer", "SoftmaxLossConf",
           "SoftmaxLossLayer", "TanhLayer", "phase_name", "register_layer"]
