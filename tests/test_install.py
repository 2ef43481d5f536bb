"""An install that works for everyone (issue 13, row 6): paramserver pip-installed into a
fresh virtual environment owned by root, then ``paramserver train`` run by another user
(nobody) with no HOME, so that neither the install's ``__pycache__`` nor a home cache is
writable. numba used to refuse to compile: ``cannot cache function '_philox_block': no
locator available``.

Runs where it can: as root, with ``setpriv`` and a Python interpreter that the other user
may run (the test looks for one of this Python's version); skipped elsewhere, saying why.
The dependencies are not downloaded: the fresh environment reads them from this one's
site-packages (a ``.pth`` line), and the wheel of paramserver is built from this checkout.
The first run compiles every kernel for the other user (half a minute on two cores); they
are cached for it after that, in its own folder under the temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "-i",
             "PATH=/usr/bin:/bin", "LANG=C.UTF-8"]


def _runs_as_nobody(python: str) -> bool:
    probe = subprocess.run([*AS_NOBODY, python, "-c", "import sys"], capture_output=True,
                           timeout=60)
    return probe.returncode == 0


def _python_for_nobody() -> str | None:
    candidates = [sys.executable, os.path.realpath(sys.executable),
                  *(shutil.which(VERSION, path=p) or "" for p in ("/usr/bin", "/usr/local/bin"))]
    return next((c for c in candidates if c and _runs_as_nobody(c)), None)


def _skip_reason() -> str | None:
    if sys.platform != "linux" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root on Linux, to run a command as another user"
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux)"
    if _python_for_nobody() is None:
        return f"no {VERSION} interpreter that the user nobody may run"
    return None


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A folder the other user can reach (pytest's own are root's alone)."""
    with tempfile.TemporaryDirectory(prefix="paramserver-install-") as folder:
        path = Path(folder)
        path.chmod(0o755)  # root's, readable by all, writable by root alone
        yield path


@pytest.fixture(scope="module")
def wheels(base: Path) -> Path:
    """The wheel of paramserver, built from this checkout as a release is (the examples
    copied in by setup.py)."""
    pkg, wheels = base / "pkg", base / "wheels"
    pkg.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in"):
        shutil.copy(ROOT / name, pkg / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "src", pkg / "src", ignore=ignore)
    shutil.copytree(ROOT / "examples", pkg / "examples", ignore=ignore)
    shutil.copytree(ROOT / "docs", pkg / "docs", ignore=ignore)
    (pkg / "tests" / "data" / "singa").mkdir(parents=True)
    for name in ("LICENSE", "NOTICE"):
        shutil.copy(ROOT / "tests" / "data" / "singa" / name, pkg / "tests" / "data" / "singa")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(pkg)], check=True,
                   timeout=300)
    return wheels


def make_venv(venv: Path, wheels: Path, python: str = sys.executable,
              hidden: tuple[str, ...] = ()) -> Path:
    """A fresh virtual environment with paramserver's wheel installed; its dependencies
    read from this environment's site-packages (a ``.pth`` line: nothing is downloaded),
    but for the packages ``hidden`` (top-level names), which are then not installed there:
    it reads a folder of links to everything else."""
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = Path(sysconfig.get_paths()["purelib"])
    if hidden:
        shown = venv / "deps"
        shown.mkdir()
        for entry in deps.iterdir():
            if re.split(r"[-.]", entry.name)[0] not in hidden:
                (shown / entry.name).symlink_to(entry)
        deps = shown
    (site / "deps.pth").write_text(f"{deps}\n")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], check=True, timeout=300)
    return venv


#: What this environment has beyond the base install and torch: the extras examples and
#: ray, and the development tools (top-level names, and the names of their distributions).
NOT_IN_THE_BASE_INSTALL = ("sklearn", "scikit_learn", "matplotlib", "mpl_toolkits", "pylab",
                           "PIL", "pillow",
                           "ray", "tensorboard", "tensorboard_data_server", "scipy",
                           "hypothesis", "pytest", "_pytest", "deepspeed")


@pytest.fixture(scope="module")
def installed(base: Path, wheels: Path) -> Path:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    python = _python_for_nobody()
    assert python is not None
    return make_venv(base / "venv", wheels, python)


