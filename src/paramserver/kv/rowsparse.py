"""``row_sparse_pull`` as MXNet 1.9.1's KVStore takes it: row ids, and keys paired with outs.

- **Row ids** (:func:`row_ids_of`): any array of whole numbers — int of any width, or float
  (MXNet's NDArrays are float32 by default) with integral values — of any shape (a 2-D
  array is read flat, as MXNet reads it), or a Python list of them; in any order, with
  repeats. A float that is not a whole number is refused (MXNet truncates it silently).
- **Pairing** (:func:`pull_plan`): one key and an out (or a list of outs, each with the same
  row ids or a list of row ids, one per out), or a list of keys with an out (or a list of
  outs) for each and row ids to match; one row-id array for everything is taken by every
  out, as MXNet's ``single_rowid``.
- **Where the rows go** (:func:`place_rows`): into an ``out`` of the table's shape, the rows
  named are written at their ids and every other row is 0 — MXNet's out is a row-sparse
  array holding only the rows pulled (checked against MXNet 1.9.1: ids ``[3, 3, 0, 1]`` on a
  4-row table give rows 0, 1 and 3, and row 2 is 0 whatever ``out`` held). An ``out`` of
  ``len(row_ids)`` rows (paramserver's, for a dense batch of rows) gets them in the order of
  the ids; when the two shapes are the same, the table's wins.
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import numpy as np

from ..config import ParamError


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def is_ids(x: Any) -> bool:
    """Whether ``x`` is one array of row ids (an array, or a flat list of numbers), not a
    list of them."""
    if isinstance(x, np.ndarray) or hasattr(x, "asnumpy"):
        return True
    return _is_list(x) and all(isinstance(i, (Number, np.number)) for i in x)


def row_ids_of(x: Any, num_rows: int, where: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Row ids as a flat int64 array, checked inside ``[0, num_rows)``; the sorted distinct
    ids; and where each id is among them (None when the ids are already sorted and
    distinct: they are their own, told by the same one pass that checks them)."""
    if hasattr(x, "asnumpy"):  # an MXNet NDArray
        x = x.asnumpy()
    ids = np.asarray(x)
    if ids.size and ids.dtype.kind == "f":
        bad = ~np.isfinite(ids) | (ids != np.floor(ids))
        if bad.any():
            raise ParamError(f"{where}: row id {float(ids[bad].flat[0])!r} is not a whole "
                             "number (row ids may be floats, as MXNet's float32 arrays, of "
                             "whole numbers)")
    elif ids.size and ids.dtype.kind not in "iu":
        raise ParamError(f"{where}: row ids must be an array of whole numbers (int or float), "
                         f"not {ids.dtype} of shape {ids.shape}")
    ids = ids.reshape(-1).astype(np.int64)
    order = 0
    if ids.size:
        from ..numerics.rows import id_order  # loads numba: only for tables

        order = id_order(ids, num_rows)
    if order < 0:
        bad_id = ids[(ids < 0) | (ids >= num_rows)][0]
        raise ParamError(f"{where}: row id {int(bad_id)} is outside the table's rows "
                         f"[0, {num_rows})")
    if order == 0:
        return ids, ids, None
    unique, at = np.unique(ids, return_inverse=True)
    return ids, unique, at.reshape(-1)


def _flatten(key: Any, values: Any, single: Any, what: str) -> list[tuple[Any, Any]]:
    """MXNet's pairing of keys with values: ``(key, value)`` per value, a list of values
    for one key repeating it. ``single(v)``: whether ``v`` is one value (not a list)."""
    if _is_list(key):
        if not _is_list(values) or single(values) or len(values) != len(key):
            raise ParamError(f"row_sparse_pull: {len(key)} keys need a list of {len(key)} "
                             f"{what}, one (or a list) per key")
        out = []
        for k, v in zip(key, values, strict=True):
            out += [(k, x) for x in ([v] if single(v) else v)]
        return out
    return [(key, values)] if single(values) else [(key, v) for v in values]


def pull_plan(key: Any, out: Any, row_ids: Any) -> list[tuple[Any, Any, Any]]:
    """``(key, out, row ids)`` per pull, as MXNet pairs ``row_sparse_pull``'s arguments
    (``out`` None: the rows are returned, one array per key)."""
    if row_ids is None:
        raise ParamError("row_sparse_pull needs row_ids")
    ids_list = [row_ids] if is_ids(row_ids) else list(row_ids)
    if out is None:
        keys = list(key) if _is_list(key) else [key]
        if len(ids_list) == 1:
            ids_list = ids_list * len(keys)
        if len(ids_list) != len(keys):
            raise ParamError(f"row_sparse_pull: {len(keys)} keys need {len(keys)} arrays of "
                             f"row ids (or one for all), not {len(ids_list)}")
        return [(k, None, r) for k, r in zip(keys, ids_list, strict=True)]
    pairs = _flatten(key, out, lambda v: not _is_list(v), "outs")
    if len(ids_list) == 1:  # one array of row ids for every out (MXNet's single_rowid)
        return [(k, o, ids_list[0]) for k, o in pairs]
    ids = _flatten(key, ids_list, is_ids, "arrays of row ids")
    if len(ids) != len(pairs):
        raise ParamError(f"row_sparse_pull: the number of row_ids ({len(ids)}) doesn't match "
                         f"the number of outs ({len(pairs)})")
    return [(k, o, r) for (k, o), (_, r) in zip(pairs, ids, strict=True)]


def place_rows(out: np.ndarray | None, table_shape: tuple[int, ...], ids: np.ndarray,
               unique: np.ndarray, at: np.ndarray | None, rows: np.ndarray, dtype: Any
               ) -> np.ndarray:
    """Put the pulled ``rows`` (one per id of ``unique``; ``at`` maps ``ids`` to them, None:
    ``ids`` are ``unique``) into ``out`` as :mod:`this module <paramserver.kv.rowsparse>`
    says, or into a new array of ``len(ids)`` rows (one copy)."""
    num_rows = int(table_shape[0])
    dim = rows.shape[1]
    if out is not None and tuple(out.shape) == tuple(table_shape):
        flat = out.reshape(num_rows, dim)
        flat[...] = 0
        flat[unique] = rows
        return out
    if out is None and at is None and rows.base is None and rows.dtype == dtype:
        return rows.reshape(ids.size, *table_shape[1:])  # its own array already
    target = out if out is not None else np.empty((ids.size, *table_shape[1:]), dtype)
    flat = target.reshape(ids.size, dim)
    if at is None:
        flat[...] = rows
    else:
        np.take(rows, at, axis=0, out=flat, mode="clip")  # (at is in range)
    return target


__all__ = ["is_ids", "place_rows", "pull_plan", "row_ids_of"]
