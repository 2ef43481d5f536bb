"""The cluster's elementwise sum of two gradients, counting what is not finite in the same pass.

:func:`add` is ``out = a + b`` over 1-D float arrays in chunks of :data:`CHUNK` run in parallel;
it returns the number of sums that are NaN or Inf (an input was, or the sum overflowed), so a
sum's check costs nothing beyond the sum.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .cache import njit

#: Elements per parallel task.
CHUNK = 1 << 15


@njit(parallel=True, nogil=True, cache=True)
def _add(out, a, b):  # type: ignore[no-untyped-def]
    n = out.shape[0]
    bad = 0
    for c in prange((n + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        hi = min(lo + CHUNK, n)
        o = out[lo:hi]
        x = a[lo:hi]
        y = b[lo:hi]
        count = 0
        for i in range(hi - lo):
            s = x[i] + y[i]
            o[i] = s
            d = s - s  # 0, or NaN for an Inf or NaN sum
            count += d != d
        bad += count
    return bad


def add(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> int:
    """``out[i] = a[i] + b[i]`` (``out`` may be ``a``); the number of non-finite sums. The
    caller chooses the thread count (:func:`~paramserver.numerics.fused.threads_for`)."""
    return int(_add(out, a, b))


__all__ = ["CHUNK", "add"]
