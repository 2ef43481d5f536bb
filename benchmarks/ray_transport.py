"""Push and pull through paramserver's Ray backend against a bare Ray actor, in one run.

Target (issue "Scale out on Ray"): push + pull through paramserver at >= 0.8 × the bare Ray
actor doing the same transfer, measured in the same run (16M float32 parameters).

Both sides are driven from this process, alternately, round after round, so that pairs see
the same load; the ratio reported is the median of the per-round ratios
(bare time / paramserver time, i.e. paramserver's throughput over the bare actor's):

- paramserver: a :class:`~paramserver.cluster.worker.Worker` stub here, with its own replica,
  talks to the server actors of a ``Cluster`` with ``backend: ray`` over the backend's
  transport, exactly as a worker actor does:
  * push + pull: one training step's exchange, ``push`` then ``collect``: the non-finite
    check, the gradients to the server through the object store, the server's update
    (kSGD), the values back (one object-store copy), copied into the replica;
  * pull: a ``Get``: the values, copied into the replica;
  * push: an ``Update`` whose reply's values are not fetched;
- bare: an actor with a 16M float32 buffer: ``echo(grads)`` returns its buffer (push +
  pull), ``send()`` returns it (pull), ``recv(grads)`` returns its length (push).

Then the round-trip time of a 1 KB message (256 float32 values): a training step's exchange
through paramserver (one server) against the bare ``echo``.

Run: ``python benchmarks/ray_transport.py [--params-m 16] [--rounds 20] [--servers 1]
[--address HOST:6379]`` (without an address it starts a local Ray on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# As in a worker actor (paramserver's actors set it): idle OpenMP threads of the worker
# stub's non-finite check sleep instead of spinning beside Ray's copies. Before numba loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

from paramserver.cluster import Cluster, Worker
from paramserver.cluster.messages import Update
from paramserver.cluster.passes import all_finite
from paramserver.cluster.ray_backend import import_ray, start_ray
from paramserver.cluster.ray_wire import encode
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet
from paramserver.updaters import create_updater

UPDATER = {"type": "kSGD", "learning_rate": {"base_lr": 1e-6}}
TARGET = 0.8


class Bare:
    """The baseline: an actor that only moves arrays."""

    def __init__(self, n: int):
        self.buf = np.ones(n, np.float32)

    def ping(self) -> int:
        return 0

    def recv(self, a: np.ndarray) -> int:
        return int(a.shape[0])

    def send(self) -> np.ndarray:
        return self.buf

    def echo(self, a: np.ndarray) -> np.ndarray:
        return self.buf if a.shape == self.buf.shape else a


def model(n: int) -> ParamSet:
    size = 1 << 20
    shapes = [(f"w{i}", (min(size, n - i * size),)) for i in range((n + size - 1) // size)]
    ps = ParamSet(shapes, np.float32)
    ps.values[:] = np.random.default_rng(0).standard_normal(ps.values.size) * 0.01
    return ps


class Client:
    """A worker stub in this process, on the server actors of a Cluster on Ray."""

    def __init__(self, n: int, servers: int):
        self.params = model(n)
        conf = ClusterConf(nservers_per_group=servers, timeout=120.0, backend="ray")
        self.cluster = Cluster(conf, self.params, UPDATER, max_restarts=0)
        replica = self.params.replica(self.params.values.copy())
        replica.grads[:] = 1e-3
        self.worker = Worker(0, 0, replica, self.cluster.layouts, self.cluster.transport,
                             self.cluster.conf)
        self.step = 0
        self.worker.pull(0)  # the servers serve from step 0 (the cluster put its values)

    def push_pull(self) -> None:
        self.worker.collect(self.worker.push(self.step), self.step)
        self.step += 1

    def pull(self) -> None:
        self.worker.pull(self.step)

    def push(self) -> None:
        ray = import_ray()
        w = self.worker
        refs = [self.cluster.transport.handles[(0, L.index)].call.remote(
            *encode(Update(0, 0, self.step, w._grads[i]))) for i, L in enumerate(w._layouts)]
        for ref in refs:
            reply = ray.get(ref)
            assert reply[0] == "Values", reply
        self.step += 1

    def close(self) -> None:
        self.cluster.close()


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params-m", type=int, default=16, help="model size in 2^20 values")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds (after 3 warm-ups)")
    ap.add_argument("--servers", type=int, default=1, help="paramserver's servers")
    ap.add_argument("--address", help="an existing Ray cluster (default: a local one)")
    args = ap.parse_args()
    owns = start_ray(args.address)
    ray = import_ray()
    n = args.params_m << 20
    try:
        bare = ray.remote(Bare).remote(n)
        ray.get(bare.ping.remote())
        client = Client(n, args.servers)
        grads = client.worker._grads[0] if args.servers == 1 else client.worker.params.grads
        cases = {
            "push + pull": (lambda: ray.get(bare.echo.remote(grads)), client.push_pull),
            "pull": (lambda: ray.get(bare.send.remote()), client.pull),
            "push": (lambda: ray.get(bare.recv.remote(grads)), client.push),
        }
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
        for r in range(args.rounds + 3):
            for name, (b, p) in cases.items():
                tb, tp = timed(b), timed(p)
                if r >= 3:
                    times[name][0].append(tb)
                    times[name][1].append(tp)
        mb = n * 4 / 1e6
        print(f"{n:,} float32 parameters ({mb:.0f} MB), {args.servers} server(s), "
              f"{args.rounds} rounds; medians")
        print(f"{'transfer':<12} {'bare Ray actor':>20} {'paramserver':>20} {'ratio':>7}")
        ratios = {}
        for name, (tb, tp) in times.items():
            ratio = statistics.median(b / p for b, p in zip(tb, tp, strict=True))
            ratios[name] = ratio
            mbs = mb * (2 if name == "push + pull" else 1)
            bt, pt = statistics.median(tb), statistics.median(tp)
            print(f"{name:<12} {bt * 1e3:8.1f} ms {mbs / bt / 1e3:5.2f} GB/s "
                  f"{pt * 1e3:8.1f} ms {mbs / pt / 1e3:5.2f} GB/s {ratio:7.2f}")
        # What paramserver does beyond moving the arrays, timed here on the same arrays.
        up = create_updater(UPDATER)
        w, g = client.params.values.copy(), client.worker.params.owner_grads()
        state = up.init_state([0, n], np.float32)
        work = {"non-finite check": lambda: all_finite(g),
                "server's update (kSGD)": lambda: up.apply(0, w, g, state),
                "copy into the replica": lambda: np.copyto(w, g)}
        parts = {k: statistics.median(timed(f) for _ in range(7)) * 1e3
                 for k, f in work.items()}
        print("paramserver's own work in a push + pull, timed in this process: "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items()))
        client.close()

        # 1 KB round trip
        small = Client(256, 1)
        tiny = np.ones(256, np.float32)
        lat_b, lat_p = [], []
        for r in range(203):
            tb = timed(lambda: ray.get(bare.echo.remote(tiny)))
            tp = timed(small.push_pull)
            if r >= 3:
                lat_b.append(tb)
                lat_p.append(tp)
        small.close()
        print(f"1 KB round trip: bare actor {statistics.median(lat_b) * 1e6:.0f} µs, "
              f"paramserver step {statistics.median(lat_p) * 1e6:.0f} µs "
              f"(median of 200)")
        verdict = "meets" if ratios["push + pull"] >= TARGET else "misses"
        print(f"push + pull through paramserver: {ratios['push + pull']:.2f} × the bare actor "
              f"({verdict} the target {TARGET})")
    finally:
        if owns:
            ray.shutdown()


if __name__ == "__main__":
    main()

