"""``paramserver.torch.Optimizer``: a ``torch.optim.Optimizer`` backed by paramserver.

The parameters are bound to paramserver's flat memory, and a step is one update call over
all of them: one fused kernel over every owner, with the per-parameter ``lr_scale``/
``wd_scale`` looked up by segment. The learning rate is the updater's learning-rate method at
the optimizer's step count (SINGA's ``step``, from 0).

Placement (where values, gradients and state live, and where the update runs):

- ``host``: CPU tensors view paramserver's host buffers; numba kernels (:mod:`._bind`);
- ``offload``: tensors anywhere (a GPU), in any float dtype; an fp32 master, the gradients
  and the state in (pinned) host buffers, updated by the numba kernels, with the copies
  overlapped (:mod:`._offload`);
- ``device``: tensors on their device (a GPU) view flat buffers there, updated by torch
  operations fused by torch.compile (:mod:`._device`);
- ``auto`` (the default): ``host`` for CPU tensors, ``device`` for others.

Every placement follows one protocol (the binding's ``attach_grads``, ``owner_grads``,
``update``, ``finish``, ``to_host``/``from_host``), so groups, schedulers, ``clip_norm``,
``state_dict`` and checkpoints are written once, here.

Param groups. Every group has ``lr`` (its current rate), ``lr_scale`` (the group's factor
on the learning-rate method), ``weight_decay`` (absolute), and the settings of its keys
(:mod:`._groupkeys`): the updater's fields by SINGA's names (``momentum`` where the method
reads it, ``delta``, ``clip_low``, ``clip_high``, the method's own such as ``rho``, and
``beta1``/``beta2`` with torch's ``betas`` beside them), or torch's names for the
torch-style constructors (:mod:`._torchstyle`). ``lr`` and ``weight_decay`` are per-segment
numbers, so groups that
differ only in them still update in one kernel call; groups that differ in another setting
get an updater of their own and a call of their own (one per run of consecutive groups with
equal settings). Writing ``group["lr"]`` -- by hand or by a ``torch.optim.lr_scheduler`` --
sets ``lr_scale = lr / learning_rate(step)``: with the default fixed learning-rate method
that is exactly torch's meaning, and with a paramserver method it rescales its curve.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ..config import ParamError
from ..config.job import UpdaterConf
from ..params import ParamSet
from ..state import COUNT, UpdaterState
from ..updaters import Updater, create_updater
from ._bind import TorchParams, binding_of
from ._groupkeys import GroupKeys, SingaKeys, hashable
from ._overlap import OverlapLike, Overlapper, overlap_conf
from ._rules import ParamRule, RulesLike, parse_rules, resolve
from ._torchstate import export_entry, import_entry, torch_key

_CHECKPOINT_KIND = "paramserver.torch.Optimizer"
#: Updaters kept for settings not in use now (a group's settings may go back and forth).
_KEPT_UPDATERS = 16

#: Where the values, gradients and state live and the update runs (see the module docstring).
Placement = Literal["auto", "host", "offload", "device"]
_PLACEMENTS = ("auto", "host", "offload", "device")


@dataclass
class _Run:
    """One :meth:`Updater.apply` call: owners ``a:b``, elements ``lo:hi``, their state."""

    updater: Updater
    a: int
    b: int
    lo: int
    hi: int
    state: UpdaterState


def _master_problems(masters: Any, pset: ParamSet) -> list[str]:
    """What is wrong with a state_dict's saved masters (offloading) for these owners."""
    if not isinstance(masters, Mapping):
        return ["the saved master is not a mapping of parameter names to tensors"]
    problems = []
    for p in pset.owners:
        m = masters.get(p.name)
        if not isinstance(m, torch.Tensor) or not m.is_floating_point() or m.numel() != p.size:
            problems.append(f"the saved master of '{p.name}' is missing or not a floating-point "
                            f"tensor of {p.size} values")
    return problems


