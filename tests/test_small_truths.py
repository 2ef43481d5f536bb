"""What the command says matches what it did (issue 38, item 7): check's list of what a run
writes, the end line of a run that only tests or that was resumed, the rows a resume keeps,
the documentation of a user's own layer, the learning-rate plot and TensorBoard's scalars."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from paramserver.cli import main

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"

JOB = """
name: "tiny"
train_steps: 20
disp_freq: 5
test_freq: 10
test_steps: 1
checkpoint_freq: 10
seed: 3
updater { type: kSGD momentum: 0.9 learning_rate { type: kInverse base_lr: 0.05
          inverse_conf { gamma: 0.1 pow: 0.75 } } }
neuralnet {
  layer { name: "data" type: kData data_conf { source: "digits" batchsize: 16 } }
  layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 10 } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }
}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    job = tmp_path / "tiny.conf"
    job.write_text(JOB)
    return job


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_check_lists_singas_checkpoint_folder_only_for_a_singa_job(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", str(MLP), "--json")
    assert code == 0
    writes = [Path(w["path"]).name for w in json.loads(out)["writes"]]
    assert writes == ["checkpoints", "tensorboard", "metrics.csv", "metrics.png"]
    code, out, _ = run(capsys, "check", str(MLP), "--set", "cluster.workspace=ws")
    assert code == 0 and "ws/checkpoint " in out and "SINGA's checkpoints" in out


def test_the_end_line_names_what_the_run_made_and_the_steps_it_ran(
        capsys: pytest.CaptureFixture[str], tiny: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    code, out, err = run(capsys, "train", str(tiny), "--workspace", str(ws), "--steps", "10")
    assert code == 0, err
    done = out.splitlines()[-1]
    assert done.startswith("done: 10 steps in ") and done.endswith(
        f"{ws}/metrics.csv, {ws}/metrics.png, {ws}/tensorboard"), done
    code, out, err = run(capsys, "train", str(tiny), "--workspace", str(ws), "--steps", "20",
                         "--resume")
    assert code == 0, err
    assert out.splitlines()[-1].startswith("done: ran 10 steps (10 → 20) in "), out
    # a run that only tests makes no TensorBoard folder, and does not say it did
    only = tmp_path / "only"
    code, out, err = run(capsys, "train", str(tiny), "--workspace", str(only), "--test")
    assert code == 0, err
    assert not (only / "tensorboard").exists()
    assert out.splitlines()[-1].startswith("done: tested step 0 in "), out
    assert out.splitlines()[-1].endswith(f"; {only}/metrics.csv, {only}/metrics.png"), out


def test_a_resume_keeps_the_test_that_ended_the_earlier_run(
        capsys: pytest.CaptureFixture[str], tiny: Path, tmp_path: Path) -> None:
    """--steps 16, then --resume --steps 20: the test at step 16 happened, TensorBoard keeps
    it, and so does metrics.csv now (it was dropped)."""
    ws = tmp_path / "ws"
    for argv in (["--steps", "16"], ["--steps", "20", "--resume"]):
        code, _, err = run(capsys, "train", str(tiny), "--workspace", str(ws), *argv)
        assert code == 0, err
    rows = [r.split(",")[:2] for r in (ws / "metrics.csv").read_text().splitlines()[1:]]
    assert [s for s, phase in rows if phase == "test"] == ["10", "16", "20"]
    assert [e.step for e in events(ws / "tensorboard").Scalars("test/loss")] == [10, 16, 20]


def events(folder: Path):  # type: ignore[no-untyped-def]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_doc_of_a_users_layer_is_its_own(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's layer without a docstring was shown with Layer's ("Base of every layer;
    see the module docstring for the interface"): the base class's text, not the layer's."""
    (tmp_path / "issue38_layers.py").write_text(
        "from paramserver.train.layers import Layer, register_layer\n\n\n"
        "@register_layer('kIssue38Doubled')\n"
        "class Doubled(Layer):\n"
        "    '''Doubles its source's output: a user's own layer.'''\n\n\n"
        "@register_layer('kIssue38Bare')\n"
        "class Bare(Layer):\n"
        "    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run(capsys, "--import", "issue38_layers", "doc", "kIssue38Doubled")
    assert code == 0, err
    assert out.splitlines()[:2] == ["user:kIssue38Doubled",
                                    "    Doubles its source's output: a user's own layer."]
    code, out, err = run(capsys, "--import", "issue38_layers", "doc", "kIssue38Bare", "--json")
    assert code == 0, err
    assert json.loads(out)["doc"] == "(issue38_layers.Bare has no docstring.)"
    code, out, err = run(capsys, "--import", "issue38_layers", "doc")
    assert code == 0 and "Base of every layer" not in out


def test_the_plot_draws_the_learning_rate_schedule_at_every_step(
        capsys: pytest.CaptureFixture[str], tiny: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kInverse is smooth; the plot drew the train rows' rates as a staircase (one step per
    display window). It draws the schedule at every step now."""
    from paramserver.train.metrics import MetricsLog

    drawn: list[tuple[list[int], list[float]]] = []
    real = MetricsLog.plot

    def plot(self: MetricsLog, path: object, title: str, lr: object = None) -> object:
        drawn.append(self.lr_points(lr))  # type: ignore[arg-type]
        return real(self, path, title, lr)  # type: ignore[arg-type]

    monkeypatch.setattr(MetricsLog, "plot", plot)
    code, _, err = run(capsys, "train", str(tiny), "--workspace", str(tmp_path / "ws"))
    assert code == 0, err
    (steps, rates), = drawn
    assert steps == list(range(1, 21))  # every step, not the 4 display rows
    expected = [0.05 * (1 + 0.1 * s) ** -0.75 for s in range(20)]
    assert rates == pytest.approx(expected, rel=1e-6)
    assert all(a > b for a, b in itertools.pairwise(rates))  # smooth: no two steps alike
    assert (tmp_path / "ws" / "metrics.png").stat().st_size > 0
