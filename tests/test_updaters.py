"""Updaters (SPEC §5, §8) through the API users call: ``create_updater``, ``update``,
``update_params``, the state Params hold (``state_of``, its export and checked load), and
users' own methods.

Every rule is checked over several steps against the SPEC formulas written out in NumPy
(float64), with ``lr_scale``, ``wd_scale``, ``grad_scale``, clipping and weight decay each
exercised, and the learning rate changing between steps. The fused kernels have their own
tests in ``test_kernels.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from paramserver import (
    Param,
    ParamError,
    Parameter,
    ParamSet,
    Updater,
    create_updater,
    field,
    register_updater,
)
from paramserver.config.components import updaters
from paramserver.config.job import ParamConf, UpdaterConf
from paramserver.numerics import kernels
from paramserver.state import COUNT

RTOL, ATOL = 2e-5, 2e-6  # float32 against a float64 reference
BUILTINS = ["kAdaDelta", "kAdaGrad", "kAdam", "kAdamMax", "kAdamW", "kFtrl", "kLAMB",
            "kNAdam", "kNesterov", "kRAdam", "kRMSProp", "kSGD", "kSignum", "kSparseAdam"]

# Each method with hyper-parameters away from their defaults.
METHODS: dict[str, dict[str, Any]] = {
    "sgd": {"type": "kSGD"},
    "momentum": {"type": "kSGD", "momentum": 0.9},
    "nesterov": {"type": "kNesterov", "momentum": 0.8},
    "adagrad": {"type": "kAdaGrad", "delta": 1e-6},
    "rmsprop": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6},
    "adadelta": {"type": "kAdaDelta", "rho": 0.9, "delta": 1e-4},
    "adam": {"type": "kAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adamw": {"type": "kAdamW", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adam_singa": {"type": "kAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
                   "bias_correction": False},
    "adamax": {"type": "kAdamMax", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adamax_singa": {"type": "kAdamMax", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
                     "bias_correction": False},
    "rmsprop_centered": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6, "centered": True},
    "amsgrad": {"type": "kAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6, "amsgrad": True},
    "sparseadam": {"type": "kSparseAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "nadam": {"type": "kNAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
              "momentum_decay": 0.05, "decoupled_weight_decay": True},
    "radam": {"type": "kRAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "ftrl": {"type": "kFtrl", "lamda1": 0.02, "beta": 0.5},
    "signum": {"type": "kSignum", "momentum": 0.8, "wd_lh": 0.1},
    "signsgd": {"type": "kSignum"},
    "lamb": {"type": "kLAMB", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
             "upper_bound": 3.0},
}

# The learning rate halves every 2 steps, so that the rate given to each step is checked too.
LEARNING_RATE = {"type": "kStep", "base_lr": 0.05, "step_conf": {"change_freq": 2,
                                                                 "gamma": 0.5}}


def lr_at(step: int, base_lr: float = 0.05) -> float:
    return base_lr * 0.5 ** (step // 2)


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "lr_scale": {"lr_scale": 2.5},
    "weight_decay": {"conf": {"weight_decay": 0.05}},
    "wd_scale": {"conf": {"weight_decay": 0.05}, "wd_scale": 3.0},
    "wd_scale_0": {"conf": {"weight_decay": 0.05}, "wd_scale": 0.0},
    "grad_scale": {"grad_scale": 0.25},
    "clip": {"conf": {"clip_low": -0.5, "clip_high": 0.3}},
    "all": {"conf": {"weight_decay": 0.01, "clip_low": -0.8, "clip_high": 1.2},
            "lr_scale": 0.5, "wd_scale": 2.0, "grad_scale": 0.5},
}


def reference(conf: dict[str, Any], w: np.ndarray, g: np.ndarray, state: dict[str, Any],
              lr: float, wd: float, grad_scale: float) -> np.ndarray:
    """One update as SPEC §5 writes it, in float64; updates ``state``, returns the new w."""
    kind = conf["type"]
    g = np.asarray(g, np.float64)
    if kind == "kSignum" and not conf.get("momentum"):  # signSGD: w decays, the sign of g
        return w * (1 - lr * wd) - lr * np.sign(g)
    lo, hi = conf.get("clip_low", 0.0), conf.get("clip_high", 0.0)
    if hi > lo:
        g = np.clip(g, lo, hi)
    g = g * grad_scale
    decoupled = kind == "kAdamW" or conf.get("decoupled_weight_decay", False)
    zero = np.zeros_like(w)
    if kind == "kFtrl":  # wd is the L2 term of the closed form, not in the gradient
        z = state["z"] = state.get("z", zero) + g - (
            np.sqrt(state.get("n", zero) + g * g) - np.sqrt(state.get("n", zero))) * w / lr
        n = state["n"] = state.get("n", zero) + g * g
        l1 = conf["lamda1"]
        return np.where(np.abs(z) > l1, (np.sign(z) * l1 - z)
                        / ((conf["beta"] + np.sqrt(n)) / lr + wd), 0.0)
    if kind == "kLAMB":  # the weight decay joins after the moments
        b1, b2 = conf["beta1"], conf["beta2"]
        t = state["t"] = state.get("t", 0) + 1
        m = state["m"] = b1 * state.get("m", zero) + (1 - b1) * g
        v = state["v"] = b2 * state.get("v", zero) + (1 - b2) * g * g
        u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + conf["delta"]) + wd * w
        r1 = min(np.linalg.norm(w), conf.get("upper_bound", np.inf))
        r2 = np.linalg.norm(u)
        return w - (lr * r1 / r2 if r1 and r2 else lr) * u
    if wd > 0 and not decoupled:
        g = g + wd * w
    if kind == "kSignum":  # the sign of the momentum; wd_lh decays w apart
        m_ = conf["momentum"]
        u = state["u"] = m_ * state.get("u", zero) + (1 - m_) * g
        return w * (1 - lr * conf["wd_lh"]) - lr * np.sign(u)
    mom, delta, rho = conf.get("momentum", 0.0), conf.get("delta", 1e-8), conf.get("rho", 0.0)
    if kind == "kSGD" and mom > 0:
        h = state["h"] = mom * state.get("h", zero) - lr * g
        return w + h
    if kind == "kSGD":
        return w - lr * g
    if kind == "kNesterov":
        h0 = state.get("h", zero)
        h = state["h"] = mom * h0 + lr * g
        return w - ((1 + mom) * h - mom * h0)
    if kind == "kAdaGrad":
        h = state["h"] = state.get("h", zero) + g * g
        return w - lr * g / np.sqrt(h + delta)
    if kind == "kRMSProp":
        h = state["h"] = rho * state.get("h", zero) + (1 - rho) * g * g
        if conf.get("centered"):  # the variance about the running mean of g
            a = state["a"] = rho * state.get("a", zero) + (1 - rho) * g
            return w - lr * g / np.sqrt(h - a * a + delta)
        return w - lr * g / np.sqrt(h + delta)
    if kind == "kAdaDelta":
        h = state["h"] = rho * state.get("h", zero) + (1 - rho) * g * g
        t = g * np.sqrt(state.get("u", zero) + delta) / np.sqrt(h + delta)
        state["u"] = rho * state.get("u", zero) + (1 - rho) * t * t
        return w - lr * t
    b1, b2 = conf["beta1"], conf["beta2"]
    t = state["t"] = state.get("t", 0) + 1
    corrected = conf.get("bias_correction", True)
    if kind == "kAdamMax":  # Kingma & Ba's AdaMax; SINGA v0.3's without bias correction
        m = state["m"] = b1 * state.get("m", zero) + (1 - b1) * g
        if corrected:
            u = state["u"] = np.maximum(b2 * state.get("u", zero), np.abs(g) + delta)
            return w - lr / (1 - b1**t) * m / u
        u = state["u"] = np.maximum(b2 * state.get("u", zero), np.abs(g)) + delta
        return w - lr * m / u
    # Adam, AdamW: bias-corrected moments; AdamW decays the weights apart from the gradient.
    # SINGA v0.3's Adam (bias_correction false): no correction, delta under the square root.
    m = state["m"] = b1 * state.get("m", zero) + (1 - b1) * g
    v = state["v"] = b2 * state.get("v", zero) + (1 - b2) * g * g
    if decoupled:
        w = w * (1 - lr * wd)
    if kind == "kNAdam":  # Dozat's momentum schedule mu_t and its running product
        psi = conf["momentum_decay"]
        mu, mu_next = (b1 * (1 - 0.5 * 0.96 ** (i * psi)) for i in (t, t + 1))
        prod = state["prod"] = state.get("prod", 1.0) * mu
        d = np.sqrt(v / (1 - b2**t)) + delta
        return w - lr * (1 - mu) / (1 - prod) * g / d - lr * mu_next / (1 - prod * mu_next) * m / d
    if kind == "kRAdam":  # Adam once the variance of the rate is tractable, else momentum
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho_t <= 5:
            return w - lr * m / (1 - b1**t)
        r = np.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
        return w - lr * r * (m / (1 - b1**t)) * np.sqrt(1 - b2**t) / (np.sqrt(v) + delta)
    if kind == "kSparseAdam":  # delta added before the correction
        return w - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + delta)
    if conf.get("amsgrad"):  # the running maximum of v in the denominator
        v = state["vmax"] = np.maximum(state.get("vmax", zero), v)
    if not corrected:
        return w - lr * m / np.sqrt(v + delta)
    return w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + delta)


def make_updater(method: str, **extra: Any) -> Updater:
    return create_updater({**METHODS[method], "learning_rate": LEARNING_RATE, **extra})


def param(name: str, shape: tuple[int, ...], seed: int, *, dtype: Any = np.float32,
          **conf: Any) -> Param:
    p = Param(name, shape, dtype, ParamConf(name=name, **conf))
    p.data[...] = np.random.default_rng(seed).standard_normal(shape)
    return p


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("method", list(METHODS))
def test_update_follows_the_spec_rule(method: str, variant: str) -> None:
    v = VARIANTS[variant]
    conf = {**METHODS[method], **v.get("conf", {})}
    lr_scale, wd_scale, grad_scale = (v.get(k, 1.0) for k in ("lr_scale", "wd_scale",
                                                               "grad_scale"))
    updater = make_updater(method, **v.get("conf", {}))
    p = param("w", (4, 25), 1, lr_scale=lr_scale, wd_scale=wd_scale)
    w = p.data.astype(np.float64)
    state: dict[str, Any] = {}
    rng = np.random.default_rng(2)
    for step in range(6):
        p.grad[...] = rng.standard_normal(p.shape)
        w = reference(conf, w, p.grad, state, lr_at(step) * lr_scale,
                      conf.get("weight_decay", 0.0) * wd_scale, grad_scale)
        if grad_scale == 1.0:
            updater.update(step, p)  # the default
        else:
            updater.update(step, p, grad_scale=grad_scale)
        assert p.version == step + 1
        np.testing.assert_allclose(p.data, w, rtol=RTOL, atol=ATOL, err_msg=f"step {step}")


def test_update_in_float64() -> None:
    updater = make_updater("sgd", weight_decay=0.1)
    p = param("w", (3, 3), 0, dtype=np.float64, lr_scale=2.0)
    p.grad[...] = 1.0
    w0 = p.data.copy()
    updater.update(3, p)
    assert p.data.dtype == np.float64
    np.testing.assert_allclose(p.data, w0 - 0.05 * 0.5 * 2.0 * (1.0 + 0.1 * w0), rtol=1e-14)


def test_gradients_are_only_read() -> None:
    p = param("w", (10,), 0)
    p.grad[...] = np.linspace(-2, 2, 10)
    before = p.grad.copy()
    make_updater("adam", clip_low=-1, clip_high=1, weight_decay=0.1).update(0, p, 0.5)
    assert np.array_equal(p.grad, before)


@pytest.mark.parametrize(("low", "high"), [(0.5, 0.5), (0.3, -0.3)])
def test_no_clipping_unless_clip_high_is_above_clip_low(low: float, high: float) -> None:
    a, b = param("w", (20,), 0), param("w", (20,), 0)
    a.grad[...] = b.grad[...] = np.linspace(-3, 3, 20)
    make_updater("sgd", clip_low=low, clip_high=high).update(0, a)
    make_updater("sgd").update(0, b)
    assert np.array_equal(a.data, b.data)


def test_adagrad_does_not_use_momentum() -> None:
    a, b = param("w", (20,), 0), param("w", (20,), 0)
    ua, ub = make_updater("adagrad", momentum=0.9), make_updater("adagrad")
    for step in range(3):
        a.grad[...] = b.grad[...] = np.sin(np.arange(20) + step)
        ua.update(step, a)
        ub.update(step, b)
    assert np.array_equal(a.data, b.data)


def test_a_sharer_is_not_updated_itself() -> None:
    ps = ParamSet([("w", 4), ("v", 4, {"share_from": "w"})])
    with pytest.raises(ParamError) as e:
        make_updater("sgd").update(0, ps["v"])
    assert str(e.value) == "Param 'v' shares the values of 'w': update the owner"


# -- torch.optim, step for step ---------------------------------------------------------------


def torch_optimizer(torch: Any, method: str, groups: list[dict[str, Any]]) -> Any:
    h = METHODS[method]
    if method == "momentum":
        return torch.optim.SGD(groups, momentum=h["momentum"])
    if method == "nesterov":
        return torch.optim.SGD(groups, momentum=h["momentum"], nesterov=True)
    if method == "adadelta":
        return torch.optim.Adadelta(groups, rho=h["rho"], eps=h["delta"])
    cls = torch.optim.Adam if method == "adam" else torch.optim.AdamW
    return cls(groups, betas=(h["beta1"], h["beta2"]), eps=h["delta"])


@pytest.mark.parametrize("method", ["momentum", "nesterov", "adadelta", "adam", "adamw"])
def test_agrees_with_torch_optim_step_for_step(method: str) -> None:
    """Two Params with their own lr_scale and wd_scale: torch's parameter groups."""
    torch = pytest.importorskip("torch")
    base_lr = 1.0 if method == "adadelta" else 0.05
    updater = create_updater({**METHODS[method], "weight_decay": 0.01,
                              "learning_rate": {"type": "kFixed", "base_lr": base_lr}})
    ps = ParamSet([("w", (8, 16), {"lr_scale": 2.0, "wd_scale": 0.5}),
                   ("b", (16,), {"lr_scale": 0.5, "wd_scale": 0.0})])
    ps.values[...] = np.random.default_rng(0).standard_normal(ps.values.size)
    tensors = [torch.nn.Parameter(torch.from_numpy(p.data.copy())) for p in ps.owners]
    groups = [{"params": [t], "lr": base_lr * p.lr_scale, "weight_decay": 0.01 * p.wd_scale}
              for t, p in zip(tensors, ps.owners)]
    optimizer = torch_optimizer(torch, method, groups)
    rng = np.random.default_rng(1)
    for step in range(8):
        ps.grads[...] = rng.standard_normal(ps.grads.size)
        for t, p in zip(tensors, ps.owners):
            t.grad = torch.from_numpy(p.grad.copy())
        optimizer.step()
        updater.update_params(step, ps)
        for t, p in zip(tensors, ps.owners):
            np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"{p.name}, step {step}")


