"""Fused numeric update kernels over flat parameter buffers (numba).

All Params of a server slice live in one contiguous 1-D array per role: values ``w``, gradient
``g`` and the updater state (``h``, ``u``; ``m``, ``v`` for Adam; ``m``, ``u`` for AdaMax).
One call updates many Params ("segments") at once: segment ``k`` is ``[offsets[k],
offsets[k+1])`` of the arrays passed, and the per-segment arguments (``lr``, ``wd``,
``gscale``, ``step``) are scalars or arrays with one entry per segment.

For every element, in the order of SPEC §5:

1. clip ``g`` into ``[clip_low, clip_high]`` if ``clip_high > clip_low``;
2. ``g = g * gscale``;
3. if ``wd > 0``: ``g = g + wd * w`` (not for AdamW, whose decay is decoupled);
4. the method's rule, which updates ``w`` and the state in place.

The gradient is only read. Every kernel is one pass over memory: each array is read once and
written at most once. Arithmetic is done in the arrays' precision (float32 or float64): the
per-segment coefficients are computed in float64 by the Python wrapper and then rounded to the
data type, never the other way round.

Importing this module is what pays the numba import; compiled kernels are cached on disk
(``cache=True``), and :func:`warmup` compiles or loads all of them for one dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from numba import get_num_threads, prange, set_num_threads
from numba.extending import register_jitable

from .config import ParamError
from .numba_cache import njit

__all__ = ["adadelta", "adagrad", "adam", "adamax", "nesterov", "rmsprop", "sgd", "threads_for",
           "warmup"]

CHUNK = 1 << 15
"""Elements per parallel work item. The range is cut into chunks regardless of segment
boundaries, so one 16M-element Param and 200 small ones are balanced alike."""

_NUM_PARAMS = 5  # call-wide hyper-parameters a rule may use: p = (p0, ..., p4)
_NUM_COEFS = 3  # per-segment coefficients a rule may use: k = (k0, k1, k2)

PerSegment = npt.ArrayLike
"""A float (the same for every segment) or a 1-D array with one entry per segment."""


# ---------------------------------------------------------------------------------------------
# Per-element rules. Each gets the element's value ``w``, its prepared gradient ``g`` (clipped,
# scaled, weight-decayed), its state elements ``h`` and ``u``, the per-segment coefficients
# ``k`` and the call-wide hyper-parameters ``p``, and returns the new ``(w, h, u)``. The driver
# reads and writes only the first ``nstate`` state arrays; a rule returns the others unchanged.
# All numbers are of the data type, so the arithmetic stays in it.


@register_jitable(inline="always")
def _sgd_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr
    return w - k[0] * g, h, u


@register_jitable(inline="always")
def _momentum_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum. SINGA's form: k0 = lr, k1 = 1 (h = m*h - lr*g; w = w + h). torch.optim's
    # form: k0 = -(1 - dampening), k1 = -lr (h = m*h + (1 - dampening)*g; w = w - lr*h), so
    # that h is torch's momentum buffer and a new rate applies to the whole of it.
    h = p[0] * h - k[0] * g
    return w + k[1] * h, h, u


@register_jitable(inline="always")
def _nesterov_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum, p1 = 1 + momentum. SINGA's form: k0 = lr, k1 = 1. torch.optim's form:
    # k0 = 1, k1 = lr (h is torch's buffer m*h + g, and (1+m)*h1 - m*h = g + m*h1 its step).
    h1 = p[0] * h + k[0] * g
    return w - k[1] * (p[1] * h1 - p[0] * h), h1, u


@register_jitable(inline="always")
def _adagrad_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr; p0 = delta under the square root (SINGA's form), p1 = delta after it
    # (torch.optim's eps); the other is 0.
    h = h + g * g
    return w - k[0] * g / (np.sqrt(h + p[0]) + p[1]), h, u


@register_jitable(inline="always")
def _rmsprop_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr; p0 = rho, p1 = 1 - rho, p2 = delta under the square root (SINGA's form),
    # p3 = delta after it (torch.optim's eps); p4 = momentum (torch.optim's, with u its
    # buffer: u = m*u + g/avg; w = w - lr*u), 0 for none.
    h = p[0] * h + p[1] * g * g
    if p[4] > 0:
        u = p[4] * u + g / (np.sqrt(h + p[2]) + p[3])
        return w - k[0] * u, h, u
    return w - k[0] * g / (np.sqrt(h + p[2]) + p[3]), h, u


@register_jitable(inline="always")
def _adadelta_rule(w, g, h, u, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr; p0 = rho, p1 = 1 - rho, p2 = delta.
    # sqrt(u + delta) / sqrt(h + delta) as one square root of a quotient: one sqrt fewer.
    h = p[0] * h + p[1] * g * g
    t = g * np.sqrt((u + p[2]) / (h + p[2]))
    u = p[0] * u + p[1] * t * t
    return w - k[0] * t, h, u


@register_jitable(inline="always")
def _adam_rule(w, g, m, v, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr / (1 - beta1^t), k1 = 1 / sqrt(1 - beta2^t), k2 = 1 - lr * wd (AdamW) or 1 (Adam);
    # p0 = beta1, p1 = 1 - beta1, p2 = beta2, p3 = 1 - beta2, p4 = delta
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / (np.sqrt(v) * k[1] + p[4]), m, v


@register_jitable(inline="always")
def _adam_inner_delta_rule(w, g, m, v, k, p):  # type: ignore[no-untyped-def]
    # SINGA v0.3's kAdam: no bias correction, delta under the square root.
    # k0 = lr, k2 = 1 - lr * wd (AdamW) or 1; p as in _adam_rule
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / np.sqrt(v + p[4]), m, v


@register_jitable(inline="always")
def _adamax_rule(w, g, m, u, k, p):  # type: ignore[no-untyped-def]
    # AdaMax, Adam's infinity norm (Kingma & Ba, section 7.1): u = max(beta2*u, |g| + p3) + p4
    # with (p3, p4) = (delta, 0) as torch.optim.Adamax, or (0, delta) as SINGA v0.3.
    # k0 = lr / (1 - beta1^t) (or lr); p0 = beta1, p1 = 1 - beta1, p2 = beta2
    m = p[0] * m + p[1] * g
    u = max(p[2] * u, abs(g) + p[3]) + p[4]
    return w - k[0] * m / u, m, u


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


# ---------------------------------------------------------------------------------------------
# The one driver. ``_fused_kernel(rule, nstate)`` makes a parallel kernel
#
#     kernel(w, g, h, u, offsets, seg, hyp, clip, check) -> int
#
# with ``seg[:, s] = (gscale, wd, k0, k1, k2)`` for segment ``s`` and
# ``hyp = (clip_low, clip_high, p0, ..., p4)``, all of the data type. It first checks that
# ``offsets`` never decrease (returning False, before writing anything, if they do: the walk
# below relies on it to stay inside the arrays). Then chunks of CHUNK elements run in parallel;
# each finds its first segment by binary search over ``offsets`` and walks forward. The inner
# loop runs over views of one segment's part of the chunk, with an index from 0, so that LLVM
# sees non-negative unit-stride indices and vectorises it. ``rule`` and ``nstate`` are closure
# constants: numba compiles the rule into the loop, the unused state branches vanish, and the
# cache key (which hashes the closure: a module-level function and an int) is the same in
# every process. ``error_model="numpy"``: a division by zero gives inf or nan, as in NumPy,
# instead of raising from inside the loop. With ``check``, a first parallel pass reads the
# gradient only and returns its number of NaN and Inf, writing nothing, when there are any:
# the step is refused whole (the second pass follows at once, its threads still awake).


def _fused_kernel(rule: Callable[..., Any], nstate: int, name: str) -> Any:
    def kernel(w, g, h, u, offsets, seg, hyp, clip, check):  # type: ignore[no-untyped-def]
        for s in range(offsets.shape[0] - 1):
            if offsets[s + 1] < offsets[s]:
                return -1
        n = w.shape[0]
        if check:  # a read-only pass first: a gradient with NaN or Inf writes nothing
            found = 0
            for c in prange((n + CHUNK - 1) // CHUNK):
                gc = g[c * CHUNK:min(c * CHUNK + CHUNK, n)]
                count = 0
                for i in range(gc.shape[0]):
                    z = gc[i] - gc[i]
                    count += z != z
                found += count
            if found > 0:
                return found
        clip_low = hyp[0]
        clip_high = hyp[1]
        p = (hyp[2], hyp[3], hyp[4], hyp[5], hyp[6])
        nonfinite = 0
        for c in prange((n + CHUNK - 1) // CHUNK):
            pos = c * CHUNK
            stop = min(pos + CHUNK, n)
            s = _segment_of(offsets, pos)
            while pos < stop:
                end = min(offsets[s + 1], stop)
                gscale = seg[0, s]
                wd = seg[1, s]
                k = (seg[2, s], seg[3, s], seg[4, s])
                ws = w[pos:end]
                gs = g[pos:end]
                hs = h[pos:end] if nstate >= 1 else h
                us = u[pos:end] if nstate >= 2 else u
                bad = 0
                for i in range(end - pos):
                    gi = gs[i]
                    d = gi - gi  # 0, or NaN for an Inf or NaN: counted in the same pass
                    bad += d != d
                    if clip:
                        gi = min(max(gi, clip_low), clip_high)
                    gi = gi * gscale
                    wi = ws[i]
                    if wd > 0:
                        gi = gi + wd * wi
                    # The stand-in for a state a rule does not keep is any value of the type.
                    hi = hs[i] if nstate >= 1 else gi
                    ui = us[i] if nstate >= 2 else gi
                    wi, hi, ui = rule(wi, gi, hi, ui, k, p)
                    ws[i] = wi
                    if nstate >= 1:
                        hs[i] = hi
                    if nstate >= 2:
                        us[i] = ui
                nonfinite += bad
                pos = end
                s += 1
        return nonfinite

    kernel.__name__ = kernel.__qualname__ = name  # names the cache files, one set per kernel
    return njit(nogil=True, parallel=True, cache=True, fastmath=False, error_model="numpy")(kernel)


_sgd_kernel = _fused_kernel(_sgd_rule, 0, "_sgd_kernel")
_momentum_kernel = _fused_kernel(_momentum_rule, 1, "_momentum_kernel")
_nesterov_kernel = _fused_kernel(_nesterov_rule, 1, "_nesterov_kernel")
_adagrad_kernel = _fused_kernel(_adagrad_rule, 1, "_adagrad_kernel")
_rmsprop_kernel = _fused_kernel(_rmsprop_rule, 1, "_rmsprop_kernel")
_rmsprop_momentum_kernel = _fused_kernel(_rmsprop_rule, 2, "_rmsprop_momentum_kernel")
_adadelta_kernel = _fused_kernel(_adadelta_rule, 2, "_adadelta_kernel")
_adam_kernel = _fused_kernel(_adam_rule, 2, "_adam_kernel")
_adam_inner_delta_kernel = _fused_kernel(_adam_inner_delta_rule, 2, "_adam_inner_delta_kernel")
_adamax_kernel = _fused_kernel(_adamax_rule, 2, "_adamax_kernel")

_KERNELS = (
    _sgd_kernel,
    _momentum_kernel,
    _nesterov_kernel,
    _adagrad_kernel,
    _rmsprop_kernel,
    _rmsprop_momentum_kernel,
    _adadelta_kernel,
    _adam_kernel,
    _adam_inner_delta_kernel,
    _adamax_kernel,
)


# ---------------------------------------------------------------------------------------------
# The Python side: check the buffers, round the coefficients to the data type, launch.


def _launch(
    kernel: Any,
    w: np.ndarray,
    g: np.ndarray,
    states: dict[str, np.ndarray],
    offsets: npt.ArrayLike,
    gscale: PerSegment,
    wd: PerSegment,
    k: tuple[PerSegment, ...],
    p: tuple[float, ...],
    clip_low: float,
    clip_high: float,
    check: bool = False,
) -> int:
    if not isinstance(w, np.ndarray) or w.dtype not in (np.float32, np.float64):
        raise ParamError(f"w must be a float32 or float64 numpy array, not {_describe(w)}")
    dtype = w.dtype
    for role, a in (("w", w), ("g", g), *states.items()):
        if not isinstance(a, np.ndarray) or a.dtype != dtype:
            raise ParamError(f"{role} must be a {dtype} numpy array like w, not {_describe(a)}")
        if a.ndim != 1 or a.shape != w.shape or not a.flags.c_contiguous:
            raise ParamError(
                f"{role} must be 1-D, C-contiguous and of w's length {w.shape[0]}, "
                f"got shape {a.shape} (contiguous: {a.flags.c_contiguous})"
            )
    for role, a in (("w", w), *states.items()):
        if not a.flags.writeable:
            raise ParamError(f"{role} is read-only; it is updated in place")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != w.shape[0]:
        _bad_offsets(offsets, w)
    nseg = offsets.shape[0] - 1
    seg = np.empty((2 + _NUM_COEFS, nseg), dtype)
    try:
        for row, value in enumerate((gscale, wd, *k)):
            seg[row] = value
    except ValueError:  # numpy's: a row of the wrong length
        raise ParamError(
            f"per-segment arguments must be scalars or have one entry per segment ({nseg})"
        ) from None
    hyp = np.zeros(2 + _NUM_PARAMS, dtype)
    hyp[: 2 + len(p)] = (clip_low, clip_high, *p)
    # A read-only view: one compiled signature for g, whether or not the caller's is writeable.
    gv = g.view()
    gv.flags.writeable = False
    h, u = (*states.values(), w[:0], w[:0])[:2]
    with threads_for(w.shape[0]):
        nonfinite = int(kernel(w, gv, h, u, offsets, seg, hyp, bool(clip_high > clip_low),
                               bool(check)))
    if nonfinite < 0:
        _bad_offsets(offsets, w)
    return nonfinite


@contextlib.contextmanager
def threads_for(n: int, chunk: int = CHUNK) -> Iterator[None]:
    """Run the parallel kernels of this block on no more threads than ``n`` values have
    chunks of ``chunk``. A parallel region waits at its end for every thread it started, and
    on a busy machine a thread with nothing to do may not be scheduled for milliseconds
    (measured: 1.4 ms instead of 9 µs for one chunk of 5k values on two loaded cores)."""
    threads = get_num_threads()
    chunks = max(1, -(-n // chunk))
    if chunks >= threads:
        yield
        return
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
# the caller decides what a non-finite gradient means).


def sgd(
    w: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
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
    """
    if momentum > 0:
        keep = 1.0 - _f64(dampening)
        k = (-keep, -_f64(lr)) if torch_form else (_f64(lr) * keep, 1.0)
        return _launch(
            _momentum_kernel,
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
        )
    else:
        return _launch(
            _sgd_kernel, w, g, {}, offsets, gscale, wd, (lr,), (), clip_low, clip_high, check
        )


