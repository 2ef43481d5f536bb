"""Speed of the fused update kernels against torch.optim and a memory-speed yardstick.

    python benchmarks/updaters.py [--quick] [--rounds 5] [--threads N] [--methods Adam ...]
                                  [--cases '200 x 4096' ...] [--no-compile]

For every method and three float32 cases (one Param of 16M elements; 200 Params of mixed sizes
totalling 16M; 200 Params of 4096), all in this process, in interleaved rounds
(benchmarks/_timing.py: at least 5, min / median / max over the rounds, the load average):

- ``paramserver``: the fused kernel of :mod:`paramserver.numerics.kernels`, one call per step
  over the flat buffers;
- ``torch``: the fastest of torch.optim's default (for-loop), ``foreach=True`` and
  ``fused=True`` (on CPU, torch 2.13 fuses SGD, Adagrad, Adam and AdamW, not RMSprop or
  Adadelta), on one tensor per Param, same hyper-parameters (torch's Adagrad and RMSprop add
  eps outside the square root: the same work);
- ``reference``: a numba loop over the whole range that reads and writes the same number of
  arrays as the method, with trivial arithmetic: what the memory system allows.

GB/s counts the bytes a method must move per step (each array read once, values and state
written once), for every contender, so it is also an effective bandwidth for torch. Last, the
time to compile the float32 kernels and to load them from numba's cache is measured in fresh
processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit, prange

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, interleaved, load_average, ratios, rounds_arg  # noqa: E402

from paramserver.numerics import kernels  # noqa: E402

DTYPE = np.float32
TOTAL = 1 << 24


# ---------------------------------------------------------------------------------------------
# The yardstick: one pass with the method's reads and writes and almost no arithmetic.


@njit(nogil=True, parallel=True, cache=True)
def _stream_2r1w(w, g, h, u, a, b):  # type: ignore[no-untyped-def]
    for i in prange(w.shape[0]):
        w[i] = w[i] + a * g[i]


@njit(nogil=True, parallel=True, cache=True)
def _stream_3r2w(w, g, h, u, a, b):  # type: ignore[no-untyped-def]
    for i in prange(w.shape[0]):
        hi = b * h[i] + g[i]
        h[i] = hi
        w[i] = w[i] + a * hi


@njit(nogil=True, parallel=True, cache=True)
def _stream_4r3w(w, g, h, u, a, b):  # type: ignore[no-untyped-def]
    for i in prange(w.shape[0]):
        gi = g[i]
        hi = b * h[i] + gi
        ui = b * u[i] - gi
        h[i] = hi
        u[i] = ui
        w[i] = w[i] + a * (hi + ui)


STREAMS = {0: _stream_2r1w, 1: _stream_3r2w, 2: _stream_4r3w}


# ---------------------------------------------------------------------------------------------
# Methods and cases.


@dataclass
class Buffers:
    """Flat float32 buffers of one case, and its segments."""

    sizes: list[int]
    w: np.ndarray = field(init=False)
    g: np.ndarray = field(init=False)
    h: np.ndarray = field(init=False)
    u: np.ndarray = field(init=False)
    offsets: np.ndarray = field(init=False)
    step: int = 0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(0)
        n = sum(self.sizes)
        self.w = rng.standard_normal(n, dtype=DTYPE)
        self.g = rng.standard_normal(n, dtype=DTYPE)
        self.h = np.zeros(n, DTYPE)
        self.u = np.zeros(n, DTYPE)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)


@dataclass(frozen=True)
class Method:
    name: str
    nstate: int  # state arrays: traffic is (2 + nstate) reads, (1 + nstate) writes
    kernel: Callable[[Buffers], None]
    torch_class: str
    torch_kwargs: dict[str, Any]


def _lr(b: Buffers, lr: float) -> np.ndarray:
    return np.full(len(b.sizes), lr)  # per segment, as an updater passes it


def _adam(decoupled: bool) -> Callable[[Buffers], None]:
    def run(b: Buffers) -> None:
        b.step += 1
        wd = 0.01 if decoupled else 0.0
        step = np.full(len(b.sizes), b.step)
        kernels.adam(
            b.w, b.g, b.h, b.u, b.offsets, _lr(b, 1e-3), wd, step=step, decoupled=decoupled
        )

    return run


def _adamax(b: Buffers) -> None:
    b.step += 1
    kernels.adamax(b.w, b.g, b.h, b.u, b.offsets, _lr(b, 2e-3),
                   step=np.full(len(b.sizes), b.step))


METHODS = [
    Method(
        "SGD",
        0,
        lambda b: kernels.sgd(b.w, b.g, b.h[:0], b.offsets, _lr(b, 0.01)),
        "SGD",
        {"lr": 0.01},
    ),
    Method(
        "SGD-momentum",
        1,
        lambda b: kernels.sgd(b.w, b.g, b.h, b.offsets, _lr(b, 0.01), momentum=0.9),
        "SGD",
        {"lr": 0.01, "momentum": 0.9},
    ),
    Method(
        "Nesterov",
        1,
        lambda b: kernels.nesterov(b.w, b.g, b.h, b.offsets, _lr(b, 0.01), momentum=0.9),
        "SGD",
        {"lr": 0.01, "momentum": 0.9, "nesterov": True},
    ),
    Method(
        "AdaGrad",
        1,
        lambda b: kernels.adagrad(b.w, b.g, b.h, b.offsets, _lr(b, 0.01)),
        "Adagrad",
        {"lr": 0.01, "eps": 1e-8},
    ),
    Method(
        "RMSProp",
        1,
        lambda b: kernels.rmsprop(b.w, b.g, b.h, b.offsets, _lr(b, 0.01), rho=0.9),
        "RMSprop",
        {"lr": 0.01, "alpha": 0.9, "eps": 1e-8},
    ),
    Method(
        "AdaDelta",
        2,
        lambda b: kernels.adadelta(b.w, b.g, b.h, b.u, b.offsets, _lr(b, 1.0), rho=0.9),
        "Adadelta",
        {"lr": 1.0, "rho": 0.9, "eps": 1e-8},
    ),
    Method("Adam", 2, _adam(False), "Adam", {"lr": 1e-3, "eps": 1e-8}),
    Method("AdamW", 2, _adam(True), "AdamW", {"lr": 1e-3, "eps": 1e-8, "weight_decay": 0.01}),
    Method("AdaMax", 2, _adamax, "Adamax", {"lr": 2e-3, "eps": 1e-8}),
]


def cases() -> dict[str, list[int]]:
    rng = np.random.default_rng(42)
    mixed = rng.lognormal(0.0, 1.5, 200)
    mixed = np.maximum(1, np.floor(mixed / mixed.sum() * TOTAL)).astype(np.int64)
    mixed[np.argmax(mixed)] += TOTAL - mixed.sum()
    return {
        "1 x 16M": [TOTAL],
        "200 mixed, 16M": [int(s) for s in mixed],
        "200 x 4096": [4096] * 200,
    }


# ---------------------------------------------------------------------------------------------
# Contenders.


def torch_steppers(method: Method, sizes: list[int]) -> dict[str, Callable[[], None]]:
    """A ``step()`` per torch.optim variant that this torch supports on CPU for the method."""
    import torch

    out: dict[str, Callable[[], None]] = {}
    for variant, kwargs in (
        ("default", {}),
        ("foreach", {"foreach": True}),
        ("fused", {"fused": True}),
    ):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in sizes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        try:
            opt = getattr(torch.optim, method.torch_class)(params, **method.torch_kwargs, **kwargs)
            opt.step()
        except (TypeError, RuntimeError, ValueError):
            continue  # not supported on CPU by this torch
        out[variant] = opt.step
    return out


@dataclass
class Row:
    method: str
    case: str
    nparams: int
    nbytes: int
    ours: list[float]  # per round, seconds per call
    reference: list[float]
    torch: list[float]
    torch_variant: str


def bench_case(method: Method, case: str, sizes: list[int], rounds: int,
               per_round_s: float) -> Row:
    b = Buffers(sizes)
    stream = STREAMS[method.nstate]
    a, c = DTYPE(1e-6), DTYPE(0.5)
    contenders: dict[str, Callable[[], None]] = {
        "ours": lambda: method.kernel(b),
        "reference": lambda: stream(b.w, b.g, b.h, b.u, a, c),
    }
    torch_variants = torch_steppers(method, sizes)
    contenders.update({f"torch {k}": v for k, v in torch_variants.items()})
    small = sum(sizes) < TOTAL
    times = interleaved(contenders, rounds, per_round_s * (0.5 if small else 1))
    best = min(torch_variants, key=lambda k: Spread.of(times[f"torch {k}"]).median)
    nbytes = (3 + 2 * method.nstate) * sum(sizes) * np.dtype(DTYPE).itemsize
    return Row(method.name, case, len(sizes), nbytes, times["ours"], times["reference"],
               times[f"torch {best}"], best)


def print_table(rows: list[Row]) -> None:
    head = (f"{'method':<13} {'case':<15} {'ours ms':>8} {'GB/s':>6} {'ref GB/s':>8} "
            f"{'ours/ref median [min–max]':>26} {'torch ms':>9} {'torch variant':<13} "
            f"{'x torch median [min–max]':>25} {'us/Param ours [min–max]':>24} {'torch':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        ours, ref, torch = (Spread.of(x) for x in (r.ours, r.reference, r.torch))
        per_param = ""
        if r.nparams > 1 and r.nbytes / r.nparams < 1e6:
            per_param = (f"{ours.scaled(1e6 / r.nparams).fmt():>24} "
                         f"{torch.median / r.nparams * 1e6:6.1f}")
        print(f"{r.method:<13} {r.case:<15} {ours.median * 1e3:8.3f} "
              f"{r.nbytes / ours.median / 1e9:6.1f} {r.nbytes / ref.median / 1e9:8.1f} "
              f"{ratios(r.reference, r.ours).fmt():>26} {torch.median * 1e3:9.3f} "
              f"{r.torch_variant:<13} {ratios(r.torch, r.ours).fmt():>25} {per_param}")


# ---------------------------------------------------------------------------------------------
# Compile and cached-load times, in fresh processes with an empty numba cache of their own.

_TIMING_SCRIPT = """
import time
t0 = time.perf_counter()
import numpy as np
import paramserver.numerics.kernels as k
import paramserver.numerics.fused  # numba's import: kernels' own imports none
t1 = time.perf_counter()
k.warmup(np.float32)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, len(k._made))
"""


def compile_times() -> list[tuple[float, float, int]]:
    """(import, warmup(float32), kernels) seconds: first with an empty cache, then from it."""
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "NUMBA_CACHE_DIR": cache,
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        }
        for _ in range(2):
            res = subprocess.run([sys.executable, "-c", _TIMING_SCRIPT], env=env, check=True,
                                 capture_output=True, text=True)
            imp, warm, made = res.stdout.split()
            out.append((float(imp), float(warm), int(made)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter rounds")
    rounds_arg(parser)
    names = [m.name for m in METHODS]
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        type=lambda x: next((n for n in names if n.lower() == x.lower()), x),
                        choices=names, help=f"only these methods, of: {', '.join(names)} "
                                            "(default: all)")
    parser.add_argument("--cases", nargs="+", choices=list(cases()), metavar="CASE",
                        help=f"only these cases, of: {', '.join(map(repr, cases()))}")
    parser.add_argument("--threads", type=int, help="threads for numba and torch (default: all)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the compile-time measurement")
    args = parser.parse_args(argv)

    import numba
    import torch

    if args.threads:
        numba.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    kernels.warmup(DTYPE)
    per_round = 0.05 if args.quick else 0.2
    print(f"cpus {os.cpu_count()}, numba {numba.__version__} ({numba.get_num_threads()} "
          f"threads), torch {torch.__version__} ({torch.get_num_threads()} threads), float32; "
          f"{args.rounds} interleaved rounds of {per_round} s (half for < 16M); load average: "
          f"{load_average()}")
    rows = []
    for method in METHODS:
        if args.methods and method.name not in args.methods:
            continue
        for case, sizes in cases().items():
            if args.cases and case not in args.cases:
                continue
            rows.append(bench_case(method, case, sizes, args.rounds, per_round))
            print(f"  measured {method.name:<13} {case}", file=sys.stderr)
    print(f"threading layer: {numba.threading_layer()}; load average at the end: "
          f"{load_average()}\n")
    print_table(rows)
    print("\nTimes: per call, each round's median; the median over the rounds. GB/s: bytes the"
          " method must move per step / time.\nours/ref: reference time / ours; x torch: best "
          "torch time / ours; both per round, median [min–max] over the rounds.\nus/Param: per "
          "Param per step (target for 200 x 4096: <= 1.5).")
    if args.no_compile:
        return
    (imp0, cold, n), (imp1, warm, _) = compile_times()
    print(f"\nimport paramserver.numerics.kernels and .fused (numba): {imp0:.2f} s (first), "
          f"{imp1:.2f} s (again)")
    print(f"warmup(float32), {n} kernels: compile {cold:.2f} s ({cold / n:.2f} s each); "
          f"load from cache {warm:.3f} s")


if __name__ == "__main__":
    main()
