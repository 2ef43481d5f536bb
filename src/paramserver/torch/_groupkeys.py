"""Param-group keys: what a group of :class:`paramserver.torch.Optimizer` may set, and the
updater a group's settings make.

Every group has ``lr``, ``lr_scale`` and ``weight_decay`` (handled by the optimizer itself,
per segment) and the *settings* of a :class:`GroupKeys`:

- :class:`SingaKeys` (``Optimizer(params, updater)``): the updater's own fields by SINGA's
  names -- ``momentum`` (only for methods that read it), ``delta``, ``clip_low``,
  ``clip_high`` and the method's block (``rho``, ``beta1``, ``beta2``, ...) -- and, for
  methods with ``beta1`` and ``beta2``, torch's ``betas`` beside them (a
  :class:`LinkedGroup` keeps them equal at every write), which is what torch's schedulers
  cycle (OneCycleLR, CyclicLR);
- the torch-style constructors' keys (:mod:`._torchstyle`): torch's names and defaults,
  translated into an updater in torch.optim's form.

Keys torch or its schedulers write for their own bookkeeping (:data:`PASSIVE`) are passed
over; any other key is refused when the group is added and when it appears later (a write
that would otherwise be ignored), with what to write instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ParamError
from ..config.job import UpdaterConf
from ..updaters import Updater

#: Keys torch.optim and its lr schedulers (OneCycleLR, CyclicLR, SWALR, ...) put into groups
#: for themselves; passed over.
PASSIVE = ("initial_lr", "param_names", "foreach", "fused", "differentiable", "capturable",
           "max_lr", "min_lr", "max_momentum", "base_momentum", "swa_lr")

#: The optimizer's own keys, present in every group.
COMMON = ("params", "lr", "lr_scale", "weight_decay")

#: torch.optim group keys that SINGA's keys lack, and what to write instead.
TORCH_HINTS = {
    "nesterov": "choose the method in the updater: type: kNesterov, or use "
                "paramserver.torch.SGD(nesterov=True)",
    "eps": "use delta (or a torch-style constructor such as paramserver.torch.Adam)",
    "dampening": "SINGA's updaters have no dampening (sgd_conf { dampening } in "
                 "paramserver.torch.SGD)",
    "alpha": "use rho (rmsprop_conf)",
    "maximize": "negate the loss (or use a torch-style constructor)",
    "amsgrad": "use adam_conf { amsgrad: true } (or paramserver.torch.Adam(amsgrad=True))",
    "centered": "use rmsprop_conf { centered: true }",
}


def hashable(value: Any) -> Any:
    """A setting as a key of the updaters' cache (lists, as torch.load may give, as tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    return value


