"""Row-sparse fused update kernels: the updaters of SPEC §5 on the given rows of a table.

A row-sparse gradient is ``(ids, rows)``: the row indices of a 2-D table (a Param of shape
``(num_rows, dim)``, flat in memory) and one row of ``dim`` gradient values per index. These
kernels apply one update of a method to those rows only, in one pass: each touched row of
the values and of the state is read once and written once; nothing else is read or written.

Per element of a touched row, the order is SPEC §5's (the dense kernels'): clip, scale by
``gscale``, add ``wd × w`` (not for AdamW), then the method's rule — the very per-element
rule functions of :mod:`.rules` (``_sgd_rule``, ``_adam_rule``, ...), compiled
into this driver, so a touched row ends exactly as a dense update of that row would leave it.

Lazy semantics (as MXNet's ``lazy_update`` and ``torch.optim.SparseAdam``): the state of an
untouched row does not change — momentum does not decay, Adam's moments are not updated,
weight decay is not applied — and the update count (Adam's and AdaMax's ``t``, for the bias
correction) is the table's: it goes up by one per update of the table, whichever rows it
touches. A dense update with a gradient that is zero outside the rows would instead decay
every row's state (and move its values by momentum and weight decay).

``ids`` must be strictly increasing (sorted, no repeats: the server sums the rows of one id
first) and inside the table; a kernel checks both before writing anything. The per-method
wrappers take the arguments of :mod:`paramserver.kernels`' (one segment: scalars), with
``ids`` and ``dim`` in place of ``offsets``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from llvmlite import ir as llvm_ir
from numba import prange, types
from numba.extending import intrinsic, register_jitable

from ..config import ParamError
from .cache import njit
from .fused import read_only, threads_for
from .rules import (
    CHUNK,
    _adadelta_rule,
    _adagrad_rule,
    _adam_inner_delta_rule,
    _adam_rule,
    _adamax_rule,
    _momentum_rule,
    _nag_mxnet_rule,
    _nesterov_rule,
    _rmsprop_rule,
    _sgd_rule,
)

__all__ = ["adadelta", "adagrad", "adam", "adamax", "check_rows", "id_order",
           "merge_rows", "nesterov", "replace", "rmsprop", "sgd", "sum_rows_in_order",
           "warmup"]

_NUM_PARAMS = 5
_NUM_COEFS = 4

# ---------------------------------------------------------------------------------------------
# The driver. ``_row_kernel(rule, nstate)`` makes
#
#     kernel(w, g, h, u, x, ids, dim, coef, hyp, clip, check) -> int
#
# with ``coef = (gscale, wd, k0, k1, k2, k3)`` and ``hyp = (clip_low, clip_high, p0, ..., p4)`` of
# the data type. ``w`` (and ``h``, ``u``, ``x``) are the table flat, ``g`` the rows flat. It first
# checks ``ids`` (strictly increasing, inside the table), returning -1 before anything is
# written when they are not. Work items are runs of rows of about CHUNK values, in parallel;
# the inner loop over one row's ``dim`` values is the dense kernel's loop body, vectorised.
# With ``check``, a read-only pass over ``g`` first returns its count of NaN and Inf when there
# are any (nothing written), as the dense kernels do.
#
# The touched rows of a large table lie far apart in memory, and a row's write (and its state's)
# waited on memory before the next row began. Each work item asks for the lines of the row
# ``_AHEAD`` rows on (LLVM's prefetch, a hint) as it writes one. Measured with 4,096 and 16,384
# rows of 64 in a table of 1M, one thread, medians of 5 alternating rounds: the replacement
# 0.39 -> 0.24 ms and 1.61 -> 0.94 ms, Adam 1.69 -> 0.91 ms and 6.8 -> 4.2 ms; two threads,
# after / before 0.60-0.72 (benchmarks/results/row_kernels-prefetch-merge-ab-2026-11-29.txt).


def _prefetch_of(typingctx, a, i):  # type: ignore[no-untyped-def]
    """LLVM's prefetch of element ``i`` of a 1-D array, for writing, into every cache level:
    a hint, nothing read or written (an address outside the array does not fault)."""
    if not isinstance(a, types.Array) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i8p = llvm_ir.IntType(8).as_pointer()
        i32 = llvm_ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [i8p], llvm_ir.FunctionType(llvm_ir.VoidType(), [i8p, i32, i32, i32]))
        address = builder.bitcast(builder.gep(data, [args[1]]), i8p)
        builder.call(fn, [address, i32(1), i32(3), i32(1)])  # write, keep in every cache, data
        return context.get_dummy_value()

    return types.void(a, i), codegen


_prefetch_write: Any = intrinsic(_prefetch_of)
#: Rows ahead whose lines a row kernel asks for before it reaches them, and the most lines
#: of one row it asks for (a longer row's next lines the processor's own prefetcher fetches).
_AHEAD = 8
_AHEAD_LINES = 8


@register_jitable
def _prefetch_row(a, base, dim):  # type: ignore[no-untyped-def]
    """Ask for the first lines of a row of ``a`` (from ``base``, ``dim`` values) ahead of
    writing it. Not the intrinsic itself in a kernel's closure: numba keys a cached kernel
    by its closure's pickle, which an intrinsic's differs in each process."""
    step = max(1, 64 // a.itemsize)
    for q in range(0, min(dim, _AHEAD_LINES * step), step):
        _prefetch_write(a, base + q)


def _row_kernel(rule: Callable[..., Any], nstate: int, name: str, clip_at: int = 0) -> Any:
    def kernel(w, g, h, u, x, ids, dim, coef, hyp, clip, check):  # type: ignore[no-untyped-def]
        n = ids.shape[0]
        num_rows = w.shape[0] // dim if dim > 0 else 0
        last = -1
        for r in range(n):
            i = ids[r]
            if i <= last or i >= num_rows:
                return -1
            last = i
        per = max(1, CHUNK // max(dim, 1))  # rows per work item
        items = (n + per - 1) // per
        if check:
            found = 0
            for c in prange(items):
                count = 0
                for r in range(c * per, min(c * per + per, n)):
                    gr = g[r * dim:r * dim + dim]
                    for j in range(dim):
                        z = gr[j] - gr[j]
                        count += z != z
                found += count
            if found > 0:
                return found
        clip_low = hyp[0]
        clip_high = hyp[1]
        p = (hyp[2], hyp[3], hyp[4], hyp[5], hyp[6])
        gscale = coef[0]
        wd = coef[1]
        k = (coef[2], coef[3], coef[4], coef[5])
        nonfinite = 0
        for c in prange(items):
            bad = 0
            end = min(c * per + per, n)
            for r in range(c * per, end):
                if r + _AHEAD < end:  # the rows' lines are far apart: ask for them early
                    ahead = ids[r + _AHEAD] * dim
                    _prefetch_row(w, ahead, dim)
                    if nstate >= 1:
                        _prefetch_row(h, ahead, dim)
                    if nstate >= 2:
                        _prefetch_row(u, ahead, dim)
                    if nstate >= 3:
                        _prefetch_row(x, ahead, dim)
                base = ids[r] * dim
                ws = w[base:base + dim]
                gs = g[r * dim:r * dim + dim]
                hs = h[base:base + dim] if nstate >= 1 else h
                us = u[base:base + dim] if nstate >= 2 else u
                xs = x[base:base + dim] if nstate >= 3 else x
                for j in range(dim):
                    gi = gs[j]
                    d = gi - gi
                    bad += d != d
                    if clip and clip_at == 0:
                        gi = min(max(gi, clip_low), clip_high)
                    gi = gi * gscale
                    if clip and clip_at == 1:
                        gi = min(max(gi, clip_low), clip_high)
                    wi = ws[j]
                    if wd > 0:
                        gi = gi + wd * wi
                    if clip and clip_at == 2:
                        gi = min(max(gi, clip_low), clip_high)
                    hi = hs[j] if nstate >= 1 else gi
                    ui = us[j] if nstate >= 2 else gi
                    xi = xs[j] if nstate >= 3 else gi
                    wi, hi, ui, xi = rule(wi, gi, hi, ui, xi, k, p)
                    ws[j] = wi
                    if nstate >= 1:
                        hs[j] = hi
                    if nstate >= 2:
                        us[j] = ui
                    if nstate >= 3:
                        xs[j] = xi
            nonfinite += bad
        return nonfinite

    kernel.__name__ = kernel.__qualname__ = name
    made = njit(nogil=True, parallel=True, cache=True, fastmath=False,
                error_model="numpy")(kernel)
    _MADE[name, clip_at] = made
    _RULE_OF[made] = (rule, nstate, name)
    return made


_MADE: dict[tuple[str, int], Any] = {}
_RULE_OF: dict[Any, tuple[Callable[..., Any], int, str]] = {}
_making = threading.Lock()


def _variant(kernel: Any, clip_at: int) -> Any:
    """``kernel``'s driver with the clip at ``clip_at`` (:data:`~.kernels.CLIP_SCALED`, ...:
    MXNet's orders), made on first use."""
    if clip_at == 0:
        return kernel
    rule, nstate, name = _RULE_OF[kernel]
    found = _MADE.get((name, clip_at))
    if found is None:
        with _making:
            found = _MADE.get((name, clip_at))
            if found is None:
                found = _row_kernel(rule, nstate, f"{name}_clip{clip_at}", clip_at)
                _MADE[name, clip_at] = found
    return found