def nesterov(
    w: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    momentum: float,
    torch_form: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
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
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    return _launch(
        _nesterov_kernel,
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
    )


def adagrad(
    w: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    delta: float = 1e-8,
    torch_form: bool = False,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
) -> int:
    """AdaGrad: ``h = h + g*g; w = w - lr*g/sqrt(h + delta)``; with ``torch_form``,
    torch.optim.Adagrad's ``w = w - lr*g/(sqrt(h) + delta)``.

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
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    return _launch(
        _adagrad_kernel,
        w,
        g,
        {"h": h},
        offsets,
        gscale,
        wd,
        (lr,),
        (0.0, delta) if torch_form else (delta, 0.0),
        clip_low,
        clip_high,
        check,
    )


def rmsprop(
    w: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    rho: float,
    delta: float = 1e-8,
    torch_form: bool = False,
    momentum: float = 0.0,
    u: np.ndarray | None = None,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
) -> int:
    """RMSProp: ``h = rho*h + (1-rho)*g*g; w = w - lr*g/sqrt(h + delta)``.

    With ``torch_form``, torch.optim.RMSprop's: ``avg = sqrt(h) + delta`` (delta after the
    square root), and with ``momentum > 0`` its momentum buffer ``u``:
    ``u = momentum*u + g/avg; w = w - lr*u`` (else ``w = w - lr*g/avg``).

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
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    inner, outer = (0.0, delta) if torch_form else (delta, 0.0)
    if momentum > 0:
        if u is None or not torch_form:
            raise ParamError("RMSProp's momentum is torch.optim's: it needs torch_form and "
                             "the momentum buffer u")
        return _launch(_rmsprop_momentum_kernel, w, g, {"h": h, "u": u}, offsets, gscale, wd,
                       (lr,), (rho, 1.0 - rho, inner, outer, momentum), clip_low, clip_high,
                       check)
    return _launch(
        _rmsprop_kernel,
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
    )


