"""Initialisation methods (SPEC §4, §8): statistics, fans, scaling, reproducibility, users' own.

Statistics are checked on large samples (up to 1e6 elements) with fixed seeds, against
bounds of six standard errors: deterministic, and far from flaky. The random fills themselves
are tested in ``test_rng.py``; here they are seen through the API users call.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from paramserver import (
    Param,
    ParamError,
    Parameter,
    ParamSet,
    create_param_generator,
    field,
    register_param_generator,
)
from paramserver.config.components import param_generators
from paramserver.config.job import ParamConf, ParamGenConf
from paramserver.init import ParamGenerator, Stream, init_params, stream
from paramserver.numerics.rng import fill_normal, fill_uniform, param_key

BUILTINS = ["glorot_normal", "glorot_uniform", "he_normal", "he_uniform", "kConstant",
            "kGaussian", "kGaussianSqrtFanIn", "kUniform", "kUniformSqrtFanIn",
            "kUniformSqrtFanInOut", "orthogonal", "truncated_normal",
            # Keras' names (tests/test_keras_init.py) and torch's untruncated normals
            "identity", "kaiming_normal", "lecun_normal", "lecun_uniform", "ones",
            "random_normal", "random_uniform", "variance_scaling", "xavier_normal", "zeros"]
#: Every built-in name: the fills above and kFromFile (which reads a file: tests/test_export.py).
REGISTERED = [*BUILTINS, "kFromFile"]


def draw(conf: Any, shape: tuple[int, ...], seed: int = 0, dtype: Any = np.float32,
         name: str = "w") -> np.ndarray:
    p = Param(name, shape, dtype)
    create_param_generator(conf).fill(p, stream(seed, name))
    return p.data


def assert_moments(x: np.ndarray, mean: float, std: float) -> None:
    """Sample mean and std within six standard errors of ``mean`` and ``std``."""
    x = x.astype(np.float64).ravel()
    n = x.size
    assert abs(x.mean() - mean) <= 6 * std / math.sqrt(n), (x.mean(), mean)
    assert abs(x.std() - std) <= 6 * std / math.sqrt(2 * n), (x.std(), std)


def truncated_std(a: float, b: float) -> float:
    """Standard deviation of N(0, 1) truncated to [a, b]."""
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    z = cdf(b) - cdf(a)
    mu = (pdf(a) - pdf(b)) / z
    return math.sqrt(1 + (a * pdf(a) - b * pdf(b)) / z - mu * mu)


# -- the methods of SPEC §4 -----------------------------------------------------------------


def test_every_method_is_registered() -> None:
    assert sorted(param_generators.names()) == sorted(REGISTERED)


def test_value_defaults_to_1_for_every_method() -> None:
    assert ParamGenConf().value == 1.0
    assert ParamGenConf().type == "kConstant"


def test_constant_fills_1_by_default() -> None:
    assert np.all(draw({}, (3, 4)) == 1.0)
    assert np.all(draw({"type": "kConstant"}, (5,)) == 1.0)
    ps = ParamSet([("b", 7, ParamConf())])  # SINGA's configuration, as a job file's
    ps["b"].data[...] = 3.0
    init_params(ps)
    assert np.all(ps["b"].data == 1.0)


@pytest.mark.parametrize("spelling", ["kConstant", "kConst", "constant", "const"])
def test_constant_fills_value(spelling: str) -> None:
    assert np.all(draw({"type": spelling, "value": -0.25}, (2, 3)) == -0.25)
    assert np.all(draw({"type": spelling, "value": 0}, (4,)) == 0.0)


def test_gaussian_statistics() -> None:
    assert_moments(draw({"type": "kGaussian"}, (1000, 1000)), 0.0, 1.0)
    # N(mean, std), then × value
    x = draw({"type": "kGaussian", "mean": 0.5, "std": 2.0, "value": 3.0}, (500, 500))
    assert_moments(x, 1.5, 6.0)


def test_gaussian_statistics_float64() -> None:
    x = draw({"type": "kGaussian", "std": 0.5}, (500, 500), dtype=np.float64)
    assert x.dtype == np.float64
    assert_moments(x, 0.0, 0.5)


def test_uniform_statistics_and_bounds() -> None:
    x = draw({"type": "kUniform"}, (1000, 1000))
    assert_moments(x, 0.0, 2 / math.sqrt(12))
    assert -1.0 <= x.min() < -0.999 and 0.999 < x.max() < 1.0
    x = draw({"type": "kUniform", "low": 0.0, "high": 2.0, "value": 1.5}, (500, 500))
    assert_moments(x, 1.5, 3 / math.sqrt(12))
    assert 0.0 <= x.min() < 1e-3 and 3.0 - 1e-3 < x.max() < 3.0


@pytest.mark.parametrize("shape", [(64, 4096), (4096, 64)])
def test_gaussian_sqrt_fan_in_uses_shape_1(shape: tuple[int, int]) -> None:
    x = draw({"type": "kGaussianSqrtFanIn"}, shape)
    assert_moments(x, 0.0, 1 / math.sqrt(shape[1]))


@pytest.mark.parametrize("shape", [(64, 4096), (4096, 64)])
def test_uniform_sqrt_fan_in_uses_shape_1(shape: tuple[int, int]) -> None:
    x = draw({"type": "kUniformSqrtFanIn"}, shape)
    bound = math.sqrt(3 / shape[1])
    assert_moments(x, 0.0, bound / math.sqrt(3))
    assert -bound <= x.min() < -0.99 * bound and 0.99 * bound < x.max() < bound


@pytest.mark.parametrize("spelling", ["kUniformSqrtFanInOut", "kUniformFanInOut"])
def test_uniform_sqrt_fan_in_out_uses_glorots_factor(spelling: str) -> None:
    x = draw({"type": spelling}, (100, 2500))
    bound = math.sqrt(6 / (2500 + 100))  # SPEC §4 Decision, not 1/sqrt(rows + cols)
    assert_moments(x, 0.0, bound / math.sqrt(3))
    assert -bound <= x.min() < -0.99 * bound and 0.99 * bound < x.max() < bound


@pytest.mark.parametrize(("method", "base", "factor"), [
    ("kGaussianSqrtFanIn", "kGaussian", lambda fi, fo: 1 / math.sqrt(fi)),
    ("kUniformSqrtFanIn", "kUniform", lambda fi, fo: math.sqrt(3 / fi)),
    ("kUniformSqrtFanInOut", "kUniform", lambda fi, fo: math.sqrt(6 / (fi + fo))),
])
def test_fan_methods_are_the_base_fill_times_their_factor(method: str, base: str,
                                                          factor: Any) -> None:
    """Element by element, as SPEC §4 writes them: "kGaussian fill, then × 1/sqrt(fan_in)"."""
    conf = {"mean": 0.25, "std": 0.5, "low": -0.5, "high": 2.0}
    fanned = draw({"type": method, **conf}, (30, 70), dtype=np.float64)
    plain = draw({"type": base, **conf}, (30, 70), dtype=np.float64)
    np.testing.assert_allclose(fanned, plain * factor(70, 30), rtol=1e-12, atol=1e-14)


SINGA_FILLS = ["kGaussian", "kUniform", "kGaussianSqrtFanIn", "kUniformSqrtFanIn",
               "kUniformSqrtFanInOut"]


@pytest.mark.parametrize("method", [*SINGA_FILLS, "truncated_normal", "glorot_uniform",
                                    "glorot_normal", "he_uniform", "he_normal", "orthogonal",
                                    "random_normal", "random_uniform", "lecun_normal",
                                    "lecun_uniform", "variance_scaling", "xavier_normal",
                                    "kaiming_normal", "identity"])
@pytest.mark.parametrize("value", [2.5, -0.5, 0.0])
def test_value_multiplies_the_fill(method: str, value: float) -> None:
    # SINGA's methods read the common fields; Keras' read their own (tests/test_keras_init.py)
    conf = ({"type": method, "mean": 0.5, "std": 2.0, "low": -0.5, "high": 1.5}
            if method in SINGA_FILLS else {"type": method})
    one = draw(conf, (20, 30), dtype=np.float64)
    scaled = draw({**conf, "value": value}, (20, 30), dtype=np.float64)
    np.testing.assert_allclose(scaled, value * one, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("method", "shape", "std"), [
    ("glorot_normal", (300, 700), math.sqrt(2 / 1000)),
    ("xavier_normal", (300, 700), math.sqrt(2 / 1000)),
    ("he_normal", (300, 700), math.sqrt(2 / 700)),
    ("kaiming_normal", (300, 700), math.sqrt(2 / 700)),
    # N-D (a convolution's weights): the fans include the receptive field.
    ("glorot_normal", (64, 32, 5, 5), math.sqrt(2 / ((32 + 64) * 25))),
    ("he_normal", (64, 32, 5, 5), math.sqrt(2 / (32 * 25))),
])
def test_glorot_and_he_normal(method: str, shape: tuple[int, ...], std: float) -> None:
    assert_moments(draw({"type": method}, shape), 0.0, std)


@pytest.mark.parametrize(("method", "shape", "bound"), [
    ("glorot_uniform", (300, 700), math.sqrt(6 / 1000)),
    ("xavier_uniform", (300, 700), math.sqrt(6 / 1000)),
    ("he_uniform", (300, 700), math.sqrt(6 / 700)),
    ("kaiming_uniform", (300, 700), math.sqrt(6 / 700)),
    ("glorot_uniform", (64, 32, 5, 5), math.sqrt(6 / ((32 + 64) * 25))),
    ("he_uniform", (64, 32, 5, 5), math.sqrt(6 / (32 * 25))),
])
def test_glorot_and_he_uniform(method: str, shape: tuple[int, ...], bound: float) -> None:
    x = draw({"type": method}, shape)
    assert_moments(x, 0.0, bound / math.sqrt(3))
    assert -bound <= x.min() < -0.99 * bound and 0.99 * bound < x.max() < bound


def test_truncated_normal_statistics_and_bounds() -> None:
    x = draw({"type": "truncated_normal", "stddev": 1.0}, (1000, 1000))
    assert_moments(x, 0.0, truncated_std(-2, 2))
    assert -2.0 <= x.min() < -1.99 and 1.99 < x.max() <= 2.0
    x = draw({"type": "truncated_normal", "mean": 1.0, "stddev": 0.5, "value": 2.0}, (500, 500))
    assert_moments(x, 2.0, truncated_std(-2, 2))
    assert 0.0 <= x.min() and x.max() <= 4.0


@pytest.mark.parametrize(("shape", "value"), [((300, 200), 1.0), ((200, 300), 2.0),
                                              ((50, 50), -1.0), ((6, 4, 5), 0.5)])
def test_orthogonal(shape: tuple[int, ...], value: float) -> None:
    x = draw({"type": "orthogonal", "value": value}, shape, dtype=np.float64)
    m = x.reshape(shape[0], -1)
    rows, cols = m.shape
    gram = m.T @ m if rows >= cols else m @ m.T
    np.testing.assert_allclose(gram, value * value * np.eye(min(rows, cols)), atol=1e-12)


@pytest.mark.parametrize("method", ["kGaussianSqrtFanIn", "kUniformSqrtFanIn",
                                    "kUniformSqrtFanInOut", "kUniformFanInOut"])
@pytest.mark.parametrize("shape", [(10,), (2, 3, 4), ()])
def test_fan_methods_refuse_a_param_that_is_not_2d(method: str, shape: tuple[int, ...]) -> None:
    canonical = param_generators.lookup(method)
    with pytest.raises(ParamError) as e:
        draw({"type": method}, shape, name="b1")
    assert str(e.value) == (f"Param 'b1' has shape {shape}: {canonical} needs a 2-D Param "
                            "(fan_in = shape[1], fan_out = shape[0])")


@pytest.mark.parametrize("method", ["glorot_uniform", "glorot_normal", "he_uniform",
                                    "he_normal", "orthogonal"])
def test_other_fan_methods_need_at_least_2_dimensions(method: str) -> None:
    with pytest.raises(ParamError) as e:
        draw({"type": method}, (10,), name="b1")
    assert str(e.value) == (f"Param 'b1' has shape (10,): {method} needs a Param of 2 or more "
                            "dimensions (fan_in = shape[1], fan_out = shape[0])")


@pytest.mark.parametrize("method", BUILTINS)
@pytest.mark.parametrize("shape", [(0, 5), (5, 0)])
def test_empty_params_are_filled_without_error(method: str, shape: tuple[int, int]) -> None:
    assert draw({"type": method}, shape).shape == shape


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("x", [
    ParamGenConf(type="kGaussian", std=0.5),
    {"type": "kGaussian", "std": 0.5},
    {"type": "gaussian", "std": "0.5"},
    "type: kGaussian std: 0.5",
    "init { type: kGaussian std: 0.5 }",
    "init: < type: kGaussian std: 0.5 >",
])
def test_create_param_generator_from_conf_dict_or_text(x: Any) -> None:
    gen = create_param_generator(x)
    assert type(gen).__name__ == "Gaussian"
    assert gen.conf.component == "kGaussian" and gen.conf.std == 0.5
    assert gen.own is None


def test_configuration_errors() -> None:
    with pytest.raises(ParamError) as e:
        create_param_generator({"type": "kGaussian", "std": -1})
    assert str(e.value) == ("value -1 for Parameter std should be greater equal to 0\n"
                            "std: Standard deviation of the Gaussian methods.")
    with pytest.raises(ParamError) as e:
        create_param_generator({"type": "kUniform", "low": 2, "high": 1})
    assert str(e.value) == "low (2) must not be greater than high (1)"
    with pytest.raises(ParamError) as e:
        create_param_generator("type: kGausian")
    assert str(e.value).startswith("<init>:1:1: Invalid Input: 'kGausian', valid values are: "
                                   "{'glorot_normal', ")
    assert str(e.value).endswith("Did you mean 'kGaussian'?")
    with pytest.raises(ParamError) as e:
        create_param_generator({"type": "kGaussian", "stdev": 1})
    assert str(e.value).startswith("Cannot find argument 'stdev', Possible Arguments:\n"
                                   "----------------\ntype : ")
    assert str(e.value).endswith("Did you mean 'std'?")
    with pytest.raises(ParamError, match="Invalid Parameter format for value expect float "
                                         "but value='big'"):
        create_param_generator("type: kConstant value: big")
    with pytest.raises(ParamError, match=r"expected a configuration \(ParamGenConf\), a dict or "
                                         "the text of the init block, not int"):
        create_param_generator(3)  # type: ignore[arg-type]


# -- users' own methods (SPEC §8) -----------------------------------------------------------


class FooConfig(Parameter):
    x: int = field(1, lower=0, doc="Upper end of the fill.")


class FooParamGen(ParamGenerator):
    """U[0, x): a user's method with its own configuration."""

    Config = FooConfig

    def fill(self, param: Param, rng: Stream) -> None:
        rng.uniform(param.data, 0.0, float(self.own.x))


