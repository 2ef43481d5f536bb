"""Per-Param costs: building, initialising and updating 10^3 ... 10^6 small Params, and
``paramserver check`` of a job of 20,000 layers (40,002 Params).

    python benchmarks/many_params.py [--sizes 1000 10000 100000 1000000] [--rounds 5]
                                     [--layers 20000] [--no-check] [--no-memory]

The Params are those of a model of many small layers, as issue 31 measured them: pairs of a
4x4 weight (``glorot_uniform``, the default of a Param declared in Python) and a bias of 4
(``zeros``), declared through the Python API as ``(name, shape)`` tuples. In every round each
size is timed in turn (interleaved, so that a busy machine slows them alike):
``ParamSet(specs)``, ``init_params``, the first ``update_params`` (kSGD with momentum: it makes
the updater state) and a second one. Printed per size and phase: the median seconds over the
rounds with [min–max], the per-Param cost in µs, and that cost over the largest size's
(1.00: flat from the smallest size to the largest).

Memory, in a fresh process per size: what the resident memory grows by through the specs
list, the set, its initialisation and two updates, less the values, gradients and updater
state themselves.

check: ``python -m paramserver check`` of a generated job (an .npz data file, a chain of
``--layers`` kInnerProduct layers with a weight and a bias each, and an output layer), wall
and CPU seconds of the whole command (interpreter start and imports included), in each round.

Targets (issue 31): build, init and update of 10^6 Params each under 10 s, under 1 GB beyond
the values, check of the 40,000-Param job under 2 s; medians over at least 5 rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, load_average, rounds_arg

from paramserver import ParamSet, create_updater, init_params

PHASES = ("build", "init", "update (first)", "update")
UPDATER = {"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.01}}


def specs(n: int) -> list[tuple[str, tuple[int, ...]]]:
    """``n`` Params: a 4x4 weight and a bias of 4 per layer, named as a net names them."""
    return [(f"fc{i // 2}_{i % 2}", (4, 4) if i % 2 == 0 else (4,)) for i in range(n)]


def one_round(n: int) -> dict[str, float]:
    """Seconds of each phase for ``n`` Params (the specs are made before the clock starts)."""
    items = specs(n)
    gc.collect()
    times = {}
    t = time.perf_counter()
    params = ParamSet(items)
    times["build"] = time.perf_counter() - t
    t = time.perf_counter()
    init_params(params, seed=1)
    times["init"] = time.perf_counter() - t
    updater = create_updater(UPDATER)
    params.grads.fill(0.01)
    t = time.perf_counter()
    updater.update_params(0, params)
    times["update (first)"] = time.perf_counter() - t
    t = time.perf_counter()
    updater.update_params(1, params)
    times["update"] = time.perf_counter() - t
    return times


def rss() -> int:
    """Resident bytes of this process now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_of(n: int) -> dict[str, float]:
    """In this (fresh) process: MB the specs, set, init and two updates of ``n`` Params add,
    and MB of their values, gradients and updater state."""
    one_round(1000)  # imports, compiled kernels, the allocator's first pools
    gc.collect()
    start = rss()
    items = specs(n)
    after_specs = rss()
    params = ParamSet(items)
    init_params(params, seed=1)
    updater = create_updater(UPDATER)
    updater.update_params(0, params)
    updater.update_params(1, params)
    end = rss()
    state = params.updater_state
    arrays = params.values.nbytes + params.grads.nbytes + sum(
        a.nbytes for a in (state.arrays.values() if state is not None else ()))
    return {"specs": (after_specs - start) / 1e6, "total": (end - start) / 1e6,
            "arrays": arrays / 1e6, "beyond": (end - start - arrays) / 1e6}


def job_text(layers: int) -> str:
    """A job of ``layers`` kInnerProduct layers in a chain (two Params each) and an output
    layer: ``2 * layers + 2`` Params."""
    out = ['name: "many-params"', "train_steps: 10", "seed: 1",
           "updater { type: kSGD momentum: 0.9 learning_rate { base_lr: 0.01 } }",
           "neuralnet {",
           '  layer { name: "data" type: kData data_conf { source: "data.npz" batchsize: 8 } }']
    src = "data"
    for i in range(layers):
        out.append(f'  layer {{ name: "fc{i}" type: kInnerProduct srclayers: "{src}" '
                   f"innerproduct_conf {{ num_output: 4 }} "
                   f'param {{ name: "w{i}" init {{ type: kUniform low: -0.1 high: 0.1 }} }} '
                   f'param {{ name: "b{i}" init {{ type: kConstant value: 0 }} }} }}')
        src = f"fc{i}"
    out += [f'  layer {{ name: "out" type: kInnerProduct srclayers: "{src}" '
            "innerproduct_conf { num_output: 10 } "
            'param { name: "wo" init { type: kUniform low: -0.1 high: 0.1 } } '
            'param { name: "bo" init { type: kConstant value: 0 } } }',
            '  layer { name: "loss" type: kSoftmaxLoss srclayers: "out" srclayers: "data" }',
            "}"]
    return "\n".join(out) + "\n"


