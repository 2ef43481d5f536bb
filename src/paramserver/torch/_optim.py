"""``paramserver.torch.Optimizer``: a ``torch.optim.Optimizer`` backed by paramserver.

The parameters are bound to paramserver's flat memory (:mod:`._bind`), and a step is one
:meth:`Updater.apply` call over all of them: one fused kernel over every owner, with the
per-parameter ``lr_scale``/``wd_scale`` looked up by segment. The learning rate is the
updater's learning-rate method at the optimizer's step count (SINGA's ``step``, from 0).

Param groups. Every group has ``lr`` (its current rate), ``lr_scale`` (the group's factor
on the learning-rate method), ``weight_decay`` (absolute), and the updater's other settings
(``momentum``, ``delta``, ``clip_low``, ``clip_high`` and the method's own fields, such as
``rho`` or ``beta1``). ``lr`` and ``weight_decay`` are per-segment numbers, so groups that
differ only in them still update in one kernel call; groups that differ in another setting
get an updater of their own and a call of their own (one per run of consecutive groups with
equal settings). Writing ``group["lr"]`` -- by hand or by a ``torch.optim.lr_scheduler`` --
sets ``lr_scale = lr / learning_rate(step)``: with the default fixed learning-rate method
that is exactly torch's meaning, and with a paramserver method it rescales its curve.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ParamError
from ..config.job import UpdaterConf
from ..state import COUNT, UpdaterState
from ..updaters import Updater, create_updater
from ._bind import TorchParams, binding_of
from ._rules import ParamRule, RulesLike, parse_rules, resolve

#: The updater's top-level settings a param group may override (besides lr, weight_decay).
_TOP_SETTINGS = ("momentum", "delta", "clip_low", "clip_high")

#: torch.optim group keys, and what to write instead.
_TORCH_HINTS = {
    "nesterov": "choose the method in the updater: type: kNesterov",
    "betas": "use beta1 and beta2 (adam_conf)",
    "eps": "use delta",
    "dampening": "SINGA's updaters have no dampening",
    "alpha": "use rho (rmsprop_conf)",
    "maximize": "negate the loss",
}

_CHECKPOINT_KIND = "paramserver.torch.Optimizer"

#: Keys torch itself or its schedulers put into groups; passed over.
_PASSIVE = ("initial_lr", "param_names", "foreach", "fused", "differentiable", "capturable")


@dataclass
class _Run:
    """One :meth:`Updater.apply` call: owners ``a:b``, elements ``lo:hi``, their state."""

    updater: Updater
    a: int
    b: int
    lo: int
    hi: int
    state: UpdaterState


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

    Differences from torch.optim, all deliberate:

    - ``.grad`` of every parameter is a view of one flat buffer, and :meth:`zero_grad`
      zeroes it in place whatever ``set_to_none`` says: a parameter that got no gradient
      in a step is updated with a zero gradient (as torch does with ``set_to_none=False``).
      A ``.grad`` set to None elsewhere (``module.zero_grad()``) is honoured: that
      parameter is skipped in the next step, as torch.optim skips it.
    - Parameters with ``requires_grad=False`` are skipped.
    - Parameters tied by ``share_from`` are updated with the *mean* of their gradients
      (SPEC §3); torch's own tying (one tensor used twice) sums them.
    """

    def __init__(self, params: Iterable[Any], updater: UpdaterConf | dict[str, Any] | str
                 = "type: kSGD", *, param_conf: RulesLike = None, seed: int = 0):
        self.updater = create_updater(updater)
        self.conf: UpdaterConf = self.updater.conf
        self.step_count = 0
        self._ready = False
        self._explicit_lr: dict[int, bool] = {}
        self._reported: list[float] = []
        defaults: dict[str, Any] = {"lr": self.updater.lr(0), "lr_scale": 1.0,
                                    "weight_decay": self.conf.weight_decay}
        defaults.update(self._conf_settings(self.conf))
        super().__init__(params, defaults)
        self._rules = parse_rules(param_conf)
        self._seed = seed
        self._layout(strict=True)
        self._ready = True

    # -- settings ---------------------------------------------------------------------------

    @staticmethod
    def _conf_settings(conf: UpdaterConf) -> dict[str, Any]:
        out = {k: getattr(conf, k) for k in _TOP_SETTINGS}
        own = conf.own
        if own is not None:
            out.update({k: getattr(own, k) for k in type(own).fields() if k not in out})
        return out

    @property
    def setting_keys(self) -> tuple[str, ...]:
        """The updater settings a param group may set besides ``lr`` and ``weight_decay``."""
        return tuple(self._conf_settings(self.conf))

    def _settings(self, group: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(group[k] for k in self.setting_keys)

    def _updater_for(self, settings: tuple[Any, ...]) -> Updater:
        """An updater with these settings and weight_decay 1 (the groups give it per segment)."""
        cached = self._updaters.get(settings)
        if cached is not None:
            return cached
        conf = self.conf.copy()
        values = dict(zip(self.setting_keys, settings, strict=True))
        try:
            conf.update({k: values[k] for k in _TOP_SETTINGS}, allow_unknown=False)
            if conf.own is not None:
                conf.own.update({k: v for k, v in values.items() if k not in _TOP_SETTINGS},
                                allow_unknown=False)
        except ParamError as e:
            raise e.at("param group") from None
        conf.__dict__["weight_decay"] = 1.0
        updater = create_updater(conf)
        self._updaters[settings] = updater
        return updater

    # -- param groups -----------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (torch's meaning); its keys are checked, and memory is laid out anew."""
        problems = []
        allowed = {"params", "lr", "lr_scale", "weight_decay", *self.defaults, *_PASSIVE}
        for key in param_group:
            if key not in allowed:
                hint = _TORCH_HINTS.get(key, "")
                problems.append(f"param group key '{key}' is not a setting of "
                                f"{type(self.updater).__name__}"
                                + (f" ({hint})" if hint else "")
                                + f"; valid: {sorted(allowed - set(_PASSIVE))}")
        if "lr" in param_group and "lr_scale" in param_group:
            problems.append("give a param group 'lr' or 'lr_scale', not both")
        if problems:
            raise ParamError(problems)
        explicit_lr = "lr" in param_group
        self._add_group(param_group)
        self._explicit_lr[id(param_group)] = explicit_lr
        if self._ready:
            self._layout(strict=False)

    def _add_group(self, group: dict[str, Any]) -> None:
        """torch's ``add_param_group`` checks, without its import of torch._dynamo (seconds)."""
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
        group["params"] = params
        for key, default in self.defaults.items():
            group.setdefault(key, default)
        if len({id(t) for t in params}) != len(params):
            raise ParamError("a parameter group holds one parameter twice")
        seen = {id(t) for g in self.param_groups for t in g["params"]}
        if any(id(t) in seen for t in params):
            raise ParamError("some parameters appear in more than one parameter group")
        if any(("param_names" in g) != ("param_names" in group) for g in self.param_groups):
            raise ParamError("all optimizer param groups should be with/without names")
        self.param_groups.append(group)

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
        if self._ready:
            old_state = self._export_state()
            self._take_lr_writes(len(self._reported))
        bindings = {id(b): b for t in tensors if (b := binding_of(t)) is not None}
        reuse = next(iter(bindings.values())) if len(bindings) == 1 else None
        if (reuse is not None and not self._rules and len(reuse.tensors) == len(tensors)
                and all(a is b for a, b in zip(reuse.tensors, tensors, strict=True))
                and reuse.names == [n for n, _ in named]):
            self.params = reuse
        else:
            self.params = self._bind(named, strict)
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
        self._no_skip = [False] * len(pset.owners)
        self._plan(self._no_skip)
        if old_state:
            self._import_state(old_state)

    def _bind(self, named: list[tuple[str, torch.Tensor]], strict: bool) -> TorchParams:
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
        return TorchParams(named, resolved.confs, initialise=resolved.initialised & fresh,
                           seed=self._seed)

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

    def _sync_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-owner lr and wd scales from the groups, taking in writes to ``lr``."""
        self._take_lr_writes(len(self.param_groups))
        n = len(self.param_groups)
        lr_scale = np.empty(n)
        wd = np.empty(n)
        problems = []
        for gi, group in enumerate(self.param_groups):
            lr_scale[gi] = float(group["lr_scale"])
            wd[gi] = float(group["weight_decay"])
            if not lr_scale[gi] >= 0 or not wd[gi] >= 0:
                problems.append(f"param group {gi}: lr_scale ({lr_scale[gi]:g}) and "
                                f"weight_decay ({wd[gi]:g}) must be >= 0")
        if problems:
            raise ParamError(problems)
        return (self._base_lr_scale * lr_scale[self._owner_group],
                self._base_wd_scale * wd[self._owner_group])

    # -- planning the apply calls -----------------------------------------------------------

    def _plan(self, skip: list[bool]) -> None:
        """Runs of consecutive owners with equal settings, leaving out skipped owners."""
        settings = [self._settings(g) for g in self.param_groups]
        key = (tuple(settings), tuple(skip))
        if key == self._plan_key:
            return
        pset = self.params.pset
        updaters = [self._updater_for(settings[g]) for g in self._owner_group]
        # One state for every group: the roles of every updater in use (zero where a
        # group's method does not use one).
        for u in dict.fromkeys(updaters):
            u.check_dtype(pset.dtype)
            self._state = self._state.with_roles(u.roles)
        runs: list[_Run] = []
        offsets = pset.offsets
        i, n = 0, len(pset.owners)
        while i < n:
            if skip[i]:
                i += 1
                continue
            j = i + 1
            while j < n and not skip[j] and updaters[j] is updaters[i]:
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
        update count a number."""
        t = self._owner_tensors[k]
        out = {}
        for role, arr in self._state.segment(k).items():
            a = arr.copy() if copy else arr
            if role == COUNT:
                out[role] = torch.tensor(int(a[0])) if copy else torch.from_numpy(a)
            elif self._state.role(role).per == "element":
                out[role] = torch.from_numpy(a).view(t.shape)
            else:
                out[role] = torch.from_numpy(a)
        return out

    # -- the torch.optim interface ----------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One update of every parameter from its ``.grad``; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        tp = self.params
        tp.check()
        missing = tp.attach_grads()
        idle = [m or not t.requires_grad for m, t in zip(missing, tp.tensors, strict=True)]
        skip = ([all(idle[t] for t in share) for share in self._share_group] if any(idle)
                else self._no_skip)
        lr_scale, wd = self._sync_groups()
        self._plan(skip)
        pset = tp.pset
        grads = tp.owner_grads()
        try:
            for run in self._runs:
                a, b = run.a, run.b
                run.updater.apply(self.step_count, pset.values[run.lo:run.hi],
                                  grads[run.lo:run.hi], run.state, lr_scale[a:b], wd[a:b],
                                  self._grad_scale[a:b])
        finally:
            tp.restore_grads()
        for k, p in enumerate(pset.owners):
            if not skip[k]:
                p.version += 1
        self.step_count += 1
        for gi in range(len(self.param_groups)):
            self._set_group_lr(gi)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every gradient in place, in one pass; ``set_to_none`` is not followed.

        Keeping ``.grad`` as views of the flat buffer is what lets autograd write straight
        into paramserver's memory.
        """
        self.params.zero_grad()

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

    @property
    def _names(self) -> list[str]:
        return [p.name for p in self.params.pset.owners]

    def state_dict(self) -> dict[str, Any]:
        """torch's layout, paramserver's content; copies, loadable with ``weights_only``.

        ``state`` maps each owner's torch index to its updater state (``history``,
        ``update``, ``m``, ``v`` as tensors shaped like the parameter, and ``count``, its
        number of updates); ``param_groups`` are the groups with parameter indices;
        ``paramserver`` holds the step count, the updater's configuration and the
        parameter names.
        """
        # A scheduler's (or the user's) write to group["lr"] since the last step is taken
        # in now, so that the saved lr_scale is the one the next step would use.
        self._take_lr_writes(len(self.param_groups))
        index = {id(t): k for k, _, t in self._indexed()}
        state = {index[id(t)]: self._tensors(k, copy=True)
                 for k, t in enumerate(self._owner_tensors)}
        groups = []
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index[id(t)] for t in group["params"]]
            groups.append(g)
        return {"state": state, "param_groups": groups,
                "paramserver": {"step": self.step_count, "updater": self.conf.to_dict(),
                                "names": [n for _, n, _ in self._indexed()]}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; checked whole before anything changes."""
        meta = state_dict.get("paramserver")
        if not isinstance(meta, Mapping) or "state" not in state_dict:
            raise ParamError("not a state_dict of paramserver.torch.Optimizer (no "
                             "'paramserver' entry); a torch.optim state cannot be loaded")
        indexed = self._indexed()
        problems = []
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"])
                                                      for g in self.param_groups]:
            problems.append(f"the saved param groups have "
                            f"{[len(g['params']) for g in saved_groups]} parameters, these "
                            f"have {[len(g['params']) for g in self.param_groups]}")
        saved_type = (meta.get("updater") or {}).get("type")
        if saved_type is not None and saved_type != self.conf.type:
            problems.append(f"the state is of updater {saved_type}, this optimizer's is "
                            f"{self.conf.type}")
        try:
            step = _step_count(meta.get("step"), "the saved step")
        except ParamError as e:
            problems += [p.message for p in e.problems]
            step = 0
        owner_of = {id(t): k for k, t in enumerate(self._owner_tensors)}
        names = self._names
        arrays: dict[str, np.ndarray] = {}
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
            for r, v in entry.items():
                arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
                arrays[f"{names[k]}/{r}"] = arr.reshape(-1)
        # The state this optimizer will hold once the saved groups' settings are taken.
        roles = {r for g in saved_groups if all(k in g for k in self.setting_keys)
                 for r in self._updater_for(self._settings(g)).roles}
        target = self._state.with_roles(roles)
        problems += target.problems(arrays, names)
        if problems:
            raise ParamError(problems)
        for group, saved in zip(self.param_groups, saved_groups, strict=True):
            for k2, v in saved.items():
                if k2 not in ("params", "param_names"):
                    group[k2] = v
        self.step_count = step
        # A group's lr and lr_scale agree in what state_dict writes; where they do not (a
        # state saved with an lr written after its last step by an older version), the lr
        # the user saw is the one to train at.
        rate = self.updater.lr(self.step_count)
        self._reported = [rate * float(g["lr_scale"]) for g in self.param_groups]
        self._take_lr_writes(len(self.param_groups))
        self._state = target
        self._plan_key = None
        self._plan([False] * len(self.params.pset.owners))
        self._state.load(arrays, names)

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
        arrays: dict[str, np.ndarray] = {f"param/{p.name}": p.data for p in pset.owners}
        for idx, entry in sd["state"].items():
            for role, t in entry.items():
                arrays[f"state/{names[idx]}/{role}"] = t.numpy()
        meta = {"kind": _CHECKPOINT_KIND, **sd["paramserver"],
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

    def __repr__(self) -> str:
        return f"paramserver.torch.Optimizer({self.updater!r}, {self.params!r})"


__all__ = ["Optimizer"]
