"""paramserver's key-value store against MXNet 1.9.1's KVStore and ps-lite, side by side.

Contenders, per configuration:

- ``local``: MXNet's ``local`` store (a process of MXNet's side venv) against paramserver's
  embedded store (``kv.create("local")``, in this process);
- ``1x1`` and ``2x2`` (workers x servers): MXNet's ``dist_sync`` — ps-lite's scheduler,
  servers and workers, started here on 127.0.0.1 with the ``DMLC_*`` variables — against
  paramserver's ``dist_sync`` store on Ray (its servers and workers are Ray actors, one
  process each), workers driven by ``store.run``.

Shapes (``_workload.py``): one key of 4M float32; 200 keys of 4,096; 10,000 keys of 64; a
row-sparse table of 1M x 64 with 4,096 rows pushed and pulled (``row_sparse_pull``); the
SGD-momentum and Adam updates of a 4M key through the store. A step is a push of every key
of the shape and a pull of it (fresh arrays every step); a call runs one untimed step and
then ``--iters`` timed ones, and the call's figure is their median. Calls of the two
contenders alternate, ``--rounds`` rounds (the first contender alternates too); each call's
pulled values are checked on every worker (exactly: the sum of the workers' pushes; with an
update method, within 2e-4 of the rule computed in float64). Printed: per shape the time of
a step of each (median [min–max] over the rounds, ms), the ratio paramserver / MXNet (the
median of the per-round ratios), the load average, and the CPU time of worker 0's process
per step (all its threads; on a loaded machine the load-independent part of the cost —
with ``local`` it is the whole of it for paramserver, whose servers are in that process).

Run (from the repository root, with paramserver's venv)::

    python benchmarks/peers/kv_mxnet.py [--mxnet-venv PATH] [--configs local,1x1,2x2]
        [--shapes SUBSTRING,...] [--rounds 5] [--iters 5] [--json OUT]

MXNet's side venv: ``--mxnet-venv`` or ``MXNET_VENV``; by default
``benchmarks/peers/.mxnet-venv``, made with pip when missing (``mxnet_venv.py``). Without it
the benchmark says why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from _timing import Spread, load_average, rounds_arg  # noqa: E402
from _workload import (  # noqa: E402
    BETA1,
    BETA2,
    EPS,
    LR,
    MOMENTUM,
    PHASES,
    SHAPES,
    TABLE_INIT,
    Grads,
    Reference,
    initial,
    row_ids,
    sample,
    shapes_of,
)
from mxnet_venv import find_or_make  # noqa: E402

from paramserver import kv  # noqa: E402

SIDE = HERE / "_mxnet_side.py"


# -- paramserver's side -----------------------------------------------------------------------

def ps_updater(phase: str) -> dict[str, Any] | None:
    if phase == "sgd":
        return {"type": "kSGD", "momentum": MOMENTUM, "learning_rate": {"base_lr": LR["sgd"]}}
    if phase == "adam":
        return {"type": "kAdam", "delta": EPS, "learning_rate": {"base_lr": LR["adam"]},
                "adam_conf": {"beta1": BETA1, "beta2": BETA2}}
    return None


def ps_init(store: Any, shapes: list[str]) -> None:
    """The shapes' keys (the maker's store initialises them; workers ask for them)."""
    for name in shapes:
        s = SHAPES[name]
        init = initial(name)
        if s.get("rows"):
            fill = kv.Fill(s["shape"], {"type": "kConstant", "value": TABLE_INIT})
            store.init(s["keys"][0], fill, row_sparse=True)
        elif init is not None:
            store.init(s["keys"][0], init.reshape(s["shape"]))
        else:
            store.init(s["keys"], [np.zeros(s["shape"], np.float32) for _ in s["keys"]])


def ps_steps(store: Any, name: str, first: int, iters: int) -> dict[str, Any]:
    """Steps ``first ..`` of a shape on one worker's store: as the MXNet side's."""
    s = SHAPES[name]
    g = Grads(name, store.rank)
    keys = s["keys"]
    times: list[float] = []
    cpu: list[float] = []
    outs: list[np.ndarray] = []
    for step in range(first, first + iters):
        if s.get("rows"):
            ids = row_ids(step, s["rows"], s["shape"][0])
            rows = g.at(step)[0].reshape(len(ids), -1)
            out = np.empty_like(rows)
            t0, c0 = time.perf_counter(), time.process_time()
            store.push(keys[0], kv.RowSparse(ids, rows))
            store.row_sparse_pull(keys[0], out=out, row_ids=ids)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            outs = [out]
        else:
            pushed = [a.reshape(s["shape"]) for a in g.at(step)]
            pulled = [np.empty(s["shape"], np.float32) for _ in keys]
            t0, c0 = time.perf_counter(), time.process_time()
            if len(keys) == 1:
                store.push(keys[0], pushed[0])
                store.pull(keys[0], out=pulled[0])
            else:
                store.push(keys, pushed)
                store.pull(keys, out=pulled)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            outs = pulled
    return {"rank": store.rank, "times": times[1:], "cpu": cpu[1:], "sample": sample(outs)}


class PsEmbedded:
    name = "paramserver embedded"

    def __init__(self, shapes: list[str]) -> None:
        self.store = kv.create("local")
        ps_init(self.store, shapes)

    def phase(self, phase: str) -> None:
        self.store.set_updater(ps_updater(phase))

    def run(self, name: str, first: int, iters: int) -> list[dict[str, Any]]:
        return [ps_steps(self.store, name, first, iters)]

    def close(self) -> None:
        self.store.close()


class PsRay:
    name = "paramserver Ray"

    def __init__(self, workers: int, servers: int, shapes: list[str]) -> None:
        self.store = kv.create("dist_sync", num_workers=workers, num_servers=servers,
                               backend="ray", timeout=600.0)
        ps_init(self.store, shapes)

    def phase(self, phase: str) -> None:
        self.store.set_updater(ps_updater(phase))

    def run(self, name: str, first: int, iters: int) -> list[dict[str, Any]]:
        return self.store.run(ps_steps, name, first, iters)

    def close(self) -> None:
        self.store.close()


# -- MXNet's side ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MXNet:
    """MXNet's store for one phase: a ``local`` process, or ps-lite's processes."""

    def __init__(self, python: Path, phase: str, workers: int, servers: int, dist: bool,
                 log: Any):
        self.name = "MXNet dist_sync" if dist else "MXNet local"
        self.procs: list[subprocess.Popen[str]] = []
        self.workers: list[subprocess.Popen[str]] = []
        env = dict(os.environ, PS_VERBOSE="0")
        env.pop("PYTHONPATH", None)
        if dist:
            env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                       DMLC_NUM_SERVER=str(servers), DMLC_NUM_WORKER=str(workers),
                       DMLC_NODE_HOST="127.0.0.1")
            # scheduler and servers: importing mxnet with DMLC_ROLE set runs them
            for role in ["scheduler"] + ["server"] * servers:
                self.procs.append(subprocess.Popen(
                    [str(python), "-c", "import mxnet"], env=dict(env, DMLC_ROLE=role),
                    stdout=log, stderr=log, text=True))
        for _ in range(workers):
            p = subprocess.Popen([str(python), str(SIDE), "dist_sync" if dist else "local",
                                  phase], env=dict(env, DMLC_ROLE="worker"),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                 text=True)
            self.workers.append(p)
            self.procs.append(p)
        for p in self.workers:
            line = self._line(p)
            if line.strip() != "ready":
                raise RuntimeError(f"{self.name}: a worker said {line!r} (see the log)")

    def _line(self, p: subprocess.Popen[str]) -> str:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: a worker ended (exit {p.wait()}; see the log)")
        return line

    def run(self, name: str, first: int, iters: int) -> list[dict[str, Any]]:
        cmd = json.dumps({"shape": name, "first": first, "iters": iters}) + "\n"
        for p in self.workers:
            assert p.stdin is not None
            p.stdin.write(cmd)
            p.stdin.flush()
        return [json.loads(self._line(p)) for p in self.workers]

    def close(self) -> None:
        for p in self.workers:
            try:
                assert p.stdin is not None
                p.stdin.write("\n")
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- the run -----------------------------------------------------------------------------------

CONFIGS = {"local": (1, 1), "1x1": (1, 1), "2x2": (2, 2)}


def measure(contenders: list[Any], name: str, workers: int, rounds: int, iters: int
            ) -> dict[str, Any]:
    """Interleaved rounds of one shape; every call's values checked."""
    ref = Reference(name, workers)
    per: dict[str, list[float]] = {c.name: [] for c in contenders}
    cpu: dict[str, list[float]] = {c.name: [] for c in contenders}
    for r in range(rounds):
        first = r * (iters + 1)
        for step in range(first, first + iters + 1):
            ref.step(step)
        order = contenders if r % 2 == 0 else contenders[::-1]
        for c in order:
            replies = c.run(name, first, iters + 1)
            for reply in replies:
                wrong = ref.check(reply["sample"], f"{c.name} rank {reply['rank']}")
                if wrong and c.name == "MXNet dist_sync" and SHAPES[name].get("rows"):
                    # ps-lite's servers without an optimizer do not leave a table's pushed
                    # rows as the values (measured; paramserver's are checked)
                    if r == 0:
                        print(f"   (not checked: {wrong})", flush=True)
                elif wrong:
                    raise SystemExit(f"kv_mxnet: wrong values: {wrong}")
            rank0 = next(x for x in replies if x["rank"] == 0)
            per[c.name].append(statistics.median(rank0["times"]))
            cpu[c.name].append(statistics.median(rank0["cpu"]))
    mx_name = contenders[0].name
    ps_name = contenders[1].name
    return {"shape": name, "mxnet": per[mx_name], "paramserver": per[ps_name],
            "ratio": [p / m for p, m in zip(per[ps_name], per[mx_name], strict=True)],
            "mxnet_cpu": cpu[mx_name], "paramserver_cpu": cpu[ps_name],
            "load": load_average()}


