"""The fused update kernels against a NumPy reference of SPEC §5, and against torch.optim."""

from __future__ import annotations

import itertools
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.numerics import kernels, quant

# Segment sizes of odd lengths, empty ones among them, so that the kernels' chunks
# (kernels.CHUNK elements) start and end inside segments and walk across many small ones.
SIZES = [1, 7, 4097, 0, 100_000, 3, 0, 0, 65_536 + 5, *np.random.default_rng(7).integers(0, 60, 40)]
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
NSEG = len(SIZES)
STEPS = 4

# ---------------------------------------------------------------------------------------------
# Reference: SPEC §5 literally, in float64, one NumPy pass per operation.


def per_element(values: Any, offsets: np.ndarray = OFFSETS) -> np.ndarray:
    """A per-segment scalar or array, repeated for every element of its segment, in float64."""
    sizes = np.diff(offsets)
    return np.repeat(np.broadcast_to(np.asarray(values, np.float64), sizes.shape), sizes)


def reference_step(
    method: str,
    w: np.ndarray,
    g: np.ndarray,
    state: dict[str, np.ndarray],
    lr: Any,
    wd: Any,
    gscale: Any,
    step: Any,
    hp: dict[str, Any],
    clip: tuple[float, float],
    offsets: np.ndarray = OFFSETS,
) -> np.ndarray:
    """One update of float64 ``w`` and ``state`` (in place); returns the new ``w``."""
    lr, wd, gscale = (per_element(x, offsets) for x in (lr, wd, gscale))
    g = g.astype(np.float64)
    if clip[1] > clip[0]:
        g = np.clip(g, clip[0], clip[1])
    g = g * gscale
    if not hp.get("decoupled", False):
        g = np.where(wd > 0, g + wd * w, g)
    if method in ("sgd", "sgd_momentum"):
        mom = hp.get("momentum", 0.0)
        if mom == 0:
            return w - lr * g
        state["h"] = mom * state["h"] - lr * g
        return w + state["h"]
    if method == "nesterov":
        mom = hp["momentum"]
        h0 = state["h"]
        state["h"] = mom * h0 + lr * g
        return w - ((1 + mom) * state["h"] - mom * h0)
    if method == "adagrad":
        state["h"] = state["h"] + g * g
        return w - lr * g / np.sqrt(state["h"] + hp["delta"])
    delta = hp["delta"]
    if method == "rmsprop":
        rho = hp["rho"]
        state["h"] = rho * state["h"] + (1 - rho) * g * g
        return w - lr * g / np.sqrt(state["h"] + delta)
    if method == "adadelta":
        rho = hp["rho"]
        state["h"] = rho * state["h"] + (1 - rho) * g * g
        t = g * np.sqrt(state["u"] + delta) / np.sqrt(state["h"] + delta)
        state["u"] = rho * state["u"] + (1 - rho) * t * t
        return w - lr * t
    b1, b2, t = hp["beta1"], hp["beta2"], per_element(step, offsets)
    if method in ("adamax", "adamax_singa"):
        # Kingma & Ba's AdaMax (delta inside the max, as torch.optim.Adamax), or SINGA v0.3's
        state["m"] = b1 * state["m"] + (1 - b1) * g
        if method == "adamax":
            state["u"] = np.maximum(b2 * state["u"], np.abs(g) + delta)
            return w - lr / (1 - b1**t) * state["m"] / state["u"]
        state["u"] = np.maximum(b2 * state["u"], np.abs(g)) + delta
        return w - lr * state["m"] / state["u"]
    if method == "adam_singa":  # SINGA v0.3's kAdam: no bias correction, delta in the sqrt
        state["m"] = b1 * state["m"] + (1 - b1) * g
        state["v"] = b2 * state["v"] + (1 - b2) * g * g
        return w - lr * state["m"] / np.sqrt(state["v"] + delta)
    assert method in ("adam", "adamw")
    if hp.get("decoupled", False):
        w = w * (1 - lr * wd)
    state["m"] = b1 * state["m"] + (1 - b1) * g
    state["v"] = b2 * state["v"] + (1 - b2) * g * g
    mhat = state["m"] / (1 - b1**t)
    vhat = state["v"] / (1 - b2**t)
    return w - lr * mhat / (np.sqrt(vhat) + delta)


# ---------------------------------------------------------------------------------------------
# The methods as the kernels take them.


@dataclass(frozen=True)
class Method:
    kernel: Callable[..., None]
    states: tuple[str, ...]
    hp: dict[str, Any] = field(default_factory=dict)


