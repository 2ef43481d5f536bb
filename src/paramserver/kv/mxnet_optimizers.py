"""MXNet 1.9.1's optimizers as paramserver declarations (SPEC §10; docs/kv.md).

``set_optimizer`` of a key-value store takes, besides paramserver's own declarations, an
MXNet optimizer: one of this module's (``optimizer.Adam(learning_rate=0.01, wd=1e-4,
rescale_grad=1/32, clip_gradient=5)``, ``optimizer.create("adam", ...)``: MXNet's names and
arguments) or MXNet's own object (``mx.optimizer.Adam(...)``, read attribute by attribute:
nothing is pickled). Each becomes the ``updater { }`` declaration of the paramserver updater
that computes what MXNet 1.9.1 computes (``form: mxnet``), which every server reads:

============  =============================================================================
MXNet         paramserver
============  =============================================================================
SGD           kSGD (momentum; lazy_update)
NAG           kNesterov
Adam          kAdam (epsilon added to sqrt(v) before the bias correction; lazy_update)
AdaGrad       kAdaGrad (eps under the square root; weight decay decoupled)
RMSProp       kRMSProp (gamma1 as rho; centered: gamma2 as momentum, MXNet's buffer)
AdaDelta      kAdaDelta (no learning rate: 1; weight decay decoupled)
Ftrl          kFtrl
Signum        kSignum (wd_lh)
LAMB          kLAMB (lower_bound, upper_bound, bias_correction)
============  =============================================================================

``rescale_grad``, ``clip_gradient`` and ``wd`` go to the updater's ``rescale_grad``,
``clip_low``/``clip_high`` (clipped where MXNet clips) and ``weight_decay``. What MXNet's
store does with a row-sparse gradient is kept: SGD and Adam update lazily as ``lazy_update``
says, AdaGrad and Ftrl always lazily, the others every row (MXNet has no sparse kernel for
them and updates densely). Arguments paramserver cannot honour (``lr_scheduler`` objects,
per-parameter ``lr_mult``/``wd_mult``, ``begin_num_update``, RMSProp's ``clip_weights``)
are refused with the reason, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..config import ParamError

#: Per MXNet optimizer (lower-case, as MXNet registers them): the paramserver method, its
#: default learning rate (None: not used) and its own arguments with MXNet's defaults.
SPECS: dict[str, tuple[str, float | None, dict[str, Any]]] = {
    "sgd": ("kSGD", 0.01, {"momentum": 0.0, "lazy_update": True}),
    "nag": ("kNesterov", 0.01, {"momentum": 0.0}),
    "adam": ("kAdam", 0.001, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                              "lazy_update": True}),
    "adagrad": ("kAdaGrad", 0.01, {"eps": 1e-7}),
    "rmsprop": ("kRMSProp", 0.001, {"gamma1": 0.9, "gamma2": 0.9, "epsilon": 1e-8,
                                    "centered": False, "clip_weights": None}),
    "adadelta": ("kAdaDelta", None, {"rho": 0.9, "epsilon": 1e-5}),
    "ftrl": ("kFtrl", 0.1, {"lamda1": 0.01, "beta": 1.0}),
    "signum": ("kSignum", 0.01, {"momentum": 0.9, "wd_lh": 0.0}),
    "lamb": ("kLAMB", 0.001, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-6,
                              "lower_bound": None, "upper_bound": None,
                              "bias_correction": True}),
}

#: MXNet's arguments of every optimizer (``mx.optimizer.Optimizer``'s), with its defaults.
COMMON: dict[str, Any] = {"learning_rate": None, "rescale_grad": 1.0, "wd": 0.0,
                          "clip_gradient": None, "lr_scheduler": None,
                          "param_idx2name": None, "sym": None, "begin_num_update": 0,
                          "multi_precision": False, "param_dict": None}

#: Where MXNet's object keeps an argument under another attribute name.
_ATTRIBUTES = {"learning_rate": "lr", "eps": "float_stable_eps"}


class Optimizer:
    """An MXNet optimizer by MXNet's name and arguments; :meth:`declaration` is the
    paramserver updater that computes the same. Made by :func:`create` or the classes
    below (``SGD(momentum=0.9)``); checked when made."""

    name = ""

    def __init__(self, **kwargs: Any):
        self.kwargs = dict(kwargs)
        self._declaration = declaration(self.name, **kwargs)

    def declaration(self) -> dict[str, Any]:
        """The ``updater { }`` declaration, as a dict (a copy)."""
        return _copy(self._declaration)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{type(self).__name__}({args})"


def _optimizer(mx_name: str, cls_name: str) -> type[Optimizer]:
    doc = (f"MXNet's ``mx.optimizer.{cls_name}``: paramserver's {SPECS[mx_name][0]} "
           f"(``form: mxnet``); arguments as MXNet's: {', '.join(SPECS[mx_name][2])} and "
           "the common ones (learning_rate, rescale_grad, wd, clip_gradient).")
    return type(cls_name, (Optimizer,), {"name": mx_name, "__doc__": doc,
                                         "__module__": __name__})


SGD = _optimizer("sgd", "SGD")
NAG = _optimizer("nag", "NAG")
Adam = _optimizer("adam", "Adam")
AdaGrad = _optimizer("adagrad", "AdaGrad")
RMSProp = _optimizer("rmsprop", "RMSProp")
AdaDelta = _optimizer("adadelta", "AdaDelta")
Ftrl = _optimizer("ftrl", "Ftrl")
Signum = _optimizer("signum", "Signum")
LAMB = _optimizer("lamb", "LAMB")
_CLASSES = {c.name: c for c in (SGD, NAG, Adam, AdaGrad, RMSProp, AdaDelta, Ftrl, Signum,
                                LAMB)}


def create(name: str, **kwargs: Any) -> Optimizer:
    """MXNet's ``mx.optimizer.create(name, **kwargs)``: an optimizer by its registered name
    (any case: ``"adam"``, ``"Adam"``)."""
    key = str(name).lower()
    if key not in _CLASSES:
        raise ParamError(f"Cannot find optimizer {name!r}: paramserver has MXNet's "
                         f"{', '.join(sorted(_CLASSES))}")
    return _CLASSES[key](**kwargs)


def declaration(name: str, **kwargs: Any) -> dict[str, Any]:
    """The paramserver updater declaration (a dict for ``set_updater``) of MXNet 1.9.1's
    optimizer ``name`` with MXNet's arguments; refuses an argument MXNet does not take, or
    one paramserver cannot honour, naming it."""
    key = str(name).lower()
    if key not in SPECS:
        raise ParamError(f"Cannot find optimizer {name!r}: paramserver has MXNet's "
                         f"{', '.join(sorted(SPECS))}")
    method, default_lr, own_defaults = SPECS[key]
    where = f"MXNet optimizer {key!r}"
    unknown = sorted(set(kwargs) - set(COMMON) - set(own_defaults))
    if unknown:
        raise ParamError(f"{where}: unknown argument {', '.join(map(repr, unknown))}; it takes "
                         f"{', '.join(sorted({**COMMON, **own_defaults}))}")
    a = {**COMMON, **own_defaults, **kwargs}
    if a["lr_scheduler"] is not None:
        raise ParamError(f"{where}: lr_scheduler is an MXNet object, not data for the servers: "
                         "set the store's updater with a paramserver learning_rate { } "
                         "(kStep, kFixedStep, ...; docs/updaters.md) instead")
    for arg, empty in (("param_idx2name", None), ("param_dict", None), ("sym", None)):
        if a[arg] not in (empty, {}, ()):
            raise ParamError(f"{where}: {arg} gives per-parameter lr_mult/wd_mult, which a "
                             "key-value store's updater does not take (one method for every "
                             "key)")
    if a["begin_num_update"] != 0:
        raise ParamError(f"{where}: begin_num_update {a['begin_num_update']!r}: the update "
                         "counts of a store's keys start at 0")
    if key == "rmsprop" and a["clip_weights"]:
        raise ParamError(f"{where}: clip_weights (clipping the values after each step) is "
                         "not built")
    lr = a["learning_rate"]
    lr = default_lr if lr is None else lr
    if default_lr is None:  # AdaDelta: MXNet takes a learning_rate and does not use it
        lr = 1.0
    decl: dict[str, Any] = {
        "type": method, "form": "mxnet",
        "learning_rate": {"type": "kFixed", "base_lr": _number(lr, "learning_rate", where)},
        "weight_decay": _number(a["wd"], "wd", where),
        "rescale_grad": _number(a["rescale_grad"], "rescale_grad", where),
    }
    clip = a["clip_gradient"]
    # MXNet passes clip_gradient only when it is truthy, and its kernels clip only when it
    # is >= 0: None, 0 and negative values do not clip.
    if clip and _number(clip, "clip_gradient", where) > 0:
        decl["clip_low"], decl["clip_high"] = -float(clip), float(clip)
    own: dict[str, Any] = {}
    if key == "sgd":
        decl["momentum"] = _number(a["momentum"], "momentum", where)
        decl["lazy_update"] = bool(a["lazy_update"])
    elif key == "nag":
        decl["momentum"] = _number(a["momentum"], "momentum", where)
        decl["lazy_update"] = False
    elif key == "adam":
        own = {"beta1": a["beta1"], "beta2": a["beta2"]}
        decl["delta"] = _number(a["epsilon"], "epsilon", where)
        decl["lazy_update"] = bool(a["lazy_update"])
    elif key == "adagrad":
        decl["delta"] = _number(a["eps"], "eps", where)
    elif key == "rmsprop":
        own = {"rho": a["gamma1"], "centered": bool(a["centered"])}
        decl["delta"] = _number(a["epsilon"], "epsilon", where)
        decl["momentum"] = _number(a["gamma2"], "gamma2", where) if a["centered"] else 0.0
        decl["lazy_update"] = False
    elif key == "adadelta":
        own = {"rho": a["rho"]}
        decl["delta"] = _number(a["epsilon"], "epsilon", where)
        decl["lazy_update"] = False
    elif key == "ftrl":
        own = {"lamda1": a["lamda1"], "beta": a["beta"]}
    elif key == "signum":
        decl["momentum"] = _number(a["momentum"], "momentum", where)
        own = {"wd_lh": a["wd_lh"]}
        decl["lazy_update"] = False
    elif key == "lamb":
        own = {"beta1": a["beta1"], "beta2": a["beta2"],
               "bias_correction": bool(a["bias_correction"]),
               # MXNet passes a bound only when it is truthy
               "lower_bound": a["lower_bound"] or None, "upper_bound": a["upper_bound"] or None}
        decl["delta"] = _number(a["epsilon"], "epsilon", where)
        decl["lazy_update"] = False
    if own:
        decl[f"{method[1:].lower()}_conf"] = own
    from ..updaters import create_updater

    try:
        create_updater(_copy(decl))  # every value checked now, named as the updater's
    except ParamError as e:
        raise ParamError(f"{where}: {e}") from None
    return decl


def from_mxnet(obj: Any) -> dict[str, Any]:
    """The declaration of MXNet's own optimizer object (``mx.optimizer.Adam(...)``), read
    from its attributes (never pickled)."""
    key = type(obj).__name__.lower()
    if key not in SPECS:
        raise ParamError(f"set_optimizer: MXNet's {type(obj).__name__} has no paramserver "
                         f"updater; these have: {', '.join(sorted(SPECS))}")
    for mults in ("lr_mult", "wd_mult"):
        if getattr(obj, mults, None):
            raise ParamError(f"set_optimizer: the optimizer's {mults} (per-parameter) is not "
                             "taken by a key-value store's updater (one method for every key)")
    kwargs: dict[str, Any] = {}
    for arg in (*COMMON, *SPECS[key][2]):
        attr = _ATTRIBUTES.get(arg, arg)
        if arg in ("param_idx2name", "sym", "param_dict"):
            continue
        if hasattr(obj, attr):
            kwargs[arg] = getattr(obj, attr)
    return declaration(key, **kwargs)


def is_mxnet_optimizer(obj: Any) -> bool:
    """Whether ``obj`` is an MXNet optimizer: this module's, or MXNet's own object."""
    if isinstance(obj, Optimizer):
        return True
    return any(c.__module__.startswith("mxnet.optimizer") and c.__name__ == "Optimizer"
               for c in type(obj).__mro__)


def to_declaration(obj: Any) -> dict[str, Any]:
    """The declaration of an MXNet optimizer (:func:`is_mxnet_optimizer`)."""
    return obj.declaration() if isinstance(obj, Optimizer) else from_mxnet(obj)


def _number(x: Any, arg: str, where: str) -> float:
    try:
        f = float(x)
    except (TypeError, ValueError):
        raise ParamError(f"{where}: {arg} must be a number, not {x!r}") from None
    if not math.isfinite(f):
        raise ParamError(f"{where}: {arg} must be finite, not {x!r}")
    return f


def _copy(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_copy(v) if isinstance(v, Mapping) else v) for k, v in d.items()}


__all__ = [
    "COMMON",
    "LAMB",
    "NAG",
    "SGD",
    "SPECS",
    "AdaDelta",
    "AdaGrad",
    "Adam",
    "Ftrl",
    "Optimizer",
    "RMSProp",
    "Signum",
    "create",
    "declaration",
    "from_mxnet",
    "is_mxnet_optimizer",
    "to_declaration",
]
