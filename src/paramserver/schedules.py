"""Learning-rate change methods (SPEC §6): each a pure function of the training step.

A method is a registered class with an optional ``Config`` (its ``*_conf`` block) and
``__call__(step) -> float``. Nothing is remembered between calls, so a server restarted from a
checkpoint computes the same rate at the same step.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from .config import Parameter, field
from .config.components import lr_methods
from .config.job import LRGenConf, conf_from

T = TypeVar("T", bound=type)


class LRMethod:
    """Base of learning-rate methods: ``lr = method(step)``.

    Args:
        conf: the ``learning_rate`` configuration; ``conf.base_lr`` is the base rate and
            ``conf.own`` the method's own ``*_conf`` (an instance of ``Config``).
    """

    Config: ClassVar[type[Parameter] | None] = None

    def __init__(self, conf: LRGenConf):
        self.conf = conf
        self.base_lr = conf.base_lr
        self.own: Any = conf.own

    def __call__(self, step: int) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_lr={self.base_lr:g}, {self.own!r})"


def register_lr_method(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register a learning-rate method class under ``name`` (SPEC §8).

    The class derives from :class:`LRMethod`; its ``Config`` (if any) is read from the
    ``[<name>_conf]`` extension block of ``learning_rate { user_type: "<name>" }``.
    """
    return lr_methods.register(name, aliases=aliases)  # type: ignore[return-value]


def create_lr_method(x: LRGenConf | dict[str, Any] | str) -> LRMethod:
    """A learning-rate method from its configuration, a nested dict, or a block's text.

    >>> create_lr_method({"type": "step", "base_lr": 0.1,
    ...                   "step_conf": {"change_freq": 10, "gamma": 0.5}})(25)
    0.025
    """
    conf = conf_from(LRGenConf, x, "learning_rate")
    cls = lr_methods.get(conf.component)
    method: LRMethod = cls(conf)
    return method


@register_lr_method("kFixed", aliases=("constant",))
class Fixed(LRMethod):
    """``base_lr`` at every step."""

    def __call__(self, step: int) -> float:
        return self.base_lr


class LinearConf(Parameter):
    change_freq: int = field(lower=1, aliases=("freq",), doc="Steps to go from base_lr "
                                                             "to final_lr.")
    final_lr: float = field(lower=0.0, finite=True,
                            doc="Rate reached at change_freq, and kept after.")


@register_lr_method("kLinear")
class Linear(LRMethod):
    """``(1 - r) * base_lr + r * final_lr`` with ``r = step / change_freq``, clamped at 1."""

    Config = LinearConf

    def __call__(self, step: int) -> float:
        r = min(step / self.own.change_freq, 1.0)
        return float((1.0 - r) * self.base_lr + r * self.own.final_lr)


class ExponentialConf(Parameter):
    change_freq: int = field(lower=1, aliases=("freq",), doc="Steps over which the rate halves.")


@register_lr_method("kExponential")
class Exponential(LRMethod):
    """``base_lr / 2 ** (step / change_freq)``."""

    Config = ExponentialConf

    def __call__(self, step: int) -> float:
        # 2 ** -x underflows to 0 on long runs, where base_lr / 2 ** x would overflow
        return float(self.base_lr * 2.0 ** (-step / self.own.change_freq))


class InverseTConf(Parameter):
    final_lr: float = field(lower=0.0, lower_exclusive=True, finite=True,
                            doc="Steps after which the rate has halved.")


@register_lr_method("kInverseT")
class InverseT(LRMethod):
    """``base_lr / (1 + step / final_lr)``."""

    Config = InverseTConf

    def __call__(self, step: int) -> float:
        return float(self.base_lr / (1.0 + step / self.own.final_lr))


class InverseConf(Parameter):
    gamma: float = field(1.0, lower=0.0, lower_exclusive=True, finite=True,
                         doc="Rate of decay.")
    pow: float = field(0.0, lower=0.0, finite=True, doc="Power of the decay.")