@pytest.fixture
def foo() -> Iterator[type[FooParamGen]]:
    register_param_generator("FooParam")(FooParamGen)
    try:
        yield FooParamGen
    finally:
        param_generators.remove("FooParam")


@pytest.mark.parametrize("x", [
    'user_type: "FooParam" [fooparam_conf] { x: 10 }',
    'init { user_type: "FooParam" [fooparam_conf] { x: 10 } }',
    {"user_type": "FooParam", "fooparam_conf": {"x": 10}},
    {"user_type": "FooParam", "x": 10},  # keyword arguments in Python
    {"user_type": "foo_param", "x": "10"},
])
def test_user_method_with_its_own_configuration(foo: type, x: Any) -> None:
    gen = create_param_generator(x)
    assert isinstance(gen, foo)
    assert gen.conf.component == "FooParam" and gen.own == FooConfig(x=10)
    data = draw(x, (100, 100))
    assert 0.0 <= data.min() and data.max() < 10.0 and data.max() > 9.9


def test_user_method_defaults_and_errors(foo: type) -> None:
    assert create_param_generator({"user_type": "FooParam"}).own == FooConfig(x=1)
    with pytest.raises(ParamError) as e:
        create_param_generator('user_type: "FooParam" [fooparam_conf] { x: -2 }')
    assert str(e.value) == ("<init>:1:41: value -2 for Parameter x should be greater equal to 0"
                            "\nx: Upper end of the fill.")
    with pytest.raises(ParamError, match=r"<init>:1:23: extension block \[barparam_conf\] "
                                         r"does not belong to init method 'FooParam' "
                                         r"\(expected \[fooparam_conf\]\)"):
        create_param_generator('user_type: "FooParam" [barparam_conf] { x: 2 }')
    with pytest.raises(ParamError, match=r"extension block \[fooparam_conf\] does not belong "
                                         r"to init method 'kGaussian'"):
        create_param_generator('type: kGaussian [fooparam_conf] { x: 2 }')
    with pytest.raises(ParamError, match="give fooparam_conf either as a block or as keys, "
                                         r"not both: \['x'\]"):
        create_param_generator({"user_type": "FooParam", "fooparam_conf": {"x": 1}, "x": 2})


