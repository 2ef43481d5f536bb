"""A fast start (issue 25): ``paramserver check`` reads no data and loads nothing heavy unless
``--data`` asks; ``train`` loads scikit-learn never, TensorBoard and matplotlib only where
they are used. Fresh processes, as users start them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli import main
from paramserver.init import init_params
from paramserver.params import ParamSet, plan_params
from paramserver.singa import stores
from paramserver.train import data
from paramserver.train.jobfile import read_job_file

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ROOT / "examples" / "digits_mlp.conf"
HEAVY = ("numba", "llvmlite", "torch", "sklearn", "scipy", "matplotlib", "PIL",
         "tensorboardX", "tensorboard", "rich")


def modules_after(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    """Run the command in a fresh process; its exit status and the heavy modules it loaded."""
    code = ("import json, sys\nfrom paramserver.cli import main\n"
            f"status = main({argv!r})\n"
            f"print(json.dumps([status, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=cwd, check=True).stdout.splitlines()[-1]
    status, loaded = json.loads(out)
    return status, loaded


def test_check_loads_nothing_heavy_and_reads_no_data(tmp_path: Path) -> None:
    status, loaded = modules_after(["check", str(MAIN_JOB)], tmp_path)
    assert status == 0 and loaded == []
    status, loaded = modules_after(["check", "--data", str(MAIN_JOB)], tmp_path)
    assert status == 0 and "numba" not in loaded  # the data is read; no fill is drawn


def test_train_loads_sklearn_never_and_tensorboard_only_when_asked(tmp_path: Path) -> None:
    job = tmp_path / "job.conf"
    job.write_text(MAIN_JOB.read_text().replace("train_steps: 1500", "train_steps: 3"))
    status, loaded = modules_after(["train", str(job), "--workspace", str(tmp_path / "a"),
                                    "--quiet", "--no-tensorboard"], tmp_path)
    assert status == 0
    assert "sklearn" not in loaded  # (numba loads scipy where it is installed)
    assert "tensorboardX" not in loaded and "PIL" in loaded  # metrics.png
    assert "matplotlib" not in loaded  # drawn with Pillow (30 MB and 1.5 s less)
    _, loaded = modules_after(["train", str(job), "--workspace", str(tmp_path / "b"),
                               "--quiet"], tmp_path)
    assert "tensorboardX" in loaded or "tensorboard" in loaded


def test_the_digits_are_scikit_learns() -> None:
    from sklearn.datasets import load_digits

    x, y = data._load_digits(normalize=False)
    expected_x, expected_y = load_digits(return_X_y=True)
    assert x.dtype == np.float64 and y.dtype == np.int64
    assert np.array_equal(x, expected_x) and np.array_equal(y, expected_y)
    assert x.shape == (data.DIGITS_SAMPLES, data.DIGITS_FEATURES)
    assert int(y.max()) + 1 == data.DIGITS_CLASSES


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(("fractions", "arrays"), [
    ({}, {"x": np.zeros((50, 3, 4), np.float32), "y": np.arange(50) % 3}),
    ({"test_fraction": 0.3, "val_fraction": 0.1},
     {"x": np.zeros((41, 6), np.int32), "y": (np.arange(41) % 5).reshape(41, 1)}),
    ({"val_fraction": 0.2}, {"x": np.zeros((30, 2), bool), "y": np.arange(30.0) % 2,
                             "x_test": np.ones((7, 2), bool), "y_test": np.zeros(7)}),
])
def test_an_npz_file_is_described_by_its_headers(tmp_path: Path, fractions: dict[str, float],
                                                 arrays: dict[str, np.ndarray]) -> None:
    path = _npz(tmp_path / "d.npz", **arrays)
    layout = data.describe_dataset(str(path), **fractions)
    loaded = data.load_dataset(str(path), **fractions)
    assert layout.sample_shape == loaded.sample_shape
    assert layout.integer_input == loaded.integer_input
    assert layout.num_train == loaded.num_train
    assert layout.num_classes is None  # the labels are not read


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.zeros((4, 2))}, "has no array 'y'"),
    ({"x": np.zeros((4, 2)), "y": np.zeros((3,))}, "'x' has 4 samples but 'y' 3 labels"),
    ({"x": np.array(["a", "b"]), "y": np.zeros(2)}, "'x' must hold numbers"),
    ({"x": np.zeros((4, 2)), "y": np.zeros((4, 2))}, "'y' must be 1-D"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4), "x_test": np.zeros((2, 3)),
      "y_test": np.zeros(2)}, "samples of 'x_test' have shape (3,)"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4), "x_test": np.zeros((2, 2))},
     "has 'x_test' but no 'y_test'"),
])
def test_an_npz_files_layout_problems_without_its_values(
        tmp_path: Path, arrays: dict[str, np.ndarray], message: str) -> None:
    path = _npz(tmp_path / "d.npz", **arrays)
    for read in (data.describe_dataset, data.load_dataset):
        with pytest.raises(data.ParamError, match=message.replace("(", r"\(").replace(
                ")", r"\)")):
            read(str(path))


BAD_NPZ_JOB = """
train_steps: 5
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "{data}" batchsize: 4 }} }}
  layer {{ name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 3 }}
          param {{ name: "w" init {{ type: kUniform low: -0.1 high: 0.1 }} }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }}
}}
"""

STORE_JOB = """
train_steps: 5
neuralnet {{
  layer {{ name: "data" type: kRecordInput
          store_conf {{ backend: "kvfile" path: "{data}" batchsize: 2 }} }}
  layer {{ name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 3 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }}
}}
"""


def test_check_reads_the_data_only_with_data(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A value only the data tells (a NaN, a record cut short): ``check`` passes without
    ``--data``, its table of Params shaped by the data's headers (a store's first record),
    and names the problem with ``--data``."""
    x = np.ones((20, 5), np.float32)
    x[7, 2] = np.nan
    npz = _npz(tmp_path / "nan.npz", x=x, y=np.arange(20) % 3)
    store = tmp_path / "train.bin"
    stores.write_records(store, stores.Samples(np.ones((4, 6), np.float32),
                                               np.arange(4) % 3))
    store.write_bytes(store.read_bytes()[:-5])  # the last record cut short
    for text, path, param, problem in (
            (BAD_NPZ_JOB, npz, ("w", "3x5"), "'x' holds NaN or infinite values"),
            (STORE_JOB, store, ("fc_0", "3x6"), "record 3 at byte")):
        job = tmp_path / "job.conf"
        job.write_text(text.format(data=path))
        assert main(["check", str(job)]) == 0
        rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
                if line.split()}
        assert rows[param[0]][2] == param[1]
        assert main(["check", "--data", str(job)]) == 2
        assert problem in capsys.readouterr().err


