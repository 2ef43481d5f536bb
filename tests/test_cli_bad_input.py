"""The command line against bad input (issue 13): every mistake exits with status 2 and one
clear line naming the place (file:line, option or path), no traceback, and the workspace
as it was. Also a resume with nothing to do, which must change nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli import main
from paramserver.config.job import MAX_JOB_FILE_BYTES

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The exit code and what the command printed: reports (stdout), then warnings and
    errors (stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def snapshot(folder: Path) -> dict[str, object]:
    """Everything under ``folder`` that a run could change: kinds, bytes and times."""
    if not folder.exists():
        return {}
    out: dict[str, object] = {".": folder.stat().st_mtime_ns}
    for path in sorted(folder.rglob("*")):
        info = path.stat()
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(folder))] = (content, info.st_mtime_ns)
    return out


def assert_user_error(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for name in names:
        assert name in err, (name, err)


# -- the job file -------------------------------------------------------------------------------


def _job_case(tmp_path: Path, case: str) -> tuple[Path, str]:
    path = tmp_path / "job.conf"
    if case == "missing":
        return path, "No such file or directory"
    if case == "directory":
        path.mkdir()
        return path, "it is a folder"
    if case == "empty":
        path.write_text("  \n# nothing but a comment\n\n".replace("# nothing but a comment", ""))
        return path, "the job file is empty"
    if case == "binary":
        path.write_bytes(b"train_steps: 1\n\x89PNG\r\n\x1a\n\xff\xfe")
        return path, "job.conf:2: the job file is not UTF-8 text"
    if case == "nul":
        path.write_bytes(b"train_steps: 1\nneuralnet { }\n\x00\x00")
        return path, "job.conf:3: the job file is not text (it holds a NUL byte)"
    if case == "huge":
        with path.open("wb") as f:
            f.truncate(MAX_JOB_FILE_BYTES + 1024 * 1024)  # sparse: no disk needed
        return path, "the job file is 17.0 MiB; job files of more than 16 MiB are refused"
    if case == "syntax":
        path.write_text("train_steps: 1\nupdater { momentum 0.9 ]\n")
        return path, "job.conf:2:"
    raise AssertionError(case)


JOB_CASES = ["missing", "directory", "empty", "binary", "nul", "huge", "syntax"]


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("case", JOB_CASES)
def test_bad_job_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str,
                      command: str) -> None:
    path, expected = _job_case(tmp_path, case)
    ws = tmp_path / "ws"
    extra = ["--workspace", str(ws), "--quiet"] if command == "train" else []
    code, err = run(capsys, command, str(path), *extra)
    assert_user_error(code, err, expected, "job.conf")
    assert not ws.exists()


def test_unreadable_job_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.conf"
    path.write_text(MLP.read_text())
    path.chmod(0)
    try:
        if os.geteuid() != 0:
            code, err = run(capsys, "check", str(path))
        elif shutil.which("setpriv") and os.access(sys.executable, os.X_OK):
            # root reads anything: another user tries (if it may run this Python at all)
            proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups", sys.executable, "-m", "paramserver",
                                   "check", str(path)], capture_output=True, text=True,
                                  timeout=120, env={**os.environ, "HOME": "/nonexistent"})
            if "Permission denied" in proc.stderr and "job.conf" not in proc.stderr:
                pytest.skip("the user nobody may not run this Python")
            code, err = proc.returncode, proc.stderr
        else:
            pytest.skip("as root, a file cannot be made unreadable without setpriv")
    finally:
        path.chmod(0o644)
    assert_user_error(code, err, "job.conf: cannot read the job file")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_job_file_that_is_not_a_regular_file_does_not_hang(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = tmp_path / "job.conf"
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    else:
        path = Path("/dev/zero")  # reading it would never end
        if not path.exists():
            pytest.skip("no /dev/zero")
    proc = subprocess.run([sys.executable, "-m", "paramserver", "check", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert_user_error(proc.returncode, proc.stderr, f"{path}: cannot read the job file: it "
                                                    "is not a regular file")


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "expected"), [
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    (["--steps", "1.5"], "argument --steps: invalid int value: '1.5'"),
    (["--steps", "-3"], "paramserver train: error: --steps -3: value -3 for Parameter "
                        "train_steps should be greater equal to 0\n"),
    (["--steps", str(10**30)], f"error: --steps {10**30}: Invalid Parameter format for "
                               "train_steps expect int"),
    (["--seed", "-1"], "error: --seed -1: value -1 for Parameter seed should be greater "
                       "equal to 0"),
    (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["--seed", str(2**64)], f"error: --seed {2**64}: Invalid Parameter format for seed"),
    (["--backend", "mpi"], "argument --backend: invalid choice: 'mpi'"),
    (["--steps"], "argument --steps: expected one argument"),
])
def test_bad_option(capsys: pytest.CaptureFixture[str], tmp_path: Path, options: list[str],
                    expected: str) -> None:
    ws = tmp_path / "ws"
    try:
        code, err = run(capsys, "train", str(MLP), "--workspace", str(ws), "--quiet", *options)
    except SystemExit as e:  # argparse's own errors exit from main
        code, err = int(str(e.code)), capsys.readouterr().err
    assert_user_error(code, err, expected)
    assert not ws.exists()


# -- the workspace (row 3) ----------------------------------------------------------------------


def _workspace_case(tmp_path: Path, case: str) -> tuple[Path, str]:
    ws = tmp_path / "ws"
    if case == "a file":
        ws.write_text("x")
        return ws, f"workspace {ws} is a file, not a folder"
    if case == "under a file":
        ws.write_text("x")
        return ws / "deeper" / "run", f"cannot be made, {ws} is a file"
    ws.mkdir()
    if case == "checkpoints is a file":
        (ws / "checkpoints").write_text("x")
        return ws, f"{ws / 'checkpoints'} should be a folder, but is a file"
    if case == "metrics.png is a folder":
        (ws / "metrics.png").mkdir()
        return ws, f"{ws / 'metrics.png'} should be a file, but is a folder"
    if case == "metrics.csv is a folder":
        (ws / "metrics.csv").mkdir()
        return ws, f"{ws / 'metrics.csv'} should be a file, but is a folder"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["a file", "under a file", "checkpoints is a file",
                                  "metrics.png is a folder", "metrics.csv is a folder"])
def test_bad_workspace_is_refused_before_training(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path, case: str) -> None:
    ws, expected = _workspace_case(tmp_path, case)
    before = snapshot(tmp_path)
    code, err = run(capsys, "train", str(MLP), "--workspace", str(ws))
    assert_user_error(code, err, expected)
    assert "step " not in err  # refused before the first step, not after it
    assert snapshot(tmp_path) == before


def test_workspace_that_is_not_writable(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    if os.geteuid() == 0:
        # root writes anywhere but on a read-only mount; /proc is one everywhere
        ws = Path("/proc/paramserver-ws")
        expected = "workspace /proc/paramserver-ws: /proc is not writable"
    else:
        ws.chmod(0o555)
        expected = f"workspace {ws}: the folder is not writable"
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", str(MLP),
                           "--workspace", str(ws), "--quiet"], capture_output=True, text=True,
                          timeout=300)
    assert_user_error(proc.returncode, proc.stderr, expected)


# -- --import of a module that fails (row 5) ----------------------------------------------------


@pytest.mark.parametrize(("source", "expected"), [
    ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom (MOD.py:2)"),
    ("def f(:\n    pass\n", "SyntaxError: invalid syntax (MOD.py:1:7)"),
    ("import json\njson.loads('{')\n", "JSONDecodeError: Expecting property name enclosed in "
                                       "double quotes: line 1 column 2 (char 1) (MOD.py:2)"),
    ("import no_such_dependency_xyz\n",
     "ModuleNotFoundError: No module named 'no_such_dependency_xyz' (MOD.py:1)"),
    ("from paramserver import Parameter, field\nclass C(Parameter):\n    x = field(1)\n",
     "ParamError: C.x: a field needs a type annotation (x: int = field(...)) (MOD.py:2)"),
])
def test_import_of_a_failing_module(tmp_path: Path, source: str, expected: str) -> None:
    module = f"user_mod_{abs(hash(source)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(source)
    proc = subprocess.run([sys.executable, "-m", "paramserver", "--import", module, "check",
                           str(MLP)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(tmp_path), *sys.path])})
    line = expected.replace("MOD.py", str(tmp_path / f"{module}.py"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"paramserver check: error: --import {module}: {line}\n"


# -- resume: damaged metrics (row 4) and nothing to do (row 1) ----------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace after 12 steps of the example (12: not a multiple of disp_freq 100)."""
    ws = tmp_path_factory.mktemp("trained") / "ws"
    assert main(["train", str(MLP), "--steps", "12", "--workspace", str(ws), "--quiet"]) == 0
    return ws


