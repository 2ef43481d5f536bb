"""SINGA side by side: its checkpoints read and written by every release's names, its test
phase (the store read on from one test to the next), ``-test`` in a trained workspace, and
its log lines (``--log-format singa``), as SINGA v0.1.0 and v0.2.0 wrote them."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli import main
from paramserver.config.job import parse_job
from paramserver.singa import checkpoints as sc
from paramserver.singa import stores
from paramserver.singa.releases import V010, V020, job_release
from paramserver.train.jobfile import read_job_file

DATA = Path(__file__).parent / "data" / "singa"

#: A small MLP of SINGA v0.2.0's form, on 8x8 digits in kvfile stores.
JOB = """
name: "small"
train_steps: {steps}
test_steps: 3
test_freq: 10
disp_freq: 5
train_one_batch {{ alg: kBP }}
updater {{ type: kSGD learning_rate {{ type: kFixed base_lr: 0.05 }} }}
neuralnet {{
  layer {{ name: "data" type: kRecordInput include: kTrain
    store_conf {{ backend: "kvfile" path: "examples/mnist/train_data.bin" batchsize: 16
                 shape: 64 std_value: 127.5 mean_value: 127.5 }} }}
  layer {{ name: "data" type: kRecordInput include: kTest
    store_conf {{ backend: "kvfile" path: "examples/mnist/test_data.bin" batchsize: 50
                 shape: 64 std_value: 127.5 mean_value: 127.5 }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 16 }}
    param {{ name: "w1" init {{ type: kUniform low: -0.05 high: 0.05 }} }}
    param {{ name: "b1" init {{ type: kUniform low: -0.05 high: 0.05 }} }} }}
  layer {{ name: "tanh1" type: kSTanh srclayers: "fc1" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "tanh1" innerproduct_conf {{ num_output: 10 }}
    param {{ name: "w2" init {{ type: kUniform low: -0.05 high: 0.05 }} }}
    param {{ name: "b2" init {{ type: kUniform low: -0.05 high: 0.05 }} }} }}
  layer {{ name: "loss" type: kSoftmaxLoss softmaxloss_conf {{ topk: 1 }}
    srclayers: "fc2" srclayers: "data" }}
}}
cluster {{ workspace: "{ws}" }}
{extra}
"""

SHAPES = {"w1": (16, 64), "b1": (16,), "w2": (10, 16), "b2": (10,)}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           capsys: pytest.CaptureFixture[str]) -> Path:
    """A working folder holding SINGA's mnist stores, made of the 8x8 digits."""
    monkeypatch.chdir(tmp_path)
    for split in ("train", "test"):
        code, _, err = run(capsys, "data", "digits", f"examples/mnist/{split}_data.bin",
                           "--split", split)
        assert code == 0, err
    return tmp_path


def write_job(path: str, steps: int = 20, ws: str = "examples/mnist", extra: str = "") -> str:
    Path(path).write_text(JOB.format(steps=steps, ws=ws, extra=extra))
    return path


def rows(ws: str | Path) -> list[dict[str, str]]:
    with (Path(ws) / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def stanh_mlp_metrics(values: dict[str, np.ndarray], records: int) -> tuple[float, float]:
    """The small MLP's loss and accuracy over the first ``records`` test records, in numpy
    (float64): SINGA's scaled tanh, softmax cross-entropy, top-1 accuracy."""
    samples = stores.read_records("examples/mnist/test_data.bin", "kvfile")
    x = (samples.x.reshape(len(samples.x), -1)[:records].astype(np.float64) - 127.5) / 127.5
    y = samples.y[:records]
    h = 1.7159047 * np.tanh(2 / 3 * (x @ values["w1"].T.astype(np.float64) + values["b1"]))
    z = h @ values["w2"].T.astype(np.float64) + values["b2"]
    z -= z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-logp[np.arange(records), y].mean()), float((z.argmax(1) == y).mean())


# -- checkpoints ------------------------------------------------------------------------------


def test_names_of_every_release() -> None:
    names = {"w1", "b1", "0#odd"}
    assert sc.param_name("w1", names) == "w1"  # v0.1.0
    assert sc.param_name("0#w1", names) == "w1"  # v0.2.0, v0.3.0: copy 0 of the unrolled net
    assert sc.param_name("1#w1", names) is None  # a sharer's: SINGA writes none
    assert sc.param_name("0#odd", names) == "0#odd"  # the job's own name first
    assert sc.param_name("w9", names) is None
    assert sc.stored_name("w1", V020) == "0#w1" and sc.stored_name("w1", V010) == "w1"


def test_the_release_of_singas_own_files() -> None:
    for name, expected in (("v0.1.0/examples/mnist/job.conf", V010),
                           ("v0.1.0/examples/cifar10/job.conf", V010),
                           ("v0.2.0/examples/mnist/job.conf", V020),
                           ("v0.2.0/examples/cifar10/job.conf", V020),
                           ("v0.3.0/examples/cifar10/cudnn_bm.conf", V020)):
        assert job_release(read_job_file(DATA / name).job) == expected, name
    assert job_release(parse_job('neuralnet { layer { name: "d" type: kData } }')) == V020


