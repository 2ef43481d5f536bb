"""torch.optim's names and layout for the updater state of the torch-style optimizers, both
ways.

A torch-style optimizer (``pst.Adam``, ``pst.SGD``, ...) shows its state as torch.optim's
class of the same name does: ``opt.state[p]`` and ``state_dict()["state"][i]`` hold
``step`` (the update count) and the updater's roles by torch's names (``m`` is Adam's
``exp_avg``, ``history`` SGD's ``momentum_buffer``: each updater's ``torch_names``), and
``load_state_dict`` takes a torch.optim ``state_dict`` of the same optimizer, so that a
running job moves across and continues exactly (and ours goes to torch.optim the same way).

Layout, as torch.optim's: a parameter that has not been updated has no entry (but Adagrad's,
whose state torch makes with the optimizer); ``step`` is a float tensor of torch's scalar
type (SparseAdam's a Python int, SGD's absent: torch.optim.SGD keeps only its momentum
buffer, and nothing without momentum); per-element state is shaped like the parameter;
NAdam's ``mu_product`` is a 0-d tensor (float64 here, so that our own resumption is
exact). State kept in bfloat16 or 8-bit codes goes as it is kept (codes and
``<name>_scale`` block scales): paramserver resumes from it exactly, and torch.optim cannot
read it. Taking a torch.optim state into such an optimizer encodes its floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..numerics.quant import SCALE
from ..state import COUNT, UpdaterState
from ..updaters import MASTER, SGD, AdaGrad, Nesterov, SparseAdam, Updater, fill_segment

#: torch.optim's name of the update count.
STEP = "step"


def torch_key(updater: Updater, role: str) -> str:
    """torch.optim's name of one of the updater's state roles."""
    if role == COUNT:
        return STEP
    names = updater.torch_names
    if role in names:
        return names[role]
    base = role.removesuffix(SCALE)
    if base != role and base in names:
        return names[base] + SCALE
    return role


def scalar_dtype() -> torch.dtype:
    """The type of torch.optim's ``step`` (float64 when that is torch's default type)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def export_entry(updater: Updater, state: UpdaterState, shape: tuple[int, ...]
                 ) -> dict[str, Any] | None:
    """One parameter's state (``state``: its one segment) as torch.optim keeps it: copies,
    by torch's names; None for a parameter not yet updated (torch keeps nothing for it,
    but for Adagrad)."""
    count = int(state.counts[0])
    eager = isinstance(updater, AdaGrad)  # torch.optim.Adagrad makes its state at once
    if count == 0 and not eager:
        return None
    initial = updater.initial_state() if count == 0 else {}
    out: dict[str, Any] = {}
    for r in updater.roles:
        if r.name == MASTER:
            continue
        a = state[r.name]
        key = torch_key(updater, r.name)
        if r.name == COUNT:
            if isinstance(updater, SparseAdam):
                out[key] = count
            elif not isinstance(updater, (SGD, Nesterov)):
                out[key] = torch.tensor(float(count), dtype=scalar_dtype())
        elif r.per == "segment":
            out[key] = torch.tensor(float(a[0]), dtype=torch.float64)
        elif r.per == "element":
            arr = a.copy()
            if r.name in initial and arr.dtype.kind == "f":
                arr[...] = initial[r.name]  # what torch's state holds before the first update
            out[key] = torch.from_numpy(arr).view(shape)
        else:
            out[key] = torch.from_numpy(a.copy())
    return out or None


def import_entry(updater: Updater, entry: Mapping[str, Any], state: UpdaterState,
                 where: str) -> list[str]:
    """Take one parameter's torch-style state (``entry``, torch.optim's or ours) into
    ``state`` (its one segment, zero); returns the problems (nothing is written then)."""
    roles = {torch_key(updater, r.name): r for r in updater.roles if r.name != MASTER}
    # paramserver's own role names (a checkpoint of an earlier release) are taken too, and
    # torch's names of state this method keeps only with other settings are passed over
    ours = {r.name: r for r in updater.roles if r.name != MASTER}
    known = {*roles, *ours, *updater.torch_names.values()}
    problems = [f"{where}: '{k}' is not state of torch.optim's {type(updater).__name__} "
                f"(keys: {sorted(roles)})" for k in entry if k not in known]
    arrays: dict[str, np.ndarray] = {}
    for key, r in [*roles.items(), *((k, r) for k, r in ours.items() if k not in roles)]:
        if key not in entry or r.name == COUNT:
            continue
        v = entry[key]
        arr = (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
               ).reshape(-1)
        n = state[r.name].size
        want = state[r.name].dtype
        ok = arr.size == n and (arr.dtype == want or (arr.dtype.kind == "f"
                                                      and r.per != "block"))
        if not ok:
            problems.append(f"{where}: '{key}' is {arr.dtype} of {arr.size} entries, expected "
                            f"{want} (or floats to encode) of {n}")
        arrays[r.name] = arr
    step = entry.get(STEP, entry.get(COUNT))
    # torch.optim.SGD keeps no step: a momentum buffer means it has been updated
    count = _count(step, where, problems) if step is not None else (1 if arrays else 0)
    if problems:
        return problems
    state.counts[0] = count
    for name, arr in arrays.items():
        if arr.dtype == state[name].dtype:
            state[name][...] = arr
        else:
            fill_segment(state, name, 0, arr)
    return []


def _count(step: Any, where: str, problems: list[str]) -> int:
    value = step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)) or not math.isfinite(value) \
            or value < 0 or float(value) != int(value):
        problems.append(f"{where}: 'step' is {step!r}: it must be a whole number >= 0")
        return 0
    return int(value)


__all__ = ["STEP", "export_entry", "import_entry", "scalar_dtype", "torch_key"]