ADAM_HP = {"beta1": 0.9, "beta2": 0.999, "delta": 1e-8}
METHODS = {
    "sgd": Method(kernels.sgd, ()),
    "sgd_momentum": Method(kernels.sgd, ("h",), {"momentum": 0.9}),
    "nesterov": Method(kernels.nesterov, ("h",), {"momentum": 0.8}),
    "adagrad": Method(kernels.adagrad, ("h",), {"delta": 1e-6}),
    "rmsprop": Method(kernels.rmsprop, ("h",), {"rho": 0.9, "delta": 1e-6}),
    "adadelta": Method(kernels.adadelta, ("h", "u"), {"rho": 0.95, "delta": 1e-6}),
    "adam": Method(kernels.adam, ("m", "v"), ADAM_HP),
    "adamw": Method(kernels.adam, ("m", "v"), {**ADAM_HP, "decoupled": True}),
    "adam_singa": Method(kernels.adam, ("m", "v"), {**ADAM_HP, "bias_correction": False}),
    "adamax": Method(kernels.adamax, ("m", "u"), ADAM_HP),
    "adamax_singa": Method(kernels.adamax, ("m", "u"), {**ADAM_HP, "bias_correction": False}),
}


def run_kernel(
    name: str,
    w: np.ndarray,
    g: np.ndarray,
    state: dict[str, np.ndarray],
    lr: Any,
    wd: Any,
    gscale: Any,
    step: Any,
    clip: tuple[float, float],
    offsets: np.ndarray = OFFSETS,
) -> None:
    method = METHODS[name]
    states = [state[s] for s in method.states] or [w[:0]]  # plain SGD: an empty history
    extra = {"step": step} if method.kernel in (kernels.adam, kernels.adamax) else {}
    method.kernel(
        w,
        g,
        *states,
        offsets,
        lr,
        wd,
        gscale,
        **method.hp,
        **extra,
        clip_low=clip[0],
        clip_high=clip[1],
    )


TOLERANCE = {"float32": (2e-5, 2e-6), "float64": (1e-11, 1e-13)}  # rtol, atol


def assert_close(actual: np.ndarray, desired: np.ndarray, msg: str = "") -> None:
    rtol, atol = TOLERANCE[actual.dtype.name]
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, err_msg=msg)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clip", [(0.0, 0.0), (-0.5, 0.75)], ids=["noclip", "clip"])
@pytest.mark.parametrize("name", list(METHODS))
def test_kernel_matches_reference(name: str, clip: tuple[float, float], dtype: Any) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{name} {clip} {dtype.__name__}".encode()))
    n = int(OFFSETS[-1])
    method = METHODS[name]
    lr = rng.uniform(0.01, 0.2, NSEG) * (2.0 if name == "adadelta" else 1.0)
    wd = np.where(rng.random(NSEG) < 0.5, 0.0, rng.uniform(1e-3, 5e-2, NSEG))  # on and off
    gscale = rng.choice([1.0, 0.5, 1 / 3], NSEG)
    step0 = rng.integers(0, 5, NSEG)  # Adam: segments at different step counts

    w = rng.standard_normal(n).astype(dtype)
    w64 = w.astype(np.float64)
    state = {s: np.zeros(n, dtype) for s in method.states}
    state64 = {s: np.zeros(n) for s in method.states}
    for t in range(1, STEPS + 1):
        g = rng.standard_normal(n).astype(dtype)
        g_before = g.copy()
        run_kernel(name, w, g, state, lr, wd, gscale, step0 + t, clip)
        w64 = reference_step(name, w64, g, state64, lr, wd, gscale, step0 + t, method.hp, clip)
        np.testing.assert_array_equal(g, g_before, err_msg="the gradient was written")
        assert w.dtype == dtype and all(s.dtype == dtype for s in state.values())
        assert_close(w, w64, f"{name} w, step {t}")
        for s in method.states:
            assert_close(state[s], state64[s], f"{name} {s}, step {t}")


def test_scalars_apply_to_every_segment_and_g_may_be_read_only() -> None:
    rng = np.random.default_rng(1)
    n = int(OFFSETS[-1])
    w = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    g.flags.writeable = False
    h = np.zeros_like(w)
    w64 = w.astype(np.float64)
    h64 = {"h": np.zeros(n)}
    kernels.sgd(w, g, h, OFFSETS, 0.1, 0.01, 0.5, momentum=0.9)
    hp = {"momentum": 0.9}
    w64 = reference_step("sgd_momentum", w64, g, h64, 0.1, 0.01, 0.5, 1, hp, (0.0, 0.0))
    assert_close(w, w64)


