"""What a training run shows and leaves: progress display, log messages, TensorBoard, plot."""

from __future__ import annotations

import io
import itertools
import logging
import re
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver.checkpoint import checkpoint_name
from paramserver.cli import main
from paramserver.cluster import Worker
from paramserver.cluster.gradfn import build_grad_fn
from paramserver.config.job import parse_job
from paramserver.train import progress
from paramserver.train import trainer as trainer_module
from paramserver.train.metrics import MetricsLog, Row, accuracy_limits
from paramserver.train.plot import COLORS, Series, log_ticks, tick_labels, ticks
from paramserver.train.progress import Progress, Rate
from paramserver.train.trainer import Trainer, default_disp_freq

JOB = """
name: "tiny"
train_steps: {steps}
disp_freq: {disp}
test_freq: 10
test_steps: 2
checkpoint_freq: 10
workspace: "{ws}"
seed: 5
updater {{
  type: kSGD momentum: 0.9
  learning_rate {{ type: kStep base_lr: 0.05 step_conf {{ change_freq: 15 gamma: 0.5 }} }}
}}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "digits" batchsize: 16 }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data"
          innerproduct_conf {{ num_output: 16 }} }}
  layer {{ name: "act" type: kTanh srclayers: "fc1" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act"
          innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
}}
"""


def job(ws: Path, steps: int = 20, disp: int = 7):  # type: ignore[no-untyped-def]
    return parse_job(JOB.format(steps=steps, ws=ws, disp=disp))


class Terminal(io.StringIO):
    """A stream that says it is a terminal (what rich draws a live display on)."""

    def isatty(self) -> bool:
        return True


# -- progress ---------------------------------------------------------------------------------

LINE = re.compile(r"train step +(\d+)/20 \( *\d+%\)  loss \d+\.\d{4}  acc +\d+\.\d\d%  "
                  r"lr [\d.e-]+  [\d,.]+ steps/s  elapsed \d+:\d\d:\d\d  ETA \d+:\d\d:\d\d")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours, cursor moves


def test_plain_lines_off_a_terminal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="paramserver"):
        Trainer(job(tmp_path), stream=out, tensorboard=False).train()
    lines = out.getvalue().splitlines()
    assert [LINE.fullmatch(x).group(1) for x in lines] == ["7", "14", "20"]  # type: ignore[union-attr]
    # Messages go through logging, not into the progress stream.
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("step 10: test loss") for m in messages)
    assert any(m.startswith("step 20: checkpoint") for m in messages)
    assert any(m.startswith("done: 20 steps") for m in messages)


def test_default_display_frequency() -> None:
    assert [default_disp_freq(n) for n in (0, 5, 37, 100, 250, 1500, 10**6)] == [
        1, 1, 2, 10, 20, 100, 100000]
    for n in (7, 100, 999, 1500, 4321, 10**5):
        assert 10 <= n // default_disp_freq(n) <= 25 or n < 10


