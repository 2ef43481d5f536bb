"""Resuming and starting again in a workspace (issue 13, rows 2, 14 and 15): a damaged newest
checkpoint is passed over with a warning, none readable is refused, an earlier run is never
deleted unless the user asks (``--overwrite``), a run holds its workspace, and the
temporaries of a killed run's writes (only those) are removed at the next start."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from paramserver.cli import main
from paramserver.config.job import parse_job
from paramserver.train.trainer import Trainer
from paramserver.train.workspace import workspace_lock

JOB = """
name: "tiny"
train_steps: 20
disp_freq: 5
test_freq: 10
test_steps: 1
checkpoint_freq: 10
seed: 3
updater { type: kSGD momentum: 0.9 learning_rate { type: kFixed base_lr: 0.05 } }
neuralnet {
  layer { name: "data" type: kData data_conf { source: "digits" batchsize: 16 } }
  layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 10 } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }
}
cluster { nworkers_per_group: 2 nservers_per_group: 2 workspace: "ws" }
"""
# (a SINGA job, by its cluster { workspace }: SINGA's checkpoints are written too)


def run(capsys: pytest.CaptureFixture[str], job: Path, ws: Path, *argv: str) -> tuple[int, str]:
    """The exit code and what the run printed: its reports (stdout), then its warnings and
    errors (stderr)."""
    code = main(["train", str(job), "--workspace", str(ws), "--no-tensorboard", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def snapshot(folder: Path) -> dict[str, object]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                         if p.is_file() else "dir", p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The job file; a workspace after 20 steps (checkpoints at 10 and 20); and one after
    an uninterrupted run of 30 steps (made in the same place, then moved)."""
    root = tmp_path_factory.mktemp("resume")
    job = root / "tiny.conf"
    job.write_text(JOB)
    ws = root / "ws"
    assert main(["train", str(job), "--workspace", str(ws), "--quiet", "--no-tensorboard",
                 "--steps", "30"]) == 0
    straight = root / "straight"
    ws.rename(straight)
    assert main(["train", str(job), "--workspace", str(ws), "--quiet",
                 "--no-tensorboard"]) == 0
    twenty = root / "twenty"
    ws.rename(twenty)
    return job, twenty, straight


@pytest.fixture
def ws(made: tuple[Path, Path, Path]) -> Path:
    """A copy of the 20-step workspace, at the path every run of the module used (the
    checkpoints hold the job's configuration, workspace included)."""
    target = made[1].parent / "ws"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(made[1], target)
    return target


# -- row 2: a damaged newest checkpoint --------------------------------------------------------


@pytest.mark.parametrize("damage", ["a byte of the header", "a byte of the values",
                                    "the last byte", "cut short", "empty"])