@register_jitable(inline="always")
def _replace_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # no update method (MXNet's store without an optimizer): the row becomes the gradient
    return g, h, u, x


_replace_rows = _row_kernel(_replace_rule, 0, "_replace_rows")
_sgd_rows = _row_kernel(_sgd_rule, 0, "_sgd_rows")
_momentum_rows = _row_kernel(_momentum_rule, 1, "_momentum_rows")
_nesterov_rows = _row_kernel(_nesterov_rule, 1, "_nesterov_rows")
_nag_mxnet_rows = _row_kernel(_nag_mxnet_rule, 1, "_nag_mxnet_rows")
_adagrad_rows = _row_kernel(_adagrad_rule, 1, "_adagrad_rows")
_rmsprop_rows = _row_kernel(_rmsprop_rule, 1, "_rmsprop_rows")
_rmsprop_momentum_rows = _row_kernel(_rmsprop_rule, 2, "_rmsprop_momentum_rows")
_adadelta_rows = _row_kernel(_adadelta_rule, 2, "_adadelta_rows")
_adam_rows = _row_kernel(_adam_rule, 2, "_adam_rows")
_adam_inner_delta_rows = _row_kernel(_adam_inner_delta_rule, 2, "_adam_inner_delta_rows")
_adamax_rows = _row_kernel(_adamax_rule, 2, "_adamax_rows")