class GroupKeys:
    """The settings of a group besides ``lr``, ``lr_scale`` and ``weight_decay``.

    Subclasses give :meth:`defaults` (every key and its value for groups that do not set
    it), :meth:`conf_for` (the updater configuration of a group's settings) and may declare
    :attr:`derived` keys: another spelling of some base keys, kept equal to them.
    """

    #: What the keys belong to, for messages ("kAdam", "torch.optim.Adam").
    owner: str = ""
    #: Whether the optimizer's state goes by torch.optim's names and layout, and takes
    #: torch.optim's ``state_dict`` (:mod:`._torchstate`): the torch-style constructors.
    torch_state: bool = False
    #: Whether a sparse gradient (``nn.Embedding(sparse=True)``) updates only its rows and
    #: their state (SPEC section 10's lazy rule), or every element, its rows made dense.
    lazy_sparse: bool = True

    def defaults(self) -> dict[str, Any]:
        raise NotImplementedError

    def conf_for(self, values: Mapping[str, Any]) -> UpdaterConf:
        raise NotImplementedError

    @property
    def derived(self) -> dict[str, tuple[str, ...]]:
        """Keys that spell base keys another way: ``{"betas": ("beta1", "beta2")}``."""
        return {}

    @property
    def base_keys(self) -> tuple[str, ...]:
        """The keys that make the updater (derived ones excluded)."""
        return tuple(k for k in self.defaults() if k not in self.derived)

    def allowed(self) -> set[str]:
        return {*COMMON, *self.defaults(), *PASSIVE}

    def sign(self, group: Mapping[str, Any]) -> float:
        """-1 for a group that maximizes (torch's ``maximize``), else 1."""
        return -1.0 if group.get("maximize") else 1.0

    def hint(self, key: str) -> str:
        return TORCH_HINTS.get(key, "")

    def unknown(self, group: Mapping[str, Any], where: str) -> list[str]:
        """A problem for each key of ``group`` that is not a setting here."""
        allowed = self.allowed()
        out = []
        for key in group:
            if key not in allowed:
                hint = self.hint(key)
                out.append(f"{where} key '{key}' is not a setting of {self.owner}"
                           + (f" ({hint})" if hint else "")
                           + f"; valid: {sorted(allowed - set(PASSIVE) - {'params'})}")
        return out

    def make_group(self, given: Mapping[str, Any], defaults: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """A new group: the keys given, the defaults for the others, its derived keys
        agreeing with their base keys (taken from whichever were given)."""
        group = LinkedGroup(self.derived)
        dict.update(group, defaults)
        dict.update(group, given)
        for alias, parts in self.derived.items():
            if alias in given:
                group[alias] = given[alias]
            else:
                group[parts[0]] = group[parts[0]]  # sets the alias from the parts
        return group


class LinkedGroup(dict):  # type: ignore[type-arg]
    """A param group whose derived keys and their base keys stay equal: a write to
    ``betas`` sets ``beta1`` and ``beta2``, a write to either of them sets ``betas``."""

    def __init__(self, derived: Mapping[str, tuple[str, ...]] | None = None, *args: Any,
                 **kwargs: Any):
        self._derived = dict(derived or {})
        super().__init__(*args, **kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        derived = getattr(self, "_derived", {})  # set after the items when copied
        for alias, parts in derived.items():
            if key == alias:
                split = _split(value, alias, parts)
                for p, v in zip(parts, split, strict=True):
                    super().__setitem__(p, v)
                super().__setitem__(alias, split)
                return
        super().__setitem__(key, value)
        for alias, parts in derived.items():
            if key in parts:
                super().__setitem__(alias, tuple(self.get(p) for p in parts))

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v


def _split(value: Any, alias: str, parts: tuple[str, ...]) -> tuple[Any, ...]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        out = ()
    if len(out) != len(parts):
        raise ParamError(f"param group key '{alias}' must be {len(parts)} numbers "
                         f"({', '.join(parts)}), not {value!r}")
    return out


class SingaKeys(GroupKeys):
    """SINGA's names: the updater's fields a group may override (see the module docstring).

    Args:
        conf: the optimizer's updater configuration (the defaults).
        updater: its updater (which fields its rule reads).
    """

    _TOP = ("momentum", "delta", "clip_low", "clip_high")

    def __init__(self, conf: UpdaterConf, updater: Updater):
        self.conf = conf
        self.owner = type(updater).__name__
        self.top = tuple(k for k in self._TOP if k != "momentum" or updater.uses_momentum)
        own = conf.own
        self.own = tuple(k for k in type(own).fields() if k not in self.top) \
            if own is not None else ()
        both = {"beta1", "beta2"} <= set(self.own)
        self._derived: dict[str, tuple[str, ...]] = {"betas": ("beta1", "beta2")} if both else {}

    def defaults(self) -> dict[str, Any]:
        out = {k: getattr(self.conf, k) for k in self.top}
        own = self.conf.own
        out.update({k: getattr(own, k) for k in self.own})
        for alias, parts in self._derived.items():
            out[alias] = tuple(out[p] for p in parts)
        return out

    @property
    def derived(self) -> dict[str, tuple[str, ...]]:
        return self._derived

    def conf_for(self, values: Mapping[str, Any]) -> UpdaterConf:
        conf = self.conf.copy()
        conf.update({k: values[k] for k in self.top}, allow_unknown=False)
        if conf.own is not None:
            conf.own.update({k: values[k] for k in self.own}, allow_unknown=False)
        return conf


__all__ = ["COMMON", "PASSIVE", "GroupKeys", "SingaKeys", "hashable"]
