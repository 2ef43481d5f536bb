"""The compiled update kernels (numba): one pass over memory for every rule of :mod:`.rules`,
with float, bfloat16 or 8-bit state, serial and parallel, made on first use and cached on
disk (:mod:`.cache`).

:mod:`.kernels` is their Python side and imports this module only for a call that needs a
compiled kernel: importing it is what pays the numba import.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from llvmlite import ir as llvm_ir
from numba import config as numba_config
from numba import prange, set_num_threads, types
from numba.extending import intrinsic, register_jitable

from . import quant
from .cache import get_num_threads, njit
from .rules import _SKIP, CHUNK, CLIP_GRADIENT, HELPERS, RULES, check_clip_at

__all__ = ["kernel_for", "read_only", "threads_for"]

BLOCK = quant.BLOCK

for _fn in (*RULES.values(), *HELPERS):  # compiled into the kernels, inlined
    register_jitable(inline="always")(_fn)
_RULES = RULES  # the same functions, now known to numba


@register_jitable
def _segment_of(offsets, i):  # type: ignore[no-untyped-def]
    """The last segment ``s`` with ``offsets[s] <= i`` (so the non-empty one holding ``i``)."""
    lo = 0
    hi = offsets.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= i:
            lo = mid
        else:
            hi = mid
    return lo


@register_jitable
def _block_start(offsets, i, n):  # type: ignore[no-untyped-def]
    """The start of the block holding value ``i`` (blocks of BLOCK counted from each
    segment's start), or ``n`` for ``i >= n``: where a work item of an 8-bit kernel starts."""
    if i >= n:
        return n
    s = _segment_of(offsets, i)
    return offsets[s] + (i - offsets[s]) // BLOCK * BLOCK


@register_jitable(inline="always")
def _nonfinite_in(g, lo, hi):  # type: ignore[no-untyped-def]
    gc = g[lo:hi]  # indices from 0: LLVM sees unit-stride loads
    count = 0
    for i in range(gc.shape[0]):
        z = gc[i] - gc[i]
        count += z != z
    return count


@register_jitable
def _nonfinite_serial(g):  # type: ignore[no-untyped-def]
    """The number of NaN and Inf in ``g``, in the calling thread: the check of a serial
    kernel, whose calls hold at most one chunk (so the four streams of
    :func:`_nonfinite_task` would never run there; leaving them out takes about a third off
    the kernel's compile, the most of a small job's first run). A function of its own: not
    inlined beside the update loop, where numba's SSA pass warns about its variables."""
    return _nonfinite_in(g, 0, g.shape[0])


@register_jitable
def _nonfinite_task(g, c, q, n):  # type: ignore[no-untyped-def]
    """The number of NaN and Inf in chunks ``c``, ``c + q``, ``c + 2q`` and ``c + 3q`` of
    ``g``: task ``c`` of the read-only check (``q`` tasks in all). The four chunks are read
    together, as four streams, which keeps more memory reads in flight than one stream: the
    check then takes about a fifth less time than chunk by chunk (measured with 2 threads,
    64 MB)."""
    a0 = c * CHUNK
    a3 = (c + 3 * q) * CHUNK
    if a3 + CHUNK <= n:
        x0 = g[a0:a0 + CHUNK]
        x1 = g[a0 + q * CHUNK:a0 + q * CHUNK + CHUNK]
        x2 = g[a0 + 2 * q * CHUNK:a0 + 2 * q * CHUNK + CHUNK]
        x3 = g[a3:a3 + CHUNK]
        count = _I(0)  # 32 bits: 16 lanes to a vector
        for i in range(CHUNK):
            z0 = x0[i] - x0[i]  # 0, or NaN for an Inf or NaN
            z1 = x1[i] - x1[i]
            z2 = x2[i] - x2[i]
            z3 = x3[i] - x3[i]
            count = _I(count + _I(z0 != z0) + _I(z1 != z1) + _I(z2 != z2) + _I(z3 != z3))
        return count
    found = 0
    for j in range(4):
        lo = (c + j * q) * CHUNK
        if lo < n:
            found += _nonfinite_in(g, lo, min(lo + CHUNK, n))
    return found


# ---------------------------------------------------------------------------------------------
# State codecs (paramserver.quant has the formats and their NumPy reference). A codec is a
# pair ``load(stored) -> value`` and ``store(value, key, index) -> stored``; a stochastic store
# draws its random bits from the segment's key and the element's index in its segment. They
# work on the bit patterns of float32 values in 32-bit integer arithmetic (numba widens
# integer operations to 64 bits; each result is cast back to 32, which lets LLVM keep 16 lanes
# to a vector), and are left to LLVM to inline (numba's own inlining of functions with
# branches trips its SSA checks).


def _bits_of_float32(typingctx, x):  # type: ignore[no-untyped-def]
    """The bit pattern of a float32, as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return types.uint32(x), codegen


def _float32_of_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The float32 whose bit pattern is the low 32 bits of an integer."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        v = args[0]
        width = getattr(x, "bitwidth", 32)
        if width > 32:
            v = builder.trunc(v, llvm_ir.IntType(32))
        elif width < 32:
            v = builder.zext(v, llvm_ir.IntType(32))
        return builder.bitcast(v, llvm_ir.FloatType())

    return types.float32(x), codegen


_bits_of: Any = intrinsic(_bits_of_float32)
_float_of: Any = intrinsic(_float32_of_bits)


def _magnitude_of_float(typingctx, x):  # type: ignore[no-untyped-def]
    """The bit pattern of ``abs(x)`` for a float32 (uint32) or float64 (uint64): NaN and Inf
    have larger patterns than any finite value (:func:`_least_nonfinite` and up)."""
    if x not in (types.float32, types.float64):
        return None
    width = 32 if x == types.float32 else 64

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        bits = builder.bitcast(args[0], llvm_ir.IntType(width))
        return builder.and_(bits, llvm_ir.Constant(llvm_ir.IntType(width), (1 << width - 1) - 1))

    return (types.uint32 if width == 32 else types.uint64)(x), codegen


_magnitude: Any = intrinsic(_magnitude_of_float)


def _no_magnitude_of(typingctx, a):  # type: ignore[no-untyped-def]
    """0 in the type of :func:`_magnitude` of an array's elements."""
    if not isinstance(a, types.Array) or a.dtype not in (types.float32, types.float64):
        return None
    t = types.uint32 if a.dtype == types.float32 else types.uint64

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return context.get_constant(t, 0)

    return t(a), codegen


def _least_nonfinite_of(typingctx, a):  # type: ignore[no-untyped-def]
    """The least :func:`_magnitude` of NaN and Inf for an array's elements (Inf's)."""
    if not isinstance(a, types.Array) or a.dtype not in (types.float32, types.float64):
        return None
    t = types.uint32 if a.dtype == types.float32 else types.uint64
    inf = 0x7F800000 if a.dtype == types.float32 else 0x7FF0000000000000

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return context.get_constant(t, inf)

    return t(a), codegen


_no_magnitude: Any = intrinsic(_no_magnitude_of)
_least_nonfinite: Any = intrinsic(_least_nonfinite_of)


_U = np.uint32
_I = np.int32
_round_key = register_jitable(quant.round_key)
_round_bits = register_jitable(quant.round_bits)
register_jitable(quant.mix32)


@register_jitable(inline="always")
def _as_is(x):  # type: ignore[no-untyped-def]
    return x


@register_jitable(inline="always")
def _as_is_store(x, key, index):  # type: ignore[no-untyped-def]
    return x


@register_jitable
def _bf16_load(c):  # type: ignore[no-untyped-def]
    return _float_of(_U(_U(c) << _U(16)))


@register_jitable
def _bf16(x, add):  # type: ignore[no-untyped-def]
    b = _U(_bits_of(x) + add)
    return np.uint16(_U(_U(0x7FC00000) if x != x else b) >> _U(16))


@register_jitable
def _bf16_nearest(x, key, index):  # type: ignore[no-untyped-def]
    return _bf16(x, _U(_U(0x7FFF) + _U(_U(_bits_of(x) >> _U(16)) & _U(1))))


@register_jitable
def _bf16_stochastic(x, key, index):  # type: ignore[no-untyped-def]
    return _bf16(x, _U(_U(_round_bits(key, index)) & _U(0xFFFF)))


@register_jitable
def _bf16_value(x):  # type: ignore[no-untyped-def]
    """``x`` rounded to bfloat16 (nearest, ties to even), as a float32: a value workers read
    when the updater keeps a float32 master copy (``value_dtype: bfloat16``)."""
    return _bf16_load(_bf16_nearest(x, 0, 0))


# The two 8-bit codes (paramserver.quant.Code8). A block's scale is a power of two, 2^E, so a
# magnitude code m in a block is the float32 with pattern (m + bias + 8E) << 20, and
# encoding rounds a value's pattern at bit 20 and takes off the same offset: integer
# operations only, with the scale folded into a per-block offset.
assert quant.SIGNED.mbits == quant.UNSIGNED.mbits == 3
_S_BIAS, _S_TOP = quant.SIGNED.bias, quant.SIGNED.top
_N_BIAS, _N_TOP = quant.UNSIGNED.bias, quant.UNSIGNED.top
_E_MIN, _E_MAX = round(np.log2(quant.SCALE_MIN)), round(np.log2(quant.SCALE_MAX))


@register_jitable
def _exponent_of_scale(scale):  # type: ignore[no-untyped-def]
    """E of a stored scale 2^E (0, a new state's, counts as the least)."""
    return _I(max(_I(_I(_U(_bits_of(scale) >> _U(23))) - _I(127)), _I(_E_MIN)))


@register_jitable
def _exponent_above(amax):  # type: ignore[no-untyped-def]
    """The least E with 2^E >= the float32 with pattern ``amax`` (in E_MIN..E_MAX)."""
    e = _I(_I(_U(amax >> _U(23))) - _I(127) + _I(_U(amax & _U(0x7FFFFF)) != _U(0)))
    return _I(min(max(e, _I(_E_MIN)), _I(_E_MAX)))


@register_jitable
def _abs_bits(x):  # type: ignore[no-untyped-def]
    """The pattern of ``abs(x)`` (non-negative state's is its own: never -0.0)."""
    return _U(_bits_of(x) & _U(0x7FFFFFFF))


@register_jitable
def _own_bits(x):  # type: ignore[no-untyped-def]
    """The pattern of non-negative ``x``, its magnitude's. Not the intrinsic itself in a
    kernel's closure: numba keys a cached kernel by its closure's pickle, and an intrinsic
    pickles differently in every process (the 8-bit kernels of unsigned state were never
    found in the cache: compiled again in every process)."""
    return _bits_of(x)


@register_jitable
def _scale(e):  # type: ignore[no-untyped-def]
    return _float_of(_U(_U(e + 127) << _U(23)))


@register_jitable
def _s8_load(c, offset):  # type: ignore[no-untyped-def]
    u = _U(np.uint8(c))
    m = _U(u & _U(0x7F))
    v = _U(_U(m + _U(offset)) << _U(20)) if m != _U(0) else _U(0)  # a signed code's 0 is 0
    return _float_of(_U(v | _U(_U(u & _U(0x80)) << _U(24))))


@register_jitable
def _u8_load(c, offset):  # type: ignore[no-untyped-def]
    return _float_of(_U(_U(_U(c) + _U(offset)) << _U(20)))


@register_jitable
def _code(a, add, offset):  # type: ignore[no-untyped-def]
    """The magnitude code of the float32 with pattern ``a`` (sign cleared), rounded by adding
    ``add`` below bit 20. No code is above the top one: the value is at most the scale, and
    rounds at most to it."""
    return _I(max(_I(_I(_U(_U(a + add) >> _U(20))) - _I(offset)), _I(0)))


@register_jitable
def _nearest_add(a, key, index):  # type: ignore[no-untyped-def]
    return _U(0x80000)  # to nearest, halves up (exact halves are rare enough to not matter)


@register_jitable
def _random_add(a, key, index):  # type: ignore[no-untyped-def]
    return _U(_U(_round_bits(key, index)) & _U(0xFFFFF))


# Non-negative state is never -0.0 (sums and products of non-negative numbers, and 0 is +0
# there), so its patterns need no clearing of the sign; a NaN's sign makes it the top code.


@register_jitable
def _s8_nearest(y, offset, key, index):  # type: ignore[no-untyped-def]
    b = _bits_of(y)
    a = _U(b & _U(0x7FFFFFFF))
    m = _code(a, _nearest_add(a, key, index), offset)
    return np.int8(_U(_U(m) | _U(_U(b >> _U(24)) & _U(0x80))))


@register_jitable
def _s8_stochastic(y, offset, key, index):  # type: ignore[no-untyped-def]
    b = _bits_of(y)
    a = _U(b & _U(0x7FFFFFFF))
    m = _code(a, _random_add(a, key, index), offset)
    return np.int8(_U(_U(m) | _U(_U(b >> _U(24)) & _U(0x80))))


@register_jitable
def _u8_nearest(y, offset, key, index):  # type: ignore[no-untyped-def]
    a = _bits_of(y)
    return np.uint8(_code(a, _nearest_add(a, key, index), offset))


@register_jitable
def _u8_stochastic(y, offset, key, index):  # type: ignore[no-untyped-def]
    a = _bits_of(y)
    return np.uint8(_code(a, _random_add(a, key, index), offset))


# ---------------------------------------------------------------------------------------------
# The drivers. ``_fused_kernel(rule, nstate, name)`` makes a kernel
#
#     kernel(w, wv, g, h, u, x, hs, us, xs, offsets, counts, seg, hyp, clip, check) -> int
#
# with ``seg[:, s] = (gscale, wd, k0, k1, k2, k3, skip)`` for segment ``s`` and ``hyp =
# (clip_low, clip_high, p0, ..., p4)``, all of the data type; a segment whose ``skip`` is not 0
# (a Param that got no gradient in the step) is passed over: nothing of it is read or written.
# ``h``, ``u``, ``x`` the state as stored, ``wv`` (a kernel made with
# ``master``) the values to write with the bfloat16 rounding of the new ``w`` (then the float32
# master copy; else unused), ``hs``, ``us``, ``xs`` the block scales of 8-bit state (else unused),
# ``counts`` the segments' update counts (for the random bits of stochastic rounding; else unused).
# It first checks that ``offsets`` never decrease (returning -1, before writing anything, if they
# do: the walk below relies on it to stay inside the arrays), and for 8-bit state that the scales
# have one entry per block (-2). Then chunks of CHUNK elements run in parallel; each finds its first
# segment by binary search over ``offsets`` and walks forward. The inner loop runs over views of one
# segment's part of the chunk, with an index from 0, so that LLVM sees non-negative unit-stride
# indices and vectorises it. ``rule``, ``nstate`` and the codec are closure constants: numba
# compiles the rule into the loop, the unused state branches vanish, and the cache key (which hashes
# the closure: module-level functions and ints) is the same in every process.
# ``error_model="numpy"``: a division by zero gives inf or nan, as in NumPy, instead of raising from
# inside the loop. With ``check``, a first pass reads the gradient only and returns its number of
# NaN and Inf, writing nothing, when there are any: the step is refused whole (the second pass
# follows at once, its threads still awake). A gradient of at most four chunks is read in the
# calling thread: there a parallel region costs more than the read (measured on two cores under
# OMP_WAIT_POLICY=PASSIVE, as Ray's actors run: a 1-worker step of 65,536 values took 205 µs
# with the check's own region, 120 µs without). The update pass counts the NaN and Inf it
# meets, in the same pass. With float state it counts element by element (``g - g`` is NaN for
# them); with bfloat16 and 8-bit state, whose loops do more arithmetic, it keeps the largest
# magnitude bit pattern of each chunk's gradient (NaN and Inf have the largest) and counts only
# in a chunk where that says there are some, reading the chunk's gradient again from cache.
# Each is the faster there: float32 SGD-momentum, 4M values on one thread, 0.98 ms counting
# against 1.15 ms keeping the pattern (plain SGD 0.54 against 0.59); bfloat16 SGD-momentum on
# 16M values, 1.26× torch's fused step keeping the pattern against 1.13× counting.
#
# Each kernel is made twice: parallel, and serial for calls of one chunk (a parallel region
# waits for every thread it wakes, and on a busy machine a thread with nothing to do may not
# be scheduled for milliseconds; the serial one needs no thread-count change around it, and a
# job of small Params compiles only it).
#
# 8-bit state: a work item is a run of whole blocks (chunks are moved to the block boundary
# of their segment); each block is updated into a buffer of BLOCK values (L1), its new scale
# is the largest magnitude there, and the codes are written from the buffer.


def _fused_kernel(rule: Callable[..., Any], nstate: int, name: str,
                  load: Callable[..., Any] = _as_is, store: Callable[..., Any] = _as_is_store,
                  stochastic: bool = False, parallel: bool = True, master: bool = False,
                  clip_at: int = 0) -> Any:
    """The kernel of ``rule`` with ``nstate`` state arrays, stored through ``load`` and
    ``store`` (float state by default); with ``master``, ``w`` is the float32 master copy and
    ``wv`` gets its bfloat16 rounding; ``clip_at`` (:data:`CLIP_GRADIENT`,
    :data:`CLIP_SCALED` or :data:`CLIP_DECAYED`) is where the clip happens; see above."""
    per_element = load is _as_is  # float state: count NaN and Inf element by element

    def kernel(w, wv, g, h, u, x, hs, us, xs, offsets, counts, seg, hyp, clip, check):  # type: ignore[no-untyped-def]
        for s in range(offsets.shape[0] - 1):
            if offsets[s + 1] < offsets[s]:
                return -1
        n = w.shape[0]
        nchunks = (n + CHUNK - 1) // CHUNK
        if check:  # a read-only pass first: a gradient with NaN or Inf writes nothing
            if parallel:
                found = _count(g)
            else:  # a serial kernel calls nothing parallel (numba prunes the other branch)
                found = _nonfinite_serial(g)
            if found > 0:
                return found
        clip_low = hyp[0]
        clip_high = hyp[1]
        p = (hyp[2], hyp[3], hyp[4], hyp[5], hyp[6])
        nonfinite = 0
        for c in prange(nchunks):
            pos = c * CHUNK
            stop = min(pos + CHUNK, n)
            s = _segment_of(offsets, pos)
            worst = _no_magnitude(g)  # bfloat16 state: the chunk's largest magnitude pattern
            while pos < stop:
                end = min(offsets[s + 1], stop)
                if seg[_SKIP, s] != 0:  # no gradient: the segment is not touched
                    pos = end
                    s += 1
                    continue
                gscale = seg[0, s]
                wd = seg[1, s]
                k = (seg[2, s], seg[3, s], seg[4, s], seg[5, s])
                key0 = _round_key(counts[s], 0) if stochastic else np.uint64(0)
                key1 = _round_key(counts[s], 1) if stochastic else np.uint64(0)
                key2 = _round_key(counts[s], 2) if stochastic else np.uint64(0)
                first = pos - offsets[s]
                ws = w[pos:end]
                vs = wv[pos:end] if master else wv
                gs = g[pos:end]
                hs_ = h[pos:end] if nstate >= 1 else h
                us_ = u[pos:end] if nstate >= 2 else u
                xs_ = x[pos:end] if nstate >= 3 else x
                bad = 0
                for i in range(end - pos):
                    gi = gs[i]
                    if per_element:
                        d = gi - gi  # 0, or NaN for an Inf or NaN
                        bad += d != d
                    else:
                        worst = max(worst, _magnitude(gi))
                    if clip and clip_at == 0:
                        gi = min(max(gi, clip_low), clip_high)
                    gi = gi * gscale
                    if clip and clip_at == 1:
                        gi = min(max(gi, clip_low), clip_high)
                    wi = ws[i]
                    if wd > 0:
                        gi = gi + wd * wi
                    if clip and clip_at == 2:
                        gi = min(max(gi, clip_low), clip_high)
                    # The stand-in for a state a rule does not keep is any value of the type.
                    hi = load(hs_[i]) if nstate >= 1 else gi
                    ui = load(us_[i]) if nstate >= 2 else gi
                    xi = load(xs_[i]) if nstate >= 3 else gi
                    wi, hi, ui, xi = rule(wi, gi, hi, ui, xi, k, p)
                    ws[i] = wi
                    if master:
                        vs[i] = _bf16_value(wi)
                    if nstate >= 1:
                        hs_[i] = store(hi, key0, first + i)
                    if nstate >= 2:
                        us_[i] = store(ui, key1, first + i)
                    if nstate >= 3:
                        xs_[i] = store(xi, key2, first + i)
                nonfinite += bad
                pos = end
                s += 1
            if worst >= _least_nonfinite(g):  # rare: count them (the chunk's g is in cache)
                nonfinite += _nonfinite_in(g, c * CHUNK, stop)
        return nonfinite

    return _jit(kernel, name, parallel)


def _blockwise_kernel(rule: Callable[..., Any], nstate: int, name: str,
                      codes: tuple[str, ...], stochastic: bool = False,
                      parallel: bool = True, master: bool = False, clip_at: int = 0) -> Any:
    """The kernel of ``rule`` over 8-bit block-wise state, each array kept as its entry of
    ``codes`` (``"int8"`` or ``"uint8"``); see above."""
    codes = (*codes, *(codes[-1:] * 3))[:3]  # the unused ones: any code
    load0, load1, load2 = (_LOADS[c] for c in codes)
    store0, store1, store2 = (_STORES[c, stochastic] for c in codes)
    bias0, bias1, bias2 = (_BIASES[c] for c in codes)
    abs0, abs1, abs2 = (_MAGNITUDE_BITS[c] for c in codes)

    def kernel(w, wv, g, h, u, x, hs, us, xs, offsets, counts, seg, hyp, clip, check):  # type: ignore[no-untyped-def]
        nseg = offsets.shape[0] - 1
        for s in range(nseg):
            if offsets[s + 1] < offsets[s]:
                return -1
        first_block = np.empty(nseg + 1, np.int64)
        first_block[0] = 0
        for s in range(nseg):
            first_block[s + 1] = first_block[s] + (offsets[s + 1] - offsets[s] + BLOCK - 1
                                                   ) // BLOCK
        nblocks = first_block[nseg]
        if hs.shape[0] != nblocks or (nstate >= 2 and us.shape[0] != nblocks) or (
                nstate >= 3 and xs.shape[0] != nblocks):
            return -2
        n = w.shape[0]
        nchunks = (n + CHUNK - 1) // CHUNK
        if check:
            if parallel:
                found = _count(g)
            else:  # a serial kernel calls nothing parallel (numba prunes the other branch)
                found = _nonfinite_serial(g)
            if found > 0:
                return found
        clip_low = hyp[0]
        clip_high = hyp[1]
        p = (hyp[2], hyp[3], hyp[4], hyp[5], hyp[6])
        nonfinite = 0
        for c in prange(nchunks):
            buf0 = np.empty(BLOCK, np.float32)
            buf1 = np.empty(BLOCK, np.float32)
            buf2 = np.empty(BLOCK, np.float32)
            pos = _block_start(offsets, c * CHUNK, n)
            stop = _block_start(offsets, c * CHUNK + CHUNK, n)
            first = pos
            s = _segment_of(offsets, pos)
            worst = _no_magnitude(g)
            while pos < stop:
                start = offsets[s]
                end = min(offsets[s + 1], stop)
                if seg[_SKIP, s] != 0:  # no gradient: the segment is not touched
                    pos = end
                    s += 1
                    continue
                gscale = seg[0, s]
                wd = seg[1, s]
                k = (seg[2, s], seg[3, s], seg[4, s], seg[5, s])
                key0 = _round_key(counts[s], 0) if stochastic else np.uint64(0)
                key1 = _round_key(counts[s], 1) if stochastic else np.uint64(0)
                key2 = _round_key(counts[s], 2) if stochastic else np.uint64(0)
                while pos < end:
                    bend = min(pos + BLOCK, end)
                    b = first_block[s] + (pos - start) // BLOCK
                    e0 = _exponent_of_scale(hs[b])
                    e1 = _exponent_of_scale(us[b]) if nstate >= 2 else e0
                    e2 = _exponent_of_scale(xs[b]) if nstate >= 3 else e0
                    ws = w[pos:bend]
                    vs = wv[pos:bend] if master else wv
                    gs = g[pos:bend]
                    hb = h[pos:bend]
                    ub = u[pos:bend] if nstate >= 2 else u
                    xb = x[pos:bend] if nstate >= 3 else x
                    off0 = _I(bias0 + 8 * e0)
                    off1 = _I(bias1 + 8 * e1)
                    off2 = _I(bias2 + 8 * e2)
                    amax0 = _U(0)
                    amax1 = _U(0)
                    amax2 = _U(0)
                    for i in range(bend - pos):
                        gi = gs[i]
                        worst = max(worst, _magnitude(gi))
                        if clip and clip_at == 0:
                            gi = min(max(gi, clip_low), clip_high)
                        gi = gi * gscale
                        if clip and clip_at == 1:
                            gi = min(max(gi, clip_low), clip_high)
                        wi = ws[i]
                        if wd > 0:
                            gi = gi + wd * wi
                        if clip and clip_at == 2:
                            gi = min(max(gi, clip_low), clip_high)
                        hi = load0(hb[i], off0)
                        ui = load1(ub[i], off1) if nstate >= 2 else gi
                        xi = load2(xb[i], off2) if nstate >= 3 else gi
                        wi, hi, ui, xi = rule(wi, gi, hi, ui, xi, k, p)
                        ws[i] = wi
                        if master:
                            vs[i] = _bf16_value(wi)
                        buf0[i] = hi
                        amax0 = max(amax0, abs0(hi))
                        if nstate >= 2:
                            buf1[i] = ui
                            amax1 = max(amax1, abs1(ui))
                        if nstate >= 3:
                            buf2[i] = xi
                            amax2 = max(amax2, abs2(xi))
                    base = pos - start
                    e0 = _exponent_above(amax0)
                    off0 = _I(bias0 + 8 * e0)
                    for i in range(bend - pos):
                        hb[i] = store0(buf0[i], off0, key0, base + i)
                    hs[b] = _scale(e0)
                    if nstate >= 2:
                        e1 = _exponent_above(amax1)
                        off1 = _I(bias1 + 8 * e1)
                        for i in range(bend - pos):
                            ub[i] = store1(buf1[i], off1, key1, base + i)
                        us[b] = _scale(e1)
                    if nstate >= 3:
                        e2 = _exponent_above(amax2)
                        off2 = _I(bias2 + 8 * e2)
                        for i in range(bend - pos):
                            xb[i] = store2(buf2[i], off2, key2, base + i)
                        xs[b] = _scale(e2)
                    pos = bend
                s += 1
            if worst >= _least_nonfinite(g):
                nonfinite += _nonfinite_in(g, first, stop)
        return nonfinite

    return _jit(kernel, name, parallel)


def _jit(kernel: Callable[..., Any], name: str, parallel: bool) -> Any:
    name = name if parallel else name + "_serial"
    kernel.__name__ = kernel.__qualname__ = name  # names the cache files, one set per kernel
    return njit(nogil=True, parallel=parallel, cache=True, fastmath=False,
                error_model="numpy")(kernel)

@register_jitable
def _nonfinite_here(g):  # type: ignore[no-untyped-def]
    # A function of its own (not inlined into the parallel code beside it, where numba's
    # SSA pass warns about the inlined loop's variables).
    return _nonfinite_task(g, 0, 1, g.shape[0])


def _count_kernel(g):  # type: ignore[no-untyped-def]
    """The read-only check: the number of NaN and Inf in ``g``, in tasks of four chunks; a
    gradient of at most four chunks is read in the calling thread (see above)."""
    n = g.shape[0]
    q = ((n + CHUNK - 1) // CHUNK + 3) // 4
    if q <= 1:
        return _nonfinite_here(g)
    found = 0
    for c in prange(q):
        found += _nonfinite_task(g, c, q, n)
    return found


#: The check, one parallel function: called on its own (:func:`count_nonfinite`) and by the
#: update kernels with ``check`` before their update pass.
_count = _jit(_count_kernel, "_count_nonfinite_kernel", True)


_LOADS: dict[str, Any] = {"int8": _s8_load, "uint8": _u8_load}
_MAGNITUDE_BITS: dict[str, Any] = {"int8": _abs_bits, "uint8": _own_bits}
_BIASES = {"int8": _S_BIAS, "uint8": _N_BIAS}
_STORES: dict[tuple[str, bool], Any] = {
    ("bfloat16", False): _bf16_nearest, ("bfloat16", True): _bf16_stochastic,
    ("int8", False): _s8_nearest, ("int8", True): _s8_stochastic,
    ("uint8", False): _u8_nearest, ("uint8", True): _u8_stochastic}
_made: dict[tuple[Any, ...], Any] = {}
_making = threading.Lock()


def kernel_for(rule: str, codes: tuple[str, ...] = (), stochastic: bool = False,
               parallel: bool = True, master: bool = False, clip_at: int = 0) -> Any:
    """The compiled-on-first-use kernel of ``rule`` for state stored as ``codes`` (one per
    state array: ``"float"``, ``"bfloat16"``, ``"int8"`` or ``"uint8"``); with ``master``,
    the one that also writes the bfloat16 rounding of the values it updates; ``clip_at``:
    where the gradient is clipped (:data:`CLIP_GRADIENT`, the default, and the others)."""
    check_clip_at(clip_at)
    key = (rule, codes, stochastic and bool(codes) and codes[0] != "float", parallel, master,
           int(clip_at))
    found = _made.get(key)
    if found is not None:
        return found
    with _making:
        found = _made.get(key)
        if found is None:
            found = _made[key] = _make(*key)
    return found


def _make(rule: str, codes: tuple[str, ...], stochastic: bool, parallel: bool,
          master: bool, clip_at: int) -> Any:
    fn = _RULES[rule]
    nstate = len(codes)
    name = (f"_{rule}_kernel" + ("_master" if master else "")
            + ("" if clip_at == CLIP_GRADIENT else f"_clip{clip_at}"))
    if not codes or codes[0] == "float":
        return _fused_kernel(fn, nstate, name, parallel=parallel, master=master,
                             clip_at=clip_at)
    suffix = ("_".join(codes) if len(set(codes)) > 1 else codes[0]) + ("_sr" if stochastic
                                                                        else "")
    if codes[0] == "bfloat16":
        return _fused_kernel(fn, nstate, f"{name}_{suffix}", _bf16_load,
                             _STORES["bfloat16", stochastic], stochastic, parallel, master,
                             clip_at)
    return _blockwise_kernel(fn, nstate, f"{name}_{suffix}", codes, stochastic, parallel,
                             master, clip_at)



#: The most threads numba's parallel kernels may use (set_num_threads only lowers it).
_MOST_THREADS: int = numba_config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``, as a kernel's input: one compiled signature (numba compiles
    one per writeable flag), whether or not the caller's array is writeable."""
    v = a.view()
    v.flags.writeable = False
    return v


def threads_for(n: int, chunk: int = CHUNK) -> contextlib.AbstractContextManager[None]:
    """Run the parallel kernels of this block on no more threads than ``n`` values have
    chunks of ``chunk``. A parallel region waits at its end for every thread it started, and
    on a busy machine a thread with nothing to do may not be scheduled for milliseconds
    (measured: 1.4 ms instead of 9 µs for one chunk of 5k values on two loaded cores).
    Where every thread has a chunk it changes nothing and returns a shared empty context
    (no generator made: it is on every kernel call)."""
    chunks = max(1, -(-n // chunk))
    if chunks >= _MOST_THREADS or chunks >= get_num_threads():  # the first test asks nothing
        return _AS_IS
    return _fewer_threads(chunks)


_AS_IS = contextlib.nullcontext()


@contextlib.contextmanager
def _fewer_threads(chunks: int) -> Iterator[None]:
    threads = get_num_threads()
    set_num_threads(chunks)
    try:
        yield
    finally:
        set_num_threads(threads)


def _lamb_kernel(w, g, m, v, offsets, seg, hyp, clip, clip_at, check, one):  # type: ignore[no-untyped-def]
    """LAMB's two passes, segment by segment (see :func:`lamb`). ``seg[:, s] = (gscale, wd,
    lr, 1/(1 - beta1^t), 1/(1 - beta2^t), skip)``; ``hyp = (clip_low, clip_high, beta1,
    1 - beta1, beta2, 1 - beta2, epsilon, lower_bound, upper_bound)`` (a bound < 0: none);
    ``one``: a one-element array of the data type (the step's rate is rounded into it)."""
    nseg = offsets.shape[0] - 1
    for s in range(nseg):
        if offsets[s + 1] < offsets[s]:
            return -1
    if check:
        found = _count(g)
        if found > 0:
            return found
    clip_low = hyp[0]
    clip_high = hyp[1]
    b1 = hyp[2]
    c1 = hyp[3]
    b2 = hyp[4]
    c2 = hyp[5]
    eps = hyp[6]
    nonfinite = 0
    for s in range(nseg):
        if seg[5, s] != 0:
            continue
        lo = offsets[s]
        n = offsets[s + 1] - lo
        gscale = seg[0, s]
        wd = seg[1, s]
        k1 = seg[3, s]
        k2 = seg[4, s]
        ws = w[lo:lo + n]
        gs = g[lo:lo + n]
        ms = m[lo:lo + n]
        vs = v[lo:lo + n]
        nchunks = (n + CHUNK - 1) // CHUNK
        r1 = 0.0
        r2 = 0.0
        bad = 0
        for c in prange(nchunks):  # pass 1: the moments, and the two norms
            a = c * CHUNK
            b = min(a + CHUNK, n)
            s1 = 0.0
            s2 = 0.0
            nb = 0
            for i in range(a, b):
                gi = gs[i]
                d = gi - gi
                nb += d != d
                if clip and clip_at == 0:
                    gi = min(max(gi, clip_low), clip_high)
                gi = gi * gscale
                if clip and clip_at != 0:
                    gi = min(max(gi, clip_low), clip_high)
                mi = b1 * ms[i] + c1 * gi
                vi = b2 * vs[i] + c2 * gi * gi
                ms[i] = mi
                vs[i] = vi
                wi = ws[i]
                ui = (mi * k1) / (np.sqrt(vi * k2) + eps) + wd * wi
                s1 += np.float64(wi) * np.float64(wi)
                s2 += np.float64(ui) * np.float64(ui)
            r1 += s1
            r2 += s2
            bad += nb
        nonfinite += bad
        r1 = np.sqrt(r1)
        r2 = np.sqrt(r2)
        if hyp[7] >= 0:
            r1 = max(r1, np.float64(hyp[7]))
        if hyp[8] >= 0:
            r1 = min(r1, np.float64(hyp[8]))
        rate = np.float64(seg[2, s])
        if r1 != 0.0 and r2 != 0.0:
            rate = rate * r1 / r2
        one[0] = rate
        lr = one[0]  # rounded to the data type
        for c in prange(nchunks):  # pass 2: the step, with the trust ratio
            a = c * CHUNK
            b = min(a + CHUNK, n)
            for i in range(a, b):
                wi = ws[i]
                ui = (ms[i] * k1) / (np.sqrt(vs[i] * k2) + eps) + wd * wi
                ws[i] = wi - lr * ui
    return nonfinite


_lamb = _jit(_lamb_kernel, "_lamb_kernel", True)
