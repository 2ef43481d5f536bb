"""Fused numeric update kernels over flat parameter buffers (numba).

All Params of a server slice live in one contiguous 1-D array per role: values ``w``, gradient
``g`` and the updater state (``h``, ``u``; ``m``, ``v`` for Adam; ``m``, ``u`` for AdaMax;
a third array for AMSGrad's running maximum and the centred RMSProp's mean with momentum).
One call updates many Params ("segments") at once: segment ``k`` is ``[offsets[k],
offsets[k+1])`` of the arrays passed, and the per-segment arguments (``lr``, ``wd``,
``gscale``, ``step``) are scalars or arrays with one entry per segment. ``skip`` marks
segments to pass over (a Param that got no gradient: nothing of it is read or written).

For every element, in the order of SPEC §5:

1. clip ``g`` into ``[clip_low, clip_high]`` if ``clip_high > clip_low``;
2. ``g = g * gscale``;
3. if ``wd > 0``: ``g = g + wd * w`` (not for AdamW, whose decay is decoupled);
4. the method's rule, which updates ``w`` and the state in place.

(``clip_at`` moves step 1 after step 2, or after step 3: MXNet's order, see
:data:`CLIP_SCALED`.)

The gradient is only read. Every kernel is one pass over memory: each array is read once and
written at most once. Arithmetic is done in the arrays' precision (float32 or float64): the
per-segment coefficients are computed in float64 by the Python wrapper and then rounded to the
data type, never the other way round.

Importing this module is what pays the numba import; compiled kernels are cached on disk
(``cache=True``), and :func:`warmup` compiles or loads all of them for one dtype.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Union

import numpy as np
import numpy.typing as npt
from llvmlite import ir as llvm_ir
from numba import config as numba_config
from numba import prange, set_num_threads, types
from numba.extending import intrinsic, register_jitable

from ..config import ParamError
from . import forms, quant, small_updates
from .cache import get_num_threads, njit

__all__ = ["BLOCK", "CHUNK", "CLIP_DECAYED", "CLIP_GRADIENT", "CLIP_SCALED", "State",
           "adadelta", "adagrad", "adam", "adamax", "ftrl", "kernel_for", "lamb", "nadam",
           "nesterov", "radam", "read_only", "rmsprop", "sgd", "signed_state", "signum",
           "state_like", "threads_for", "warmup"]

BLOCK = quant.BLOCK
"""Values per block of 8-bit state (one float32 scale each)."""

#: Where the gradient is clipped into ``[clip_low, clip_high]`` (the ``clip_at`` of every
#: kernel): before it is scaled (SPEC §5's order, the default); after it is scaled by
#: ``gscale`` (MXNet's ``clip(rescale_grad * g)``: SGD, NAG, AdaGrad, AdaDelta, Signum, Ftrl,
#: LAMB); after the weight decay is added too (MXNet's ``clip(rescale_grad * g + wd * w)``:
#: Adam, RMSProp).
CLIP_GRADIENT, CLIP_SCALED, CLIP_DECAYED = 0, 1, 2

CHUNK = 1 << 15
"""Elements per parallel work item. The range is cut into chunks regardless of segment
boundaries, so one 16M-element Param and 200 small ones are balanced alike."""

_NUM_PARAMS = 5  # call-wide hyper-parameters a rule may use: p = (p0, ..., p4)
_NUM_COEFS = 4  # per-segment coefficients a rule may use: k = (k0, k1, k2, k3)
_SKIP = 2 + _NUM_COEFS  # the row of the per-segment table that marks a skipped segment

PerSegment = npt.ArrayLike
"""A float (the same for every segment) or a 1-D array with one entry per segment."""


# ---------------------------------------------------------------------------------------------
# Per-element rules. Each gets the element's value ``w``, its prepared gradient ``g`` (clipped,
# scaled, weight-decayed), its state elements ``h``, ``u`` and ``x``, the per-segment
# coefficients ``k`` and the call-wide hyper-parameters ``p``, and returns the new
# ``(w, h, u, x)``. The driver reads and writes only the first ``nstate`` state arrays; a rule
# returns the others unchanged. All numbers are of the data type, so the arithmetic stays in it.


@register_jitable(inline="always")
def _sgd_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr
    return w - k[0] * g, h, u, x


@register_jitable(inline="always")
def _singa_momentum_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # SINGA's form of the momentum rule below (k1 = 1), one multiply an element fewer: the
    # result is the same bit for bit (w + 1·h is w + h), and the update kernel gets about 7 %
    # faster where it is not bound by memory (4M values on one thread: 1.18 -> 1.10 ms).
    h = p[0] * h - k[0] * g
    return w + h, h, u, x


@register_jitable(inline="always")
def _momentum_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum. SINGA's form: k0 = lr, k1 = 1 (h = m*h - lr*g; w = w + h). torch.optim's
    # form: k0 = -(1 - dampening), k1 = -lr (h = m*h + (1 - dampening)*g; w = w - lr*h), so
    # that h is torch's momentum buffer and a new rate applies to the whole of it.
    h = p[0] * h - k[0] * g
    return w + k[1] * h, h, u, x


@register_jitable(inline="always")
def _nesterov_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum, p1 = 1 + momentum. SINGA's form: k0 = lr, k1 = 1. torch.optim's form:
    # k0 = 1, k1 = lr (h is torch's buffer m*h + g, and (1+m)*h1 - m*h = g + m*h1 its step).
    h1 = p[0] * h + k[0] * g
    return w - k[1] * (p[1] * h1 - p[0] * h), h1, u, x


@register_jitable(inline="always")
def _nag_mxnet_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # MXNet 1.9.1's nag_mom_update as its store runs it, in place (out is the weight): h is
    # MXNet's mom; k0 = lr, k1 = lr*wd; p0 = momentum, p1 = 1 + momentum. The kernel writes
    # the new weight before it updates mom, whose weight decay term then reads the new
    # weight: mom = momentum*mom - lr*(clip(rescale*grad) + wd*w_new).
    h = p[0] * h
    w1 = w - h + p[1] * (h - k[0] * g)
    return w1, h - k[0] * g - k[1] * (w1 - w), u, x


@register_jitable(inline="always")
def _adagrad_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr, k1 = 1 - lr * wd (MXNet's decoupled decay) or 1; p0 = delta under the square
    # root (SINGA's form), p1 = delta after it (torch.optim's eps); the other is 0.
    h = h + g * g
    return w * k[1] - k[0] * g / (np.sqrt(h + p[0]) + p[1]), h, u, x


@register_jitable(inline="always")
def _rmsprop_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr; p0 = rho, p1 = 1 - rho, p2 = delta under the square root (SINGA's form),
    # p3 = delta after it (torch.optim's eps); p4 = momentum (torch.optim's, with u its
    # buffer: u = m*u + g/avg; w = w - lr*u), 0 for none.
    h = p[0] * h + p[1] * g * g
    if p[4] > 0:
        u = p[4] * u + g / (np.sqrt(h + p[2]) + p[3])
        return w - k[0] * u, h, u, x
    return w - k[0] * g / (np.sqrt(h + p[2]) + p[3]), h, u, x


@register_jitable(inline="always")
def _centered_avg(h, a, p):  # type: ignore[no-untyped-def]
    # The centred RMSProp's denominator: sqrt(h - a² (+ delta)) (+ delta) with the running
    # mean a of g. h ≥ a² holds exactly (Cauchy-Schwarz over the running means' weights),
    # but bfloat16 or 8-bit state rounds h and a apart: a negative difference is taken as 0
    # (torch.optim, in float state, would give NaN there). NaN stays NaN (d - d: a zero of
    # the data type, where a literal 0 would widen float32 to float64).
    d = h - a * a
    d = d if d >= 0 else d - d
    return np.sqrt(d + p[2]) + p[3]


@register_jitable(inline="always")
def _rmsprop_centered_rule(w, g, h, a, x, k, p):  # type: ignore[no-untyped-def]
    # torch.optim.RMSprop(centered=True) without momentum: a (the second state) is the running
    # mean of g, a = rho*a + (1 - rho)*g; k, p as _rmsprop_rule (p4 = 0).
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    return w - k[0] * g / _centered_avg(h, a, p), h, a, x


@register_jitable(inline="always")
def _rmsprop_centered_momentum_rule(w, g, h, u, a, k, p):  # type: ignore[no-untyped-def]
    # torch.optim.RMSprop(centered=True, momentum=p4): u the momentum buffer, a (the third
    # state) the running mean of g; p as _rmsprop_rule; k0 = lr, k1 = 1 (torch.optim's
    # buffer, u = p4*u + g/avg; w -= lr*u), or k0 = 1, k1 = lr (MXNet's RMSPropAlex, whose
    # buffer holds the steps: delta = gamma2*delta - lr*g/avg; w += delta, with u = -delta).
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    u = p[4] * u + k[1] * g / _centered_avg(h, a, p)
    return w - k[0] * u, h, u, a


@register_jitable(inline="always")
def _adadelta_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr, k1 = 1 - lr * wd (MXNet's decoupled decay) or 1; p0 = rho, p1 = 1 - rho,
    # p2 = delta. sqrt(u + delta) / sqrt(h + delta) as one square root of a quotient: one
    # sqrt fewer.
    h = p[0] * h + p[1] * g * g
    t = g * np.sqrt((u + p[2]) / (h + p[2]))
    u = p[0] * u + p[1] * t * t
    return w * k[1] - k[0] * t, h, u, x


@register_jitable(inline="always")
def _signum_rule(w, g, u, v, x, k, p):  # type: ignore[no-untyped-def]
    # Signum (Bernstein et al. 2018, MXNet's): u = p0*u + p1*g (p0 = momentum, p1 = 1 -
    # momentum); w = w*k1 - k0*sign(u), k0 = lr, k1 = 1 - lr*wd_lh. (MXNet keeps -u.)
    u = p[0] * u + p[1] * g
    step = k[0] if u > 0 else (-k[0] if u < 0 else k[0] - k[0])
    return w * k[1] - step, u, v, x


@register_jitable(inline="always")
def _signsgd_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # signSGD (MXNet's Signum without momentum): w = w*k1 - k0*sign(g), k0 = lr,
    # k1 = 1 - lr*wd (its weight decay is decoupled).
    step = k[0] if g > 0 else (-k[0] if g < 0 else k[0] - k[0])
    return w * k[1] - step, h, u, x


@register_jitable(inline="always")
def _ftrl_rule(w, g, z, n, x, k, p):  # type: ignore[no-untyped-def]
    # FTRL-Proximal (McMahan et al. 2013, MXNet's Ftrl): k0 = lr, k1 = wd (the L2 term of the
    # closed form, not added to g); p0 = lamda1 (L1), p1 = beta.
    n1 = n + g * g
    z = z + (g - (np.sqrt(n1) - np.sqrt(n)) * w / k[0])
    if abs(z) > p[0]:
        w = ((p[0] if z > 0 else -p[0]) - z) / ((p[1] + np.sqrt(n1)) / k[0] + k[1])
    else:
        w = z - z  # 0 (NaN stays NaN)
    return w, z, n1, x


@register_jitable(inline="always")
def _adam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr / (1 - beta1^t), k1 = 1 / sqrt(1 - beta2^t), k2 = 1 - lr * wd (AdamW) or 1 (Adam);
    # p0 = beta1, p1 = 1 - beta1, p2 = beta2, p3 = 1 - beta2, p4 = delta. (torch.optim's
    # SparseAdam adds delta to sqrt(v) before the bias correction: k0 = lr·sqrt(1 - beta2^t) /
    # (1 - beta1^t), k1 = 1.)
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / (np.sqrt(v) * k[1] + p[4]), m, v, x


@register_jitable(inline="always")
def _amsgrad_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # AMSGrad (torch.optim.Adam(amsgrad=True)): Adam with the running maximum x of v in the
    # denominator; k, p as _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    x = max(x, v)
    return w * k[2] - k[0] * m / (np.sqrt(x) * k[1] + p[4]), m, v, x


@register_jitable(inline="always")
def _adam_inner_delta_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # SINGA v0.3's kAdam: no bias correction, delta under the square root.
    # k0 = lr, k2 = 1 - lr * wd (AdamW) or 1; p as in _adam_rule
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / np.sqrt(v + p[4]), m, v, x


@register_jitable(inline="always")
def _adamax_rule(w, g, m, u, x, k, p):  # type: ignore[no-untyped-def]
    # AdaMax, Adam's infinity norm (Kingma & Ba, section 7.1): u = max(beta2*u, |g| + p3) + p4
    # with (p3, p4) = (delta, 0) as torch.optim.Adamax, or (0, delta) as SINGA v0.3.
    # k0 = lr / (1 - beta1^t) (or lr); p0 = beta1, p1 = 1 - beta1, p2 = beta2
    m = p[0] * m + p[1] * g
    u = max(p[2] * u, abs(g) + p[3]) + p[4]
    return w - k[0] * m / u, m, u, x


@register_jitable(inline="always")
def _nadam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # NAdam (Dozat 2016, as torch.optim.NAdam): k0 = lr·(1 - mu_t)/(1 - mu_1···mu_t),
    # k1 = lr·mu_{t+1}/(1 - mu_1···mu_{t+1}), k2 = 1/sqrt(1 - beta2^t), k3 = 1 - lr·wd
    # (decoupled weight decay) or 1; p as _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[3] - (k[0] * g + k[1] * m) / (np.sqrt(v) * k[2] + p[4]), m, v, x


@register_jitable(inline="always")
def _radam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # RAdam (Liu et al. 2020, as torch.optim.RAdam): where the variance is tractable
    # (rho_t > 5) k0 = lr·r_t·sqrt(1 - beta2^t)/(1 - beta1^t) and k1 = 0, else k0 = 0 and
    # k1 = lr/(1 - beta1^t) (an SGD-momentum step); k2 = 1 - lr·wd (decoupled) or 1; p as
    # _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - m * (k[0] / (np.sqrt(v) + p[4]) + k[1]), m, v, x


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


def count_nonfinite(g: np.ndarray) -> int:
    """The number of NaN and Inf in ``g`` (1-D, float32 or float64): the update kernels'
    read-only check (``check=True``) on its own, for a gradient read before it is sent."""
    if not isinstance(g, np.ndarray) or g.dtype not in (np.float32, np.float64) \
            or g.ndim != 1:
        raise ParamError(f"g must be a 1-D float32 or float64 numpy array, not {_describe(g)}"
                         + (f" of shape {g.shape}" if isinstance(g, np.ndarray) else ""))
    gv = read_only(np.ascontiguousarray(g))
    with threads_for(g.shape[0], 4 * CHUNK):  # a task reads four chunks
        return int(_count(gv))


# ---------------------------------------------------------------------------------------------
# The kernels by method and state type, made on first use (a job compiles only those it runs).

#: The rules by name (quant.SIGNED_STATE says which of their state may be negative).
_RULES: dict[str, Callable[..., Any]] = {
    "sgd": _sgd_rule,
    "momentum": _momentum_rule,
    "singa_momentum": _singa_momentum_rule,
    "nesterov": _nesterov_rule,
    "nag_mxnet": _nag_mxnet_rule,
    "adagrad": _adagrad_rule,
    "rmsprop": _rmsprop_rule,
    "rmsprop_momentum": _rmsprop_rule,
    "rmsprop_centered": _rmsprop_centered_rule,
    "rmsprop_centered_momentum": _rmsprop_centered_momentum_rule,
    "adadelta": _adadelta_rule,
    "signum": _signum_rule,
    "signsgd": _signsgd_rule,
    "ftrl": _ftrl_rule,
    "adam": _adam_rule,
    "amsgrad": _amsgrad_rule,
    "adam_inner_delta": _adam_inner_delta_rule,
    "adamax": _adamax_rule,
    "nadam": _nadam_rule,
    "radam": _radam_rule,
}

_LOADS: dict[str, Any] = {"int8": _s8_load, "uint8": _u8_load}
_MAGNITUDE_BITS: dict[str, Any] = {"int8": _abs_bits, "uint8": _own_bits}
_BIASES = {"int8": _S_BIAS, "uint8": _N_BIAS}
_STORES: dict[tuple[str, bool], Any] = {
    ("bfloat16", False): _bf16_nearest, ("bfloat16", True): _bf16_stochastic,
    ("int8", False): _s8_nearest, ("int8", True): _s8_stochastic,
    ("uint8", False): _u8_nearest, ("uint8", True): _u8_stochastic}
_made: dict[tuple[Any, ...], Any] = {}
_making = threading.Lock()


def signed_state(rule: str) -> tuple[bool, ...]:
    """For each state array of kernel ``rule`` (``"adam"``, ``"momentum"``), whether it may be
    negative."""
    return quant.SIGNED_STATE[rule]


def kernel_for(rule: str, codes: tuple[str, ...] = (), stochastic: bool = False,
               parallel: bool = True, master: bool = False, clip_at: int = 0) -> Any:
    """The compiled-on-first-use kernel of ``rule`` for state stored as ``codes`` (one per
    state array: ``"float"``, ``"bfloat16"``, ``"int8"`` or ``"uint8"``); with ``master``,
    the one that also writes the bfloat16 rounding of the values it updates; ``clip_at``:
    where the gradient is clipped (:data:`CLIP_GRADIENT`, the default, and the others)."""
    _check_clip_at(clip_at)
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


def _check_clip_at(clip_at: int) -> None:
    if clip_at not in (CLIP_GRADIENT, CLIP_SCALED, CLIP_DECAYED):
        raise ParamError(f"clip_at must be {CLIP_GRADIENT}, {CLIP_SCALED} or {CLIP_DECAYED}, "
                         f"not {clip_at!r}")


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


# ---------------------------------------------------------------------------------------------
# The Python side: check the buffers, round the coefficients to the data type, launch.

State = Union[np.ndarray, tuple[np.ndarray, np.ndarray]]  # noqa: UP007 (a runtime alias)
"""A state array as a kernel takes it: float values of ``w``'s type, bfloat16 bit patterns
(``uint16``), or 8-bit codes with their block scales, ``(codes, scales)``: ``int8`` codes
for state that may be negative, ``uint8`` for non-negative state, ``float32`` scales, one
per block of BLOCK values counted from each segment's start."""

