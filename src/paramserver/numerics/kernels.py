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

This module is the Python side: it checks the buffers, rounds the coefficients to the data
type and launches a kernel. It imports no numba. A small call of float state takes its NumPy
form (:mod:`.small_updates`), which writes the same bits; any other call imports
:mod:`.fused` (numba, the compiled kernels) on its first use. The rules themselves are
:mod:`.rules`, one home for both forms. Compiled kernels are cached on disk, and
:func:`warmup` compiles or loads all of them for one dtype.
"""

from __future__ import annotations

from typing import Any, NoReturn, Union

import numpy as np
import numpy.typing as npt

from ..config import ParamError
from . import forms, quant, small_updates
from .rules import (
    _NUM_COEFS,
    _NUM_PARAMS,
    _SKIP,
    CHUNK,
    CLIP_DECAYED,
    CLIP_GRADIENT,
    CLIP_SCALED,
    RULES,
    check_clip_at,
)

__all__ = ["BLOCK", "CHUNK", "CLIP_DECAYED", "CLIP_GRADIENT", "CLIP_SCALED", "State",
           "adadelta", "adagrad", "adam", "adamax", "count_nonfinite", "ftrl", "lamb", "nadam",
           "nesterov", "radam", "rmsprop", "sgd", "signed_state", "signum", "state_like",
           "warmup"]

BLOCK = quant.BLOCK
"""Values per block of 8-bit state (one float32 scale each)."""

PerSegment = npt.ArrayLike
"""A float (the same for every segment) or a 1-D array with one entry per segment."""


def signed_state(rule: str) -> tuple[bool, ...]:
    """For each state array of kernel ``rule`` (``"adam"``, ``"momentum"``), whether it may be
    negative."""
    return quant.SIGNED_STATE[rule]



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
    arrays = [a for _, a, _ in found] + [w[:0]] * 3
    scales = [sc for _, _, sc in found if sc is not None] + [_NO_SCALES] * 3
    n = w.shape[0]
    check_clip_at(clip_at)
    if small_updates.applies(rule, n, nseg, codes, master):  # no compiler: see there
        nonfinite = small_updates.update(
            RULES[rule], w, g, [a for _, a, _ in found], offsets, seg, hyp,
            bool(clip_high > clip_low), bool(check), int(clip_at), _SKIP)
        if nonfinite == -1:
            _bad_offsets(offsets, w)
        return nonfinite
    parallel = n > CHUNK
    from . import fused  # numba, and its compiler with the first kernel

    kernel = fused.kernel_for(rule, codes, stochastic, parallel, master, clip_at)
    gv = fused.read_only(g)
    wv = bf16_values if bf16_values is not None else w[:0]
    args = (w, wv, gv, *arrays[:3], *scales[:3], offsets, counts, seg, hyp,
            bool(clip_high > clip_low), bool(check))
    if parallel:
        with fused.threads_for(n):
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


def _bad_offsets(offsets: np.ndarray, w: np.ndarray) -> NoReturn:
    raise ParamError(
        f"offsets must be non-decreasing from 0 to len(w) = {w.shape[0]}, got {offsets!r}"
    )


def _describe(a: object) -> str:
    return f"{type(a).__name__} of {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__


def _f64(x: PerSegment) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def count_nonfinite(g: np.ndarray) -> int:
    """The number of NaN and Inf in ``g`` (1-D, float32 or float64): the update kernels'
    read-only check (``check=True``) on its own, for a gradient read before it is sent."""
    if not isinstance(g, np.ndarray) or g.dtype not in (np.float32, np.float64) \
            or g.ndim != 1:
        raise ParamError(f"g must be a 1-D float32 or float64 numpy array, not {_describe(g)}"
                         + (f" of shape {g.shape}" if isinstance(g, np.ndarray) else ""))
    from . import fused

    gv = fused.read_only(np.ascontiguousarray(g))
    if g.shape[0] <= 4 * CHUNK:  # one task, read in the calling thread: no threads to limit
        return int(fused._count(gv))  # (limiting them took 13 µs of a 10 µs check)
    with fused.threads_for(g.shape[0], 4 * CHUNK):  # a task reads four chunks
        return int(fused._count(gv))




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
    from . import fused

    gv = fused.read_only(g)
    with fused.threads_for(w.shape[0]):
        found = int(fused._lamb(w, gv, m, v, offsets, seg, hyp, bool(clip_high > clip_low),
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


#: What :mod:`.fused` holds (numba's), reached here as before: imported on first use.
_FUSED = frozenset({"kernel_for", "read_only", "threads_for", "_RULES", "_made",
                    "_fused_kernel"})


def __getattr__(name: str) -> Any:
    if name in _FUSED:
        from . import fused

        return getattr(fused, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
