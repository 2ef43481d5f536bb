"""What a key-value client pushes and initialises besides plain arrays (SPEC §10).

- :class:`RowSparse`: a row-sparse gradient, ``(ids, rows)`` — row ids need not be sorted or
  unique (:meth:`RowSparse.coalesced` sums the rows of one id, in the order given);
- :class:`Fill`: a value the servers make themselves with an init method (SPEC §4), so that
  a table larger than any worker never exists outside them;
- :class:`RowResidual`: a worker's residual of 2-bit compression for the rows it pushed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster.compression import encode
from ..config import ParamError
from ..config.job import ParamGenConf, conf_from
from ..params import coalesce_rows

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: Integer values, for keys that hold counts (MXNet's int32 and int64 NDArrays).
_INTEGERS = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True)
class RowSparse:
    """A row-sparse gradient of a table: ``rows[i]`` is the gradient of row ``ids[i]``.

    Attributes:
        ids: row ids (any order; a repeated id's rows are summed).
        rows: one row per id (``len(ids) × row shape``).
    """

    ids: Any
    rows: Any

    def coalesced(self, num_rows: int, dim: int, dtype: Any, where: str
                  ) -> tuple[np.ndarray, np.ndarray]:
        """``(sorted unique ids, rows summed per id in the order given)`` as int64 and a
        C-contiguous ``(n, dim)`` array of ``dtype``; checked against the table."""
        ids = np.asarray(self.ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ParamError(f"{where}: row ids must be a 1-D array of integers, not "
                             f"{ids.dtype} of shape {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
        rows = np.asarray(self.rows)
        if rows.dtype.kind != "f" or rows.size != ids.size * dim:
            raise ParamError(f"{where}: {ids.size} row ids need {ids.size} rows of {dim} "
                             f"float values, not {rows.dtype} of shape {rows.shape}")
        rows = rows.reshape(ids.size, dim).astype(dtype, copy=False)
        if not ids.size:
            return ids, np.ascontiguousarray(rows)
        from ..numerics.rows import id_order  # loads numba: only for tables

        ids = np.ascontiguousarray(ids)
        order = id_order(ids, num_rows)  # bounds and order in one pass
        if order < 0:
            bad = ids[(ids < 0) | (ids >= num_rows)][0]
            raise ParamError(f"{where}: row id {int(bad)} is outside the table's rows "
                             f"[0, {num_rows})")
        if order == 0:  # sorted, each row once: as given
            return ids, np.ascontiguousarray(rows)
        return coalesce_rows(ids, rows, dim, dtype)


def row_sparse(ids: Any, rows: Any) -> RowSparse:
    """A row-sparse gradient (see :class:`RowSparse`)."""
    return RowSparse(ids, rows)


@dataclass(frozen=True)
class Fill:
    """A value that the servers fill themselves, with an init method (SPEC §4).

    Element ``i`` of the value is that of the method's fill of a Param named as the key, with
    ``seed`` (the same whatever the number of servers). Methods that fill whole Params only
    (``orthogonal``, ``kFromFile``, users') are filled by the initialising client and sent.

    Attributes:
        shape: the value's shape.
        init: the method: an ``init { }`` block's text, a dict or a ``ParamGenConf``
            (default: constant 0).
        dtype: float32 or float64.
        seed: the fill's seed.
    """

    shape: tuple[int, ...]
    init: Any = field(default_factory=lambda: {"type": "kConstant", "value": 0.0})
    dtype: Any = "float32"
    seed: int = 0

    def conf(self) -> ParamGenConf:
        return conf_from(ParamGenConf, dict(self.init) if isinstance(self.init, Mapping)
                         else self.init, "init")


def value_dtype(dtype: Any, where: str) -> np.dtype[Any]:
    """A key's dtype: float32 or float64, or int32 or int64 (a key that holds counts)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in _FLOATS and dt not in _INTEGERS:
        raise ParamError(f"{where}: values must be float32 or float64 (or int32 or int64, "
                         f"for counts), not {dtype if dt is None else dt}")
    return dt


class RowResidual:
    """What 2-bit compression has not sent yet of the rows a worker pushed to one table
    piece: a residual row per row id ever pushed (sorted ids)."""

    def __init__(self, dim: int, dtype: Any):
        self.dim = dim
        self.ids = np.zeros(0, np.int64)
        self.rows = np.zeros((0, dim), dtype)

    def encode(self, ids: np.ndarray, rows: np.ndarray, threshold: float) -> np.ndarray:
        """The 2-bit codes of ``rows`` plus their residuals; the residuals keep the rest."""
        pos = np.searchsorted(self.ids, ids)
        found = pos < self.ids.size
        found[found] = self.ids[pos[found]] == ids[found]
        rest = np.zeros(rows.shape, self.rows.dtype)
        rest[found] = self.rows[pos[found]]
        codes = encode(np.ascontiguousarray(rows).reshape(-1), "2bit", threshold,
                       rest.reshape(-1))  # rest: the residuals in, what is not sent out
        self.rows[pos[found]] = rest[found]
        if not found.all():
            new = ~found
            ids_ = np.concatenate([self.ids, ids[new]])
            order = np.argsort(ids_, kind="stable")
            self.ids = ids_[order]
            self.rows = np.concatenate([self.rows, rest[new]])[order]
        return codes

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.rows.nbytes)


__all__ = ["Fill", "RowResidual", "RowSparse", "row_sparse", "value_dtype"]