def adadelta(
    w: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    u: np.ndarray,
    offsets: npt.ArrayLike,
    lr: PerSegment,
    wd: PerSegment = 0.0,
    gscale: PerSegment = 1.0,
    *,
    rho: float,
    delta: float = 1e-8,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
) -> int:
    """AdaDelta: ``h = rho*h + (1-rho)*g*g; t = g*sqrt(u + delta)/sqrt(h + delta);
    u = rho*u + (1-rho)*t*t; w = w - lr*t``.

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
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    return _launch(
        _adadelta_kernel,
        w,
        g,
        {"h": h, "u": u},
        offsets,
        gscale,
        wd,
        (lr,),
        (rho, 1.0 - rho, delta),
        clip_low,
        clip_high,
        check,
    )


def adam(
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
    delta: float = 1e-8,
    decoupled: bool = False,
    bias_correction: bool = True,
    clip_low: float = 0.0,
    clip_high: float = 0.0,
    check: bool = False,
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

    Args:
      w: values, updated in place (1-D, float32 or float64, C-contiguous).
      g: gradient of the same dtype and length; only read.
      m: first-moment estimate, updated in place.
      v: second-moment estimate, updated in place.
      offsets: segment boundaries, int64, ``offsets[0] == 0``, ``offsets[-1] == len(w)``.
      lr: learning rate per segment (already times ``lr_scale``).
      wd: weight decay per segment (already times ``wd_scale``); applied when > 0.
      gscale: gradient scale per segment (``1/number_of_sharers``).
      step: per segment, the number ``t >= 1`` of this update (1 for the first update).
      beta1, beta2: decays of the moment estimates, in [0, 1).
      delta: added to the denominator (Adam's epsilon); > 0.
      decoupled: AdamW's decoupled weight decay.
      bias_correction: False for SINGA v0.3's kAdam (see above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    lr64 = _f64(lr)
    if bias_correction:
        t = _step(step)
        a = lr64 / -np.expm1(t * np.log(beta1)) if beta1 > 0 else lr64
        b = 1.0 / np.sqrt(-np.expm1(t * np.log(beta2))) if beta2 > 0 else 1.0
    else:
        a, b = lr64, 1.0
    if decoupled:
        coupled_wd: PerSegment = 0.0
        decay: PerSegment = 1.0 - lr64 * _f64(wd)
    else:
        coupled_wd, decay = wd, 1.0
    return _launch(
        _adam_kernel if bias_correction else _adam_inner_delta_kernel,
        w,
        g,
        {"m": m, "v": v},
        offsets,
        gscale,
        coupled_wd,
        (a, b, decay),
        (beta1, 1.0 - beta1, beta2, 1.0 - beta2, delta),
        clip_low,
        clip_high,
        check,
    )


def adamax(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    u: np.ndarray,
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
      step: per segment, the number ``t >= 1`` of this update (1 for the first update).
      beta1, beta2: decays of the moment and of the norm, in [0, 1).
      delta: keeps the denominator above 0; > 0.
      bias_correction: False for SINGA v0.3's kAdamMax (see above).
      clip_low, clip_high: clip the gradient into this range if ``clip_high > clip_low``.
      check: read the gradient first, and write nothing if it holds NaN or Inf.
    """
    lr64 = _f64(lr)
    if bias_correction:
        t = _step(step)
        a = lr64 / -np.expm1(t * np.log(beta1)) if beta1 > 0 else lr64
        inner, outer = delta, 0.0
    else:
        a, inner, outer = lr64, 0.0, delta
    return _launch(
        _adamax_kernel,
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
    )


