"""SINGA side by side: its checkpoints read and written by every release's names, its test
phase (the store read on from one test to the next), ``-test`` in a trained workspace, and
its log lines (``--log-format singa``), as SINGA v0.1.0 and v0.2.0 wrote them."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli import main
from paramserver.config.job import parse_job
from paramserver.singa import checkpoints as sc
from paramserver.singa import logs, stores
from paramserver.singa.releases import V010, V020, job_release
from paramserver.train.jobfile import read_job_file
from paramserver.train.trainer import due, events_before, singa_due

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


def stanh_mlp_metrics(values: dict[str, np.ndarray], records: int | np.ndarray
                      ) -> tuple[float, float]:
    """The small MLP's loss and accuracy over test records (the first ``records``, or those
    indexes), in numpy (float64): SINGA's scaled tanh, softmax cross-entropy, top-1
    accuracy."""
    samples = stores.read_records("examples/mnist/test_data.bin", "kvfile")
    idx = np.arange(records) if isinstance(records, int) else records
    x = (samples.x.reshape(len(samples.x), -1)[idx].astype(np.float64) - 127.5) / 127.5
    y = samples.y[idx]
    h = 1.7159047 * np.tanh(2 / 3 * (x @ values["w1"].T.astype(np.float64) + values["b1"]))
    z = h @ values["w2"].T.astype(np.float64) + values["b2"]
    z -= z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-logp[np.arange(len(idx)), y].mean()), float((z.argmax(1) == y).mean())


def values_of(checkpoint: str | Path) -> dict[str, np.ndarray]:
    return {s.name.removeprefix("0#"): s.values for s in sc.read_checkpoint(checkpoint)}


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


# -- the test phase ---------------------------------------------------------------------------


def test_events_before_counts_the_schedule() -> None:
    for freq, after, start, at_zero in [(10, 0, 0, True), (10, 0, 0, False), (7, 3, 0, True),
                                        (6, 4, 5, False), (1, 0, 2, True), (0, 0, 0, True)]:
        when = singa_due if at_zero else due
        for step in range(0, 40):
            expected = sum(1 for s in range(start, step) if when(s, freq, after))
            assert events_before(step, freq, after, start, at_zero=at_zero) == expected


def test_tests_read_on_through_the_store_and_stop_before_the_last_step(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SINGA's test layer keeps its reader from one test to the next: test k reads
    test_steps batches from record k * test_steps * batchsize, wrapping around (the store
    holds 359 records; 3 batches of 50 a test). SINGA's worker tests before steps 0, 10 and
    20, and stops at step 30 before testing there."""
    job = write_job("job.conf", steps=30)
    Path(job).write_text(Path(job).read_text().replace("base_lr: 0.05", "base_lr: 0"))
    code, _, err = run(capsys, "train", job, "--quiet")
    assert code == 0, err
    tests = [r for r in rows("examples/mnist") if r["phase"] == "test"]
    assert [r["step"] for r in tests] == ["0", "10", "20"]
    values = values_of("examples/mnist/checkpoint/step30-worker0")  # unchanged: lr 0
    n = len(stores.read_records("examples/mnist/test_data.bin", "kvfile").y)
    for k, row in enumerate(tests):
        loss, accuracy = stanh_mlp_metrics(values, np.arange(k * 150, (k + 1) * 150) % n)
        assert float(row["loss"]) == pytest.approx(loss, abs=1e-6), k
        assert float(row["accuracy"]) == pytest.approx(accuracy, abs=1e-9), k


