"""A cluster's state as flat arrays (checkpoints), the same on every backend.

Keys: ``step``; ``layout`` (each server's ``[start, stop)``, so that a state is only loaded
into the same server ranges); and for every server ``server/<group>/<index>/<name>``, where
``<name>`` is ``values``, ``versions`` or ``state/<param>/<role>`` (the updater state's one
key scheme, :mod:`paramserver.state`). Plain arrays only: no pickle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..config import ParamError
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


def owner_values(state: Mapping[str, np.ndarray]) -> np.ndarray:
    """The owners' flat values (as ``ParamSet.values`` holds them) from a flat state: every
    server's ``values`` of server group 0, placed at its ``layout`` range.

    Raises:
        ParamError: naming what is missing or does not fit (a ValueError).
    """
    if "layout" not in state:
        raise ParamError("'layout' is missing")
    layout = np.asarray(state["layout"])
    if layout.ndim != 2 or layout.shape[1:] != (2,) or layout.dtype.kind not in "iu":
        raise ParamError(f"'layout' is {layout.dtype} of shape {layout.shape}, expected "
                         "integers of shape (servers, 2)")
    ranges = layout.tolist()
    # The ranges are read from the file: they must tile [0, total) before anything is made
    # of that size (a forged range of 2^40 values is refused, not allocated).
    covered = 0
    for start, stop in sorted(ranges):
        if start != covered or stop < start:
            raise ParamError(f"the servers' ranges leave a gap or overlap at {covered}")
        covered = stop
    total = covered
    parts = []
    for index, (start, stop) in enumerate(ranges):
        if start == stop:
            continue
        key = f"server/0/{index}/values"
        values = state.get(key)
        if values is None or np.ndim(values) != 1 or len(values) != stop - start:
            raise ParamError(f"'{key}' is missing or does not hold the {stop - start} "
                             f"values of [{start}, {stop})")
        parts.append((start, stop, np.asarray(values)))
    if not parts:
        return np.zeros(0, np.float32)
    out = np.empty(total, parts[0][2].dtype)
    for start, stop, values in parts:
        out[start:stop] = values
    return out


__all__ = ["join_state", "layout_array", "owner_values", "owner_versions", "split_state",
           "step_problems"]
