"""Updater state in bfloat16 and 8 bits against torch.optim's best float32 step.

    python benchmarks/low_precision.py [--size-m 16] [--rounds 5] [--per-round 0.3]
                                       [--methods adam sgd-momentum adadelta]

An update step is memory-bound: its time is the bytes it moves. float32 Adam moves 28 bytes
per parameter (reads w, g, m, v; writes w, m, v); with its state in bfloat16 20, in 8-bit
codes 16 (and the block scales). For each method, all in this process, on one Param of
``--size-m`` × 2^20 float32 values:

- ``torch <variant>``: torch.optim with float32 state, each of its CPU variants (for-loop,
  ``foreach``, ``fused`` where torch 2.13 has it: SGD and Adam, not Adadelta); "torch best"
  is the one with the lowest median;
- ``ours <state_dtype>``: :meth:`paramserver.Updater.apply` (what a server runs for its
  range) with ``state_dtype`` float32, bfloat16 and int8 (8-bit block-wise codes).

Contenders run in interleaved rounds (benchmarks/_timing.py); the table gives per contender
the milliseconds per step (median [min–max] over the rounds), the bytes it moves per step,
the state's bytes per parameter, and torch best / ours (per round; median [min–max]) with
the issue's targets: bfloat16 state ≥ 1.3 ×, 8-bit ≥ 1.6 × torch's best float32.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from _timing import Spread, interleaved, load_average, ratios, rounds_arg  # noqa: E402

from paramserver import create_updater  # noqa: E402
from paramserver.numerics import quant  # noqa: E402

# method: (updater conf, number of state arrays, torch class, torch kwargs, torch variants)
METHODS: dict[str, tuple[dict[str, Any], int, str, dict[str, Any], tuple[str, ...]]] = {
    "adam": ({"type": "kAdam", "learning_rate": {"base_lr": 1e-3}}, 2,
             "Adam", {"lr": 1e-3}, ("for-loop", "foreach", "fused")),
    "sgd-momentum": ({"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.01}}, 1,
                     "SGD", {"lr": 0.01, "momentum": 0.9}, ("for-loop", "foreach", "fused")),
    "adadelta": ({"type": "kAdaDelta", "delta": 1e-6, "adadelta_conf": {"rho": 0.9},
                  "learning_rate": {"base_lr": 1.0}}, 2,
                 "Adadelta", {"lr": 1.0, "rho": 0.9, "eps": 1e-6}, ("for-loop", "foreach")),
}
VARIANTS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}
STATE_DTYPES = ("float32", "bfloat16", "int8")
TARGETS = {"bfloat16": 1.3, "int8": 1.6}


def torch_steps(method: str, n: int) -> dict[str, tuple[Callable[[], object], float]]:
    """Per torch variant available on the CPU: its step and its state bytes per parameter."""
    import torch

    _, _, cls, kwargs, variants = METHODS[method]
    out: dict[str, tuple[Callable[[], object], float]] = {}
    for v in variants:
        gen = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(n, generator=gen))
        p.grad = torch.randn(n, generator=gen) * 1e-3
        try:
            opt = getattr(torch.optim, cls)([p], **kwargs, **VARIANTS[v])
            opt.step()
        except (RuntimeError, ValueError, TypeError):
            continue  # a variant this torch lacks on the CPU
        per = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                  if isinstance(t, torch.Tensor) and t.numel() == n) / n
        out[f"torch {v}"] = (opt.step, per)
    return out


def our_step(method: str, state_dtype: str, n: int) -> tuple[Callable[[], object], float]:
    """A step of :meth:`Updater.apply` with ``state_dtype``, and its state bytes per
    parameter (block scales included)."""
    conf = {**METHODS[method][0], "state_dtype": state_dtype}
    up = create_updater(conf)
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n, dtype=np.float32)
    g = (rng.standard_normal(n, dtype=np.float32) * 1e-3).astype(np.float32)
    state = up.init_state([0, n], np.float32)
    per = sum(a.nbytes for k, a in state.arrays.items() if k != "count") / n
    counter = iter(range(1 << 62))

    def step() -> None:
        up.apply(next(counter), w, g, state)

    step()  # compile or load the kernel
    return step, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-m", type=int, default=16, help="parameters, in 2^20 (default 16)")
    rounds_arg(ap)
    ap.add_argument("--per-round", type=float, default=0.3,
                    help="seconds of timed steps per contender and round (default 0.3)")
    ap.add_argument("--methods", nargs="+", type=str.lower, choices=list(METHODS),
                    default=list(METHODS), metavar="METHOD",
                    help=f"of: {', '.join(METHODS)} (default: all)")
    args = ap.parse_args()
    n = args.size_m << 20

    import numba
    import torch

    print(f"{n:,} float32 parameters in one Param; cpus {os.cpu_count()}, numba "
          f"{numba.__version__} ({numba.get_num_threads()} threads), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); {args.rounds} interleaved rounds of "
          f"{args.per_round} s per contender; load average before: {load_average()}")
    results = []
    for method in args.methods:
        nstate = METHODS[method][1]
        steps = torch_steps(method, n)
        for sd in STATE_DTYPES:
            steps[f"ours {sd}"] = our_step(method, sd, n)
        times = interleaved({k: fn for k, (fn, _) in steps.items()}, args.rounds,
                            args.per_round)
        results.append((method, nstate, steps, times))
        print(f"  measured {method}", file=sys.stderr, flush=True)
    print(f"load average after: {load_average()}\n")
    head = (f"{'method':<13}{'contender':<17}{'ms median [min–max]':>24}{'B/step':>8}"
            f"{'state B/param':>14}   {'torch best / ours':<22}target")
    print(head)
    print("-" * (len(head) + 12))
    for method, nstate, steps, times in results:
        best = min((k for k in times if k.startswith("torch")),
                   key=lambda k: Spread.of(times[k]).median)
        for name, (_, per) in steps.items():
            ms = Spread.of(times[name]).scaled(1e3)
            moved = 12 + 8 * nstate if name.startswith("torch") or name.endswith("float32") \
                else 12 + 2 * quant.state_bytes(name.split()[1], nstate)
            ratio, verdict = "", ""
            if name.startswith("ours"):
                r = ratios(times[best], times[name])
                ratio = r.fmt()
                target = TARGETS.get(name.split()[1])
                if target is not None:
                    verdict = f">= {target}: {'met' if r.median >= target else 'MISSED'}"
            elif name == best:
                ratio = "(torch best)"
            print(f"{method:<13}{name:<17}{ms.fmt():>24}{moved:8.1f}{per:14.2f}   "
                  f"{ratio:<22}{verdict}")
    print("\nms: per step, the median of each round's steps; over the rounds median "
          "[min–max]. B/step: bytes moved per parameter per step (reads and writes).\n"
          "torch best / ours: per round; a target is met only if the median meets it. The "
          "machine may be shared: compare within a run, not across runs.")


if __name__ == "__main__":
    main()