def _step_count(x: Any, where: str) -> int:
    """A saved step (or version): an integer >= 0, or a ParamError saying what it is."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < 0:
        raise ParamError(f"{where} is {x!r}: it must be an integer >= 0")
    return int(x)


class Optimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose updates are paramserver's (SINGA's) updaters.

    Args:
        params: what torch optimizers take: an iterable of tensors, of ``(name, tensor)``
            pairs (``model.named_parameters()``, needed for name patterns), or of param
            group dicts (``{"params": ..., "lr": 0.01, "weight_decay": 0}``).
        updater: an ``UpdaterConf``, a nested dict, or the text of an ``updater { }`` block,
            e.g. ``"type: kSGD momentum: 0.9 learning_rate { base_lr: 0.1 }"``.
        param_conf: per-parameter configuration by name pattern (``lr_scale``,
            ``wd_scale``, ``init``, ``share_from``): see :func:`paramserver.torch.bind`.
            Tensors bound before (by ``bind``) keep their configuration.
        seed: seed of paramserver's initialisation, for parameters given an ``init``.
        placement: ``"auto"`` (the default: ``"host"`` for CPU tensors, ``"device"``
            otherwise), ``"host"``, ``"offload"`` (an fp32 master and the state in host
            memory for a model on a GPU, in any float dtype) or ``"device"`` (updates on
            the tensors' device); see the module docstring and ``docs/torch.md``.
        overlap: with ``placement="offload"``, ``True`` or an :class:`Overlap`: each bucket
            of parameters is updated on the host as soon as its gradients have landed during
            backward, with the same arithmetic as ``step()`` (see :mod:`._overlap`: its
            contract on gradient accumulation, what is rolled back). Off by default.

    As torch.optim: :meth:`zero_grad` sets ``.grad`` to None (or zeroes it with
    ``set_to_none=False``), and a parameter whose ``.grad`` is None at :meth:`step` -- it
    got no gradient -- is not touched: values, state, update count. A sparse ``.grad`` is
    applied on its rows (lazily).

    Differences from torch.optim, all deliberate:

    - ``.grad`` is a view of one flat buffer once a step has taken it in (autograd then adds
      into paramserver's memory); a gradient torch allocated is copied in at ``step()``.
    - Parameters with ``requires_grad=False`` are skipped.
    - Parameters tied by ``share_from`` are updated with the *mean* of their gradients
      (SPEC §3); torch's own tying (one tensor used twice) sums them.
    """

    def __init__(self, params: Iterable[Any], updater: UpdaterConf | dict[str, Any] | str
                 = "type: kSGD", *, param_conf: RulesLike = None, seed: int = 0,
                 placement: Placement = "auto", overlap: OverlapLike = False,
                 _keys: GroupKeys | None = None, _lr: float = 0.0,
                 _weight_decay: float = 0.0):
        if placement not in _PLACEMENTS:
            raise ParamError(f"placement must be one of {list(_PLACEMENTS)}, not {placement!r}")
        self.placement = placement
        self._overlap_conf = overlap_conf(overlap, placement)
        #: the early updates of ``overlap`` (None without it)
        self.overlap: Overlapper | None = None
        if _keys is None:  # paramserver's own: an updater configuration, SINGA's keys
            self.updater = create_updater(updater)
            self._keys: GroupKeys = SingaKeys(self.updater.conf, self.updater)
            lr, lr_scale, wd = self.updater.lr(0), 1.0, self.updater.conf.weight_decay
        else:  # a torch-style constructor: its keys, a fixed rate of 1 scaled by each lr
            self._keys = _keys
            self.updater = create_updater(_keys.conf_for(_keys.defaults()))
            lr, lr_scale, wd = _lr, _lr, _weight_decay
        self.conf: UpdaterConf = self.updater.conf
        self.step_count = 0
        self._ready = False
        self._explicit_lr: dict[int, bool] = {}
        self._reported: list[float] = []
        self.params: Any = None
        defaults: dict[str, Any] = {"lr": lr, "lr_scale": lr_scale, "weight_decay": wd,
                                    **self._keys.defaults()}
        super().__init__(params, defaults)
        self._rules = parse_rules(param_conf)
        self._seed = seed
        self._layout(strict=True)
        self._ready = True

    # -- settings ---------------------------------------------------------------------------

    @property
    def setting_keys(self) -> tuple[str, ...]:
        """The settings a param group may set besides ``lr`` and ``weight_decay`` (those
        that make its updater; derived spellings such as ``betas`` excluded)."""
        return self._keys.base_keys

    def _settings(self, group: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(hashable(group[k]) for k in self.setting_keys)

    def _updater_for(self, settings: tuple[Any, ...]) -> Updater:
        """An updater with these settings and weight_decay 1 (the groups give it per segment)."""
        cached = self._updaters.get(settings)
        if cached is not None:
            return cached
        values = dict(zip(self.setting_keys, settings, strict=True))
        try:
            conf = self._keys.conf_for(values)
        except ParamError as e:
            raise e.at("param group") from None
        conf.__dict__["weight_decay"] = 1.0
        updater = create_updater(conf)
        if len(self._updaters) >= _KEPT_UPDATERS:
            # Schedulers that cycle a setting (OneCycleLR's betas) make new settings at
            # every step: the oldest updaters not in use go.
            in_use = {id(u) for u in getattr(self, "_owner_updaters", ())}
            old = [k for k, u in self._updaters.items() if id(u) not in in_use]
            for k in old[:len(self._updaters) - _KEPT_UPDATERS + 1]:
                del self._updaters[k]
        self._updaters[settings] = updater
        return updater

    # -- param groups -----------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (torch's meaning); its keys are checked, and memory is laid out anew."""
        problems = self._keys.unknown(param_group, "param group")
        if "lr" in param_group and "lr_scale" in param_group:
            problems.append("give a param group 'lr' or 'lr_scale', not both")
        if problems:
            raise ParamError(problems)
        explicit_lr = "lr" in param_group
        group = self._add_group(param_group)
        self._explicit_lr[id(group)] = explicit_lr
        if self._ready:
            self._layout(strict=False)

    def _add_group(self, given: dict[str, Any]) -> dict[str, Any]:
        """torch's ``add_param_group`` checks, without its import of torch._dynamo (seconds);
        returns the group as kept (its derived keys linked to their base keys)."""
        group = dict(given)
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise ParamError("optimizer parameters need to be organized in ordered collections, "
                            "not a set")
        params = list(params)
        named = [p for p in params if isinstance(p, tuple)]
        if named and len(named) != len(params):
            raise ParamError("all optimizer params should be with/without names. Some param "
                             "names are missing")
        if named:
            group["param_names"] = [str(n) for n, _ in named]
            params = [t for _, t in named]
        for t in params:
            if not isinstance(t, torch.Tensor):
                raise ParamError("optimizer can only optimize Tensors, but one of the params "
                                f"is {type(t).__name__}")
            if not (t.is_leaf or t.retains_grad):
                raise ParamError("can't optimize a non-leaf Tensor")
        sparse = [[len(self.param_groups), j] for j, t in enumerate(params) if t.is_sparse]
        if sparse:
            raise ParamError(f"Sparse params at indices {sparse}: {type(self).__name__} "
                             "requires dense parameter tensors (sparse gradients of dense "
                             "parameters, nn.Embedding(sparse=True), are taken)")
        group["params"] = params
        group = self._keys.make_group(group, self.defaults)
        if len({id(t) for t in params}) != len(params):
            raise ParamError("a parameter group holds one parameter twice")
        seen = {id(t) for g in self.param_groups for t in g["params"]}
        if any(id(t) in seen for t in params):
            raise ParamError("some parameters appear in more than one parameter group")
        if any(("param_names" in g) != ("param_names" in group) for g in self.param_groups):
            raise ParamError("all optimizer param groups should be with/without names")
        self.param_groups.append(group)
        return group

    def _layout(self, strict: bool) -> None:
        """Bind every group's tensors, in group order, to one flat memory; plan the updates."""
        named: list[tuple[str, torch.Tensor]] = []
        for gi, group in enumerate(self.param_groups):
            names = group.get("param_names")
            for j, t in enumerate(group["params"]):
                old = binding_of(t)
                if names is not None:
                    name = str(names[j])
                elif old is not None:
                    name = old.name_of(t)
                else:
                    name = f"param{len(named)}" if len(self.param_groups) == 1 else \
                        f"group{gi}.param{j}"
                named.append((name, t))
        tensors = [t for _, t in named]
        old_state: dict[int, UpdaterState] = {}
        if self.overlap is not None:
            self.overlap.close()
            self.overlap = None
        if self._ready:
            old_state = self._export_state()
            self._take_lr_writes(len(self._reported))
        cls = self._binding_class(tensors)
        bindings = {id(b): b for t in tensors if (b := binding_of(t)) is not None}
        reuse = next(iter(bindings.values())) if len(bindings) == 1 else None
        old = self.params
        if (reuse is not None and type(reuse) is cls and not self._rules
                and len(reuse.tensors) == len(tensors)
                and all(a is b for a, b in zip(reuse.tensors, tensors, strict=True))
                and reuse.names == [n for n, _ in named]):
            self.params = reuse
        else:
            self.params = self._bind(named, strict, cls, reuse)
        if old is not None and old is not self.params:
            old.close()
        tp = self.params
        pset = tp.pset
        group_of = {id(t): gi for gi, g in enumerate(self.param_groups) for t in g["params"]}
        self._owner_group = np.array([group_of[id(tp[p.name])] for p in pset.owners], np.int64)
        self._owner_tensors = [tp[p.name] for p in pset.owners]
        index = {n: i for i, n in enumerate(tp.names)}
        self._share_group = [[index[p.name]] for p in pset.owners]
        for p in pset.params:
            if p.owner is not None:
                self._share_group[pset.owner_index(p.name)].append(index[p.name])
        self._base_lr_scale = pset.lr_scales
        self._base_wd_scale = pset.wd_scales
        self._grad_scale = 1.0 / pset.num_shares
        self._updaters: dict[tuple[Any, ...], Updater] = {}
        self._state = UpdaterState((), pset.offsets, pset.dtype)
        self._plan_key: tuple[Any, ...] | None = None
        self._reported = [0.0] * len(self.param_groups)
        for gi, group in enumerate(self.param_groups):
            self._set_group_lr(gi, explicit=self._explicit_lr.pop(id(group), False))
        self._plan()
        if old_state:
            self._import_state(old_state)
        if self._overlap_conf is not None:
            self.overlap = Overlapper(self, self.params, self._overlap_conf)

    def _binding_class(self, tensors: list[torch.Tensor]) -> type:
        """The binding of the placement asked for (``auto``: by where the tensors are)."""
        placement = self.placement
        if placement == "auto":
            placement = "host" if all(t.device.type == "cpu" for t in tensors) else "device"
        if placement == "offload":
            from ._offload import OffloadParams

            return OffloadParams
        if placement == "device":
            from ._device import DeviceParams

            return DeviceParams
        return TorchParams

    def _bind(self, named: list[tuple[str, torch.Tensor]], strict: bool, cls: type,
              previous: Any) -> Any:
        names = [n for n, _ in named]
        carried: list[ParamRule] = []
        fresh: set[str] = set()
        for name, t in named:
            old = binding_of(t)
            if old is None:
                fresh.add(name)
                continue
            conf = old.pset[old.name_of(t)].conf
            fields: dict[str, Any] = {"lr_scale": conf.lr_scale, "wd_scale": conf.wd_scale}
            if conf.share_from is not None:
                fields["share_from"] = conf.share_from
            carried.append(ParamRule(glob.escape(name), fields, f"parameter '{name}'"))
        rules = self._rules if strict else [r for r in self._rules
                                           if any(r.matches(n) for n in names)]
        resolved = resolve(names, [*carried, *rules])
        extra: dict[str, Any] = {}
        if cls.__name__ == "OffloadParams" and type(previous) is cls:
            extra["previous"] = previous  # its fp32 masters, not the parameters' copies
        return cls(named, resolved.confs, initialise=resolved.initialised & fresh,
                   seed=self._seed, **extra)

    def _set_group_lr(self, gi: int, *, explicit: bool = False) -> None:
        """Make group ``gi``'s ``lr`` its rate at the current step (or read it, if given)."""
        group = self.param_groups[gi]
        rate = self.updater.lr(self.step_count)
        if explicit:
            group["lr_scale"] = self._scale_for(group["lr"], rate)
        else:
            group["lr"] = rate * float(group["lr_scale"])
        self._reported[gi] = group["lr"]

    @staticmethod
    def _scale_for(lr: float, rate: float) -> float:
        if lr == 0:
            return 0.0
        if rate <= 0:
            raise ParamError(f"cannot set a param group's lr to {lr:g}: the learning-rate "
                             f"method gives 0 at this step; set 'lr_scale' instead")
        return float(lr) / rate

    def _take_lr_writes(self, num_groups: int) -> None:
        """A group whose ``lr`` was written since we set it gets the matching ``lr_scale``."""
        rate = self.updater.lr(self.step_count)
        for gi, group in enumerate(self.param_groups[:num_groups]):
            if group["lr"] != self._reported[gi]:
                group["lr_scale"] = self._scale_for(group["lr"], rate)
                self._reported[gi] = group["lr"]

    def _check_keys(self) -> None:
        """Refuse keys written into a group that no setting reads (they would be ignored)."""
        problems = []
        for gi, group in enumerate(self.param_groups):
            problems += self._keys.unknown(group, f"param group {gi}")
        if problems:
            raise ParamError(problems)

    def _sync_groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-owner lr and wd scales and gradient signs (torch's ``maximize``) from the
        groups, taking in writes to ``lr``."""
        self._check_keys()
        self._take_lr_writes(len(self.param_groups))
        n = len(self.param_groups)
        lr_scale = np.empty(n)
        wd = np.empty(n)
        sign = np.empty(n)
        problems = []
        for gi, group in enumerate(self.param_groups):
            lr_scale[gi] = float(group["lr_scale"])
            wd[gi] = float(group["weight_decay"])
            sign[gi] = self._keys.sign(group)
            if not lr_scale[gi] >= 0 or not wd[gi] >= 0:
                problems.append(f"param group {gi}: lr_scale ({lr_scale[gi]:g}) and "
                                f"weight_decay ({wd[gi]:g}) must be >= 0")
        if problems:
            raise ParamError(problems)
        return (self._base_lr_scale * lr_scale[self._owner_group],
                self._base_wd_scale * wd[self._owner_group], sign[self._owner_group])

    # -- planning the apply calls -----------------------------------------------------------

    def _plan(self) -> None:
        """Runs of consecutive owners with equal settings (an owner without a gradient is
        passed over inside its run's kernel call)."""
        settings = [self._settings(g) for g in self.param_groups]
        key = tuple(settings)
        if key == self._plan_key:
            return
        pset = self.params.pset
        updaters = [self._updater_for(settings[g]) for g in self._owner_group]
        # One state for every group: the roles of every updater in use (zero where a
        # group's method does not use one).
        for u in dict.fromkeys(updaters):
            u.check_dtype(pset.dtype)
            self._state = self._state.with_roles(u.roles)
        self.params.ensure_state(self._state)
        runs: list[_Run] = []
        offsets = pset.offsets
        self._owner_updaters = updaters
        i, n = 0, len(pset.owners)
        while i < n:
            j = i + 1
            while j < n and updaters[j] is updaters[i]:
                j += 1
            runs.append(_Run(updaters[i], i, j, int(offsets[i]), int(offsets[j]),
                             self._state.segments(i, j)))
            i = j
        self._runs = runs
        self._plan_key = key
        # torch.optim's per-parameter state, as views (for inspection; state_dict copies).
        self.state.clear()
        for k in range(n):
            self.state[self._owner_tensors[k]] = self._tensors(k, copy=False)

    def _tensors(self, k: int, copy: bool) -> dict[str, torch.Tensor]:
        """Owner ``k``'s state as tensors: per-element roles shaped like the parameter, the
        update count a number. Copies come from the host state (see :meth:`state_dict`);
        views from where the state lives (a device's buffers for ``placement="device"``)."""
        t = self._owner_tensors[k]
        offsets = self.params.pset.offsets
        lo, hi = int(offsets[k]), int(offsets[k + 1])
        out = {}
        updater = self._owner_updaters[k]
        own_roles = {r.name for r in updater.roles}
        for role, arr in self._state.segment(k).items():
            a = arr.copy() if copy else arr
            # torch-style optimizers show torch.optim's names (their own roles only)
            key = role
            if self._keys.torch_state:
                if role not in own_roles:
                    continue
                key = torch_key(updater, role)
            if role == COUNT:
                out[key] = torch.tensor(int(a[0])) if copy else torch.from_numpy(a)
            elif self._state.role(role).per == "element":
                out[key] = (torch.from_numpy(a) if copy else
                            self.params.state_view(self._state, role, lo, hi)).view(t.shape)
            else:
                out[key] = torch.from_numpy(a)
        return out

    # -- the torch.optim interface ----------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One update of every parameter from its ``.grad``; returns the closure's loss.

        Under ``torch.compile`` (``torch.compile(opt.step)``, or a compiled training step
        that calls it) the step is a graph break: it runs as it does without compiling
        (paramserver's kernels are not torch operations to trace)."""
        if torch.compiler.is_compiling():
            return _step_eagerly(self, closure)
        return self._step(closure)

    def _step(self, closure: Callable[[], Any] | None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        tp = self.params
        tp.check()
        # owners updated during backward (overlap), their inputs unchanged: passed over below
        done = self.overlap.settle() if self.overlap is not None else None
        missing = tp.attach_grads(self._keys.lazy_sparse)
        rows = tp.take_rows() if tp.lazy_rows else {}
        # torch's rule: a parameter whose .grad is None is not touched (nor is a frozen one);
        # an owner is idle when it and every sharer of it are. Sparse gradients are applied
        # on their rows, after the dense call.
        idle = [m or not t.requires_grad for m, t in zip(missing, tp.tensors, strict=True)]
        skip = None
        if any(idle) or rows:
            skip = np.array([all(idle[t] for t in share) for share in self._share_group])
            skip[list(rows)] = True
        if done is not None:
            skip = done if skip is None else skip | done
        lr_scale, wd, sign = self._sync_groups()
        self._plan()
        pset = tp.pset
        grads = tp.owner_grads()
        gscale = self._grad_scale * sign
        try:
            norm = None
            if any(run.updater.conf.clip_norm > 0 for run in self._runs):
                # clip_norm: the norm of every gradient of the optimizer, all runs together
                squares = sum(tp.sum_squares(run.updater, grads, run.a, run.b, run.state,
                                             gscale[run.a:run.b]) for run in self._runs)
                squares += sum(self._owner_updaters[k].grad_sum_squares(
                    r.reshape(-1), [0, r.size], gscale[k]) for k, (_, r) in rows.items())
                norm = math.sqrt(squares)
            for run in self._runs:
                a, b = run.a, run.b
                tp.update(run.updater, self.step_count, grads, a, b, run.state,
                          lr_scale[a:b], wd[a:b], gscale[a:b], norm,
                          None if skip is None else skip[a:b])
            for k, (ids, r) in rows.items():
                updater = self._owner_updaters[k]
                factor = 1.0
                if norm is not None and updater.conf.clip_norm > 0:
                    from ..numerics.norm import clip_factor

                    factor = clip_factor(norm, updater.conf.clip_norm)
                tp.update_rows(updater, self.step_count, k, ids, r,
                               self._state.segments(k, k + 1), lr_scale[k], wd[k],
                               gscale[k] * factor)
        finally:
            tp.restore_grads()
        tp.finish()
        for k, p in enumerate(pset.owners):
            if skip is None or not skip[k] or k in rows or (done is not None and done[k]):
                p.version += 1
        self.step_count += 1
        for gi in range(len(self.param_groups)):
            self._set_group_lr(gi)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch.optim's: every ``.grad`` set to None (the default) or zeroed in place.

        A parameter whose ``.grad`` is still None at :meth:`step` got no gradient and is not
        touched (values, state, update count). ``set_to_none=False`` keeps ``.grad`` as views
        of the flat buffer, into which autograd then adds in place (no copy at ``step()``);
        a parameter that had a gradient and gets none then has a zero one, and is updated
        with it, as torch.optim does; one that never had a gradient keeps None.

        With ``overlap``, updates started during a backward pass that no ``step()`` took
        are rolled back (a skipped step).
        """
        if self.overlap is not None:
            self.overlap.cancel()
        self.params.zero_grad(set_to_none)

    @property
    def lr(self) -> float:
        """The learning-rate method's rate at the current step (before group scales)."""
        return self.updater.lr(self.step_count)

    # -- state ------------------------------------------------------------------------------

    def _indexed(self) -> list[tuple[int, str, torch.Tensor]]:
        """``(torch index, name, tensor)`` in torch's state_dict numbering."""
        tp = self.params
        out = []
        k = 0
        for group in self.param_groups:
            for t in group["params"]:
                out.append((k, tp.name_of(t), t))
                k += 1
        return out

    def _export_state(self) -> dict[int, UpdaterState]:
        """Each owner's state (copies), by tensor id."""
        self.params.to_host(self._state, values=False)
        return {id(t): self._state.segments(k, k + 1).copy()
                for k, t in enumerate(self._owner_tensors)}

    def _import_state(self, state: dict[int, UpdaterState]) -> None:
        """Take back what :meth:`_export_state` gave, for the tensors still here."""
        for k, t in enumerate(self._owner_tensors):
            old = state.get(id(t))
            if old is None:
                continue
            mine = self._state.segments(k, k + 1)
            for role in old.names:
                if role in mine and old[role].size == mine[role].size:
                    mine[role][...] = old[role]
        self.params.from_host(self._state, values=False)

    @property
    def _names(self) -> list[str]:
        return [p.name for p in self.params.pset.owners]

    def state_dict(self) -> dict[str, Any]:
        """torch's layout; copies, loadable with ``weights_only``.

        ``state`` maps each owner's torch index to its updater state: for the torch-style
        optimizers (``pst.Adam``, ...) torch.optim's own (``step``, ``exp_avg``, ...: see
        :mod:`._torchstate`), which torch.optim's class of the same name loads; for an
        optimizer made from an updater configuration, paramserver's roles (``history``,
        ``update``, ``m``, ``v`` as tensors shaped like the parameter, and ``count``, its
        number of updates). ``param_groups`` are the groups with parameter indices;
        ``paramserver`` holds the step count, the updater's configuration and the parameter
        names (torch.optim passes it over).
        """
        # A scheduler's (or the user's) write to group["lr"] since the last step is taken
        # in now, so that the saved lr_scale is the one the next step would use; so are
        # writes to other keys (refused when no setting reads them).
        if self.overlap is not None:
            self.overlap.cancel()  # a step not taken is not saved
        self._check_keys()
        self._take_lr_writes(len(self.param_groups))
        self._plan()
        self.params.to_host(self._state, values=False)
        index = {id(t): k for k, _, t in self._indexed()}
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, t in enumerate(self._owner_tensors):
            if self._keys.torch_state:
                entry = export_entry(self._owner_updaters[k], self._state.segments(k, k + 1),
                                     tuple(t.shape))
                if entry is not None:
                    state[index[id(t)]] = entry
            else:
                state[index[id(t)]] = self._tensors(k, copy=True)
        groups = []
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index[id(t)] for t in group["params"]]
            groups.append(g)
        meta: dict[str, Any] = {"step": self.step_count, "updater": self.conf.to_dict(),
                                "optimizer": self._keys.owner,
                                "names": [n for _, n, _ in self._indexed()]}
        if self.params.lossy:
            # The parameters show the values at a lower precision than the master holds
            # them: the master goes with the state, or a resumed run would not be this run.
            meta["master"] = {p.name: torch.from_numpy(p.data.copy())
                              for p in self.params.pset.owners}
        return {"state": state, "param_groups": groups, "paramserver": meta}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output -- or, for a torch-style optimizer, the
        ``state_dict`` of torch.optim's class of the same name, so that a job moves across
        and continues exactly. Checked whole before anything changes."""
        if self.overlap is not None:
            self.overlap.cancel()
        meta = state_dict.get("paramserver")
        torch_style = self._keys.torch_state
        if "state" not in state_dict or "param_groups" not in state_dict:
            raise ParamError("not an optimizer's state_dict: it has no 'state' and "
                             "'param_groups'")
        if not isinstance(meta, Mapping):
            if not torch_style:
                raise ParamError(
                    "not a state_dict of paramserver.torch.Optimizer (no 'paramserver' "
                    "entry); a torch.optim state loads into paramserver's torch-style "
                    "optimizer of its class (paramserver.torch.Adam, ...), not into one made "
                    "from an updater configuration")
            meta = {}
        indexed = self._indexed()
        problems = []
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"])
                                                      for g in self.param_groups]:
            problems.append(f"the saved param groups have "
                            f"{[len(g['params']) for g in saved_groups]} parameters, these "
                            f"have {[len(g['params']) for g in self.param_groups]}")
            raise ParamError(problems)
        saved_type = (meta.get("updater") or {}).get("type")
        saved_owner = meta.get("optimizer")
        if torch_style and saved_owner is not None and saved_owner != self._keys.owner:
            problems.append(f"the state is of {saved_owner}, this optimizer is "
                            f"{self._keys.owner}")
        elif saved_type is not None and saved_type != self.conf.type and not (
                torch_style and saved_owner == self._keys.owner):
            problems.append(f"the state is of updater {saved_type}, this optimizer's is "
                            f"{self.conf.type}")
        owner_of = {id(t): k for k, t in enumerate(self._owner_tensors)}
        names = self._names
        entries: dict[int, Mapping[str, Any]] = {}
        for idx, entry in state_dict["state"].items():
            idx = int(idx)
            if idx >= len(indexed):
                problems.append(f"state of parameter {idx}: there are only {len(indexed)}")
                continue
            _, name, t = indexed[idx]
            k = owner_of.get(id(t))
            if k is None:
                problems.append(f"state of '{name}': it shares another's values, has none")
                continue
            entries[k] = entry
        # The updaters this optimizer will have once the saved groups' settings are taken.
        settings = [tuple(hashable(saved.get(key, group[key])) for key in self.setting_keys)
                    for group, saved in zip(self.param_groups, saved_groups, strict=True)]
        updaters = [self._updater_for(settings[g]) for g in self._owner_group]
        target = UpdaterState((), self._state.offsets, self._state.dtype)
        for u in dict.fromkeys(updaters):
            target = target.with_roles(u.roles)
        arrays: dict[str, np.ndarray] = {}
        if torch_style:  # torch.optim's names, or ours, into a fresh state
            for k, entry in entries.items():
                problems += import_entry(updaters[k], entry, target.segments(k, k + 1),
                                         f"state of '{names[k]}'")
            counts = [int(target.counts[k]) for k in entries]
            step = max(counts, default=0)
        else:
            for k, entry in entries.items():
                for r, v in entry.items():
                    arr = (v.detach().cpu().numpy() if isinstance(v, torch.Tensor)
                           else np.asarray(v))
                    arrays[f"{names[k]}/{r}"] = arr.reshape(-1)
            problems += target.problems(arrays, names)
        if "step" in meta or not torch_style:
            try:
                step = _step_count(meta.get("step"), "the saved step")
            except ParamError as e:
                problems += [p.message for p in e.problems]
                step = 0
        masters = meta.get("master") if self.params.lossy else None
        if masters is not None:
            problems += _master_problems(masters, self.params.pset)
        if problems:
            raise ParamError(problems)
        rate = self.updater.lr(step)
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            for k2, v in saved.items():
                if k2 not in ("params", "param_names"):
                    group[k2] = v
            if "lr_scale" not in saved:  # torch.optim's: the rate is the group's lr
                group["lr_scale"] = self._scale_for(float(group["lr"]), rate)
        self.step_count = step
        # A group's lr and lr_scale agree in what state_dict writes; where they do not (a
        # state saved with an lr written after its last step by an older version), the lr
        # the user saw is the one to train at.
        self._reported = [rate * float(g["lr_scale"]) for g in self.param_groups]
        self._take_lr_writes(len(self.param_groups))
        self._state = target
        self._plan_key = None
        self._plan()
        if not torch_style:
            self._state.load(arrays, names)
        if masters is not None:
            for p in self.params.pset.owners:
                p.data[...] = masters[p.name].detach().cpu().reshape(p.shape).numpy()
        self.params.from_host(self._state, values=masters is not None)

    # -- paramserver checkpoints ------------------------------------------------------------

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the parameters' values, the updater state, the step and the versions to a
        paramserver checkpoint (SPEC §9: safetensors of plain arrays, atomic, no pickle).

        Module buffers (batch-norm statistics) are not Params: save them with the module.
        """
        from ..checkpoint import save_checkpoint
        from ..export import TABLE, param_table

        sd = self.state_dict()
        names = sd["paramserver"]["names"]
        pset = self.params.pset
        self.params.to_host(self._state, values=True)
        arrays: dict[str, np.ndarray] = {f"param/{p.name}": p.data for p in pset.owners}
        for idx, entry in sd["state"].items():
            for role, t in entry.items():
                arrays[f"state/{names[idx]}/{role}"] = (t.numpy() if isinstance(t, torch.Tensor)
                                                        else np.asarray(t))  # an int step
        # the master is the checkpoint's values (param/<name>), not its metadata
        meta = {"kind": _CHECKPOINT_KIND,
                **{k: v for k, v in sd["paramserver"].items() if k != "master"},
                "param_groups": sd["param_groups"],
                "versions": {p.name: p.version for p in pset.owners},
                TABLE: param_table(pset)}  # names and shapes, for paramserver export
        return save_checkpoint(path, arrays, meta)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore :meth:`save_checkpoint`'s file: values, updater state, step, versions.

        Checked whole (names, shapes, updater) before anything changes; training then goes
        on bit for bit as if it had not stopped.
        """
        from ..checkpoint import CheckpointError, load_checkpoint

        arrays, meta = load_checkpoint(path)
        if meta.get("kind") != _CHECKPOINT_KIND:
            raise CheckpointError(f"{path}: not a checkpoint of paramserver.torch.Optimizer")
        names = [n for _, n, _ in self._indexed()]
        if list(meta.get("names", [])) != names:
            raise CheckpointError(f"{path}: saved for parameters {meta.get('names')}, not "
                                  f"these {names}")
        pset = self.params.pset
        problems = []
        for p in pset.owners:
            arr = arrays.get(f"param/{p.name}")
            if arr is None or arr.shape != p.shape:
                problems.append(f"'param/{p.name}' is missing or not of shape {p.shape}")
        index = {n: i for i, n in enumerate(names)}
        state: dict[int, dict[str, Any]] = {}
        for key, arr in arrays.items():
            if key.startswith("state/"):
                name, _, role = key[len("state/"):].rpartition("/")
                if name not in index:
                    problems.append(f"'{key}' is not a state of these parameters")
                    continue
                state.setdefault(index[name], {})[role] = torch.from_numpy(arr)
        versions = meta.get("versions", {})
        for p in pset.owners:
            try:
                _step_count(versions.get(p.name, 0), f"the version of '{p.name}'")
            except ParamError as e:
                problems.append(str(e))
        if problems:
            raise CheckpointError([f"{path}: {m}" for m in problems])
        try:
            self.load_state_dict({"state": state, "param_groups": meta["param_groups"],
                                  "paramserver": meta})
        except CheckpointError:
            raise
        except ParamError as e:
            raise CheckpointError([f"{path}: {p.message}" for p in e.problems]) from None
        for p in pset.owners:
            p.data[...] = arrays[f"param/{p.name}"]
            p.version = int(versions.get(p.name, 0))
        self.params.from_host(self._state, values=True)

    def describe(self) -> str:
        """The full configuration, where ``repr`` (torch.optim's table of the groups and
        their keys) is short: each group's updater configuration and the binding of the
        parameters (their names, per-parameter scales and sharing)."""
        self._plan()
        lines = [f"{type(self).__name__} on {self.params!r}, step {self.step_count}, "
                 f"placement {self.placement!r}"
                 + (f", {self._overlap_conf}" if self._overlap_conf is not None else "")]
        for gi, group in enumerate(self.param_groups):
            updater = self._updater_for(self._settings(group))
            lines.append(f"param group {gi} (lr {group['lr']:g}, weight_decay "
                         f"{group['weight_decay']:g}): {updater.conf.to_json()}")
        for p in self.params.pset.params:
            conf = p.conf
            extra = f", shares '{p.owner.name}'" if p.owner is not None else ""
            lines.append(f"  {p.name} {tuple(p.shape)} lr_scale {conf.lr_scale:g} wd_scale "
                         f"{conf.wd_scale:g}{extra}")
        return "\n".join(lines)


@torch._disable_dynamo
def _step_eagerly(optimizer: Optimizer, closure: Callable[[], Any] | None) -> Any:
    """:meth:`Optimizer.step` outside torch.compile's tracing (torch's own lazy
    ``torch._dynamo.disable``, as torch.optim's ``zero_grad`` has it)."""
    return optimizer._step(closure)


__all__ = ["Optimizer"]
