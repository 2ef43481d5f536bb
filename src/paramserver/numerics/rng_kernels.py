"""The compiled side of :mod:`.rng`: Philox4x32-10, the ziggurat, the inverse normal CDF,
and the fillers that write a stream's values into an array (numba).

:mod:`.rng` checks a fill's arguments and calls :func:`run`; the layout of the streams and
the distributions are described there. This module is imported (and numba with it) on the
first fill that writes values, so that a program that only checks a job's initialisation
(``paramserver check``) never loads numba.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import prange

from .cache import njit
from .rng_arrays import FEW_SEGMENTS

__all__ = ["NORMAL", "TRUNCATED", "UNIFORM", "constant_segments", "run", "run_segments"]

# ---------------------------------------------------------------------------------------------
# Philox4x32-10

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = np.uint64(0x9E3779B9)
_PHILOX_W1 = np.uint64(0xBB67AE85)
_ZERO = np.uint64(0)


@njit(inline="always")
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0..c3) under key (k0, k1); all uint64 holding 32 bits."""
    for _ in range(10):
        p0 = _PHILOX_M0 * c0
        p1 = _PHILOX_M1 * c2
        c0 = (p1 >> _S32) ^ c1 ^ k0
        c1 = p1 & _M32
        c2 = (p0 >> _S32) ^ c3 ^ k1
        c3 = p0 & _M32
        k0 = (k0 + _PHILOX_W0) & _M32
        k1 = (k1 + _PHILOX_W1) & _M32
    return c0, c1, c2, c3


@njit(nogil=True, cache=True)
def _philox_block(c0, c1, c2, c3, k0, k1):
    """:func:`_philox` as a function of its own, for the scalar (rare or edge) draws."""
    return _philox(c0, c1, c2, c3, k0, k1)


@njit(nogil=True, cache=True)
def _bulk_bits(k0, k1, i, is32):
    """The bits of stream element ``i``: 32 for a float32 fill, 64 for a float64 one."""
    iu = np.uint64(i)
    if is32:  # word i % 4 of block i // 4
        j = iu >> np.uint64(2)
        r = _philox_block(j & _M32, j >> _S32, _ZERO, _ZERO, k0, k1)
        return r[i & 3]
    j = iu >> np.uint64(1)  # words 2·(i % 2) (low half) and 2·(i % 2) + 1 of block i // 2
    r = _philox_block(j & _M32, j >> _S32, _ZERO, _ZERO, k0, k1)
    if i & 1:
        return r[2] | (r[3] << _S32)
    return r[0] | (r[1] << _S32)


@njit(inline="always")
def _element_block(k0, k1, i, attempt, stage, rnd):
    """Per-element block (i, attempt, rnd·2¹⁶ + stage), stage ≥ 1; as two 64-bit values."""
    iu = np.uint64(i)
    r = _philox_block(iu & _M32, iu >> _S32, np.uint64(attempt) & _M32,
                      ((np.uint64(rnd) << np.uint64(16)) | np.uint64(stage)) & _M32, k0, k1)
    return r[0] | (r[1] << _S32), r[2] | (r[3] << _S32)


@njit(inline="always")
def _unit53(bits):
    """A float64 in [0, 1) from the top 53 of 64 bits."""
    return np.float64(np.int64(bits >> np.uint64(11))) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------------------------------------
# Ziggurat (256 layers, Marsaglia & Tsang 2000)

_ZIG_R = 3.6541528853610088  # right edge of the base layer
_ZIG_V = 0.00492867323399  # area of every layer