def test_a_resumed_run_tests_where_a_straight_one_does(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    straight = write_job("straight.conf", steps=30, ws="examples/straight")
    assert run(capsys, "train", straight, "--quiet")[0] == 0
    tests = [r for r in rows("examples/straight") if r["phase"] == "test"]
    assert [r["step"] for r in tests] == ["0", "10", "20"]
    for stop in ("15", "20"):  # 20: that run stopped before its test at 20; resumed, it tests
        resumed = write_job("resumed.conf", steps=30, ws=f"examples/resumed{stop}",
                            extra="checkpoint_freq: 10")
        assert run(capsys, "train", resumed, "--quiet", "--steps", stop)[0] == 0
        assert run(capsys, "train", resumed, "--quiet", "--resume")[0] == 0
        assert [r for r in rows(f"examples/resumed{stop}") if r["phase"] == "test"] == tests


def test_test_in_a_trained_workspace_tests_its_newest_checkpoint(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job("job.conf", steps=20)
    assert run(capsys, "train", job, "--quiet")[0] == 0
    files = {p: p.read_bytes() for p in Path("examples/mnist").rglob("*") if p.is_file()}
    for argv in (["train", job, "--test"], ["-conf", job, "-test"]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "test only: examples/mnist/metrics.csv of the earlier run in examples/mnist " \
               "kept" in out, out
        assert "testing examples/mnist/checkpoints/step-00000020.ckpt.safetensors (step 20)" \
            in out, out
        loss, accuracy = stanh_mlp_metrics(values_of("examples/mnist/checkpoint/"
                                                     "step20-worker0"), 150)
        assert f"step 20: test loss {loss:.4f}, accuracy {100 * accuracy:.2f}%" in out, out
        assert {p: p.read_bytes() for p in Path("examples/mnist").rglob("*")
                if p.is_file()} == files  # nothing written over the trained run's files
    # SINGA's own files only (a workspace of SINGA's): its newest
    for p in Path("examples/mnist/checkpoints").iterdir():
        p.unlink()
    code, out, err = run(capsys, "train", job, "--test")
    assert code == 0 and "testing examples/mnist/checkpoint/step20-worker0 (step 20)" in out
    assert f"step 20: test loss {loss:.4f}" in out, out
    # checkpoint_path, as SINGA's -test: that one
    values = make_values(3)
    made = sc.write_checkpoint("made/step7-worker0", [("0#" + k, v, 7) for k, v in
                                                      values.items()])
    Path(job).write_text(Path(job).read_text() + f'\ncheckpoint_path: "{made}"')
    code, out, err = run(capsys, "train", job, "--test")
    assert code == 0, err
    assert f"step 0: test loss {stanh_mlp_metrics(values, 150)[0]:.4f}" in out, out


# -- SINGA's log lines ------------------------------------------------------------------------

GLOG = re.compile(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] (.*)")
NUMBER = r"\d+\.\d{6}"


def messages(out: str) -> list[str]:
    found = [GLOG.fullmatch(line) for line in out.splitlines()]
    assert all(found), out
    return [m.group(1) for m in found if m]


def test_v020_log_lines_line_for_line(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job("job.conf", steps=22)
    code, out, err = run(capsys, "train", job, "--log-format", "singa")
    assert code == 0, err
    got = [m for m in messages(out) if "@ step" in m or m.startswith("   ")]
    metric = rf"Loss = {NUMBER}, accuracy = {NUMBER}"
    expected = ["Test @ step 0", f"   {metric}", f"Train @ step 0  {metric}",
                f"Train @ step 5  {metric}", "Test @ step 10", f"   {metric}",
                f"Train @ step 10  {metric}", f"Train @ step 15  {metric}", "Test @ step 20",
                f"   {metric}", f"Train @ step 20  {metric}"]
    assert len(got) == len(expected), got
    for line, pattern in zip(got, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    # the test's numbers are metrics.csv's, as SINGA printed them (float32, six decimals)
    tests = [r for r in rows("examples/mnist") if r["phase"] == "test"]
    assert [f"   Loss = {float(np.float32(r['loss'])):.6f}, accuracy = "
            f"{float(np.float32(r['accuracy'])):.6f}" for r in tests] == [got[1], got[5], got[9]]
    # SINGA's -test: the results alone (Driver::Test logs no "Test @ step")
    code, out, err = run(capsys, "train", job, "-test", "--log-format", "singa")
    assert code == 0, err
    loss, accuracy = stanh_mlp_metrics(values_of("examples/mnist/checkpoint/step22-worker0"),
                                       150)
    (line,) = [m for m in messages(out) if "Loss" in m or "@" in m]
    assert re.fullmatch(rf"   {metric}", line)
    numbers = [float(x) for x in re.findall(NUMBER, line)]
    assert numbers == pytest.approx([loss, accuracy], abs=2e-6)


def test_v010_log_lines(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for split in ("train", "test"):
        assert run(capsys, "data", "digits", f"examples/mnist/mnist_{split}_shard",
                   "--format", "shard", "--split", split)[0] == 0
    text = (DATA / "v0.1.0" / "examples" / "mnist" / "job.conf").read_text()
    text = text.replace("batchsize: 1000", "batchsize: 20").replace(
        "num_output: 2500", "num_output: 12")
    Path("v01.conf").write_text(text)
    code, out, err = run(capsys, "train", "v01.conf", "--steps", "12", "--log-format", "singa",
                         "--set", "disp_freq=5", "--set", "test_freq=10", "--set",
                         "test_steps=2")
    assert code == 0, err
    got = [m for m in messages(out) if "@ step" in m]
    metric = rf"accuracy = {NUMBER}, loss = {NUMBER}"  # Metric::ToLogString's order
    expected = [f"Test @ step 0: {metric}", f"Train @ step 0: {metric}",
                f"Train @ step 5: {metric}", f"Test @ step 10: {metric}",
                f"Train @ step 10: {metric}"]
    assert len(got) == len(expected), got
    for line, pattern in zip(got, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_what_each_layer_type_shows() -> None:
    m = {"loss": 2.2236071, "accuracy": 0.18906251}
    assert logs.train_lines(V020, 10, ["kSoftmaxLoss"], m) == [
        "Train @ step 10  Loss = 2.223607, accuracy = 0.189063"]
    assert logs.train_lines(V020, 3, ["kEuclideanLoss", "kAccuracy"], m) == [
        "Train @ step 3  Loss = 2.223607", "Train @ step 3  accuracy = 0.189063"]
    assert logs.eval_lines(V020, "kVal", 4, ["kRBMVis"], {"loss": 0.5}) == [
        "Validation @ step 4", "   Squared Error = 0.500000"]
    assert logs.eval_lines(V020, "kTest", 0, ["kCudnnSoftmaxLoss"], m, alone=True) == [
        "   Loss = 2.223607"]
    # kBPTT: one line, each label summed over the unrolled copies, with a trailing comma
    assert logs.train_lines(V020, 0, ["kSoftmaxLoss"] * 3, m, bptt=True) == [
        "Train @ step 0 accuracy = 0.567189, Loss = 6.670821, "]
    assert logs.eval_lines(V020, "kTest", 5, ["kSoftmaxLoss"] * 2, m, bptt=True) == [
        "Test @ step 5", "  accuracy = 0.378126, Loss = 4.447214, "]
    assert logs.eval_lines(V010, "kTest", 60, ["kSoftmaxLoss"], m) == [
        "Test @ step 60: accuracy = 0.189063, loss = 2.223607"]
    assert logs.train_lines(V010, 1, ["kRBMVis"], {"loss": 1.25}) == [
        "Train @ step 1: Squared Error = 1.250000"]
    # a user's layer: its metrics by paramserver's names
    assert logs.train_lines(V020, 2, ["kMyLoss"], {"perplexity": 3.0}) == [
        "Train @ step 2  perplexity = 3.000000"]
    assert logs.value(0.1) == "0.100000" and logs.value(float("nan")) == "nan"
