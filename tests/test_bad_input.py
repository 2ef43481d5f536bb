"""Bad input found by trying paramserver as a new user would (issue 13): each is refused with
a clear ParamError, in SPEC section 1's wording, before anything runs or is allocated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.cluster import Cluster
from paramserver.config.job import ClusterConf, JobConf, UpdaterConf, conf_from, parse_job
from paramserver.config.textformat import parse_text
from paramserver.params import ParamSet, plan_params
from paramserver.report import job_report
from paramserver.updaters import create_updater

ROOT = Path(__file__).resolve().parents[1]
MLP = (ROOT / "examples" / "digits_mlp.conf").read_text()


def error(fn: Any, *args: Any) -> str:
    with pytest.raises(ParamError) as e:
        fn(*args)
    return str(e.value)


# -- row 7: cluster sizes are bounded ------------------------------------------------------------


@pytest.mark.parametrize("key", ["nworker_groups", "nserver_groups", "nworkers_per_group",
                                 "nservers_per_group"])
def test_cluster_sizes_are_bounded(key: str) -> None:
    # 2**31 servers ran away (minutes, gigabytes) in check before anything was said.
    text = MLP.replace("cluster {", f"cluster {{\n  {key}: 2147483648")
    text = text.replace(f"  {key}: 1\n", "")
    message = error(parse_job, text, "job.conf")
    assert message.startswith("job.conf:")
    assert f"value 2147483648 for Parameter {key} exceed bound [1,4096]" in message
    assert ClusterConf(**{key: 4096}).to_dict()[key] == 4096


# -- row 8: check allocates nothing large; train says the model does not fit -------------------


def test_check_of_a_model_larger_than_memory_allocates_nothing() -> None:
    job = parse_job(MLP.replace("num_output: 128", "num_output: 2147483648"))
    report = job_report(job)  # a MemoryError traceback before: check built the whole model
    assert "161,061,273,610 values" in report
    assert "2147483648x64" in report


def test_a_model_larger_than_memory_is_refused_with_its_size() -> None:
    specs = [("w", (2**31, 64)), ("b", (2**31,))]
    message = error(ParamSet, specs)
    assert message.startswith("the model does not fit in memory: its Params hold "
                              "139,586,437,120 values and 139,586,437,120 gradient elements, "
                              "1.0 TiB in float32; this machine has ")
    assert "(largest: 'w' 2147483648x64 (param 0), 'b' 2147483648 (param 1))" in message
    plan = plan_params(specs)
    assert plan.num_values == 2**31 * 65 and plan.nbytes(np.float64) == 2**31 * 65 * 16


def test_a_failed_allocation_says_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import paramserver.params as params

    monkeypatch.setattr(params, "physical_memory", lambda: None)  # no system answer

    def refuse(*args: Any, **kwargs: Any) -> np.ndarray:
        raise MemoryError

    monkeypatch.setattr(params.np, "zeros", refuse)
    message = error(ParamSet, [("w", (10, 10))])
    assert message == ("the model does not fit in memory: its Params hold 100 values and 100 "
                       "gradient elements, 800 bytes in float32 (largest: 'w' 10x10 (param 0))")


# -- row 9: assigning a Param's gradient writes through -----------------------------------------


def test_assigning_grad_in_grad_fn_is_written_through() -> None:
    job = parse_job("train_steps: 2\nneuralnet { }\nupdater { learning_rate { base_lr: 0.5 } }")
    params = ParamSet([("w", (2,))])
    cluster = Cluster(job, params)

    def grad_fn(worker: Any, step: int) -> None:
        worker.params["w"].grad = np.ones(2)  # silently ignored before: a new array

    cluster.run(grad_fn, 2)
    np.testing.assert_array_equal(params["w"].data, [-1.0, -1.0])


def test_assignment_to_data_and_grad_is_checked() -> None:
    ps = ParamSet([("w", (2, 3)), ("v", (3, 2), {"share_from": "w"})])
    w = ps["w"]
    w.data = np.arange(6).reshape(2, 3)
    assert w.data.base is not None and np.shares_memory(w.data, ps.values)
    np.testing.assert_array_equal(ps.values, np.arange(6))
    ps["v"].data = 7  # a sharer writes its owner's values
    np.testing.assert_array_equal(w.data, np.full((2, 3), 7))
    w.grad = 0.5
    np.testing.assert_array_equal(ps.owner_grads(), np.full(6, 0.5, np.float32))
    assert error(setattr, w, "grad", np.ones(5)) == (
        "Param 'w': cannot assign an array of shape (5,) to grad of shape (2, 3)")
    assert error(setattr, w, "data", "x") == (
        "Param 'w': cannot assign <U1 values to data (float32)")


# -- row 10: values that would make every parameter non-finite are refused ------------------------


@pytest.mark.parametrize(("conf", "expected"), [
    ({"learning_rate": {"base_lr": "inf"}},
     "learning_rate: value inf for Parameter base_lr should be a finite number\n"
     "base_lr: Base learning rate."),
    ({"weight_decay": "inf"},
     "value inf for Parameter weight_decay should be a finite number\n"
     "weight_decay: Weight decay (L2) coefficient."),
    ({"clip_low": "nan"},
     "value nan for Parameter clip_low should be a number (inf and -inf are), not nan\n"
     "clip_low: Gradients are clamped into [clip_low, clip_high] when clip_high > clip_low;"),
    ({"clip_high": float("nan")},
     "value nan for Parameter clip_high should be a number (inf and -inf are), not nan"),
    ({"clip_high": "nan(x)"}, "value nan for Parameter clip_high should be a number"),
    ({"delta": "inf"}, "value inf for Parameter delta should be a finite number"),
    ({"delta": "1e-500"}, "Out of range value for delta, value='1e-500'"),
])
def test_updater_values_must_be_finite(conf: dict[str, Any], expected: str) -> None:
    assert error(UpdaterConf.parse, conf).startswith(expected)


@pytest.mark.parametrize(("low", "high", "expected"), [
    ("-inf", "0.5", [-3.0, 0.5, 0.5, -0.25]),   # clipped above only
    ("-0.5", "inf", [-0.5, 2.0, 1e30, -0.25]),  # below only
    ("-inf", "inf", [-3.0, 2.0, 1e30, -0.25]),  # a clip that changes nothing
])
def test_clip_bounds_may_be_infinite(low: str, high: str, expected: list[float]) -> None:
    """One-sided clipping (SPEC §5: clip bounds must not be NaN; infinite ones are bounds)."""
    text = f"type: kSGD clip_low: {low} clip_high: {high} learning_rate {{ base_lr: 1 }}"
    conf = UpdaterConf.parse(parse_text(text, "updater"))
    assert (conf.clip_low, conf.clip_high) == (float(low), float(high))
    for dtype in (np.float32, np.float64):  # kernels run in the Params' type
        param = ParamSet([("w", (4,))], dtype)["w"]  # values 0
        param.grad[...] = [-3.0, 2.0, 1e30, -0.25]
        create_updater(conf).update(0, param)
        assert np.array_equal(-param.data, np.array(expected, dtype)), (dtype, param.data)


def test_param_scales_must_be_finite() -> None:
    text = MLP.replace('param { name: "w1" ', 'param { name: "w1" lr_scale: inf ')
    assert "value inf for Parameter lr_scale should be a finite number" in error(
        parse_job, text, "job.conf")
    text = MLP.replace("wd_scale: 0 init { type: kConstant", "wd_scale: inf init "
                       "{ type: kConstant")
    assert "value inf for Parameter wd_scale should be a finite number" in error(
        parse_job, text, "job.conf")
    for key in ("value", "mean", "std", "low", "high"):
        assert "should be a finite number" in error(
            parse_job, MLP.replace("type: kGaussian std: 0.01", f"type: kGaussian {key}: nan"))


# -- the SINGA layer and data configurations (issue 14's): no value that makes training
# non-finite or a layer impossible ----------------------------------------------------------


@pytest.mark.parametrize(("block", "expected"), [
    ("lrn_conf { knorm: 0 }", "value 0 for Parameter knorm should be greater than 0"),
    ("lrn_conf { alpha: -1 }", "value -1 for Parameter alpha should be greater equal to 0"),
    ("lrn_conf { beta: inf }", "value inf for Parameter beta should be a finite number"),
    ("lrn_conf { local_size: 4 }", "local_size must be odd (the window is centred on the "
                                   "channel), got 4"),
    ("convolution_conf { num_filters: 8 stride: 0 }",
     "value 0 for Parameter stride should be greater equal to 1"),
    ("convolution_conf { num_filters: 8 kernel_x: 0 }",
     "value 0 for Parameter kernel_x should be greater equal to 1"),
    ("pooling_conf { stride_y: 0 }", "value 0 for Parameter stride_y should be greater equal "
                                     "to 1"),
    ("pooling_conf { kernel: 0 }", "value 0 for Parameter kernel should be greater equal to 1"),
    ("softmaxloss_conf { scale: inf }", "value inf for Parameter scale should be a finite"),
    ("relu_conf { negative_slope: nan }", "value nan for Parameter negative_slope should be a "
                                          "finite number"),
    ("rnn_dummy_conf { low: 1 high: 0 }", "low must not exceed high, got low 1 and high 0"),
    ("rnn_dummy_conf { high: inf }", "value inf for Parameter high should be a finite number"),
    ("dropout_conf { dropout_ratio: nan }", "value nan for Parameter dropout_ratio exceed "
                                            "bound [0,1]"),
    # data
    ("store_conf { std_value: 0 }", "value 0 for Parameter std_value should be greater than 0"),
    ("store_conf { mean_value: -inf }", "value -inf for Parameter mean_value should be a "
                                        "finite number"),
    ("store_conf { separator: '' }", "separator must not be empty"),
    ("store_conf { batchsize: 0 }", "value 0 for Parameter batchsize should be greater equal "
                                    "to 1"),
    ("mnist_conf { norm_a: 0 }", "value 0 for Parameter norm_a should be greater than 0"),
    ("mnist_conf { norm_b: nan }", "value nan for Parameter norm_b should be a finite number"),
    ("mnist_conf { sigma: -1 }", "value -1 for Parameter sigma should be greater equal to 0"),
    ("rgbimage_conf { scale: inf }", "value inf for Parameter scale should be a finite number"),
    ("sharddata_conf { path: 'x' batchsize: 0 }",
     "value 0 for Parameter batchsize should be greater equal to 1"),
])
def test_singa_layer_and_data_values_are_checked(block: str, expected: str) -> None:
    name = block.split()[0]
    from paramserver.config.components import layers

    layer_type = next(t for t in layers.names() if layers.conf_name(t) == name)
    text = MLP.replace("neuralnet {", f'neuralnet {{\n  layer {{ name: "x" type: {layer_type} '
                                      f"{block} }}", 1)
    message = error(parse_job, text, "job.conf")
    assert message.startswith("job.conf:") and expected in message, message


def test_singa_example_values_are_still_accepted() -> None:
    from paramserver.singa.confs import LRNConf, MnistConf, PoolingConf, StoreConf

    assert LRNConf.parse({"local_size": 3, "alpha": 5e-05, "beta": 0.75, "knorm": 1}).knorm == 1
    assert MnistConf.parse({"norm_a": 127.5, "norm_b": 1}).norm_a == 127.5
    assert PoolingConf.parse({"kernel": 3, "stride": 2, "pool": "AVG"}).stride == 2
    assert StoreConf.parse({"std_value": 255, "mean_value": 127.5}).std_value == 255


def test_delta_that_rounds_to_zero_in_the_data_type_is_refused() -> None:
    job = parse_job(MLP.replace("momentum: 0.9", "delta: 1e-300"))
    assert job.updater.delta == 1e-300  # a float64 run may use it
    params = ParamSet([("w", (3,))])
    message = error(Cluster, job, params)
    assert message == (
        "value 1e-300 for Parameter delta should be greater than 0 in float32, where it rounds "
        "to 0 (the smallest is 1e-45)\ndelta: Small constant that keeps divisions finite "
        "(epsilon).")
    create_updater(job.updater).init_state([0, 3], np.float64)  # representable there


# -- row 17: a wrong type does not hide the other mistakes ---------------------------------------


def test_wrong_type_and_misspelt_field_are_reported_together() -> None:
    with pytest.raises(ParamError) as e:
        conf_from(UpdaterConf, "type: kSGDD\nmomentun: 0.9\n", "updater")
    first = [(str(p.where), p.message.splitlines()[0]) for p in e.value.problems]
    assert len(first) == 2
    assert first[0][0] == "<updater>:1:1"
    assert first[0][1].startswith("Invalid Input: 'kSGDD', valid values are: {'kAdaDelta', ")
    assert first[1] == ("<updater>:2:1", "Cannot find argument 'momentun', Possible Arguments:")
    assert e.value.problems[0].message.endswith("Did you mean 'kSGD'?")
    assert e.value.problems[1].message.endswith("Did you mean 'momentum'?")


def test_wrong_type_leaves_keys_some_component_reads_alone() -> None:
    # rho belongs to kRMSProp and kAdaDelta: with the type unknown it may be right.
    message = error(conf_from, UpdaterConf, "type: kRMSPro rho: 0.5", "updater")
    assert "rho" not in message.split("Did you mean")[0].split("valid values are")[0]
    assert "Cannot find argument" not in message


def test_misspelt_common_field_next_to_the_components_own_keys() -> None:
    # Loose keys of kRMSProp go to its rmsprop_conf; a misspelt common one is named as such.
    with pytest.raises(ParamError) as e:
        conf_from(UpdaterConf, "type: kRMSProp momentun: 0.9 rho: 0.5", "updater")
    (problem,) = e.value.problems
    assert problem.message.startswith("Cannot find argument 'momentun', Possible Arguments:")
    assert "momentum : float" in problem.message and "rho : float" in problem.message
    assert problem.message.endswith("Did you mean 'momentum'?")
    conf = conf_from(UpdaterConf, "type: kRMSProp momentum: 0.9 rho: 0.5", "updater")
    assert conf.own.rho == 0.5 and conf.momentum == 0.9


def test_unknown_keys_of_a_component_are_returned_when_allowed() -> None:
    conf, unknown = UpdaterConf.parse({"type": "kRMSProp", "rho": 0.5, "other": 1},
                                      allow_unknown=True)
    assert unknown == {"other": 1} and conf.own.rho == 0.5


def test_job_conf_reports_every_mistake() -> None:
    text = MLP.replace("type: kSGD", "type: kSGDD").replace("momentum:", "momentun:")
    with pytest.raises(ParamError) as e:
        JobConf._build(parse_text(text, "job.conf"))
    heads = [p.message.splitlines()[0] for p in e.value.problems]
    assert heads[0].startswith("Invalid Input: 'kSGDD'")
    assert heads[1] == "Cannot find argument 'momentun', Possible Arguments:"
