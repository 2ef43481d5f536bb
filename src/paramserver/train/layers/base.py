"""The layer interface: set-up without PyTorch, computation with it.

A layer is a registered class (``register_layer("kName", aliases=...)``) with an optional
``Config`` — its ``*_conf`` block (``kInnerProduct`` reads ``innerproduct_conf``). The net
(:class:`~paramserver.train.net.Net`) drives every layer through the same small interface,
SINGA's (``Setup``, ``ComputeFeature``, ``ComputeGradient``):

1. ``Layer(conf, srcs, dtype=..., seed=..., base_dir=...)`` — ``srcs`` are the layers named
   by ``srclayers``, already set up;
2. :meth:`Layer.setup` — checks the sources and sets :attr:`Layer.out_shape`, the shape of
   one sample's output; a ParamError naming the layer when the sources do not fit. Set-up
   needs no PyTorch, so that ``paramserver check`` runs without it;
3. :meth:`Layer.param_shapes` — the shapes of the layer's Params, in the order of its
   ``param { }`` entries; :meth:`Layer.param_confs` — their configurations;
4. :meth:`Layer.bind` — the Params (views into a ParamSet's flat buffers) and the torch
   tensors that view them (:attr:`Layer.weights`: ``.data`` views the values, ``.grad`` the
   gradients), made by :mod:`paramserver.torch`'s binding;
5. per batch, :meth:`Layer.forward` reads the sources' :attr:`~Layer.data` (torch tensors,
   the batch on axis 0) and sets its own; then :meth:`Layer.backward` reads its
   :attr:`~Layer.grad` (d loss / d ``data``), gives each source that wants one its gradient
   (:meth:`Layer.give_grad`: the first is kept as it is, later ones are added, so no
   buffer is zeroed) and *adds* into its weights' ``.grad`` (the net zeroes those first).
   A layer whose ``grad`` is still None when its turn comes got no gradient: its
   backward is skipped. A layer whose backward sets every element of its weights'
   gradients (:attr:`Layer.writes_whole_grads`: fully connected, convolution) is told by
   :attr:`Layer.fresh_grads` when it is their only writer in a step whose gradients start
   at zero: it then *writes* them, and the net does not zero them first (a pass over the
   memory saved; the net zeroes them after a backward pass that skipped the layer).

The computation of most layers is :meth:`Layer.compute`, a differentiable function of the
inputs and the weights, and their gradient is PyTorch's autograd of it
(:meth:`Layer.run` records it during a training step; the default :meth:`Layer.backward`
replays it). A few small, frequent layers (fully connected, activations, softmax loss) write
their backward pass with torch operations instead: for the small tensors of the main job the
autograd graph costs more than the arithmetic (measured: 235 µs against 123 µs per step of
the digits MLP), and the tests check each such backward against autograd and central
differences. Convolution and max pooling call torch's backward kernels directly
(:mod:`.conv`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from ...config import ParamError, Parameter
from ...config.components import layers
from ...config.job import LayerConf, ParamConf
from ...config.singa_enums import PHASE
from ...params import Param

if TYPE_CHECKING:
    import torch

T = TypeVar("T", bound=type)

TORCH_MISSING = ("training computes the layers with PyTorch, which is not installed: "
                 "pip install 'paramserver[torch]'")


def require_torch() -> Any:
    """The torch module; a ParamError that names the extra to install when it is missing."""
    try:
        import torch
    except ImportError:
        raise ParamError(TORCH_MISSING) from None
    return torch


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a NumPy float dtype."""
    torch = require_torch()
    return {np.dtype(np.float32): torch.float32,
            np.dtype(np.float64): torch.float64}[np.dtype(dtype)]


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
    """Register a layer class under ``name`` (SPEC §8).

    A class defined outside paramserver is a *user's* layer: it lives in its own namespace
    (a user may register ``kData`` without clashing with the built-in one) and is selected
    with ``user_type: "name"`` — or with ``type: name`` when no built-in layer has that name.
    """
    return layers.register(name, aliases=aliases)  # type: ignore[no-any-return]


def shape_text(shape: Sequence[int]) -> str:
    return str(tuple(shape))


