"""A training step on Ray against a bare Ray actor round trip and against the embedded step.

Targets (issue "Many machines for real"): a training step of the main job's model
(``examples/digits_mlp.conf``: an MLP on the 8×8 digits, 9,610 float32 parameters) on Ray
costs at most 1.5 × a bare Ray actor round trip carrying the same bytes with 1 worker and 1
server, and at most 2.5 × with 2 workers and 2 servers; and the Ray step of 1 worker and 1
server costs at most 3 × the embedded step of the same job. All measured in this process.

Contenders, interleaved round after round so that they see the same load
(:mod:`_timing`):

- bare: ``ray.get(actor.echo.remote(grads))`` from this process to an actor that returns an
  array as large (the model's gradients out, its values back: the bytes of one step's
  exchange), ``--trips`` times per call;
- embedded 1×1: ``Cluster.run`` of ``--steps`` steps of the main job on the embedded
  cluster (its net, its data, its updater), 1 worker and 1 server;
- Ray 1×1, Ray 2×2: the same on Ray (the workers build their nets from the job, as
  ``paramserver train --backend ray`` does), 1 worker and 1 server, then 2 and 2;
- Ray 1×1 graph, Ray 2×2 graph: the same through a Compiled Graph (``compiled=True``),
  against which the default path (links on one node, actor calls across nodes) is
  compared, without a target.

With ``--nodes``, the script starts a Ray of three nodes on this machine
(``ray.cluster_utils``: a head, a node for the servers and the bare actor, a node for the
workers), so that every message of a step crosses from one node's raylet to another's, as
between machines (less the network): the default path is then actor calls, not links.

A step's cost is a run's time over its steps (the run's start and end included). Each round
gives one ratio per target (both figures of the same round); a target is met when the
median ratio is within it. Printed: min / median / max of every time and ratio, and the
load average before and after.

Run: ``python benchmarks/ray_step.py [--rounds 5] [--steps 200] [--trips 200] [--nodes]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as paramserver's actors do

import numpy as np
from _timing import Spread, interleaved, load_average, ratios, rounds_arg

from paramserver.cluster import Cluster, RemoteGradFn
from paramserver.cluster.ray_backend import import_ray, loopback_only, start_ray
from paramserver.config.job import load_job
from paramserver.init import init_params
from paramserver.params import ParamSet
from paramserver.train.net import Net

JOB = Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.conf"
#: Contender: (backend, workers and servers per group, through a Compiled Graph).
CONFIGS = {"embedded 1x1": ("local", 1, False), "Ray 1x1": ("ray", 1, False),
           "Ray 2x2": ("ray", 2, False), "Ray 1x1 graph": ("ray", 1, True),
           "Ray 2x2 graph": ("ray", 2, True)}
#: Target: (numerator, denominator, most).
TARGETS = {"Ray 1x1 / bare": ("Ray 1x1", "bare", 1.5),
           "Ray 2x2 / bare": ("Ray 2x2", "bare", 2.5),
           "Ray 1x1 / embedded 1x1": ("Ray 1x1", "embedded 1x1", 3.0)}
#: Ratios shown without a target: the default path (links on one node) against the graph.
COMPARED = {"Ray 1x1 / Ray 1x1 graph": ("Ray 1x1", "Ray 1x1 graph"),
            "Ray 2x2 / Ray 2x2 graph": ("Ray 2x2", "Ray 2x2 graph")}


class Echo:
    """The baseline: an actor that returns an array as large as the one it is sent."""

    def __init__(self, n: int):
        self.buf = np.ones(n, np.float32)

    def ping(self) -> int:
        return 0

    def echo(self, a: np.ndarray) -> np.ndarray:
        return self.buf if a.shape == self.buf.shape else a


#: Where the actors go on the three nodes of ``--nodes`` (each node has its resource).
ON_NODES = {"server_options": {"num_cpus": 0, "resources": {"server": 1}},
            "worker_options": {"num_cpus": 0, "resources": {"worker": 1}}}


@contextlib.contextmanager
def three_nodes() -> Iterator[None]:
    """A Ray of three nodes on this machine, this process connected to it, while it lasts."""
    ray = import_ray()
    from ray.cluster_utils import Cluster as RayNodes

    with loopback_only():
        nodes = RayNodes(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": False, "object_store_memory": 200 << 20})
        for name in ("server", "worker"):
            nodes.add_node(num_cpus=2, resources={name: 100}, object_store_memory=200 << 20)
        ray.init(address=nodes.address, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()
        nodes.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rounds_arg(ap)
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--trips", type=int, default=200, help="bare round trips per call")
    ap.add_argument("--per-round", type=float, default=1.0,
                    help="seconds of calls per contender and round (at least 3 calls)")
    ap.add_argument("--nodes", action="store_true",
                    help="servers and workers on two nodes of a three-node Ray of this machine")
    args = ap.parse_args()
    load_before = load_average()
    with contextlib.ExitStack() as stack:
        if args.nodes:
            stack.enter_context(three_nodes())
        measure(args, load_before)


def measure(args: argparse.Namespace, load_before: str) -> None:
    owns = start_ray()
    ray = import_ray()
    placed: dict[str, Any] = ON_NODES if args.nodes else {}
    job = load_job(JOB)
    specs = Net(job.neuralnet, seed=job.seed, base_dir=str(JOB.parent)).param_specs()
    clusters: dict[str, Cluster] = {}
    try:
        size = 0
        fns: dict[str, RemoteGradFn] = {}
        for name, (backend, n, graph) in CONFIGS.items():
            params = ParamSet(specs)
            init_params(params, job.seed)
            size = params.values.size
            mine = job.copy()
            mine.cluster.update({"backend": backend, "nworkers_per_group": n,
                                 "nservers_per_group": n})
            fns[name] = RemoteGradFn("paramserver.train.trainer:net_grad_fn",
                                     {"job": mine.to_json(), "base_dir": str(JOB.parent)})
            options = {"compiled": True} if graph else {}
            if backend == "ray":
                options.update(placed)
            clusters[name] = Cluster(mine, params, checkpoint_freq=0, **options)
        echo = ray.remote(Echo).options(**placed.get("server_options", {})).remote(size)
        ray.get(echo.ping.remote())
        grads = np.ones(size, np.float32)

        def bare() -> None:
            for _ in range(args.trips):
                ray.get(echo.echo.remote(grads))

        def run(name: str) -> None:
            clusters[name].run(fns[name], args.steps)

        contenders = {"bare": bare, **{n: (lambda n=n: run(n)) for n in clusters}}
        seconds = interleaved(contenders, args.rounds, args.per_round)
        per = {"bare": args.trips, **dict.fromkeys(clusters, args.steps)}
        ms = {n: [s / per[n] * 1e3 for s in xs] for n, xs in seconds.items()}
        print(f"main job: {JOB.name}, {size:,} float32 parameters ({size * 4 / 1e3:.1f} kB); "
              f"{args.rounds} rounds; a call: {args.steps} steps or {args.trips} bare "
              f"trips; {os.cpu_count()} CPUs; "
              f"{'servers and workers on two nodes' if args.nodes else 'one Ray node'}")
        print(f"load average before {load_before}, after {load_average()}")
        print(f"{'':26}{'ms: median [min-max]':>26}")
        for name, xs in ms.items():
            label = "bare round trip" if name == "bare" else f"step {name}"
            print(f"{label:26}{Spread.of(xs).fmt(3):>26}")
        print(f"{'':26}{'ratio: median [min-max]':>26}   target")
        for label, (num, den, most) in TARGETS.items():
            r = ratios(ms[num], ms[den])
            verdict = "ok" if r.median <= most else "MISSED"
            print(f"{label:26}{r.fmt(2):>26}   <= {most:g}: {verdict}")
        for label, (num, den) in COMPARED.items():
            print(f"{label:26}{ratios(ms[num], ms[den]).fmt(2):>26}")
    finally:
        for c in clusters.values():
            c.close()
        if owns:
            ray.shutdown()


if __name__ == "__main__":
    main()