def test_a_job_without_disp_freq_shows_about_ten_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    text = JOB.format(steps=100, ws=tmp_path, disp=0)
    Trainer(parse_job(text), stream=out, tensorboard=False).train()
    assert len(out.getvalue().splitlines()) == 10


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock of steps/s, set by the test (``now[0]`` seconds)."""
    clock = [0.0]
    monkeypatch.setattr(progress, "clock", lambda: clock[0])
    return clock


def test_steps_per_second_is_recent_not_since_the_start(now: list[float]) -> None:
    rate = Rate(window=10.0)
    rate.start()
    now[0] = 20.0
    assert rate.add(10) == pytest.approx(0.5)    # a slow start: 10 steps in 20 s
    for _ in range(20, 200, 10):                  # then 10 steps a second
        now[0] += 1.0
        value = rate.add(10)
    assert value == pytest.approx(10.0)          # not (190 / 38 s) since the start


def test_steps_per_second_counts_training_time_only(now: list[float]) -> None:
    rate = Rate(window=10.0)
    rate.start()
    rate.skip_next()                 # the first step: warm-up, not counted
    now[0] = 30.0
    assert rate.add() is None        # nothing counted yet: not known
    for _ in range(5):               # then a step every 0.1 s
        now[0] += 0.1
        value = rate.add()
    assert value == pytest.approx(10.0)
    now[0] += 60.0                   # a test between two chunks of steps: not training
    rate.start()
    now[0] += 0.1
    assert rate.add() == pytest.approx(10.0)
    rate.hold(True)                  # a kernel compiles, across two steps
    now[0] += 5.0
    rate.add()
    now[0] += 5.0
    rate.hold(False)
    now[0] += 1.0                    # the step in which the compile ended: not counted
    rate.add()
    now[0] += 0.1
    assert rate.add() == pytest.approx(10.0)


def test_the_first_rate_shown_is_after_the_warm_up(
        tmp_path: Path, now: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """A gradient function that blocks on the first step (100 s by the clock of steps/s),
    then takes 1/128 s a step: the first rate shown, in the log lines and TensorBoard, is
    the fast one (128 steps/s), and so is its ETA. Each step waits until the trainer has
    taken the one before (its ``step`` marker), so that the clock moves in step order."""
    reported = [threading.Event() for _ in range(21)]
    monkeypatch.setattr(trainer_module, "marker",
                        lambda event, step: reported[int(step)].set())
    out = io.StringIO()
    trainer = Trainer(job(tmp_path), stream=out)
    real = build_grad_fn(trainer._step_fn.to_data())

    def grad_fn(worker: Worker, step: int) -> Any:
        if step and not reported[step].wait(60):
            raise RuntimeError(f"step {step - 1} was not reported")
        now[0] += 100.0 if step == 0 else 1 / 128  # exact in binary
        return real(worker, step)

    trainer._step_fn = grad_fn  # type: ignore[assignment]
    trainer.train()
    lines = out.getvalue().splitlines()
    assert [LINE.fullmatch(x).group(1) for x in lines] == ["7", "14", "20"]  # type: ignore[union-attr]
    assert all(" 128 steps/s " in x and x.endswith(" ETA 0:00:00") for x in lines)
    rates = scalars(events(tmp_path / "tensorboard"), "train/steps_per_second")
    assert [s for s, _ in rates] == [7, 14, 20]
    assert [v for _, v in rates] == [128.0] * 3


def test_the_terminal_shows_the_means_of_the_last_display_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between display steps the live display keeps the mean loss and accuracy of the last
    display window (the row of metrics.csv); before the first one, the mean of the steps
    so far."""
    shown: list[tuple[int, tuple[float, float, float] | None]] = []
    real = Progress.update

    def update(self: Progress, step: int, rate: float | None,
               metrics: tuple[float, float, float] | None = None, force: bool = False,
               extra: Any = None) -> None:
        shown.append((step, metrics))
        real(self, step, rate, metrics, force, extra)

    monkeypatch.setattr(Progress, "update", update)
    trainer = Trainer(job(tmp_path), stream=Terminal(), tensorboard=False)
    losses: list[float] = []
    step_fn = build_grad_fn(trainer._step_fn.to_data())

    def grad_fn(worker: Worker, step: int) -> Any:
        metrics = step_fn(worker, step)
        losses.append(float(metrics["loss"]))
        return metrics

    trainer._step_fn = grad_fn  # type: ignore[assignment]
    trainer.train()
    rows = {r[0]: r[2] for r in csv_rows(tmp_path) if r[1] == "train"}
    assert [s for s, _ in shown] == list(range(1, 21))
    for step, metrics in shown:
        if step < 7:
            assert metrics is not None and metrics[0] == pytest.approx(np.mean(losses[:step]))
        elif step in rows:
            assert metrics is not None and metrics[0] == pytest.approx(rows[step])
        else:
            assert metrics is None  # the last window's means stay on screen