def run_config(config: str, python: Path, shapes: list[str], rounds: int, iters: int,
               log: Any) -> list[dict[str, Any]]:
    workers, servers = CONFIGS[config]
    dist = config != "local"
    what = ("MXNet dist_sync (ps-lite) vs paramserver on Ray" if dist
            else "MXNet local vs paramserver embedded")
    print(f"\n== {config}: {what} ({workers} worker(s) x {servers} server(s)); "
          f"load average {load_average()}", flush=True)
    t0 = time.perf_counter()
    ps: Any = PsRay(workers, servers, shapes) if dist else PsEmbedded(shapes)
    print(f"   paramserver store made and {sum(len(SHAPES[n]['keys']) for n in shapes):,} "
          f"keys initialised in {time.perf_counter() - t0:.1f} s", flush=True)
    results = []
    try:
        for phase in PHASES:
            names = [n for n in shapes_of(phase) if n in shapes]
            if not names:
                continue
            ps.phase(phase)
            mx = MXNet(python, phase, workers, servers, dist, log)
            try:
                for name in names:
                    res = measure([mx, ps], name, workers, rounds, iters)
                    res["config"] = config
                    results.append(res)
                    ms = 1000.0
                    print(f"   {name:32s} MXNet {Spread.of(res['mxnet']).scaled(ms).fmt()} ms"
                          f"  paramserver {Spread.of(res['paramserver']).scaled(ms).fmt()} ms"
                          f"  ratio {Spread.of(res['ratio']).fmt()}  (load {res['load']})"
                          f"\n   {'':32s} CPU of worker 0's process: MXNet "
                          f"{Spread.of(res['mxnet_cpu']).scaled(ms).fmt()} ms  paramserver "
                          f"{Spread.of(res['paramserver_cpu']).scaled(ms).fmt()} ms",
                          flush=True)
            finally:
                mx.close()
    finally:
        ps.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mxnet-venv", default=None,
                        help="MXNet's side venv (default: MXNET_VENV, else "
                             "benchmarks/peers/.mxnet-venv, made with pip when missing)")
    parser.add_argument("--configs", default="local,1x1,2x2",
                        help="local, 1x1, 2x2 (workers x servers), comma-separated")
    parser.add_argument("--shapes", default="",
                        help="only shapes whose name holds one of these, comma-separated")
    rounds_arg(parser)
    parser.add_argument("--iters", type=int, default=5, help="timed steps per call (5)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        parser.error(f"unknown configurations {bad}; known: {', '.join(CONFIGS)}")
    wanted = [w.strip() for w in args.shapes.split(",") if w.strip()]
    shapes = [n for n in SHAPES if not wanted or any(w in n for w in wanted)]
    python, why = find_or_make(args.mxnet_venv)
    if python is None:
        print(f"kv_mxnet: skipped: {why}")
        return 0
    print(f"kv_mxnet: MXNet from {python}; {args.rounds} rounds of {args.iters} timed steps; "
          f"load average {load_average()}", flush=True)
    results = []
    with open(HERE / ".kv_mxnet.log", "w") as log:
        for config in configs:
            results += run_config(config, python, shapes, args.rounds, args.iters, log)
    print(f"\nload average at the end {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
