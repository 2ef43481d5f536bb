"""One synchronous cluster step against the bare updater kernel on the same memory.

Target (issue "Parameter servers and workers, embedded"): one synchronous step with 1 worker
and 1 server on a 16M-parameter model costs at most 1.25 × the bare updater kernel; with
4 servers, the same bound.

Both are timed in the same worker thread, step after step, as pairs:

- bare: inside the gradient function, one ``updater.apply`` over the model's flat values
  with the worker's gradient buffer and a state of its own (kSGD with momentum 0.9: reads
  w, g, h; writes w, h);
- cluster: from the end of the gradient function to the start of the next one, i.e. the
  cluster's whole share of a step: stub (share sum), Update messages, the servers' updates
  of their ranges (whose kernels count NaN and Inf in the same pass, for the default
  ``nonfinite: error``), the replies, the versions.

Pairs taken a few milliseconds apart see the same load on the machine, so the median of the
per-step ratios is steady even where the times themselves are not. Printed: the median
times, and the min / median / max of the per-step ratios, with the load average before and
after.

The last line measures what ``nonfinite: error`` costs one server alone: the updater kernel
with its read-only check of the gradient (``refuse_nonfinite``, what a server with one
worker runs, so that a refused step writes nothing) against the same kernel without it,
interleaved call by call (information: the cluster's ratio above includes it).
``--nonfinite skip`` measures the other policy, whose workers read their gradients once more
before sending (a push must be dropped before anything is written). Run:
``python benchmarks/cluster.py [--params-m 16] [--rounds 5] [--steps 20] [--nonfinite skip]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np

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
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the configurations")
    ap.add_argument("--steps", type=int, default=20, help="steps per round and config")
    ap.add_argument("--nonfinite", choices=("error", "skip"), default="error",
                    help="the cluster's policy for NaN and Inf gradients (default: error, "
                         "checked inside the kernels' pass)")
    args = ap.parse_args()
    load_before = os.getloadavg()

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
    check_state = updater.init_state(ps.offsets, ps.dtype)
    work = ps.values.copy()

    def checked(n: int) -> list[float]:
        """Ratios (kernel with the read-only check) / (kernel without), ``n`` pairs."""
        out = []
        for i in range(n):
            times = []
            for check in (i % 2 == 0, i % 2 == 1):  # alternate which goes first
                t0 = time.perf_counter()
                updater.apply(0, work, grad, check_state, lr, wd, gs, refuse_nonfinite=check)
                times.append((time.perf_counter() - t0, check))
            with_check = next(t for t, c in times if c)
            without = next(t for t, c in times if not c)
            out.append(with_check / without)
        return out

    checked(2)
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in CONFIGS}
    check_ratios: list[float] = []
    for _ in range(args.rounds):
        for name, c in clusters.items():
            bare, step = pairs(c, args.steps)
            samples[name][0].extend(bare)
            samples[name][1].extend(step)
        check_ratios += checked(args.steps // 2)
    load_after = os.getloadavg()

    print(f"model: {ps.values.size:,} float32 parameters in {len(ps.owners)} Params; "
          f"updater kSGD momentum 0.9; {args.rounds} x {args.steps} paired steps each; "
          f"nonfinite: {args.nonfinite}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs")
    print(f"{'':23}{'bare ms':>9}{'step ms':>9}   {'ratio: min median   max':>23}   target")
    for name, (bare, step) in samples.items():
        ratios = np.array(step) / np.array(bare)
        ratio = float(np.median(ratios))
        verdict = (f"<= {TARGET}: {'ok' if ratio <= TARGET else 'MISSED'}"
                   if name.startswith("1 worker") else "(information)")
        print(f"{name:23}{np.median(bare) * 1e3:9.2f}{np.median(step) * 1e3:9.2f}   "
              f"{ratios.min():7.3f} {ratio:7.3f} {ratios.max():7.3f}   {verdict}")
    c = np.array(check_ratios)
    print(f"{'kernel check / none':23}{'':18}   {c.min():7.3f} {np.median(c):7.3f} "
          f"{c.max():7.3f}   (information: nonfinite 'error', one worker)")


if __name__ == "__main__":
    main()
