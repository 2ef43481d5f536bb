"""The kernel cache after what a returning user's machine does to it, in fresh processes
(issue 38, item 8):

- one damaged index file (``.nbi``: empty, cut short, garbage) is as good as a missing one:
  the next process compiles that kernel anew and writes the index again whole, and the one
  after it loads the kernel -- through a kernel of one's own and through ``paramserver
  train`` -- instead of every later run failing on ``EOFError`` or ``UnpicklingError``;
- when ``paramserver-numba-<uid>`` under the temporary folder is another user's (or a link,
  or a folder others may write), every process finds the same folder of this user's own
  instead, and leaves no other folder behind; when every such name is taken, each process
  uses a folder of its own and removes it when it exits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"
DAMAGE = {
    "empty": lambda data: b"",
    "cut short": lambda data: data[: len(data) // 2],
    "garbage": lambda data: bytes(range(256)) * 4,
}

#: A kernel of one's own, cached by paramserver: prints where the cache is and whether the
#: kernel was loaded from it or compiled.
SCRIPT = """
import json, sys
import numpy as np
import paramserver.numerics.cache as nc

@nc.njit(cache=True)
def scaled(x, k):
    return x * k

out = scaled(np.arange(3.0), 2.0)
print(json.dumps({"cache": nc.CACHE_DIR, "result": out.tolist(),
                  "hits": sum(scaled.stats.cache_hits.values()),
                  "misses": sum(scaled.stats.cache_misses.values())}))
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "TMPDIR")}
    return {**env, "HOME": str(home), "NUMBA_NUM_THREADS": "2",
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""), **extra}


def _kernel(folder: Path, **env: str) -> dict[str, object]:
    """Run the script in a fresh process, in ``folder`` (where it is written)."""
    script = folder / "kernel_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True,
                          text=True, timeout=600, env=_env(folder, **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    found: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    assert found["result"] == [0.0, 2.0, 4.0]
    return found


# -- a damaged index --------------------------------------------------------------------------


def _damage(index: Path, kind: str) -> None:
    index.write_bytes(DAMAGE[kind](index.read_bytes()))


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_index_is_compiled_anew_and_heals(tmp_path: Path, kind: str) -> None:
    cache = tmp_path / "cache"
    first = _kernel(tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert (first["hits"], first["misses"]) == (0, 1)
    [index] = Path(str(first["cache"])).glob("kernel_script.scaled-*.nbi")
    _damage(index, kind)
    again = _kernel(tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert (again["hits"], again["misses"]) == (0, 1)  # compiled anew, not failed
    healed = _kernel(tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert (healed["hits"], healed["misses"]) == (1, 0)  # the index was written again
    assert not [p.name for p in index.parent.iterdir() if ".tmp." in p.name]


@pytest.fixture(scope="module")
def trained_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernels of a run of the example job, compiled into an empty cache by the command."""
    folder = tmp_path_factory.mktemp("trained")
    cache = folder / "cache"
    proc = _train(folder, cache, "ws")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cache


def _train(cwd: Path, cache: Path, ws: str) -> subprocess.CompletedProcess[str]:
    # NUMBA_DEBUG_CACHE: numba says what it loads and saves ("[cache] data saved to ...")
    return subprocess.run([sys.executable, "-m", "paramserver", "train", str(MLP), "--steps",
                           "2", "--workspace", ws, "--quiet"], cwd=cwd, capture_output=True,
                          text=True, timeout=600,
                          env=_env(cwd, NUMBA_CACHE_DIR=str(cache), NUMBA_DEBUG_CACHE="1"))


def test_a_run_after_indexes_were_damaged_heals_them(trained_cache: Path, tmp_path: Path
                                                     ) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(trained_cache, cache)
    # the update kernel's index, and two of the random fills', each damaged its own way
    indexes = [*sorted(cache.rglob("fused.*.nbi")), *sorted(cache.rglob("rng_kernels.*.nbi"))]
    damaged = dict(zip(DAMAGE, indexes))
    assert len(damaged) == len(DAMAGE) and "rng_kernels" not in damaged["empty"].name
    for kind, index in damaged.items():
        _damage(index, kind)
    run = _train(tmp_path, cache, "ws1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "EOFError" not in run.stderr, run.stderr
    saved = [line for line in run.stdout.splitlines() if "[cache] data saved" in line]
    assert {Path(line.split("'")[1]).name.split("-")[0] for line in saved} == {
        index.name.split("-")[0] for index in damaged.values()}  # only those compiled anew
    again = _train(tmp_path, cache, "ws2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[cache] data saved" not in again.stdout  # everything loaded: healed
    assert (tmp_path / "ws1" / "metrics.csv").read_bytes() == (
        tmp_path / "ws2" / "metrics.csv").read_bytes()


# -- the temporary folder's name held by another user -------------------------------------------


def _squat(folder: Path) -> None:
    """Make ``folder`` a folder this user must not use: another user's where this is root,
    else one that every user may write."""
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)  # nobody's
        folder.chmod(0o700)
    else:
        folder.chmod(0o777)


def _no_home(tmp: Path) -> dict[str, str]:
    return {"HOME": "", "TMPDIR": str(tmp)}


def test_a_name_held_by_another_user_gives_one_folder_for_every_process(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    held = tmp / f"paramserver-numba-{os.getuid()}"
    _squat(held)
    runs = []
    for n in range(2):
        where = tmp_path / f"run{n}"
        where.mkdir()
        runs.append(_kernel(where, **_no_home(tmp)))
    ours = tmp / f"paramserver-numba-{os.getuid()}-1"
    assert [Path(str(r["cache"])).parent for r in runs] == [ours, ours]
    assert [(r["hits"], r["misses"]) for r in runs] == [(0, 1), (1, 0)]  # reused
    assert sorted(tmp.iterdir()) == [held, ours]  # nothing else left behind
    assert (ours.stat().st_mode & 0o777, ours.stat().st_uid) == (0o700, os.getuid())
    assert not any(held.iterdir())


def test_every_name_held_leaves_nothing_behind(tmp_path: Path) -> None:
    import paramserver.numerics.cache as nc

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    held = [tmp / (f"paramserver-numba-{os.getuid()}" + (f"-{n}" if n else ""))
            for n in range(nc.PRIVATE_NAMES)]
    for folder in held:
        _squat(folder)
    runs = [_kernel(tmp_path, **_no_home(tmp)) for _ in range(2)]
    assert all((r["hits"], r["misses"]) == (0, 1) for r in runs)  # cached in each process
    assert runs[0]["cache"] != runs[1]["cache"]
    assert sorted(tmp.iterdir()) == sorted(held)  # each removed its own at exit
