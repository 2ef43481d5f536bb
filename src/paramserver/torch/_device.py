"""Updates on the parameters' own device: SINGA's rules as torch tensor operations.

:func:`device_update` is the counterpart, for tensors on a GPU, of the numba kernels of
:mod:`paramserver.kernels`: the same order (clip, scale, weight decay, the method's rule), the
same per-segment coefficients -- worked out in float64 on the host from the learning rate,
``lr_scale``, ``wd_scale``, ``grad_scale`` and the update counts, then rounded to the data
type -- and the same rules, written once more in torch operations (``_RULES`` below mirror
the kernels' per-element rules line by line; the tests hold the two equal step for step on
the CPU). Each segment's coefficients are gathered by a per-element segment index, or taken
as scalars when every segment of a run has the same ones (one group, no per-parameter
scales: the common case, which then reads no index).

On CUDA the step of a run is compiled by ``torch.compile`` (inductor fuses the gather, the
clip, the weight decay, the rule and the in-place writes into one kernel: one launch per run
and step, a run being the parameters whose groups share the updater's settings). Elsewhere it
runs eagerly, operation by operation: correct, but not a fused kernel (paramserver's numba
kernels are the fast path for CPU tensors).

:class:`DeviceParams` binds the parameters to flat buffers on their device, as
:class:`~paramserver.torch.TorchParams` binds CPU parameters to host memory: one buffer of
owner values, one of gradients, the updater state in one buffer per role; every tensor's
``.data`` and ``.grad`` are views. The update counts stay on the host (they are per
parameter, and the coefficients are computed there). A ParamSet of the same layout holds the
names, the configurations and, when a checkpoint or ``state_dict`` asks, a host copy of the
values and the state (its memory is not touched before).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..config import ParamError
from ..config.job import ParamConf
from ..params import ParamSet, ParamSpec
from ..state import UpdaterState
from ..updaters import (
    SGD,
    AdaDelta,
    AdaGrad,
    Adam,
    AdamMax,
    NAdam,
    Nesterov,
    RAdam,
    RMSProp,
    Updater,
)
from ._bind import _BOUND, BoundTensors, _init

T = torch.Tensor
Rule = Callable[..., tuple[T, T | None, T | None, T | None]]


# ---------------------------------------------------------------------------------------------
# The rules: each gets the values w, the prepared gradient g, the state h, u and x (None where
# a method keeps less), the per-segment coefficients k = (k0, k1, k2, k3) and the call-wide
# hyper-parameters p, and returns the new (w, h, u, x). Line by line the kernels' rules.

R = tuple[T, Any, Any, Any]


def _sgd(w: T, g: T, h: Any, u: Any, x: Any, k: Any, p: Any) -> R:
    return w - k[0] * g, h, u, x


def _momentum(w: T, g: T, h: T, u: Any, x: Any, k: Any, p: Any) -> R:
    h = p[0] * h - k[0] * g
    return w + k[1] * h, h, u, x


def _nesterov(w: T, g: T, h: T, u: Any, x: Any, k: Any, p: Any) -> R:
    h1 = p[0] * h + k[0] * g
    return w - k[1] * (p[1] * h1 - p[0] * h), h1, u, x


def _adagrad(w: T, g: T, h: T, u: Any, x: Any, k: Any, p: Any) -> R:
    h = h + g * g
    return w - k[0] * g / (torch.sqrt(h + p[0]) + p[1]), h, u, x


def _rmsprop(w: T, g: T, h: T, u: Any, x: Any, k: Any, p: Any) -> R:
    h = p[0] * h + p[1] * g * g
    return w - k[0] * g / (torch.sqrt(h + p[2]) + p[3]), h, u, x


def _rmsprop_momentum(w: T, g: T, h: T, u: T, x: Any, k: Any, p: Any) -> R:
    h = p[0] * h + p[1] * g * g
    u = p[4] * u + g / (torch.sqrt(h + p[2]) + p[3])
    return w - k[0] * u, h, u, x


def _centered_avg(h: T, a: T, p: Any) -> T:
    d = h - a * a
    d = torch.where(d >= 0, d, d - d)
    return torch.sqrt(d + p[2]) + p[3]


def _rmsprop_centered(w: T, g: T, h: T, a: T, x: Any, k: Any, p: Any) -> R:
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    return w - k[0] * g / _centered_avg(h, a, p), h, a, x


def _rmsprop_centered_momentum(w: T, g: T, h: T, u: T, a: T, k: Any, p: Any) -> R:
    h = p[0] * h + p[1] * g * g
    a = p[0] * a + p[1] * g
    u = p[4] * u + g / _centered_avg(h, a, p)
    return w - k[0] * u, h, u, a


def _adadelta(w: T, g: T, h: T, u: T, x: Any, k: Any, p: Any) -> R:
    h = p[0] * h + p[1] * g * g
    t = g * torch.sqrt((u + p[2]) / (h + p[2]))
    u = p[0] * u + p[1] * t * t
    return w - k[0] * t, h, u, x


def _adam_rule(w: T, g: T, m: T, v: T, x: Any, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / (torch.sqrt(v) * k[1] + p[4]), m, v, x


def _amsgrad(w: T, g: T, m: T, v: T, x: T, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    x = torch.maximum(x, v)
    return w * k[2] - k[0] * m / (torch.sqrt(x) * k[1] + p[4]), m, v, x


def _adam_inner_delta(w: T, g: T, m: T, v: T, x: Any, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - k[0] * m / torch.sqrt(v + p[4]), m, v, x


def _adamax(w: T, g: T, m: T, u: T, x: Any, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    u = torch.maximum(p[2] * u, torch.abs(g) + p[3]) + p[4]
    return w - k[0] * m / u, m, u, x


def _nadam(w: T, g: T, m: T, v: T, x: Any, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[3] - (k[0] * g + k[1] * m) / (torch.sqrt(v) * k[2] + p[4]), m, v, x


def _radam(w: T, g: T, m: T, v: T, x: Any, k: Any, p: Any) -> R:
    m = p[0] * m + p[1] * g
    v = p[2] * v + p[3] * g * g
    return w * k[2] - m * (k[0] / (torch.sqrt(v) + p[4]) + k[1]), m, v, x


_RULES: dict[str, Rule] = {
    "sgd": _sgd, "momentum": _momentum, "nesterov": _nesterov, "adagrad": _adagrad,
    "rmsprop": _rmsprop, "rmsprop_momentum": _rmsprop_momentum,
    "rmsprop_centered": _rmsprop_centered,
    "rmsprop_centered_momentum": _rmsprop_centered_momentum, "adadelta": _adadelta,
    "adam": _adam_rule, "amsgrad": _amsgrad, "adam_inner_delta": _adam_inner_delta,
    "adamax": _adamax, "nadam": _nadam, "radam": _radam,
}


def _step_fn(rule: Rule, clip: bool, uniform: bool) -> Callable[..., None]:
    """The step of one run: gather, clip, scale, weight decay, rule, written in place."""

    def step(w: T, g: T, h: T | None, u: T | None, x: T | None, seg: T | None, coef: T,
             hyp: T) -> None:
        c = coef if uniform else coef[:, seg]
        gscale, wd, k = c[0], c[1], (c[2], c[3], c[4], c[5])
        p = (hyp[2], hyp[3], hyp[4], hyp[5], hyp[6])
        gg = torch.minimum(torch.maximum(g, hyp[0]), hyp[1]) if clip else g
        gg = gg * gscale
        gg = torch.where(wd > 0, gg + wd * w, gg)
        w1, h1, u1, x1 = rule(w, gg, h, u, x, k, p)
        w.copy_(w1)
        for a, a1 in ((h, h1), (u, u1), (x, x1)):
            if a is not None and a1 is not None:
                a.copy_(a1)

    return step


_STEPS: dict[tuple[str, bool, bool, bool], Callable[..., None]] = {}


def _compiled_step(rule: str, clip: bool, uniform: bool, compile: bool) -> Callable[..., None]:
    key = (rule, clip, uniform, compile)
    fn = _STEPS.get(key)
    if fn is None:
        fn = _step_fn(_RULES[rule], clip, uniform)
        if compile:
            fn = torch.compile(fn, dynamic=None)
        _STEPS[key] = fn
    return fn


# ---------------------------------------------------------------------------------------------
# The coefficients: what paramserver.kernels' wrappers compute, per method, in float64.


def _coefficients(u: Updater, lr: np.ndarray, wd: np.ndarray, state: UpdaterState
                  ) -> tuple[str, list[Any], tuple[float, ...], np.ndarray]:
    """``(rule, [k0, k1, k2, k3], p, wd)`` of one update: ``k`` per segment (arrays) or for
    all (numbers), ``wd`` as the gradient sees it (0 for a decoupled decay). NAdam's
    ``mu_product`` (in ``state``, on the host) is moved on to this update's."""
    c = u.conf
    counts = state.counts
    torch_form = u.torch_form
    one = 1.0
    p: tuple[float, ...]
    if isinstance(u, SGD):
        m = c.momentum
        if m <= 0:
            return "sgd", [lr, one, one, one], (), wd
        damp = u.own.dampening if u.own is not None else 0.0
        keep = 1.0 - (np.where(counts == 1, 0.0, damp) if damp > 0 else 0.0)
        k = [-keep, -lr] if torch_form else [lr * keep, one]
        return "momentum", [*k, one, one], (m,), wd
    if isinstance(u, Nesterov):
        m = c.momentum
        return "nesterov", ([one, lr, one, one] if torch_form else [lr, one, one, one]), (
            m, 1.0 + m), wd
    if isinstance(u, AdaGrad):
        own = u.own
        if own is not None and own.lr_decay > 0:
            lr = lr / (1.0 + (counts - 1) * own.lr_decay)
        p = (0.0, c.delta) if torch_form else (c.delta, 0.0)
        return "adagrad", [lr, one, one, one], p, wd
    if isinstance(u, RMSProp):
        inner, outer = (0.0, c.delta) if torch_form else (c.delta, 0.0)
        momentum = c.momentum if u.uses_momentum else 0.0
        return u.kernel_rule, [lr, one, one, one], (u.own.rho, 1.0 - u.own.rho, inner, outer,
                                                    momentum), wd
    if isinstance(u, AdaDelta):
        rho = u.own.rho
        return "adadelta", [lr, one, one, one], (rho, 1.0 - rho, c.delta), wd
    if not isinstance(u, (Adam, NAdam, RAdam, AdamMax)):
        raise ParamError(f"{type(u).__name__} has no update on the device (a user's updater "
                         "is written in NumPy): give the optimizer placement='offload' or "
                         "'host'")
    t = counts.astype(np.float64)
    own = u.own
    b1, b2 = own.beta1, own.beta2
    adam_p = (b1, 1.0 - b1, b2, 1.0 - b2, c.delta)
    decoupled = bool(getattr(u, "decoupled", False) or getattr(own, "decoupled_weight_decay",
                                                               False))
    decay = 1.0 - lr * wd if decoupled else one
    coupled = np.zeros_like(wd) if decoupled else wd
    if isinstance(u, Adam):
        correct = getattr(own, "bias_correction", True)
        if correct:
            a = lr / -np.expm1(t * np.log(b1)) if b1 > 0 else lr
            b = 1.0 / np.sqrt(-np.expm1(t * np.log(b2))) if b2 > 0 else one
            if u.extra().get("delta_before_correction"):  # SparseAdam
                a, b = a / b, one
        else:
            a, b = lr, one
        rule = u.kernel_rule if correct else "adam_inner_delta"
        return rule, [a, b, decay, one], adam_p, coupled
    if isinstance(u, NAdam):
        from ..numerics.kernels import nadam_coefficients

        product = np.where(counts == 1, 1.0, state["mu_product"])
        k0, k1, k2, product = nadam_coefficients(lr, t, product, b1, b2, own.momentum_decay)
        state["mu_product"][...] = product
        return "nadam", [k0, k1, k2, decay], adam_p, coupled
    if isinstance(u, RAdam):
        from ..numerics.kernels import radam_coefficients

        k0, k1 = radam_coefficients(lr, t, b1, b2)
        return "radam", [k0, k1, decay, one], adam_p, coupled
    if own.bias_correction:  # AdaMax
        a = lr / -np.expm1(t * np.log(b1)) if b1 > 0 else lr
        inner, outer = c.delta, 0.0
    else:
        a, inner, outer = lr, 0.0, c.delta
    return "adamax", [a, one, one, one], (b1, 1.0 - b1, own.beta2, inner, outer), wd


