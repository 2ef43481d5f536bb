"""Job files as SINGA writes them, read into our declarations (SPEC §2), and their errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramserver import ParamError, load_job, parse_job
from paramserver.config.job import JobConf, LRGenConf, UpdaterConf
from paramserver.init import create_param_generator
from paramserver.schedules import create_lr_method
from paramserver.updaters import create_updater

ROOT = Path(__file__).resolve().parents[1]

SINGA = """\
# A job as SINGA's documents write it.
name: "singa-style"
train_steps: 1000
test_freq: 100
train_one_batch { alg: kBP }
updater {
  type: kSGD
  momentum: 0.9
  weight_decay: 0.0005
  learning_rate: {
    type: kFixedStep
    fixedstep_conf {
      step: 0
      step: 60000
      step: 65000
      step_lr: 0.001
      step_lr: 0.0001
      step_lr: 0.00001
    }
  }
}
neuralnet {
  layer {
    name: "data"
    type: kData
    data_conf < source: 'digits' batchsize: 64; >
  }
  layer {
    name: "fc1"
    type: kInnerProduct
    srclayers: "data"
    innerproduct_conf { num_output: 100 }
    param { name: "w1" init { type: kUniformFanInOut } }
    param { name: "b1" lr_scale: 2.0 wd_scale: 0, init { type: kConst value: 0 } }
  }
  layer { name: "loss" type: kSoftmaxLoss srclayers: ["fc1", "data"] }
}
cluster { nworker_groups: 1 nserver_groups: 1 workspace: "examples/singa" }
"""


def test_a_singa_job_reads_as_written() -> None:
    job = parse_job(SINGA, "singa.conf")
    assert job.name == "singa-style" and job.train_steps == 1000
    u = job.updater
    assert (u.component, u.momentum, u.weight_decay) == ("kSGD", 0.9, 0.0005)
    lr = u.learning_rate
    assert lr.component == "kFixedStep"
    assert lr.own.step == [0, 60000, 65000]
    assert lr.own.step_lr == [0.001, 0.0001, 0.00001]
    fc1 = job.neuralnet.layer[1]
    assert fc1.own.num_output == 100
    w1, b1 = fc1.param
    assert w1.init.component == "kUniformSqrtFanInOut"     # the documents' spelling
    assert b1.init.component == "kConstant" and b1.init.value == 0
    assert (b1.lr_scale, b1.wd_scale) == (2.0, 0.0)
    assert job.neuralnet.layer[2].srclayers == ["fc1", "data"]   # list syntax
    assert job.neuralnet.layer[0].own.batchsize == 64            # < > block, ';' and quotes
    assert job.workspace_dir == "examples/singa"


def test_round_trip_through_dict_and_json() -> None:
    job = parse_job(SINGA)
    again = JobConf.from_json(job.to_json())
    assert again == job
    assert JobConf.from_dict(job.to_dict()) == job


def test_every_example_loads() -> None:
    for path in sorted((ROOT / "examples").glob("*.conf")):
        assert load_job(path).train_steps > 0


def test_many_mistakes_are_reported_in_one_run() -> None:
    text = SINGA.replace("momentum: 0.9", "momentun: 0.9").replace(
        "num_output: 100", "num_output: many").replace("kSoftmaxLoss", "kSoftmaxLos")
    with pytest.raises(ParamError) as e:
        parse_job(text, "bad.conf")
    places = [str(p.where) for p in e.value.problems]
    messages = [p.message.splitlines()[0] for p in e.value.problems]
    assert "bad.conf:8:3" in places and messages[places.index("bad.conf:8:3")] == (
        "Cannot find argument 'momentun', Possible Arguments:")
    assert "Did you mean 'momentum'?" in str(e.value)
    assert "bad.conf:32:25" in places and messages[places.index("bad.conf:32:25")] == (
        "Invalid Parameter format for num_output expect int but value='many'")
    assert "bad.conf:36:24" in places
    assert messages[places.index("bad.conf:36:24")].startswith("Invalid Input: 'kSoftmaxLos'")


@pytest.mark.parametrize(("text", "where", "message"), [
    ("train_steps: -5\nneuralnet { }", "f.conf:1:1",
     "value -5 for Parameter train_steps should be greater equal to 0"),
    ("train_steps: 1\nneuralnet { }\nupdater { delta: 0 }", "f.conf:3:11",
     "value 0 for Parameter delta should be greater than 0"),
    ("neuralnet { }\ntrain_steps: t", "f.conf:2:1",
     "Invalid Parameter format for train_steps expect int but value='t'"),
    ("train_steps: 1\nneuralnet { }\nupdater { type: kSGD rmsprop_conf { rho: 0.5 } }",
     "f.conf:3:22", "rmsprop_conf is given but the updater is 'kSGD', which reads sgd_conf"),
    ("train_steps: 1\nneuralnet { }\nupdater { learning_rate { type: kStep "
     "linear_conf { freq: 2 final_lr: 0 } step_conf { freq: 2 } } }", "f.conf:3:39",
     "linear_conf is given but the learning-rate method is 'kStep', which reads step_conf"),
    ("train_steps: 1\nneuralnet { }\nupdater { learning_rate { type: kFixedStep "
     "fixedstep_conf { step: 0 step: 5 step_lr: 1 } } }", "f.conf:3:",
     "fixedstep_conf has 2 step values but 1 step_lr values; they must be as many"),
    ("train_steps: 1\nneuralnet { }\ncluster { backend: slurm }", "f.conf:3:11",
     "Invalid Input: 'slurm', valid values are: {'local', 'ray'}"),
    ("train_steps: 1.5\nneuralnet { }", "f.conf:1:1",
     "Invalid Parameter format for train_steps expect int but value='1.5'"),
])
def test_each_error_names_its_place(text: str, where: str, message: str) -> None:
    """A bad value is placed at its key (line:column of the key), as every message is."""
    with pytest.raises(ParamError) as e:
        parse_job(text, "f.conf")
    found = [(str(p.where), p.message.splitlines()[0]) for p in e.value.problems]
    assert any(w.startswith(where) and m == message for w, m in found), found


def test_user_extension_blocks_resolve_to_the_registered_class() -> None:
    from paramserver import Parameter, field
    from paramserver.config.components import lr_methods
    from paramserver.schedules import LRMethod, register_lr_method

    @register_lr_method("HalfLife")
    class HalfLife(LRMethod):
        class Config(Parameter):
            steps: int = field(10, lower=1)

        def __call__(self, step: int) -> float:
            return float(self.base_lr * 0.5 ** (step / self.own.steps))

    try:
        text = ("train_steps: 1\nneuralnet { }\nupdater { learning_rate { "
                "user_type: \"HalfLife\" base_lr: 0.8 [halflife_conf] { steps: 4 } } }")
        job = parse_job(text)
        assert create_lr_method(job.updater.learning_rate)(8) == pytest.approx(0.2)
        with pytest.raises(ParamError, match=r"f.conf:3:80: value 0 for Parameter steps"):
            parse_job(text.replace("steps: 4", "steps: 0"), "f.conf")
        with pytest.raises(ParamError, match=r"extension block \[other_conf\] does not belong"):
            parse_job(text.replace("halflife_conf", "other_conf"))
    finally:
        lr_methods.remove("HalfLife")


@pytest.mark.parametrize("factory,conf_type,text", [
    (create_updater, UpdaterConf, "type: kAdaDelta adadelta_conf { rho: 0.9 }"),
    (create_updater, UpdaterConf, "updater { type: kAdaDelta adadelta_conf { rho: 0.9 } }"),
    (create_lr_method, LRGenConf, "learning_rate { type: kStep step_conf { freq: 3 } }"),
    (create_param_generator, None, "init { type: kGaussian std: 0.5 }"),
])
def test_factories_take_text_dicts_and_confs(factory, conf_type, text) -> None:  # type: ignore[no-untyped-def]
    made = factory(text)
    again = factory(made.conf)
    assert type(again) is type(made) and again.conf == made.conf
    assert type(factory(made.conf.to_dict())) is type(made)


_VALID = (ROOT / "examples" / "digits_mlp.conf").read_text()
_EDIT = st.tuples(st.integers(0, len(_VALID)), st.integers(0, 6),
                  st.text(alphabet=st.sampled_from(list("{}<>[]:;,\"'#-.e0123456789 \nkx_")),
                          max_size=4))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EDIT, min_size=1, max_size=4))
def test_mutated_job_files_raise_nothing_but_param_error(edits) -> None:  # type: ignore[no-untyped-def]
    text = _VALID
    for pos, cut, insert in edits:
        pos = min(pos, len(text))
        text = text[:pos] + insert + text[pos + cut:]
    try:
        job = parse_job(text, "mutated.conf")
    except ParamError as e:
        for p in e.problems:
            assert p.where is None or re.match(r"mutated\.conf:\d+:\d+", str(p.where)), p
        return
    assert isinstance(job, JobConf)
