"""Learning-rate change methods (SPEC §6, §8): rates at given steps, boundaries, configuration.

Every method is checked against its SPEC formula written out here, at chosen steps including
the boundaries where the rate changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver import (
    LRMethod,
    ParamError,
    Parameter,
    create_lr_method,
    create_updater,
    field,
    register_lr_method,
)
from paramserver.config.components import lr_methods
from paramserver.config.job import LRGenConf

DERANDOMIZED = settings(derandomize=True, max_examples=100, deadline=None)
STEPS = [0, 1, 2, 9, 10, 11, 19, 20, 99, 100, 101, 1000, 123457]
BUILTINS = ["kCosine", "kExponential", "kFixed", "kFixedStep", "kInverse", "kInverseT", "kJoin",
            "kLinear", "kStep", "kWarmup"]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-13, abs_tol=1e-300)


# (configuration, SPEC formula) for every SINGA method; base_lr = 0.5
CASES: dict[str, tuple[dict[str, Any], Callable[[int], float]]] = {
    "kFixed": ({"type": "kFixed"}, lambda s: 0.5),
    "kLinear": ({"type": "kLinear", "linear_conf": {"change_freq": 100, "final_lr": 0.1}},
                lambda s: (1 - min(s / 100, 1)) * 0.5 + min(s / 100, 1) * 0.1),
    "kExponential": ({"type": "kExponential", "exponential_conf": {"change_freq": 10}},
                     lambda s: 0.5 * 2 ** (-s / 10)),
    "kInverseT": ({"type": "kInverseT", "inverset_conf": {"final_lr": 20}},
                  lambda s: 0.5 / (1 + s / 20)),
    "kInverse": ({"type": "kInverse", "inverse_conf": {"gamma": 0.0001, "pow": 0.75}},
                 lambda s: 0.5 * (1 + 0.0001 * s) ** -0.75),
    "kStep": ({"type": "kStep", "step_conf": {"change_freq": 10, "gamma": 0.1}},
              lambda s: 0.5 * 0.1 ** (s // 10)),
    "kFixedStep": ({"type": "kFixedStep",
                    "fixedstep_conf": {"step": [10, 20, 100], "step_lr": [0.3, 0.2, 0.1]}},
                   lambda s: 0.3 if s < 20 else 0.2 if s < 100 else 0.1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rates_follow_the_spec_formulas(name: str) -> None:
    conf, formula = CASES[name]
    method = create_lr_method({**conf, "base_lr": 0.5})
    for step in STEPS:
        lr = method(step)
        assert isinstance(lr, float)
        assert close(lr, formula(step)), (name, step, lr, formula(step))


def test_every_method_is_registered() -> None:
    assert sorted(lr_methods.names()) == BUILTINS


def test_base_lr_defaults_to_0_01() -> None:
    assert LRGenConf().base_lr == 0.01
    assert create_lr_method({})(1000) == 0.01
    assert create_lr_method({"type": "kFixed"}).base_lr == 0.01


def test_step_changes_exactly_at_multiples_of_change_freq() -> None:
    lr = create_lr_method({"type": "kStep", "base_lr": 1.0, "change_freq": 10, "gamma": 0.5})
    assert [lr(s) for s in (0, 9, 10, 19, 20, 29, 30)] == [1, 1, 0.5, 0.5, 0.25, 0.25, 0.125]
    assert create_lr_method({"type": "kStep", "base_lr": 1.0, "change_freq": 1,
                             "gamma": 0.5})(3) == 0.125


def test_fixed_step_boundaries() -> None:
    lr = create_lr_method({"type": "kFixedStep", "step": [5, 10, 20],
                           "step_lr": [0.1, 0.01, 0.001]})
    expected = {0: 0.1, 4: 0.1, 5: 0.1, 9: 0.1, 10: 0.01, 19: 0.01, 20: 0.001, 10**9: 0.001}
    assert {s: lr(s) for s in expected} == expected
    # step_lr[0] before step[0], whatever base_lr says
    lr = create_lr_method({"type": "kFixedStep", "base_lr": 7, "step": [3], "step_lr": [0.2]})
    assert [lr(0), lr(2), lr(3), lr(50)] == [0.2, 0.2, 0.2, 0.2]


@DERANDOMIZED
@given(steps=st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True),
       rates=st.lists(st.floats(0, 10), min_size=8, max_size=8),
       queries=st.lists(st.integers(0, 12_000), min_size=1, max_size=20))
def test_fixed_step_is_a_pure_function_of_the_step(steps: list[int], rates: list[float],
                                                   queries: list[int]) -> None:
    steps = sorted(steps)
    rates = rates[: len(steps)]
    conf = {"type": "kFixedStep", "step": steps, "step_lr": rates}
    walked = create_lr_method(conf)
    for q in queries:  # in any order: no hidden state between calls
        k = max([i for i, s in enumerate(steps) if s <= q], default=0)
        assert walked(q) == rates[k]
        assert create_lr_method(conf)(q) == rates[k]  # a restarted server agrees


def test_linear_is_clamped_at_final_lr() -> None:
    lr = create_lr_method({"type": "kLinear", "base_lr": 0.1, "change_freq": 10,
                           "final_lr": 0.001})
    assert close(lr(5), 0.0505)
    assert [lr(10), lr(11), lr(10**6)] == [0.001, 0.001, 0.001]  # never negative (SPEC §6)
    up = create_lr_method({"type": "kLinear", "base_lr": 0.0, "change_freq": 4, "final_lr": 1})
    assert [up(s) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("method", ["kLinear", "kExponential", "kStep"])
def test_freq_is_an_alias_of_change_freq(method: str) -> None:
    extra = {"kLinear": {"final_lr": 0.0}, "kStep": {"gamma": 0.5}}.get(method, {})
    conf = {"type": method, "base_lr": 1.0, **extra}
    a = create_lr_method({**conf, "change_freq": 7})
    b = create_lr_method({**conf, "freq": 7})
    assert a.own == b.own and [a(s) for s in STEPS] == [b(s) for s in STEPS]
    own = " ".join(f"{k}: {v}" for k, v in {"freq": 7, **extra}.items())
    text = create_lr_method(f"type: {method} base_lr: 1 {lr_methods.conf_name(method)} {{ {own} }}")
    assert text.own == a.own


def test_cosine_decay() -> None:
    lr = create_lr_method("type: kCosine base_lr: 0.1 cosine_conf { decay_steps: 100 "
                          "final_lr: 0.001 }")
    for s in (0, 1, 25, 50, 99, 100, 101, 5000):
        t = min(s, 100) / 100
        assert close(lr(s), 0.001 + (0.1 - 0.001) * 0.5 * (1 + math.cos(math.pi * t)))
    assert lr(0) == 0.1 and lr(100) == lr(10**6) == 0.001
    assert create_lr_method({"type": "cosine_decay", "decay_steps": 4}).own.final_lr == 0.0


def test_warmup_to_base_lr() -> None:
    lr = create_lr_method({"type": "kWarmup", "base_lr": 0.1, "warmup_steps": 10,
                           "start_lr": 0.01})
    for s in range(10):
        assert close(lr(s), 0.01 + (0.1 - 0.01) * s / 10)
    assert [lr(10), lr(11), lr(1000)] == [0.1, 0.1, 0.1]


def test_warmup_then_another_method_counted_from_the_end_of_the_warmup() -> None:
    text = """
        type: kWarmup base_lr: 0.1
        warmup_conf {
          warmup_steps: 5
          then { type: kStep base_lr: 0.2 step_conf { change_freq: 10 gamma: 0.5 } }
        }"""
    lr = create_lr_method(text)
    assert [lr(s) for s in range(6)] == pytest.approx([0.0, 0.04, 0.08, 0.12, 0.16, 0.2])
    assert [lr(14), lr(15), lr(25)] == [0.2, 0.1, 0.05]
    same = create_lr_method({"type": "linear_warmup", "warmup_steps": 5,
                             "then": {"type": "kStep", "base_lr": 0.2, "change_freq": 10,
                                      "gamma": 0.5}})
    assert [same(s) for s in STEPS] == [lr(s) for s in STEPS]


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize("x", [
    LRGenConf(type="kInverse", base_lr=0.01, inverse_conf={"gamma": 0.0001, "pow": 0.75}),
    {"type": "kInverse", "base_lr": 0.01, "inverse_conf": {"gamma": 0.0001, "pow": 0.75}},
    {"type": "inverse", "base_lr": "0.01", "gamma": 0.0001, "pow": 0.75},
    "type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 }",
    "learning_rate { type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 } }",
])
def test_create_lr_method_from_conf_dict_or_text(x: Any) -> None:
    lr = create_lr_method(x)
    assert type(lr).__name__ == "Inverse" and lr.base_lr == 0.01
    assert (lr.own.gamma, lr.own.pow) == (0.0001, 0.75)
    assert close(lr(1000), 0.01 * 1.1 ** -0.75)


def message(x: Any) -> str:
    with pytest.raises(ParamError) as e:
        create_lr_method(x)
    return str(e.value)


def test_bounds_give_the_spec_messages() -> None:
    assert message({"base_lr": -0.1}) == ("value -0.1 for Parameter base_lr should be greater "
                                          "equal to 0\nbase_lr: Base learning rate.")
    assert message({"type": "kStep", "change_freq": 0}) == (
        "value 0 for Parameter change_freq should be greater equal to 1\n"
        "change_freq: Steps between changes.")
    assert message({"type": "kStep", "step_conf": {"change_freq": 2, "gamma": 0}}) == (
        "step_conf: value 0 for Parameter gamma exceed bound (0,1]\n"
        "gamma: Factor applied at every change (at most 1).")
    assert message({"type": "kInverse", "gamma": -1}).startswith(
        "value -1 for Parameter gamma should be greater than 0")
    assert message({"type": "kExponential", "freq": 0}).startswith(
        "value 0 for Parameter change_freq should be greater equal to 1")
    assert message({"type": "kLinear", "change_freq": 0, "final_lr": 0}).startswith(
        "value 0 for Parameter change_freq should be greater equal to 1")
    assert message({"type": "kInverseT", "final_lr": 0}).startswith(
        "value 0 for Parameter final_lr should be greater than 0")
    assert message({"type": "kStep", "step_conf": {"gamma": 0.5}}) == (
        "step_conf: Required parameter change_freq of int is not presented")


def test_step_gamma_above_1_is_refused_not_an_overflow() -> None:
    # A factor > 1 grows without bound: gamma ** (step // change_freq) raised OverflowError
    # at a large step. Refused when configured, as MXNet's FactorScheduler refuses it.
    assert message({"type": "kStep", "change_freq": 1, "gamma": 2}) == (
        "value 2 for Parameter gamma exceed bound (0,1]\n"
        "gamma: Factor applied at every change (at most 1).")
    lr = create_lr_method({"type": "kStep", "change_freq": 1, "gamma": 0.5})
    assert lr(10**6) == 0.0 and lr(2**62) == 0.0  # underflows quietly to 0, no error


@pytest.mark.parametrize("conf", [
    {"base_lr": "inf"}, {"base_lr": float("inf")},
    {"type": "kLinear", "change_freq": 5, "final_lr": "inf"},
    {"type": "kInverse", "pow": "inf"}, {"type": "kInverse", "gamma": "inf"},
    {"type": "kInverseT", "final_lr": "inf"},
    {"type": "kFixedStep", "step": [0], "step_lr": ["inf"]},
    {"type": "kCosine", "decay_steps": 5, "final_lr": "inf"},
    {"type": "kWarmup", "warmup_steps": 5, "start_lr": "inf"},
])
def test_rates_must_be_finite(conf: dict[str, Any]) -> None:
    assert "should be a finite number" in message(conf)


def test_fixed_step_lists_must_be_as_long_and_increasing() -> None:
    assert message({"type": "kFixedStep", "step": [0, 10], "step_lr": [0.1]}) == (
        "fixedstep_conf has 2 step values but 1 step_lr values; they must be as many")
    assert message({"type": "kFixedStep", "step": [0, 10, 10, 5],
                    "step_lr": [1, 2, 3, 4]}) == (
        "fixedstep_conf step values must be increasing: 10 then 10, 10 then 5")
    assert message({"type": "kFixedStep"}) == (
        "fixedstep_conf: fixedstep_conf needs at least one step and step_lr")
    assert message({"type": "kFixedStep", "step": [-1], "step_lr": [0.1]}).startswith(
        "value -1 for Parameter step should be greater equal to 0")
    assert message({"type": "kFixedStep", "step": [1], "step_lr": [-0.1]}).startswith(
        "value -0.1 for Parameter step_lr should be greater equal to 0")
    text = ("type: kFixedStep\n"
            "fixedstep_conf { step: 0 step_lr: 0.1 step: 5 step_lr: 0.01 step: 3 }")
    assert message(text) == (
        "<learning_rate>:2:16: fixedstep_conf has 3 step values but 2 step_lr values; they "
        "must be as many\n"
        "<learning_rate>:2:16: fixedstep_conf step values must be increasing: 5 then 3")


def test_other_configuration_errors() -> None:
    assert message("type: kStepp").startswith(
        "<learning_rate>:1:1: Invalid Input: 'kStepp', valid values are: {'kCosine', ")
    assert message("type: kStepp").endswith("Did you mean 'kStep'?")
    assert message({"type": "kFixed", "step_conf": {"change_freq": 3}}) == (
        "step_conf is given but the learning-rate method is 'kFixed', which has no *_conf")
    assert message({"type": "kLinear", "step_conf": {"change_freq": 3}, "change_freq": 2,
                    "final_lr": 0}) == (
        "step_conf is given but the learning-rate method is 'kLinear', which reads linear_conf")
    assert message({"type": "kStep", "step_conf": {"change_freq": 3}, "gamma": 0.5}) == (
        "give step_conf either as a block or as keys, not both: ['gamma']")
    assert message(None) == ("expected a configuration (LRGenConf), a dict or the text of "
                             "the learning_rate block, not NoneType")


def test_learning_rate_inside_an_updater() -> None:
    u = create_updater("updater { type: kSGD learning_rate { type: kStep base_lr: 0.1 "
                       "step_conf { change_freq: 10 gamma: 0.5 } } }")
    assert [u.lr(9), u.lr(10)] == [0.1, 0.05]
    with pytest.raises(ParamError) as e:
        create_updater({"learning_rate": {"type": "kStep", "change_freq": 0}})
    assert str(e.value).startswith("learning_rate: value 0 for Parameter "
                                   "change_freq should be greater equal to 1")


# -- users' own methods (SPEC §8) -----------------------------------------------------------


class HalfLifeConfig(Parameter):
    half_life: float = field(lower=0.0, lower_exclusive=True, doc="Steps to halve the rate.")
    floor: float = field(0.0, lower=0.0, doc="Smallest rate.")


class HalfLife(LRMethod):
    Config = HalfLifeConfig

    def __call__(self, step: int) -> float:
        return max(self.base_lr * 0.5 ** (step / self.own.half_life), self.own.floor)


@pytest.fixture
def half_life() -> Iterator[type[HalfLife]]:
    register_lr_method("HalfLife")(HalfLife)
    try:
        yield HalfLife
    finally:
        lr_methods.remove("HalfLife")


@pytest.mark.parametrize("x", [
    'user_type: "HalfLife" base_lr: 0.8 [halflife_conf] { half_life: 5 floor: 0.1 }',
    'learning_rate { user_type: "HalfLife" base_lr: 0.8 [halflife_conf] { half_life: 5 '
    "floor: 0.1 } }",
    {"user_type": "HalfLife", "base_lr": 0.8, "halflife_conf": {"half_life": 5, "floor": 0.1}},
    {"user_type": "half_life", "base_lr": 0.8, "half_life": 5, "floor": 0.1},
])
def test_user_lr_method(half_life: type, x: Any) -> None:
    lr = create_lr_method(x)
    assert isinstance(lr, half_life)
    assert lr.own == HalfLifeConfig(half_life=5, floor=0.1)
    assert [lr(0), lr(5), lr(10), lr(15), lr(1000)] == [0.8, 0.4, 0.2, 0.1, 0.1]


def test_user_lr_method_in_an_updater(half_life: type) -> None:
    u = create_updater('type: kSGD learning_rate { user_type: "HalfLife" base_lr: 0.8 '
                       "[halflife_conf] { half_life: 5 } }")
    assert u.lr(10) == 0.2


def test_user_lr_method_errors(half_life: type) -> None:
    assert message({"user_type": "HalfLife"}) == (
        "halflife_conf: Required parameter half_life of float is not presented")
    assert message('user_type: "HalfLife" [halflife_conf] { half_life: 0 }') == (
        "<learning_rate>:1:41: value 0 for Parameter half_life should be greater than 0\n"
        "half_life: Steps to halve the rate.")
    names = "{" + ", ".join(repr(n) for n in sorted([*BUILTINS, "HalfLife"])) + "}"
    assert message('user_type: "HalfLive"') == (
        f"<learning_rate>:1:1: Invalid Input: 'HalfLive', valid values are: {names}\n"
        "Did you mean 'HalfLife'?")
    with pytest.raises(ParamError, match="learning-rate method name 'half_life' is already "
                                         "registered"):
        register_lr_method("half_life")(HalfLife)
    with pytest.raises(ParamError, match="learning-rate method name 'kStep' is already "
                                         "registered"):
        register_lr_method("kStep")(HalfLife)


def test_warmup_then_inherits_base_lr_unless_it_sets_its_own() -> None:
    """``then`` without base_lr peaks at the warm-up's base_lr (not the default 0.01)."""
    lr = create_lr_method("""
        type: kWarmup base_lr: 0.1
        warmup_conf { warmup_steps: 100 then { type: kCosine cosine_conf { decay_steps: 1000 } } }
    """)
    assert lr(100) == pytest.approx(0.1)
    assert lr(50) == pytest.approx(0.05)
    assert lr(600) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    own = create_lr_method({"type": "kWarmup", "base_lr": 0.1, "warmup_steps": 10,
                            "then": {"type": "kFixed", "base_lr": 0.3}})
    assert own(10) == pytest.approx(0.3)