def test_resume_with_nothing_to_do_changes_nothing(capsys: pytest.CaptureFixture[str],
                                                   trained: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    rows = (ws / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]] == [["12", "train"], ["12", "test"]]
    before = snapshot(ws)
    code, err = run(capsys, "train", str(MLP), "--steps", "12", "--workspace", str(ws),
                    "--resume")
    assert code == 0 and "nothing to do: the job is at step 12 of 12" in err
    assert snapshot(ws) == before  # the last rows were deleted before


def test_resume_further_keeps_the_rows_of_the_earlier_end(
        capsys: pytest.CaptureFixture[str], trained: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    code, _ = run(capsys, "train", str(MLP), "--steps", "15", "--workspace", str(ws),
                  "--resume", "--quiet")
    assert code == 0
    rows = (ws / "metrics.csv").read_text().splitlines()
    # A straight run to 15 has no rows at 12 (neither a display nor a test step), but the
    # earlier run ended there, with a test that TensorBoard keeps too (issue 38).
    assert [r.split(",")[:2] for r in rows[1:]] == [["12", "train"], ["12", "test"],
                                                    ["15", "train"], ["15", "test"]]


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda t: t.replace("step,phase", "stp,phase"), "metrics.csv:1: the metrics file does "
                                                     "not start with the header"),
    (lambda t: t.replace(",train,", ",train,x,"), "metrics.csv:2: expected 5 values"),
    (lambda t: t.replace("12,train", "twelve,train"), "metrics.csv:2: step 'twelve' is not"),
    (lambda t: t.replace("12,test", "12,tset"),
     "metrics.csv:3: phase 'tset' is not one of train, val, test"),
    (lambda t: t.replace("12,test,", "12,test,nope"), "metrics.csv:3: loss 'nope"),
    (lambda t: "", "metrics.csv:1: the metrics file does not start with the header"),
    (lambda t: t[: len(t) // 2], "metrics.csv:2:"),
])
def test_damaged_metrics_are_refused_on_resume(capsys: pytest.CaptureFixture[str],
                                               trained: Path, tmp_path: Path, damage: object,
                                               expected: str) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    metrics = ws / "metrics.csv"
    metrics.write_text(damage(metrics.read_text()))  # type: ignore[operator]
    before = snapshot(ws)
    code, err = run(capsys, "train", str(MLP), "--steps", "20", "--workspace", str(ws),
                    "--resume", "--quiet")
    assert_user_error(code, err, expected, str(metrics))
    assert snapshot(ws) == before


