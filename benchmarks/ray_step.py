"""A training step on Ray against a bare Ray actor round trip carrying the same bytes.

Target (issue "One cluster core"): a training step of the main job's model
(``examples/digits_mlp.conf``: an MLP on the 8×8 digits, 9,610 float32 parameters) on Ray
costs at most 3 × a bare Ray actor round trip carrying the same bytes with 1 worker and 1
server, and at most 4 × with 2 workers and 2 servers; both measured in this process.

Contenders, interleaved round after round so that they see the same load:

- bare: ``ray.get(actor.echo.remote(grads))`` from this process to an actor that returns an
  array as large (the model's gradients out, its values back: the bytes of one step's
  exchange), ``--trips`` times per round;
- step 1×1, step 2×2: ``Cluster.run`` of ``--steps`` steps of the main job (its net, its
  data, its updater; the workers build their nets from the job, as ``paramserver train
  --backend ray`` does), with 1 worker and 1 server, then 2 workers and 2 servers; a step's
  cost is the run's time over its steps (the run's start and end included).

Each round gives one ratio per configuration (step / bare of the same round); the target
is met when the median ratio is within it. Printed: min / median / max of every time and
ratio, and the load average before and after.

Run: ``python benchmarks/ray_step.py [--rounds 7] [--steps 200] [--trips 200]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as paramserver's actors do

import numpy as np

from paramserver.cluster import Cluster, RemoteGradFn
from paramserver.cluster.ray_backend import import_ray, start_ray
from paramserver.config.job import load_job
from paramserver.init import init_params
from paramserver.params import ParamSet
from paramserver.train.net import Net

JOB = Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.conf"
TARGETS = {"1 worker x 1 server": 3.0, "2 workers x 2 servers": 4.0}
CONFIGS = {"1 worker x 1 server": {"nworkers_per_group": 1, "nservers_per_group": 1},
           "2 workers x 2 servers": {"nworkers_per_group": 2, "nservers_per_group": 2}}


class Echo:
    """The baseline: an actor that returns an array as large as the one it is sent."""

    def __init__(self, n: int):
        self.buf = np.ones(n, np.float32)

    def ping(self) -> int:
        return 0

    def echo(self, a: np.ndarray) -> np.ndarray:
        return self.buf if a.shape == self.buf.shape else a


def stats(xs: list[float]) -> str:
    return f"{min(xs):7.3f} {statistics.median(xs):7.3f} {max(xs):7.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (after a warm-up)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--trips", type=int, default=200, help="bare round trips per round")
    args = ap.parse_args()
    load_before = os.getloadavg()
    owns = start_ray()
    ray = import_ray()
    job = load_job(JOB)
    net = Net(job.neuralnet, seed=job.seed, base_dir=str(JOB.parent))
    specs = net.param_specs()
    clusters: dict[str, Cluster] = {}
    fns: dict[str, RemoteGradFn] = {}
    try:
        size = 0
        for name, kw in CONFIGS.items():
            params = ParamSet(specs)
            init_params(params, job.seed)
            size = params.values.size
            mine = job.copy()
            mine.cluster.update({**kw, "backend": "ray"})
            fns[name] = RemoteGradFn("paramserver.train.trainer:net_grad_fn",
                                     {"job": mine.to_json(), "base_dir": str(JOB.parent)})
            clusters[name] = Cluster(mine, params, checkpoint_freq=0)
        echo = ray.remote(Echo).remote(size)
        ray.get(echo.ping.remote())
        grads = np.ones(size, np.float32)

        def bare() -> float:
            t = time.perf_counter()
            for _ in range(args.trips):
                ray.get(echo.echo.remote(grads))
            return (time.perf_counter() - t) / args.trips * 1e3

        def step(name: str) -> float:
            t = time.perf_counter()
            clusters[name].run(fns[name], args.steps)
            return (time.perf_counter() - t) / args.steps * 1e3

        bare()  # warm-up: actors, nets, data, kernels
        for name in clusters:
            step(name)
        times: dict[str, list[float]] = {"bare": [], **{n: [] for n in clusters}}
        ratios: dict[str, list[float]] = {n: [] for n in clusters}
        for _ in range(args.rounds):
            b = bare()
            times["bare"].append(b)
            for name in clusters:
                s = step(name)
                times[name].append(s)
                ratios[name].append(s / b)
        load_after = os.getloadavg()
        print(f"main job: {JOB.name}, {size:,} float32 parameters ({size * 4 / 1e3:.1f} kB); "
              f"{args.rounds} rounds of {args.steps} steps and {args.trips} bare trips; "
              f"{os.cpu_count()} CPUs")
        print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
              f"{' '.join(f'{x:.2f}' for x in load_after)}")
        print(f"{'':26}{'ms: min  median     max':>24}   {'ratio: min median   max':>24}"
              "   target")
        print(f"{'bare round trip':26}{stats(times['bare'])}")
        for name in clusters:
            med = statistics.median(ratios[name])
            verdict = "ok" if med <= TARGETS[name] else "MISSED"
            print(f"{'step ' + name:26}{stats(times[name])}   {stats(ratios[name])}   "
                  f"<= {TARGETS[name]:g}: {verdict}")
    finally:
        for c in clusters.values():
            c.close()
        if owns:
            ray.shutdown()


if __name__ == "__main__":
    main()