def device_update(updater: Updater, step: int, w: T, g: T, state: UpdaterState,
                  arrays: dict[str, T], lr_scale: np.ndarray | float = 1.0,
                  wd_scale: np.ndarray | float = 1.0, grad_scale: np.ndarray | float = 1.0,
                  *, grad_norm: float | None = None, seg: T | None = None,
                  compile: bool | None = None) -> None:
    """One update of a run of flat tensors on their device, as ``updater.apply`` does on the
    host: in place, the update counts (in ``state``, on the host) up by one.

    Args:
        updater: a built-in method (users' methods run on the host).
        step: the training step (the learning rate's).
        w, g: the run's values (updated) and gradients (read), 1-D, on one device.
        state: the run's state on the host: its counts (raised) and per-segment roles.
        arrays: the per-element state arrays by role (``history``, ``m``, ...), like ``w``.
        lr_scale, wd_scale, grad_scale: per segment of ``state``, or numbers.
        grad_norm: with ``clip_norm``, the global norm of the gradients.
        seg: the segment of every element (int32, on the device); needed when the
            segments' coefficients differ.
        compile: fuse with torch.compile (default: on CUDA).
    """
    n = state.num_segments
    c = updater.conf
    lr = np.broadcast_to(updater.lr(step) * np.asarray(lr_scale, np.float64), (n,)).copy()
    wd = np.broadcast_to(c.weight_decay * np.asarray(wd_scale, np.float64), (n,)).copy()
    if updater.conf.form == "mxnet":
        raise ParamError("form mxnet (MXNet's rules) runs on the host: give the optimizer "
                         "placement='offload' or 'host'")
    gscale = np.broadcast_to(np.asarray(grad_scale, np.float64), (n,)) * updater.conf.rescale_grad
    if c.clip_norm > 0:
        if grad_norm is None:
            raise ParamError("clip_norm needs grad_norm, the global norm of the gradients")
        from ..numerics.norm import clip_factor

        gscale = gscale * clip_factor(grad_norm, c.clip_norm)
    counts = state.counts
    np.add(counts, 1, out=counts)
    rule, k, p, wd = _coefficients(updater, lr, wd, state)
    for role, value in updater.initial_state().items():  # torch's sum starts at this value
        for i in np.flatnonzero(counts == 1):
            if role in arrays:
                arrays[role][int(state.offsets[i]):int(state.offsets[i + 1])] = value
    if n == 0 or w.numel() == 0:
        return
    table = np.empty((6, n), np.float64)
    for row, x in enumerate((gscale, wd, *k)):
        table[row] = x
    uniform = bool(np.all(table == table[:, :1]))
    coef = _to_device(np.ascontiguousarray(table[:, :1]) if uniform else table, w)
    hyp_np = np.zeros(7, np.float64)
    hyp_np[:2] = (c.clip_low, c.clip_high)
    hyp_np[2:2 + len(p)] = p
    hyp = _to_device(hyp_np, w)
    if not uniform and seg is None:
        seg = segment_index(state.offsets, w.device)
    # the per-element state in the rule's order (h, u, x), None where it keeps less
    h, u, x = [*(arrays[r.name] for r in updater.roles[1:] if r.per == "element"),
               None, None, None][:3]
    if compile is None:
        compile = w.device.type == "cuda"
    fn = _compiled_step(rule, bool(c.clip_high > c.clip_low), uniform, compile)
    fn(w, g, h, u, x, None if uniform else seg, coef, hyp)