# -- update_params: a whole ParamSet in one call ----------------------------------------------

SET_SPECS = [
    ("a", (6, 5), {"lr_scale": 2.0, "wd_scale": 0.5}),
    ("b", (7,), {"lr_scale": 0.5}),
    ("a_t", (5, 6), {"share_from": "a"}),
    ("c", (3, 3), {"wd_scale": 0.0}),
    ("a_2", (30,), {"share_from": "a_t"}),
    ("frozen", (4,), {"lr_scale": 0.0}),
]


def paramset(seed: int = 0) -> ParamSet:
    ps = ParamSet(SET_SPECS)
    ps.values[...] = np.random.default_rng(seed).standard_normal(ps.values.size)
    return ps


@pytest.mark.parametrize("method", list(METHODS))
def test_update_params_equals_update_of_each_owner(method: str) -> None:
    """One call; per-Param lr_scale and wd_scale; grad_scale 1/num_shares by default."""
    extra = {"weight_decay": 0.02, "clip_low": -1.5, "clip_high": 1.5}
    whole, each = paramset(), paramset()
    u_whole, u_each = make_updater(method, **extra), make_updater(method, **extra)
    rng = np.random.default_rng(3)
    for step in range(5):
        grads = rng.standard_normal(whole.grads.size)
        for ps in (whole, each):
            ps.grads[...] = grads
            ps.sum_shared_grads()
        u_whole.update_params(step, whole)
        for i, p in enumerate(each.owners):
            u_each.update(step, p, grad_scale=1.0 / each.num_shares[i])
        np.testing.assert_array_equal(whole.values, each.values, err_msg=f"step {step}")
    assert whole.num_shares.tolist() == [3, 1, 1, 1]
    assert whole.versions.tolist() == each.versions.tolist() == [5, 5, 5, 5]
    assert whole["a_t"].version == 5
    assert np.array_equal(whole["frozen"].data, paramset()["frozen"].data)  # lr_scale 0