def _ziggurat_tables() -> tuple[np.ndarray, ...]:
    x = np.zeros(256)  # right edges of the layers; x[0] = 0 stands for the top of layer 1
    x[255] = _ZIG_R
    for i in range(254, 0, -1):
        x[i] = math.sqrt(-2.0 * math.log(_ZIG_V / x[i + 1] + math.exp(-0.5 * x[i + 1] ** 2)))
    width = x.copy()
    width[0] = _ZIG_V / math.exp(-0.5 * _ZIG_R**2)  # the base layer, its tail included
    ratio = np.zeros(256)  # the part of each layer's box that lies under the curve for sure
    ratio[0] = _ZIG_R / width[0]
    ratio[2:] = x[1:255] / x[2:]
    f = np.exp(-0.5 * x * x)  # the density at the layers' right edges, f[0] = 1
    # Integer thresholds and scaled widths for 23-bit (float32) and 52-bit (float64) abscissae.
    k23 = np.floor(ratio * 2.0**23).astype(np.int32)
    w23 = (width / 2.0**23).astype(np.float32)
    k52 = np.floor(ratio * 2.0**52).astype(np.int64)
    w52 = width / 2.0**52
    return width, ratio, f, k23, w23, k52, w52


_ZIG_WIDTH, _ZIG_RATIO, _ZIG_F, _ZIG_K23, _ZIG_W23, _ZIG_K52, _ZIG_W52 = _ziggurat_tables()

_U8 = np.uint64(8)
_U9 = np.uint64(9)
_U12 = np.uint64(12)
_U255 = np.uint64(255)
_U1 = np.uint64(1)


@njit(inline="always")
def _normal32_fast(w, mean, std):
    """The ziggurat's fast path on 32 bits, in float32: (mean + std·z, accepted?).

    Bits 0-7 pick the layer, bit 8 the sign, bits 9-31 the abscissa (NumPy's layout).
    """
    idx = w & _U255
    u = np.int32(w >> _U9)
    z = np.float32(u) * _ZIG_W23[idx]
    sign = np.float32(1.0) - np.float32(2.0) * np.float32(np.int32((w >> _U8) & _U1))
    return mean + std * (z * sign), u < _ZIG_K23[idx]


@njit(inline="always")
def _normal64_fast(w, mean, std):
    """The ziggurat's fast path on 64 bits: (mean + std·z, accepted?).

    Bits 0-7 pick the layer, bit 8 the sign, bits 12-63 the abscissa (NumPy's layout).
    """
    idx = w & _U255
    u = np.int64(w >> _U12)
    z = np.float64(u) * _ZIG_W52[idx]
    sign = 1.0 - 2.0 * np.float64(np.int64((w >> _U8) & _U1))
    return mean + std * (z * sign), u < _ZIG_K52[idx]


@njit(nogil=True, cache=True)
def _normal_slow(k0, k1, i, rnd, first, first_is32):
    """The exact ziggurat for element ``i`` in round ``rnd``, from candidate bits ``first``.

    ``first`` is the element's bulk bits in round 0 (32 of them for float32: ``first_is32``)
    and its stage-1 block of attempt 0 in later rounds. The next candidates (stage 1 of
    attempts 1, 2, ...) and the uniforms of the wedge test (stage 2) and of the tail's own
    loop (stage 2 + t) come from per-element blocks.
    """
    w = first
    is32 = first_is32
    attempt = np.int64(0)
    while True:
        idx = np.int64(w & _U255)
        if is32:
            uf = np.float64(np.int64(w >> _U9)) * (1.0 / 8388608.0)
        else:
            uf = np.float64(np.int64(w >> _U12)) * (1.0 / 4503599627370496.0)
        z = uf * _ZIG_WIDTH[idx]
        if uf < _ZIG_RATIO[idx]:
            break
        if idx == 0:  # the tail beyond r (Marsaglia 1964)
            t = np.int64(0)
            while True:
                b0, b1 = _element_block(k0, k1, i, attempt, 2 + t, rnd)
                xt = -math.log(_unit53(b0) + 1.0 / 9007199254740992.0) / _ZIG_R
                y = -math.log(_unit53(b1) + 1.0 / 9007199254740992.0)
                if y + y > xt * xt:
                    break
                t += 1
            z = _ZIG_R + xt
            break
        b0, _ = _element_block(k0, k1, i, attempt, 2, rnd)
        y = _ZIG_F[idx] + _unit53(b0) * (_ZIG_F[idx - 1] - _ZIG_F[idx])
        if y < math.exp(-0.5 * z * z):
            break
        attempt += 1
        w, _ = _element_block(k0, k1, i, attempt, 1, rnd)
        is32 = False
    return -z if (w >> _U8) & _U1 else z


