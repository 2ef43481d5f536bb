"""Keras' initialisers by their names, with Keras' statistics; torch's untruncated normals
beside them; the Python API's default init; ``paramserver check``'s warning of constant
weight matrices.

Statistics are checked on large samples with fixed seeds against bounds of six standard
errors (deterministic, far from flaky), truncation by the sample's extremes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import Param, ParamError, ParamSet, create_param_generator
from paramserver.cli import main
from paramserver.config.job import ParamConf
from paramserver.init import TRUNCATED_STD, init_params, stream

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (400, 600)  # fan_in 600, fan_out 400 (SINGA's and torch's layout: rows = fan_out)
FAN_IN, FAN_OUT = 600, 400


def draw(conf: Any, shape: tuple[int, ...] = SHAPE, seed: int = 3) -> np.ndarray:
    p = Param("w", shape, np.float64)
    create_param_generator(conf).fill(p, stream(seed, "w"))
    return p.data


def assert_moments(x: np.ndarray, mean: float, std: float) -> None:
    x = x.ravel()
    n = x.size
    assert abs(x.mean() - mean) <= 6 * std / math.sqrt(n), (x.mean(), mean)
    assert abs(x.std() - std) <= 6 * std / math.sqrt(2 * n), (x.std(), std)


def test_truncated_std_is_that_of_the_standard_normal_cut_at_two() -> None:
    from scipy.stats import truncnorm

    assert TRUNCATED_STD == pytest.approx(truncnorm(-2, 2).std(), rel=1e-14)


def test_zeros_ones_and_constant() -> None:
    assert np.all(draw({"type": "zeros"}) == 0) and np.all(draw({"type": "ones"}) == 1)
    assert np.all(draw({"type": "constant", "value": -0.5}) == -0.5)
    with pytest.raises(ParamError, match="ones does not read value"):
        draw({"type": "ones", "value": 2})


def test_random_normal_and_uniform_have_kerass_defaults() -> None:
    assert_moments(draw({"type": "random_normal"}), 0.0, 0.05)
    assert_moments(draw({"type": "random_normal", "mean": 1.0, "stddev": 0.2}), 1.0, 0.2)
    x = draw({"type": "random_uniform"})
    assert_moments(x, 0.0, 0.1 / math.sqrt(12))
    assert -0.05 <= x.min() < -0.0499 and 0.0499 < x.max() < 0.05
    x = draw({"type": "random_uniform", "minval": 1.0, "maxval": 3.0})
    assert_moments(x, 2.0, 2 / math.sqrt(12))
    assert 1.0 <= x.min() and x.max() < 3.0


def test_truncated_normal_cuts_at_two_stddev() -> None:
    x = draw({"type": "truncated_normal"})  # Keras: stddev 0.05, within two of it
    assert_moments(x, 0.0, 0.05 * TRUNCATED_STD)
    assert -0.1 <= x.min() < -0.0999 and 0.0999 < x.max() <= 0.1


# (name, variance scale, mode's n, distribution) of Keras' variance-scaling family
FAMILY = {
    "glorot_uniform": (1.0, (FAN_IN + FAN_OUT) / 2, "uniform"),
    "glorot_normal": (1.0, (FAN_IN + FAN_OUT) / 2, "truncated_normal"),
    "lecun_uniform": (1.0, FAN_IN, "uniform"),
    "lecun_normal": (1.0, FAN_IN, "truncated_normal"),
    "he_uniform": (2.0, FAN_IN, "uniform"),
    "he_normal": (2.0, FAN_IN, "truncated_normal"),
    "xavier_normal": (1.0, (FAN_IN + FAN_OUT) / 2, "untruncated_normal"),  # torch's
    "kaiming_normal": (2.0, FAN_IN, "untruncated_normal"),                 # torch's
}


def check_variance_scaling(x: np.ndarray, scale: float, n: float, distribution: str) -> None:
    """Variance scale/n whatever the distribution; the support each distribution has."""
    std = math.sqrt(scale / n)
    assert_moments(x, 0.0, std)
    if distribution == "uniform":
        limit = math.sqrt(3 * scale / n)
        assert -limit <= x.min() < -0.999 * limit and 0.999 * limit < x.max() < limit
    elif distribution == "truncated_normal":  # cut at two of the pre-rescaling stddev
        cut = 2 * std / TRUNCATED_STD
        assert -cut <= x.min() < -0.99 * cut and 0.99 * cut < x.max() <= cut
    else:  # untruncated: values beyond the cut occur
        assert np.abs(x).max() > 2.5 * std


@pytest.mark.parametrize("method", list(FAMILY))
def test_the_variance_scaling_family(method: str) -> None:
    check_variance_scaling(draw({"type": method}), *FAMILY[method])


@pytest.mark.parametrize("mode", ["fan_in", "fan_out", "fan_avg"])
@pytest.mark.parametrize("distribution", ["truncated_normal", "untruncated_normal", "uniform"])
def test_variance_scaling(mode: str, distribution: str) -> None:
    n = {"fan_in": FAN_IN, "fan_out": FAN_OUT, "fan_avg": (FAN_IN + FAN_OUT) / 2}[mode]
    x = draw({"type": "variance_scaling", "scale": 3.0, "mode": mode,
              "distribution": distribution})
    check_variance_scaling(x, 3.0, n, distribution)


def test_convolution_fans_include_the_receptive_field() -> None:
    # (out, in, kh, kw): fan_in = in·kh·kw, as torch counts it (Keras' layout is (kh, kw, in,
    # out); the statistics for the same fans are the same)
    x = draw({"type": "he_normal"}, (32, 16, 3, 3))
    check_variance_scaling(x, 2.0, 16 * 9, "truncated_normal")


@pytest.mark.parametrize(("shape", "value"), [((5, 5), 1.0), ((3, 6), 2.0), ((6, 3), -1.0)])
def test_identity(shape: tuple[int, int], value: float) -> None:
    np.testing.assert_array_equal(draw({"type": "identity", "value": value}, shape),
                                  value * np.eye(*shape))
    with pytest.raises(ParamError, match="identity needs a 2-D Param"):
        draw({"type": "identity"}, (2, 2, 2))


def test_orthogonal_gain() -> None:
    m = draw({"type": "orthogonal", "value": 1.5}, (30, 50))
    np.testing.assert_allclose(m @ m.T, 2.25 * np.eye(30), atol=1e-12)


@pytest.mark.parametrize(("conf", "message"), [
    ({"type": "random_normal", "std": 0.1}, "random_normal does not read std (it reads stddev)"),
    ({"type": "random_uniform", "low": -0.1}, "random_uniform does not read low (it reads minval)"),
    ({"type": "glorot_uniform", "std": 0.1}, "glorot_uniform does not read std"),
    ({"type": "truncated_normal", "std": 2}, "truncated_normal does not read std"),
])
def test_singa_fields_a_keras_method_does_not_read_are_refused(conf: Any, message: str) -> None:
    with pytest.raises(ParamError) as e:
        draw(conf)
    assert str(e.value).startswith(message)


def test_bad_keras_configurations() -> None:
    with pytest.raises(ParamError, match="minval"):
        create_param_generator({"type": "random_uniform", "minval": 1, "maxval": 0})
    with pytest.raises(ParamError, match="Invalid Input: 'fan_sum'"):
        create_param_generator({"type": "variance_scaling", "mode": "fan_sum"})
    with pytest.raises(ParamError, match="scale"):
        create_param_generator({"type": "variance_scaling", "scale": 0})


# -- the Python API's default init ----------------------------------------------------------


def test_params_declared_in_python_get_kerass_defaults() -> None:
    ps = ParamSet([("w", (200, 300)), ("b", (200,)), ("v", (300, 200), {"lr_scale": 2}),
                   ("s", (3, 4), {"init": {"type": "kConstant", "value": 2}}),
                   ("k", (3, 4), ParamConf()), ("t", (300, 200), {"share_from": "w"})])
    assert ps["w"].conf.init.type == "glorot_uniform"
    assert ps["v"].conf.init.type == "glorot_uniform"
    assert ps["b"].conf.init.type == "zeros"
    init_params(ps, seed=0)
    limit = math.sqrt(6 / 500)
    for name in ("w", "v"):
        x = ps[name].data.astype(np.float64)
        assert_moments(x, 0.0, limit / math.sqrt(3))
        assert np.abs(x).max() < limit
    assert np.all(ps["b"].data == 0)
    assert np.all(ps["s"].data == 2)   # an init given is the one used
    assert np.all(ps["k"].data == 1)   # a ParamConf object is SINGA's: constant 1
    np.testing.assert_array_equal(ps["t"].data, ps["w"].data.reshape(300, 200))


# -- paramserver check ------------------------------------------------------------------------


def test_check_warns_of_a_constant_weight_matrix(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    text = (ROOT / "examples" / "digits_mlp.conf").read_text()
    job = tmp_path / "job.conf"
    job.write_text(text.replace('param { name: "w2" init { type: kGaussian std: 0.01 } }',
                                'param { name: "w2" }'))
    assert main(["check", str(job)]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out  # the report on stdout, its warnings on stderr
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warned == [
        "warning: Param 'w2' (layer 'fc2', param 0) of shape 10x128 has a constant init (none "
        "given, so SINGA's default: kConstant, value 1): every unit computes the same and gets "
        "the same gradient, so they stay equal; give it a random init, e.g. init { type: "
        "glorot_uniform }"]
    # biases (one dimension) with constant inits, and the unchanged example, are not warned of
    assert main(["check", "--json", str(ROOT / "examples" / "digits_mlp.conf")]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["warnings"] == []