# -- kJoin: schedules one after another (optax's join_schedules) ------------------------------


def test_join_runs_each_schedule_from_its_boundary_inheriting_base_lr() -> None:
    text = """learning_rate {
      type: kJoin base_lr: 0.1
      join_conf {
        schedule { type: kWarmup warmup_conf { warmup_steps: 10 } }
        schedule { type: kCosine cosine_conf { decay_steps: 40 final_lr: 0.01 } }
        schedule { type: kFixed base_lr: 0.001 }
        boundaries: [10, 50]
      }
    }"""
    lr = create_lr_method(text)
    cosine = create_lr_method({"type": "kCosine", "base_lr": 0.1, "decay_steps": 40,
                               "final_lr": 0.01})
    for step in range(0, 10):
        assert lr(step) == pytest.approx(0.1 * step / 10, abs=1e-15)
    for step in range(10, 50):
        assert lr(step) == cosine(step - 10)   # counted from its boundary
    assert lr(50) == lr(10_000) == 0.001       # its own base_lr
    assert lr(10) == 0.1                       # the join's base_lr, inherited


def test_join_from_python_equals_the_job_file_form() -> None:
    from paramserver.schedules import join_schedules

    parts = [{"type": "linear_warmup", "warmup_steps": 5},
             {"type": "kStep", "change_freq": 3, "gamma": 0.5}]
    lr = join_schedules(parts, [5], base_lr=0.2)
    same = create_lr_method({"type": "kJoin", "base_lr": 0.2,
                             "join_conf": {"schedule": parts, "boundaries": [5]}})
    assert [lr(s) for s in range(20)] == [same(s) for s in range(20)]
    assert lr(5) == 0.2 and lr(8) == 0.1
    # its conf goes into an updater as it is
    updater = create_updater({"type": "kSGD", "learning_rate": lr.conf})
    assert updater.lr(8) == 0.1