def test_a_compile_is_said_and_held_out_of_the_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        now: list[float]) -> None:
    """While numba compiles, a log message says so (an update kernel, a random fill), and
    the rate is held; a kernel loaded from the cache says nothing."""
    import paramserver.numerics.cache as nc

    monkeypatch.setattr(nc, "CACHE_DIR", str(tmp_path))

    def kernel() -> Any:  # made anew, as a new process would
        @nc.njit(cache=True)
        def twice(x):  # type: ignore[no-untyped-def]
            return 2 * x

        return twice

    rate = Rate()
    rate.start()
    with caplog.at_level(logging.INFO, logger="paramserver"), progress.CompileNotice(rate):
        assert kernel()(2.0) == 4.0
        now[0] += 1.0
        assert rate.add() is None  # the step that compiled is not counted
        assert kernel()(3.0) == 6.0  # loaded from the cache
        now[0] += 0.5
        assert rate.add() == 2.0
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "compiling update kernels, first run only…"
    assert re.fullmatch(r"compiled update kernels in \d+\.\d s", messages[1])
    assert len(messages) == 2
    assert progress._kind_of("paramserver.numerics.rng_kernels:_chunk32") == "random fills"


def test_live_display_keeps_its_last_line_and_prints_messages_above(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    term = Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["train", str(_job_file(tmp_path)), "--workspace", str(tmp_path / "ws"),
                 "--no-tensorboard"]) == 0
    screen = _screen(term.getvalue())
    last = max(i for i, x in enumerate(screen) if "20/20" in x)
    assert "ETA" in screen[last] and "steps/s" in screen[last] and "…" not in screen[last]
    assert "loss" in screen[last + 1] and "acc" in screen[last + 1]  # the final metrics
    assert any(x.startswith("step 10: test loss") for x in screen[:last])  # above the bar
    assert any(x.startswith("step 20: test loss") for x in screen[:last])
    assert screen[last + 2].startswith("done: 20 steps")  # after it, on a line of its own


def _screen(text: str) -> list[str]:
    """What stays on each line of a terminal: the text after the line's last carriage
    return (a live display redraws its lines in place), escapes left out."""
    lines: list[str] = []
    for raw in ESCAPES.sub("", text).split("\n"):
        lines.append(raw.split("\r")[-1])
    # A redraw moves the cursor up over the display's lines; keep the last drawing of them.
    return [x for x in lines if x.strip()]


