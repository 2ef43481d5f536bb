"""Checkpoints a returning user's workspace holds but may not read, and a disk that filled up
before the first one, in fresh processes of the command (issue 38, item 8):

- a checkpoint this user may not read (another user's, mode 0600) is not a damaged one: the
  run refuses, exit 2, naming the file and the permission; it is never renamed ``.damaged``
  and the run never goes on from an older checkpoint instead; once readable, ``--resume``
  goes on from it;
- a ``checkpoints/`` folder this user may not read: exit 2 naming it (``train --resume``,
  ``train``, ``export``);
- a full disk before the first checkpoint: the message names the command that starts again,
  ``--resume-or-start``, and that command does.

Root reads every file: as root, the runs here drop the capabilities that let root pass over
a file's permissions (``setpriv --bounding-set``), so that permissions apply as to any user.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"
NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _as_user() -> list[str]:
    """The prefix that runs a command as a user whom a file's permissions bind."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("as root, permissions bind only without root's capabilities (setpriv)")
    probe = subprocess.run([*NO_OVERRIDE, "true"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"setpriv may not drop capabilities here: {probe.stderr.decode()[-200:]}")
    return NO_OVERRIDE


def _env(cwd: Path) -> dict[str, str]:
    (cwd / "home").mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(cwd / "home"),
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _paramserver(cwd: Path, *argv: str, prefix: tuple[str, ...] = (),
                 file_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def small_files() -> None:
        assert file_limit is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.run([*prefix, sys.executable, "-m", "paramserver", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=_env(cwd),
                          preexec_fn=small_files if file_limit is not None else None)


def _train(cwd: Path, steps: int, *args: str, prefix: tuple[str, ...] = (),
           file_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    return _paramserver(cwd, "train", str(MLP), "--steps", str(steps), "--set",
                        "checkpoint_freq=2", "--set", "test_freq=0", "--set", "disp_freq=1",
                        "--workspace", "ws", *args, prefix=prefix, file_limit=file_limit)


def _refused(run: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b""
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    run = _train(folder, 4, "--quiet")
    assert run.returncode == 0, run.stderr
    return folder / "ws"


@pytest.fixture
def trained(trained_once: Path, tmp_path: Path) -> Path:
    """A workspace (tmp_path/ws) with the checkpoints of steps 2 and 4."""
    shutil.copytree(trained_once, tmp_path / "ws")
    return tmp_path / "ws"


def test_a_checkpoint_this_user_may_not_read_is_refused_not_set_aside(trained: Path) -> None:
    prefix = tuple(_as_user())
    cwd = trained.parent
    newest = trained / "checkpoints" / "step-00000004.ckpt.safetensors"
    if os.geteuid() == 0:
        os.chown(newest, 65534, 65534)  # another user's (nobody's)
    newest.chmod(0o600 if os.geteuid() == 0 else 0)
    before = _listing(trained) if os.geteuid() == 0 else None
    try:
        run = _train(cwd, 6, "--resume", prefix=prefix)
        _refused(run, f"checkpoint ws/checkpoints/{newest.name} cannot be read",
                 "Permission denied", "not damaged")
        assert sorted(p.name for p in newest.parent.iterdir()) == [
            "step-00000002.ckpt.safetensors", newest.name]  # not renamed, no step 6
        if before is not None:
            assert _listing(trained) == before  # nothing changed
    finally:
        newest.chmod(0o644)
    again = _train(cwd, 6, "--resume", prefix=prefix)  # readable now: goes on from it
    assert again.returncode == 0, again.stderr
    assert f"resuming from ws/checkpoints/{newest.name} (step 4)" in again.stdout


@pytest.mark.parametrize("mode", [0o000, 0o300])
def test_a_checkpoints_folder_this_user_may_not_read(trained: Path, mode: int) -> None:
    prefix = tuple(_as_user())
    cwd = trained.parent
    folder = trained / "checkpoints"
    folder.chmod(mode)
    try:
        runs = [_train(cwd, 6, "--resume", prefix=prefix),
                _train(cwd, 6, "--overwrite", prefix=prefix),
                _paramserver(cwd, "export", "ws/checkpoints", "--to", "model.safetensors",
                             prefix=prefix)]
    finally:
        folder.chmod(0o755)
    for run in runs:
        _refused(run, "ws/checkpoints", "cannot be read", "Permission denied",
                 f"mode {mode:04o}")
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-00000002.ckpt.safetensors", "step-00000004.ckpt.safetensors"]
    assert not (cwd / "model.safetensors").exists()


def test_a_full_disk_before_the_first_checkpoint_names_the_command_that_starts_again(
        tmp_path: Path) -> None:
    full = _train(tmp_path, 4, "--quiet", file_limit=1000)  # nothing of 1000 bytes fits
    assert full.returncode == 1, full.stderr
    assert "Traceback" not in full.stderr
    [line] = full.stderr.strip().splitlines()
    assert "the run stopped; no checkpoint was written before it" in line, line
    assert "--resume-or-start in ws starts from the beginning" in line, line
    assert not (tmp_path / "ws" / "checkpoints").exists() or not any(
        (tmp_path / "ws" / "checkpoints").iterdir())
    again = _train(tmp_path, 4, "--quiet", "--resume-or-start")  # the command it names
    assert again.returncode == 0, again.stderr
    straight = tmp_path / "straight"
    straight.mkdir()
    assert _train(straight, 4, "--quiet").returncode == 0
    assert (tmp_path / "ws" / "metrics.csv").read_bytes() == (
        straight / "ws" / "metrics.csv").read_bytes()
    assert sorted(p.name for p in (tmp_path / "ws" / "checkpoints").iterdir()) == sorted(
        p.name for p in (straight / "ws" / "checkpoints").iterdir())