@register_lr_method("kInverse")
class Inverse(LRMethod):
    """``base_lr * (1 + gamma * step) ** -pow``."""

    Config = InverseConf

    def __call__(self, step: int) -> float:
        return float(self.base_lr * (1.0 + self.own.gamma * step) ** -self.own.pow)


class StepConf(Parameter):
    change_freq: int = field(lower=1, aliases=("freq",), doc="Steps between changes.")
    # At most 1, as MXNet's FactorScheduler: a factor > 1 grows without bound, and
    # gamma ** (step // change_freq) overflows a float on a long run.
    gamma: float = field(1.0, lower=0.0, lower_exclusive=True, upper=1.0,
                         doc="Factor applied at every change (at most 1).")


@register_lr_method("kStep")
class Step(LRMethod):
    """``base_lr * gamma ** (step // change_freq)``."""

    Config = StepConf

    def __call__(self, step: int) -> float:
        return float(self.base_lr * self.own.gamma ** (step // self.own.change_freq))


class FixedStepConf(Parameter):
    step: list[int] = field(factory=list, lower=0, doc="Steps at which the rate changes, "
                                                       "increasing.")
    step_lr: list[float] = field(factory=list, lower=0.0, finite=True,
                                 doc="The rate from each step on.")

    def check(self) -> list[str]:
        problems = []
        if not self.step:
            problems.append("fixedstep_conf needs at least one step and step_lr")
        if len(self.step) != len(self.step_lr):
            problems.append(f"fixedstep_conf has {len(self.step)} step values but "
                            f"{len(self.step_lr)} step_lr values; they must be as many")
        bad = _not_increasing(self.step)
        if bad:
            problems.append("fixedstep_conf step values must be increasing: " + bad)
        return problems


@register_lr_method("kFixedStep")
class FixedStep(LRMethod):
    """``step_lr[k]`` for the largest k with ``step[k] <= step``; ``step_lr[0]`` before."""

    Config = FixedStepConf

    def __call__(self, step: int) -> float:
        lr = self.own.step_lr[0]
        for s, value in zip(self.own.step, self.own.step_lr):
            if s > step:
                break
            lr = value
        return float(lr)


class CosineConf(Parameter):
    decay_steps: int = field(lower=1, doc="Steps over which the rate falls to final_lr.")
    final_lr: float = field(0.0, lower=0.0, finite=True,
                            doc="Rate at decay_steps, and kept after.")


@register_lr_method("kCosine", aliases=("cosine_decay",))
class Cosine(LRMethod):
    """Cosine decay: ``final + (base - final) * (1 + cos(pi * min(step, T) / T)) / 2``."""

    Config = CosineConf

    def __call__(self, step: int) -> float:
        t = min(step, self.own.decay_steps) / self.own.decay_steps
        return float(self.own.final_lr + (self.base_lr - self.own.final_lr)
                     * 0.5 * (1.0 + math.cos(math.pi * t)))


class FollowingLRGenConf(LRGenConf):
    """A learning-rate method that follows another (``then`` of kWarmup): its ``base_lr``,
    when not given, is the enclosing method's, so that ``base_lr`` is written once."""

    base_lr: float | None = field(  # type: ignore[assignment]
        None, lower=0.0, finite=True,
        doc="Base learning rate (default: the enclosing method's base_lr).")


def _following(conf: LRGenConf, base_lr: float) -> LRMethod:
    """The method of a ``then`` block, its missing ``base_lr`` taken from ``base_lr``."""
    if conf.base_lr is None:
        conf = conf.copy()
        conf.__dict__["base_lr"] = base_lr
    return create_lr_method(conf)


class WarmupConf(Parameter):
    warmup_steps: int = field(lower=1, doc="Steps of the linear warm-up.")
    start_lr: float = field(0.0, lower=0.0, finite=True, doc="Rate at step 0.")
    then: FollowingLRGenConf | None = field(
        None, doc="Method after the warm-up, counted from its end (none: base_lr); its "
                  "base_lr is the warm-up's unless it sets its own.")


@register_lr_method("kWarmup", aliases=("linear_warmup",))
class Warmup(LRMethod):
    """Linear warm-up from ``start_lr`` to the rate that follows, then that method."""

    Config = WarmupConf

    def __init__(self, conf: LRGenConf):
        super().__init__(conf)
        self.then = (_following(self.own.then, self.base_lr) if self.own.then is not None
                     else None)

    def __call__(self, step: int) -> float:
        w = self.own.warmup_steps
        if step >= w:
            return self.then(step - w) if self.then is not None else self.base_lr
        target = self.then(0) if self.then is not None else self.base_lr
        return float(self.own.start_lr + (target - self.own.start_lr) * step / w)


class JoinConf(Parameter):
    schedule: list[FollowingLRGenConf] = field(
        factory=list, doc="The schedules, in order: each runs from its boundary (the first "
                          "from step 0) to the next, counted from its own boundary, its "
                          "base_lr the join's unless it sets its own.")
    boundaries: list[int] = field(
        factory=list, lower=1, doc="The steps at which the next schedule takes over, "
                                   "increasing: one fewer than the schedules.")

    def check(self) -> list[str]:
        problems = []
        if not self.schedule:
            problems.append("join_conf needs at least one schedule")
        elif len(self.boundaries) != len(self.schedule) - 1:
            problems.append(f"join_conf has {len(self.schedule)} schedules and "
                            f"{len(self.boundaries)} boundaries; there must be one boundary "
                            "fewer than schedules (where each next one starts)")
        bad = _not_increasing(self.boundaries)
        if bad:
            problems.append("join_conf boundaries must be increasing: " + bad)
        return problems


@register_lr_method("kJoin", aliases=("join_schedules",))
class Join(LRMethod):
    """Schedules one after another (optax's ``join_schedules``): schedule ``i`` from
    ``boundaries[i - 1]`` on, at ``step - boundaries[i - 1]``."""

    Config = JoinConf

    def __init__(self, conf: LRGenConf):
        super().__init__(conf)
        self.parts = [_following(c, self.base_lr) for c in self.own.schedule]

    def __call__(self, step: int) -> float:
        bounds = self.own.boundaries
        i = bisect.bisect_right(bounds, step)
        return float(self.parts[i](step - (bounds[i - 1] if i else 0)))


def join_schedules(schedules: Sequence[LRGenConf | dict[str, Any] | str],
                   boundaries: Sequence[int], base_lr: float | None = None) -> LRMethod:
    """Schedules joined at ``boundaries`` (``kJoin``), as optax's ``join_schedules``.

    Args:
        schedules: each a ``learning_rate`` configuration (a conf, a dict or a block's text);
            one without ``base_lr`` takes ``base_lr``.
        boundaries: the steps where each next schedule starts, increasing.
        base_lr: the join's base rate (default 0.01, as every method's).

    Returns:
        The method; its ``conf`` is the ``learning_rate`` configuration to give an updater.

    >>> lr = join_schedules([{"type": "linear_warmup", "warmup_steps": 10},
    ...                      {"type": "cosine_decay", "decay_steps": 90}], [10], base_lr=0.1)
    >>> lr(5), lr(10), round(lr(55), 6)
    (0.05, 0.1, 0.05)
    """
    parts = [c.to_dict() if isinstance(c, LRGenConf) else c for c in schedules]
    conf: dict[str, Any] = {"type": "kJoin",
                            "join_conf": {"schedule": parts, "boundaries": list(boundaries)}}
    if base_lr is not None:
        conf["base_lr"] = base_lr
    return create_lr_method(conf)



def _not_increasing(values: Sequence[Any]) -> str:
    """``"a then b"`` for the first few places where ``values`` do not increase, and how
    many more there are ('' where they do)."""
    first: list[str] = []
    count = 0
    for a, b in itertools.pairwise(values):
        if b <= a:
            count += 1
            if len(first) < 5:
                first.append(f"{a} then {b}")
    return ", ".join(first) + (f", ... ({count - 5:,} more)" if count > 5 else "")

__all__ = ["LRMethod", "create_lr_method", "join_schedules", "register_lr_method"]