def _step(step: PerSegment) -> np.ndarray:
    t = _f64(step)
    if np.any(t < 1):
        raise ParamError(f"step must be >= 1 (the number of this update), got {step!r}")
    return t


def warmup(dtype: npt.DTypeLike = np.float32) -> None:
    """Compile, or load from numba's on-disk cache, every kernel for ``dtype``.

    Args:
      dtype: float32 or float64.
    """
    w = np.zeros(1, dtype)
    offsets = np.array([0, 1], np.int64)
    sgd(w, w.copy(), w[:0], offsets, 0.0)
    sgd(w, w.copy(), w.copy(), offsets, 0.0, momentum=0.5)
    nesterov(w, w.copy(), w.copy(), offsets, 0.0, momentum=0.5)
    adagrad(w, w.copy(), w.copy(), offsets, 0.0)
    rmsprop(w, w.copy(), w.copy(), offsets, 0.0, rho=0.9)
    rmsprop(w, w.copy(), w.copy(), offsets, 0.0, rho=0.9, torch_form=True, momentum=0.5,
            u=w.copy())
    adadelta(w, w.copy(), w.copy(), w.copy(), offsets, 0.0, rho=0.9)
    adam(w, w.copy(), w.copy(), w.copy(), offsets, 0.0, step=1)
    adam(w, w.copy(), w.copy(), w.copy(), offsets, 0.0, step=1, bias_correction=False)
    adamax(w, w.copy(), w.copy(), w.copy(), offsets, 0.0, step=1)
