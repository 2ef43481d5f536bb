"""The passes over memory the cluster adds to the updater's kernel.

- :func:`all_finite`: whether a gradient holds no NaN or Inf — one parallel, read-only pass
  that counts the values whose exponent bits are all set, as integers (exact, and
  vectorised without fast-math: 1 ms for 16M float32 values where a running maximum of the
  bits took 1 to 6 ms on two busy cores);
- :func:`nonfinite_counts`: the slow, exact account for the error message, per range;
- :func:`sum_into`: ``out = a + b``, elementwise, in parallel (the fixed-order sum of
  several workers' gradients is a chain of these), counting the non-finite sums in the same
  pass (so a sum's check for NaN, Inf and overflow costs nothing);
- :func:`sum_rows`: the rows of several workers' row-sparse gradients summed per id, in worker
  order (a fixed order: the same sum on every run and backend);
- :func:`kernel_guard`: numba's ``workqueue`` threading layer aborts the process when two
  threads launch parallel kernels at once; under it every kernel launch of the cluster is
  serialised (``omp`` and ``tbb`` are thread-safe and run unguarded).

numba is imported, and the kernels (:mod:`paramserver.numerics`) compiled or loaded from the
cache, on first use.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..config.job import ClusterConf

#: Below this many elements a parallel launch costs more than the work: NumPy does it.
_SMALL = 1 << 16
_launch_lock = threading.RLock()  # re-entered when a guarded call checks or sums inside
_guarded: bool | None = None


def kernel_guard() -> contextlib.AbstractContextManager[Any]:
    """Serialise parallel kernel launches where numba's threading layer needs it: the
    launch lock there, else a shared empty context (this is on every update call).

    Until numba is loaded the layer is not asked (asking would load numba, 55 MB, in a job
    whose calls all take their NumPy forms): the lock is taken meanwhile, so that the call
    that loads numba, and launches the process's first parallel kernel, is serialised too."""
    global _guarded
    if _guarded is None:
        if "numba" not in sys.modules:
            return _launch_lock
        from ..numerics.cache import threading_layer

        _guarded = threading_layer() == "workqueue"
    return _launch_lock if _guarded else _UNGUARDED


_UNGUARDED = contextlib.nullcontext()


def workers_check(conf: ClusterConf) -> bool:
    """Whether each worker reads its gradients for NaN and Inf before it pushes them.

    Under ``skip``, always: a push is dropped before anything is written. Under ``error``,
    when a group has several servers: a server sees only its own range, and one server's
    refusal alone would leave the other servers' ranges updated; a worker's check (the same
    bytes as the servers' checks together) refuses the step before any server has it. With
    one server, the server checks, in the sum of several gradients (free) or in its update
    call (one worker)."""
    return conf.nonfinite == "skip" or conf.nservers_per_group > 1


def all_finite(x: np.ndarray) -> bool:
    """Whether a 1-D float32/float64 array holds no NaN and no Inf (integers always)."""
    if x.dtype.kind in "iu":
        return True
    if x.size < _SMALL:
        return bool(np.isfinite(x).all())
    from ..numerics.kernels import count_nonfinite

    with kernel_guard():
        return count_nonfinite(x) == 0


def nonfinite_counts(x: np.ndarray) -> tuple[int, int]:
    """The numbers of NaN and of ±Inf in ``x`` (slow; for messages)."""
    return int(np.count_nonzero(np.isnan(x))), int(np.count_nonzero(np.isinf(x)))


def nonfinite_text(x: np.ndarray) -> str:
    """The NaN and Inf of ``x`` as messages name them (``"2 NaN, 1 Inf"``); empty when
    there are none."""
    return ", ".join(f"{n} {kind}" for n, kind in zip(nonfinite_counts(x), ("NaN", "Inf"))
                     if n)


def sum_into(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> int:
    """``out[i] = a[i] + b[i]`` in the arrays' precision; ``out`` may be ``a``. Returns the
    number of sums that are NaN or Inf (an input was, or the sum overflowed)."""
    if out.size < _SMALL:
        with np.errstate(over="ignore", invalid="ignore"):  # counted, and said, by the caller
            np.add(a, b, out=out)
        return int(out.size - np.count_nonzero(np.isfinite(out)))
    from ..numerics import sums
    from ..numerics.fused import threads_for

    with kernel_guard(), threads_for(out.size, sums.CHUNK):
        return sums.add(out, a, b)


def sum_all(out: np.ndarray, parts: list[np.ndarray]) -> int:
    """``out = ((p0 + p1) + p2) + ...`` in the arrays' precision (two parts or more; the
    order fixed, so the sum is the same bit for bit wherever it is made). Returns the
    number of NaN and Inf in the sum (a non-finite part or partial sum stays so)."""
    bad = sum_into(out, parts[0], parts[1])
    for p in parts[2:]:
        bad = sum_into(out, out, p)
    return bad


def sum_rows(parts: list[tuple[np.ndarray, np.ndarray]], dim: int, dtype: Any
             ) -> tuple[np.ndarray, np.ndarray, bool]:
    """Several ``(ids, rows)`` (each with strictly increasing int64 ids, rows of ``dtype``)
    as one: the sorted union of the ids, per id the sum of its rows in the order of
    ``parts`` (``((a + b) + c)``), and whether the sums are all finite (counted as they are
    written: :func:`~paramserver.numerics.rows.merge_rows`)."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros((0, dim), dtype), True
    if len(parts) == 1:
        ids, rows = parts[0]
        return ids, rows.reshape(len(ids), dim), all_finite(rows.reshape(-1))
    from ..numerics.rows import merge_rows

    ids, rows, bad = merge_rows(parts, dim, dtype)
    return ids, rows, bad == 0


__all__ = ["all_finite", "kernel_guard", "nonfinite_counts", "nonfinite_text", "sum_all",
           "sum_into", "sum_rows", "workers_check"]
