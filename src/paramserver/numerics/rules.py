"""What every update kernel computes per element: the rules of the methods, and the layout of
their arguments (the clip positions, the per-segment table, the work item).

Plain Python functions of the arrays' scalars or of whole arrays: :mod:`.fused` registers them
with numba and compiles them into its kernels, and :mod:`.small_updates` runs the same
functions over NumPy arrays. Importing this module imports no numba, so that a job whose
calls are all small never loads it (SINGA's LeNet: numba's import alone is 55 MB of resident
memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import ParamError

__all__ = ["CHUNK", "CLIP_DECAYED", "CLIP_GRADIENT", "CLIP_SCALED", "HELPERS", "RULES",
           "check_clip_at"]

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


# ---------------------------------------------------------------------------------------------
# Per-element rules. Each gets the element's value ``w``, its prepared gradient ``g`` (clipped,
# scaled, weight-decayed), its state elements ``h``, ``u`` and ``x``, the per-segment
# coefficients ``k`` and the call-wide hyper-parameters ``p``, and returns the new
# ``(w, h, u, x)``. The driver reads and writes only the first ``nstate`` state arrays; a rule
# returns the others unchanged. All numbers are of the data type, so the arithmetic stays in it.


def _sgd_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr
    return w - k[0] * g, h, u, x


def _singa_momentum_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # SINGA's form of the momentum rule below (k1 = 1), one multiply an element fewer: the
    # result is the same bit for bit (w + 1·h is w + h), and the update kernel gets about 7 %
    # faster where it is not bound by memory (4M values on one thread: 1.18 -> 1.10 ms).
    h = p[0] * h - k[0] * g
    return w + h, h, u, x


def _momentum_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum. SINGA's form: k0 = lr, k1 = 1 (h = m*h - lr*g; w = w + h). torch.optim's
    # form: k0 = -(1 - dampening), k1 = -lr (h = m*h + (1 - dampening)*g; w = w - lr*h), so
    # that h is torch's momentum buffer and a new rate applies to the whole of it.
    h = p[0] * h - k[0] * g
    return w + k[1] * h, h, u, x


def _nesterov_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # p0 = momentum, p1 = 1 + momentum. SINGA's form: k0 = lr, k1 = 1. torch.optim's form:
    # k0 = 1, k1 = lr (h is torch's buffer m*h + g, and (1+m)*h1 - m*h = g + m*h1 its step).
    h1 = p[0] * h + k[0] * g
    return w - k[1] * (p[1] * h1 - p[0] * h), h1, u, x


def _nag_mxnet_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # MXNet 1.9.1's nag_mom_update as its store runs it, in place (out is the weight): h is
    # MXNet's mom; k0 = lr, k1 = lr*wd; p0 = momentum, p1 = 1 + momentum. The kernel writes
    # the new weight before it updates mom, whose weight decay term then reads the new
    # weight: mom = momentum*mom - lr*(clip(rescale*grad) + wd*w_new).
    h = p[0] * h
    w1 = w - h + p[1] * (h - k[0] * g)
    return w1, h - k[0] * g - k[1] * (w1 - w), u, x


def _adagrad_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr, k1 = 1 - lr * wd (MXNet's decoupled decay) or 1; p0 = delta under the square
    # root (SINGA's form), p1 = delta after it (torch.optim's eps); the other is 0.
    h = h + g * g
    return w * k[1] - k[0] * g / (np.sqrt(h + p[0]) + p[1]), h, u, x


def _rmsprop_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr; p0 = rho, p1 = 1 - rho, p2 = delta under the square root (SINGA's form),
    # p3 = delta after it (torch.optim's eps); p4 = momentum (torch.optim's, with u its
    # buffer: u = m*u + g/avg; w = w - lr*u), 0 for none.
    h = p[0] * h + p[1] * g * g
    if p[4] > 0:
        u = p[4] * u + g / (np.sqrt(h + p[2]) + p[3])
        return w - k[0] * u, h, u, x
    return w - k[0] * g / (np.sqrt(h + p[2]) + p[3]), h, u, x


def _centered_avg(h, a, p):  # type: ignore[no-untyped-def]
    # The centred RMSProp's denominator: sqrt(h - a² (+ delta)) (+ delta) with the running
    # mean a of g. h ≥ a² holds exactly (Cauchy-Schwarz over the running means' weights),
    # but bfloat16 or 8-bit state rounds h and a apart: a negative difference is taken as 0
    # (torch.optim, in float state, would give NaN there). NaN stays NaN (d - d: a zero of
    # the data type, where a literal 0 would widen float32 to float64).
    d = h - a * a
    d = d if d >= 0 else d - d
    return np.sqrt(d + p[2]) + p[3]


def _rmsprop_centered_rule(w, g, h, a, x, k, p):  # type: ignore[no-untyped-def]
    # torch.optim.RMSprop(centered=True) without momentum: a (the second state) is the running
    # mean of g, a = rho*a + (1 - rho)*g; k, p as _rmsprop_rule (p4 = 0).
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    return w - k[0] * g / _centered_avg(h, a, p), h, a, x


def _rmsprop_centered_momentum_rule(w, g, h, u, a, k, p):  # type: ignore[no-untyped-def]
    # torch.optim.RMSprop(centered=True, momentum=p4): u the momentum buffer, a (the third
    # state) the running mean of g; p as _rmsprop_rule; k0 = lr, k1 = 1 (torch.optim's
    # buffer, u = p4*u + g/avg; w -= lr*u), or k0 = 1, k1 = lr (MXNet's RMSPropAlex, whose
    # buffer holds the steps: delta = gamma2*delta - lr*g/avg; w += delta, with u = -delta).
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    u = p[4] * u + k[1] * g / _centered_avg(h, a, p)
    return w - k[0] * u, h, u, a


def _adadelta_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr, k1 = 1 - lr * wd (MXNet's decoupled decay) or 1; p0 = rho, p1 = 1 - rho,
    # p2 = delta. sqrt(u + delta) / sqrt(h + delta) as one square root of a quotient: one
    # sqrt fewer.
    h = p[0] * h + p[1] * g * g
    t = g * np.sqrt((u + p[2]) / (h + p[2]))
    u = p[0] * u + p[1] * t * t
    return w * k[1] - k[0] * t, h, u, x


def _signum_rule(w, g, u, v, x, k, p):  # type: ignore[no-untyped-def]
    # Signum (Bernstein et al. 2018, MXNet's): u = p0*u + p1*g (p0 = momentum, p1 = 1 -
    # momentum); w = w*k1 - k0*sign(u), k0 = lr, k1 = 1 - lr*wd_lh. (MXNet keeps -u.)
    u = p[0] * u + p[1] * g
    step = k[0] if u > 0 else (-k[0] if u < 0 else k[0] - k[0])
    return w * k[1] - step, u, v, x


def _signsgd_rule(w, g, h, u, x, k, p):  # type: ignore[no-untyped-def]
    # signSGD (MXNet's Signum without momentum): w = w*k1 - k0*sign(g), k0 = lr,
    # k1 = 1 - lr*wd (its weight decay is decoupled).
    step = k[0] if g > 0 else (-k[0] if g < 0 else k[0] - k[0])
    return w * k[1] - step, h, u, x


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


def _adam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # k0 = lr / (1 - beta1^t), k1 = 1 / sqrt(1 - beta2^t), k2 = 1 - lr * wd (AdamW) or 1 (Adam);
    # p0 = beta1, p1 = 1 - beta1, p2 = beta2, p3 = 1 - beta2, p4 = delta. (torch.optim's
    # SparseAdam adds delta to sqrt(v) before the bias correction: k0 = lr·sqrt(1 - beta2^t) /
    # (1 - beta1^t), k1 = 1.)
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / (np.sqrt(v) * k[1] + p[4]), m, v, x


def _amsgrad_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # AMSGrad (torch.optim.Adam(amsgrad=True)): Adam with the running maximum x of v in the
    # denominator; k, p as _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    x = max(x, v)
    return w * k[2] - k[0] * m / (np.sqrt(x) * k[1] + p[4]), m, v, x


def _adam_inner_delta_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # SINGA v0.3's kAdam: no bias correction, delta under the square root.
    # k0 = lr, k2 = 1 - lr * wd (AdamW) or 1; p as in _adam_rule
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / np.sqrt(v + p[4]), m, v, x


def _adamax_rule(w, g, m, u, x, k, p):  # type: ignore[no-untyped-def]
    # AdaMax, Adam's infinity norm (Kingma & Ba, section 7.1): u = max(beta2*u, |g| + p3) + p4
    # with (p3, p4) = (delta, 0) as torch.optim.Adamax, or (0, delta) as SINGA v0.3.
    # k0 = lr / (1 - beta1^t) (or lr); p0 = beta1, p1 = 1 - beta1, p2 = beta2
    m = p[0] * m + p[1] * g
    u = max(p[2] * u, abs(g) + p[3]) + p[4]
    return w - k[0] * m / u, m, u, x


def _nadam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # NAdam (Dozat 2016, as torch.optim.NAdam): k0 = lr·(1 - mu_t)/(1 - mu_1···mu_t),
    # k1 = lr·mu_{t+1}/(1 - mu_1···mu_{t+1}), k2 = 1/sqrt(1 - beta2^t), k3 = 1 - lr·wd
    # (decoupled weight decay) or 1; p as _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[3] - (k[0] * g + k[1] * m) / (np.sqrt(v) * k[2] + p[4]), m, v, x


def _radam_rule(w, g, m, v, x, k, p):  # type: ignore[no-untyped-def]
    # RAdam (Liu et al. 2020, as torch.optim.RAdam): where the variance is tractable
    # (rho_t > 5) k0 = lr·r_t·sqrt(1 - beta2^t)/(1 - beta1^t) and k1 = 0, else k0 = 0 and
    # k1 = lr/(1 - beta1^t) (an SGD-momentum step); k2 = 1 - lr·wd (decoupled) or 1; p as
    # _adam_rule.
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - m * (k[0] / (np.sqrt(v) + p[4]) + k[1]), m, v, x


#: The rules by name (quant.SIGNED_STATE says which of their state may be negative).
RULES: dict[str, Callable[..., Any]] = {
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

#: What the rules call besides themselves (compiled into them, as they are).
HELPERS: tuple[Callable[..., Any], ...] = (_centered_avg,)


def check_clip_at(clip_at: int) -> None:
    if clip_at not in (CLIP_GRADIENT, CLIP_SCALED, CLIP_DECAYED):
        raise ParamError(f"clip_at must be {CLIP_GRADIENT}, {CLIP_SCALED} or {CLIP_DECAYED}, "
                         f"not {clip_at!r}")