def test_update_params_uses_the_mean_of_shared_gradients() -> None:
    ps = ParamSet([("w", 3), ("w2", 3, {"share_from": "w"}), ("w3", 3, {"share_from": "w"})])
    ps["w"].grad[...] = 1.0
    ps["w2"].grad[...] = 2.0
    ps["w3"].grad[...] = 6.0
    ps.sum_shared_grads()
    create_updater({"learning_rate": {"base_lr": 0.5}}).update_params(0, ps)
    np.testing.assert_allclose(ps["w"].data, -0.5 * 3.0)  # mean of 1, 2, 6
    np.testing.assert_allclose(ps["w3"].data, -0.5 * 3.0)


def test_update_params_grad_scale_given() -> None:
    a, b = paramset(), paramset()
    scale = np.array([0.1, 1.0, 2.0, 0.5])
    a.grads[...] = b.grads[...] = 1.0
    ua, ub = make_updater("momentum"), make_updater("momentum")
    ua.update_params(0, a, grad_scale=scale)
    for i, p in enumerate(b.owners):
        ub.update(0, p, grad_scale=scale[i])
    assert np.array_equal(a.values, b.values)
    c = paramset()
    c.grads[...] = 1.0
    make_updater("momentum").update_params(0, c, grad_scale=1.0)
    d = paramset()
    d.grads[...] = 1.0
    for p in d.owners:
        make_updater("momentum").update(0, p)
    assert np.array_equal(c.values, d.values)