_EMPTY_I64 = np.zeros(0, np.int64)


def _code_of(role: str, a: Any, w: np.ndarray, signed: bool) -> tuple[str, np.ndarray,
                                                                      np.ndarray | None]:
    """How state ``a`` is stored: its code name, its array and its scales (8-bit)."""
    if isinstance(a, tuple):
        if len(a) != 2:
            raise ParamError(f"{role}: an 8-bit state is a pair (codes, scales), not "
                             f"{len(a)} arrays")
        codes, scales = a
        if not isinstance(codes, np.ndarray) or codes.dtype not in (np.int8, np.uint8):
            raise ParamError(f"{role} codes must be an int8 or uint8 numpy array, not "
                             f"{_describe(codes)}")
        if not isinstance(scales, np.ndarray) or scales.dtype != np.float32 or \
                scales.ndim != 1 or not scales.flags.c_contiguous or not scales.flags.writeable:
            raise ParamError(f"{role} scales must be a writeable 1-D C-contiguous float32 "
                             f"numpy array, not {_describe(scales)}")
        code = codes.dtype.name
        if signed and code == "uint8":
            raise ParamError(f"{role} may be negative: its 8-bit codes must be int8 (uint8 "
                             "codes hold non-negative state)")
        return code, codes, scales
    if not isinstance(a, np.ndarray):
        raise ParamError(f"{role} must be a numpy array, not {_describe(a)}")
    if a.dtype == w.dtype:
        return "float", a, None
    if a.dtype == np.uint16:
        return "bfloat16", a, None
    raise ParamError(f"{role} must be a {w.dtype} numpy array like w, bfloat16 bit patterns "
                     f"(uint16) or 8-bit (codes, scales), not {_describe(a)}")