@njit(nogil=True, cache=True)
def _sum_in_order(rows, order, bounds, out):  # type: ignore[no-untyped-def]
    for k in range(bounds.shape[0] - 1):
        for q in range(bounds[k], bounds[k + 1]):
            r = order[q]
            for j in range(rows.shape[1]):
                out[k, j] += rows[r, j]


def sum_rows_in_order(rows: np.ndarray, order: np.ndarray, bounds: np.ndarray,
                      out: np.ndarray) -> None:
    """``out[k] += rows[order[q]]`` for ``q`` in ``bounds[k]:bounds[k + 1]``, one after the
    other: the per-id sums of a row-sparse gradient (ids sorted stably by ``order``) in the
    order the rows were given — what ``np.add.at`` computes, bit for bit, without its
    per-element dispatch (0.4 ms against 5 ms for 4,096 rows of 50)."""
    _sum_in_order(rows, order, bounds, out)


@njit(nogil=True, cache=True)
def _id_order(ids, num_rows):  # type: ignore[no-untyped-def]
    # one read of the ids: -1 when one is outside [0, num_rows), else 0 when they are
    # strictly increasing, 1 when not
    order = 0
    last = -1
    for i in range(ids.shape[0]):
        v = ids[i]
        if v < 0 or v >= num_rows:
            return -1
        if v <= last:
            order = 1
        last = v
    return order


def id_order(ids: np.ndarray, num_rows: int) -> int:
    """One pass over int64 ``ids`` (1-D, contiguous): -1 when one is outside
    ``[0, num_rows)``, else 0 when they are strictly increasing and 1 when not — what a min,
    a max and a comparison of neighbours tell in three passes and three temporaries."""
    return int(_id_order(read_only(ids), np.int64(num_rows)))


