"""The main job: training, exact resumption (crashes: test_crash.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from paramserver.checkpoint import (
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from paramserver.config.job import parse_job
from paramserver.train.trainer import Trainer
from resume_rows import assert_rows_of_a_resume

ROOT = Path(__file__).resolve().parents[1]

JOB = """
name: "tiny"
train_steps: {steps}
disp_freq: 7
test_freq: 10
test_steps: 2
checkpoint_freq: {ckpt}
workspace: "{ws}"
seed: 5
updater {{
  type: kSGD momentum: 0.9 weight_decay: 0.001
  learning_rate {{ type: kStep base_lr: 0.05 step_conf {{ change_freq: 15 gamma: 0.5 }} }}
}}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "digits" batchsize: 16 }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data"
          innerproduct_conf {{ num_output: 16 }} }}
  layer {{ name: "drop" type: kDropout srclayers: "fc1" dropout_conf {{ dropout_ratio: 0.2 }} }}
  layer {{ name: "act" type: kTanh srclayers: "drop" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act"
          innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: 2 nservers_per_group: 2 timeout: 30 }}
"""


def job(ws: Path, steps: int, ckpt: int = 20):  # type: ignore[no-untyped-def]
    return parse_job(JOB.format(steps=steps, ckpt=ckpt, ws=ws))


def test_resume_is_exact(tmp_path: Path) -> None:
    straight = Trainer(job(tmp_path / "a", 40), progress=False)
    straight.train()

    first = Trainer(job(tmp_path / "b", 20), progress=False)
    first.train()
    second = Trainer(job(tmp_path / "b", 40), progress=False)
    second.train(resume=True)

    assert np.array_equal(straight.params.values, second.params.values)
    assert_rows_of_a_resume(tmp_path / "a", tmp_path / "b", 20)
    arrays_a, _ = load_checkpoint(tmp_path / "a" / "checkpoints" / checkpoint_name(40))
    arrays_b, _ = load_checkpoint(tmp_path / "b" / "checkpoints" / checkpoint_name(40))
    assert arrays_a.keys() == arrays_b.keys()
    for key in arrays_a:
        assert np.array_equal(arrays_a[key], arrays_b[key]), key


def test_workspace_files(tmp_path: Path) -> None:
    result = Trainer(job(tmp_path, 20, ckpt=10), progress=False).train()
    assert result.step == 20 and result.test_accuracy is not None
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == "step,phase,loss,accuracy,lr"
    assert [line.split(",")[:2] for line in lines[1:]] == [
        ["7", "train"], ["10", "test"], ["14", "train"], ["20", "train"], ["20", "test"]]
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [10, 20]


def test_resume_refuses_a_checkpoint_of_another_net(tmp_path: Path) -> None:
    Trainer(job(tmp_path, 10, ckpt=10), progress=False).train()
    other = parse_job(JOB.format(steps=20, ckpt=10, ws=tmp_path).replace(
        "num_output: 16", "num_output: 8"))
    with pytest.raises(Exception, match="do not match"):
        Trainer(other, progress=False).train(resume=True)


def test_digits_mlp_example_reaches_95_percent(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "digits_mlp.conf").read_text()
    conf = parse_job(text, "digits_mlp.conf")
    conf.update({"workspace": str(tmp_path)})
    result = Trainer(conf, progress=False).train()
    assert result.test_accuracy is not None and result.test_accuracy >= 0.95


@pytest.mark.parametrize("name", ["digits_async.conf", "digits_shared.conf"])
def test_other_examples_train(tmp_path: Path, name: str) -> None:
    conf = parse_job((ROOT / "examples" / name).read_text(), name)
    conf.update({"workspace": str(tmp_path), "train_steps": 300, "test_freq": 300,
                 "checkpoint_freq": 0})
    result = Trainer(conf, progress=False).train()
    assert result.test_accuracy is not None and result.test_accuracy > 0.8
    assert textwrap.dedent("step,phase") in (tmp_path / "metrics.csv").read_text()


def test_a_checkpoint_of_the_first_release_still_resumes(tmp_path: Path) -> None:
    straight = Trainer(job(tmp_path / "a", 40), progress=False, tensorboard=False)
    straight.train()
    Trainer(job(tmp_path / "b", 20), progress=False, tensorboard=False).train()
    folder = tmp_path / "b" / "checkpoints"
    for step, path in list_checkpoints(folder):  # rewrite them as the first release did
        assert path.name.endswith(".ckpt.safetensors")
        arrays, meta = load_checkpoint(path)
        first = {k: meta[k] for k in ("format", "job", "step", "params", "dtype", "window")}
        save_checkpoint(folder / f"step-{step:08d}.ckpt.npz", arrays, first)
        path.unlink()
    second = Trainer(job(tmp_path / "b", 40), progress=False, tensorboard=False)
    second.train(resume=True)
    assert np.array_equal(straight.params.values, second.params.values)
    assert_rows_of_a_resume(tmp_path / "a", tmp_path / "b", 20)