def test_the_wheel_alone_runs_the_main_job_from_an_empty_folder(base: Path, wheels: Path,
                                                              tmp_path: Path) -> None:
    """Issue 26: from an installed wheel, the README's `paramserver train
    examples/digits_mlp.conf` failed in another folder (the examples were not in the
    wheel), and the digits needed scikit-learn. Only the base install and torch here."""
    venv = make_venv(base / "base-venv", wheels, hidden=NOT_IN_THE_BASE_INSTALL)
    command = str(venv / "bin" / "paramserver")
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)),
           "LANG": "C.UTF-8", "OMP_WAIT_POLICY": "PASSIVE"}
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import paramserver, importlib.util as u; print(paramserver.__file__,"
                            " u.find_spec('sklearn'), u.find_spec('PIL'))"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert probe.stdout.startswith(str(venv)) and probe.stdout.split()[1:] == ["None", "None"], \
        probe.stdout + probe.stderr  # the install, without the extras
    proc = subprocess.run([command, "train", "examples/digits_mlp.conf"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("examples/digits_mlp.conf: paramserver's example "
                                  f"{venv}/"), proc.stdout[:300]
    assert "step 1500: test loss" in proc.stdout and "Traceback" not in proc.stderr
    # the one thing the base install lacks, said with what to do
    assert proc.stderr == ("warning: no metrics.png: Pillow is not installed (pip install "
                           "'paramserver[examples]')\n")
    ws = tmp_path / "workspace" / "digits-mlp"
    accuracy = float((ws / "metrics.csv").read_text().splitlines()[-1].split(",")[3])
    assert accuracy > 0.9  # the README's "about 97 %"
    assert sorted(p.name for p in (ws / "checkpoints").iterdir()) == [
        "step-00000500.ckpt.safetensors", "step-00001000.ckpt.safetensors",
        "step-00001500.ckpt.safetensors"]
    # the short name, and SINGA's files, their licence beside them
    again = subprocess.run([command, "check", "singa/mnist/conv"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "paramserver data" in again.stderr, again.stderr
    # Issue 38: the message sent the user to docs/singa.md, which the wheel did not hold;
    # it names the document where the install has it.
    site = next(venv.glob("lib/python*/site-packages"))
    doc = re.search(r"see (\S+singa\.md)\)", again.stderr)
    assert doc is not None and Path(doc.group(1)) == site / "paramserver" / "docs" / \
        "singa.md", again.stderr
    assert Path(doc.group(1)).is_file()
    helped = subprocess.run([command, "train", "--help"], cwd=tmp_path,
                            env={**env, "COLUMNS": "1000"},  # a path on one line
                            capture_output=True, text=True, timeout=300)
    named = re.findall(r"(/\S+\.md)", helped.stdout)
    assert named and all(Path(name).is_file() for name in named), helped.stdout
    assert (venv / next(venv.glob("lib/python*/site-packages")).relative_to(venv) /
            "paramserver" / "examples" / "singa" / "LICENSE").is_file()


def test_train_as_another_user_without_home(installed: Path, base: Path) -> None:
    venv = installed
    tmp_path = base / "run"
    tmp_path.mkdir()
    where = subprocess.run([*AS_NOBODY, str(venv / "bin" / "python"), "-c",
                            "import paramserver; print(paramserver.__file__)"],
                           capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the install
    tmp_path.chmod(0o777)
    job = tmp_path / "job.conf"
    job.write_text((ROOT / "examples" / "digits_mlp.conf").read_text())
    proc = subprocess.run([*AS_NOBODY, f"MPLCONFIGDIR={tmp_path}",
                           str(venv / "bin" / "paramserver"), "train", str(job), "--steps",
                           "20", "--workspace", str(tmp_path / "ws"), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = (tmp_path / "ws" / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,phase,loss,accuracy,lr" and rows[-1].startswith("20,test,")
    assert (tmp_path / "ws" / "checkpoints").is_dir()
    # The install stayed as it was: nothing written into it by the other user.
    assert not list(venv.rglob("*.nbi"))