def test_user_method_in_a_paramset_is_reproducible(foo: type) -> None:
    specs = [("w", (20, 30), {"init": {"user_type": "FooParam", "x": 4}})]
    a, b = ParamSet(specs), ParamSet(specs)
    init_params(a, seed=5)
    init_params(b, seed=5)
    assert np.array_equal(a.values, b.values)
    assert 0.0 <= a.values.min() and a.values.max() < 4.0


def test_unknown_user_type_lists_the_registered_names(foo: type) -> None:
    with pytest.raises(ParamError) as e:
        create_param_generator('user_type: "FooPram"')
    names = "{" + ", ".join(repr(n) for n in sorted([*REGISTERED, "FooParam"])) + "}"
    assert str(e.value) == (f"<init>:1:1: Invalid Input: 'FooPram', valid values are: {names}"
                            "\nDid you mean 'FooParam'?")


@pytest.mark.parametrize("name", ["FooParam", "fooparam", "foo_param", "kFooParam"])
def test_a_name_that_collides_is_refused(foo: type, name: str) -> None:
    with pytest.raises(ParamError) as e:
        register_param_generator(name)(type("Other", (ParamGenerator,), {}))
    assert str(e.value) == (f"init method name '{name}' is already registered (as 'FooParam' "
                            f"for {__name__}.FooParamGen)")


