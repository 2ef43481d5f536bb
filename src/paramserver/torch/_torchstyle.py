"""torch.optim's constructors on paramserver's updaters: ``SGD``, ``Adam``, ``AdamW``,
``Adagrad``, ``RMSprop``, ``Adadelta``, ``Adamax``, ``NAdam``, ``RAdam``, ``SparseAdam``.

Each takes torch's arguments by torch's names, with torch's defaults, and makes a
:class:`~paramserver.torch.Optimizer` whose updater computes what the torch.optim class
computes, step for step: the methods in torch.optim's form (``form: torch``, the one
documented variant field of the updaters, see :mod:`paramserver.updaters`), a fixed
learning-rate method of rate 1 with each group's ``lr`` as its ``lr_scale`` (so a group's
rate is its ``lr`` exactly, whatever a scheduler writes), and the groups' keys torch's own
(``betas``, ``eps``, ``alpha``, ``nesterov``, ``maximize``, ...), translated per group into
the updater's fields. Per-parameter ``lr_scale``/``wd_scale`` rules, placement (host,
offload, device) and paramserver checkpoints work as for the general optimizer.

Their state goes by torch.optim's names and layout, and ``load_state_dict`` takes the
``state_dict`` of torch.optim's class of the same name (:mod:`._torchstate`). Beyond
torch.optim's arguments each takes paramserver's ``param_conf``, ``seed``, ``placement``,
``overlap`` and ``state_dtype`` (``"bfloat16"`` or ``"int8"``: the state kept smaller, as
the updaters' ``state_dtype``) and ``stochastic_rounding``.

``differentiable=True`` is refused (paramserver's updates are not recorded by autograd); the
implementation flags (``foreach``, ``fused``, ``capturable``) are accepted and change
nothing: every step here is one fused update per run of groups with equal settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch

from ..config import ParamError
from ..config.job import UpdaterConf
from ._groupkeys import GroupKeys
from ._optim import Optimizer, Placement
from ._overlap import OverlapLike
from ._rules import RulesLike

#: Implementation flags of torch.optim's constructors: accepted, with no effect here.
_FLAGS = ("foreach", "fused", "capturable")


class TorchKeys(GroupKeys):
    """A torch.optim class's group keys (its constructor's arguments but ``params``, ``lr``
    and ``weight_decay``) and the updater they make."""

    method: ClassVar[str]
    #: torch's defaults of the keys.
    keys: ClassVar[dict[str, Any]]
    torch_state = True

    def __init__(self, fields: Mapping[str, Any] | None = None, **given: Any):
        self.owner = f"torch.optim.{self.method}"
        self._defaults = {**self.keys, **given}
        #: the optimizer's updater fields that no group key sets (``state_dtype``, ...)
        self.fields = dict(fields or {})
        self.check(self._defaults, "the optimizer")

    def defaults(self) -> dict[str, Any]:
        return dict(self._defaults)

    def hint(self, key: str) -> str:
        return ""

    def check(self, values: Mapping[str, Any], where: str) -> None:
        """Refuse what paramserver's updaters do not do (and torch's own refusals)."""
        if values.get("differentiable"):
            raise ParamError(f"{where}: differentiable=True is not supported: paramserver's "
                             "updates are not recorded by autograd")

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The updater's fields (besides form, learning rate and weight decay)."""
        raise NotImplementedError

    def conf_for(self, values: Mapping[str, Any]) -> UpdaterConf:
        self.check(values, "param group")
        fields = {**self.updater(values), **self.fields, "form": "torch",
                  "learning_rate": {"type": "kFixed", "base_lr": 1.0}}
        try:
            return UpdaterConf.parse(fields)
        except ParamError as e:
            raise e.at(f"{self.owner} param group") from None


def _eps(values: Mapping[str, Any]) -> float:
    return float(values["eps"])