def test_metrics_that_are_not_text(capsys: pytest.CaptureFixture[str], trained: Path,
                                   tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(trained, ws)
    (ws / "metrics.csv").write_bytes(b"\xff\xfe\x00garbage")
    code, err = run(capsys, "train", str(MLP), "--steps", "20", "--workspace", str(ws),
                    "--resume", "--quiet")
    assert_user_error(code, err, f"{ws / 'metrics.csv'}: cannot read the metrics of the run")


# -- a model larger than the machine (row 8) ----------------------------------------------------


def test_model_that_does_not_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "big.conf"
    job.write_text(MLP.read_text().replace("num_output: 128", "num_output: 2147483648"))
    code = main(["check", str(job)])
    out, err = capsys.readouterr()
    assert code == 0, err  # checked without allocating the model
    assert "161,061,273,610 values" in out
    ws = tmp_path / "ws"
    code, err = run(capsys, "train", str(job), "--workspace", str(ws), "--quiet")
    assert_user_error(code, err, "the model does not fit in memory: its Params hold "
                                 "161,061,273,610 values", "'w1' 2147483648x64")
    assert not ws.exists()


def test_data_file_name_too_long_is_a_user_error(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    """Found by benchmarks/fuzz_jobs.py: a data source whose name is longer than the system
    allows ended ``failed: ... File name too long`` with exit 1 (pathlib's is_dir raises
    ENAMETOOLONG): it is the job's mistake, named at its place."""
    text = MLP.read_text().replace('source: "digits"', f'source: "{"a" * 300}.npz"', 1)
    assert text != MLP.read_text()
    path = tmp_path / "job.conf"
    path.write_text(text)
    code, err = run(capsys, "check", str(path))
    assert code == 2 and "job.conf:" in err and "layer 'data' (kData): data file" in err, err


@pytest.mark.parametrize("argv", [["check", "LONG.conf"], ["export", "LONG", "--to", "x.st"],
                                  ["data", "digits", "LONG.npz"]])
def test_paths_too_long_are_user_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        argv: list[str]) -> None:
    """A name longer than the system allows (ENAMETOOLONG, which pathlib's is_file and
    is_dir raise) is the user's mistake: exit 2 with the name, and nothing written."""
    monkeypatch.chdir(tmp_path)
    long = "a" * 300
    code, err = run(capsys, *[a.replace("LONG", long) for a in argv])
    assert_user_error(code, err, "File name too long", "a" * 80)
    assert len(err.splitlines()) == 1 and len(err) < 1000
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", ""])
def test_a_job_name_that_is_not_one_folder_name_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        name: str) -> None:
    """The default workspace is workspace/<name>: a name of '../../escape' put the run's
    checkpoints and metrics two folders above it. Refused, unless a workspace is given."""
    (tmp_path / "in").mkdir()
    monkeypatch.chdir(tmp_path / "in")
    job = tmp_path / "in" / "job.conf"
    job.write_text(MLP.read_text().replace('name: "digits-mlp"', f'name: "{name}"', 1))
    for command in ("check", "train"):
        code, err = run(capsys, command, str(job), *(["--steps", "1", "--quiet"]
                                                      if command == "train" else []))
        assert_user_error(code, err, f"name {name!r}: the job's workspace is workspace/<name>")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["in", "job.conf"]
    code, _ = run(capsys, "train", str(job), "--steps", "1", "--quiet", "--workspace", "ws")
    assert code == 0 and (tmp_path / "in" / "ws" / "metrics.csv").is_file()
