"""paramserver beside Apache SINGA v0.2.0 on SINGA's own mnist jobs: CPU time per step, the
CPU time of start-up, and peak resident memory.

SINGA v0.2.0 is built from source by ``/work/shared/peers/singa/build.sh`` (it needs the
ZooKeeper ``zk.sh`` starts); give its folder with ``--singa`` (default ``$SINGA_HOME``, else
build.sh's ``${TMPDIR:-/tmp}/singa-peer/singa-v0.2.0``). Without it the SINGA columns
are skipped, with one line saying so, and paramserver is measured alone.

Both run SINGA's ``examples/mnist/job.conf`` (the 784-2500-2000-1500-1000-500-10 MLP) and
``conv.conf`` (LeNet) as released, with ``random_skip`` 0, no tests and no checkpoint but
the one both write at the end, on MNIST-shaped data (the digits resampled to 28x28 by
``paramserver data``) in a temporary folder. Each contender runs each job for ``--short``
and ``--long`` steps (four times as many for the MLP, five for LeNet) in its own
process; CPU time is the process's user + system time
(``wait4``), so that other load on the machine changes it little:

* CPU per step = (CPU(long) − CPU(short)) / (long − short): start-up cancels out;
* start-up CPU = CPU(short) − short · CPU per step (reading the job, building the net, and
  for paramserver importing torch, and numba where the job needs it);
* peak RSS: the process's maximum resident set (``ru_maxrss``), and for paramserver its own
  share two ways: less that of a process that only imports torch and numba (issue 36's
  measure), and less that of one that only imports torch (a job that never imports numba,
  as LeNet's, saves numba's import too; measured each round).

Contenders and jobs alternate round after round (``--rounds``, at least 5 for figures);
the table gives min / median / max and the load average.

    python benchmarks/singa_peer.py [--rounds 5] [--short 10] [--long 40] [--jobs mlp conv]
        [--before SRC]

``--before SRC`` adds an earlier paramserver as a third contender, run from the source folder
``SRC`` (e.g. ``git worktree add /tmp/before <commit>``, then ``/tmp/before/src``), in the
same rounds: the before and after of a change, measured side by side.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"mlp": ROOT / "examples" / "singa" / "mnist" / "job.conf",
        "conv": ROOT / "examples" / "singa" / "mnist" / "conv.conf"}
ZK_PORT = 21873
#: Steps of a job's runs, as multiples of --short and --long: their difference must
#: outweigh start-up's noise (~0.5 s) by far (the MLP's steps were 30 until 2026-11-29:
#: 2.7 s against that noise, ±18 % a round); LeNet's steps cost about a fifth of the MLP's.
SCALE = {"mlp": 4, "conv": 5}


@dataclass
class Run:
    cpu: float  # seconds, user + system
    rss_mb: float  # peak resident set


def run_process(argv: list[str], cwd: Path, env: dict[str, str]) -> Run:
    """Run ``argv`` to its end; its CPU time and peak resident memory (``wait4``)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n"
                           f"{err.decode(errors='replace')[-2000:]}")
    return Run(usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def job_text(job: str, steps: int, workspace: str) -> str:
    """SINGA's job file with ``steps`` training steps, no tests, no random skip, a display
    at the end only, and its workspace at ``workspace``."""
    text = JOBS[job].read_text()
    text = re.sub(r"train_steps:\s*\d+", f"train_steps: {steps}", text)
    text = re.sub(r"test_freq:\s*\d+", "test_freq: 0", text)
    text = re.sub(r"test_steps:\s*\d+", "test_steps: 0", text)
    text = re.sub(r"disp_freq:\s*\d+", f"disp_freq: {steps}", text)
    text = re.sub(r"random_skip:\s*\d+", "random_skip: 0", text)
    return text.replace('workspace: "examples/mnist"', f'workspace: "{workspace}"')


def zookeeper_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", ZK_PORT), timeout=2):
            return True
    except OSError:
        return False


class Contenders:
    def __init__(self, folder: Path, singa: Path | None):
        self.folder = folder
        self.singa = singa
        self.count = 0
        self.env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")

    def paramserver(self, job: str, steps: int, src: Path = ROOT / "src") -> Run:
        self.count += 1
        ws = f"examples/ps{self.count}"
        path = self.folder / f"ps{self.count}.conf"
        path.write_text(job_text(job, steps, ws))
        try:
            return run_process([sys.executable, "-m", "paramserver", "train", path.name,
                                "--quiet", "--no-tensorboard"], self.folder,
                               dict(self.env, PYTHONPATH=str(src)))
        finally:
            shutil.rmtree(self.folder / ws, ignore_errors=True)

    def singa_run(self, job: str, steps: int) -> Run:
        assert self.singa is not None
        self.count += 1
        ws = f"examples/singa{self.count}"
        (self.folder / ws).mkdir(parents=True)
        path = self.folder / f"singa{self.count}.conf"
        path.write_text(job_text(job, steps, ws))
        env = dict(self.env, SINGA_HOST_IP="127.0.0.1",
                   LD_LIBRARY_PATH=str(self.singa / ".libs"))
        # A job id of its own: ZooKeeper keeps an ended run's process registered for a while
        # (its session), and a second one of the same job would count it (SINGA's driver
        # takes -singa_job; singa-run.sh got a fresh id from singatool).
        argv = [str(self.singa / ".libs" / "singa"), "-conf", path.name, "-singa_conf",
                str(self.singa / "conf" / "singa.conf"), "-singa_job",
                str(os.getpid() % 10000 * 1000 + self.count)]
        try:
            return run_process(argv, self.folder, env)
        finally:
            shutil.rmtree(self.folder / ws, ignore_errors=True)

    def imports_only(self, modules: str = "torch, numba") -> Run:
        return run_process([sys.executable, "-c", f"import {modules}"], self.folder, self.env)


def spread(values: list[float], fmt: str) -> str:
    return (f"{fmt.format(min(values))} / {fmt.format(statistics.median(values))} / "
            f"{fmt.format(max(values))}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--short", type=int, default=10)
    p.add_argument("--long", type=int, default=40)
    p.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["mlp", "conv"])
    # build.sh's own default place (BASE=${TMPDIR:-/tmp}/singa-peer), unless SINGA_HOME says
    p.add_argument("--singa", type=Path, default=Path(os.environ.get("SINGA_HOME") or Path(
        os.environ.get("TMPDIR") or "/tmp") / "singa-peer" / "singa-v0.2.0"))
    p.add_argument("--before", type=Path, default=None,
                   help="the src folder of an earlier paramserver, measured beside this one")
    args = p.parse_args()
    singa: Path | None = args.singa
    if not (args.singa / ".libs" / "singa").is_file():
        print(f"SINGA v0.2.0 not built at {args.singa} (see /work/shared/peers/singa/"
              "build.sh): measuring paramserver alone")
        singa = None
    elif not zookeeper_up():
        print(f"no ZooKeeper on 127.0.0.1:{ZK_PORT} (SINGA v0.2.0 needs one: "
              "/work/shared/peers/singa/zk.sh): measuring paramserver alone")
        singa = None
    with tempfile.TemporaryDirectory(prefix="singa-peer-") as tmp:
        folder = Path(tmp)
        for split in ("train", "test"):
            subprocess.run([sys.executable, "-m", "paramserver", "data", "digits",
                            f"examples/mnist/{split}_data.bin", "--shape", "28,28",
                            "--split", split], cwd=folder, env=dict(os.environ, PYTHONPATH=str(
                                ROOT / "src")), check=True, stdout=subprocess.DEVNULL)
        c = Contenders(folder, singa)
        names = ["paramserver", *(["before"] if args.before else []),
                 *(["SINGA"] if singa else [])]
        runners = {"paramserver": c.paramserver, "SINGA": c.singa_run,
                   "before": lambda job, steps: c.paramserver(job, steps, args.before)}
        keys = [(j, n) for j in args.jobs for n in names]
        per_step: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
        startup: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
        rss: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
        base: list[float] = []
        torch_base: list[float] = []
        loads = []
        # One short run of each first, untimed: a first run compiles its kernels into the
        # cache (numba keys them by the source file's path, so a new source tree compiles
        # anew), which would count as start-up or, in the shorter run, make CPU per step < 0.
        for job in args.jobs:
            for name in names:
                runners[name](job, args.short * SCALE[job])
        for r in range(args.rounds):
            base.append(c.imports_only().rss_mb)
            torch_base.append(c.imports_only("torch").rss_mb)
            for job in args.jobs:
                for name in (names if r % 2 == 0 else names[::-1]):
                    runner = runners[name]
                    n_short, n_long = args.short * SCALE[job], args.long * SCALE[job]
                    short, long = runner(job, n_short), runner(job, n_long)
                    step = (long.cpu - short.cpu) / (n_long - n_short)
                    per_step[job, name].append(step)
                    startup[job, name].append(short.cpu - n_short * step)
                    rss[job, name].append(max(short.rss_mb, long.rss_mb))
                    print(f"round {r + 1} {job:4} {name:11} CPU/step {1000 * step:8.1f} ms  "
                          f"start-up {short.cpu - n_short * step:6.2f} s  "
                          f"peak RSS {rss[job, name][-1]:7.1f} MB", flush=True)
            loads.append(os.getloadavg()[0])
    print(f"\nimport torch, numba alone: peak RSS {spread(base, '{:.0f}')} MB; "
          f"import torch alone: {spread(torch_base, '{:.0f}')} MB")
    print(f"load average (1 min) during the rounds: {spread(loads, '{:.1f}')}\n")
    print("| job | contender | CPU per step, ms (min / median / max) | start-up CPU, s | "
          "peak RSS, MB | own RSS, MB (less torch, numba) | own RSS, MB (less torch) |")
    print("|---|---|---|---|---|---|---|")
    base_mb = statistics.median(base)
    torch_mb = statistics.median(torch_base)
    for job in args.jobs:
        for name in names:
            own, own_torch = ("", "") if name == "SINGA" else (
                spread([x - b for x in rss[job, name]], "{:.0f}") for b in (base_mb, torch_mb))
            print(f"| {job} | {name} | {spread([1000 * x for x in per_step[job, name]], '{:.1f}')}"
                  f" | {spread(startup[job, name], '{:.2f}')} | "
                  f"{spread(rss[job, name], '{:.0f}')} | {own} | {own_torch} |")
        for name in (n for n in names if singa and n != "SINGA"):
            ratio = (statistics.median(per_step[job, name])
                     / statistics.median(per_step[job, "SINGA"]))
            own_ratio, torch_ratio = ((statistics.median(rss[job, name]) - b)
                                      / statistics.median(rss[job, "SINGA"])
                                      for b in (base_mb, torch_mb))
            print(f"| {job} | {name} / SINGA | {ratio:.2f}x | | | {own_ratio:.2f}x | "
                  f"{torch_ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
