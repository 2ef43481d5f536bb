"""The main job through the command line, embedded against a local Ray: what a user waits.

``paramserver train digits_mlp`` (``examples/digits_mlp.conf``) is run as a user runs it, a
process each time, with ``--backend local`` and ``--backend ray`` (a Ray of its own on this
machine), with 1 worker and 1 server and with 2 and 2 (``--set cluster.nworkers_per_group=2
--set cluster.nservers_per_group=2``), in a fresh workspace each time. Contenders run in
interleaved rounds (round 1 runs each in turn, then round 2, ...; at least five), so that a
busy machine slows them alike. Figures per contender, min / median / max over the rounds:

- **training**: the seconds the command reports for its training steps (``done: … (training
  X s, tests Y s)``): the steps, their checkpoints, without the tests and the start;
- **steps/s**: the job's steps over that time;
- **whole**: the command's wall time, start (Python, the job, Ray and its actors) to end.

and Ray ÷ embedded of the training time and of the whole, per round (target: the medians of
the training time within 3× at 1×1 and 2×2), and the load average before and after.

    python benchmarks/cli_backends.py [--rounds 5] [--steps 1500] [--layouts 1x1 2x2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import Spread, load_average, ratios, rounds_arg

DONE = re.compile(r"done: (\d+) steps in ([\d.]+) s \(training ([\d.]+) s, tests ([\d.]+) s\)")


def run(backend: str, layout: str, steps: int, folder: Path) -> tuple[float, float, int]:
    """One ``paramserver train``: (training seconds, wall seconds, steps)."""
    workers, servers = (int(x) for x in layout.split("x"))
    workspace = Path(tempfile.mkdtemp(prefix=f"{backend}-{layout}-", dir=folder))
    command = [sys.executable, "-m", "paramserver", "train", "digits_mlp", "--backend", backend,
               "--workspace", str(workspace / "ws"), "--steps", str(steps), "--no-tensorboard",
               "--set", f"cluster.nworkers_per_group={workers}",
               "--set", f"cluster.nservers_per_group={servers}"]
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    found = DONE.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return float(found.group(3)), wall, int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rounds_arg(parser)
    parser.add_argument("--steps", type=int, default=1500, help="steps per run (default: "
                        "the job's 1500)")
    parser.add_argument("--layouts", nargs="+", default=["1x1", "2x2"],
                        help="workers x servers per group (default 1x1 2x2)")
    args = parser.parse_args()
    contenders = [(b, lay) for lay in args.layouts for b in ("local", "ray")]
    training: dict[tuple[str, str], list[float]] = {c: [] for c in contenders}
    whole: dict[tuple[str, str], list[float]] = {c: [] for c in contenders}
    rates: dict[tuple[str, str], list[float]] = {c: [] for c in contenders}
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="cli-backends-") as tmp:
        for r in range(args.rounds):
            for c in contenders:
                seconds, wall, steps = run(*c, args.steps, Path(tmp))
                training[c].append(seconds)
                whole[c].append(wall)
                rates[c].append(steps / seconds if seconds else float("inf"))
                print(f"round {r + 1}: {c[0]:5} {c[1]}: training {seconds:6.1f} s, "
                      f"{rates[c][-1]:7.1f} steps/s, whole {wall:6.1f} s "
                      f"(load {load_average()})", flush=True)
    after = load_average()
    print(f"\npython {sys.version.split()[0]}, {os.cpu_count()} cores, {args.rounds} rounds of "
          f"{args.steps} steps; load average {before} before, {after} after")
    print(f"{'':14} {'training s':>22} {'steps/s':>24} {'whole s':>22}")
    for c in contenders:
        print(f"{c[0]:5} {c[1]:8} {Spread.of(training[c]).fmt(1):>22} "
              f"{Spread.of(rates[c]).fmt(0):>24} {Spread.of(whole[c]).fmt(1):>22}")
    for lay in args.layouts:
        ray, local = ("ray", lay), ("local", lay)
        print(f"ray / embedded at {lay}: training {ratios(training[ray], training[local]).fmt()}"
              f" (target <= 3), whole {ratios(whole[ray], whole[local]).fmt()}")


if __name__ == "__main__":
    main()