def test_sgd_without_momentum_leaves_the_history_alone() -> None:
    w = np.ones(5, np.float32)
    h = np.full(5, 7.0, np.float32)
    kernels.sgd(w, np.ones(5, np.float32), h, [0, 5], 0.5)
    np.testing.assert_array_equal(w, np.full(5, 0.5))
    np.testing.assert_array_equal(h, np.full(5, 7.0))


def test_one_segment_and_offsets_as_a_list() -> None:
    w = np.ones(5, np.float64)
    kernels.sgd(w, np.full(5, 2.0), w[:0], [0, 5], 0.25)
    np.testing.assert_array_equal(w, np.full(5, 0.5))


def test_weight_decay_is_only_applied_when_positive() -> None:
    # wd = 0 must leave g alone even where w is infinite (0 * inf would be nan).
    w = np.array([np.inf, 1.0])
    kernels.sgd(w, np.array([1.0, 1.0]), w[:0], [0, 1, 2], 0.5, [0.0, 1.0])
    np.testing.assert_array_equal(w, [np.inf, 1.0 - 0.5 * (1.0 + 1.0)])


def test_segments_are_updated_with_their_own_coefficients() -> None:
    w = np.zeros(6, np.float32)
    g = np.ones(6, np.float32)
    kernels.sgd(w, g, w[:0], [0, 2, 2, 6], [1.0, 5.0, 2.0], 0.0, [1.0, 1.0, 0.5])
    np.testing.assert_array_equal(w, [-1, -1, -1, -1, -1, -1])
    kernels.sgd(w, g, w[:0], [0, 2, 2, 6], [1.0, 5.0, 2.0], 0.0, 1.0, clip_low=0, clip_high=0.25)
    np.testing.assert_array_equal(w, [-1.25, -1.25, -1.5, -1.5, -1.5, -1.5])


# ---------------------------------------------------------------------------------------------
# Step for step against torch.optim, one param group per segment (its own lr and weight decay).

TORCH_SIZES = [1, 7, 4097, 40_000]
TORCH_OFFSETS = np.concatenate([[0], np.cumsum(TORCH_SIZES)]).astype(np.int64)