def _betas(values: Mapping[str, Any], where: str) -> tuple[float, float]:
    """A group's ``betas``, checked: two numbers."""
    betas = values["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ParamError(f"{where}: betas must be two numbers, not {betas!r}")
    b1, b2 = (float(b) for b in betas)
    for i, b in enumerate((b1, b2)):
        if not 0.0 <= b < 1.0:
            raise ParamError(f"{where}: Invalid beta parameter at index {i}: {betas[i]} "
                             f"(beta{i + 1} must be in [0, 1))")
    return b1, b2


class BetasKeys(TorchKeys):
    """The keys of torch's optimizers with ``betas`` and ``eps``."""

    def check(self, values: Mapping[str, Any], where: str) -> None:
        super().check(values, where)
        _betas(values, where)

    def moments(self, values: Mapping[str, Any]) -> dict[str, Any]:
        b1, b2 = _betas(values, "param group")
        return {"beta1": b1, "beta2": b2}


class SGDKeys(TorchKeys):
    method = "SGD"
    keys: ClassVar[dict[str, Any]] = {
        "momentum": 0.0, "dampening": 0.0, "nesterov": False, "maximize": False,
        "foreach": None, "differentiable": False, "fused": None}

    def check(self, values: Mapping[str, Any], where: str) -> None:
        super().check(values, where)
        if values["nesterov"] and (values["momentum"] <= 0 or values["dampening"] != 0):
            raise ParamError(f"{where}: Nesterov momentum requires a momentum and zero "
                             "dampening")

    def __init__(self, fields: Mapping[str, Any] | None = None, *, lazy_sparse: bool = False,
                 **given: Any):
        super().__init__(fields, **given)
        self.lazy_sparse = bool(lazy_sparse)

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        if values["nesterov"]:
            return {"type": "kNesterov", "momentum": values["momentum"]}
        return {"type": "kSGD", "momentum": values["momentum"],
                "sgd_conf": {"dampening": values["dampening"]}}


class AdamKeys(BetasKeys):
    method = "Adam"
    keys: ClassVar[dict[str, Any]] = {
        "betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False, "maximize": False,
        "foreach": None, "capturable": False, "differentiable": False, "fused": None,
        "decoupled_weight_decay": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        decoupled = bool(values["decoupled_weight_decay"])
        return {"type": "kAdamW" if decoupled else "kAdam", "delta": _eps(values),
                "adamw_conf" if decoupled else "adam_conf": {
                    **self.moments(values), "amsgrad": bool(values["amsgrad"])}}


class AdamWKeys(AdamKeys):
    method = "AdamW"
    keys: ClassVar[dict[str, Any]] = {**AdamKeys.keys, "decoupled_weight_decay": True}


class AdagradKeys(TorchKeys):
    method = "Adagrad"
    keys: ClassVar[dict[str, Any]] = {
        "lr_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10, "maximize": False,
        "foreach": None, "differentiable": False, "fused": None}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        # torch.optim.Adagrad fills every parameter's sum with its constructor's value when
        # it is made; a group's own initial_accumulator_value is kept in the group, unread
        return {"type": "kAdaGrad", "delta": _eps(values),
                "adagrad_conf": {"lr_decay": values["lr_decay"],
                                 "initial_accumulator_value":
                                     self._defaults["initial_accumulator_value"]}}


class RMSpropKeys(TorchKeys):
    method = "RMSprop"
    keys: ClassVar[dict[str, Any]] = {
        "alpha": 0.99, "eps": 1e-8, "momentum": 0.0, "centered": False, "capturable": False,
        "foreach": None, "maximize": False, "differentiable": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kRMSProp", "delta": _eps(values), "momentum": values["momentum"],
                "rmsprop_conf": {"rho": values["alpha"], "centered": bool(values["centered"])}}


class AdadeltaKeys(TorchKeys):
    method = "Adadelta"
    keys: ClassVar[dict[str, Any]] = {
        "rho": 0.9, "eps": 1e-6, "foreach": None, "capturable": False, "maximize": False,
        "differentiable": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kAdaDelta", "delta": _eps(values),
                "adadelta_conf": {"rho": values["rho"]}}


class AdamaxKeys(BetasKeys):
    method = "Adamax"
    keys: ClassVar[dict[str, Any]] = {
        "betas": (0.9, 0.999), "eps": 1e-8, "foreach": None, "maximize": False,
        "differentiable": False, "capturable": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kAdamMax", "delta": _eps(values), "adammax_conf": self.moments(values)}


class NAdamKeys(BetasKeys):
    method = "NAdam"
    keys: ClassVar[dict[str, Any]] = {
        "betas": (0.9, 0.999), "eps": 1e-8, "momentum_decay": 4e-3,
        "decoupled_weight_decay": False, "foreach": None, "maximize": False,
        "capturable": False, "differentiable": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kNAdam", "delta": _eps(values), "nadam_conf": {
            **self.moments(values), "momentum_decay": values["momentum_decay"],
            "decoupled_weight_decay": bool(values["decoupled_weight_decay"])}}


class RAdamKeys(BetasKeys):
    method = "RAdam"
    keys: ClassVar[dict[str, Any]] = {
        "betas": (0.9, 0.999), "eps": 1e-8, "decoupled_weight_decay": False,
        "foreach": None, "maximize": False, "capturable": False, "differentiable": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kRAdam", "delta": _eps(values), "radam_conf": {
            **self.moments(values),
            "decoupled_weight_decay": bool(values["decoupled_weight_decay"])}}


class SparseAdamKeys(BetasKeys):
    method = "SparseAdam"
    keys: ClassVar[dict[str, Any]] = {"betas": (0.9, 0.999), "eps": 1e-8, "maximize": False}

    def updater(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "kSparseAdam", "delta": _eps(values),
                "sparseadam_conf": self.moments(values)}


def _make(keys: TorchKeys, params: Iterable[Any], lr: float | torch.Tensor,
          weight_decay: float, param_conf: RulesLike, seed: int, placement: Placement,
          overlap: OverlapLike = False) -> dict[str, Any]:
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ParamError(f"Tensor lr must be 1-element, not of shape {tuple(lr.shape)}")
        lr = float(lr.item())
    if not lr >= 0:
        raise ParamError(f"Invalid learning rate: {lr}")
    if not weight_decay >= 0:
        raise ParamError(f"Invalid weight_decay value: {weight_decay}")
    return {"params": params, "param_conf": param_conf, "seed": seed, "placement": placement,
            "overlap": overlap,
            "_keys": keys, "_lr": float(lr), "_weight_decay": float(weight_decay)}


def _fields(state_dtype: str, stochastic_rounding: bool) -> dict[str, Any]:
    """paramserver's optimizer-wide updater fields of a torch-style constructor."""
    return {"state_dtype": state_dtype, "stochastic_rounding": bool(stochastic_rounding)}


class SGD(Optimizer):
    """``torch.optim.SGD``'s arguments and defaults on paramserver (kSGD, or kNesterov with
    ``nesterov=True``, in torch's form: ``buf = momentum·buf + (1 − dampening)·g;
    w −= lr·buf``). See :mod:`paramserver.torch._torchstyle`.

    A sparse gradient (``nn.Embedding(sparse=True)``) is applied as torch.optim.SGD applies
    it: every row goes on through its momentum buffer (and weight decay), the rows not in
    the batch with a zero gradient. ``lazy_sparse=True`` asks for the lazy rule instead
    (SPEC section 10): only the batch's rows and their momentum change, which is cheaper on
    a large table and is not what torch computes."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False,
                 fused: bool | None = None, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False, lazy_sparse: bool = False):
        keys = SGDKeys(_fields(state_dtype, stochastic_rounding), lazy_sparse=lazy_sparse,
                       momentum=momentum,
                       dampening=dampening, nesterov=nesterov, maximize=maximize,
                       foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class Adam(Optimizer):
    """``torch.optim.Adam``'s arguments and defaults on paramserver (kAdam; kAdamW with
    ``decoupled_weight_decay=True``; AMSGrad with ``amsgrad=True``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False,
                 param_conf: RulesLike = None, seed: int = 0, placement: Placement = "auto",
                 overlap: OverlapLike = False,
                 state_dtype: str = "float32", stochastic_rounding: bool = False):
        keys = AdamKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas), eps=eps,
                        amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class AdamW(Optimizer):
    """``torch.optim.AdamW``'s arguments and defaults on paramserver (kAdamW; weight decay
    0.01; AMSGrad with ``amsgrad=True``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False):
        keys = AdamWKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas),
                         eps=eps, amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``'s arguments and defaults on paramserver (kAdaGrad in torch's
    form: ``eps`` after the square root, ``lr_decay``, ``initial_accumulator_value``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-2,
                 lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10,
                 foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 param_conf: RulesLike = None, seed: int = 0, placement: Placement = "auto",
                 overlap: OverlapLike = False,
                 state_dtype: str = "float32", stochastic_rounding: bool = False):
        keys = AdagradKeys(_fields(state_dtype, stochastic_rounding), lr_decay=lr_decay,
                           initial_accumulator_value=initial_accumulator_value, eps=eps,
                           maximize=maximize, foreach=foreach, differentiable=differentiable,
                           fused=fused)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``'s arguments and defaults on paramserver (kRMSProp in torch's
    form: ``rho`` = ``alpha``, ``eps`` after the square root, torch's momentum; the running
    mean of the gradient with ``centered=True``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-2,
                 alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 momentum: float = 0.0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, *, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False):
        keys = RMSpropKeys(_fields(state_dtype, stochastic_rounding), alpha=alpha, eps=eps,
                           momentum=momentum, centered=centered, capturable=capturable,
                           foreach=foreach, maximize=maximize, differentiable=differentiable)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``'s arguments and defaults on paramserver (kAdaDelta; ``lr``
    1.0, ``eps`` 1e-6)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1.0,
                 rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0.0,
                 foreach: bool | None = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False,
                 param_conf: RulesLike = None, seed: int = 0, placement: Placement = "auto",
                 overlap: OverlapLike = False,
                 state_dtype: str = "float32", stochastic_rounding: bool = False):
        keys = AdadeltaKeys(_fields(state_dtype, stochastic_rounding), rho=rho, eps=eps,
                            foreach=foreach, capturable=capturable, maximize=maximize,
                            differentiable=differentiable)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class Adamax(Optimizer):
    """``torch.optim.Adamax``'s arguments and defaults on paramserver (kAdamMax, Kingma &
    Ba's infinity norm: ``u = max(beta2·u, |g| + eps)``; ``lr`` 2e-3)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False):
        keys = AdamaxKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas),
                          eps=eps, foreach=foreach, maximize=maximize,
                          differentiable=differentiable, capturable=capturable)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class NAdam(Optimizer):
    """``torch.optim.NAdam``'s arguments and defaults on paramserver (kNAdam: Adam with
    Nesterov momentum and Dozat's momentum schedule; ``lr`` 2e-3; decoupled weight decay
    with ``decoupled_weight_decay=True``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False):
        keys = NAdamKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas),
                         eps=eps, momentum_decay=momentum_decay,
                         decoupled_weight_decay=decoupled_weight_decay, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class RAdam(Optimizer):
    """``torch.optim.RAdam``'s arguments and defaults on paramserver (kRAdam: Adam with the
    variance of its rate rectified, momentum SGD before; decoupled weight decay with
    ``decoupled_weight_decay=True``)."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 param_conf: RulesLike = None, seed: int = 0, placement: Placement = "auto",
                 overlap: OverlapLike = False,
                 state_dtype: str = "float32", stochastic_rounding: bool = False):
        keys = RAdamKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas),
                         eps=eps, decoupled_weight_decay=decoupled_weight_decay,
                         foreach=foreach, maximize=maximize, capturable=capturable,
                         differentiable=differentiable)
        super().__init__(**_make(keys, params, lr, weight_decay, param_conf, seed, placement,
                                       overlap))


class SparseAdam(Optimizer):
    """``torch.optim.SparseAdam``'s arguments and defaults on paramserver (kSparseAdam):
    lazy Adam for ``nn.Embedding(sparse=True)``: a sparse gradient updates only its rows
    and their moments (the others' do not decay), ``eps`` added before the bias correction,
    as torch's. A dense gradient (which torch.optim.SparseAdam refuses) gets the same rule
    on every element."""

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False, *, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto",
                 overlap: OverlapLike = False, state_dtype: str = "float32",
                 stochastic_rounding: bool = False):
        keys = SparseAdamKeys(_fields(state_dtype, stochastic_rounding), betas=tuple(betas),
                              eps=eps, maximize=maximize)
        super().__init__(**_make(keys, params, lr, 0.0, param_conf, seed, placement,
                                       overlap))


__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
           "RMSprop", "SparseAdam", "TorchKeys"]
