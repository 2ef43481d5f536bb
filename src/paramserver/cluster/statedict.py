"""A cluster's state as flat arrays (checkpoints), the same on every backend.

Keys: ``step``; ``layout`` (each server's ``[start, stop)``, so that a state is only loaded
into the same server ranges); and for every server ``server/<group>/<index>/<name>``, where
``<name>`` is ``values``, ``versions`` or ``state/<param>/<role>`` (the updater state's one
key scheme, :mod:`paramserver.state`). Plain arrays only: no pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from .layout import ServerLayout
from .messages import Address

_TOP = ("step", "layout")


def layout_array(layouts: Sequence[ServerLayout]) -> np.ndarray:
    return np.array([[L.start, L.stop] for L in layouts], np.int64).reshape(-1, 2)


def join_state(step: int, layouts: Sequence[ServerLayout],
               servers: Mapping[Address, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One flat dict from every server's state."""
    out: dict[str, np.ndarray] = {"step": np.array(step, np.int64),
                                  "layout": layout_array(layouts)}
    for (g, s), state in servers.items():
        for k, v in state.items():
            out[f"server/{g}/{s}/{k}"] = v
    return out


def split_state(state: Mapping[str, np.ndarray], layouts: Sequence[ServerLayout],
                addresses: Iterable[Address]
                ) -> tuple[list[str], dict[Address, dict[str, np.ndarray]]]:
    """Every server's part of a flat state, and the problems that forbid loading it."""
    problems = [f"'{key}' is missing" for key in _TOP if key not in state]
    if "step" in state:
        problems += step_problems(state["step"])
    if "layout" in state and not np.array_equal(np.asarray(state["layout"]),
                                                layout_array(layouts)):
        problems.append("the state was saved with other server ranges (another model or "
                        "nservers_per_group)")
    parts: dict[Address, dict[str, np.ndarray]] = {a: {} for a in addresses}
    for key, value in state.items():
        if key in _TOP:
            continue
        head, group, index, name = (*key.split("/", 3), "", "", "")[:4]
        address = (int(group), int(index)) if group.isdigit() and index.isdigit() else None
        if head != "server" or address is None or address not in parts:
            problems.append(f"'{key}' is not a key of this cluster's state")
            continue
        parts[address][name] = np.asarray(value)
    return problems, parts


def step_problems(step: object) -> list[str]:
    """Why a saved step cannot be the step to go on from (an integer >= 0)."""
    arr = np.asarray(step)
    if arr.ndim != 0 or arr.dtype.kind not in "iu" or int(arr) < 0:
        return [f"'step' is {arr.tolist()!r} ({arr.dtype}): it must be an integer >= 0"]
    return []


def owner_versions(layouts: Sequence[ServerLayout],
                   versions_of: Callable[[ServerLayout], np.ndarray]) -> dict[int, int]:
    """Each owner Param's version: the smallest of its slices' (in server group 0)."""
    per_owner: dict[int, int] = {}
    for L in layouts:
        for owner, version in zip(L.slice_owners.tolist(), versions_of(L).tolist(),
                                  strict=True):
            per_owner[owner] = min(per_owner.get(owner, version), version)
    return per_owner


__all__ = ["join_state", "layout_array", "owner_versions", "split_state", "step_problems"]
