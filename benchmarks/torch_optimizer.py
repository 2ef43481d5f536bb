"""paramserver.torch.Optimizer.step against the best torch.optim step, same module, same run.

The module has 16.8M parameters in 64 tensors (16 blocks of a 1024×1024 Linear with its
bias and a LayerNorm): the shape of a small transformer's MLP stack, where torch's
``foreach`` and ``fused`` implementations are at their best. Every optimizer gets its own
copy of the module with the same gradients (random, filled once: a step's cost does not
depend on where gradients come from). For each method, torch's variants (for-loop,
``foreach``, ``fused`` where torch has it on the CPU) and paramserver's Optimizer run in
interleaved rounds (benchmarks/_timing.py: at least 5), so that machine noise falls on all
of them alike; the table gives each one's milliseconds per step (median [min–max] over the
rounds) and the ratio of torch's best to paramserver's (per round, median [min–max]), with
the load average.

The methods added for torch.optim's users (AMSGrad, the centred RMSprop, Adamax, NAdam,
RAdam) run as paramserver's torch-style constructors (``pst.NAdam(...)``, computing what
torch.optim computes); SparseAdam runs on a sparse gradient of an embedding table (its
``--rows`` rows, a batch of ``--ids`` ids, repeats included), against
torch.optim.SparseAdam (``--dim`` values per row).

    python benchmarks/torch_optimizer.py [--rounds 5] [--per-round 0.3] [--blocks 16]
                                         [--width 1024] [--rows 200000] [--dim 64]
                                         [--ids 4096]
                                         [--methods sgd nesterov adam adamw adadelta
                                          amsgrad rmsprop-centered adamax nadam radam
                                          sparseadam]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, interleaved, load_average, ratios, rounds_arg

import paramserver.torch as pst

# method: (paramserver's: an updater, or a torch-style constructor of paramserver.torch taking
# the torch kwargs; torch class, torch kwargs, torch variants to try)
METHODS: dict[str, tuple[str | Callable[..., Any], Any, dict[str, Any], tuple[str, ...]]] = {
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
    "Adam AMSGrad": (pst.Adam, torch.optim.Adam, {"lr": 1e-3, "amsgrad": True},
                     ("for-loop", "foreach", "fused")),
    "RMSprop centered": (pst.RMSprop, torch.optim.RMSprop,
                         {"lr": 1e-3, "centered": True, "momentum": 0.9},
                         ("for-loop", "foreach")),
    "Adamax": (pst.Adamax, torch.optim.Adamax, {"lr": 2e-3, "weight_decay": 1e-4},
               ("for-loop", "foreach")),
    "NAdam": (pst.NAdam, torch.optim.NAdam, {"lr": 2e-3, "weight_decay": 0.01,
                                             "decoupled_weight_decay": True},
              ("for-loop", "foreach")),
    "RAdam": (pst.RAdam, torch.optim.RAdam, {"lr": 1e-3, "weight_decay": 0.01},
              ("for-loop", "foreach")),
}

#: ``--methods`` names (any letter case) -> the method.
OPTIONS = {"sgd": "SGD momentum", "nesterov": "Nesterov", "adam": "Adam", "adamw": "AdamW",
           "adadelta": "AdaDelta", "amsgrad": "Adam AMSGrad",
           "rmsprop-centered": "RMSprop centered", "adamax": "Adamax", "nadam": "NAdam",
           "radam": "RAdam", "sparseadam": "SparseAdam"}

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


def bench(name: str, base: torch.nn.Module, rounds: int,
          per_round: float) -> dict[str, list[float]]:
    """Per contender, its seconds per step in each round."""
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
    opt = (pst.Optimizer(m.parameters(), updater) if isinstance(updater, str)
           else updater(m.parameters(), **kwargs))
    fill_grads(m)
    steps["paramserver"] = opt.step
    for step in steps.values():  # compile or load the kernels, first-touch the state
        step()
    return interleaved(steps, rounds, per_round)


def sparse_grad(table: torch.nn.Embedding, ids: int) -> torch.Tensor:
    """The gradient of a batch of ``ids`` lookups (random ids, repeats included): what
    backward through ``nn.Embedding(sparse=True)`` gives, uncoalesced."""
    g = torch.Generator().manual_seed(2)
    rows = torch.randint(0, table.num_embeddings, (ids,), generator=g)
    values = torch.randn(ids, table.embedding_dim, generator=g) * 1e-3
    return torch.sparse_coo_tensor(rows[None], values, table.weight.shape,
                                   check_invariants=True)


def bench_sparse(rows: int, dim: int, ids: int, rounds: int,
                 per_round: float) -> dict[str, list[float]]:
    """SparseAdam on an embedding table's sparse gradient: torch's and paramserver's (which
    coalesces it, as torch's does, then updates only its rows)."""
    torch.manual_seed(0)
    base = torch.nn.Embedding(rows, dim, sparse=True)
    grad = sparse_grad(base, ids)
    steps: dict[str, Callable[[], Any]] = {}
    for name, make in (("torch for-loop", torch.optim.SparseAdam),
                       ("paramserver", pst.SparseAdam)):
        table = copy.deepcopy(base)
        opt = make(table.parameters(), lr=1e-3)

        def step(opt: Any = opt, table: torch.nn.Embedding = table) -> None:
            table.weight.grad = grad  # what backward leaves after zero_grad()
            opt.step()

        steps[name] = step
    for step in steps.values():
        step()
    return interleaved(steps, rounds, per_round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rounds_arg(ap)
    ap.add_argument("--per-round", type=float, default=0.3,
                    help="seconds of timed steps per contender and round (default 0.3)")
    ap.add_argument("--blocks", type=int, default=16, help="Linear+LayerNorm blocks "
                    "(default: 16)")
    ap.add_argument("--width", type=int, default=1024, help="width of a block (default: 1024)")
    ap.add_argument("--rows", type=int, default=200_000, help="rows of SparseAdam's "
                    "embedding table (default: 200000)")
    ap.add_argument("--dim", type=int, default=64, help="values per row of SparseAdam's "
                    "table (default: 64)")
    ap.add_argument("--ids", type=int, default=4096, help="ids of SparseAdam's batch "
                    "(default: 4096)")
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
          f" {args.rounds} interleaved rounds of {args.per_round} s per contender; load "
          f"average before: {load_average()}")
    print()
    cols = ("torch for-loop", "torch foreach", "torch fused", "paramserver")
    print("| method | " + " | ".join(f"{c} ms" for c in cols)
          + " | torch best / paramserver |")
    print("|---|" + "---:|" * (len(cols) + 1))
    for name in (OPTIONS[m] for m in args.methods):
        times = (bench_sparse(args.rows, args.dim, args.ids, args.rounds, args.per_round)
                 if name == "SparseAdam" else bench(name, base, args.rounds, args.per_round))
        best = min((k for k in times if k.startswith("torch")),
                   key=lambda k: Spread.of(times[k]).median)

        def ms(key: str, times: dict[str, list[float]] = times) -> str:
            return Spread.of(times[key]).scaled(1e3).fmt(1) if key in times else "—"

        print(f"| {name} | " + " | ".join(ms(c) for c in cols)
              + f" | {ratios(times[best], times['paramserver']).fmt()}× (vs {best[6:]}) |",
              flush=True)
    print(f"\nms: median [min–max] over the rounds of each round's median step; ratios per "
          f"round. Load average after: {load_average()}")


if __name__ == "__main__":
    main()