def torch_optimizer(name: str, groups: list[dict[str, Any]]) -> Any:
    torch = pytest.importorskip("torch")
    optim = torch.optim
    if name == "sgd_momentum":
        return optim.SGD(groups, momentum=0.9)
    if name == "nesterov":
        return optim.SGD(groups, momentum=0.8, nesterov=True)
    if name == "adadelta":
        return optim.Adadelta(groups, rho=0.95, eps=1e-6)
    betas = (ADAM_HP["beta1"], ADAM_HP["beta2"])
    if name == "adamax":
        return optim.Adamax(groups, betas=betas, eps=ADAM_HP["delta"])
    if name == "adam":
        return optim.Adam(groups, betas=betas, eps=ADAM_HP["delta"])
    return optim.AdamW(groups, betas=betas, eps=ADAM_HP["delta"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["sgd_momentum", "nesterov", "adadelta", "adam", "adamw",
                                  "adamax"])
def test_kernel_matches_torch_optim(name: str, dtype: Any) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(zlib.crc32(f"torch {name} {dtype.__name__}".encode()))
    nseg, n = len(TORCH_SIZES), int(TORCH_OFFSETS[-1])
    lr = rng.uniform(0.01, 0.1, nseg) * (10.0 if name == "adadelta" else 1.0)
    wd = np.array([0.0, 1e-2, 0.0, 5e-3])  # on and off
    w = rng.standard_normal(n).astype(dtype)
    state = {s: np.zeros(n, dtype) for s in METHODS[name].states}
    params = [
        torch.nn.Parameter(torch.from_numpy(w[a:b].copy()))
        for a, b in itertools.pairwise(TORCH_OFFSETS)
    ]
    groups = [
        {"params": [p], "lr": float(lr[i]), "weight_decay": float(wd[i])}
        for i, p in enumerate(params)
    ]
    optimizer = torch_optimizer(name, groups)
    for t in range(1, 6):
        g = rng.standard_normal(n).astype(dtype)
        for p, (a, b) in zip(params, itertools.pairwise(TORCH_OFFSETS), strict=True):
            p.grad = torch.from_numpy(g[a:b].copy())
        optimizer.step()
        run_kernel(name, w, g, state, lr, wd, 1.0, t, (0.0, 0.0), TORCH_OFFSETS)
        expected = np.concatenate([p.detach().numpy() for p in params])
        assert_close(w, expected, f"{name}, step {t}")


# ---------------------------------------------------------------------------------------------
# The interface around the numbers.


def test_wrong_arrays_are_refused() -> None:
    w = np.zeros(4, np.float32)
    with pytest.raises(ParamError, match="g must be a float32"):
        kernels.sgd(w, np.zeros(4), w[:0], [0, 4], 0.1)
    with pytest.raises(ParamError, match="float32 or float64"):
        kernels.sgd(np.zeros(4, np.int32), np.zeros(4, np.int32), w[:0], [0, 4], 0.1)
    with pytest.raises(ValueError, match="h must be 1-D"):
        kernels.sgd(w, w.copy(), np.zeros(3, np.float32), [0, 4], 0.1, momentum=0.5)
    with pytest.raises(ValueError, match="offsets must be non-decreasing from 0 to len"):
        kernels.sgd(w, w.copy(), w[:0], [0, 3], 0.1)
    with pytest.raises(ValueError, match="offsets must be non-decreasing"):
        kernels.sgd(w, w.copy(), w[:0], [0, 3, 2, 4], 0.1)
    with pytest.raises(ValueError, match="one entry per segment"):
        kernels.sgd(w, w.copy(), w[:0], [0, 2, 4], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="step must be >= 1"):
        kernels.adam(w, w.copy(), w.copy(), w.copy(), [0, 4], 0.1, step=0)
    read_only = np.zeros(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="w is read-only"):
        kernels.sgd(read_only, w, w[:0], [0, 4], 0.1)


def test_warmup_compiles_every_kernel() -> None:
    for dtype in (np.float32, np.float64):
        kernels.warmup(dtype)
        for rule, signs in quant.SIGNED_STATE.items():
            codes = ("float",) * (len(signs) if rule != "sgd" else 0)
            for parallel in (False, True):  # one chunk: serial; more: parallel
                kernel = kernels.kernel_for(rule, codes, False, parallel)
                assert any(arg.dtype.name == np.dtype(dtype).name
                           for arg, *_ in kernel.signatures), (rule, parallel)


def test_importing_the_package_does_not_import_numba() -> None:
    code = "import sys, paramserver; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nonfinite_gradients_are_counted_in_the_same_pass(dtype: type) -> None:
    n = 3 * kernels.CHUNK + 5
    w = np.ones(n, dtype)
    g = np.full(n, 0.5, dtype)
    h = np.zeros(n, dtype)
    offsets = np.array([0, 7, n], np.int64)
    assert kernels.sgd(w, g, h, offsets, 0.1, momentum=0.9) == 0
    g[[3, kernels.CHUNK, n - 1]] = [np.nan, np.inf, -np.inf]
    # Clipping and scaling do not hide them: the raw gradient is counted.
    assert kernels.sgd(w, g, h, offsets, 0.1, momentum=0.9, clip_low=-1, clip_high=1) == 3
    u = np.zeros(n, dtype)
    assert kernels.adadelta(w, g, h, u, offsets, 0.1, rho=0.9) == 3
    assert kernels.adam(w, g, h, u, offsets, 0.1, step=1) == 3
    assert kernels.adamax(w, g, h, u, offsets, 0.1, step=1) == 3


@pytest.mark.parametrize("n", [0, 7, 4 * kernels.CHUNK, 4 * kernels.CHUNK + 3,
                               13 * kernels.CHUNK + 77])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_count_nonfinite_is_the_check_on_its_own(n: int, dtype: Any) -> None:
    """The read-only check alone (what a worker runs before it pushes): every NaN and Inf
    is counted, in the calling thread (up to four chunks) and in the parallel tasks."""
    rng = np.random.default_rng(n)
    g = rng.standard_normal(n).astype(dtype)
    bad = rng.choice(n, size=min(n, 7), replace=False)
    g[bad] = np.resize(np.array([np.nan, np.inf, -np.inf], dtype), len(bad))
    assert kernels.count_nonfinite(g) == len(bad)
    assert kernels.count_nonfinite(g[:0]) == 0
    with pytest.raises(ParamError, match="1-D float32 or float64"):
        kernels.count_nonfinite(g.astype(np.float16))
