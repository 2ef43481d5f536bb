"""The first ``paramserver train`` on a fresh machine: what numba compiles, and what it costs.

    python benchmarks/first_run.py [--rounds 5] [--job examples/digits_mlp.conf]

Each round runs the job twice in fresh processes, interleaved: *cold*, with an empty numba
cache of its own (``NUMBA_CACHE_DIR`` pointed at a new temporary folder: every kernel the job
uses is compiled), then *warm*, with the cache the cold run filled (every kernel is loaded).
Printed: the wall time of each (min / median / max over the rounds), their difference (the
first-use cost), the load average, and the kernels the job compiled (numba's cache index
files): only those the job runs (its update rule and state type, serial or parallel by its
slice sizes; the initialisers; the cluster's gradient sum), not every method's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, load_average, ratios, rounds_arg

ROOT = Path(__file__).resolve().parents[1]


def run(job: str, cache: str, workspace: str) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "paramserver", "train", job, "--workspace",
                    workspace, "--overwrite"], env=env, check=True, capture_output=True,
                   cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rounds_arg(ap)
    ap.add_argument("--job", default="examples/digits_mlp.conf",
                    help="the job file (default: the README's main job)")
    args = ap.parse_args()
    print(f"job {args.job}; {args.rounds} rounds of a cold and a warm run; load average "
          f"before: {load_average()}")
    cold: list[float] = []
    warm: list[float] = []
    compiled: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            cache = os.path.join(tmp, f"cache{r}")
            os.makedirs(cache)
            cold.append(run(args.job, cache, os.path.join(tmp, "ws")))
            warm.append(run(args.job, cache, os.path.join(tmp, "ws")))
            compiled = sorted(p.name.split("-")[0] for p in Path(cache).rglob("*.nbi"))
            print(f"  round {r + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s",
                  file=sys.stderr)
    first_use = Spread.of([c - w for c, w in zip(cold, warm, strict=True)])
    print(f"load average after: {load_average()}\n")
    print(f"cold (empty cache) s    {Spread.of(cold).fmt()}")
    print(f"warm (cached) s         {Spread.of(warm).fmt()}")
    print(f"first-use cost s        {first_use.fmt()}   (cold - warm, per round)")
    print(f"cold / warm             {ratios(cold, warm).fmt()}")
    print(f"\n{len(compiled)} kernels compiled: {', '.join(compiled)}")
    print("\nmedian [min–max] over the rounds; wall time of the whole command.")


if __name__ == "__main__":
    main()
