"""One synchronous cluster step against the bare updater kernel on the same memory.

Target (issue "Parameter servers and workers, embedded"): one synchronous step with 1 worker
and 1 server on a 16M-parameter model costs at most 1.25 × the bare updater kernel; with
4 servers, the same bound.

Both are timed in the same worker thread, step after step, as pairs:

- bare: inside the gradient function, one ``updater.apply`` over the model's flat values
  with the worker's gradient buffer and a state of its own (kSGD with momentum 0.9: reads
  w, g, h; writes w, h);
- cluster: from the end of the gradient function to the start of the next one, i.e. the
  cluster's whole share of a step: stub (share sum), the read of the gradient for NaN and
  Inf under the default ``nonfinite: error`` (by the one server in its kernel call, or with
  several servers by the worker before it pushes, so that no server writes a refused step),
  Update messages, the servers' updates of their ranges, the replies, the versions.

Pairs taken a few milliseconds apart see the same load on the machine, so the median of the
per-step ratios is steady even where the times themselves are not. The configurations run in
interleaved rounds (at least 5); the table gives min / median / max over the rounds and the
load average (benchmarks/_timing.py).

The last line measures what ``nonfinite: error`` costs one server alone, in the same rounds:
the updater kernel with its read-only check of the gradient (``refuse_nonfinite``, what a
server with one worker runs, so that a refused step writes nothing) against the same kernel
without it, call by call (information: the cluster's ratio above includes it).
``--nonfinite skip`` measures the other policy, whose workers read their gradients once more
before sending (a push must be dropped before anything is written). Run:
``python benchmarks/cluster.py [--params-m 16] [--rounds 5] [--steps 20] [--nonfinite skip]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Spread, load_average, rounds_arg

from paramserver.cluster import Cluster, Worker
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet
from paramserver.updaters import create_updater

UPDATER = {"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.01}}
CONFIGS = {"1 worker x 1 server": dict(nservers_per_group=1),
           "1 worker x 4 servers": dict(nservers_per_group=4),
           "2 workers x 4 servers": dict(nservers_per_group=4, nworkers_per_group=2)}
TARGET = 1.25


def model(million: int) -> ParamSet:
    """``million`` Params of 2^20 float32 values each (16: 16,777,216 parameters)."""
    ps = ParamSet([(f"w{i}", (1024, 1024)) for i in range(million)], np.float32)
    ps.values[:] = np.random.default_rng(0).standard_normal(ps.values.size) * 0.01
    return ps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params-m", type=int, default=16, help="model size in 2^20 values")
    rounds_arg(ap)
    ap.add_argument("--steps", type=int, default=20, help="steps per round and config")
    ap.add_argument("--nonfinite", choices=("error", "skip"), default="error",
                    help="the cluster's policy for NaN and Inf gradients (default: error, "
                         "checked inside the kernels' pass)")
    args = ap.parse_args()

    ps = model(args.params_m)
    updater = create_updater(UPDATER)
    grad = (np.random.default_rng(1).standard_normal(ps.values.size) * 1e-3).astype(
        np.float32)
    bare_state = updater.init_state(ps.offsets, ps.dtype)
    lr, wd, gs = ps.lr_scales, ps.wd_scales, 1.0 / ps.num_shares
    clusters = {}
    for name, kw in CONFIGS.items():
        c = Cluster(ClusterConf(**kw, nonfinite=args.nonfinite), ps, updater)
        for w in c.workers:
            w.params.grads[:] = grad
        clusters[name] = c

    def pairs(c: Cluster, n: int) -> tuple[list[float], list[float]]:
        """(bare, cluster) seconds of ``n`` steps of worker 0."""
        marks: list[tuple[float, float]] = []

        def grad_fn(worker: Worker, step: int) -> None:
            if worker.rank == 0:
                t0 = time.perf_counter()
                updater.apply(step, ps.values, worker.params.grads, bare_state, lr, wd, gs)
                marks.append((t0, time.perf_counter()))

        c.run(grad_fn, n + 1)
        bare = [t1 - t0 for t0, t1 in marks[:-1]]
        step = [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(marks)]
        return bare, step

    for c in clusters.values():  # warm-up: compile or load kernels, touch every page
        pairs(c, 3)
    # Per config and round: the round's median bare time, step time and step/bare ratio.
    per_round: dict[str, list[tuple[float, float, float]]] = {n: [] for n in CONFIGS}
    check_state = updater.init_state(ps.offsets, ps.dtype)
    work = ps.values.copy()

    def checked(n: int) -> float:
        """The median over ``n`` pairs of (kernel with the read-only check) / (without)."""
        out = []
        for i in range(n):
            times = {}
            for check in (i % 2 == 0, i % 2 == 1):  # alternate which goes first
                t0 = time.perf_counter()
                updater.apply(0, work, grad, check_state, lr, wd, gs, refuse_nonfinite=check)
                times[check] = time.perf_counter() - t0
            out.append(times[True] / times[False])
        return float(np.median(out))

    checked(2)
    check_rounds: list[float] = []
    load_before = load_average()
    for _ in range(args.rounds):
        for name, c in clusters.items():
            bare, step = pairs(c, args.steps)
            per_round[name].append((float(np.median(bare)), float(np.median(step)),
                                    float(np.median(np.array(step) / np.array(bare)))))
        check_rounds.append(checked(max(3, args.steps // 2)))

    print(f"model: {ps.values.size:,} float32 parameters in {len(ps.owners)} Params; "
          f"updater kSGD momentum 0.9; {args.rounds} interleaved rounds of {args.steps} paired "
          f"steps each; nonfinite: {args.nonfinite}; load average before: {load_before}, "
          f"after: {load_average()}")
    print(f"{'':23}{'bare ms':>20}{'step ms':>20}{'ratio':>24}   target")
    for name, rows in per_round.items():
        bare_s, step_s, ratio_s = (Spread.of([r[i] for r in rows]) for i in range(3))
        verdict = (f"<= {TARGET}: {'met' if ratio_s.median <= TARGET else 'MISSED'}"
                   if name.startswith("1 worker") else "(information)")
        print(f"{name:23}{bare_s.scaled(1e3).fmt():>20}{step_s.scaled(1e3).fmt():>20}"
              f"{ratio_s.fmt(3):>24}   {verdict}")
    print(f"{'kernel check / none':23}{'':40}{Spread.of(check_rounds).fmt(3):>24}   "
          "(information: nonfinite 'error', one worker)")
    print("\nmedian [min–max] over the rounds of each round's median (ratio: of the per-step "
          "ratios step / bare).")

if __name__ == "__main__":
    main()