@register_jitable
def _copy_row(src, r, out, n):  # type: ignore[no-untyped-def]
    # row r of src becomes row n of out; its NaN and Inf counted
    bad = 0
    for c in range(out.shape[1]):
        v = src[r, c]
        out[n, c] = v
        z = v - v
        bad += z != z
    return bad


@njit(nogil=True, cache=True)
def _merge_two(ia, ra, ib, rb, ids, out):  # type: ignore[no-untyped-def]
    # the union of two strictly increasing id lists, and per id the row of the one that has
    # it or the sum a + b; the count of NaN and Inf written comes with it
    na = ia.shape[0]
    nb = ib.shape[0]
    dim = out.shape[1]
    i = 0
    j = 0
    n = 0
    bad = 0
    while i < na or j < nb:
        if j >= nb or (i < na and ia[i] < ib[j]):
            ids[n] = ia[i]
            bad += _copy_row(ra, i, out, n)
            i += 1
        elif i >= na or ib[j] < ia[i]:
            ids[n] = ib[j]
            bad += _copy_row(rb, j, out, n)
            j += 1
        else:
            ids[n] = ia[i]
            for c in range(dim):
                v = ra[i, c] + rb[j, c]
                out[n, c] = v
                z = v - v
                bad += z != z
            i += 1
            j += 1
        n += 1
    return n, bad