def test_ctrl_c_is_reported_on_a_line_of_its_own(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    term = Terminal()
    monkeypatch.setattr(sys, "stdout", term)  # the display's
    monkeypatch.setattr(sys, "stderr", term)  # the interruption's: the same terminal
    monkeypatch.setenv("COLUMNS", "80")

    def interrupted(self: Trainer, step: int, *args: object) -> None:
        if step >= 10:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_evaluate", interrupted)
    assert main(["train", str(_job_file(tmp_path)), "--workspace", str(tmp_path / "ws"),
                 "--no-tensorboard"]) == 130
    text = ESCAPES.sub("", term.getvalue())
    before, _, after = text.rpartition("paramserver: interrupted")
    assert before.endswith("\n") and after == "\n"  # not on the bar's line
    assert "10/20" in _screen(before)[-2]  # the bar stays, at the step it reached


def test_progress_off_a_terminal_is_silent_between_display_steps() -> None:
    out = io.StringIO()
    with Progress(10, stream=out) as p:
        p.update(3, 2.0, (1.0, 0.5, 0.1))
        p.set_phase("test")
        p.update(5, 2.0, (1.0, 0.5, 0.1), force=True)
        p.update(6, None, force=True)  # the metrics shown stay; the rate is not known
    assert out.getvalue().splitlines() == [
        "test step  5/10 ( 50%)  loss 1.0000  acc 50.00%  lr 0.1  2.0 steps/s  "
        "elapsed 0:00:00  ETA 0:00:02",
        "test step  6/10 ( 60%)  loss 1.0000  acc 50.00%  lr 0.1  - steps/s  "
        "elapsed 0:00:00  ETA -:--:--"]
    quiet = io.StringIO()
    with Progress(10, stream=quiet, enabled=False) as p:
        p.update(5, 1.0, (1.0, 0.5, 0.1), force=True)
    assert quiet.getvalue() == ""


def _job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.conf"
    path.write_text(JOB.format(steps=20, ws=tmp_path / "unused", disp=7))
    return path


# -- TensorBoard ------------------------------------------------------------------------------

def events(folder: Path):  # type: ignore[no-untyped-def]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalars(acc, tag: str) -> list[tuple[int, float]]:  # type: ignore[no-untyped-def]
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_event_files_hold_every_phase_and_histograms(tmp_path: Path) -> None:
    Trainer(job(tmp_path), progress=False).train()
    acc = events(tmp_path / "tensorboard")
    tags = acc.Tags()
    assert sorted(tags["scalars"]) == sorted(
        f"{phase}/{name}" for phase, names in (
            ("train", ("loss", "accuracy", "lr", "steps_per_second")),
            ("test", ("loss", "accuracy", "lr", "steps_per_second"))) for name in names)
    for name in ("loss", "accuracy", "lr", "steps_per_second"):
        assert [s for s, _ in scalars(acc, f"train/{name}")] == [7, 14, 20]
    assert [s for s, _ in scalars(acc, "test/accuracy")] == [10, 20]
    assert scalars(acc, "train/lr")[-1][1] == pytest.approx(0.025)
    rows = [r for r in csv_rows(tmp_path) if r[1] == "train"]
    assert [v for _, v in scalars(acc, "train/loss")] == pytest.approx([r[2] for r in rows])
    names = ("fc1_0", "fc1_1", "fc2_0", "fc2_1")
    assert sorted(tags["histograms"]) == sorted(f"{k}/{n}" for k in ("values", "update")
                                                for n in names)
    for tag in tags["histograms"]:
        assert [e.step for e in acc.Histograms(tag)] == [10, 20]
    update = acc.Histograms("update/fc2_0")[-1].histogram_value
    values = acc.Histograms("values/fc2_0")[-1].histogram_value
    assert update.num == values.num == 160 and 0 < update.max < values.max


def csv_rows(ws: Path) -> list[tuple[int, str, float]]:
    lines = (ws / "metrics.csv").read_text().splitlines()[1:]
    return [(int(a), b, float(c)) for a, b, c, *_ in (x.split(",") for x in lines)]


def test_resume_continues_the_event_files_without_duplicates(tmp_path: Path) -> None:
    Trainer(job(tmp_path / "straight"), progress=False).train()
    Trainer(job(tmp_path / "resumed"), progress=False).train()
    # The run stopped after its checkpoint at 10 (the one at 20 was never written), having
    # logged steps 14 and 20: the resumed run logs them again, and they show once.
    (tmp_path / "resumed" / "checkpoints" / checkpoint_name(20)).unlink()
    Trainer(job(tmp_path / "resumed"), progress=False).train(resume=True)
    assert len(list((tmp_path / "resumed" / "tensorboard").iterdir())) == 2
    a, b = events(tmp_path / "straight" / "tensorboard"), events(
        tmp_path / "resumed" / "tensorboard")
    for tag in ("train/loss", "train/accuracy", "train/lr", "test/loss", "test/accuracy"):
        assert scalars(b, tag) == scalars(a, tag), tag
    assert [e.step for e in b.Histograms("values/fc1_0")] == [10, 20]


def test_a_record_cut_short_is_cut_off_by_the_next_run(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A run killed while it wrote an event leaves the record cut short at the end of its
    file; the next run in the workspace cuts it off (and says so), so that TensorBoard
    reads the file whole, the events before it included."""
    from paramserver.train.tensorboard import records_end, repair

    ws = tmp_path / "ws"
    Trainer(job(ws), progress=False).train()
    (ws / "checkpoints" / checkpoint_name(20)).unlink()  # killed after the one at 10
    first = next((ws / "tensorboard").iterdir())
    whole = first.read_bytes()
    cut = len(whole) - 7
    first.write_bytes(whole[:cut])  # the last record torn
    assert records_end(whole[:cut]) < cut
    with caplog.at_level(logging.WARNING, logger="paramserver"):
        Trainer(job(ws), progress=False).train(resume=True)
    assert any("cut off a TensorBoard event cut short" in m for m in caplog.messages)
    assert records_end(first.read_bytes()) == first.stat().st_size
    assert repair(ws / "tensorboard") == []  # nothing left to cut
    acc = events(ws / "tensorboard")
    assert [e.step for e in acc.Histograms("update/fc2_1")] == [10, 20]


def test_no_tensorboard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(_job_file(tmp_path)), "--workspace", str(tmp_path / "ws"),
                 "--no-tensorboard", "--quiet"]) == 0
    assert not (tmp_path / "ws" / "tensorboard").exists()
    assert capsys.readouterr().err == ""  # --quiet: no display, no messages


# -- the plot ---------------------------------------------------------------------------------

def test_accuracy_axis_zooms_to_the_data_and_lr_is_plotted(tmp_path: Path) -> None:
    lo, hi = accuracy_limits([0.97, 0.985, 0.997])
    assert 0.9 < lo < 0.97 and 0.997 < hi <= 1.0
    assert accuracy_limits([]) == (0.0, 1.0) and accuracy_limits([0.1, 0.9])[0] >= 0.0
    log = MetricsLog(tmp_path / "metrics.csv")
    log.rows = [Row(s, "train", 1.0 / s, 0.97 + s / 10000, 0.1 * 0.5 ** (s // 20))
                for s in range(10, 101, 10)] + [Row(50, "test", 0.1, 0.99, 0.1)]
    _, acc, lr = log.panels()
    assert acc.ylimits()[0] > 0.9 and acc.percent and lr.title == "learning rate"
    assert [s.label for s in acc.series] == ["train", "test"] and acc.series[1].marker == "o"
    assert np.allclose(lr.series[0].ys, [r.lr for r in log.rows[:10]]) and lr.log
    path = log.plot(tmp_path / "metrics.png", "t")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(path) as image:
        assert image.size == (3 * 470, 400)
        colors = {c for _, c in image.getcolors(1 << 20)}
    assert {COLORS["train"], COLORS["test"]} <= colors  # both curves drawn


def test_a_step_schedule_is_drawn_as_steps_and_a_metric_never_computed_has_no_panel(
        tmp_path: Path) -> None:
    """Issue 26: a kStep rate was drawn as ramps between display rows, and an RBM's
    accuracy (NaN: not computed) as an empty panel."""
    log = MetricsLog(tmp_path / "metrics.csv")
    log.rows = [Row(s, "train", 1.0 / s, float("nan"), 0.1 * 0.5 ** ((s - 1) // 30))
                for s in range(10, 101, 10)]
    panels = log.panels()
    assert [p.title for p in panels] == ["loss", "learning rate"]
    line = panels[1].series[0]
    assert line.steps  # each row's rate holds over its window
    # the drawn path: flat runs joined by vertical jumps, not ramps from row to row
    path = line.path()
    assert len(path) == 2 * len(log.rows) - 1
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in itertools.pairwise(path))
    assert log.plot(tmp_path / "metrics.png", "t") is not None


def test_the_plots_ticks_and_labels() -> None:
    values, step = ticks(0.0, 1.0)
    assert values == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0] and step == 0.2
    assert tick_labels(values, step) == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    values, step = ticks(-75.0, 1575.0)
    assert values == [0.0, 500.0, 1000.0, 1500.0]
    assert tick_labels(values, step) == ["0", "500", "1000", "1500"]
    values, step = ticks(0.9, 1.0)
    assert tick_labels(values, step, percent=True) == ["90%", "92%", "94%", "96%", "98%",
                                                       "100%"]
    assert tick_labels(*ticks(0.0, 1.0, 4)) == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert log_ticks(5e-4, 0.2) == [1e-3, 1e-2, 1e-1]
    assert log_ticks(0.011, 0.09) == [0.02, 0.05]  # fewer than two decades: 2× and 5×
    assert tick_labels([1e-3, 1e-2, 0.1], None) == ["0.001", "0.01", "0.1"]
    staircase = Series("x", (1.0, 2.0, 3.0), (5.0, 4.0, 3.0), (0, 0, 0), steps=True)
    assert staircase.path() == [(1, 5), (1, 4), (2, 4), (2, 3), (3, 3)]


def test_the_legend_hides_no_line() -> None:
    """The legend goes to the corner of the plot area that hides the least of the lines,
    counted along them, not only at their points: a curve that rises to 100 % at its last
    point keeps every column it had without a legend."""
    from paramserver.train.plot import Panel, render

    xs, ys = (0.0, 1000.0, 1500.0), (0.84, 0.95, 1.0)  # no point, but a line, up right

    def top_columns(label: str) -> np.ndarray:
        image = np.asarray(render([Panel("accuracy", "accuracy", [
            Series(label, xs, ys, COLORS["train"])], ylim=(0.82, 1.0))], "t"))
        top = image[: image.shape[0] // 2].astype(int)
        return (np.abs(top - np.array(COLORS["train"])).sum(axis=2) < 60).any(axis=0)

    line = top_columns("")  # no label: no legend
    assert line.sum() > 150 and top_columns("train")[line].all()


def test_a_run_with_no_metric_plots_its_learning_rate(tmp_path: Path) -> None:
    """A sampling job (char-rnn's sample.conf) computes neither loss nor accuracy: one
    panel, no error."""
    log = MetricsLog(tmp_path / "metrics.csv")
    log.rows = [Row(0, "test", float("nan"), float("nan"), 0.1)]
    path = log.plot(tmp_path / "metrics.png", "t")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_the_nets_own_metrics_and_nan_ones(tmp_path: Path) -> None:
    """A metric the net adds (rnnlm's ppl) is a column of metrics.csv, read back on resume;
    a missing one is nan in its row."""
    log = MetricsLog(tmp_path / "metrics.csv")
    log.rows = [Row(10, "train", 2.0, float("nan"), 0.1, {"ppl": 7.389}),
                Row(10, "val", 2.5, float("nan"), 0.1, {"ppl": 12.18}),
                Row(20, "test", 2.5, 0.5, 0.1)]
    log.write()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "step,phase,loss,accuracy,lr,ppl", "10,train,2.0,nan,0.1,7.389",
        "10,val,2.5,nan,0.1,12.18", "20,test,2.5,0.5,0.1,nan"]
    again = MetricsLog(tmp_path / "metrics.csv")
    again.load()
    again.write()
    assert (tmp_path / "metrics.csv").read_text() == "\n".join([
        "step,phase,loss,accuracy,lr,ppl", "10,train,2.0,nan,0.1,7.389",
        "10,val,2.5,nan,0.1,12.18", "20,test,2.5,0.5,0.1,nan"]) + "\n"


def test_missing_pillow_is_a_plain_message(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL fails
    assert main(["train", str(_job_file(tmp_path)), "--workspace", str(tmp_path / "ws"),
                 "--no-tensorboard", "--steps", "3"]) == 0
    err = capsys.readouterr().err
    assert "warning: no metrics.png: Pillow is not installed (pip install " in err
    assert "Warning" not in err and "warnings.warn" not in err
    assert not (tmp_path / "ws" / "metrics.png").exists()
