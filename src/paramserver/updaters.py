"""Updaters (SPEC §5): one shape for every method, one fused kernel call per range.

An :class:`Updater` turns gradients into new values. Its core is :meth:`Updater.apply`: one
update of a range of flat buffers holding many Params ("segments"), which is what a server
calls for its slices. :meth:`Updater.update` (one Param) and :meth:`Updater.update_params`
(a whole :class:`~paramserver.params.ParamSet` in one call) keep the per-element state
themselves, by Param name, so that :meth:`state_dict` round-trips it.

Per update, in this order: clip into ``[clip_low, clip_high]`` (when ``clip_high >
clip_low``), scale by ``grad_scale``, add ``weight_decay × wd_scale × w``, then the method's
rule with ``lr = learning_rate(step) × lr_scale``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from .config import ParamError, Parameter, field
from .config.components import updaters
from .config.job import UpdaterConf, conf_from
from .config.types import format_number
from .params import Param, ParamSet
from .schedules import create_lr_method

T = TypeVar("T", bound=type)
State = dict[str, np.ndarray]

#: Per-segment update counts, kept for methods whose rule depends on them (Adam).
COUNT = "count"


class Updater:
    """Base of every update method; see the module docstring.

    Subclasses set ``state_roles`` (names of per-element state arrays, zero at start),
    ``counted`` (whether per-segment update counts are kept), and either override
    :meth:`_run` with a fused kernel (built-ins) or :meth:`rule` in NumPy (users' methods).
    """

    Config: ClassVar[type[Parameter] | None] = None
    state_roles: ClassVar[tuple[str, ...]] = ()
    counted: ClassVar[bool] = False

    def __init__(self, conf: UpdaterConf):
        self.conf = conf
        self.own: Any = conf.own
        self.lr = create_lr_method(conf.learning_rate)
        self._state: dict[str, State] = {}
        self._flat: dict[int, tuple[ParamSet, State]] = {}

    # -- the batched core -------------------------------------------------------------------

    def init_state(self, size: int, num_segments: int, dtype: Any) -> State:
        """Zeroed state for a range of ``size`` elements in ``num_segments`` segments.

        Refuses a ``delta`` that is 0 in ``dtype`` (1e-300 in float32): every division it
        guards would give Inf or NaN.
        """
        dt = np.dtype(dtype)
        if dt.kind == "f" and not dt.type(self.conf.delta) > 0:
            raise ParamError(
                f"value {format_number(self.conf.delta)} for Parameter delta should be greater "
                f"than 0 in {dt.name}, where it rounds to 0 (the smallest is "
                f"{np.finfo(dt).smallest_subnormal!s})\n"
                f"delta: {UpdaterConf.fields()['delta'].doc}")
        state = {role: np.zeros(size, dtype) for role in self.state_roles}
        if self.counted:
            state[COUNT] = np.zeros(num_segments, np.int64)
        return state

    def apply(self, step: int, values: np.ndarray, grads: np.ndarray, state: State,
              offsets: np.ndarray, lr_scale: np.ndarray | float = 1.0,
              wd_scale: np.ndarray | float = 1.0,
              grad_scale: np.ndarray | float = 1.0) -> int:
        """One update of a range of flat buffers, in place.

        Returns the number of gradient elements that were NaN or Inf, counted in the same
        pass (the update is applied regardless; the caller decides what that means).

        Args:
            step: the training step; the learning rate is ``learning_rate(step)``.
            values: 1-D values, updated in place.
            grads: 1-D gradients of the same length and dtype; only read.
            state: this range's state (from :meth:`init_state`), updated in place.
            offsets: int64 segment boundaries, ``offsets[0] == 0``, ``offsets[-1] == len``.
            lr_scale, wd_scale, grad_scale: per segment (arrays) or for all (numbers).
        """
        n = len(offsets) - 1
        lr = self.lr(step) * _per_segment(lr_scale, n)
        wd = self.conf.weight_decay * _per_segment(wd_scale, n)
        if self.counted:
            state[COUNT] += 1
        return self._run(values, grads, state, np.asarray(offsets, np.int64), lr, wd,
                         _per_segment(grad_scale, n))

    def _run(self, w: np.ndarray, g: np.ndarray, state: State, offsets: np.ndarray,
             lr: np.ndarray, wd: np.ndarray, gscale: np.ndarray) -> int:
        """The update over segments; by default :meth:`rule` on each segment, in NumPy.
        Returns the number of non-finite gradient elements."""
        c = self.conf
        nonfinite = int(g.size - np.count_nonzero(np.isfinite(g)))
        for i in range(len(offsets) - 1):
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            gi = g[lo:hi].astype(w.dtype, copy=True)
            if c.clip_high > c.clip_low:
                np.clip(gi, c.clip_low, c.clip_high, out=gi)
            gi *= w.dtype.type(gscale[i])
            if wd[i] > 0:
                gi += w.dtype.type(wd[i]) * w[lo:hi]
            seg = {k: (v[lo:hi] if k != COUNT else v[i:i + 1]) for k, v in state.items()}
            self.rule(w[lo:hi], gi, seg, float(lr[i]))
        return nonfinite

    def rule(self, w: np.ndarray, g: np.ndarray, state: State, lr: float) -> None:
        """A user method's rule on one segment: update ``w`` and ``state`` in place.

        ``g`` is already clipped, scaled and weight-decayed (a private copy).
        """
        raise NotImplementedError(f"{type(self).__name__} must define rule() or _run()")

    # -- Params -----------------------------------------------------------------------------

    def update(self, step: int, param: Param, grad_scale: float = 1.0) -> int:
        """Update one owner Param from its gradient; its version goes up by one.

        Returns the number of NaN or Inf elements the gradient held (0 when it was finite).
        """
        if param.owner is not None:
            raise ParamError(f"Param '{param.name}' shares the values of "
                             f"'{param.owner.name}': update the owner")
        state = self._state.get(param.name)
        if state is None:
            state = self._state[param.name] = self.init_state(param.size, 1, param.dtype)
        nonfinite = self.apply(step, param.data.reshape(-1), param.grad.reshape(-1), state,
                               np.array([0, param.size], np.int64), param.lr_scale,
                               param.wd_scale, grad_scale)
        param.version += 1
        return nonfinite

    def update_params(self, step: int, params: ParamSet,
                      grad_scale: np.ndarray | float | None = None) -> int:
        """Update every owner of a ParamSet in one call over its flat buffers; returns the
        number of NaN or Inf gradient elements.

        ``grad_scale`` defaults to ``1 / num_shares`` per owner: the mean of the gradients
        of the Params sharing it, once :meth:`ParamSet.sum_shared_grads` has summed them.
        """
        entry = self._flat.get(id(params))
        if entry is None or entry[0] is not params:
            entry = (params, self._bind(params))
            self._flat[id(params)] = entry
        scale = 1.0 / params.num_shares if grad_scale is None else grad_scale
        nonfinite = self.apply(step, params.values, params.owner_grads(), entry[1],
                               params.offsets, params.lr_scales, params.wd_scales, scale)
        for p in params.owners:
            p.version += 1
        return nonfinite

    def _bind(self, params: ParamSet) -> State:
        """Flat state for a ParamSet, with each owner's part registered under its name."""
        flat = self.init_state(params.values.size, len(params.owners), params.dtype)
        for i, p in enumerate(params.owners):
            lo, hi = int(params.offsets[i]), int(params.offsets[i + 1])
            old = self._state.get(p.name)
            view = {k: (v[lo:hi] if k != COUNT else v[i:i + 1]) for k, v in flat.items()}
            if old is not None:  # keep state already built up (or loaded) for this name
                for k in view:
                    view[k][...] = old[k].reshape(view[k].shape)
            self._state[p.name] = view
        return flat

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every state array and counter, as ``{"<param>/<role>": array}`` (copies)."""
        return {f"{name}/{role}": arr.copy()
                for name, state in self._state.items() for role, arr in state.items()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output; checked whole before anything changes."""
        roles = set(self.state_roles) | ({COUNT} if self.counted else set())
        parsed: dict[str, State] = {}
        problems = []
        for key, arr in state.items():
            name, _, role = key.rpartition("/")
            if not name or role not in roles:
                problems.append(f"state key '{key}' is not '<param>/<role>' with a role of "
                                f"{type(self).__name__}: {sorted(roles)}")
                continue
            current = self._state.get(name, {}).get(role)
            if current is not None and current.shape != np.shape(arr):
                problems.append(f"state '{key}' has shape {np.shape(arr)}, "
                                f"expected {current.shape}")
            parsed.setdefault(name, {})[role] = np.array(arr)
        for name, st in parsed.items():
            if set(st) != roles:
                problems.append(f"state of '{name}' has roles {sorted(st)}, "
                                f"expected {sorted(roles)}")
        if problems:
            raise ParamError(problems)
        for name, st in parsed.items():
            held = self._state.get(name)
            if held is not None:
                for role, arr in st.items():
                    held[role][...] = arr
            else:
                self._state[name] = st

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.conf!r})"