class Layer:
    """Base of every layer; see the module docstring for the interface.

    Attributes:
        conf: the ``layer { }`` configuration; ``own`` is its ``*_conf`` (or None).
        name: the layer's name; ``type`` its registered type (``"kInnerProduct"``).
        srcs: the source layers, in the order of ``srclayers``.
        dtype: the NumPy float dtype of outputs, gradients and Params.
        out_shape: the shape of one sample's output (set by :meth:`setup`).
        int_output: whether ``data`` holds integers (ids) rather than floats.
        data: the output of the last :meth:`forward`, a tensor ``(batch,) + out_shape``.
        grad: d loss / d ``data``; None where no gradient is needed (the net decides).
        labels: SINGA's "aux data": the labels this layer gives to loss layers (int64,
            ``(batch,)``), or None.
        params: the bound Params, in the order of :meth:`param_shapes`.
        weights: the torch tensors of ``params`` (``.data`` views the values, ``.grad``
            the gradients; on the net's device).
        requires_grad: whether the layer's output depends on a Param (set by the net): only
            then does it get a ``grad`` and a :meth:`backward`.
        training: whether the current :meth:`forward` is followed by :meth:`backward` (set
            by the net): only then is an autograd graph recorded.
        unroll_index: which copy of an unrolled layer this is (kBPTT; 0 otherwise).
        device: the torch device the net computes on (None: the CPU).
    """

    Config: ClassVar[type[Parameter] | None] = None
    #: False for SINGA's layer types that are declared but not computed
    #: (:mod:`paramserver.singa.layers`).
    built: ClassVar[bool] = True
    #: How many srclayers the layer reads (``max_srcs`` None: any number).
    min_srcs: ClassVar[int] = 1
    max_srcs: ClassVar[int | None] = 1
    #: Whether the layer is a sink whose own objective starts back-propagation (a loss).
    is_loss: ClassVar[bool] = False
    #: Whether the layer may read a layer written after it (RBMVis reads RBMHid, kCD).
    reads_later: ClassVar[bool] = False
    #: The Params (by position) the layer reads and trains by rows (an embedding's table):
    #: in a training job they are row-sparse tables (SPEC §10) that workers pull and push
    #: by row id, and the layer's weight is then the :class:`~paramserver.params.TableParam`
    #: itself, not a tensor.
    row_sparse_params: ClassVar[tuple[int, ...]] = ()
    #: Whether :meth:`backward` sets every element of its weights' gradients (so that, told
    #: :attr:`fresh_grads`, it can write them rather than add to zeros).
    writes_whole_grads: ClassVar[bool] = False

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
        self.data: Any = None
        self.grad: Any = None
        self.labels: Any = None
        self.params: list[Param] = []
        self.weights: list[Any] = []
        self.requires_grad = False
        self.training = False
        self.unroll_index = 0
        self.device: Any = None
        #: False when the net is built to be checked (``paramserver check``): input layers
        #: then tell their data's layout without reading its values (set before setup).
        self.read_data = True
        #: Set by the net for one backward pass: this layer is the only writer of its
        #: weights' gradients and they were not zeroed, so :meth:`backward` writes them
        #: (:meth:`put_grad`) instead of adding (only for :attr:`writes_whole_grads`).
        self.fresh_grads = False
        self._graph: tuple[list[Any], Any] | None = None

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

    def link(self, later: Sequence[Layer]) -> None:
        """Called once every layer of the net is set up, with the sources written after this
        layer (only for layers with :attr:`reads_later`)."""

    def float_source(self, i: int = 0) -> Layer:
        """Source ``i``, checked to give floats."""
        src = self.srcs[i]
        if src.int_output:
            raise self.error(f"srclayer '{src.name}' gives integers; {self.type} reads "
                             "floats")
        return src

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

    def bind(self, params: Sequence[Param], weights: Sequence[Any], *,
             whole: bool = True) -> None:
        """Use ``params`` (one per :meth:`param_shapes`, same shapes) and their tensors
        ``weights`` from now on. ``whole=False``: the tensors are parts of the Params (a
        layer partitioned on the features), of the layer's shapes."""
        shapes = self.param_shapes()
        if len(params) != len(shapes) or len(weights) != len(shapes):
            raise self.error(f"needs {len(shapes)} Params, {len(params)} given")
        for i, (p, t, shape) in enumerate(zip(params, weights, shapes, strict=True)):
            if not whole:
                assert tuple(t.shape) == shape, (p.name, t.shape, shape)
                continue
            if p.shape != shape:
                raise self.error(f"Param {i} ('{p.name}') has shape {shape_text(p.shape)}, "
                                 f"expected {shape_text(shape)}")
            if p.dtype != self.dtype:
                raise self.error(f"Param '{p.name}' is {p.dtype.name}, the layer computes "
                                 f"in {self.dtype.name}")
        self.params = list(params)
        self.weights = list(weights)

    # -- computation ------------------------------------------------------------------------

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        """Compute :attr:`data` from the sources' ``data``; ``phase`` is "train", "test" or
        "val" (:func:`phase_name`). The default: :meth:`compute` of :meth:`inputs`, through
        :meth:`run`."""
        self.data = self.run(self.compute, *self.inputs())

    def inputs(self) -> list[Any]:
        """The tensors :meth:`compute` reads, one per source (the sources' ``data``)."""
        return [s.data for s in self.srcs]

    def compute(self, *xs: Any) -> Any:
        """The layer's output as a differentiable function of its inputs and weights."""
        raise NotImplementedError(f"{type(self).__name__} computes in forward()")

    def run(self, fn: Callable[..., Any], *xs: Any) -> Any:
        """``fn(*xs)``; while :attr:`training`, with an autograd graph from the float inputs
        of sources that need a gradient (and from the weights) kept for :meth:`backward`.
        Returns the output, detached."""
        if not self.training:
            return fn(*xs)
        torch = require_torch()
        leaves = []
        for src, x in zip(self.srcs, xs):
            if src.requires_grad and isinstance(x, torch.Tensor) and x.is_floating_point():
                x = x.detach().requires_grad_(True)
            leaves.append(x)
        leaves += list(xs[len(self.srcs):])
        with torch.enable_grad():
            out = fn(*leaves)
        self._graph = (leaves, out)
        return out.detach()

    def backward(self) -> None:
        """Add d loss / d (source data) into the sources' ``grad`` and into the weights'
        ``.grad``: by default autograd of what :meth:`run` recorded."""
        if self._graph is None:
            return
        torch = require_torch()
        leaves, out = self._graph
        self._graph = None
        if out.requires_grad:
            torch.autograd.backward(out, None if self.is_loss else self.grad)
        for i, leaf in enumerate(leaves[:len(self.srcs)]):
            g = getattr(leaf, "grad", None)
            if g is not None:
                self.give_grad(i, g)

    def wants_grad(self, i: int = 0) -> bool:
        """Whether source ``i`` takes a gradient (its output depends on a Param, and it is
        not a loss layer)."""
        src = self.srcs[i]
        return src.requires_grad and not src.is_loss

    def give_grad(self, i: int, g: Any) -> None:
        """Give source ``i`` the gradient ``g`` of its data (a tensor this layer does not
        change afterwards): its first one is kept as it is, later ones are added."""
        src = self.srcs[i]
        if not (src.requires_grad and not src.is_loss):
            return
        if src.grad is None:
            src.grad = g if tuple(g.shape) == tuple(src.data.shape) else g.reshape(
                src.data.shape)
        else:
            src.grad.add_(g.reshape(src.grad.shape))

    def put_grad(self, i: int, g: Any) -> None:
        """Put ``g`` (of weight ``i``'s shape) into weight ``i``'s gradient: written when
        :attr:`fresh_grads`, else added."""
        grad = self.weights[i].grad
        if self.fresh_grads:
            grad.copy_(g.reshape(grad.shape))
        else:
            grad.add_(g.reshape(grad.shape))

    def metrics(self) -> dict[str, float]:
        """Numbers this layer reports after :meth:`forward` (a loss layer's loss, ...)."""
        return {}

    def flat_input(self, i: int = 0) -> Any:
        """Source ``i``'s data with each sample flattened: ``(batch, features)``."""
        x = self.srcs[i].data
        return x.reshape(x.shape[0], -1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, out_shape={self.out_shape})"