@pytest.mark.parametrize("name", ["kGaussian", "gaussian", "kConst", "xavier_uniform"])
def test_builtin_names_cannot_be_taken(name: str) -> None:
    with pytest.raises(ParamError, match=f"init method name '{name}' is already registered"):
        register_param_generator(name)(type("Other", (ParamGenerator,), {}))
    with pytest.raises(ParamError, match="init method name 'kUniform' is already registered"):
        register_param_generator("mine", aliases=("kUniform",))(type("O", (), {}))
    assert "mine" not in param_generators  # nothing registered


# -- reproducibility ------------------------------------------------------------------------

SPECS = [
    ("fc1_w", (64, 100), {"init": {"type": "kUniformSqrtFanIn"}}),
    ("fc1_b", (64,), {"init": {"type": "kConstant", "value": 0.1}}),
    ("fc2_w", (10, 64), {"init": {"type": "kGaussian", "std": 0.01}}),
    ("fc2_b", (10,), {"init": {"type": "kUniform"}}),
    ("emb", (50, 8), {"init": {"type": "truncated_normal"}}),
    ("rnn", (8, 8), {"init": {"type": "orthogonal"}}),
    ("fc3_w", (64, 10), {"share_from": "fc2_w"}),
]


def values_by_name(ps: ParamSet) -> dict[str, np.ndarray]:
    return {p.name: p.data.copy() for p in ps}