def _per_segment(x: np.ndarray | float, n: int) -> np.ndarray:
    arr = np.asarray(x, np.float64)
    return np.full(n, float(arr)) if arr.ndim == 0 else arr


def register_updater(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register an updater class under ``name`` (SPEC §8)."""
    return updaters.register(name, aliases=aliases)  # type: ignore[return-value]


def create_updater(x: UpdaterConf | dict[str, Any] | str) -> Updater:
    """An updater from its configuration, a nested dict, or an ``updater`` block's text."""
    conf = conf_from(UpdaterConf, x, "updater")
    updater: Updater = updaters.get(conf.component)(conf)
    return updater


# -- built-in methods: each one fused kernel ------------------------------------------------

class _Fused(Updater):
    """Built-ins: ``_run`` is one call of the method's kernel in :mod:`paramserver.kernels`."""

    kernel: ClassVar[str]

    def extra(self) -> dict[str, Any]:
        """The method's hyper-parameters, as the kernel takes them."""
        return {}

    def _run(self, w: np.ndarray, g: np.ndarray, state: State, offsets: np.ndarray,
             lr: np.ndarray, wd: np.ndarray, gscale: np.ndarray) -> int:
        from . import kernels

        arrays = [state[r] for r in self.state_roles]
        kw = self.extra()
        if self.counted:
            kw["step"] = state[COUNT].astype(np.float64)
        nonfinite: int = getattr(kernels, self.kernel)(
            w, g, *arrays, offsets, lr, wd, gscale, clip_low=self.conf.clip_low,
            clip_high=self.conf.clip_high, **kw)
        return nonfinite


@register_updater("kSGD", aliases=("sgd",))
class SGD(_Fused):
    """``h = momentum·h − lr·g; w = w + h`` (``w = w − lr·g`` without momentum)."""

    kernel = "sgd"

    @property
    def state_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("history",) if self.conf.momentum > 0 else ()

    def _run(self, w: np.ndarray, g: np.ndarray, state: State, offsets: np.ndarray,
             lr: np.ndarray, wd: np.ndarray, gscale: np.ndarray) -> int:
        from . import kernels

        h = state.get("history", np.empty(0, w.dtype))
        return kernels.sgd(w, g, h, offsets, lr, wd, gscale, momentum=self.conf.momentum,
                           clip_low=self.conf.clip_low, clip_high=self.conf.clip_high)


@register_updater("kNesterov", aliases=("nesterov",))
class Nesterov(_Fused):
    """``h0 = h; h = momentum·h + lr·g; w = w − ((1 + momentum)·h − momentum·h0)``."""

    kernel = "nesterov"
    state_roles = ("history",)

    def extra(self) -> dict[str, Any]:
        return {"momentum": self.conf.momentum}


@register_updater("kAdaGrad", aliases=("adagrad",))
class AdaGrad(_Fused):
    """``h = h + g²; w = w − lr·g / sqrt(h + delta)`` (momentum not used)."""

    kernel = "adagrad"
    state_roles = ("history",)

    def extra(self) -> dict[str, Any]:
        return {"delta": self.conf.delta}


class RMSPropConf(Parameter):
    rho: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the running mean of g².")


@register_updater("kRMSProp", aliases=("rmsprop",))
class RMSProp(_Fused):
    """``h = rho·h + (1 − rho)·g²; w = w − lr·g / sqrt(h + delta)``."""

    Config = RMSPropConf
    kernel = "rmsprop"
    state_roles = ("history",)

    def extra(self) -> dict[str, Any]:
        return {"rho": self.own.rho, "delta": self.conf.delta}


class AdaDeltaConf(Parameter):
    rho: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the running means (SINGA's "
                                                      "default, 0.9).")


@register_updater("kAdaDelta", aliases=("adadelta",))
class AdaDelta(_Fused):
    """``h = rho·h + (1−rho)·g²; t = g·sqrt(u + delta)/sqrt(h + delta);
    u = rho·u + (1−rho)·t²; w = w − lr·t``."""

    Config = AdaDeltaConf
    kernel = "adadelta"
    state_roles = ("history", "update")

    def extra(self) -> dict[str, Any]:
        return {"rho": self.own.rho, "delta": self.conf.delta}


class AdamConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")
    bias_correction: bool = field(True, doc="Correct the moments' bias towards 0, as users "
                                            "expect today; false: SINGA v0.3's kAdam "
                                            "exactly (no correction, delta under the square "
                                            "root: w -= lr*m/sqrt(v + delta)).")

    def check(self) -> list[str]:
        # At 1 the bias correction 1 - beta^t is 0: every value would become Inf or NaN.
        if not self.bias_correction:
            return []
        return [f"value 1 for Parameter {name} should be less than 1 (the bias correction "
                f"divides by 1 - {name}^t)" for name in ("beta1", "beta2")
                if getattr(self, name) == 1.0]


@register_updater("kAdam", aliases=("adam",))
class Adam(_Fused):
    """Adam with bias correction; weight decay added to the gradient (L2)."""

    Config = AdamConf
    kernel = "adam"
    state_roles = ("m", "v")
    counted = True
    decoupled = False

    def extra(self) -> dict[str, Any]:
        return {"beta1": self.own.beta1, "beta2": self.own.beta2, "delta": self.conf.delta,
                "decoupled": self.decoupled, "bias_correction": self.own.bias_correction}


@register_updater("kAdamW", aliases=("adamw",))
class AdamW(Adam):
    """Adam with decoupled weight decay: ``w = w·(1 − lr·wd)`` before the Adam step."""

    conf_name = "adamw_conf"
    decoupled = True


class AdamMaxConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the infinity norm.")
    bias_correction: bool = field(True, doc="Correct the first moment's bias towards 0 "
                                            "(Kingma & Ba); false: SINGA v0.3's kAdamMax "
                                            "exactly (no correction, u = max(beta2*u, |g|) + "
                                            "delta).")

    def check(self) -> list[str]:
        if self.bias_correction and self.beta1 == 1.0:
            return ["value 1 for Parameter beta1 should be less than 1 (the bias correction "
                    "divides by 1 - beta1^t)"]
        return []


@register_updater("kAdamMax", aliases=("adamax",))
class AdamMax(_Fused):
    """AdaMax, Adam with the infinity norm (Kingma & Ba, section 7.1; SINGA v0.3's
    kAdamMax): ``m = beta1·m + (1−beta1)·g; u = max(beta2·u, |g| + delta);
    w = w − lr/(1−beta1^t)·m/u``."""

    Config = AdamMaxConf
    kernel = "adamax"
    state_roles = ("m", "u")
    counted = True

    def extra(self) -> dict[str, Any]:
        return {"beta1": self.own.beta1, "beta2": self.own.beta2, "delta": self.conf.delta,
                "bias_correction": self.own.bias_correction}


__all__ = ["COUNT", "Updater", "create_updater", "register_updater"]