def _launch(
    rule: str,
    w: np.ndarray,
    g: np.ndarray,
    states: dict[str, State],
    offsets: npt.ArrayLike,
    gscale: PerSegment,
    wd: PerSegment,
    k: tuple[PerSegment, ...],
    p: tuple[float, ...],
    clip_low: float,
    clip_high: float,
    check: bool = False,
    stochastic: bool = False,
    step: PerSegment | None = None,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64):
        raise ParamError(f"w must be a float32 or float64 numpy array, not {_describe(w)}")
    master = bf16_values is not None
    if master:
        if not isinstance(bf16_values, np.ndarray) or bf16_values.dtype != np.float32 \
                or w.dtype != np.float32:
            raise ParamError("bf16_values (the values read beside a float32 master copy w) "
                             f"and w must be float32 numpy arrays, not "
                             f"{_describe(bf16_values)} and {_describe(w)}")
        if bf16_values.shape != w.shape or not bf16_values.flags.c_contiguous \
                or not bf16_values.flags.writeable:
            raise ParamError(f"bf16_values must be writeable, 1-D, C-contiguous and of w's "
                             f"length {w.shape[0]}, got shape {bf16_values.shape}")
        if np.shares_memory(bf16_values, w):
            raise ParamError("bf16_values and the master copy w must not overlap")
    dtype = w.dtype
    if not isinstance(g, np.ndarray) or g.dtype != dtype:
        raise ParamError(f"g must be a {dtype} numpy array like w, not {_describe(g)}")
    signs = quant.SIGNED_STATE[rule]
    found = [_code_of(role, a, w, signs[i]) for i, (role, a) in enumerate(states.items())]
    codes = tuple(c for c, _, _ in found)
    family = {"int8": "8-bit", "uint8": "8-bit"}
    if len({family.get(c, c) for c in codes}) > 1:
        raise ParamError(f"state arrays {list(states)} are kept as {list(codes)}: one call "
                         "takes one kind (float, bfloat16 or 8-bit)")
    if codes and codes[0] != "float" and dtype != np.float32:
        raise ParamError(f"bfloat16 and 8-bit state are for float32 values, not {dtype}")
    for role, a in (("w", w), ("g", g), *((r, f[1]) for r, f in zip(states, found))):
        if a.ndim != 1 or a.shape != w.shape or not a.flags.c_contiguous:
            raise ParamError(
                f"{role} must be 1-D, C-contiguous and of w's length {w.shape[0]}, "
                f"got shape {a.shape} (contiguous: {a.flags.c_contiguous})"
            )
    for role, a in (("w", w), *((r, f[1]) for r, f in zip(states, found))):
        if not a.flags.writeable:
            raise ParamError(f"{role} is read-only; it is updated in place")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != w.shape[0]:
        _bad_offsets(offsets, w)
    nseg = offsets.shape[0] - 1
    seg = np.zeros((3 + _NUM_COEFS, nseg), dtype)
    try:
        for row, value in enumerate((gscale, wd, *k)):
            seg[row] = value
        if skip is not None:
            seg[_SKIP] = np.asarray(skip, bool)
    except ValueError:  # numpy's: a row of the wrong length
        raise ParamError(
            f"per-segment arguments (and skip) must be scalars or have one entry per segment "
            f"({nseg})"
        ) from None
    hyp = np.zeros(2 + _NUM_PARAMS, dtype)
    hyp[: 2 + len(p)] = (clip_low, clip_high, *p)
    stochastic = bool(stochastic) and bool(codes) and codes[0] != "float"
    counts = _EMPTY_I64
    if stochastic:
        if step is None:
            raise ParamError("stochastic rounding needs step (per segment, the number of "
                             "this update): its random bits are drawn from it")
        counts = np.ascontiguousarray(np.broadcast_to(_step(step, skip).astype(np.int64),
                                                      (nseg,)))
    gv = read_only(g)
    arrays = [a for _, a, _ in found] + [w[:0]] * 3
    scales = [sc for _, _, sc in found if sc is not None] + [_NO_SCALES] * 3
    n = w.shape[0]
    _check_clip_at(clip_at)
    if small_updates.applies(rule, n, nseg, codes, master):  # no compiler: see there
        nonfinite = small_updates.update(
            _RULES[rule], w, g, [a for _, a, _ in found], offsets, seg, hyp,
            bool(clip_high > clip_low), bool(check), int(clip_at), _SKIP)
        if nonfinite == -1:
            _bad_offsets(offsets, w)
        return nonfinite
    parallel = n > CHUNK
    kernel = kernel_for(rule, codes, stochastic, parallel, master, clip_at)
    wv = bf16_values if bf16_values is not None else w[:0]
    args = (w, wv, gv, *arrays[:3], *scales[:3], offsets, counts, seg, hyp,
            bool(clip_high > clip_low), bool(check))
    if parallel:
        with threads_for(n):
            nonfinite = int(kernel(*args))
    else:
        nonfinite = int(kernel(*args))
    if nonfinite == -1:
        _bad_offsets(offsets, w)
    if nonfinite == -2:
        sizes = np.diff(offsets)
        raise ParamError(f"8-bit state: the scales must have one entry per block of {BLOCK} "
                         f"values counted from each segment's start "
                         f"({int((-(-sizes // BLOCK)).sum())}), got "
                         f"{[len(sc) for sc in scales[:len(found)]]}")
    return nonfinite


