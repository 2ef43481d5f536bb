"""Which server holds what: slices as ranges of the owners' flat values.

A :class:`ServerLayout` is plain data (integers and small arrays), so that it can be shipped
to a server in another process. Because slice ids follow Param order and partitioning fills
servers in order, the slices of one server are one contiguous range ``[start, stop)`` of
:attr:`ParamSet.values <paramserver.params.ParamSet.values>`; its *segments* are the pieces
of Params inside that range, one per Param (a Param cut between two servers has a segment
on each), and one updater call covers them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.job import ClusterConf
from ..params import ParamSet, TableParam
from .slicing import compute_slices, partition_slices


@dataclass(frozen=True, eq=False)
class ServerLayout:
    """The range of one server (the same in every server group).

    Attributes:
        index: the server's index within its group.
        start, stop: its range of the owners' flat values.
        slice_ids: global ids of its slices, consecutive.
        slice_offsets: boundaries of its slices within the range (from 0 to ``size``).
        slice_owners: owner index (position in ``ParamSet.owners``) of each slice.
        offsets: boundaries of its segments within the range (from 0 to ``size``).
        owners: owner index of each segment.
        names: name of each segment's Param.
        lr_scale, wd_scale: of each segment's Param (float64).
        dtype: of the values.
        row_dims: per segment, the values per row of a row-sparse table (SPEC §10), 0 for a
            dense Param; the tables come after every dense segment, cut at row boundaries.
        first_rows: per segment, the table row its piece starts at (0 for a dense one).
    """

    index: int
    start: int
    stop: int
    slice_ids: np.ndarray
    slice_offsets: np.ndarray
    slice_owners: np.ndarray
    offsets: np.ndarray
    owners: np.ndarray
    names: tuple[str, ...]
    lr_scale: np.ndarray
    wd_scale: np.ndarray
    dtype: np.dtype[Any]
    row_dims: np.ndarray | None = None
    first_rows: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.owners)
        for name in ("row_dims", "first_rows"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(n, np.int64))
        dims = self.dims
        tables = np.flatnonzero(dims > 0)
        num_dense = int(tables[0]) if tables.size else n
        if np.any(dims[num_dense:] == 0):
            raise ParamError("a server's table segments come after its dense ones")
        # Asked several times in every update: worked out once (the layout never changes).
        object.__setattr__(self, "_num_dense", num_dense)
        object.__setattr__(self, "_dense_size", int(self.offsets[num_dense]))
        object.__setattr__(self, "_tables", range(num_dense, n))

    @property
    def dims(self) -> np.ndarray:
        """:attr:`row_dims`, never None."""
        assert self.row_dims is not None
        return self.row_dims

    @property
    def num_dense(self) -> int:
        """The number of dense segments (they come first)."""
        return int(self._num_dense)  # type: ignore[attr-defined]

    @property
    def dense_size(self) -> int:
        """The values of the dense segments (a prefix of the range)."""
        return int(self._dense_size)  # type: ignore[attr-defined]

    @property
    def tables(self) -> range:
        """The indices of the table segments."""
        tables: range = self._tables  # type: ignore[attr-defined]
        return tables

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def num_slices(self) -> int:
        return len(self.slice_ids)

    @property
    def num_segments(self) -> int:
        return len(self.owners)

    def __repr__(self) -> str:
        ids = (f"{self.slice_ids[0]}..{self.slice_ids[-1]}" if self.num_slices else "none")
        return (f"ServerLayout(server {self.index}: values [{self.start}, {self.stop}), "
                f"slices {ids}, {self.num_segments} segments)")


@dataclass(frozen=True)
class ServerLoad:
    """What one server carries, as ``paramserver check`` shows it."""

    server: int
    slice_ids: tuple[int, ...]
    num_values: int


def _sizes(params: ParamSet | Sequence[int]) -> list[int]:
    if isinstance(params, ParamSet):
        return [int(x) for x in np.diff(params.offsets)]
    return [int(x) for x in params]


def _on_rows(pieces: list[int], dim: int) -> list[int]:
    """A table's slices cut at row boundaries: each cut moved to the nearest row's start."""
    if dim <= 1 or len(pieces) < 2:
        return pieces
    cuts = np.cumsum(pieces)
    rounded = [round(c / dim) * dim for c in cuts[:-1].tolist()] + [int(cuts[-1])]
    out, last = [], 0
    for c in rounded:
        if c > last:
            out.append(c - last)
            last = c
    return out


def _slices(params: ParamSet | Sequence[int], num: int, dims: Sequence[int] | None = None
            ) -> list[list[int]]:
    """SINGA's slices of each owner; a table's cut at row boundaries."""
    slices = compute_slices(_sizes(params), num)
    if isinstance(params, ParamSet):
        dims = [p.dim if isinstance(p, TableParam) else 0 for p in params.owners]
    if dims is not None:
        slices = [_on_rows(pieces, d) for pieces, d in zip(slices, dims, strict=True)]
    return slices


def server_loads(params: ParamSet | Sequence[int], conf: ClusterConf | int,
                 dims: Sequence[int] | None = None) -> list[ServerLoad]:
    """The slices and number of values of each server of one server group.

    Args:
        params: a ParamSet, or the sizes of the owner Params in order.
        conf: the cluster configuration, or the number of servers per group.
        dims: with sizes, each owner's values per row if it is a row-sparse table (cut at
            row boundaries), else 0 (:meth:`ParamPlan.server_sizes
            <paramserver.params.ParamPlan.server_sizes>`).
    """
    num = conf if isinstance(conf, int) else conf.nservers_per_group
    sizes = [x for pieces in _slices(params, num, dims) for x in pieces]
    where = partition_slices(sizes, num) if sizes else []
    ids: list[list[int]] = [[] for _ in range(num)]
    load = [0] * num
    for i, (size, server) in enumerate(zip(sizes, where, strict=True)):
        ids[server].append(i)
        load[server] += size
    return [ServerLoad(s, tuple(ids[s]), load[s]) for s in range(num)]


def plan_servers(params: ParamSet, num: int) -> list[ServerLayout]:
    """The layouts of the ``num`` servers of a group, for a ParamSet's owners."""
    sizes = _sizes(params)
    slices = _slices(params, num)
    flat = np.array([x for pieces in slices for x in pieces], np.int64)
    slice_owner = np.array([i for i, pieces in enumerate(slices) for _ in pieces], np.int64)
    bounds = np.concatenate([[0], np.cumsum(flat)]).astype(np.int64)
    where = np.array(partition_slices(flat.tolist(), num) if len(flat) else [], np.int64)
    offsets = params.offsets
    names = [p.name for p in params.owners]
    lr, wd = params.lr_scales, params.wd_scales
    layouts = []
    stop = 0
    for s in range(num):
        ids = np.flatnonzero(where == s).astype(np.int64)
        start = int(bounds[ids[0]]) if len(ids) else stop
        stop = int(bounds[ids[-1] + 1]) if len(ids) else start
        segs = np.array([i for i in range(len(sizes)) if sizes[i] > 0 and offsets[i] < stop
                         and offsets[i + 1] > start], np.int64)
        seg_bounds = np.clip(np.concatenate([offsets[segs], [stop]]), start, stop) - start
        dims = np.array([params.owners[i].dim if isinstance(params.owners[i], TableParam)
                         else 0 for i in segs], np.int64)
        first = np.array([(start + int(b) - int(offsets[i])) // int(d) if d else 0
                          for i, b, d in zip(segs, seg_bounds[:-1], dims, strict=True)],
                         np.int64)
        layouts.append(ServerLayout(
            index=s, start=start, stop=stop, slice_ids=ids,
            slice_offsets=(bounds[np.concatenate([ids, ids[-1:] + 1])] - start
                           if len(ids) else np.zeros(1, np.int64)),
            slice_owners=slice_owner[ids], offsets=seg_bounds.astype(np.int64),
            owners=segs, names=tuple(names[i] for i in segs),
            lr_scale=lr[segs], wd_scale=wd[segs], dtype=params.dtype, row_dims=dims,
            first_rows=first))
    return layouts


__all__ = ["ServerLayout", "ServerLoad", "plan_servers", "server_loads"]
