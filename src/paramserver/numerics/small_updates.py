"""A small update in NumPy, bit for bit what the compiled kernel writes (:mod:`.kernels`).

Why a second form: the first compiled kernel a process runs loads numba's compiler, LLVM's
library and numba's runtime, about 85 MB of resident memory even when the kernel comes from
numba's cache. For SINGA's LeNet job that is most of the run's own memory (193 MB against
SINGA's 35). This form is the slower: each NumPy operation is a pass of its own, about ten a
Param. SINGA's momentum over LeNet's 431,080 float32 values in 8 Params takes 1.24 ms a step
against 0.22 ms compiled on two threads (medians of 9 interleaved rounds, quiet machine);
that is about 1 ms of a 40 ms step, 2.5 %, for 71 MB less memory. So an update call that
:func:`applies` to takes this form, and a job whose fills are small too (:mod:`.rng_arrays`)
never loads the compiler.

The driver does what the compiled one does for float state, element by element, with the
same rule functions (:mod:`.kernels` writes each rule once, for both): clip, scale, weight
decay, the rule, the count of NaN and Inf. Each NumPy operation is one correctly rounded
IEEE operation of the arrays' type, as the compiled code's are (no fused multiply-add: numba
compiles without fast-math). A test compares the two forms bit for bit, for every rule
listed in :data:`ARRAY_RULES`, with NaN and Inf, skipped segments and every clip position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import forms

__all__ = ["ARRAY_RULES", "MOST_SEGMENTS", "SMALL_UPDATE", "applies", "update"]

#: Calls of at most this many values take the NumPy form: LeNet's 431,080, with its three
#: arrays (12 bytes a value) still in a server CPU's last-level cache, where the extra passes
#: cost little. At 1M values NumPy took 4 ms against 0.5 ms compiled here.
SMALL_UPDATE = 1 << 19
#: ... of at most this many segments: each is a few NumPy calls from Python.
MOST_SEGMENTS = 32
#: The rules written with arithmetic only (no branch on an element's value), so that the
#: same function runs on arrays.
ARRAY_RULES = frozenset({"sgd", "momentum", "singa_momentum", "nesterov", "nag_mxnet",
                         "adagrad", "rmsprop", "rmsprop_momentum", "adadelta", "adam",
                         "adam_inner_delta", "nadam", "radam"})


def applies(rule: str, n: int, segments: int, codes: tuple[str, ...], master: bool) -> bool:
    """Whether an update call of ``rule`` over ``n`` values in ``segments`` segments, with
    state kept as ``codes`` (and a bfloat16 copy of the values with ``master``), takes the
    NumPy form: float state only, a rule of :data:`ARRAY_RULES`, and a small call (not
    within :func:`.forms.compiled_only`)."""
    return (n <= SMALL_UPDATE and segments <= MOST_SEGMENTS and not master
            and rule in ARRAY_RULES and all(c == "float" for c in codes)
            and forms.numpy_allowed())


def update(rule: Callable[..., Any], w: np.ndarray, g: np.ndarray, states: list[np.ndarray],
           offsets: np.ndarray, seg: np.ndarray, hyp: np.ndarray, clip: bool, check: bool,
           clip_at: int, skip_row: int) -> int:
    """The compiled kernel's update (``kernels._fused_kernel`` over float state) in NumPy.

    Arguments as the kernel takes them: ``states`` the rule's state arrays (``w``'s type),
    ``seg[:, s]`` segment ``s``'s (gscale, wd, k0, k1, k2, k3, ...) with its skip flag in row
    ``skip_row``, ``hyp`` (clip_low, clip_high, p0 ... p4), all of ``w``'s type.

    Returns:
        As the kernel: the number of NaN and Inf in the gradient of the segments updated;
        with ``check``, that of the whole gradient when there are any (nothing written);
        -1, writing nothing, if ``offsets`` decrease.
    """
    if np.any(offsets[1:] < offsets[:-1]):
        return -1
    if check:
        found = _nonfinite(g)
        if found:
            return found
    with np.errstate(all="ignore"):  # NaN and Inf as the compiled code makes them: silently
        return _update(rule, w, g, states, offsets, seg, hyp, clip, clip_at, skip_row)


def _update(rule: Callable[..., Any], w: np.ndarray, g: np.ndarray, states: list[np.ndarray],
            offsets: np.ndarray, seg: np.ndarray, hyp: np.ndarray, clip: bool, clip_at: int,
            skip_row: int) -> int:
    low, high = hyp[0], hyp[1]
    p = tuple(hyp[2:7])
    nstate = len(states)
    nonfinite = 0
    for s in range(offsets.shape[0] - 1):
        a, b = int(offsets[s]), int(offsets[s + 1])
        if a == b or seg[skip_row, s] != 0:  # no gradient: the segment is not touched
            continue
        gs = g[a:b]
        nonfinite += _nonfinite(gs)
        gi = _clip(gs, low, high) if clip and clip_at == 0 else gs
        gi = gi * seg[0, s]
        if clip and clip_at == 1:
            gi = _clip(gi, low, high)
        ws = w[a:b]
        wd = seg[1, s]
        if wd > 0:
            gi = gi + wd * ws
        if clip and clip_at == 2:
            gi = _clip(gi, low, high)
        k = (seg[2, s], seg[3, s], seg[4, s], seg[5, s])
        # The stand-in for a state the rule does not keep is any array of the type.
        held = [st[a:b] for st in states] + [gi] * (3 - nstate)
        new = rule(ws, gi, held[0], held[1], held[2], k, p)
        ws[...] = new[0]
        for i in range(nstate):
            held[i][...] = new[1 + i]
    return nonfinite


def _clip(x: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """``min(max(x, low), high)`` as the compiled code takes it: ``max`` keeps ``x`` unless
    ``low`` is greater, ``min`` unless ``high`` is smaller (so NaN stays NaN)."""
    x = np.where(low > x, low, x)
    return np.where(high < x, high, x)


def _nonfinite(x: np.ndarray) -> int:
    return int(x.size - np.count_nonzero(np.isfinite(x)))