def test_resume_passes_over_a_damaged_checkpoint(capsys: pytest.CaptureFixture[str],
                                                 made: tuple[Path, Path, Path], ws: Path,
                                                 damage: str) -> None:
    job, _, straight = made
    newest = ws / "checkpoints" / checkpoint_name(20)
    size = newest.stat().st_size
    if damage == "cut short":
        newest.write_bytes(newest.read_bytes()[: size // 2])
    elif damage == "empty":
        newest.write_bytes(b"")
    else:
        flip(newest, {"a byte of the header": 100, "a byte of the values": size - 200,
                      "the last byte": size - 1}[damage])
    bad = newest.read_bytes()
    code, err = run(capsys, job, ws, "--resume", "--steps", "30")
    assert code == 0, err
    assert "Traceback" not in err
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert warning.startswith(f"warning: {newest}: ")
    assert warning.endswith("; resuming from step-00000010.ckpt.safetensors instead (the "
                            "damaged file is kept as step-00000020.ckpt.safetensors.damaged)")
    assert "resuming from" in err and "(step 10)" in err
    # kept for the user to look at, out of the way of the new one
    assert (ws / "checkpoints" / "step-00000020.ckpt.safetensors.damaged").read_bytes() == bad
    # and the run is the uninterrupted one, byte for byte (the checkpoint of step 10 is the
    # 20-step run's, whose configuration says train_steps: 20)
    for sub in ("checkpoints", "checkpoint"):
        names = sorted(p.name for p in (straight / sub).iterdir())
        assert sorted(p.name for p in (ws / sub).iterdir() if not p.name.endswith(
            ".damaged")) == names
        for name in names:
            if name != checkpoint_name(10):
                assert (ws / sub / name).read_bytes() == (straight / sub / name).read_bytes()
    assert (ws / "metrics.csv").read_bytes() == (straight / "metrics.csv").read_bytes()


def test_resume_passes_over_every_damaged_newer_checkpoint(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], ws: Path) -> None:
    job, _, straight = made
    # A third checkpoint, of step 25, and both it and step 20's damaged.
    arrays, meta = load_checkpoint(ws / "checkpoints" / checkpoint_name(20))
    save_checkpoint(ws / "checkpoints" / checkpoint_name(25), arrays, meta)
    for step in (20, 25):
        flip(ws / "checkpoints" / checkpoint_name(step), 5000)
    code, err = run(capsys, job, ws, "--resume", "--steps", "30", "--quiet")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert [w.split(":")[1].strip() for w in warnings] == [
        str(ws / "checkpoints" / checkpoint_name(25)), str(ws / "checkpoints" /
                                                           checkpoint_name(20))]
    assert (ws / "checkpoints" / checkpoint_name(30)).read_bytes() == (
        straight / "checkpoints" / checkpoint_name(30)).read_bytes()


def test_a_checkpoint_of_another_job_is_refused_not_passed_over(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], ws: Path) -> None:
    other = ws.parent / "other.conf"
    other.write_text(JOB.replace("num_output: 10", "num_output: 12"))
    flip(ws / "checkpoints" / checkpoint_name(20), 100)
    before = snapshot(ws)
    code, err = run(capsys, other, ws, "--resume", "--steps", "30")
    assert code == 2 and "Traceback" not in err
    assert f"{ws / 'checkpoints' / checkpoint_name(10)}: the checkpoint's Params do not " \
           "match the job's" in err
    assert snapshot(ws) == before  # the damaged one is not set aside either


# -- row 15: no checkpoint can be read ----------------------------------------------------------


def test_resume_refuses_when_no_checkpoint_can_be_read(capsys: pytest.CaptureFixture[str],
                                                       made: tuple[Path, Path, Path],
                                                       ws: Path) -> None:
    job = made[0]
    folder = ws / "checkpoints"
    flip(folder / checkpoint_name(20), 100)
    (folder / checkpoint_name(10)).write_bytes(b"")
    before = snapshot(ws)
    code, err = run(capsys, job, ws, "--resume", "--steps", "30")
    assert code == 2 and "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == (f"paramserver train: error: cannot resume: none of the 2 "
                        f"checkpoint(s) in {folder} can be read (move them away to resume "
                        "from the start, or give --overwrite to start afresh, deleting the "
                        "earlier run's files)")
    assert lines[1].startswith(f"paramserver train: error: {folder / checkpoint_name(20)}: ")
    assert lines[2].startswith(f"paramserver train: error: {folder / checkpoint_name(10)}: ")
    assert snapshot(ws) == before  # nothing overwritten, nothing deleted


def test_resume_without_any_checkpoint_is_refused_unless_asked_to_start(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path],
        tmp_path: Path) -> None:
    """Issue 26: --resume with nothing to resume from used to start over, with a warning."""
    code, err = run(capsys, made[0], tmp_path / "new", "--resume", "--steps", "10")
    assert code == 2
    assert err == (f"paramserver train: error: cannot resume: no checkpoint in "
                   f"{tmp_path / 'new' / 'checkpoints'} nor SINGA's in "
                   f"{tmp_path / 'new' / 'checkpoint'}: train without --resume to start the "
                   "job, or give --resume-or-start to start from the beginning when there is "
                   "nothing to resume\n")
    assert not (tmp_path / "new").exists()  # nothing made
    (tmp_path / "new").mkdir()
    code, err = run(capsys, made[0], tmp_path / "new", "--resume", "--steps", "10")
    assert code == 2 and list((tmp_path / "new").iterdir()) == []
    code, err = run(capsys, made[0], tmp_path / "new", "--resume-or-start", "--steps", "10")
    assert code == 0, err
    assert f"no checkpoint in {tmp_path / 'new' / 'checkpoints'}: starting from step 0 " \
           "(--resume-or-start)" in err
    assert [s for s, _ in list_checkpoints(tmp_path / "new" / "checkpoints")] == [10]


