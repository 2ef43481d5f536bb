"""Many Params (issue 31): a ParamSet of 10^5 Params builds, initialises to the values of
earlier releases, updates, checkpoints and goes on exactly; what made that cheap (Params
configured alike, lazy views, many fills in one call) changes nothing a user sees.

Speed is measured by ``benchmarks/many_params.py``, not here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import (
    Param,
    ParamSet,
    create_param_generator,
    create_updater,
    init_params,
    load_checkpoint,
    save_checkpoint,
)
from paramserver.config.components import param_generators
from paramserver.config.job import ParamConf
from paramserver.init import ParamGenerator, register_param_generator, stream
from paramserver.numerics.rng_kernels import _CHUNK
from paramserver.params import ParamSpec

N = 100_000


def many(n: int) -> list[tuple[Any, ...]]:
    """``n`` Params as a model of small layers declares them: a 4x4 weight and a bias of 4
    per layer (Python's defaults: glorot_uniform, zeros); every 1000th layer's weight with a
    lower rate, and a tied copy of the first weight at the end."""
    out: list[tuple[Any, ...]] = []
    for i in range(n - 1):
        layer, kind = divmod(i, 2)
        if kind:
            out.append((f"fc{layer}_b", (4,)))
        elif layer % 1000 == 0:
            out.append((f"fc{layer}_w", (4, 4), {"lr_scale": 0.5}))
        else:
            out.append((f"fc{layer}_w", (4, 4)))
    return [*out, ("tied", (4, 4), {"share_from": "fc0_w"})]


def gradients(params: ParamSet, step: int) -> None:
    params.grads[...] = np.sin(np.arange(params.grads.size) * 0.37 + step).astype(params.dtype)
    params.sum_shared_grads()


def test_a_hundred_thousand_params_build_initialise_update_and_resume(tmp_path: Path) -> None:
    params = ParamSet(many(N))
    assert len(params) == N and len(params.owners) == N - 1
    assert params.num_shares[0] == 2 and params["tied"].owner is params["fc0_w"]
    assert params.lr_scales[[0, 2, 2000]].tolist() == [0.5, 1.0, 0.5]

    init_params(params, seed=5)
    again = ParamSet(many(N))
    init_params(again, seed=5)
    assert np.array_equal(params.values, again.values)  # reproducible
    for name in ("fc0_w", "fc1_b", "fc777_w", f"fc{N // 2 - 2}_b"):  # each as filled alone
        p = params[name]
        alone = Param(name, p.shape)
        create_param_generator(p.conf.init).fill(alone, stream(5, name))
        assert np.array_equal(p.data, alone.data), name
    assert np.array_equal(params["tied"].data, params["fc0_w"].data)

    updater = create_updater({"type": "kSGD", "momentum": 0.9, "learning_rate":
                              {"type": "kStep", "base_lr": 0.1,
                               "step_conf": {"change_freq": 2, "gamma": 0.5}}})
    for step in range(2):
        gradients(params, step)
        updater.update_params(step, params)
    assert params.versions.min() == params.versions.max() == 2
    assert params["tied"].version == 2

    # A checkpoint of many Params: the flat buffers, a handful of arrays.
    state = updater.state_of(params)
    path = save_checkpoint(tmp_path / "step-2.ckpt.safetensors",
                           {"values": params.values, "versions": params.versions,
                            **{f"state/{r}": a for r, a in state.arrays.items()}},
                           {"step": 2})
    # And by name, as the cluster keys it: every Param's piece of every role.
    names = [p.name for p in params.owners]
    pieces = state.export(names)
    assert len(pieces) == 2 * len(names) and pieces["fc1_b/count"].tolist() == [2]

    arrays, meta = load_checkpoint(path)
    resumed = ParamSet(many(N))
    resumed.values[...] = arrays["values"]
    resumed.set_versions(arrays["versions"])
    fresh = create_updater(updater.conf)
    for r, a in fresh.state_of(resumed).arrays.items():
        a[...] = arrays[f"state/{r}"]
    by_name = create_updater(updater.conf)
    named = ParamSet(many(N))
    named.values[...] = arrays["values"]
    by_name.state_of(named).load(pieces, names)

    for step in range(meta["step"], 4):  # all three go on exactly alike
        for ps, u in ((params, updater), (resumed, fresh), (named, by_name)):
            gradients(ps, step)
            u.update_params(step, ps)
    assert np.array_equal(resumed.values, params.values)
    assert np.array_equal(named.values, params.values)
    for r in state.arrays:
        assert np.array_equal(fresh.state_of(resumed)[r], updater.state_of(params)[r]), r
    assert resumed["fc3_b"].version == 4 and params["fc3_b"].version == 4


#: Uniform and constant fills (no libm beyond sqrt), whose values are the same everywhere:
#: their SHA-256 was taken with the release before issue 31 (commit afe10dc).
UNIFORMS = [{"type": "kConstant", "value": -0.5}, {"type": "kUniform", "low": -0.3, "high": 0.7},
            {"type": "kUniformSqrtFanIn", "value": -2.0}, {"type": "kUniformSqrtFanInOut"},
            {"type": "glorot_uniform"}, {"type": "he_uniform", "value": 0.5},
            {"type": "lecun_uniform"}, {"type": "random_uniform", "value": -1.0},
            {"type": "variance_scaling",
             "variance_scaling_conf": {"mode": "fan_out", "distribution": "uniform"}},
            {"type": "zeros"}, {"type": "ones"}]
PINNED = {np.float32: "1ae64fdf0510bbba84a4bd03a89f34b4831adb7beb7acdf04983980061ac1d5d",
          np.float64: "af1b21318dd6c890c13fd2adc1911fe80785d32bf1eae8448cc91ba8028271bf"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_seeded_values_are_those_of_earlier_releases(dtype: Any) -> None:
    specs: list[tuple[Any, ...]] = [
        (f"m{i}_{j}", shape, {"init": init}) for i, init in enumerate(UNIFORMS)
        for j, shape in enumerate([(3, 5), (0, 4), (7, 1), (300, 250)])]  # 75,000 > a chunk
    specs += [(f"p{k}", (k % 5 + 1, 3) if k % 2 else (k % 7,)) for k in range(40)]
    params = ParamSet(specs, dtype=dtype)
    init_params(params, seed=2024)
    assert params.values.size == 825_480 and 300 * 250 > _CHUNK
    assert hashlib.sha256(params.values.tobytes()).hexdigest() == PINNED[dtype]


FILLS = sorted(set(param_generators.names()) - {"kFromFile"})
SHAPES = [(3, 5), (1, 7), (0, 4), (2, 3, 3), (130, 511), (257,)]  # 66,430 values > a chunk


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_init_of_many_params_equals_a_fill_of_each(dtype: Any) -> None:
    """Every built-in method (each through its draw, many Params per call) gives what a fill
    of each Param on its own gives, bit for bit: scaled, negated, empty, 3-D, longer than a
    chunk."""
    specs = []
    for method in FILLS:
        needs = {"kGaussianSqrtFanIn": 2, "kUniformSqrtFanIn": 2, "kUniformSqrtFanInOut": 2,
                 "identity": 2}.get(method)
        for j, shape in enumerate(SHAPES):
            if (needs and len(shape) != needs) or (len(shape) < 2 and method in (
                    "glorot_normal", "glorot_uniform", "he_normal", "he_uniform",
                    "kaiming_normal", "lecun_normal", "lecun_uniform", "orthogonal",
                    "variance_scaling", "xavier_normal")):
                continue
            value = {"zeros": {}, "ones": {}}.get(method, {"value": -1.5 if j % 2 else 0.75})
            specs.append((f"{method}_{j}", shape, {"init": {"type": method, **value}}))
    params = ParamSet(specs, dtype=dtype)
    init_params(params, seed=99)
    for p in params:
        alone = Param(p.name, p.shape, dtype)
        create_param_generator(p.conf.init).fill(alone, stream(99, p.name))
        assert np.array_equal(p.data, alone.data), p.name


def test_params_configured_alike_keep_configurations_of_their_own() -> None:
    conf = ParamConf.parse({"init": {"type": "kConstant", "value": 1.0}})
    params = ParamSet([("a", 3, conf), ("b", 3, conf), ("c", 3, {"lr_scale": 2.0}),
                       ("d", 3, {"lr_scale": 2.0}), ("e", 3, {"share_from": "a"})])
    a, b, c, d, e = (params[n] for n in "abcde")
    assert (a.conf.name, b.conf.name, e.conf.name, e.conf.share_from) == ("a", "b", "e", "a")
    assert a.conf is not b.conf and a.conf.init is not b.conf.init
    assert c.conf == ParamConf.parse({"name": "c", "lr_scale": 2.0,
                                      "init": {"type": "zeros"}})

    a.conf.init.value = 3.0  # a's own configuration: init reads it, b's stays
    init_params(params)
    assert a.data.tolist() == [3.0] * 3 and b.data.tolist() == [1.0] * 3
    assert conf.init.value == 1.0  # and the caller's too

    assert params.lr_scales.tolist() == [1.0, 1.0, 2.0, 2.0]
    d.conf.lr_scale = 0.0  # read by the next update, and only for d
    assert params.lr_scales.tolist() == [1.0, 1.0, 2.0, 0.0] and c.lr_scale == 2.0
    params.grads[...] = 1.0
    create_updater({"learning_rate": {"base_lr": 0.5}}).update_params(0, params)
    assert c.data.tolist() == [-1.0] * 3 and d.data.tolist() == [0.0] * 3
    c.conf = ParamConf.parse({"lr_scale": 4.0})  # a new configuration altogether
    assert params.lr_scales.tolist() == [1.0, 1.0, 4.0, 0.0]


def test_a_param_updated_alone_keeps_its_state_in_the_set() -> None:
    params = ParamSet([("a", 4), ("b", (2, 2)), ("c", 4, {"share_from": "a"})])
    updater = create_updater({"type": "kAdam"})
    params.grads[...] = 1.0
    assert params["a"].updater_state is None and params.updater_state is None
    updater.update(0, params["a"])
    updater.update(1, params["a"])
    alone = params["a"].updater_state
    assert alone is not None and alone["count"].tolist() == [2]
    m = alone["m"].copy()
    updater.update_params(2, params)
    state = params.updater_state
    assert state is not None and state["count"].tolist() == [3, 1]
    a = params["a"].updater_state
    assert a is not None and np.shares_memory(a["m"], state["m"])  # a view of the set's now
    assert not np.array_equal(a["m"], m) and params["c"].updater_state is None
    assert params.owner_states() == {}
    assert params.versions.tolist() == [3, 1] and params["c"].version == 3


def test_a_users_method_has_an_instance_per_configuration_object_as_before() -> None:
    """Params declared alike share one parsed configuration inside the set, but a user's
    method (which may keep state) still gets an instance per Param, as when each held a
    copy; specs given one ParamConf object share its instance, as before."""
    made: list[ParamGenerator] = []

    @register_param_generator("CountingInit")
    class Counting(ParamGenerator):
        def __init__(self, conf: Any):
            super().__init__(conf)
            made.append(self)
            self.calls = 0

        def fill(self, param: Param, rng: Any) -> None:
            self.calls += 1
            param.data[...] = self.calls

    try:
        one = {"init": {"user_type": "CountingInit"}}
        params = ParamSet([("a", 2, one), ("b", 2, one), ("c", 2, {**one})])
        init_params(params)
        assert len(made) == 3 and [params[n].data[0] for n in "abc"] == [1.0, 1.0, 1.0]
        conf = ParamConf.parse(one)
        shared = ParamSet([ParamSpec("x", (2,), conf, "param 0"),
                           ParamSpec("y", (2,), conf, "param 1")])
        init_params(shared)
        assert len(made) == 4 and [shared[n].data[0] for n in "xy"] == [1.0, 2.0]
        assert shared["x"].conf is conf  # a spec's own configuration, as given
    finally:
        param_generators.remove("CountingInit")
