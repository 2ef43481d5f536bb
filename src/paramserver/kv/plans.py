"""A store's plan of a list of dense keys: what a push or pull of it sends each server.

MXNet users push and pull the same list of keys every step. What a call of a list needs —
each key's description, the server of each of its pieces, each server's list of names and
the bounds of each key's part of its buffer — depends on the keys alone, so a
:class:`~.store.KVStore` makes it once per list (:func:`make_plan`) and reuses it: a
call then checks each value's shape, copies the values into one buffer per server (a
push) or each server's buffer into the outs (a pull), and nothing else per key.

Only lists of distinct dense float keys are planned (a table, counts or a key given twice
go the general way, which knows what to do with each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..cluster.messages import KEY_SEPARATOR


class _Key(Protocol):
    """What a plan reads of a store's key (:class:`~.store._Key`)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    row_sparse: bool
    pieces: list[tuple[int, int, int]]

    @property
    def size(self) -> int: ...


@dataclass
class ServerPart:
    """What one server holds of a planned list: its names joined (a batch's ``keys``), the
    bounds of each piece in its buffer, and per piece ``(key index, lo, hi)`` of the key's
    flat values."""

    server: int
    names: str
    offsets: np.ndarray
    pieces: list[tuple[int, int, int]]
    #: the keys whose single piece is whole here, by index, in order (None: some are cut)
    whole: list[int] | None


@dataclass
class Plan:
    """A planned list of keys (see the module docstring)."""

    keys: list[Any]  # the store's keys (:class:`~.store._Key`)
    shapes: list[tuple[int, ...]]
    dtype: np.dtype[Any]
    flat: bool  # every key is 1-D: its value is its flat value
    parts: list[ServerPart]
    #: per key, its pieces' servers as indexes into ``parts``
    where: list[list[int]]


def make_plan(keys: Sequence[_Key]) -> Plan | None:
    """The plan of a list of keys; None when it is not one of distinct dense float keys of
    one dtype."""
    if not keys or len({k.name for k in keys}) != len(keys):
        return None
    dtype = keys[0].dtype
    if any(k.row_sparse or k.dtype != dtype for k in keys) or dtype.kind != "f":
        return None
    pieces: dict[int, list[tuple[int, int, int]]] = {}
    names: dict[int, list[str]] = {}
    for i, k in enumerate(keys):
        for s, lo, hi in k.pieces:
            pieces.setdefault(s, []).append((i, lo, hi))
            names.setdefault(s, []).append(k.name)
    parts = []
    order = {s: j for j, s in enumerate(pieces)}
    for s, own in pieces.items():
        offsets = np.zeros(len(own) + 1, np.int64)
        np.cumsum([hi - lo for _, lo, hi in own], out=offsets[1:])
        whole = [i for i, _, _ in own] if all(
            lo == 0 and hi == keys[i].size for i, lo, hi in own) else None
        parts.append(ServerPart(s, KEY_SEPARATOR.join(names[s]), offsets, own, whole))
    where = [[order[s] for s, _, _ in k.pieces] for k in keys]
    return Plan(list(keys), [k.shape for k in keys], dtype, all(len(k.shape) == 1 for k in keys),
                parts, where)


def gather(plan: Plan, values: Sequence[np.ndarray], part: ServerPart) -> np.ndarray:
    """One server's buffer of a push: its pieces of ``values`` (arrays of the keys' shapes,
    checked), one after the other, in the plan's dtype (always a copy)."""
    flat = values if plan.flat else [v.reshape(-1) for v in values]
    if part.whole is not None:
        chosen = flat if len(part.whole) == len(flat) else [flat[i] for i in part.whole]
    else:
        chosen = [flat[i][lo:hi] for i, lo, hi in part.pieces]
    return np.concatenate(chosen, dtype=plan.dtype)


def scatter(plan: Plan, buffer: np.ndarray, part: ServerPart, outs: list[np.ndarray]) -> None:
    """Copy one server's reply to a pull (its pieces, one after the other) into ``outs``."""
    bounds = part.offsets.tolist()
    if plan.flat:
        for (i, lo, hi), a, b in zip(part.pieces, bounds, bounds[1:], strict=False):
            outs[i][lo:hi] = buffer[a:b]
        return
    for (i, lo, hi), a, b in zip(part.pieces, bounds, bounds[1:], strict=False):
        outs[i].reshape(-1)[lo:hi] = buffer[a:b]


def outs_fit(plan: Plan, outs: list[Any]) -> bool:
    """Whether every out is a writeable C-contiguous array of its key's shape."""
    for o, shape in zip(outs, plan.shapes, strict=True):
        if type(o) is not np.ndarray or o.shape != shape:
            return False
        flags = o.flags
        if not (flags.writeable and flags.c_contiguous):
            return False
    return True


def values_fit(plan: Plan, values: list[Any]) -> bool:
    """Whether every value is an array of floats of its key's shape."""
    for v, shape in zip(values, plan.shapes, strict=True):
        if type(v) is not np.ndarray or v.shape != shape or v.dtype.kind != "f":
            return False
    return True


__all__ = ["Plan", "ServerPart", "gather", "make_plan", "outs_fit", "scatter", "values_fit"]
