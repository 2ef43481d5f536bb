"""The uniform fill in NumPy, bit for bit what the compiled filler writes (:mod:`.rng_kernels`).

Why a second form: the first compiled kernel a process runs loads numba's compiler, LLVM's
library and numba's runtime, about 85 MB of resident memory even when the kernel comes from
numba's cache (measured on SINGA's LeNet job: 193 MB of the run's own memory, against SINGA's
35 MB). A small job's fills are cheap either way: Philox4x32-10 and the uniform's arithmetic
over NumPy arrays cost about 20 ns a value here (1.7 ns compiled), 10 ms for LeNet's 431,080
values. So a fill of at most :data:`SMALL_FILL` values takes this form, and a job that also
updates its Params without the compiler (:mod:`.small_updates`) never loads it.

The values are the compiled filler's, bit for bit (a test compares them over offsets, sizes,
bounds and both dtypes): the same Philox blocks (the stream layout is in :mod:`.rng`), and
the uniform's float64 arithmetic, one correctly rounded operation at a time, rounded to the
dtype as the compiled code rounds it. The normal fills have a ziggurat whose rare slow path
calls ``log`` and ``exp`` element by element; they stay compiled.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FEW_SEGMENTS", "SMALL_FILL", "philox_blocks", "uniform"]

#: Fills of at most this many values (one call, all its segments together) take the NumPy
#: form: at most about 25 ms here, less than loading the compiled fillers from numba's cache.
SMALL_FILL = 1 << 20
#: ... and of at most this many segments: each is a call from Python (tens of microseconds),
#: where the compiled fillers take more small Params in one call (:mod:`.rng_kernels`, which
#: calls its chunk filler from Python for up to this many).
FEW_SEGMENTS = 256

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
#: Philox blocks per pass: 16,384 blocks (64K float32 values) keep each pass's arrays in cache.
_BLOCKS = 1 << 14


def philox_blocks(first: int, count: int, k0: int, k1: int) -> np.ndarray:
    """Philox4x32-10 of the bulk counters ``(j mod 2³², j div 2³², 0, 0)`` for blocks
    ``j = first ... first + count - 1`` under key ``(k0, k1)``: a ``(count, 4)`` uint64 array
    holding each block's four 32-bit words."""
    j = np.arange(first, first + count, dtype=np.uint64)
    c0, c1 = j & _M32, j >> _S32
    # The first round with c2 = c3 = 0 (its products of 0 are 0).
    p0 = c0 * _M0
    c0, c1, c2, c3 = c1 ^ np.uint64(k0), np.zeros_like(j), (p0 >> _S32) ^ np.uint64(k1), p0 & _M32
    p1 = np.empty_like(j)
    for r in range(1, 10):
        rk0 = np.uint64((k0 + r * _W0) & 0xFFFFFFFF)
        rk1 = np.uint64((k1 + r * _W1) & 0xFFFFFFFF)
        np.multiply(c0, _M0, out=p0)
        np.multiply(c2, _M1, out=p1)
        np.right_shift(p1, _S32, out=c0)
        c0 ^= c1
        c0 ^= rk0
        np.bitwise_and(p1, _M32, out=c1)
        np.right_shift(p0, _S32, out=c2)
        c2 ^= c3
        c2 ^= rk1
        np.bitwise_and(p0, _M32, out=c3)
    return np.stack((c0, c1, c2, c3), axis=1)


def uniform(flat: np.ndarray, offset: int, k0: int, k1: int, prm: np.ndarray) -> None:
    """Fill ``flat`` (C-contiguous 1-D float32 or float64) with uniform stream elements
    ``offset ...`` of key ``(k0, k1)``, as :func:`.rng_kernels.run` fills it with
    ``method=UNIFORM`` and the parameters ``prm`` (low, high - low, the largest float64 and
    float32 below high) that :mod:`.rng` made."""
    n = flat.size
    if n == 0:
        return
    is32 = flat.dtype == np.float32
    per = 4 if is32 else 2  # values per block
    low, span = float(prm[0]), float(prm[1])
    top = flat.dtype.type(prm[3] if is32 else prm[2])
    first, last = offset // per, (offset + n - 1) // per + 1
    pos = 0
    for b0 in range(first, last, _BLOCKS):
        words = philox_blocks(b0, min(b0 + _BLOCKS, last) - b0, k0, k1)
        if is32:  # element i: word i % 4 of block i // 4; u from its top 24 bits
            bits = words.reshape(-1)
            shift, scale = np.uint64(8), 1.0 / 16777216.0
        else:  # words 2·(i % 2) (low half) and 2·(i % 2) + 1 of block i // 2; top 53 bits
            bits = words[:, 0::2] | (words[:, 1::2] << _S32)
            bits = bits.reshape(-1)
            shift, scale = np.uint64(11), 1.0 / 9007199254740992.0
        skip = offset - per * b0 if b0 == first else 0
        bits = bits[skip:skip + n - pos]
        u = (bits >> shift).astype(np.float64)
        u *= scale
        u *= span
        u += low  # low + span·u in float64, as the compiled code computes it
        v = u.astype(flat.dtype) if is32 else u
        # min(v, top) as numba's min takes it: top only where it is smaller
        flat[pos:pos + bits.size] = np.where(top < v, top, v)
        pos += bits.size