# -- row 15: an earlier run is deleted only when the user asks ----------------------------------


def _earlier(ws: Path, kind: str) -> str:
    """Leave only one kind of an earlier run's results in ``ws``; what the refusal names."""
    keep = {"checkpoints": "checkpoints", "SINGA": "checkpoint", "metrics": "metrics.csv",
            "tensorboard": "tensorboard"}[kind]
    for path in list(ws.iterdir()):
        if path.name == keep:
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if kind == "tensorboard":
        (ws / "tensorboard").mkdir()
        (ws / "tensorboard" / "events.out.tfevents.1.host.1").write_bytes(b"x")
        return f"1 TensorBoard event file in {ws / 'tensorboard'}"
    return {"checkpoints": f"2 checkpoints in {ws / 'checkpoints'}",
            "SINGA": f"2 SINGA checkpoints in {ws / 'checkpoint'}",
            "metrics": str(ws / "metrics.csv")}[kind]


@pytest.mark.parametrize("kind", ["checkpoints", "SINGA", "tensorboard", "metrics"])
def test_a_new_run_refuses_a_workspace_with_an_earlier_run(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], ws: Path,
        kind: str) -> None:
    described = _earlier(ws, kind)
    (ws / "checkpoints").mkdir(exist_ok=True)  # a killed write's: kept too, as it all is
    (ws / "checkpoints" / ".step-00000030.ckpt.safetensors.0123456789ab.tmp").write_bytes(b"")
    before = snapshot(ws)
    code, err = run(capsys, made[0], ws)
    assert code == 2 and "Traceback" not in err
    assert err == (f"paramserver train: error: workspace {ws} holds the results of an "
                   f"earlier run ({described}): give --resume to go on from its newest "
                   "checkpoint, or --overwrite to start afresh (deleting them), or another "
                   "--workspace\n")
    assert snapshot(ws) == before


def test_overwrite_deletes_the_earlier_run(capsys: pytest.CaptureFixture[str],
                                           made: tuple[Path, Path, Path], ws: Path) -> None:
    (ws / "tensorboard").mkdir()
    old_events = ws / "tensorboard" / "events.out.tfevents.1.host.1"
    old_events.write_bytes(b"x")
    (ws / "notes.txt").write_text("mine")  # not a run's: kept
    code, err = run(capsys, made[0], ws, "--overwrite", "--steps", "10", "--quiet")
    assert code == 0, err
    assert err.startswith(f"warning: --overwrite: deleted the earlier run's 2 checkpoints in "
                          f"{ws / 'checkpoints'}, 2 SINGA checkpoints in {ws / 'checkpoint'}, "
                          f"1 TensorBoard event file in {ws / 'tensorboard'}, "
                          f"{ws / 'metrics.csv'}")
    assert [s for s, _ in list_checkpoints(ws / "checkpoints")] == [10]
    assert sorted(p.name for p in (ws / "checkpoint").iterdir()) == ["step10-worker0"]
    assert not old_events.exists() and (ws / "notes.txt").read_text() == "mine"