@pytest.mark.parametrize(("conf", "message"), [
    ({"schedule": [], "boundaries": []}, "join_conf needs at least one schedule"),
    ({"schedule": [{"type": "kFixed"}] * 2, "boundaries": []},
     "join_conf has 2 schedules and 0 boundaries; there must be one boundary fewer than "
     "schedules (where each next one starts)"),
    ({"schedule": [{"type": "kFixed"}] * 3, "boundaries": [5, 5]},
     "join_conf boundaries must be increasing: 5 then 5"),
])
def test_join_configuration_errors(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError) as e:
        create_lr_method({"type": "kJoin", "join_conf": conf})
    assert message in str(e.value)


def test_join_equals_torchs_sequential_lr() -> None:
    """A reference from outside: torch's SequentialLR of LinearLR, CosineAnnealingLR and
    StepLR (each restarted at its milestone, all from the optimizer's one base rate) gives
    the rates of kWarmup, kCosine and kStep joined at the same boundaries."""
    torch = pytest.importorskip("torch")
    sched = torch.optim.lr_scheduler
    base = 0.1
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    ref = sched.SequentialLR(opt, [
        sched.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=10),
        sched.CosineAnnealingLR(opt, T_max=30, eta_min=0.005),
        sched.StepLR(opt, step_size=7, gamma=0.3)], milestones=[10, 40])
    ours = create_lr_method(f"""learning_rate {{
      type: kJoin base_lr: {base}
      join_conf {{
        schedule {{ type: kWarmup warmup_conf {{ warmup_steps: 10 start_lr: 0.01 }} }}
        schedule {{ type: kCosine cosine_conf {{ decay_steps: 30 final_lr: 0.005 }} }}
        schedule {{ type: kStep step_conf {{ change_freq: 7 gamma: 0.3 }} }}
        boundaries: [10, 40]
      }}
    }}""")
    for step in range(70):
        assert ours(step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-15), step
        opt.step()
        ref.step()