def test_the_net_checked_without_data_has_the_params_of_the_net_run(tmp_path: Path) -> None:
    for job in sorted((ROOT / "examples").glob("*.conf")):
        job_file = read_job_file(job)
        try:
            run = job_file.build_net()
        except data.ParamError:  # a SINGA example whose data is made by a script first
            continue
        checked = job_file.build_net(read_data=False)
        assert [(s.name, s.shape) for s in checked.param_specs()] == [
            (s.name, s.shape) for s in run.param_specs()], job.name


def test_a_checked_initialisation_draws_nothing_and_still_refuses(tmp_path: Path) -> None:
    job_file = read_job_file(MAIN_JOB)
    net = job_file.build_net(read_data=False)
    params = ParamSet(plan_params(net.param_specs()), net.dtype)
    init_params(params, 1, check_only=True)
    assert not params.values.any()  # no random value drawn (the biases' 0 is written)
    job = tmp_path / "job.conf"
    job.write_text(MAIN_JOB.read_text().replace(
        "init { type: kUniformSqrtFanInOut }", "init { type: kUniform low: 1 high: -1 }"))
    status, loaded = modules_after(["check", str(job)], tmp_path)
    assert status == 2 and loaded == []  # refused as training would, without numba


def test_a_stores_first_records_are_read_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    stores.write_records(path, stores.Samples(np.arange(12, dtype=np.float32).reshape(3, 4),
                                              np.arange(3)))
    path.write_bytes(path.read_bytes()[:-3])  # the last record cut short
    first = stores.read_records(path, limit=1)
    assert first.x.tolist() == [[0.0, 1.0, 2.0, 3.0]] and first.y.tolist() == [0]
    with pytest.raises(data.ParamError, match="cut short"):
        stores.read_records(path)
    csv = tmp_path / "s.csv"
    csv.write_text("1,0.5,2\n0,1,\n")
    assert stores.read_records(csv, "textfile", limit=1).x.tolist() == [[0.5, 2.0]]
    with pytest.raises(data.ParamError, match="line 2"):
        stores.read_records(csv, "textfile")
