"""The global L2 norm of gradients, for clipping by norm (``clip_norm``, SPEC §5 beyond SINGA).

:func:`sum_squares` is one range's part of the squared norm: the sum of ``(clip(g) * gscale)²``
over segments, each with its own ``gscale`` (the mean of shared gradients), in one parallel pass
that reads each gradient element once, accumulates in float64 and releases the GIL. Parts of
several ranges (the runs of an optimizer, the servers of a cluster) add up to the whole;
:func:`clip_factor` turns the norm into the factor every gradient is multiplied by.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import prange

from ..config import ParamError
from .cache import njit

#: Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does.
NORM_EPS = 1e-6

#: Elements per parallel work item; ranges below :data:`_PARALLEL_FROM` run on one thread (a
#: parallel region on a busy machine costs more than the pass).
_CHUNK = 1 << 16
_PARALLEL_FROM = 1 << 20


def _sum_squares_body(g, offsets, first, gscale, lo, hi, clip):  # type: ignore[no-untyped-def]
    n = g.shape[0]
    total = 0.0
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        pos = c * _CHUNK
        stop = min(pos + _CHUNK, n)
        s = first[c]
        acc = 0.0
        while pos < stop:
            end = min(offsets[s + 1], stop)
            part = 0.0
            for i in range(pos, end):
                x = np.float64(g[i])
                if clip:
                    x = min(max(x, lo), hi)
                part += x * x
            acc += part * gscale[s] * gscale[s]
            pos = end
            s += 1
        total += acc
    return total


_parallel = njit(nogil=True, parallel=True, cache=True)(_sum_squares_body)
_serial = njit(nogil=True, parallel=False, cache=True)(_sum_squares_body)


def sum_squares(g: np.ndarray, offsets: npt.ArrayLike, gscale: npt.ArrayLike = 1.0,
                clip_low: float = 0.0, clip_high: float = 0.0) -> float:
    """``Σ (clip(g) · gscale)²`` over a range cut into segments at ``offsets``.

    Args:
        g: 1-D gradients (float32 or float64, C-contiguous); only read.
        offsets: int64 segment boundaries from 0 to ``len(g)``, non-decreasing.
        gscale: per segment (or one number), the factor the update multiplies the gradient by.
        clip_low, clip_high: each element is first clamped into this range when
            ``clip_high > clip_low`` (as the update does).

    Returns:
        The sum, in float64 (NaN or Inf when a gradient element is).
    """
    if not isinstance(g, np.ndarray) or g.dtype not in (np.float32, np.float64) or g.ndim != 1:
        raise ParamError("gradients must be a 1-D float32 or float64 numpy array")
    g = np.ascontiguousarray(g)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 1 or off[0] != 0 or off[-1] != g.size or np.any(
            np.diff(off) < 0):
        raise ParamError(f"offsets must be non-decreasing from 0 to {g.size}")
    nseg = off.size - 1
    scale = np.ascontiguousarray(np.broadcast_to(np.asarray(gscale, np.float64), (nseg,)))
    starts = np.arange(0, g.size, _CHUNK, dtype=np.int64)
    first = np.searchsorted(off, starts, side="right").astype(np.int64) - 1
    kernel = _parallel if g.size >= _PARALLEL_FROM else _serial
    return float(kernel(g, off, first, scale, float(clip_low), float(clip_high),
                        bool(clip_high > clip_low)))


def clip_factor(norm: float, clip_norm: float) -> float:
    """``min(1, clip_norm / (norm + 1e-6))``: what every gradient is multiplied by.

    1 when clipping is off (``clip_norm`` 0) or the norm is not finite: a NaN or Inf gradient
    is left to the update's own check, not spread to every value.
    """
    if not clip_norm > 0 or not math.isfinite(norm):
        return 1.0
    return min(1.0, clip_norm / (norm + NORM_EPS))


__all__ = ["NORM_EPS", "clip_factor", "sum_squares"]
