"""A new user's first minutes: ``paramserver check``, and ``paramserver train`` cold and warm.

    python benchmarks/first_run.py [--rounds 5] [--job examples/digits_mlp.conf] [--source DIR]...

Each round runs, in fresh processes and in this order: ``paramserver check JOB`` (with an
empty kernel cache of its own, as a new user's first command); ``train`` *cold*, with an
empty kernel cache of its own (``NUMBA_CACHE_DIR`` a new temporary folder:
every kernel the job uses is compiled); ``train`` *warm*, with the cache the cold run filled
(every kernel loaded). Printed, as min / median / max over the rounds with the load average:

- the wall time of ``check`` (target: at most 1.0 s, median);
- the wall time of each ``train``, and a warm run's cost beyond its own steps and tests (its
  wall time less the seconds its last message gives for training steps and tests: imports,
  building the net and the cluster, checkpoints, the plot; target: at most 2 s);
- the first-use cost (cold less warm, per round; target: at most 4 s), and what the cold run
  compiled, with the seconds its messages give for each kind;
- beside each wall time, the CPU time of the command (user and system): on a machine that
  others load, it moves less than the wall time.

``--source`` measures another tree of paramserver's sources (e.g. an earlier commit's,
``git archive``'d; its ``src`` goes first on ``PYTHONPATH``); given several times, the trees
take turns in every round.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, load_average, rounds_arg

ROOT = Path(__file__).resolve().parents[1]
DONE = re.compile(r"done: \d+ steps in [\d.]+ s \(training ([\d.]+) s, tests ([\d.]+) s\)")
COMPILED = re.compile(r"compiled (.+) in ([\d.]+) s")


def command(source: Path, cache: str, *argv: str) -> tuple[float, float, str]:
    """Wall seconds and CPU seconds (user and system, of the process and its children) of
    ``paramserver ARGV`` in a fresh process, and its messages (stdout, then stderr: the
    run's reports go to stdout since issue 26, its warnings to stderr)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache,
           "PYTHONPATH": os.pathsep.join([str(source / "src"), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "paramserver", *argv], env=env,
                         capture_output=True, text=True, cwd=source)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode:
        raise SystemExit(f"paramserver {' '.join(argv)}: exit {run.returncode}\n{run.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, run.stdout + run.stderr


@dataclass
class Figures:
    """What the rounds measured of one source tree."""

    check: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    beyond: list[float] = field(default_factory=list)
    compiled: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    kernels: list[str] = field(default_factory=list)

    def round(self, source: Path, job: str, tmp: str) -> str:
        """One round: check, a cold train into an empty cache, a warm one."""
        cache = tempfile.mkdtemp(dir=tmp)
        train = ("train", job, "--workspace", os.path.join(tmp, "ws"), "--overwrite")
        # check on an empty cache of its own (a new user's first command; what it compiled,
        # if anything, must not spare the cold train its compiling)
        seconds, cpu, _ = command(source, tempfile.mkdtemp(dir=tmp), "check", job)
        self.check.append(seconds)
        self.cpu["check"].append(cpu)
        seconds, cpu, err = command(source, cache, *train)
        self.cold.append(seconds)
        self.cpu["cold"].append(cpu)
        bursts: dict[str, float] = defaultdict(float)
        for kind, s in COMPILED.findall(err):
            bursts[kind] += float(s)
        for kind, s in bursts.items():
            self.compiled[kind].append(s)
        self.kernels = sorted(p.name.split("-")[0] for p in Path(cache).rglob("*.nbi"))
        seconds, cpu, err = command(source, cache, *train)
        self.warm.append(seconds)
        self.cpu["warm"].append(cpu)
        done = DONE.search(err)
        if done:  # (an earlier tree's last message gives no such split)
            self.beyond.append(seconds - float(done.group(1)) - float(done.group(2)))
        return (f"check {self.check[-1]:.2f} s, cold {self.cold[-1]:.2f} s, warm "
                f"{self.warm[-1]:.2f} s" + (f" ({self.beyond[-1]:.2f} s beyond its steps "
                                            "and tests)" if done else ""))

    def report(self) -> None:
        def row(what: str, wall: list[float], cpu: list[float] | None, note: str = "") -> None:
            cpu_text = Spread.of(cpu).fmt() if cpu else ""
            print(f"{what:<30}{Spread.of(wall).fmt():<22}{cpu_text:<22}{note}")

        print(f"{'':<30}{'wall s':<22}{'CPU s':<22}")
        row("check", self.check, self.cpu["check"], "target: wall <= 1.0")
        row("train cold (empty cache)", self.cold, self.cpu["cold"])
        row("train warm (cached)", self.warm, self.cpu["warm"])
        if self.beyond:
            row("  warm beyond steps + tests", self.beyond, None, "target: <= 2.0")
        row("first-use cost (cold - warm)",
            [c - w for c, w in zip(self.cold, self.warm, strict=True)],
            [c - w for c, w in zip(self.cpu["cold"], self.cpu["warm"], strict=True)],
            "target: wall <= 4.0")
        for kind, seconds in self.compiled.items():
            row(f"  compiling {kind}", seconds, None, "(its messages)")
        print(f"{len(self.kernels)} functions compiled and cached: {', '.join(self.kernels)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rounds_arg(ap)
    ap.add_argument("--job", default="examples/digits_mlp.conf",
                    help="the job file, relative to the source tree (default: the main job)")
    ap.add_argument("--source", type=Path, action="append",
                    help="a paramserver source tree to measure (default: this one; "
                    "repeatable: the trees take turns in every round)")
    args = ap.parse_args()
    sources = [s.resolve() for s in args.source or [ROOT]]
    print(f"job {args.job}; {args.rounds} rounds of check, a cold and a warm train per source "
          f"tree; load average before: {load_average()}")
    figures = {source: Figures() for source in sources}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for source, f in figures.items():
                print(f"  round {r + 1} {source}: {f.round(source, args.job, tmp)}",
                      file=sys.stderr)
    print(f"load average after: {load_average()}")
    for source, f in figures.items():
        print(f"\n{source}")
        f.report()
    print("\nmedian [min–max] over the rounds; wall time of the whole command.")


if __name__ == "__main__":
    main()
