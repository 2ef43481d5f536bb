"""Updater state (SPEC §5): the one home of optimizer state.

An :class:`UpdaterState` holds the state of an update method for a range of flat values cut
into *segments* (the Params, or pieces of Params, of a server's range; the owners of a
ParamSet; the tensors of a torch optimizer): one flat array per *role* and the number of
updates applied to each segment. :class:`~paramserver.updaters.Updater`,
:class:`~paramserver.cluster.Server` and :class:`paramserver.torch.Optimizer` all keep their
state in one, so that it has one layout, one set of views and one checkpoint key scheme.

A :class:`Role` says how long its array is and of which type:

- ``per="element"``: one entry per value (``history``, Adam's ``m`` and ``v``);
- ``per="segment"``: one entry per segment (the update ``count``, kept for every method);
- ``per="block"``: one entry per block of ``block`` values, the blocks of each segment
  counted from the segment's start (e.g. the scale of a block-wise quantised state);

and ``dtype`` is the values' type unless the role names another (``int64`` for the count,
``int8`` for quantised state).

Views share memory with the state they come from: :meth:`UpdaterState.segments` (segments
``a`` to ``b``), :meth:`UpdaterState.elements` (a range of values, which may cut segments;
per-block roles need it on block boundaries) and :meth:`UpdaterState.segment` (one segment's
arrays by role).

Checkpoints: :meth:`UpdaterState.export` names every array piece ``<name>/<role>``, the name
being the segment's Param; :meth:`UpdaterState.problems` and :meth:`UpdaterState.load`
check such pieces whole (keys, roles, types, lengths, counts) before anything changes.
Holders put their own prefix in front (``state/`` in the cluster's and the torch
optimizer's checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ParamError

#: The role of the per-segment update counts, kept by every state.
COUNT = "count"
_PER = ("element", "segment", "block")


@dataclass(frozen=True)
class Role:
    """One array of an updater's state; see the module docstring.

    Attributes:
        name: the key of the array (``"history"``, ``"m"``).
        dtype: its numpy type name, or None for the values' type.
        per: ``"element"``, ``"segment"`` or ``"block"``: what one entry stands for.
        block: values per block (with ``per="block"``).
    """

    name: str
    dtype: str | None = None
    per: str = "element"
    block: int = 0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ParamError(f"state role name {self.name!r}: a non-empty name without '/'")
        if self.per not in _PER:
            raise ParamError(f"state role '{self.name}': per must be one of {_PER}, "
                             f"not {self.per!r}")
        if (self.per == "block") != (self.block > 0):
            raise ParamError(f"state role '{self.name}': block (values per block) must be "
                             "> 0 exactly when per is 'block'")

    def type_for(self, values: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype(self.dtype) if self.dtype is not None else values


COUNT_ROLE = Role(COUNT, "int64", "segment")


def roles_of(names: Iterable[str | Role]) -> tuple[Role, ...]:
    """Roles from names (per element, of the values' type) or Roles, with the count first."""
    out = [COUNT_ROLE]
    for r in names:
        role = r if isinstance(r, Role) else Role(str(r))
        if role.name == COUNT:
            if role != COUNT_ROLE:
                raise ParamError(f"'{COUNT}' is the per-segment update count, kept by every "
                                 "state: a method may not declare it otherwise")
            continue
        if any(o.name == role.name for o in out):
            raise ParamError(f"state role '{role.name}' is declared twice")
        out.append(role)
    return tuple(out)


def _bounds(offsets: np.ndarray, block: int) -> np.ndarray:
    """Per segment, the first block: blocks of each segment counted from its start."""
    sizes = np.diff(offsets)
    return np.concatenate([[0], np.cumsum(-(-sizes // block))]).astype(np.int64)


class UpdaterState:
    """An updater's state for a range of values in segments; see the module docstring.

    Args:
        roles: the method's roles (names or :class:`Role`); the count is added.
        offsets: int64 segment boundaries, from 0 to the range's size (non-decreasing).
        dtype: the values' type (float32 or float64).
        arrays: the arrays themselves (for views); by default zeros.

    Attributes:
        roles: every role, the count first.
        offsets: the segment boundaries (from 0).
        dtype: the values' type.
        arrays: the arrays by role name (``arrays["count"]`` the update counts).
    """

    __slots__ = ("_blocks", "arrays", "dtype", "offsets", "roles")

    def __init__(self, roles: Iterable[str | Role], offsets: Sequence[int] | np.ndarray,
                 dtype: Any, arrays: Mapping[str, np.ndarray] | None = None):
        self.roles = roles_of(roles)
        self.offsets = np.asarray(offsets, np.int64).reshape(-1)
        if (len(self.offsets) < 1 or self.offsets[0] != 0
                or np.any(np.diff(self.offsets) < 0)):
            raise ParamError(f"state offsets must be non-decreasing from 0, not "
                             f"{self.offsets.tolist()}")
        self.dtype = np.dtype(dtype)
        self._blocks: dict[int, np.ndarray] = {}
        if arrays is None:
            self.arrays = {r.name: np.zeros(self.length(r), r.type_for(self.dtype))
                           for r in self.roles}
        else:
            self.arrays = dict(arrays)

    # -- shape ------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The number of values the state covers."""
        return int(self.offsets[-1])

    @property
    def num_segments(self) -> int:
        return len(self.offsets) - 1

    @property
    def names(self) -> tuple[str, ...]:
        """The role names, the count first."""
        return tuple(r.name for r in self.roles)

    @property
    def counts(self) -> np.ndarray:
        """Per segment, the number of updates applied to it (a view)."""
        return self.arrays[COUNT]

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise ParamError(f"no state role '{name}'; this state has {list(self.names)}")

    def block_offsets(self, block: int) -> np.ndarray:
        """Per segment, the first block of a per-block role of ``block`` values per block."""
        found = self._blocks.get(block)
        if found is None:
            found = self._blocks[block] = _bounds(self.offsets, block)
        return found

    def length(self, role: Role) -> int:
        """The length of a role's array."""
        if role.per == "element":
            return self.size
        if role.per == "segment":
            return self.num_segments
        return int(self.block_offsets(role.block)[-1])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    # -- views ------------------------------------------------------------------------------

    def _piece(self, role: Role, a: int, b: int) -> slice:
        """The entries of ``role`` that belong to segments ``a`` to ``b``."""
        if role.per == "element":
            return slice(int(self.offsets[a]), int(self.offsets[b]))
        if role.per == "segment":
            return slice(a, b)
        blocks = self.block_offsets(role.block)
        return slice(int(blocks[a]), int(blocks[b]))

    def segments(self, a: int, b: int) -> UpdaterState:
        """A view of segments ``a`` to ``b`` (``b`` excluded)."""
        if not 0 <= a <= b <= self.num_segments:
            raise ParamError(f"segments {a}:{b} out of range 0:{self.num_segments}")
        offsets = self.offsets[a:b + 1] - self.offsets[a]
        return UpdaterState(self.roles, offsets, self.dtype,
                            {r.name: self.arrays[r.name][self._piece(r, a, b)]
                             for r in self.roles})

    def segment(self, i: int) -> dict[str, np.ndarray]:
        """Segment ``i``'s arrays by role (views)."""
        return {r.name: self.arrays[r.name][self._piece(r, i, i + 1)] for r in self.roles}

    def elements(self, lo: int, hi: int) -> UpdaterState:
        """A view of values ``lo`` to ``hi``: per-element roles sliced there, per-segment roles
        for the segments the range touches, per-block roles for its blocks (the range must
        then begin and end on block boundaries of its segments)."""
        if not 0 <= lo <= hi <= self.size:
            raise ParamError(f"elements {lo}:{hi} out of range 0:{self.size}")
        off = self.offsets
        a = int(np.searchsorted(off[1:], lo, side="right"))  # the first segment ending after lo
        b = max(a, int(np.searchsorted(off[:-1], hi, side="left")))  # those starting before hi
        if hi == lo:
            b = a  # an empty range touches no segment
        arrays = {}
        for r in self.roles:
            if r.per == "element":
                arrays[r.name] = self.arrays[r.name][lo:hi]
            elif r.per == "segment":
                arrays[r.name] = self.arrays[r.name][a:b]
            elif b == a:
                arrays[r.name] = self.arrays[r.name][:0]
            else:
                first, last = int(off[a]), int(off[b - 1])
                if (lo - first) % r.block or (hi != off[b] and (hi - last) % r.block):
                    raise ParamError(f"a view of values {lo}:{hi} cuts a block of role "
                                     f"'{r.name}' ({r.block} values per block)")
                blocks = self.block_offsets(r.block)
                arrays[r.name] = self.arrays[r.name][
                    int(blocks[a]) + (lo - first) // r.block:
                    int(blocks[b - 1]) + -(-(hi - last) // r.block)]
        offsets = np.clip(off[a:b + 1], lo, hi) - lo if b > a else np.zeros(1, np.int64)
        return UpdaterState(self.roles, offsets, self.dtype, arrays)

    # -- whole-state operations -------------------------------------------------------------

    def zero(self) -> None:
        for a in self.arrays.values():
            a.fill(0)

    def copy(self) -> UpdaterState:
        return UpdaterState(self.roles, self.offsets.copy(), self.dtype,
                            {k: v.copy() for k, v in self.arrays.items()})

    def with_roles(self, roles: Iterable[str | Role]) -> UpdaterState:
        """A state with these roles besides its own: its arrays kept, new ones zero."""
        new = [r for r in roles_of(roles) if r.name not in self.arrays]
        if not new:
            return self
        arrays = dict(self.arrays)
        for r in new:
            arrays[r.name] = np.zeros(self.length(r), r.type_for(self.dtype))
        return UpdaterState((*self.roles, *new), self.offsets, self.dtype, arrays)

    def copy_from(self, other: UpdaterState,
                  copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto) -> None:
        """Take ``other``'s arrays (same roles and layout) into this state's memory, each by
        ``copy(destination, source)``."""
        for r in self.roles:
            copy(self.arrays[r.name], other.arrays[r.name])

    # -- checkpoints ------------------------------------------------------------------------

    def _check_names(self, names: Sequence[str]) -> None:
        if len(names) != self.num_segments:
            raise ParamError(f"{len(names)} names for {self.num_segments} segments")

    def _bounds_of(self, role: Role) -> list[int]:
        """Per segment, where ``role``'s entries start, and the end: as Python ints (the
        per-segment loops of checkpoints run over a million segments)."""
        if role.per == "element":
            return self.offsets.tolist()  # type: ignore[no-any-return]
        if role.per == "segment":
            return list(range(self.num_segments + 1))
        return self.block_offsets(role.block).tolist()  # type: ignore[no-any-return]

    def export(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Every array piece as ``{"<name>/<role>": copy}``, ``names[i]`` naming segment i."""
        self._check_names(names)
        pieces = [(r.name, self.arrays[r.name], self._bounds_of(r)) for r in self.roles]
        return {f"{name}/{role}": a[at[i]:at[i + 1]].copy()
                for i, name in enumerate(names) for role, a, at in pieces}

    def problems(self, arrays: Mapping[str, Any], names: Sequence[str],
                 prefix: str = "") -> list[str]:
        """What :meth:`load` would refuse in ``arrays`` (keys ``<prefix><name>/<role>``)."""
        self._check_names(names)
        problems = []
        pieces = [(r, self._bounds_of(r)) for r in self.roles]
        expected: dict[str, tuple[Role, int]] = {
            f"{prefix}{name}/{r.name}": (r, at[i + 1] - at[i])
            for i, name in enumerate(names) for r, at in pieces}
        for key in arrays:
            if key not in expected:
                problems.append(f"'{key}' is not state of this updater (its keys are "
                                f"'{prefix}<param>/<role>', roles {list(self.names)})")
        for key, (r, n) in expected.items():
            if key not in arrays:
                problems.append(f"'{key}' is missing")
                continue
            arr = np.asarray(arrays[key])
            want = r.type_for(self.dtype)
            if arr.dtype != want or arr.size != n:
                problems.append(f"'{key}' is {arr.dtype} of {arr.size} entries, expected "
                                f"{want} of {n}")
            elif r.name == COUNT and arr.size and int(arr.min()) < 0:
                problems.append(f"'{key}' is {int(arr.min())}: an update count is >= 0")
        return problems

    def load(self, arrays: Mapping[str, Any], names: Sequence[str], prefix: str = "") -> None:
        """Take :meth:`export`'s pieces back; checked whole before anything changes."""
        problems = self.problems(arrays, names, prefix)
        if problems:
            raise ParamError(problems)
        for r in self.roles:
            a, at = self.arrays[r.name], self._bounds_of(r)
            for i, name in enumerate(names):
                a[at[i]:at[i + 1]] = np.asarray(arrays[f"{prefix}{name}/{r.name}"]).reshape(-1)

    def __repr__(self) -> str:
        return (f"UpdaterState({list(self.names)}, {self.size} values in "
                f"{self.num_segments} segments, {self.dtype.name})")


__all__ = ["COUNT", "COUNT_ROLE", "Role", "UpdaterState", "roles_of"]
