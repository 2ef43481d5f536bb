"""paramserver.torch.Optimizer.step against the best torch.optim step, same module, same run.

The module has 16.8M parameters in 64 tensors (16 blocks of a 1024×1024 Linear with its
bias and a LayerNorm): the shape of a small transformer's MLP stack, where torch's
``foreach`` and ``fused`` implementations are at their best. Every optimizer gets its own
copy of the module with the same gradients (random, filled once: a step's cost does not
depend on where gradients come from). For each method, torch's variants (for-loop,
``foreach``, ``fused`` where torch has it on the CPU) and paramserver's Optimizer are timed
in turn, repetition by repetition, so that machine noise falls on all of them alike; the
table gives medians after warm-up, and the ratio of torch's best to paramserver's.

    python benchmarks/torch_optimizer.py [--reps 15] [--blocks 16] [--width 1024]
                                         [--methods sgd nesterov adam adamw adadelta]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import paramserver.torch as pst

# method: (paramserver updater, torch class, torch kwargs, torch variants to try)
METHODS: dict[str, tuple[str, Any, dict[str, Any], tuple[str, ...]]] = {
    "SGD momentum": ("type: kSGD momentum: 0.9 weight_decay: 0.0001 "
                     "learning_rate { base_lr: 0.01 }",
                     torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4},
                     ("for-loop", "foreach", "fused")),
    "Nesterov": ("type: kNesterov momentum: 0.9 learning_rate { base_lr: 0.01 }",
                 torch.optim.SGD, {"lr": 0.01, "momentum": 0.9, "nesterov": True},
                 ("for-loop", "foreach", "fused")),
    "Adam": ("type: kAdam learning_rate { base_lr: 0.001 }",
             torch.optim.Adam, {"lr": 1e-3}, ("for-loop", "foreach", "fused")),
    "AdamW": ("type: kAdamW weight_decay: 0.01 learning_rate { base_lr: 0.001 }",
              torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01},
              ("for-loop", "foreach", "fused")),
    "AdaDelta": ("type: kAdaDelta delta: 1e-6 adadelta_conf { rho: 0.9 } "
                 "learning_rate { base_lr: 1.0 }",
                 torch.optim.Adadelta, {"lr": 1.0, "rho": 0.9, "eps": 1e-6},
                 ("for-loop", "foreach")),
}

#: ``--methods`` names (any letter case) -> the method.
OPTIONS = {"sgd": "SGD momentum", "nesterov": "Nesterov", "adam": "Adam", "adamw": "AdamW",
           "adadelta": "AdaDelta"}

VARIANTS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}


def make_module(blocks: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*layers)


def fill_grads(module: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for p in module.parameters():
        grad = torch.randn(p.shape, generator=g) * 1e-3
        if p.grad is None:
            p.grad = grad
        else:
            p.grad.copy_(grad)  # paramserver's: keep the view of the flat buffer


def timed(step: Callable[[], Any]) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def bench(name: str, base: torch.nn.Module, reps: int, warmup: int) -> dict[str, float]:
    updater, cls, kwargs, variants = METHODS[name]
    steps: dict[str, Callable[[], Any]] = {}
    for v in variants:
        m = copy.deepcopy(base)
        fill_grads(m)
        try:
            steps[f"torch {v}"] = cls(m.parameters(), **kwargs, **VARIANTS[v]).step
        except (RuntimeError, ValueError, TypeError) as e:  # a variant this torch lacks
            print(f"  ({name}: torch {v} unavailable: {e})")
    m = copy.deepcopy(base)
    opt = pst.Optimizer(m.parameters(), updater)
    fill_grads(m)
    steps["paramserver"] = opt.step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(warmup):
        for step in steps.values():
            step()
    for _ in range(reps):
        for k, step in steps.items():
            times[k].append(timed(step))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="timed steps per contender "
                    "(default: 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    ap.add_argument("--blocks", type=int, default=16, help="Linear+LayerNorm blocks "
                    "(default: 16)")
    ap.add_argument("--width", type=int, default=1024, help="width of a block (default: 1024)")
    ap.add_argument("--methods", nargs="+", type=str.lower, choices=list(OPTIONS),
                    default=list(OPTIONS), metavar="METHOD",
                    help=f"only these methods, of: {', '.join(OPTIONS)} (default: all)")
    args = ap.parse_args()
    base = make_module(args.blocks, args.width)
    n = sum(p.numel() for p in base.parameters())
    import numba

    print(f"module: {n / 1e6:.1f}M float32 parameters in {len(list(base.parameters()))} tensors"
          f"; torch {torch.__version__} with {torch.get_num_threads()} threads, numba "
          f"{numba.__version__} with {numba.get_num_threads()} threads, {os.cpu_count()} CPUs;"
          f" medians of {args.reps} steps after {args.warmup} warm-up steps")
    print()
    print(f"| method | {'torch for-loop':>14} | {'torch foreach':>13} | {'torch fused':>11} | "
          f"{'paramserver':>11} | torch best / paramserver |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in (OPTIONS[m] for m in args.methods):
        med = bench(name, base, args.reps, args.warmup)
        torch_best = min(v for k, v in med.items() if k.startswith("torch"))
        best_name = min((v, k) for k, v in med.items() if k.startswith("torch"))[1]

        def ms(key: str, med: dict[str, float] = med) -> str:
            return f"{med[key] * 1e3:.1f} ms" if key in med else "—"

        print(f"| {name} | {ms('torch for-loop'):>14} | {ms('torch foreach'):>13} | "
              f"{ms('torch fused'):>11} | {ms('paramserver'):>11} | "
              f"{torch_best / med['paramserver']:.2f}× (vs {best_name[6:]}) |", flush=True)


if __name__ == "__main__":
    main()