_NO_SCALES = np.zeros(0, np.float32)
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


def _bad_offsets(offsets: np.ndarray, w: np.ndarray) -> NoReturn:
    raise ParamError(
        f"offsets must be non-decreasing from 0 to len(w) = {w.shape[0]}, got {offsets!r}"
    )


def _describe(a: object) -> str:
    return f"{type(a).__name__} of {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__


def _f64(x: PerSegment) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The kernels. All update ``w`` and the state in place and return the number of gradient
# elements that were NaN or Inf (counted in the same pass; the update is applied regardless:
# the caller decides what a non-finite gradient means). Each state array may be kept as
# ``State`` says: of w's type, bfloat16 (uint16 patterns) or 8-bit ``(codes, scales)``
# (low-precision state needs float32 values; one call's state is of one kind).


def sgd(
    w: np.ndarray,
    g: np.ndarray,
    h: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    momentum: float = 0.0,
    dampening: PerSegment = 0.0,
    torch_form: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """SGD: ``h = momentum*h - lr*g; w = w + h``, or ``w = w - lr*g`` when momentum is 0.

    With ``torch_form``, torch.optim.SGD's form: ``h = momentum*h + (1-dampening)*g;
    w = w - lr*h`` (``h`` is torch's momentum buffer, and a new rate applies to all of it).
    SINGA's form with dampening: ``h = momentum*h - lr*(1-dampening)*g``.

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      h: momentum history, updated in place; not touched (may be empty) when momentum is 0.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      momentum: in [0, 1].
      dampening: per segment, in [0, 1]; the gradient enters the momentum times
        ``1 - dampening`` (torch.optim's; give 0 for a segment's first update, whose buffer
        torch starts from the gradient itself).
      torch_form: torch.optim's form of the momentum (above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      step: per segment, the number ``t >= 1`` of this update (the key of the random bits
        of stochastic rounding).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    if momentum > 0:
        keep = 1.0 - _f64(dampening)
        k = (-keep, -_f64(lr)) if torch_form else (_f64(lr) * keep, 1.0)
        return _launch(
            "momentum" if torch_form else "singa_momentum",
            w,
            g,
            {"h": h},
            offsets,
            gscale,
            wd,
            k,
            (momentum,),
            clip_low,
            clip_high,
            check,
            stochastic,
            step,
            bf16_values,
            skip=skip, clip_at=clip_at,
        )
    else:
        return _launch(
            "sgd", w, g, {}, offsets, gscale, wd, (lr,), (), clip_low, clip_high, check,
            bf16_values=bf16_values,
            skip=skip, clip_at=clip_at,
        )


def nesterov(
    w: np.ndarray,
    g: np.ndarray,
    h: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    momentum: float,
    torch_form: bool = False,
    mxnet: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """Nesterov: ``h0 = h; h = momentum*h + lr*g; w = w - ((1+momentum)*h - momentum*h0)``.

    With ``torch_form``, torch.optim.SGD's (``nesterov=True``): ``h = momentum*h + g;
    w = w - lr*(g + momentum*h)`` (``h`` is torch's momentum buffer).

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      h: history, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      momentum: in [0, 1].
      torch_form: torch.optim's form of the momentum (above).
      mxnet: MXNet 1.9.1's NAG as its store runs it: ``h`` is MXNet's ``mom`` (SINGA's
        history negated), and the weight decay of the new ``h`` reads the new ``w``
        (``nag_mom_update`` in place writes the weight first): ``h = momentum*h;
        w1 = w - h + (1+momentum)*(h - lr*g); h = h - lr*(g + wd*(w1 - w))``.
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      step: per segment, the number ``t >= 1`` of this update (the key of the random bits
        of stochastic rounding).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    if mxnet:
        lr64 = _f64(lr)
        return _launch("nag_mxnet", w, g, {"h": h}, offsets, gscale, wd, (lr64, lr64 * _f64(wd)),
                       (momentum, 1.0 + momentum), clip_low, clip_high, check, stochastic,
                       step, bf16_values, skip=skip, clip_at=clip_at)
    return _launch(
        "nesterov",
        w,
        g,
        {"h": h},
        offsets,
        gscale,
        wd,
        (1.0, lr) if torch_form else (lr, 1.0),
        (momentum, 1.0 + momentum),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def adagrad(
    w: np.ndarray,
    g: np.ndarray,
    h: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    delta: float = 1e-8,
    torch_form: bool = False,
    decoupled: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """AdaGrad: ``h = h + g*g; w = w - lr*g/sqrt(h + delta)``; with ``torch_form``,
    torch.optim.Adagrad's ``w = w - lr*g/(sqrt(h) + delta)``. With ``decoupled`` (MXNet's
    AdaGrad), the weight decay is not added to the gradient: ``w = w*(1 - lr*wd) -
    lr*g/sqrt(h + delta)``.

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      h: sum of squared gradients, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      delta: added under the square root (after it with ``torch_form``); > 0.
      torch_form: torch.optim's placement of delta (above).
      decoupled: MXNet's decoupled weight decay (above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      step: per segment, the number ``t >= 1`` of this update (the key of the random bits
        of stochastic rounding).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    coupled_wd, decay = _decay(_f64(lr), wd, decoupled)
    return _launch(
        "adagrad",
        w,
        g,
        {"h": h},
        offsets,
        gscale,
        coupled_wd,
        (lr, decay),
        (0.0, delta) if torch_form else (delta, 0.0),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def rmsprop(
    w: np.ndarray,
    g: np.ndarray,
    h: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    rho: float,
    delta: float = 1e-8,
    torch_form: bool = False,
    momentum: float = 0.0,
    u: State | None = None,
    centered: bool = False,
    a: State | None = None,
    lr_in_buffer: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """RMSProp: ``h = rho*h + (1-rho)*g*g; w = w - lr*g/sqrt(h + delta)``.

    With ``torch_form``, torch.optim.RMSprop's: ``avg = sqrt(h) + delta`` (delta after the
    square root), and with ``momentum > 0`` its momentum buffer ``u``:
    ``u = momentum*u + g/avg; w = w - lr*u`` (else ``w = w - lr*g/avg``). With
    ``centered`` (torch.optim.RMSprop's ``centered=True``), the running mean ``a`` of the
    gradient is kept too, ``a = rho*a + (1-rho)*g``, and ``h - a*a`` (the variance) takes
    the place of ``h`` in ``avg``.

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      h: running mean of squared gradients, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      rho: decay of the running mean, in [0, 1].
      delta: added under the square root (after it with ``torch_form``); > 0.
      torch_form: torch.optim's placement of delta (above).
      momentum: torch.optim's momentum, in [0, 1] (with ``torch_form`` only).
      u: the momentum buffer, updated in place (needed when ``momentum > 0``).
      centered: keep the running mean of the gradient, ``a`` (above).
      a: the running mean of the gradient, updated in place (needed with ``centered``).
      lr_in_buffer: (centred, with momentum) MXNet's RMSPropAlex: the buffer holds the
        steps, ``u = momentum*u + lr*g/avg; w = w - u`` (torch.optim's takes the rate out:
        the same while the rate does not change).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      step: per segment, the number ``t >= 1`` of this update (the key of the random bits
        of stochastic rounding).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    inner, outer = (0.0, delta) if torch_form else (delta, 0.0)
    if momentum > 0 and (u is None or not (torch_form or (centered and lr_in_buffer))):
        raise ParamError("RMSProp's momentum is torch.optim's (torch_form) or MXNet's "
                         "centred one (centered, lr_in_buffer): it needs one of them and the "
                         "momentum buffer u")
    if centered:
        if a is None:
            raise ParamError("a centred RMSProp needs a, the running mean of the gradient")
        states: dict[str, State] = {"h": h, "a": a}
        if u is not None and momentum > 0:
            states = {"h": h, "u": u, "a": a}
        k = (1.0, lr) if lr_in_buffer and momentum > 0 else (lr, 1.0)
        return _launch("rmsprop_centered_momentum" if momentum > 0 else "rmsprop_centered",
                       w, g, states, offsets, gscale, wd, k,
                       (rho, 1.0 - rho, inner, outer, momentum), clip_low, clip_high, check,
                       stochastic, step, bf16_values, skip=skip, clip_at=clip_at)
    if momentum > 0 and u is not None:  # (u is there: refused above otherwise)
        return _launch("rmsprop_momentum", w, g, {"h": h, "u": u}, offsets, gscale, wd,
                       (lr,), (rho, 1.0 - rho, inner, outer, momentum), clip_low, clip_high,
                       check, stochastic, step, bf16_values, skip=skip, clip_at=clip_at)
    return _launch(
        "rmsprop",
        w,
        g,
        {"h": h},
        offsets,
        gscale,
        wd,
        (lr,),
        (rho, 1.0 - rho, inner, outer, 0.0),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def adadelta(
    w: np.ndarray,
    g: np.ndarray,
    h: State,
    u: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    rho: float,
    delta: float = 1e-8,
    decoupled: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """AdaDelta: ``h = rho*h + (1-rho)*g*g; t = g*sqrt(u + delta)/sqrt(h + delta);
    u = rho*u + (1-rho)*t*t; w = w - lr*t``. With ``decoupled`` (MXNet's AdaDelta), the weight
    decay is not added to the gradient: ``w = w*(1 - lr*wd) - lr*t``.

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      h: running mean of squared gradients, updated in place.
      u: running mean of squared updates, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      rho: decay of the running means, in [0, 1].
      delta: added under the square roots; > 0.
      decoupled: MXNet's decoupled weight decay (above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      step: per segment, the number ``t >= 1`` of this update (the key of the random bits
        of stochastic rounding).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    coupled_wd, decay = _decay(_f64(lr), wd, decoupled)
    return _launch(
        "adadelta",
        w,
        g,
        {"h": h, "u": u},
        offsets,
        gscale,
        coupled_wd,
        (lr, decay),
        (rho, 1.0 - rho, delta),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def adam(
    w: np.ndarray,
    g: np.ndarray,
    m: State,
    v: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    step: PerSegment,
    beta1: float = 0.9,
    beta2: float = 0.999,
    delta: float = 1e-8,
    decoupled: bool = False,
    bias_correction: bool = True,
    vmax: State | None = None,
    delta_before_correction: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """Adam (or AdamW with ``decoupled=True``) with bias correction.

    With ``bias_correction=False``, SINGA v0.3's kAdam exactly:
    ``w = w - lr*m / sqrt(v + delta)`` (``step`` is then not used).

    ``m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
    w = w - lr*(m/(1-beta1^t)) / (sqrt(v/(1-beta2^t)) + delta)``, computed as
    ``w - a*m / (sqrt(v)/b + delta)`` with the per-segment ``a = lr/(1-beta1^t)`` and
    ``b = sqrt(1-beta2^t)`` worked out in float64 (the form torch.optim uses). With
    ``decoupled=True`` the weight decay is not added to the gradient; instead
    ``w = w*(1 - lr*wd)`` before the step.

    With ``vmax`` (AMSGrad, torch.optim.Adam's ``amsgrad=True``), the running maximum of
    ``v`` is kept there, ``vmax = max(vmax, v)``, and takes the place of ``v`` in the
    denominator. With ``delta_before_correction`` (torch.optim.SparseAdam's form), delta is
    added to ``sqrt(v)`` before the bias correction: ``w - lr*sqrt(1-beta2^t)/(1-beta1^t) *
    m/(sqrt(v) + delta)``.

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      m: first-moment estimate, updated in place.
      v: second-moment estimate, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      step: per segment, the number ``t >= 1`` of this update (1 for the first update; also
        the key of the random bits of stochastic rounding).
      beta1, beta2: decays of the moment estimates, in [0, 1).
      delta: added to the denominator (Adam's epsilon); > 0.
      decoupled: AdamW's decoupled weight decay.
      bias_correction: False for SINGA v0.3's kAdam (see above).
      vmax: AMSGrad's running maximum of ``v``, updated in place; None: plain Adam.
      delta_before_correction: torch.optim.SparseAdam's placement of delta (above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    lr64 = _f64(lr)
    if bias_correction:
        t = _step(step, skip)
        a = lr64 / -np.expm1(t * np.log(beta1)) if beta1 > 0 else lr64
        b = 1.0 / np.sqrt(-np.expm1(t * np.log(beta2))) if beta2 > 0 else 1.0
        if delta_before_correction:
            a, b = a / b, 1.0
    else:
        a, b = lr64, 1.0
    coupled_wd, decay = _decay(lr64, wd, decoupled)
    if vmax is not None and not bias_correction:
        raise ParamError("AMSGrad (vmax) is Adam's with bias correction")
    rule = "amsgrad" if vmax is not None else "adam" if bias_correction else "adam_inner_delta"
    return _launch(
        rule,
        w,
        g,
        {"m": m, "v": v, **({"vmax": vmax} if vmax is not None else {})},
        offsets,
        gscale,
        coupled_wd,
        (a, b, decay),
        (beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def adamax(
    w: np.ndarray,
    g: np.ndarray,
    m: State,
    u: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    step: PerSegment,
    beta1: float = 0.9,
    beta2: float = 0.999,
    delta: float = 1e-8,
    bias_correction: bool = True,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """AdaMax, the infinity-norm variant of Adam (Kingma & Ba 2015, section 7.1).

    ``m = beta1*m + (1-beta1)*g; u = max(beta2*u, |g| + delta);
    w = w - lr/(1-beta1^t) * m/u`` (torch.optim.Adamax's placement of delta, which keeps
    ``u > 0``). With ``bias_correction=False``, SINGA v0.3's kAdamMax exactly:
    ``u = max(beta2*u, |g|) + delta; w = w - lr * m/u`` (``step`` is then not used).

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      m: first-moment estimate, updated in place.
      u: exponentially weighted infinity norm, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      step: per segment, the number ``t >= 1`` of this update (1 for the first update; also
        the key of the random bits of stochastic rounding).
      beta1, beta2: decays of the moment and of the norm, in [0, 1).
      delta: keeps the denominator above 0; > 0.
      bias_correction: False for SINGA v0.3's kAdamMax (see above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
      stochastic: round bfloat16 and 8-bit state stochastically (else to nearest).
      bf16_values: with a float32 master copy as ``w``, the values read (float32, w's
        length), written with the new ``w`` rounded to bfloat16 (nearest, ties to even).
      skip: per segment, whether to pass it over (a Param that got no gradient in this
        step): nothing of it is read or written; None: none.
    """
    lr64 = _f64(lr)
    if bias_correction:
        t = _step(step, skip)
        a = lr64 / -np.expm1(t * np.log(beta1)) if beta1 > 0 else lr64
        inner, outer = delta, 0.0
    else:
        a, inner, outer = lr64, 0.0, delta
    return _launch(
        "adamax",
        w,
        g,
        {"m": m, "u": u},
        offsets,
        gscale,
        wd,
        (a,),
        (beta1, 1.0 - beta1, beta2, inner, outer),
        clip_low,
        clip_high,
        check,
        stochastic,
        step,
        bf16_values,
        skip=skip, clip_at=clip_at,
    )


def nadam(
    w: np.ndarray,
    g: np.ndarray,
    m: State,
    v: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    step: PerSegment,
    mu_product: np.ndarray,
    beta1: float = 0.9,
    beta2: float = 0.999,
    delta: float = 1e-8,
    momentum_decay: float = 4e-3,
    decoupled: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """NAdam, Adam with Nesterov momentum (Dozat 2016), as torch.optim.NAdam.

    With the momentum schedule ``mu_t = beta1*(1 - 0.5*0.96^(t*momentum_decay))`` and
    ``P_t = mu_1*...*mu_t`` (``mu_product``, kept per segment by the caller, in float64):
    ``m`` and ``v`` as Adam's, then ``w = w - lr*(1-mu_t)/(1-P_t) * g/d
    - lr*mu_{t+1}/(1-P_{t+1}) * m/d`` with ``d = sqrt(v/(1-beta2^t)) + delta``. With
    ``decoupled=True`` the weight decay is not added to the gradient; instead
    ``w = w*(1 - lr*wd)`` before the step.

    Args:
      w, g, m, v, offsets, lr, wd, gscale, step, beta1, beta2, delta, clip_low, clip_high,
        check, stochastic, bf16_values, skip: as :func:`adam`'s.
      mu_product: per segment, ``P_{t-1}`` (1 before the first update): float64, updated in
        place to ``P_t`` (not for a skipped segment, nor when ``check`` refuses the step).
      momentum_decay: the momentum schedule's decay, > 0.
      decoupled: decoupled weight decay (torch.optim.NAdam's ``decoupled_weight_decay``).
    """
    nseg = np.asarray(offsets).shape[0] - 1
    if not isinstance(mu_product, np.ndarray) or mu_product.dtype != np.float64 \
            or mu_product.shape != (nseg,) or not mu_product.flags.writeable:
        raise ParamError(f"mu_product must be a writeable float64 numpy array with one entry "
                         f"per segment ({nseg}), not {_describe(mu_product)}"
                         + (f" of shape {mu_product.shape}"
                            if isinstance(mu_product, np.ndarray) else ""))
    lr64 = _f64(lr)
    k0, k1, k2, product = nadam_coefficients(lr64, _step(step, skip), mu_product, beta1, beta2,
                                             momentum_decay)
    coupled_wd, decay = _decay(lr64, wd, decoupled)
    found = _launch("nadam", w, g, {"m": m, "v": v}, offsets, gscale, coupled_wd,
                    (k0, k1, k2, decay), (beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta),
                    clip_low, clip_high, check, stochastic, step, bf16_values,
                    skip=skip, clip_at=clip_at)
    if not (check and found):
        done = np.broadcast_to(product, (nseg,))
        if skip is not None:
            done = np.where(np.asarray(skip, bool), mu_product, done)
        mu_product[...] = done
    return found


def radam(
    w: np.ndarray,
    g: np.ndarray,
    m: State,
    v: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    step: PerSegment,
    beta1: float = 0.9,
    beta2: float = 0.999,
    delta: float = 1e-8,
    decoupled: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """RAdam, Adam with the variance of its adaptive rate rectified (Liu et al. 2020), as
    torch.optim.RAdam.

    ``m`` and ``v`` as Adam's; with ``rho_inf = 2/(1-beta2) - 1`` and ``rho_t = rho_inf -
    2t*beta2^t/(1-beta2^t)``: where ``rho_t > 5``, ``w = w - lr*r_t*sqrt(1-beta2^t)/(1-beta1^t)
    * m/(sqrt(v) + delta)`` with ``r_t = sqrt((rho_t-4)(rho_t-2)rho_inf / ((rho_inf-4)
    (rho_inf-2)rho_t))``; before, ``w = w - lr/(1-beta1^t) * m`` (momentum SGD). With
    ``decoupled=True``, ``w = w*(1 - lr*wd)`` first instead of adding ``wd*w`` to ``g``.

    Args:
      w, g, m, v, offsets, lr, wd, gscale, step, beta1, beta2, delta, clip_low, clip_high,
        check, stochastic, bf16_values, skip: as :func:`adam`'s.
      decoupled: decoupled weight decay (torch.optim.RAdam's ``decoupled_weight_decay``).
    """
    lr64 = _f64(lr)
    k0, k1 = radam_coefficients(lr64, _step(step, skip), beta1, beta2)
    coupled_wd, decay = _decay(lr64, wd, decoupled)
    return _launch("radam", w, g, {"m": m, "v": v}, offsets, gscale, coupled_wd,
                   (k0, k1, decay), (beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta),
                   clip_low, clip_high, check, stochastic, step, bf16_values,
                   skip=skip, clip_at=clip_at)


def signum(
    w: np.ndarray,
    g: np.ndarray,
    u: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    momentum: float = 0.9,
    wd_lh: float = 0.0,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """Signum, the sign of the momentum (Bernstein et al. 2018), as MXNet's.

    ``u = momentum*u + (1-momentum)*g; w = (1 - lr*wd_lh)*w - lr*sign(u)`` (``g`` with the
    weight decay added). Without momentum, MXNet's signSGD: ``w = (1 - lr*wd)*w -
    lr*sign(g)``, the weight decay decoupled, ``gscale`` and the clip not used (they do not
    change a sign), ``u`` not touched (may be empty) and ``wd_lh`` refused.

    Args:
      w, g, offsets, lr, wd, gscale, clip_low, clip_high, check, stochastic, bf16_values,
        step, skip, clip_at: as :func:`sgd`'s.
      u: the momentum (MXNet keeps its negative), updated in place.
      momentum: in [0, 1).
      wd_lh: the decoupled weight decay (Loshchilov & Hutter) of Signum with momentum.
    """
    lr64 = _f64(lr)
    if momentum > 0:
        return _launch("signum", w, g, {"u": u}, offsets, gscale, wd,
                       (lr64, 1.0 - lr64 * wd_lh), (momentum, 1.0 - momentum), clip_low,
                       clip_high, check, stochastic, step, bf16_values, skip=skip,
                       clip_at=clip_at)
    if wd_lh > 0:
        raise ParamError("wd_lh is the decoupled weight decay of Signum with momentum; "
                         "without momentum (signSGD) the weight decay is decoupled already: "
                         "give weight_decay")
    return _launch("signsgd", w, g, {}, offsets, 1.0, 0.0, (lr64, 1.0 - lr64 * _f64(wd)), (),
                   0.0, 0.0, check, False, None, bf16_values, skip=skip)


def ftrl(
    w: np.ndarray,
    g: np.ndarray,
    z: State,
    n: State,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    lamda1: float = 0.01,
    beta: float = 1.0,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    step: PerSegment | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """FTRL-Proximal (McMahan et al. 2013, *Ad Click Prediction*), as MXNet's Ftrl.

    ``z += g - (sqrt(n + g*g) - sqrt(n))*w/lr; n += g*g; w = (sign(z)*lamda1 - z) /
    ((beta + sqrt(n))/lr + wd)`` where ``|z| > lamda1``, else 0. The weight decay is the L2
    term of that closed form: it is not added to the gradient.

    Args:
      w, g, offsets, lr, gscale, clip_low, clip_high, check, stochastic, bf16_values, step,
        skip, clip_at: as :func:`sgd`'s (``lr`` > 0).
      z: the accumulated adjusted gradients, updated in place.
      n: the sum of squared gradients, updated in place.
      wd: the L2 regularisation per segment.
      lamda1: the L1 regularisation (MXNet's spelling), >= 0.
      beta: the per-coordinate rate's beta.
    """
    return _launch("ftrl", w, g, {"z": z, "n": n}, offsets, gscale, 0.0, (lr, wd),
                   (lamda1, beta), clip_low, clip_high, check, stochastic, step, bf16_values,
                   skip=skip, clip_at=clip_at)


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


def lamb(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    step: PerSegment,
    beta1: float = 0.9,
    beta2: float = 0.999,
    delta: float = 1e-6,
    bias_correction: bool = True,
    lower_bound: float | None = None,
    upper_bound: float | None = None,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
    stochastic: bool = False,
    bf16_values: np.ndarray | None = None,
    skip: npt.ArrayLike | None = None,
    clip_at: int = 0,
) -> int:
    """LAMB (You et al. 2020, *Large Batch Optimization for Deep Learning*), as MXNet's.

    Per segment: ``m`` and ``v`` as Adam's (the weight decay not in the gradient); ``u =
    m̂/(sqrt(v̂) + delta) + wd*w`` with ``m̂ = m/(1 - beta1^t)``, ``v̂ = v/(1 - beta2^t)``
    (``m``, ``v`` without ``bias_correction``); ``r1 = ||w||`` clamped into ``[lower_bound,
    upper_bound]`` (those given), ``r2 = ||u||``; ``w = w - lr*(r1/r2)*u`` (``lr*u`` when
    either norm is 0). The norms are of the whole segment, so this is two passes: the first
    updates the moments and sums both norms (in float64), the second takes the step.

    Args:
      w, g, m, v, offsets, lr, wd, gscale, step, clip_low, clip_high, check, skip, clip_at:
        as :func:`adam`'s (the clip, wherever it is, comes before the weight decay: LAMB adds
        it after the moments). State is float (not bfloat16 or 8-bit); ``stochastic`` and
        ``bf16_values`` are refused.
      beta1, beta2: decays of the moments, in [0, 1).
      delta: added to ``sqrt(v̂)`` (MXNet's epsilon, 1e-6).
      bias_correction: correct the moments' bias (MXNet's default).
      lower_bound, upper_bound: the clamp of ``||w||`` (None: none).
    """
    if stochastic or bf16_values is not None:
        raise ParamError("LAMB keeps float state and values (no stochastic rounding, no "
                         "bfloat16 master copy)")
    if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64):
        raise ParamError(f"w must be a float32 or float64 numpy array, not {_describe(w)}")
    for role, a in (("g", g), ("m", m), ("v", v)):
        if not isinstance(a, np.ndarray) or a.dtype != w.dtype:
            raise ParamError(f"{role} must be a {w.dtype} numpy array like w (LAMB keeps float "
                             f"state), not {_describe(a)}")
        if a.ndim != 1 or a.shape != w.shape or not a.flags.c_contiguous:
            raise ParamError(f"{role} must be 1-D, C-contiguous and of w's length "
                             f"{w.shape[0]}, got shape {a.shape}")
    for role, a in (("w", w), ("m", m), ("v", v)):
        if a.ndim != 1 or not a.flags.c_contiguous or not a.flags.writeable:
            raise ParamError(f"{role} must be a writeable 1-D C-contiguous array")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != w.shape[0]:
        _bad_offsets(offsets, w)
    nseg = offsets.shape[0] - 1
    t = _step(step, skip)
    if bias_correction:
        k1 = 1.0 / -np.expm1(t * np.log(beta1)) if beta1 > 0 else np.ones_like(t)
        k2 = 1.0 / -np.expm1(t * np.log(beta2)) if beta2 > 0 else np.ones_like(t)
    else:
        k1 = k2 = np.ones_like(t)
    seg = np.zeros((6, nseg), w.dtype)
    try:
        for row, value in enumerate((gscale, wd, lr, k1, k2)):
            seg[row] = value
        if skip is not None:
            seg[5] = np.asarray(skip, bool)
    except ValueError:
        raise ParamError(f"per-segment arguments (and skip) must be scalars or have one entry "
                         f"per segment ({nseg})") from None
    hyp = np.array([clip_low, clip_high, beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta,
                    -1.0 if lower_bound is None else lower_bound,
                    -1.0 if upper_bound is None else upper_bound], w.dtype)
    gv = read_only(g)
    with threads_for(w.shape[0]):
        found = int(_lamb(w, gv, m, v, offsets, seg, hyp, bool(clip_high > clip_low),
                          int(clip_at), bool(check), np.zeros(1, w.dtype)))
    if found == -1:
        _bad_offsets(offsets, w)
    return found


def nadam_coefficients(lr: np.ndarray, t: np.ndarray, mu_product: np.ndarray, beta1: float,
                       beta2: float, momentum_decay: float) -> tuple[np.ndarray, ...]:
    """NAdam's per-segment ``(k0, k1, k2, P_t)`` (:func:`nadam`) in float64, from the rates,
    the update numbers ``t`` and the products ``P_{t-1}`` (one home for the numba kernel's and
    the device rule's)."""
    mu = beta1 * (1.0 - 0.5 * np.power(0.96, t * momentum_decay))
    mu_next = beta1 * (1.0 - 0.5 * np.power(0.96, (t + 1.0) * momentum_decay))
    product = mu_product * mu
    k0 = lr * (1.0 - mu) / (1.0 - product)
    k1 = lr * mu_next / (1.0 - product * mu_next)
    k2 = 1.0 / np.sqrt(-np.expm1(t * np.log(beta2))) if beta2 > 0 else np.ones_like(t)
    return k0, k1, k2, product


def radam_coefficients(lr: np.ndarray, t: np.ndarray, beta1: float, beta2: float
                       ) -> tuple[np.ndarray, np.ndarray]:
    """RAdam's per-segment ``(k0, k1)`` (:func:`radam`) in float64, from the rates and the
    update numbers ``t``, worked out as torch.optim.RAdam does (so that the test
    ``rho_t > 5`` falls alike)."""
    correction1 = 1.0 - np.power(beta1, t)
    correction2 = 1.0 - np.power(beta2, t)
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * t * np.power(beta2, t) / correction2
    tractable = rho_t > 5.0
    rect = np.sqrt(np.where(tractable, (rho_t - 4.0) * (rho_t - 2.0) * rho_inf, 0.0)
                   / ((rho_inf - 4.0) * (rho_inf - 2.0) * np.where(tractable, rho_t, 1.0)))
    k0 = np.where(tractable, lr * rect * np.sqrt(correction2) / correction1, 0.0)
    k1 = np.where(tractable, 0.0, lr / correction1)
    return k0, k1


def _decay(lr: np.ndarray, wd: PerSegment, decoupled: bool) -> tuple[PerSegment, PerSegment]:
    """``(weight decay added to the gradient, factor on w before the step)``: ``(wd, 1)``, or
    for a decoupled decay ``(0, 1 - lr*wd)``."""
    if decoupled:
        return 0.0, 1.0 - lr * _f64(wd)
    return wd, 1.0


def _step(step: PerSegment, skip: npt.ArrayLike | None = None) -> np.ndarray:
    """The update numbers ``t`` per segment (1 in place of a skipped segment's: its
    coefficients are not used)."""
    t = _f64(step)
    if skip is not None and t.ndim:
        t = np.where(np.asarray(skip, bool), np.maximum(t, 1.0), t)
    if np.any(t < 1):
        raise ParamError(f"step must be >= 1 (the number of this update), got {step!r}")
    return t


def state_like(w: np.ndarray, state_dtype: str = "float32", signed: bool = True) -> State:
    """A zero state array for values ``w`` (one segment), kept as ``state_dtype``."""
    n = w.shape[0]
    if state_dtype == "float32":
        return np.zeros(n, w.dtype)
    if state_dtype == "bfloat16":
        return np.zeros(n, np.uint16)
    quant.check_state_dtype(state_dtype)
    return np.zeros(n, np.int8 if signed else np.uint8), np.zeros(-(-n // BLOCK), np.float32)


def warmup(dtype: npt.DTypeLike = np.float32, state_dtype: str = "float32", *,
           stochastic: bool = False, sizes: tuple[int, ...] = (1, CHUNK + 1)) -> None:
    """Compile, or load from numba's on-disk cache, every method's kernel for values of
    ``dtype`` and state kept as ``state_dtype``, for calls of ``sizes`` values (by default
    both kinds: one chunk, serial, and more, parallel).

    The compiled kernels, even for calls small enough to take the NumPy form
    (:mod:`.small_updates`) when a job makes them.

    Args:
      dtype: float32 or float64.
      state_dtype: float32 (the values' type), bfloat16 or int8.
      stochastic: the kernels that round stochastically.
      sizes: the numbers of values of the calls to prepare for.
    """
    with forms.compiled_only():
        _warmup(dtype, state_dtype, stochastic, sizes)


def _warmup(dtype: npt.DTypeLike, state_dtype: str, stochastic: bool,
            sizes: tuple[int, ...]) -> None:
    for n in sizes:
        w = np.zeros(n, dtype)
        offsets = np.array([0, n], np.int64)

        def st(rule: str, i: int, w: np.ndarray = w) -> State:
            return state_like(w, state_dtype, signed_state(rule)[i])

        kw: dict[str, Any] = {"stochastic": stochastic, "step": 1}
        if state_dtype == "float32":
            sgd(w, w.copy(), w[:0], offsets, 0.0)
        for torch_form in (False, True):
            sgd(w, w.copy(), st("momentum", 0), offsets, 0.0, momentum=0.5,
                torch_form=torch_form, **kw)
        nesterov(w, w.copy(), st("nesterov", 0), offsets, 0.0, momentum=0.5, **kw)
        nesterov(w, w.copy(), st("nag_mxnet", 0), offsets, 0.0, momentum=0.5, mxnet=True,
                 **kw)
        adagrad(w, w.copy(), st("adagrad", 0), offsets, 0.0, **kw)
        rmsprop(w, w.copy(), st("rmsprop", 0), offsets, 0.0, rho=0.9, **kw)
        rmsprop(w, w.copy(), st("rmsprop_momentum", 0), offsets, 0.0, rho=0.9,
                torch_form=True, momentum=0.5, u=st("rmsprop_momentum", 1), **kw)
        adadelta(w, w.copy(), st("adadelta", 0), st("adadelta", 1), offsets, 0.0, rho=0.9,
                 **kw)
        for bc in (True, False):
            adam(w, w.copy(), st("adam", 0), st("adam", 1), offsets, 0.0, bias_correction=bc,
                 **kw)
        adamax(w, w.copy(), st("adamax", 0), st("adamax", 1), offsets, 0.0, **kw)
        adam(w, w.copy(), st("amsgrad", 0), st("amsgrad", 1), offsets, 0.0,
             vmax=st("amsgrad", 2), **kw)
        for momentum in (0.0, 0.5):
            rule = "rmsprop_centered_momentum" if momentum else "rmsprop_centered"
            rmsprop(w, w.copy(), st(rule, 0), offsets, 0.0, rho=0.9, torch_form=True,
                    momentum=momentum, u=st(rule, 1) if momentum else None, centered=True,
                    a=st(rule, 2 if momentum else 1), **kw)
        nadam(w, w.copy(), st("nadam", 0), st("nadam", 1), offsets, 0.0,
              mu_product=np.ones(1), **kw)
        radam(w, w.copy(), st("radam", 0), st("radam", 1), offsets, 0.0, **kw)
        signum(w, w.copy(), st("signum", 0), offsets, 0.0, momentum=0.5, **kw)
        signum(w, w.copy(), w[:0], offsets, 0.0, momentum=0.0, **kw)
        ftrl(w, w.copy(), st("ftrl", 0), st("ftrl", 1), offsets, 1.0, **kw)