def _to_device(x: np.ndarray, like: T) -> T:
    """Host numbers (float64) as a tensor of ``like``'s device and dtype. To a GPU they go
    through pinned memory, asynchronously: a copy from pageable memory would make the host
    wait for everything queued on the stream, and a step could no longer be queued while
    the GPU still runs the backward pass (torch's caching host allocator keeps the pinned
    block until the copy is done)."""
    t = torch.from_numpy(x)
    if like.device.type == "cuda":
        return t.pin_memory().to(device=like.device, dtype=like.dtype, non_blocking=True)
    return t.to(dtype=like.dtype)


def segment_index(offsets: np.ndarray | Sequence[int], device: torch.device) -> T:
    """The segment of every element of a run cut at ``offsets`` (int32, on ``device``)."""
    sizes = torch.from_numpy(np.diff(np.asarray(offsets, np.int64)))
    index = torch.repeat_interleave(torch.arange(len(sizes), dtype=torch.int32), sizes)
    return index.to(device)


def device_sum_squares(updater: Updater, g: T, offsets: np.ndarray,
                       grad_scale: np.ndarray | float = 1.0) -> float:
    """A run's part of the squared global norm, on its device: ``Σ (clip(g)·gscale)²``."""
    c = updater.conf
    x = g.to(torch.float64)
    if c.clip_high > c.clip_low:
        x = x.clamp(c.clip_low, c.clip_high)
    scale = np.broadcast_to(np.asarray(grad_scale, np.float64), (len(offsets) - 1,))
    if np.all(scale == scale[0]):
        return float(torch.sum(x * x)) * float(scale[0]) ** 2
    per = torch.from_numpy(np.repeat(scale, np.diff(offsets))).to(x.device)
    return float(torch.sum((x * per) ** 2))