def join_schedules_conf() -> dict[str, Any]:
    from paramserver.schedules import join_schedules

    return join_schedules([{"type": "kWarmup", "warmup_steps": 4},
                           {"type": "kFixed"}, {"type": "kFixed", "base_lr": 0.05}],
                          [4, 8], base_lr=0.1).conf.to_dict()


@pytest.mark.parametrize("nservers", [1, 4])
def test_join_on_the_cluster_is_the_same_schedule_on_1_and_4_servers(nservers: int) -> None:
    """Each server computes the joined rate from the step alone: 1 and 4 servers give the
    values that the updater applied by hand gives."""
    import numpy as np

    from paramserver import ParamSet
    from paramserver.cluster import Cluster
    from paramserver.config.job import ClusterConf

    updater = {"type": "kSGD", "momentum": 0.9, "learning_rate": join_schedules_conf()}
    shapes = [(6, 5), (5,), (40,), (3, 3), (17,)]

    def params() -> ParamSet:
        ps = ParamSet([(f"p{i}", s) for i, s in enumerate(shapes)])
        ps.values[:] = np.random.default_rng(0).standard_normal(ps.values.size)
        return ps

    def grad(step: int, n: int) -> np.ndarray:
        return np.random.default_rng(step).standard_normal(n).astype(np.float32)

    def fill(worker: Any, step: int) -> None:
        worker.params.grads[:] = grad(step, worker.params.grads.size)

    steps = 12
    ps = params()
    Cluster(ClusterConf(nservers_per_group=nservers, timeout=10.0), ps, updater).run(fill, steps)
    ref = params()
    up = create_updater(updater)
    state = up.init_state(ref.offsets, ref.dtype)
    for step in range(steps):
        up.apply(step, ref.values, grad(step, ref.values.size), state, 1.0, 1.0, 1.0)
    assert [up.lr(s) for s in (0, 3, 4, 8, 11)] == pytest.approx([0, 0.075, 0.1, 0.05, 0.05])
    np.testing.assert_array_equal(ps.values, ref.values)