def test_init_follows_the_documented_seeding_scheme() -> None:
    """Each Param's stream is keyed by BLAKE2b(name, key=seed) (docs/params.md)."""
    digest = hashlib.blake2b(b"fc2_w", digest_size=8, key=(7).to_bytes(8, "little")).digest()
    key = int.from_bytes(digest, "little")
    assert stream(7, "fc2_w").key == param_key(7, "fc2_w") == key
    ps = ParamSet(SPECS)
    init_params(ps, seed=7)
    expected = np.empty((10, 64), np.float32)
    fill_normal(expected, key, 0.0, 0.01)
    assert np.array_equal(ps["fc2_w"].data, expected)
    bias = np.empty(10, np.float32)
    fill_uniform(bias, param_key(7, "fc2_b"), -1.0, 1.0)
    assert np.array_equal(ps["fc2_b"].data, bias)


def test_same_seed_same_values_other_seed_other_values() -> None:
    a, b, c = ParamSet(SPECS), ParamSet(SPECS), ParamSet(SPECS)
    init_params(a, seed=1)
    init_params(b, seed=1)
    init_params(c, seed=2)
    assert np.array_equal(a.values, b.values)
    for name in ["fc1_w", "fc2_w", "fc2_b", "emb", "rnn"]:
        assert not np.array_equal(a[name].data, c[name].data)
    # Params of one method differ by name.
    d = ParamSet([("x", 100, {"init": {"type": "kGaussian"}}),
                  ("y", 100, {"init": {"type": "kGaussian"}})])
    init_params(d)
    assert not np.array_equal(d["x"].data, d["y"].data)