def merge_rows(parts: list[tuple[np.ndarray, np.ndarray]], dim: int, dtype: Any
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """Two or more ``(ids, rows)``, each with strictly increasing int64 ids and rows of
    ``dtype``, as one: the sorted union of the ids, per id the sum of its rows in the order
    of ``parts`` (``(a + b) + c``, a part without the id left out), and the number of NaN
    and Inf in the sums. A merge, one pass per part after the first, where sorting the
    concatenated ids took a sort, its inverse, a stable argsort and a search (and two
    copies) first: 45 against 315 µs for two parts of 2,048 rows of 64."""
    if len(parts) < 2:
        raise ParamError(f"merge_rows needs two parts or more, not {len(parts)}")
    ids, rows = parts[0]
    rows = rows.reshape(ids.size, dim)
    bad = 0
    for ib, rb in parts[1:]:
        union = np.empty(ids.size + ib.size, np.int64)
        out = np.empty((union.size, dim), dtype)
        n, bad = _merge_two(read_only(ids), read_only(rows), read_only(ib),
                            read_only(rb.reshape(ib.size, dim)), union, out)
        ids, rows = union[:n], out[:n]
    return ids, rows, bad


# ---------------------------------------------------------------------------------------------
# The Python side: check the arrays, round the coefficients to the data type, launch.


def check_rows(ids: Any, num_rows: int, where: str = "row ids") -> np.ndarray:
    """``ids`` as int64, checked strictly increasing and inside ``[0, num_rows)``."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ParamError(f"{where} must be a 1-D array of integers, not {arr.dtype} of shape "
                         f"{arr.shape}")
    arr = np.ascontiguousarray(arr, np.int64)
    if arr.size and id_order(arr, num_rows) != 0:
        bad = arr[(arr < 0) | (arr >= num_rows)]
        what = (f"{int(bad[0])} is outside the table's rows [0, {num_rows})" if bad.size
                else "they are not strictly increasing (sorted, each row once)")
        raise ParamError(f"{where}: {what}")
    return arr


def _launch(kernel: Any, w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int,
            states: dict[str, np.ndarray], gscale: float, wd: float, k: tuple[float, ...],
            p: tuple[float, ...], clip_low: float, clip_high: float, check: bool,
            clip_at: int = 0) -> int:
    if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64):
        raise ParamError(f"w must be a float32 or float64 numpy array, not {type(w).__name__}")
    dtype = w.dtype
    if isinstance(dim, bool) or int(dim) < 1 or w.ndim != 1 or w.shape[0] % int(dim):
        raise ParamError(f"dim must be an integer >= 1 that divides len(w) = {w.size}, not "
                         f"{dim!r}")
    dim = int(dim)
    ids = np.ascontiguousarray(ids, np.int64)  # type: ignore[arg-type]
    if ids.ndim != 1:
        raise ParamError(f"ids must be 1-D, not of shape {ids.shape}")
    for role, a in (("w", w), *states.items()):
        if (not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != w.shape
                or not a.flags.c_contiguous or not a.flags.writeable):
            raise ParamError(f"{role} must be a writeable, C-contiguous 1-D {dtype} array of "
                             f"w's length {w.shape[0]}")
    if (not isinstance(g, np.ndarray) or g.dtype != dtype
            or g.size != ids.size * dim or not g.flags.c_contiguous):
        raise ParamError(f"the rows must be a C-contiguous {dtype} array of {ids.size} × {dim} "
                         f"values, not {getattr(g, 'dtype', type(g).__name__)} of shape "
                         f"{getattr(g, 'shape', '?')}")
    gv = read_only(g.reshape(-1))
    coef = np.zeros(2 + _NUM_COEFS, dtype)
    coef[:2 + len(k)] = (gscale, wd, *k)
    hyp = np.zeros(2 + _NUM_PARAMS, dtype)
    hyp[:2 + len(p)] = (clip_low, clip_high, *p)
    h, u, x = (*states.values(), w[:0], w[:0], w[:0])[:3]
    kernel = _variant(kernel, clip_at)
    with threads_for(ids.size * dim):
        found = int(kernel(w, gv, h, u, x, ids, np.int64(dim), coef, hyp,
                           bool(clip_high > clip_low), bool(check)))
    if found < 0:
        check_rows(ids, w.shape[0] // dim)  # says which
        raise AssertionError("unreachable")
    return found


def _f(x: Any) -> float:
    return float(np.asarray(x, np.float64))


def sgd(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, h: np.ndarray,
        lr: float, wd: float = 0.0, gscale: float = 1.0, *, momentum: float = 0.0,
        dampening: float = 0.0, torch_form: bool = False, clip_low: float = 0.0,
        clip_high: float = 0.0, check: bool = False, clip_at: int = 0) -> int:
    """SGD on rows ``ids`` of the table ``w`` (``num_rows × dim`` flat): as
    :func:`paramserver.kernels.sgd`; ``h`` is not touched (may be empty) without momentum.

    Args:
      w: the table's values, flat; rows ``ids`` updated in place.
      g: one row of ``dim`` gradient values per id (``len(ids) × dim``); only read.
      ids: strictly increasing row indices.
      dim: values per row.
      h: the momentum history, the table's shape.
      lr, wd, gscale: learning rate (times ``lr_scale``), weight decay (times ``wd_scale``),
        gradient scale.
      momentum, dampening, torch_form, clip_low, clip_high, check: as the dense kernel's
        (``dampening`` one number: the table's).

    Returns:
      The number of NaN or Inf gradient values (nothing written with ``check`` when > 0).
    """
    if momentum > 0:
        keep = 1.0 - _f(dampening)
        k = (-keep, -_f(lr)) if torch_form else (_f(lr) * keep, 1.0)
        return _launch(_momentum_rows, w, g, ids, dim, {"h": h}, gscale, wd, k,
                       (momentum,), clip_low, clip_high, check, clip_at)
    return _launch(_sgd_rows, w, g, ids, dim, {}, gscale, wd, (_f(lr),), (), clip_low,
                   clip_high, check, clip_at)


def replace(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, gscale: float = 1.0,
            *, check: bool = False) -> int:
    """Rows ``ids`` of the table ``w`` become the rows ``g`` times ``gscale`` (no update
    method): in one parallel pass, which also counts the NaN and Inf it wrote (with
    ``check``, a read-only pass first: nothing written when there are any). A kernel, not
    NumPy's ``w[ids] = g``, whose row copies wait on memory one after the other (measured,
    4,096 rows of 64 in a table of 1M, 7 interleaved rounds: 0.35 against 0.44 ms, the
    rounds' ratios 0.58–0.88)."""
    return _launch(_replace_rows, w, g, ids, dim, {}, gscale, 0.0, (), (), 0.0, 0.0, check)


def nesterov(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, h: np.ndarray,
             lr: float, wd: float = 0.0, gscale: float = 1.0, *, momentum: float,
             torch_form: bool = False, mxnet: bool = False, clip_low: float = 0.0,
             clip_high: float = 0.0, check: bool = False, clip_at: int = 0) -> int:
    """Nesterov on rows ``ids``: as :func:`paramserver.kernels.nesterov` (see :func:`sgd`)."""
    if mxnet:
        return _launch(_nag_mxnet_rows, w, g, ids, dim, {"h": h}, gscale, wd,
                       (_f(lr), _f(lr) * _f(wd)), (momentum, 1.0 + momentum), clip_low,
                       clip_high, check, clip_at)
    return _launch(_nesterov_rows, w, g, ids, dim, {"h": h}, gscale, wd,
                   (1.0, _f(lr)) if torch_form else (_f(lr), 1.0),
                   (momentum, 1.0 + momentum), clip_low, clip_high, check, clip_at)


def adagrad(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, h: np.ndarray,
            lr: float, wd: float = 0.0, gscale: float = 1.0, *, delta: float = 1e-8,
            torch_form: bool = False, decoupled: bool = False, clip_low: float = 0.0,
            clip_high: float = 0.0, check: bool = False, clip_at: int = 0) -> int:
    """AdaGrad on rows ``ids``: as :func:`paramserver.kernels.adagrad` (see :func:`sgd`)."""
    coupled_wd, decay = _decay(lr, wd, decoupled)
    return _launch(_adagrad_rows, w, g, ids, dim, {"h": h}, gscale, coupled_wd,
                   (_f(lr), decay), (0.0, delta) if torch_form else (delta, 0.0), clip_low,
                   clip_high, check, clip_at)


def rmsprop(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, h: np.ndarray,
            lr: float, wd: float = 0.0, gscale: float = 1.0, *, rho: float,
            delta: float = 1e-8, torch_form: bool = False, momentum: float = 0.0,
            u: np.ndarray | None = None, clip_low: float = 0.0, clip_high: float = 0.0,
            check: bool = False, clip_at: int = 0) -> int:
    """RMSProp on rows ``ids``: as :func:`paramserver.kernels.rmsprop` (see :func:`sgd`;
    ``u`` torch's momentum buffer, the table's shape)."""
    inner, outer = (0.0, delta) if torch_form else (delta, 0.0)
    if momentum > 0:
        if u is None or not torch_form:
            raise ParamError("RMSProp's momentum is torch.optim's: it needs torch_form and "
                             "the momentum buffer u")
        return _launch(_rmsprop_momentum_rows, w, g, ids, dim, {"h": h, "u": u}, gscale, wd,
                       (_f(lr),), (rho, 1.0 - rho, inner, outer, momentum), clip_low,
                       clip_high, check, clip_at)
    return _launch(_rmsprop_rows, w, g, ids, dim, {"h": h}, gscale, wd, (_f(lr),),
                   (rho, 1.0 - rho, inner, outer, 0.0), clip_low, clip_high, check, clip_at)


def adadelta(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, h: np.ndarray,
             u: np.ndarray, lr: float, wd: float = 0.0, gscale: float = 1.0, *, rho: float,
             delta: float = 1e-8, decoupled: bool = False, clip_low: float = 0.0,
             clip_high: float = 0.0, check: bool = False, clip_at: int = 0) -> int:
    """AdaDelta on rows ``ids``: as :func:`paramserver.kernels.adadelta` (see :func:`sgd`)."""
    coupled_wd, decay = _decay(lr, wd, decoupled)
    return _launch(_adadelta_rows, w, g, ids, dim, {"h": h, "u": u}, gscale, coupled_wd,
                   (_f(lr), decay), (rho, 1.0 - rho, delta), clip_low, clip_high, check,
                   clip_at)


def _decay(lr: float, wd: float, decoupled: bool) -> tuple[float, float]:
    """``(weight decay added to the gradient, factor on w before the step)``."""
    return (0.0, 1.0 - _f(lr) * _f(wd)) if decoupled else (_f(wd), 1.0)


def _bias(beta: float, t: float) -> float:
    """``1 - beta^t``, accurately for small ``t·log(beta)`` (as the dense wrappers)."""
    return float(-np.expm1(t * np.log(beta)))


def adam(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, m: np.ndarray,
         v: np.ndarray, lr: float, wd: float = 0.0, gscale: float = 1.0, *, step: float,
         beta1: float = 0.9, beta2: float = 0.999, delta: float = 1e-8,
         decoupled: bool = False, bias_correction: bool = True,
         delta_before_correction: bool = False, clip_low: float = 0.0,
         clip_high: float = 0.0, check: bool = False, clip_at: int = 0) -> int:
    """Adam / AdamW on rows ``ids``: as :func:`paramserver.kernels.adam` (see :func:`sgd`);
    ``step`` is the table's update count (this update's number, >= 1). With
    ``delta_before_correction``, torch.optim.SparseAdam's placement of delta."""
    lr64 = _f(lr)
    if bias_correction:
        t = _step(step)
        a = lr64 / _bias(beta1, t) if beta1 > 0 else lr64
        b = 1.0 / np.sqrt(_bias(beta2, t)) if beta2 > 0 else 1.0
        if delta_before_correction:
            a, b = a / b, 1.0
    else:
        a, b = lr64, 1.0
    coupled_wd, decay = _decay(lr64, wd, decoupled)
    return _launch(_adam_rows if bias_correction else _adam_inner_delta_rows, w, g, ids, dim,
                   {"m": m, "v": v}, gscale, coupled_wd, (a, float(b), decay),
                   (beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta), clip_low, clip_high,
                   check, clip_at)


def adamax(w: np.ndarray, g: np.ndarray, ids: npt.ArrayLike, dim: int, m: np.ndarray,
           u: np.ndarray, lr: float, wd: float = 0.0, gscale: float = 1.0, *, step: float,
           beta1: float = 0.9, beta2: float = 0.999, delta: float = 1e-8,
           bias_correction: bool = True, clip_low: float = 0.0, clip_high: float = 0.0,
           check: bool = False, clip_at: int = 0) -> int:
    """AdaMax on rows ``ids``: as :func:`paramserver.kernels.adamax` (see :func:`sgd`)."""
    lr64 = _f(lr)
    if bias_correction:
        t = _step(step)
        a = lr64 / _bias(beta1, t) if beta1 > 0 else lr64
        inner, outer = delta, 0.0
    else:
        a, inner, outer = lr64, 0.0, delta
    return _launch(_adamax_rows, w, g, ids, dim, {"m": m, "u": u}, gscale, wd, (a,),
                   (beta1, 1.0 - beta1, beta2, inner, outer), clip_low, clip_high, check, clip_at)


def _step(step: Any) -> float:
    t = _f(step)
    if not t >= 1:
        raise ParamError(f"step must be >= 1 (the number of this update), got {step!r}")
    return t


def warmup(dtype: npt.DTypeLike = np.float32) -> None:
    """Compile, or load from numba's cache, every row kernel for ``dtype``."""
    w = np.zeros(2, dtype)
    g = np.zeros(1, dtype)
    ids = np.zeros(1, np.int64)
    id_order(ids, 2)
    merge_rows([(ids, g), (ids, g)], 1, dtype)
    replace(w, g, ids, 1)
    sgd(w, g, ids, 1, w[:0], 0.0)
    sgd(w, g, ids, 1, w.copy(), 0.0, momentum=0.5)
    nesterov(w, g, ids, 1, w.copy(), 0.0, momentum=0.5)
    adagrad(w, g, ids, 1, w.copy(), 0.0)
    rmsprop(w, g, ids, 1, w.copy(), 0.0, rho=0.9)
    rmsprop(w, g, ids, 1, w.copy(), 0.0, rho=0.9, torch_form=True, momentum=0.5, u=w.copy())
    adadelta(w, g, ids, 1, w.copy(), w.copy(), 0.0, rho=0.9)
    adam(w, g, ids, 1, w.copy(), w.copy(), 0.0, step=1)
    adam(w, g, ids, 1, w.copy(), w.copy(), 0.0, step=1, bias_correction=False)
    adamax(w, g, ids, 1, w.copy(), w.copy(), 0.0, step=1)