def make_values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.5, shape).astype(np.float32) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("prefix", ["0#", ""])  # v0.2.0's and v0.3.0's names; v0.1.0's
def test_test_reproduces_the_loss_of_a_singa_checkpoint(
        folder: Path, capsys: pytest.CaptureFixture[str], prefix: str) -> None:
    values = make_values(7)
    made = sc.write_checkpoint("made/step100-worker0",
                               [(prefix + k, v, 100) for k, v in values.items()])
    job = write_job("job.conf", extra=f'checkpoint_path: "{made}"')
    code, _out, err = run(capsys, "train", "-conf", job, "-test", "--quiet")
    assert code == 0, err
    (test,) = rows("examples/mnist")
    loss, accuracy = stanh_mlp_metrics(values, 150)  # test_steps 3 of 50
    assert test["phase"] == "test" and test["step"] == "0"
    assert float(test["loss"]) == pytest.approx(loss, abs=1e-6)
    assert float(test["accuracy"]) == pytest.approx(accuracy, abs=1e-9)
    random_start = stanh_mlp_metrics(make_values(8), 150)[0]
    assert abs(random_start - loss) > 0.1  # the values loaded are what was tested


def test_a_checkpoint_of_another_net_is_refused_naming_both_lists(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = sc.write_checkpoint("other/step5-worker0", [("0#conv1_w", np.ones(4), 5),
                                                        ("0#conv1_b", np.ones(2), 5)])
    job = write_job("job.conf", extra=f'checkpoint_path: "{other}"')
    for command in (["train", job, "--steps", "2"], ["train", job, "--test"], ["check", job]):
        code, out, err = run(capsys, *command)
        assert code == 2, (command, out, err)
        assert err.count("\n") == 1 and "Traceback" not in err
        assert (f"checkpoint_path: {other}: none of its Params is one of this job's, so "
                "nothing would be loaded: it holds '0#conv1_w', '0#conv1_b'; the job's are "
                "'w1', 'b1', 'w2', 'b2'") in err, err
    assert not Path("examples/mnist/metrics.csv").exists()  # nothing run, nothing written


def test_a_singa_job_writes_its_releases_names_and_resumes_from_them(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job("job.conf", steps=10)
    code, _, err = run(capsys, "train", job, "--quiet")
    assert code == 0, err
    saved = sc.read_checkpoint("examples/mnist/checkpoint/step10-worker0")
    assert [s.name for s in saved] == ["0#w1", "0#b1", "0#w2", "0#b2"]  # as v0.2.0 names them
    # SINGA's -resume in a workspace of SINGA's (its files only): loads those values
    for p in Path("examples/mnist/checkpoints").iterdir():
        p.unlink()
    code, _, err = run(capsys, "train", job, "--steps", "12", "--resume", "--quiet")
    assert code == 0 and "resuming from SINGA's checkpoint of step 10" in err, err
    again = {s.name: s for s in sc.read_checkpoint("examples/mnist/checkpoint/step12-worker0")}
    assert again["0#w1"].version == 12
    # two more steps from the loaded values, not from a random start: close to them
    for s in saved:
        assert np.abs(again[s.name].values - s.values).max() < 0.05


def test_a_v010_job_writes_plain_names(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for split in ("train", "test"):
        code, _, err = run(capsys, "data", "digits", f"examples/mnist/{split}_shard",
                           "--format", "shard", "--split", split)
        assert code == 0, err
    text = JOB.format(steps=4, ws="examples/v01", extra="")
    for split, batch in (("train", 16), ("test", 50)):
        text = text.replace(
            f'type: kRecordInput include: k{split.title()}\n    store_conf {{ backend: "kvfile" '
            f'path: "examples/mnist/{split}_data.bin" batchsize: {batch}\n                 '
            'shape: 64 std_value: 127.5 mean_value: 127.5 }',
            f'type: kShardData include: k{split.title()} sharddata_conf {{ path: '
            f'"examples/mnist/{split}_shard" batchsize: {batch} }}')
    text = text.replace('srclayers: "data" innerproduct_conf', 'srclayers: "mnist" '
                        'innerproduct_conf').replace(
        'srclayers: "fc2" srclayers: "data"', 'srclayers: "fc2" srclayers: "label"').replace(
        '  layer { name: "fc1"', '  layer { name: "mnist" type: kMnist srclayers: "data" '
        'mnist_conf { norm_a: 127.5 norm_b: 1 } }\n  layer { name: "label" type: kLabel '
        'srclayers: "data" }\n  layer { name: "fc1"')
    Path("v01.conf").write_text(text)
    assert job_release(read_job_file("v01.conf").job) == V010
    code, _, err = run(capsys, "train", "v01.conf", "--quiet")
    assert code == 0, err
    saved = sc.read_checkpoint("examples/v01/checkpoint/step4-worker0")
    assert [s.name for s in saved] == ["w1", "b1", "w2", "b2"]  # as v0.1.0 names them