# -- state: checkpoints continue bit for bit --------------------------------------------------


def run(updater: Updater, target: Param | ParamSet, steps: range, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for step in steps:
        if isinstance(target, ParamSet):
            target.grads[...] = rng.standard_normal(target.grads.size)
            target.sum_shared_grads()
            updater.update_params(step, target)
        else:
            target.grad[...] = rng.standard_normal(target.shape)
            updater.update(step, target)


def names(target: Param | ParamSet) -> list[str]:
    return [p.name for p in target.owners] if isinstance(target, ParamSet) else [target.name]


def saved(updater: Updater, target: Param | ParamSet) -> dict[str, np.ndarray]:
    return updater.state_of(target).export(names(target))


@pytest.mark.parametrize("method", list(METHODS))
def test_state_round_trip_continues_bit_for_bit(method: str) -> None:
    extra = {"weight_decay": 0.01}
    # One Param
    a = param("w", (5, 5), 0)
    ua = make_updater(method, **extra)
    run(ua, a, range(3), seed=1)
    saved_state, saved_values = saved(ua, a), a.data.copy()
    run(ua, a, range(3, 7), seed=2)
    b = param("w", (5, 5), 0)
    b.data[...] = saved_values
    ub = make_updater(method, **extra)
    ub.state_of(b).load(saved_state, ["w"])
    run(ub, b, range(3, 7), seed=2)
    assert np.array_equal(a.data, b.data)
    # A ParamSet, restored into one that has already been updated
    sa = paramset()
    usa = make_updater(method, **extra)
    run(usa, sa, range(3), seed=3)
    saved_state, saved_values = saved(usa, sa), sa.values.copy()
    run(usa, sa, range(3, 7), seed=4)
    sb = paramset(seed=9)
    usb = make_updater(method, **extra)
    run(usb, sb, range(2), seed=5)
    sb.values[...] = saved_values
    usb.state_of(sb).load(saved_state, names(sb))
    run(usb, sb, range(3, 7), seed=4)
    assert np.array_equal(sa.values, sb.values)


def test_the_state_lives_with_the_params_and_the_updater_holds_none() -> None:
    u = make_updater("adam")
    ps = paramset()
    ps.grads[...] = 1.0
    u.update_params(0, ps)
    u.update(1, ps["b"])  # the owner's view of the ParamSet's state
    assert not any(isinstance(v, (dict, np.ndarray)) for v in vars(u).values())
    state = saved(u, ps)
    assert sorted(state) == sorted(f"{n}/{r}" for n in ("a", "b", "c", "frozen")
                                   for r in ("m", "v", COUNT))
    assert state["a/m"].shape == (30,) and state["a/m"].dtype == np.float32
    assert state["b/count"].tolist() == [2] and state["a/count"].tolist() == [1]
    assert np.shares_memory(ps["b"].updater_state["m"], ps.updater_state["m"])
    state["a/m"][...] = 99.0  # a copy
    assert not np.any(saved(u, ps)["a/m"] == 99.0)
    for method, roles in [("sgd", []), ("momentum", ["history"]), ("nesterov", ["history"]),
                          ("adagrad", ["history"]), ("rmsprop", ["history"]),
                          ("adadelta", ["history", "update"])]:
        u = make_updater(method)
        p = param("p", (3,), 0)
        u.update(0, p)
        assert sorted(saved(u, p)) == sorted(f"p/{r}" for r in [*roles, COUNT])


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing() -> None:
    u = make_updater("adadelta")
    p = param("w", (4,), 0)
    p.grad[...] = 1.0
    u.update(0, p)
    good = saved(u, p)
    bad: dict[str, np.ndarray] = {
        "w/history": np.zeros(5, np.float32), "w/bogus": np.zeros(4, np.float32),
        "w/update": np.zeros(4, np.float64), "w/count": np.array([-2])}
    with pytest.raises(ParamError) as e:
        u.state_of(p).load(bad, ["w"])
    assert [pr.message for pr in e.value.problems] == [
        "'w/bogus' is not state of this updater (its keys are '<param>/<role>', roles "
        "['count', 'history', 'update'])",
        "'w/count' is -2: an update count is >= 0",
        "'w/history' is float32 of 5 entries, expected float32 of 4",
        "'w/update' is float64 of 4 entries, expected float32 of 4",
    ]
    after = saved(u, p)
    assert after.keys() == good.keys()
    assert all(np.array_equal(after[k], good[k]) for k in good)
    with pytest.raises(ParamError, match="'w/count' is missing"):
        u.state_of(p).load({k: v for k, v in good.items() if k != "w/count"}, ["w"])


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("x", [
    UpdaterConf(type="kSGD", momentum=0.9, weight_decay=0.0005,
                learning_rate={"type": "kInverse", "base_lr": 0.01,
                               "inverse_conf": {"gamma": 0.0001, "pow": 0.75}}),
    {"type": "kSGD", "momentum": 0.9, "weight_decay": 0.0005,
     "learning_rate": {"type": "kInverse", "base_lr": 0.01,
                       "inverse_conf": {"gamma": 0.0001, "pow": 0.75}}},
    {"type": "sgd", "momentum": "0.9", "weight_decay": "0.0005",
     "learning_rate": {"type": "inverse", "base_lr": 0.01, "gamma": 0.0001, "pow": 0.75}},
    """type: kSGD
       momentum: 0.9
       weight_decay: 0.0005
       learning_rate { type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 } }
    """,
    """updater {
         type: kSGD
         momentum: 0.9
         weight_decay: 0.0005
         learning_rate { type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 } }
       }
    """,
])
def test_create_updater_from_conf_dict_or_text(x: Any) -> None:
    u = create_updater(x)
    assert type(u).__name__ == "SGD" and u.conf.component == "kSGD"
    assert (u.conf.momentum, u.conf.weight_decay) == (0.9, 0.0005)
    assert type(u.lr).__name__ == "Inverse" and u.lr(0) == 0.01


@pytest.mark.parametrize(("x", "own"), [
    ({"type": "kRMSProp", "rmsprop_conf": {"rho": 0.8}}, {"rho": 0.8, "centered": False}),
    ({"type": "rmsprop", "rho": 0.8}, {"rho": 0.8, "centered": False}),
    ("type: kRMSProp rmsprop_conf { rho: 0.8 centered: true }",
     {"rho": 0.8, "centered": True}),
    # SPEC §5 lists rho with the shared fields
    ("type: kRMSProp rho: 0.8", {"rho": 0.8, "centered": False}),
    ("updater { type: kAdaDelta adadelta_conf { rho: 0.5 } }", {"rho": 0.5}),
    ({"type": "kAdam", "adam_conf": {"beta1": 0.5}},
     {"beta1": 0.5, "beta2": 0.999, "bias_correction": True, "amsgrad": False}),
    ({"type": "kAdamW", "adamw_conf": {"beta2": 0.9, "amsgrad": True}},
     {"beta1": 0.9, "beta2": 0.9, "bias_correction": True, "amsgrad": True}),
    ({"type": "adamw", "beta2": 0.9},
     {"beta1": 0.9, "beta2": 0.9, "bias_correction": True, "amsgrad": False}),
    ("type: kAdam adam_conf { bias_correction: false }",
     {"beta1": 0.9, "beta2": 0.999, "bias_correction": False, "amsgrad": False}),
    ("type: kAdamMax adammax_conf { beta1: 0.5 }",
     {"beta1": 0.5, "beta2": 0.999, "bias_correction": True}),
    ("type: 7 adammax_conf { beta2: 0.5 bias_correction: f }",
     {"beta1": 0.9, "beta2": 0.5, "bias_correction": False}),
    ("type: kNAdam nadam_conf { momentum_decay: 0.01 decoupled_weight_decay: true }",
     {"beta1": 0.9, "beta2": 0.999, "momentum_decay": 0.01, "decoupled_weight_decay": True}),
    ("type: kRAdam radam_conf { beta1: 0.8 }",
     {"beta1": 0.8, "beta2": 0.999, "decoupled_weight_decay": False}),
    ("type: kSparseAdam sparseadam_conf { beta2: 0.99 }", {"beta1": 0.9, "beta2": 0.99}),
])
def test_methods_own_configuration(x: Any, own: dict[str, float]) -> None:
    assert create_updater(x).own.to_dict() == own


def test_defaults() -> None:
    u = create_updater({})
    c = u.conf
    assert c.component == "kSGD" and (c.momentum, c.weight_decay, c.delta) == (0, 0, 1e-8)
    assert (c.clip_low, c.clip_high) == (0, 0)
    assert u.lr.conf.component == "kFixed" and u.lr(100) == 0.01
    assert create_updater({"type": "kRMSProp"}).own.rho == 0.9
    assert create_updater({"type": "kAdaDelta"}).own.rho == 0.9  # SINGA's default


def error(x: Any) -> str:
    with pytest.raises(ParamError) as e:
        create_updater(x)
    return str(e.value)


@pytest.mark.parametrize(("x", "expected"), [
    ({"momentum": 1.5}, "value 1.5 for Parameter momentum exceed bound [0,1]\n"
                        "momentum: Momentum."),
    ({"momentum": -0.1}, "value -0.1 for Parameter momentum exceed bound [0,1]\n"
                         "momentum: Momentum."),
    ({"weight_decay": -1e-4}, "value -0.0001 for Parameter weight_decay should be greater "
                              "equal to 0\nweight_decay: Weight decay (L2) coefficient."),
    ({"delta": 0}, "value 0 for Parameter delta should be greater than 0\n"
                   "delta: Small constant that keeps divisions finite (epsilon)."),
    ({"type": "kRMSProp", "rho": 1.01}, "value 1.01 for Parameter rho exceed bound [0,1]\n"
                                        "rho: Decay of the running mean of g²."),
    ({"type": "kAdaDelta", "adadelta_conf": {"rho": -0.5}},
     "adadelta_conf: value -0.5 for Parameter rho exceed bound [0,1]\n"
     "rho: Decay of the running means (SINGA's default, 0.9)."),
    ({"type": "kAdam", "beta1": 2}, "value 2 for Parameter beta1 exceed bound [0,1]\n"
                                    "beta1: Decay of the first moment."),
    ({"learning_rate": {"base_lr": -0.1}},
     "learning_rate: value -0.1 for Parameter base_lr should be greater equal to 0\n"
     "base_lr: Base learning rate."),
    ({"learning_rate": {"type": "kFixedStep", "step": [0, 10], "step_lr": [0.1]}},
     "learning_rate: fixedstep_conf has 2 step values but 1 step_lr values; they must be "
     "as many"),
    ({"learning_rate": {"type": "kFixedStep", "step": [10, 5], "step_lr": [0.1, 0.2]}},
     "learning_rate: fixedstep_conf step values must be increasing: 10 then 5"),
    ({"type": "kSGD", "rho": 0.5}, None),
    ({"type": "kAdam", "adamw_conf": {"beta1": 0.5}},
     "adamw_conf is given but the updater is 'kAdam', which reads adam_conf"),
    ({"type": "kRMSProp", "rmsprop_conf": {"rho": 0.5}, "rho": 0.3},
     "give rmsprop_conf either as a block or as keys, not both: ['rho']"),
    (None, "expected a configuration (UpdaterConf), a dict or the text of the updater block, "
           "not NoneType"),
])
def test_bad_configurations(x: Any, expected: str | None) -> None:
    message = error(x)
    if expected is None:  # SGD has no rho
        assert message.startswith("Cannot find argument 'rho', Possible Arguments:\n"
                                  "----------------\ntype : ")
    else:
        assert message == expected


def test_bad_configuration_in_a_file_names_the_place() -> None:
    text = "updater {\n  type: kSGD\n  momentum: 1.5\n}\n"
    assert error(text) == ("<updater>:3:3: value 1.5 for Parameter momentum exceed bound "
                           "[0,1]\nmomentum: Momentum.")
    assert error("type: kSDG").startswith("<updater>:1:1: Invalid Input: 'kSDG', valid "
                                          "values are: {'kAdaDelta', ")
    assert error("type: kSDG").endswith("Did you mean 'kSGD'?")


# -- users' own updaters (SPEC §8) ----------------------------------------------------------


class SignConfig(Parameter):
    scale: float = field(1.0, lower=0.0, doc="Multiplies the step.")


class SignSGD(Updater):
    """``w = w − lr·scale·sign(g)``; counts the non-zero gradients it has seen, per element."""

    Config = SignConfig
    state_roles = ("seen",)
    counted = True
    seen_gradients: list[np.ndarray]

    def rule(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
             lr: float) -> None:
        type(self).seen_gradients.append(g.copy())
        state["seen"] += g != 0
        w -= np.float32(lr * self.own.scale) * np.sign(g)


@pytest.fixture
def sign_sgd() -> Iterator[type[SignSGD]]:
    SignSGD.seen_gradients = []
    register_updater("SignSGD")(SignSGD)
    try:
        yield SignSGD
    finally:
        updaters.remove("SignSGD")


@pytest.mark.parametrize("x", [
    'user_type: "SignSGD" learning_rate { base_lr: 0.5 } [signsgd_conf] { scale: 2 }',
    'updater { user_type: "SignSGD" learning_rate { base_lr: 0.5 } [signsgd_conf] { scale: 2 } }',
    {"user_type": "SignSGD", "learning_rate": {"base_lr": 0.5}, "signsgd_conf": {"scale": 2}},
    {"user_type": "sign_sgd", "learning_rate": {"base_lr": 0.5}, "scale": 2},
])
def test_user_updater(sign_sgd: type, x: Any) -> None:
    u = create_updater(x)
    assert isinstance(u, sign_sgd) and u.own == SignConfig(scale=2.0)
    p = param("w", (4,), 0, lr_scale=0.5)
    p.data[...] = [1, 2, 3, 4]
    p.grad[...] = [1, -1, 0, 2]
    u.update(0, p)
    assert p.data.tolist() == [0.5, 2.5, 3.0, 3.5]
    assert p.version == 1
    assert {k: v.tolist() for k, v in saved(u, p).items()} == {
        "w/seen": [1, 1, 0, 1], "w/count": [1]}


def test_user_updater_gets_the_prepared_gradient(sign_sgd: type[SignSGD]) -> None:
    """Clipped, scaled, then weight-decayed, as for the built-ins; the Param's own untouched."""
    u = create_updater({"user_type": "SignSGD", "weight_decay": 0.5, "clip_low": -1,
                        "clip_high": 1})
    p = param("w", (3,), 0, wd_scale=2.0)
    p.data[...] = [1, -2, 4]
    p.grad[...] = [3, -3, 0.5]
    u.update(0, p, grad_scale=0.5)
    np.testing.assert_allclose(sign_sgd.seen_gradients[0], np.array([1.5, -2.5, 4.25]))
    assert p.grad.tolist() == [3, -3, 0.5]


def test_user_updater_over_a_paramset(sign_sgd: type[SignSGD]) -> None:
    u = create_updater({"user_type": "SignSGD", "learning_rate": {"base_lr": 0.1}})
    ps = paramset()
    before = ps.values.copy()
    ps.grads[...] = 1.0
    ps.sum_shared_grads()
    u.update_params(0, ps)
    for i, p in enumerate(ps.owners):
        lo, hi = ps.offsets[i], ps.offsets[i + 1]
        np.testing.assert_allclose(p.data.ravel(), before[lo:hi] - np.float32(0.1 * p.lr_scale))
    assert len(sign_sgd.seen_gradients) == len(ps.owners)  # the rule runs once per Param
    np.testing.assert_allclose(sign_sgd.seen_gradients[0], 1.0)  # (1 + 1 + 1) / 3 shares
    state = saved(u, ps)
    assert state["a/count"].tolist() == [1] and state["a/seen"].shape == (30,)


def test_user_updater_state_round_trip(sign_sgd: type) -> None:
    conf = {"user_type": "SignSGD", "learning_rate": {"base_lr": 0.1}}
    ua, a = create_updater(conf), paramset()
    run(ua, a, range(2), seed=1)
    ub, b = create_updater(conf), paramset()
    b.values[...] = a.values
    ub.state_of(b).load(saved(ua, a), names(b))
    run(ua, a, range(2, 4), seed=2)
    run(ub, b, range(2, 4), seed=2)
    assert np.array_equal(a.values, b.values)
    assert all(np.array_equal(v, saved(ub, b)[k]) for k, v in saved(ua, a).items())


def test_user_updater_errors(sign_sgd: type) -> None:
    assert error('user_type: "SignSGD" [signsgd_conf] { scale: -1 }') == (
        "<updater>:1:39: value -1 for Parameter scale should be greater equal to 0\n"
        "scale: Multiplies the step.")
    names = "{" + ", ".join(repr(n) for n in sorted([*BUILTINS, "SignSGD"])) + "}"
    assert error('user_type: "SignSDG"') == (
        f"<updater>:1:1: Invalid Input: 'SignSDG', valid values are: {names}\n"
        "Did you mean 'SignSGD'?")
    for name in ("SignSGD", "signsgd", "sign_sgd", "kSGD", "sgd", "adamw"):
        with pytest.raises(ParamError, match=f"updater name '{name}' is already registered"):
            register_updater(name)(SignSGD)


def test_an_updater_without_a_rule_says_so() -> None:
    class NoRule(Updater):
        pass

    register_updater("NoRule")(NoRule)
    try:
        u = create_updater({"user_type": "NoRule"})
        with pytest.raises(NotImplementedError, match="NoRule must define rule"):
            u.update(0, param("w", (2,), 0))
    finally:
        updaters.remove("NoRule")


def test_every_builtin_is_registered() -> None:
    assert sorted(updaters.names()) == BUILTINS


@pytest.mark.parametrize("method", list(METHODS))
def test_a_refused_nonfinite_gradient_writes_nothing(method: str) -> None:
    """``refuse_nonfinite``: the kernel reads the gradient first and, when it holds NaN or
    Inf, leaves values, state and update counts as they were; a finite one is applied as
    without it."""
    a, b = paramset(), paramset()
    ua, ub = make_updater(method, weight_decay=0.01), make_updater(method, weight_decay=0.01)
    sa, sb = ua.init_state(a.offsets, a.dtype), ub.init_state(b.offsets, b.dtype)
    rng = np.random.default_rng(7)
    for step in range(3):
        g = rng.standard_normal(a.values.size).astype(np.float32)
        assert ua.apply(step, a.values, g, sa, refuse_nonfinite=True) == 0
        ub.apply(step, b.values, g, sb)
    assert np.array_equal(a.values, b.values)
    before, state = a.values.copy(), {k: v.copy() for k, v in sa.arrays.items()}
    g[[3, 40]] = [np.nan, -np.inf]
    assert ua.apply(3, a.values, g, sa, refuse_nonfinite=True) == 2
    assert np.array_equal(a.values, before)
    assert all(np.array_equal(sa[k], v) for k, v in state.items())  # counts included


@pytest.mark.parametrize("n", [3 * kernels.CHUNK + 11, 4 * kernels.CHUNK * 3,
                               4 * kernels.CHUNK * 3 + 777])
@pytest.mark.parametrize("state_dtype", ["float32", "int8"])
def test_the_check_counts_every_nonfinite_value_in_a_parallel_pass(n: int,
                                                                    state_dtype: str) -> None:
    """The read-only check reads four chunks at a time (its tasks' four streams) and the
    chunks left over one by one: a NaN or Inf in any of them is counted, and nothing is
    written (up to four chunks, the calling thread reads them alone). The update pass counts
    them too, in float32 and float64."""
    u = create_updater({"type": "kAdam", "state_dtype": state_dtype,
                        "learning_rate": {"base_lr": 0.01}})
    offsets = np.array([0, n // 3, n], np.int64)
    w = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    state = u.init_state(offsets, np.float32)
    g = np.full(n, 0.5, np.float32)
    step = 3 if n > 4 * kernels.CHUNK else 1  # a chunk of each stream, or each chunk
    bad = [0, kernels.CHUNK * step + 5, kernels.CHUNK * 2 * step + 1,
           kernels.CHUNK * 3 * step + 2, n - 1]
    g[bad] = [np.nan, np.inf, -np.inf, np.nan, np.inf]
    before = w.copy()
    assert u.apply(0, w, g, state, refuse_nonfinite=True) == len(bad)
    assert np.array_equal(w, before)
    # Without the check the update pass counts them (it applies the step regardless).
    for dtype in ((np.float32, np.float64) if state_dtype == "float32" else (np.float32,)):
        w2, s2 = before.astype(dtype), u.init_state(offsets, dtype)
        assert u.apply(0, w2, g.astype(dtype), s2) == len(bad)
        assert np.isnan(w2[bad]).all() and np.isfinite(np.delete(w2, bad)).all()
    g[bad] = 0.25
    assert u.apply(0, w, g, state, refuse_nonfinite=True) == 0
    assert not np.array_equal(w, before)


# -- clip_norm: clipping by the global norm ---------------------------------------------------


@pytest.mark.parametrize("n", [1000, 3_000_001])  # one thread, and the parallel pass
def test_sum_squares_of_scaled_clipped_segments(n: int) -> None:
    from paramserver.numerics.norm import sum_squares

    rng = np.random.default_rng(4)
    g = rng.standard_normal(n).astype(np.float32)
    cuts = np.sort(rng.integers(0, n, 30))
    offsets = np.concatenate([[0], cuts, cuts[:3], [n]]).astype(np.int64)  # empty segments too
    offsets.sort()
    scale = rng.uniform(0.1, 2.0, offsets.size - 1)
    per = np.repeat(scale, np.diff(offsets))
    g64 = g.astype(np.float64)
    assert sum_squares(g, offsets, scale) == pytest.approx(np.sum((g64 * per) ** 2), rel=1e-12)
    clipped = np.clip(g64, -0.5, 0.25)
    assert sum_squares(g, offsets, scale, -0.5, 0.25) == pytest.approx(
        np.sum((clipped * per) ** 2), rel=1e-12)


def test_clip_norm_scales_every_gradient_by_the_global_norm() -> None:
    """update_params against the reference: g · min(1, c / (‖g‖ + 1e-6)), ‖g‖ over every
    owner's (mean of shared, element-clipped) gradient, then the rule."""
    conf = {"type": "kSGD", "momentum": 0.9, "clip_norm": 2.0, "clip_low": -1.5,
            "clip_high": 1.5, "learning_rate": {"base_lr": 0.1}}
    updater = create_updater(conf)
    ps = paramset()
    ref_w = ps.values.astype(np.float64).copy()
    h = np.zeros_like(ref_w)
    rng = np.random.default_rng(5)
    n = ps.values.size
    norms = []
    for step in range(4):
        ps.grads[...] = rng.standard_normal(ps.grads.size) * (0.2 if step == 2 else 3.0)
        ps.sum_shared_grads()
        g = np.clip(ps.owner_grads().astype(np.float64), -1.5, 1.5)
        g *= np.repeat(1.0 / ps.num_shares, np.diff(ps.offsets))
        norm = np.sqrt(np.sum(g * g))
        norms.append(norm)
        g *= min(1.0, 2.0 / (norm + 1e-6))
        lr = 0.1 * np.repeat(ps.lr_scales, np.diff(ps.offsets))
        h = 0.9 * h - lr * g
        ref_w = ref_w + h
        updater.update_params(step, ps)
        np.testing.assert_allclose(ps.values, ref_w[:n], rtol=RTOL, atol=ATOL)
    assert norms[2] < 2.0 < min(norms[:2] + norms[3:])  # one step under the bound, unscaled


def test_clip_norm_needs_the_whole_set() -> None:
    """One Param alone is not the job: refused (the cluster reduces the norm across its
    servers: tests/test_cluster.py)."""
    updater = create_updater({"type": "kSGD", "clip_norm": 1.0})
    p = param("w", (3, 4), 0)
    with pytest.raises(ParamError, match="clip_norm clips by the L2 norm of every gradient of "
                                         "the job, which this call does not see"):
        updater.update(0, p)