# ---------------------------------------------------------------------------------------------
# The binding.

_FLOAT = (torch.float32, torch.float64)


class DeviceParams(BoundTensors):
    """Tensors on a device (a GPU) whose values, gradients and updater state live in flat
    buffers on that device; see the module docstring.

    Args:
        named: ``(name, tensor)`` pairs: leaf, float32 or float64, all of one dtype and on
            one device.
        confs: each name's configuration (``lr_scale``, ``wd_scale``, ``init``, sharing).
        initialise: the names whose values paramserver's initialisation gives (on the host,
            then copied to the device); the others keep theirs.
        seed: the seed of that initialisation.
        compile: fuse each run's step with torch.compile (default: on CUDA).
    """

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]],
                 confs: dict[str, ParamConf] | None = None, *, initialise: Any = (),
                 seed: int = 0, compile: bool | None = None):
        names = [n for n, _ in named]
        tensors = [t for _, t in named]
        problems = []
        devices = {t.device for t in tensors}
        if not tensors:
            problems.append("no parameters to bind")
        if len(devices) > 1:
            problems.append(f"parameters on several devices {sorted(map(str, devices))}: an "
                            "optimizer updating on the device needs them on one")
        for n, t in named:
            if t.dtype not in _FLOAT:
                problems.append(f"parameter '{n}' is {t.dtype}: updates on the device keep "
                                "float32 or float64 parameters (for half precision, keep an "
                                "fp32 master with placement='offload', or train in fp32 "
                                "under autocast)")
            elif not t.is_leaf:
                problems.append(f"parameter '{n}' is not a leaf tensor")
        if len({t.dtype for t in tensors}) > 1:
            problems.append("parameters of several dtypes: convert the module to one")
        if problems:
            raise ParamError(problems)
        confs = confs or {}
        specs = [ParamSpec(n, tuple(t.shape), confs.get(n) or ParamConf(name=n),
                           f"parameter '{n}'") for n, t in named]
        dtype = tensors[0].dtype
        # The host copy, for checkpoints: its pages are not touched until one is written.
        pset = ParamSet(specs, np.float32 if dtype == torch.float32 else np.float64)
        device = tensors[0].device
        self.device = device
        self.compile = compile
        total = int(pset.offsets[-1])
        self.values = torch.empty(total, dtype=dtype, device=device)
        self.grads = torch.zeros(pset.grads.size, dtype=dtype, device=device)
        by_name = dict(named)
        ranges = {p.name: (int(pset.offsets[i]), int(pset.offsets[i + 1]))
                  for i, p in enumerate(pset.owners)}
        with torch.no_grad():
            for p in pset.owners:
                lo, hi = ranges[p.name]
                self.values[lo:hi].copy_(by_name[p.name].detach().reshape(-1))
        init = set(initialise)
        if init:
            _init(pset, init, seed)
            for p in pset.owners:
                if p.name in init:
                    lo, hi = ranges[p.name]
                    self.values[lo:hi].copy_(torch.from_numpy(p.data.reshape(-1)))
        grad_at: dict[str, tuple[int, int]] = dict(ranges)
        pos = total
        for p in pset.params:
            if p.owner is not None:
                grad_at[p.name] = (pos, pos + p.size)
                pos += p.size
        value_views = []
        grad_views = []
        for n, t in named:
            owner = pset[n].owner or pset[n]
            lo, hi = ranges[owner.name]
            value_views.append(self.values[lo:hi].view(t.shape))
            glo, ghi = grad_at[n]
            grad_views.append(self.grads[glo:ghi].view(t.shape))
        self.pset = pset
        self._set_views(names, tensors, value_views, grad_views, keep_grads=True)
        self._shared = [(i, [(grad_at[q.name], q.shape) for q in pset.params
                             if q.owner is not None and q.owner.name == p.name])
                        for i, p in enumerate(pset.owners) if pset.num_shares[i] > 1]
        self.arrays: dict[str, T] = {}
        self._segs: dict[tuple[int, int], T] = {}
        for t in tensors:
            _BOUND[t] = self

    # -- gradients of sharers -----------------------------------------------------------------

    def owner_grads(self) -> T:
        """The owners' gradients with every sharer's added in (undone by restore_grads)."""
        pset = self.pset
        self._saved: list[tuple[int, T]] = []
        for i, sharers in self._shared:
            lo, hi = int(pset.offsets[i]), int(pset.offsets[i + 1])
            self._saved.append((i, self.grads[lo:hi].clone()))
            owner = self.grads[lo:hi].view(pset.owners[i].shape)
            for (slo, shi), _shape in sharers:
                owner.add_(self.grads[slo:shi].view(owner.shape))
        return self.grads[:int(pset.offsets[-1])]

    def restore_grads(self) -> None:
        for i, saved in getattr(self, "_saved", []):
            lo, hi = int(self.pset.offsets[i]), int(self.pset.offsets[i + 1])
            self.grads[lo:hi].copy_(saved)
        self._saved = []

    # -- updates ------------------------------------------------------------------------------

    def ensure_state(self, state: UpdaterState) -> None:
        """Device arrays for every per-element role of ``state`` (new ones from its arrays);
        per-segment roles (the counts, NAdam's ``mu_product``) stay on the host."""
        for r in state.roles:
            if r.per == "segment" or r.name in self.arrays:
                continue
            if r.per != "element" or r.dtype is not None:
                raise ParamError(f"state role '{r.name}' ({r.per}, {r.dtype}) has no form on "
                                 "the device; use placement='offload' or 'host'")
            self.arrays[r.name] = torch.from_numpy(state[r.name]).to(self.device)

    def sum_squares(self, updater: Updater, grads: T, a: int, b: int, state: UpdaterState,
                    grad_scale: np.ndarray) -> float:
        lo, hi = int(self.pset.offsets[a]), int(self.pset.offsets[b])
        return device_sum_squares(updater, grads[lo:hi], state.offsets, grad_scale)

    def update(self, updater: Updater, step: int, grads: T, a: int, b: int,
               state: UpdaterState, lr_scale: np.ndarray, wd: np.ndarray,
               grad_scale: np.ndarray, grad_norm: float | None,
               skip: np.ndarray | None = None) -> None:
        """One update of owners ``a:b`` (a run of one updater) but those ``skip`` marks: one
        step call per stretch of owners that got gradients."""
        if skip is not None and skip.any():
            i, n = 0, b - a
            while i < n:
                if skip[i]:
                    i += 1
                    continue
                j = i + 1
                while j < n and not skip[j]:
                    j += 1
                self.update(updater, step, grads, a + i, a + j, state.segments(i, j),
                            lr_scale[i:j], wd[i:j], grad_scale[i:j], grad_norm)
                i = j
            return
        lo, hi = int(self.pset.offsets[a]), int(self.pset.offsets[b])
        arrays = {name: a[lo:hi] for name, a in self.arrays.items()}
        seg = self._segs.get((lo, hi))
        if seg is None:
            seg = segment_index(state.offsets, self.device)
            self._segs[(lo, hi)] = seg
        device_update(updater, step, self.values[lo:hi], grads[lo:hi], state, arrays,
                      lr_scale, wd, grad_scale, grad_norm=grad_norm, seg=seg,
                      compile=self.compile)

    def finish(self) -> None:
        """Nothing to publish: the tensors view the updated buffers."""

    def state_view(self, state: UpdaterState, role: str, lo: int, hi: int) -> T:
        return self.arrays[role][lo:hi]

    def to_host(self, state: UpdaterState, values: bool = True) -> None:
        """Copy the state (and the values) to their host copies (for a checkpoint)."""
        if values:
            self.pset.values[...] = self.values.cpu().numpy()
        for name, a in self.arrays.items():
            if name in state:
                state[name][...] = a.cpu().numpy()

    def from_host(self, state: UpdaterState, values: bool = True) -> None:
        """Take the host copies of the state (and the values), after a checkpoint is read."""
        if values:
            self.values.copy_(torch.from_numpy(self.pset.values))
        for name in list(self.arrays):
            if name in state:
                self.arrays[name].copy_(torch.from_numpy(state[name]))
        self.ensure_state(state)

    def close(self) -> None:
        """Nothing to release (the tensors keep viewing the buffers)."""

    def __repr__(self) -> str:
        return (f"DeviceParams({len(self.tensors)} tensors, {len(self.pset.owners)} owners, "
                f"{self.values.numel()} values, {self.values.dtype}, {self.device})")


__all__ = ["DeviceParams", "device_sum_squares", "device_update", "segment_index"]