def test_values_do_not_depend_on_the_order_params_are_declared_in() -> None:
    forward = ParamSet(SPECS)
    backward = ParamSet(SPECS[::-1])
    alone = ParamSet([SPECS[4], SPECS[2]])
    for ps in (forward, backward, alone):
        init_params(ps, seed=3)
    a, b, c = values_by_name(forward), values_by_name(backward), values_by_name(alone)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    for name in c:
        assert np.array_equal(a[name], c[name]), name


def test_values_do_not_depend_on_the_number_of_replicas_or_threads() -> None:
    reference = ParamSet(SPECS)
    init_params(reference, seed=11)
    for workers in (1, 2, 4):
        replicas = [ParamSet(SPECS) for _ in range(workers)]
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda ps: init_params(ps, seed=11), replicas))
        for ps in replicas:
            assert np.array_equal(ps.values, reference.values)
    # A worker's replica (own memory) initialised on its own gets the same values too.
    replica = reference.replica(np.zeros_like(reference.values))
    init_params(replica, seed=11)
    assert np.array_equal(replica.values, reference.values)


def test_values_do_not_depend_on_numbas_thread_count() -> None:
    import numba

    specs = [("big", (400, 500), {"init": {"type": "kGaussian"}}),  # several parallel chunks
             ("big_u", (400, 500), {"init": {"type": "kUniform"}})]
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = ParamSet(specs)
        init_params(one, seed=2)
    finally:
        numba.set_num_threads(before)
    many = ParamSet(specs)
    init_params(many, seed=2)
    assert np.array_equal(one.values, many.values)


def test_values_are_the_same_in_another_process() -> None:
    """Not seeded by the clock nor by Python's per-process string hashing."""
    ps = ParamSet(SPECS)
    init_params(ps, seed=42)
    here = hashlib.sha256(ps.values.tobytes()).hexdigest()
    code = ("import hashlib, sys\n"
            f"sys.path[:0] = {sys.path!r}\n"
            "from paramserver import ParamSet, init_params\n"
            f"ps = ParamSet({SPECS!r})\n"
            "init_params(ps, seed=42)\n"
            "print(hashlib.sha256(ps.values.tobytes()).hexdigest())\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == here


def test_init_fills_owners_and_sharers_see_the_values() -> None:
    ps = ParamSet(SPECS)
    ps["fc2_w"].version = 5
    init_params(ps, seed=0)
    assert np.shares_memory(ps["fc3_w"].data, ps["fc2_w"].data)
    assert np.array_equal(ps["fc3_w"].data.ravel(), ps["fc2_w"].data.ravel())
    assert ps.versions.tolist() == [0] * len(ps.owners)
    assert np.all(ps["fc1_b"].data == np.float32(0.1))
    # Adding a sharer changes no value.
    plain = ParamSet(SPECS[:-1])
    init_params(plain, seed=0)
    assert np.array_equal(plain.values, ps.values)


def test_init_errors_name_the_param() -> None:
    ps = ParamSet([("bias", 5, {"init": {"type": "kUniformSqrtFanIn"}})])
    with pytest.raises(ParamError, match=r"Param 'bias' has shape \(5,\): kUniformSqrtFanIn "
                                         "needs a 2-D Param"):
        init_params(ps)


@pytest.mark.parametrize("seed", [-1, 1 << 64, 1.5, True, "1"])
def test_a_bad_seed_is_refused(seed: Any) -> None:
    with pytest.raises(ParamError, match=r"seed must be an int in \[0, 2\*\*64\), not "):
        init_params(ParamSet(SPECS), seed=seed)


def test_the_largest_seed() -> None:
    a, b = ParamSet(SPECS), ParamSet(SPECS)
    init_params(a, seed=(1 << 64) - 1)
    init_params(b, seed=np.uint64((1 << 64) - 1))
    assert np.array_equal(a.values, b.values)