def run_check(folder: Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``paramserver check job.conf`` in ``folder``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "paramserver", "check", "job.conf"], cwd=folder,
                   check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1_000, 10_000, 100_000, 1_000_000],
                        help="numbers of Params (default: 10^3 to 10^6)")
    rounds_arg(parser)
    parser.add_argument("--layers", type=int, default=20_000,
                        help="layers of the job that check reads (default 20000: 40,002 Params)")
    parser.add_argument("--no-check", action="store_true", help="skip paramserver check")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory processes")
    parser.add_argument("--memory-of", type=int, help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args(argv)
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of)))
        return

    sizes = sorted(args.sizes)
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, numpy {np.__version__}; "
          f"{args.rounds} interleaved rounds; load average before: {load_average()}")
    one_round(1000)  # imports and compiled kernels, before any clock
    times: dict[int, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in sizes}
    checks: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.no_check:
            rng = np.random.default_rng(0)
            np.savez(folder / "data.npz", x=rng.random((64, 8), dtype=np.float32),
                     y=np.arange(64) % 10)
            (folder / "job.conf").write_text(job_text(args.layers))
            run_check(folder)  # the kernel cache, once
        for _ in range(args.rounds):
            for n in sizes:
                for phase, seconds in one_round(n).items():
                    times[n][phase].append(seconds)
            if not args.no_check:
                checks.append(run_check(folder))
    print(f"load average after: {load_average()}")

    largest = sizes[-1]
    print(f"\nseconds: median [min–max] over {args.rounds} rounds; µs per Param (median); "
          f"'flat': µs per Param over that of {largest:,} Params")
    print(f"{'Params':>10}  {'phase':<15}{'seconds':>26}{'µs/Param':>11}{'flat':>7}")
    for n in sizes:
        for phase in PHASES:
            s = Spread.of(times[n][phase])
            per = s.median / n * 1e6
            flat = per / (Spread.of(times[largest][phase]).median / largest * 1e6)
            print(f"{n:>10,}  {phase:<15}{s.fmt(3):>26}{per:>11.2f}{flat:>7.2f}")

    verdicts = []
    for phase in PHASES:
        median = Spread.of(times[largest][phase]).median
        verdicts.append(f"{phase} of {largest:,}: {median:.2f} s "
                        f"({'met' if median < 10 else 'NOT met'}: < 10 s)")

    if not args.no_memory:
        print("\nmemory (fresh process per size), MB: specs list, all added, values + "
              "gradients + state, added beyond those")
        for n in sizes:
            out = subprocess.run([sys.executable, __file__, "--memory-of", str(n)],
                                 check=True, capture_output=True, text=True).stdout
            m: dict[str, Any] = json.loads(out)
            print(f"{n:>10,}  {m['specs']:>8.0f}{m['total']:>8.0f}{m['arrays']:>8.0f}"
                  f"{m['beyond']:>8.0f}")
        verdicts.append(f"memory beyond the values at {largest:,}: {m['beyond']:.0f} MB "
                        f"({'met' if m['beyond'] < 1000 else 'NOT met'}: < 1 GB)")

    if checks:
        wall = Spread.of([c[0] for c in checks])
        cpu = Spread.of([c[1] for c in checks])
        print(f"\nparamserver check of {args.layers:,} layers ({2 * args.layers + 2:,} Params, "
              f"{len(job_text(args.layers)) / 1e6:.1f} MB): wall {wall.fmt()} s, "
              f"CPU {cpu.fmt()} s")
        verdicts.append(f"check: {wall.median:.2f} s "
                        f"({'met' if wall.median < 2 else 'NOT met'}: < 2 s)")
    print("\n" + "\n".join(verdicts))
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