# ---------------------------------------------------------------------------------------------
# Standard normal CDF and its inverse (for narrow truncations)

_ACKLAM_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
             1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
_ACKLAM_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
             6.680131188771972e01, -1.328068155288572e01)
_ACKLAM_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
             -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
_ACKLAM_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
             3.754408661907416e00)
_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


@njit(inline="always")
def _ndtr(x):
    """Φ(x), accurate in the lower tail."""
    return 0.5 * math.erfc(-x / _SQRT2)


@njit(nogil=True, cache=True)
def _ndtri(p):
    """Φ⁻¹(p) for 0 < p < 1: Acklam's rational approximation and one Halley step.

    Computed for min(p, 1 - p) (exact for p ≥ 0.5), in the lower half, where Φ keeps its
    relative accuracy; about 1e-15 relative error.
    """
    a, b, c, d = _ACKLAM_A, _ACKLAM_B, _ACKLAM_C, _ACKLAM_D
    q = min(p, 1.0 - p)
    if q < 0.02425:
        s = math.sqrt(-2.0 * math.log(q))
        x = ((((c[0] * s + c[1]) * s + c[2]) * s + c[3]) * s + c[4]) * s + c[5]
        x /= (((d[0] * s + d[1]) * s + d[2]) * s + d[3]) * s + 1.0
    else:
        s = q - 0.5
        r = s * s
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * s
        x /= ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0
    density = math.exp(-0.5 * x * x) / _SQRT2PI
    if density > 0.0:
        e = (_ndtr(x) - q) / density
        x -= e / (1.0 + 0.5 * x * e)
    return x if p <= 0.5 else -x


# ---------------------------------------------------------------------------------------------
# Fill kernels

UNIFORM, NORMAL, TRUNCATED = 0, 1, 2  # the fill's method, as rng passes it
_CHUNK = 1 << 16  # elements per parallel task; a multiple of 4, so tasks start on blocks
_TRUNC_ROUNDS = 16  # rejection rounds before the inverse-CDF draw
_STAGE_INVERSE = 0xFFFF


@njit(inline="always")
def _uniform_value32(w, low, span, top):
    """low + span·u from the top 24 of 32 bits, rounded to float32, kept below high."""
    u = np.float64(np.int32(w >> _U8)) * (1.0 / 16777216.0)
    return min(np.float32(low + span * u), top)


@njit(inline="always")
def _uniform_value64(w, low, span, top):
    """low + span·u from the top 53 of 64 bits, kept below high."""
    return min(low + span * _unit53(w), top)