def test_overwrite_keeps_the_checkpoints_the_job_reads(made: tuple[Path, Path, Path],
                                                       ws: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    source = ws / "checkpoint" / "step20-worker0"
    conf = parse_job(JOB + f'checkpoint_path: "{source}"\n')
    conf.update({"workspace": str(ws), "train_steps": 5, "checkpoint_freq": 0})
    with caplog.at_level(logging.WARNING, logger="paramserver"):
        Trainer(conf, progress=False, tensorboard=False).train(overwrite=True)
    assert caplog.messages == [f"--overwrite: deleted the earlier run's 2 checkpoints in "
                               f"{ws / 'checkpoints'}, 1 SINGA checkpoint in "
                               f"{ws / 'checkpoint'}, {ws / 'metrics.csv'}"]
    assert sorted(p.name for p in (ws / "checkpoint").iterdir()) == ["step20-worker0",
                                                                     "step5-worker0"]
    assert [s for s, _ in list_checkpoints(ws / "checkpoints")] == [5]  # the end's


def test_a_run_that_only_tests_replaces_only_the_metrics(made: tuple[Path, Path, Path],
                                                         ws: Path) -> None:
    conf = parse_job(JOB)
    conf.update({"workspace": str(ws), "train_steps": 0})
    before = (ws / "metrics.csv").read_bytes()
    # SINGA's -test in a trained workspace: tests its newest checkpoint, writes nothing
    Trainer(conf, progress=False, tensorboard=False).train()
    assert (ws / "metrics.csv").read_bytes() == before
    Trainer(conf, progress=False, tensorboard=False).train(overwrite=True)
    assert [s for s, _ in list_checkpoints(ws / "checkpoints")] == [10, 20]  # kept
    assert [line.split(",")[:2] for line in (ws / "metrics.csv").read_text().splitlines()
            ] == [["step", "phase"], ["20", "test"]]  # the newest checkpoint's step


def test_resume_and_overwrite_exclude_each_other(capsys: pytest.CaptureFixture[str],
                                                 made: tuple[Path, Path, Path],
                                                 ws: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", str(made[0]), "--workspace", str(ws), "--resume", "--overwrite"])
    assert e.value.code == 2
    assert "argument --overwrite: not allowed with argument --resume" in capsys.readouterr().err
    conf = parse_job(JOB + "resume: true\n")
    conf.update({"workspace": str(ws)})
    with pytest.raises(ParamError, match=r"--resume and --overwrite exclude each other.*"
                                         r"\(the job file sets resume: true\)"):
        Trainer(conf, progress=False).train(overwrite=True)


# -- one run at a time in a workspace -----------------------------------------------------------


def test_a_second_run_in_a_busy_workspace_is_refused(capsys: pytest.CaptureFixture[str],
                                                     made: tuple[Path, Path, Path],
                                                     ws: Path) -> None:
    before = snapshot(ws)
    with workspace_lock(ws):  # as a run in another process holds it
        code, err = run(capsys, made[0], ws, "--resume", "--steps", "30")
    assert code == 2
    assert err == (f"paramserver train: error: workspace {ws} is in use by another run (a "
                   "paramserver train that has not ended): wait for it to end, or give "
                   "another --workspace\n")
    assert snapshot(ws) == before
    code, err = run(capsys, made[0], ws, "--resume", "--steps", "30", "--quiet")
    assert code == 0, err  # released


# -- row 14: the temporaries of killed writes, and only those, are removed ----------------------


def test_only_our_own_temporaries_are_removed(capsys: pytest.CaptureFixture[str],
                                              made: tuple[Path, Path, Path], ws: Path,
                                              tmp_path: Path) -> None:
    servers = ws / "checkpoints" / "servers" / "server-0-1"  # the Ray servers' folders
    servers.mkdir(parents=True)
    ours = [ws / "checkpoints" / ".step-00000020.ckpt.safetensors.0123456789ab.tmp",
            ws / "checkpoints" / ".step-00000030.ckpt.npz.k3j_x9a2.tmp",  # mkstemp's (0.0.x)
            ws / "checkpoint" / ".step20-worker0.abcdefabcdef.tmp",
            ws / ".metrics.csv.00112233aabb.tmp", ws / ".metrics.png.99887766ffee.tmp",
            ws / ".metrics.csv.tmp",  # the fixed name of earlier releases
            servers / ".step-00000020.ckpt.safetensors.a1b2c3d4e5f6.tmp"]
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not ours")
    theirs = [ws / "checkpoints" / ".step-00000020.ckpt.safetensors.tmp",  # no random part
              ws / "checkpoints" / ".step-00000020.ckpt.safetensors.0123456789AB.tmp",
              ws / "checkpoints" / ".step-00000020.ckpt.safetensors.0123456789ab.tmp.bak",
              ws / "checkpoints" / ".notes.txt.0123456789ab.tmp",  # not a name of ours
              ws / "checkpoints" / ".step20-worker0.0123456789ab.tmp",  # SINGA's, wrong place
              ws / "checkpoint" / ".step-00000020.ckpt.safetensors.0123456789ab.tmp",
              ws / ".step-00000020.ckpt.safetensors.0123456789ab.tmp",  # not in checkpoints/
              ws / "other" / ".step-00000020.ckpt.safetensors.0123456789ab.tmp",
              ws / "checkpoints" / "notes.tmp"]
    for path in ours + theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    folder = ws / "checkpoints" / ".step-00000040.ckpt.safetensors.0123456789ab.tmp"
    folder.mkdir()  # a folder, whatever its name
    link = ws / "checkpoints" / ".step-00000050.ckpt.safetensors.0123456789ab.tmp"
    link.symlink_to(outside)  # a link: neither it nor what it points to
    code, err = run(capsys, made[0], ws, "--resume", "--steps", "30")
    assert code == 0, err
    assert f"removed {len(ours)} temporary file(s) of an interrupted run: " in err
    assert [p for p in ours if p.exists()] == []
    assert [p for p in theirs if not p.exists()] == []
    assert folder.is_dir() and link.is_symlink() and outside.read_text() == "not ours"


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    import paramserver.checkpoint as checkpoint

    def broken(tmp: Path, *args: object) -> None:
        tmp.write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_safetensors", broken)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / checkpoint_name(1), {"x": np.ones(3)}, {})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / checkpoint_name(1))


def test_lock_is_per_workspace(tmp_path: Path) -> None:
    with workspace_lock(tmp_path / "a"), workspace_lock(tmp_path / "b"):
        assert os.path.isdir(tmp_path / "a") and os.path.isdir(tmp_path / "b")


# -- issue 26: resume never starts over --------------------------------------------------------


def _values(ws: Path, step: int) -> dict[str, np.ndarray]:
    return load_checkpoint(ws / "checkpoints" / checkpoint_name(step))[0]


def test_a_job_without_checkpoint_freq_resumes_from_its_end(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Issue 26: with no checkpoint_freq only SINGA's checkpoint was written, and --resume
    read none: the second run started over. A checkpoint is written at the end now."""
    job = tmp_path / "job.conf"
    job.write_text(JOB.replace("checkpoint_freq: 10", "checkpoint_freq: 0")
                   .replace(' workspace: "ws"', ""))  # paramserver's own (not a SINGA job)
    code, out = run(capsys, job, tmp_path / "ws", "--steps", "6", "--quiet")
    assert code == 0, out
    assert not (tmp_path / "ws" / "checkpoint").exists()  # SINGA's only in a SINGA job
    code, out = run(capsys, job, tmp_path / "ws", "--steps", "12", "--resume")
    assert code == 0, out
    assert "resuming from" in out and "(step 6)" in out and "warning" not in out
    code, out = run(capsys, job, tmp_path / "straight", "--steps", "12", "--quiet")
    assert code == 0, out
    for key, value in _values(tmp_path / "straight", 12).items():
        np.testing.assert_array_equal(_values(tmp_path / "ws", 12)[key], value, err_msg=key)
    # the same rows, and the first run's own last rows at step 6 (its last train window and
    # its final test), kept as TensorBoard keeps them (issue 38)
    resumed = (tmp_path / "ws" / "metrics.csv").read_text().splitlines()
    straight = (tmp_path / "straight" / "metrics.csv").read_text().splitlines()
    assert [r for r in resumed if not r.startswith("6,")] == straight
    assert [r.split(",")[:2] for r in resumed if r.startswith("6,")] == [["6", "train"],
                                                                         ["6", "test"]]


def test_resume_goes_on_from_singas_own_checkpoints(capsys: pytest.CaptureFixture[str],
                                                    made: tuple[Path, Path, Path],
                                                    ws: Path) -> None:
    """SINGA's -resume continued from the newest step<N>-worker<M> files: so does --resume
    when they are newer than paramserver's (its values; the updater's state afresh)."""
    shutil.rmtree(ws / "checkpoints")  # as a workspace of SINGA's own holds them
    (ws / "checkpoint" / "step10-worker0").unlink()
    code, out = run(capsys, made[0], ws, "--resume", "--steps", "30")
    assert code == 0, out
    assert "warning: resuming from SINGA's checkpoint of step 20 (step20-worker0): it holds " \
           "the values but not the updater's state" in out
    rows = [r.split(",")[:2] for r in (ws / "metrics.csv").read_text().splitlines()[1:]]
    # SINGA's resumed worker tests before step 20 (the run of 20 steps stopped before it),
    # and not before step 30, where it stops
    assert ["20", "test"] in rows and ["25", "train"] in rows and ["30", "test"] not in rows
    assert [s for s, _ in list_checkpoints(ws / "checkpoints")] == [30]
    from paramserver.singa.checkpoints import read_checkpoint

    at20 = {p.name: p for p in read_checkpoint(made[1] / "checkpoint" / "step20-worker0")}
    at30 = {p.name: p for p in read_checkpoint(ws / "checkpoint" / "step30-worker0")}
    assert {n: p.version for n, p in at30.items()} == {n: p.version + 10
                                                       for n, p in at20.items()}


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_ctrl_c_writes_a_checkpoint_and_resume_goes_on_exactly(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """The first Ctrl-C stops the run at its next stop (every 10 steps here) with a
    checkpoint there; --resume then ends with the files of a run never interrupted. On Ray
    too: the actors are stopped, the local Ray with them, and the resume is exact."""
    import signal

    import paramserver.train.trainer as trainer

    ray = pytest.importorskip("ray") if backend == "ray" else None
    job = made[0]
    only_at_the_end = ("--set", "checkpoint_freq=0", "--set", "test_freq=0", "--backend",
                       backend)
    ws = tmp_path / "ws"  # the same path for both runs (checkpoints name their workspace)
    code, out = run(capsys, job, ws, "--steps", "30", "--quiet", *only_at_the_end)
    assert code == 0, out
    ws.rename(tmp_path / "straight")
    real = trainer.marker

    def ctrl_c_at_step_13(event: str, what: object = "") -> None:
        real(event, what)
        if event == "step" and what == 13:
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it

    monkeypatch.setattr(trainer, "marker", ctrl_c_at_step_13)
    ray_before = ray is not None and ray.is_initialized()
    code, out = run(capsys, job, ws, "--steps", "30", *only_at_the_end)
    assert code == 130
    if ray is not None:  # a local Ray the run started is gone with its actors (one that
        assert ray.is_initialized() == ray_before  # earlier tests started stays)
    assert "warning: interrupted: stopping at the next step boundary to write a checkpoint" \
           in out
    assert "warning: interrupted at step 20 of 30: --resume goes on from there" in out
    assert [s for s, _ in list_checkpoints(ws / "checkpoints")] == [20]
    assert (ws / "metrics.png").is_file()  # the plot of the 20 steps
    monkeypatch.setattr(trainer, "marker", real)
    code, out = run(capsys, job, ws, "--steps", "30", "--resume", "--quiet", *only_at_the_end)
    assert code == 0, out
    for name in (checkpoint_name(30), "metrics.csv"):
        sub = "checkpoints/" if name != "metrics.csv" else ""
        assert (ws / f"{sub}{name}").read_bytes() == (
            tmp_path / "straight" / f"{sub}{name}").read_bytes(), name
    assert (ws / "checkpoint" / "step30-worker0").read_bytes() == (
        tmp_path / "straight" / "checkpoint" / "step30-worker0").read_bytes()


def test_a_closed_stdout_stops_the_run_as_ctrl_c_does(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    """Issue 38: ``paramserver train job | grep -m1 "step 250"`` — the reader of stdout
    goes away. The run ended at once with status 0, no message and no checkpoint, and the
    next run was refused as "an earlier run". Now it stops at its next step boundary as on
    Ctrl-C: a checkpoint there, the reason on stderr, and --resume goes on exactly. Here in
    a fresh process, its stdout a real pipe that the reader closes after the line it wanted
    (the run would go on for 100,000 steps)."""
    import re
    import subprocess
    import sys

    job = tmp_path / "job.conf"
    job.write_text(JOB.replace(' workspace: "ws"', ""))
    ws = tmp_path / "ws"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "paramserver", "train", str(job),
                             "--workspace", str(ws), "--steps", "100000", "--no-tensorboard"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.startswith("step 10: test"):
            break  # as grep -m1 does: the reader has what it wanted, and goes away
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=600) == 141, err  # a shell's status of a command a pipe ended
    lines = err.splitlines()
    assert lines[0] == ("warning: stdout was closed (its reader went away): stopping at the "
                        "next step boundary to write a checkpoint"), err
    stop = re.fullmatch(r"warning: stopped at step (\d+) of 100000: --resume goes on from "
                        r"there", lines[1])
    assert stop is not None and len(lines) == 2, err  # and no traceback
    step = int(stop.group(1))
    assert step > 10 and step in {s for s, _ in list_checkpoints(ws / "checkpoints")}
    # --resume goes on from there, as if the run had not stopped
    code, out = run(capsys, job, ws, "--steps", str(step + 10), "--resume")
    assert code == 0 and f"(step {step})" in out, out
    code, out = run(capsys, job, tmp_path / "straight", "--steps", str(step + 10), "--quiet")
    assert code == 0, out
    for key, value in _values(tmp_path / "straight", step + 10).items():
        np.testing.assert_array_equal(_values(ws, step + 10)[key], value, err_msg=key)


@pytest.mark.parametrize(("change", "expected"), [
    (["--set", "updater.type=kAdam"],
     ": the run was trained by updater kSGD and this job's is kAdam, whose state cannot go on "
     "from kSGD's: resume with updater.type kSGD, as the run was trained, or start afresh with "
     "--overwrite (deleting that run's files) or in another --workspace; paramserver export "
     "and init { type: kFromFile } start a new run from its values"),
    (["--set", "name=other", "--set", "cluster.nservers_per_group=1"],  # another job's
     " is a checkpoint of job 'tiny', not of this job 'other': give this job a workspace of "
     "its own (--workspace DIR), or start it afresh here with --overwrite, deleting that "
     "job's run"),
    (["--set", "updater.momentum=0"],
     ": the updater's settings changed since the run was trained (momentum 0.9 → 0.0) and "
     "its state does not fit them: resume with the settings it was trained with, or start "
     "afresh with --overwrite (deleting that run's files) or in another --workspace"),
    (["--set", "cluster.nservers_per_group=1"],
     ": the run was trained with other servers (nservers_per_group 2 → 1), and its state is "
     "laid out by server: resume with the servers it was trained with, or start afresh with "
     "--overwrite (deleting that run's files) or in another --workspace"),
    (["--set", "neuralnet.layer[fc].innerproduct_conf.num_output=12"],
     ": the checkpoint's Params do not match the job's (was the net changed?): Param "
     "'fc_0' has 640 values in it and 768 in the job; resume with the net it was "
     "trained with, or start afresh with --overwrite (deleting that run's files) or in "
     "another --workspace"),
])
def test_a_resume_that_does_not_fit_says_what_changed_in_one_sentence(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], ws: Path,
        change: list[str], expected: str) -> None:
    """Issue 38: --resume after changing the updater, or in another job's workspace,
    printed a dozen of the loader's lines ('server/0/0/state/b1/history' is not state of
    this updater ...) instead of what changed and what to do."""
    before = snapshot(ws)
    code, err = run(capsys, made[0], ws, "--resume", "--steps", "30", "--quiet", *change)
    assert code == 2
    newest = ws / "checkpoints" / checkpoint_name(20)
    assert err.endswith(f"paramserver train: error: {newest}{expected}\n"), err
    assert err.count("\n") == 1, err  # one line (in the net's case, after the file's place)
    assert snapshot(ws) == before  # nothing changed


@pytest.mark.parametrize("case", ["no checkpoint", "an earlier run"])
def test_a_refused_start_is_refused_before_any_ray_actor(
        capsys: pytest.CaptureFixture[str], made: tuple[Path, Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """--resume with nothing to resume (a workspace whose run failed before its first
    checkpoint), or a new run in a workspace that holds one: refused (exit 2) before the
    net, the Params or any Ray actor is made, and nothing in the workspace changes."""
    from paramserver.cluster import ray_backend

    def no_actors(*args: object, **kw: object) -> None:
        raise AssertionError("the Ray backend was made")

    monkeypatch.setattr(ray_backend.RayBackend, "__init__", no_actors)
    ws = tmp_path / "ws"
    if case == "no checkpoint":
        ws.mkdir()
        (ws / "metrics.csv").write_text("step,phase\n")
        argv = ["--resume"]
    else:
        shutil.copytree(made[1], ws)
        argv = []
    before = snapshot(ws)
    code, out = run(capsys, made[0], ws, "--backend", "ray", *argv)
    assert code == 2, out
    assert ("cannot resume: no checkpoint in" if case == "no checkpoint"
            else "holds the results of an earlier run") in out, out
    assert snapshot(ws) == before
