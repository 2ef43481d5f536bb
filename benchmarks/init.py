"""Random fills for initialisation: paramserver.numerics.rng against torch.nn.init, in one process.

    python benchmarks/init.py [--size 16777216] [--repeats 15]

Fills one float32 buffer of ``--size`` elements (16M by default) with each method, taking
turns with torch's fill of the same buffer so that both see the same machine load; prints
the median times and ``torch / ours`` (> 1: paramserver is faster). The first call of each
is a warm-up (numba compiles, or loads its cache, there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np
import torch

from paramserver.numerics.rng import fill_normal, fill_truncated_normal, fill_uniform, param_key


def _seconds(fill: Callable[[], object]) -> float:
    start = time.perf_counter()
    fill()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16 * 1024 * 1024,
                        help="values per fill (default: 16 Mi)")
    parser.add_argument("--repeats", type=int, default=15,
                        help="timed fills per method (default: 15)")
    args = parser.parse_args()

    buffer = np.empty(args.size, np.float32)
    tensor = torch.from_numpy(buffer)  # the same memory for both
    key = param_key(1, "fc1_weight")
    cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("normal(0, 1)", lambda: torch.nn.init.normal_(tensor),
         lambda: fill_normal(buffer, key)),
        ("uniform(-1, 1)", lambda: torch.nn.init.uniform_(tensor, -1.0, 1.0),
         lambda: fill_uniform(buffer, key)),
        ("truncated normal ±2σ", lambda: torch.nn.init.trunc_normal_(tensor),
         lambda: fill_truncated_normal(buffer, key)),
    ]

    print(f"{args.size:,} float32 values; median of {args.repeats} after a warm-up; "
          f"torch {torch.__version__} on {torch.get_num_threads()} threads, "
          f"numba {numba.__version__} on {numba.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")
    print(f"{'fill':<22}{'torch ms':>10}{'ours ms':>10}{'torch/ours':>12}")
    for name, theirs, ours in cases:
        theirs()
        ours()
        times: dict[str, list[float]] = {"torch": [], "ours": []}
        for _ in range(args.repeats):  # take turns, so that load from elsewhere hits both
            times["torch"].append(_seconds(theirs))
            times["ours"].append(_seconds(ours))
        t, o = statistics.median(times["torch"]), statistics.median(times["ours"])
        print(f"{name:<22}{t * 1e3:>10.1f}{o * 1e3:>10.1f}{t / o:>12.2f}")


if __name__ == "__main__":
    main()