@njit(nogil=True, cache=True)
def _uniform_blocks32(out, j0, k0, k1, low, span, top):
    """Uniforms for float32 stream elements 4·j0 ...: one Philox block per four."""
    for j in range(out.size // 4):
        b = np.uint64(j0 + j)
        r0, r1, r2, r3 = _philox(b & _M32, b >> _S32, _ZERO, _ZERO, k0, k1)
        out[4 * j] = _uniform_value32(r0, low, span, top)
        out[4 * j + 1] = _uniform_value32(r1, low, span, top)
        out[4 * j + 2] = _uniform_value32(r2, low, span, top)
        out[4 * j + 3] = _uniform_value32(r3, low, span, top)


@njit(nogil=True, cache=True)
def _uniform_blocks64(out, j0, k0, k1, low, span, top):
    """Uniforms for float64 stream elements 2·j0 ...: one Philox block per two."""
    for j in range(out.size // 2):
        b = np.uint64(j0 + j)
        r0, r1, r2, r3 = _philox(b & _M32, b >> _S32, _ZERO, _ZERO, k0, k1)
        out[2 * j] = _uniform_value64(r0 | (r1 << _S32), low, span, top)
        out[2 * j + 1] = _uniform_value64(r2 | (r3 << _S32), low, span, top)


@njit(nogil=True, cache=True)
def _normal_blocks32(out, slow, j0, k0, k1, mean, std):
    """The ziggurat's fast path for float32 stream elements 4·j0 ...; ``slow`` flags misses."""
    for j in range(out.size // 4):
        b = np.uint64(j0 + j)
        r0, r1, r2, r3 = _philox(b & _M32, b >> _S32, _ZERO, _ZERO, k0, k1)
        v, ok = _normal32_fast(r0, mean, std)
        out[4 * j] = v
        slow[4 * j] = not ok
        v, ok = _normal32_fast(r1, mean, std)
        out[4 * j + 1] = v
        slow[4 * j + 1] = not ok
        v, ok = _normal32_fast(r2, mean, std)
        out[4 * j + 2] = v
        slow[4 * j + 2] = not ok
        v, ok = _normal32_fast(r3, mean, std)
        out[4 * j + 3] = v
        slow[4 * j + 3] = not ok


@njit(nogil=True, cache=True)
def _normal_blocks64(out, slow, j0, k0, k1, mean, std):
    """The ziggurat's fast path for float64 stream elements 2·j0 ...; ``slow`` flags misses."""
    for j in range(out.size // 2):
        b = np.uint64(j0 + j)
        r0, r1, r2, r3 = _philox(b & _M32, b >> _S32, _ZERO, _ZERO, k0, k1)
        v, ok = _normal64_fast(r0 | (r1 << _S32), mean, std)
        out[2 * j] = v
        slow[2 * j] = not ok
        v, ok = _normal64_fast(r2 | (r3 << _S32), mean, std)
        out[2 * j + 1] = v
        slow[2 * j + 1] = not ok


@njit(inline="always")
def _lowest_byte(w):
    """The index of the lowest nonzero byte of ``w`` (nonzero, bytes 0 or 1)."""
    low = w & (~w + _U1)
    k = 0
    if low >= np.uint64(1 << 32):
        k += 4
        low >>= _S32
    if low >= np.uint64(1 << 16):
        k += 2
        low >>= np.uint64(16)
    if low >= np.uint64(1 << 8):
        k += 1
    return k


def _jit(fn: Any, name: str, is32: bool, truncated: bool, parallel: bool) -> Any:
    """``fn`` compiled (on first call, cached), named by its variant: numba names its cache
    files by the function's name, one set per variant."""
    fn.__name__ = fn.__qualname__ = f"{name}{32 if is32 else 64}" + ("_truncated" if truncated
                                                                      else "")
    return njit(nogil=True, parallel=parallel, cache=True)(fn)


def _chunk_kernel(is32: bool, truncated: bool) -> Any:
    """The chunk filler of one output type (``is32``: float32, else float64), with the
    truncated normal's path or without it; see :func:`_fill_kernel`."""

    def chunk(out32, out64, slow, g0, k0, k1, method, prm):  # type: ignore[no-untyped-def]
        """Fill ``out32`` or ``out64`` (the other is empty) with stream elements ``g0 ...``.

        ``method`` is ``UNIFORM`` (prm: low, high - low, top64, top32), ``NORMAL`` (mean, std)
        or ``TRUNCATED`` (mean, std, a, b, inverse?, plo, pspan, mirror); ``slow`` is scratch
        for the ziggurat's misses. The block loops cover the block-aligned body; the first and
        last few elements of an unaligned range take the same arithmetic one at a time.
        """
        n = out32.size if is32 else out64.size
        per = 4 if is32 else 2  # elements per Philox block
        head = min((per - g0 % per) % per, n)
        body = head + (n - head) // per * per
        j0 = (g0 + head) // per
        if method == UNIFORM:
            low, span, top64, top32 = prm[0], prm[1], prm[2], np.float32(prm[3])
            if is32:
                _uniform_blocks32(out32[head:body], j0, k0, k1, low, span, top32)
            else:
                _uniform_blocks64(out64[head:body], j0, k0, k1, low, span, top64)
            for e in range(head + n - body):
                t = e if e < head else body + e - head
                w = _bulk_bits(k0, k1, g0 + t, is32)
                if is32:
                    out32[t] = _uniform_value32(w, low, span, top32)
                else:
                    out64[t] = _uniform_value64(w, low, span, top64)
            return
        mean, std = (prm[0], prm[1]) if method == NORMAL else (0.0, 1.0)
        mean32, std32 = np.float32(mean), np.float32(std)
        if is32:
            _normal_blocks32(out32[head:body], slow[head:body], j0, k0, k1, mean32, std32)
        else:
            _normal_blocks64(out64[head:body], slow[head:body], j0, k0, k1, mean, std)
        for e in range(head + n - body):
            t = e if e < head else body + e - head
            w = _bulk_bits(k0, k1, g0 + t, is32)
            if is32:
                v32, ok = _normal32_fast(w, mean32, std32)
                out32[t] = v32
            else:
                v64, ok = _normal64_fast(w, mean, std)
                out64[t] = v64
            slow[t] = not ok
        if method == NORMAL:
            # About one element in a hundred missed; find them eight flags (one word) at a time.
            words = slow[: n // 8 * 8].view(np.uint64)
            for q in range(words.size + 1):
                w = words[q] if q < words.size else _ZERO
                if q == words.size:  # the last n % 8 flags, as one word
                    for t in range(n - n // 8 * 8):
                        w |= np.uint64(slow[8 * q + t]) << np.uint64(8 * t)
                while w:
                    t = 8 * q + _lowest_byte(w)
                    w &= w - _U1
                    v = mean + std * _normal_slow(k0, k1, g0 + t, np.int64(0),
                                                  _bulk_bits(k0, k1, g0 + t, is32), is32)
                    if is32:
                        out32[t] = v
                    else:
                        out64[t] = v
            return
        if not truncated:
            return
        mean, std, a, b = prm[0], prm[1], prm[2], prm[3]
        inverse, plo, pspan, mirror = prm[4] != 0.0, prm[5], prm[6], prm[7] != 0.0
        for t in range(n):
            i = g0 + t
            ok = False
            z = 0.0
            if not inverse:  # the element's normal, redrawn while outside [a, b]
                if slow[t]:
                    z = _normal_slow(k0, k1, i, np.int64(0), _bulk_bits(k0, k1, i, is32), is32)
                else:
                    z = np.float64(out32[t]) if is32 else out64[t]
                ok = a <= z <= b
                rnd = np.int64(1)
                while not ok and rnd < _TRUNC_ROUNDS:
                    w, _ = _element_block(k0, k1, i, 0, 1, rnd)
                    z = _normal_slow(k0, k1, i, rnd, w, np.bool_(False))
                    ok = a <= z <= b
                    rnd += 1
            if not ok:  # the inverse CDF, in the lower tail (mirrored if the interval is above 0)
                w, _ = _element_block(k0, k1, i, 0, _STAGE_INVERSE, 0)
                u = _unit53(w) + 1.0 / 18014398509481984.0  # in (0, 1)
                z = _ndtri(plo + u * pspan)
                if mirror:
                    z = -z
                z = min(max(z, a), b)
            if is32:
                out32[t] = mean + std * z
            else:
                out64[t] = mean + std * z

    return _jit(chunk, "_chunk", is32, truncated, parallel=False)


# The chunk fillers are module globals, not closure cells of the fillers: numba keys its
# cache on a closure's contents, and a compiled function there pickles differently in every
# process (its fillers would be compiled again in each).
_chunk32 = _chunk_kernel(True, False)
_chunk32_truncated = _chunk_kernel(True, True)
_chunk64 = _chunk_kernel(False, False)
_chunk64_truncated = _chunk_kernel(False, True)


def _fill_kernel(is32: bool, truncated: bool) -> Any:
    """The parallel filler of one output type, with the truncated normal's path or without.

    ``fill(out32, out64, offset, k0, k1, method, prm)`` fills ``out32`` or ``out64`` (the
    other is empty) with stream elements ``offset ...``, in parallel over chunks at fixed
    stream positions (multiples of ``_CHUNK``); the values do not depend on the chunking,
    only the split of the work does. Compiling is most of a first fill's cost (numba's
    parallel functions compile slowly), so each variant is made and compiled on first use,
    and only for fills longer than one chunk (:func:`run` calls the chunk filler directly
    for shorter ones): a float32 job that draws uniform and normal values into large Params
    compiles one function without the float64 and truncated paths.
    """

    def fill(out32, out64, offset, k0, k1, method, prm):  # type: ignore[no-untyped-def]
        n = max(out32.size, out64.size)
        if n == 0:
            return
        c0 = offset // _CHUNK
        c1 = (offset + n - 1) // _CHUNK + 1
        for c in prange(c1 - c0):
            lo = max((c0 + c) * _CHUNK, offset) - offset
            hi = min((c0 + c + 1) * _CHUNK, offset + n) - offset
            slow = np.empty(hi - lo if method != UNIFORM else 0, np.uint8)
            a, b = out32[lo:hi], out64[lo:hi]
            if is32:  # the constants pick one chunk filler: numba compiles only that one
                if truncated:
                    _chunk32_truncated(a, b, slow, offset + lo, k0, k1, method, prm)
                else:
                    _chunk32(a, b, slow, offset + lo, k0, k1, method, prm)
            elif truncated:
                _chunk64_truncated(a, b, slow, offset + lo, k0, k1, method, prm)
            else:
                _chunk64(a, b, slow, offset + lo, k0, k1, method, prm)

    return _jit(fill, "_fill", is32, truncated, parallel=True)


_fills: dict[tuple[bool, bool], Any] = {}
_making = threading.Lock()


def _fill(is32: bool, truncated: bool) -> Any:
    """The filler variant, made once per process."""
    key = (is32, truncated)
    found = _fills.get(key)
    if found is None:
        with _making:
            found = _fills.get(key)
            if found is None:
                found = _fills[key] = _fill_kernel(is32, truncated)
    return found


_NO32 = np.empty(0, np.float32)
_NO64 = np.empty(0, np.float64)


_CHUNKS = {(True, False): _chunk32, (True, True): _chunk32_truncated,
           (False, False): _chunk64, (False, True): _chunk64_truncated}


def run(flat: np.ndarray, offset: int, k0: np.uint64, k1: np.uint64, method: int,
         prm: np.ndarray) -> None:
    """Fill ``flat`` with stream elements ``offset ...``: a fill of at most one chunk's
    length (every Param of a small job) calls its chunk filler here, in this thread, and
    never compiles a parallel filler; a longer one runs the parallel filler. The values are
    the same either way (they depend only on the key and the stream position)."""
    if flat.size == 0:
        return
    variant = (flat.dtype == np.float32, method == TRUNCATED)
    if flat.size <= _CHUNK:
        slow = np.empty(flat.size if method != UNIFORM else 0, np.uint8)
        a, b = (flat, _NO64) if variant[0] else (_NO32, flat)
        _CHUNKS[variant](a, b, slow, offset, k0, k1, method, prm)
        return
    fill = _fill(*variant)
    if flat.dtype == np.float32:
        fill(flat, _NO64, offset, k0, k1, method, prm)
    else:
        fill(_NO32, flat, offset, k0, k1, method, prm)


def _segments_kernel(is32: bool, truncated: bool) -> Any:
    """The filler of many short segments of one output type (see :func:`_run_segments`)."""

    def segments(out32, out64, starts, sizes, k0s, k1s, method, prms):  # type: ignore[no-untyped-def]
        """Fill segment ``s`` (``starts[s]``, ``sizes[s]`` values, at most one chunk) of
        ``out32`` or ``out64`` (the other is empty) with stream elements 0 ... of key
        ``(k0s[s], k1s[s])`` and parameters ``prms[s]``: by the chunk filler, as :func:`_run`
        fills one Param of at most one chunk."""
        longest = 0
        for s in range(starts.size):
            longest = max(longest, sizes[s])
        slow = np.empty(longest if method != UNIFORM else 0, np.uint8)
        for s in range(starts.size):
            lo = starts[s]
            hi = lo + sizes[s]
            scratch = slow[:sizes[s]] if method != UNIFORM else slow
            if is32:  # the constants pick one chunk filler: numba compiles only that one
                if truncated:
                    _chunk32_truncated(out32[lo:hi], out64, scratch, 0, k0s[s], k1s[s],
                                       method, prms[s])
                else:
                    _chunk32(out32[lo:hi], out64, scratch, 0, k0s[s], k1s[s], method, prms[s])
            elif truncated:
                _chunk64_truncated(out32, out64[lo:hi], scratch, 0, k0s[s], k1s[s], method,
                                   prms[s])
            else:
                _chunk64(out32, out64[lo:hi], scratch, 0, k0s[s], k1s[s], method, prms[s])

    return _jit(segments, "_segments", is32, truncated, parallel=False)


_SEGMENTS = {(is32, truncated): _segments_kernel(is32, truncated)
             for is32 in (True, False) for truncated in (False, True)}


# Up to FEW_SEGMENTS short segments, :func:`run_segments` calls the chunk filler once for each
# from Python (microseconds a call) instead of its compiled loop over segments: the loop's
# compile (about a second, once per machine) is worth it only for many small Params, and a
# job of a few Params (the main job: 4) then compiles only the filler it needs anyway.


def run_segments(out: np.ndarray, starts: np.ndarray, sizes: np.ndarray, k0s: np.ndarray,
                 k1s: np.ndarray, method: int, prms: np.ndarray) -> None:
    """Fill segments of the flat array ``out`` (checked by :mod:`.rng`), each a whole Param
    of its own: segment ``s`` (``starts[s]``, ``sizes[s]`` values) with stream elements 0 ...
    of key ``(k0s[s], k1s[s])`` and parameters ``prms[s]``. Segments of at most one chunk are
    filled in one compiled call (a million small Params would otherwise cost a call each),
    unless there are at most :data:`FEW_SEGMENTS` of them; longer ones as :func:`run` fills
    them. The values are those of one fill per segment."""
    is32 = out.dtype == np.float32
    small = sizes <= _CHUNK
    # by run(): each by its chunk filler, or its parallel fill
    each: Sequence[int] | np.ndarray = range(starts.size)
    if np.count_nonzero(small) > FEW_SEGMENTS:
        pick = slice(None) if small.all() else small
        a, b = (out, _NO64) if is32 else (_NO32, out)
        _SEGMENTS[is32, method == TRUNCATED](
            a, b, starts[pick], sizes[pick], k0s[pick], k1s[pick], method,
            np.ascontiguousarray(prms[pick]))
        each = np.flatnonzero(~small)
    for s in each:
        lo = int(starts[s])
        run(out[lo:lo + int(sizes[s])], 0, k0s[s], k1s[s], method, prms[s])


@njit(nogil=True, cache=True)
def _constant_segments(out, starts, sizes, values):  # type: ignore[no-untyped-def]
    for s in range(starts.size):
        out[starts[s]:starts[s] + sizes[s]] = values[s]


def constant_segments(out: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                      values: np.ndarray) -> None:
    """Segment ``s`` of ``out`` set to ``values[s]`` (checked by :mod:`.rng`) by a compiled
    loop: for more segments than :data:`FEW_SEGMENTS`, which :mod:`.rng` sets from Python."""
    _constant_segments(out, starts, sizes, values)