class LossLayer(Layer):
    """Base of loss layers: sinks whose objective starts back-propagation; :meth:`metrics`
    gives ``loss`` (and what else they measure)."""

    is_loss = True

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.loss: Any = float("nan")

    def metrics(self) -> dict[str, float]:
        return {"loss": float(self.loss)}


def label_source(layer: Layer, index: int | None) -> Layer:
    """The layer whose ``labels`` a loss or accuracy layer reads: source ``index`` when
    given, else the one layer upstream of its first source that gives labels."""
    if index is not None:
        src = layer.srcs[index]
        if not getattr(src, "gives_labels", False):
            raise layer.error(f"srclayer '{src.name}' ({src.type}) gives no labels; the "
                              "labels come from an input layer (kData, kRecordInput, ...), "
                              "kLabel or kRNNLabel")
        return src
    found: dict[str, Layer] = {}
    todo, seen = [layer.srcs[0]], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if getattr(current, "gives_labels", False):
            found[current.name] = current
        else:
            todo.extend(current.srcs)
    if len(found) != 1:
        which = (f"{len(found)}: " + ", ".join(f"'{n}'" for n in sorted(found))
                 if found else "none")
        raise layer.error(f"cannot tell where the labels come from: srclayer "
                          f"'{layer.srcs[0].name}' depends on layers giving labels {which}; "
                          "name the label layer as the second srclayer")
    return next(iter(found.values()))


def as_tensor(x: Any, dtype: Any = None) -> torch.Tensor:
    """A torch tensor of ``x`` (a NumPy array is viewed, not copied, where it can be)."""
    torch = require_torch()
    if isinstance(x, torch.Tensor):
        return x if dtype is None else x.to(dtype)
    a = np.asarray(x)
    if not a.flags.writeable:  # torch warns on read-only memory; it is never written here
        a = a.copy()
    t = torch.from_numpy(a)
    return t if dtype is None else t.to(dtype)


__all__ = ["TORCH_MISSING", "Layer", "LossLayer", "as_tensor", "label_source", "phase_name",
           "register_layer", "require_torch", "shape_text", "torch_dtype"]
