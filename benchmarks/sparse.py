"""Row-sparse tables (SPEC §10): step time and bytes per step, sparse against dense, and
paramserver's sparse updates against torch's, in one process.

Parts, each timed with its contenders interleaved round by round (so machine noise falls on
all alike), ``--rounds`` rounds of ``--steps`` steps after a warm-up round:

1. **Key-value steps on a large table** (``--rows`` × ``--dim`` float32, held by
   ``--servers`` embedded servers, updated with Adam): a step is ``row_sparse_pull`` of the
   batch's rows, then a ``push`` of their gradient as rows by id. Bytes are counted by a
   metered transport (what the messages would cost between processes); the worker's memory
   is the rows it pulled and pushes: compared with the table's size.
2. **Sparse against dense on a small table** (``--small-rows``): the same step, and the
   dense path's (``pull`` of the whole table, ``push`` of a whole gradient).
3. **The sparse Adam step against torch.optim.SparseAdam**, and sparse SGD against
   ``torch.optim.SGD`` with a sparse gradient, on the same table and the same batch (ids
   with repeats, as an embedding's backward makes them): paramserver's is
   ``coalesce_rows`` + :meth:`Updater.apply_rows`, torch's ``optimizer.step()`` given the
   uncoalesced sparse gradient.
4. **Bytes pushed with compression**: float32, bf16 and 2-bit of the same row push.

The issue's table is 2 × 10^7 rows × 50 (4 GB; with Adam's two state arrays 12 GB on the
servers); ``--rows`` sets the size so that it fits the machine: the default is 2 × 10^6
(400 MB). Ids follow a power law (Zipf, ``--zipf``), as in recommendation and language
models.

    python benchmarks/sparse.py [--rows 2000000] [--dim 50] [--batch 4096] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver import kv
from paramserver.cluster.transport import LocalTransport, MeteredTransport
from paramserver.params import coalesce_rows
from paramserver.updaters import create_updater

ADAM = {"type": "kAdam", "learning_rate": {"base_lr": 0.001}}
SGD = {"type": "kSGD", "learning_rate": {"base_lr": 0.01}}


def batches(rows: int, batch: int, n: int, zipf: float, seed: int = 0) -> list[np.ndarray]:
    """``n`` batches of ``batch`` ids in [0, rows), power-law distributed (repeats kept)."""
    rng = np.random.default_rng(seed)
    return [((rng.zipf(zipf, batch) - 1) % rows).astype(np.int64) for _ in range(n)]


def stats(xs: list[float], scale: float = 1e3) -> str:
    return (f"{min(xs) * scale:8.2f} {statistics.median(xs) * scale:8.2f} "
            f"{max(xs) * scale:8.2f}")


def interleave(contenders: dict[str, Callable[[int], object]], rounds: int, steps: int
               ) -> dict[str, list[float]]:
    """Per contender, the mean seconds per step of each round (after one warm-up round)."""
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds + 1):
        for name, fn in contenders.items():
            t = time.perf_counter()
            for s in range(steps):
                fn(r * steps + s)
            if r:
                out[name].append((time.perf_counter() - t) / steps)
    return out


def report(title: str, times: dict[str, list[float]], base: str | None = None) -> None:
    print(f"\n{title}  (ms per step: min median max{', ratio of medians' if base else ''})")
    for name, xs in times.items():
        ratio = ""
        if base is not None and name != base:
            ratio = f"   {statistics.median(times[base]) / statistics.median(xs):6.2f}x"
            ratio += f" faster than {base}"
        print(f"  {name:34s} {stats(xs)}{ratio}")


class Store:
    """A one-worker store whose transport counts bytes, with a table of ``rows × dim``."""

    def __init__(self, rows: int, dim: int, servers: int, updater: Any,
                 compression: Any = None, row_sparse: bool = True):
        self.meters: list[MeteredTransport] = []

        def metered(s: Any) -> MeteredTransport:
            self.meters.append(MeteredTransport(LocalTransport(s)))
            return self.meters[-1]

        self.store = kv.create("local", num_servers=servers, updater=updater,
                               compression=compression, transport=metered)
        self.store.init("emb", kv.Fill((rows, dim), init={"type": "kGaussian", "value": 0.01}),
                        row_sparse=row_sparse)
        self.dim = dim
        self.rows = rows

    @property
    def meter(self) -> MeteredTransport:
        return self.meters[0]

    def sparse_step(self, ids: np.ndarray, grad_rows: np.ndarray) -> np.ndarray:
        unique = np.unique(ids)
        got = self.store.row_sparse_pull("emb", row_ids=unique)
        self.store.push("emb", kv.RowSparse(ids, grad_rows))
        return got

    def dense_step(self, grad: np.ndarray, out: np.ndarray) -> None:
        self.store.pull("emb", out=out)
        self.store.push("emb", grad)

    def bytes(self) -> tuple[int, int]:
        self.store.wait()
        return sum(self.meter.sent.values()), sum(self.meter.received.values())

    def close(self) -> None:
        self.store.close()


def part_large(a: argparse.Namespace) -> None:
    table = a.rows * a.dim * 4
    print(f"\n1. key-value steps on a table of {a.rows:,} x {a.dim} float32 = "
          f"{table / 2**30:.2f} GiB on {a.servers} servers (Adam: {3 * table / 2**30:.2f} "
          "GiB with its state)")
    t = time.perf_counter()
    s = Store(a.rows, a.dim, a.servers, ADAM)
    print(f"   made and filled on the servers in {time.perf_counter() - t:.1f} s")
    ids = batches(a.rows, a.batch, a.steps * (a.rounds + 1), a.zipf)
    g = np.random.default_rng(1).standard_normal((a.batch, a.dim)).astype(np.float32) * 1e-3
    times = interleave({"sparse pull + push (Adam)": lambda i: s.sparse_step(ids[i], g)},
                       a.rounds, a.steps)
    report("   step time", times)
    s.meter.reset()
    n = min(20, len(ids))
    touched = []
    for i in range(n):
        touched.append(np.unique(ids[i]).size)
        got = s.sparse_step(ids[i], g)
    sent, received = s.bytes()
    rows = statistics.mean(touched)
    print(f"   rows touched per step: {rows:,.0f} of {a.rows:,} ({rows / a.rows:.3%})")
    print(f"   bytes per step: pushed {sent / n / 1e6:.3f} MB, pulled {received / n / 1e6:.3f} MB"
          f" ({(sent + received) / n / rows:.0f} B per row touched; the table is "
          f"{table / 1e6:,.0f} MB)")
    worker = got.nbytes + g.nbytes + ids[0].nbytes
    print(f"   the worker holds {worker / 1e6:.2f} MB = {worker / table:.4%} of the table")
    print("   bytes per step against rows touched (proportional: the same bytes per row)")
    for size in (a.batch // 4, a.batch, a.batch * 4):
        grow = np.ones((size, a.dim), np.float32) * 1e-3
        more = batches(a.rows, size, 5, a.zipf, seed=size)
        s.meter.reset()
        for b in more:
            s.sparse_step(b, grow)
        sent, received = s.bytes()
        touched = sum(np.unique(b).size for b in more)
        print(f"     batch {size:6d}: {touched / 5:8,.0f} rows, {(sent + received) / 5 / 1e6:7.3f}"
              f" MB per step, {(sent + received) / touched:5.0f} B per row")
    s.close()


def part_small(a: argparse.Namespace) -> None:
    rows = a.small_rows
    print(f"\n2. sparse against dense on a table of {rows:,} x {a.dim} "
          f"({rows * a.dim * 4 / 1e6:.0f} MB), Adam, batch {a.batch}")
    sparse = Store(rows, a.dim, a.servers, ADAM)
    dense = Store(rows, a.dim, a.servers, ADAM, row_sparse=False)
    ids = batches(rows, a.batch, a.steps * (a.rounds + 1), a.zipf, seed=2)
    g = np.random.default_rng(1).standard_normal((a.batch, a.dim)).astype(np.float32) * 1e-3
    full = np.zeros((rows, a.dim), np.float32)
    out = np.empty((rows, a.dim), np.float32)

    def dense_step(i: int) -> None:
        full[...] = 0
        np.add.at(full, ids[i], g)  # the embedding's dense gradient
        dense.dense_step(full, out)

    times = interleave({"dense pull + push": dense_step,
                        "sparse pull + push": lambda i: sparse.sparse_step(ids[i], g)},
                       a.rounds, a.steps)
    report("   step time", times, base="dense pull + push")
    dense.meter.reset()
    sparse.meter.reset()
    for i in range(10):
        dense_step(i)
        sparse.sparse_step(ids[i], g)
    (ds, dr), (ss, sr) = dense.bytes(), sparse.bytes()
    print(f"   bytes per step: dense {(ds + dr) / 10 / 1e6:.3f} MB, sparse "
          f"{(ss + sr) / 10 / 1e6:.3f} MB ({(ds + dr) / max(ss + sr, 1):.0f}x fewer)")
    dense.close()
    sparse.close()


def part_torch(a: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    rows, dim = a.rows, a.dim
    print(f"\n3. sparse updates against torch {torch.__version__} on a table of {rows:,} x {dim}"
          f", batch {a.batch} ids (with repeats)")
    ids = batches(rows, a.batch, a.steps * (a.rounds + 1), a.zipf, seed=3)
    g = np.random.default_rng(1).standard_normal((a.batch, dim)).astype(np.float32) * 1e-3
    g_t = torch.from_numpy(g)
    ids_t = [torch.from_numpy(i).reshape(1, -1) for i in ids]
    w0 = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32) * 0.01
    results = {}
    for method, conf, make in (
            ("Adam", ADAM, lambda p: torch.optim.SparseAdam([p], lr=1e-3, eps=1e-8)),
            ("SGD", SGD, lambda p: torch.optim.SGD([p], lr=0.01))):
        u = create_updater(conf)
        w = w0.reshape(-1).copy()
        state = u.init_state([0, w.size], np.float32)
        p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
        opt = make(p)

        def ours(i: int, u: Any = u, w: np.ndarray = w, state: Any = state) -> None:
            unique, summed = coalesce_rows(ids[i], g, dim, np.float32)
            u.apply_rows(i, w, unique, summed, dim, state)

        def theirs(i: int, p: Any = p, opt: Any = opt) -> None:
            p.grad = torch.sparse_coo_tensor(ids_t[i], g_t, (rows, dim),
                                             check_invariants=False)
            opt.step()

        times = interleave({f"torch {type(opt).__name__} (sparse grad)": theirs,
                            f"paramserver {method} apply_rows": ours}, a.rounds, a.steps)
        report(f"   {method}", times, base=f"torch {type(opt).__name__} (sparse grad)")
        results[method] = times
        del p, opt, w, state


def part_compression(a: argparse.Namespace) -> None:
    rows = a.small_rows
    print(f"\n4. bytes pushed per step with compression (a push of {a.batch} ids x {a.dim})")
    ids = batches(rows, a.batch, 5, a.zipf, seed=4)
    g = np.random.default_rng(1).standard_normal((a.batch, a.dim)).astype(np.float32) * 1e-3
    base = None
    for comp in (None, "bf16", {"type": "2bit", "threshold": 0.5e-3}):
        s = Store(rows, a.dim, 1, SGD, compression=comp)
        s.meter.reset()
        for i in ids:
            s.store.push("emb", kv.RowSparse(i, g))
        sent, _ = s.bytes()
        base = base or sent
        name = comp if isinstance(comp, str) else (comp or {}).get("type", "float32")
        print(f"   {name:8s} {sent / len(ids) / 1e3:10.1f} kB per push   "
              f"{base / sent:5.1f}x fewer than float32 (ids included)")
        s.close()
    print("   (with compression the sorted row ids travel as varints of their differences; "
          "of the values alone, 2-bit is 1/16 of float32)")
    dense_sizes = {}
    for comp in (None, {"type": "2bit", "threshold": 0.5e-3}):
        s = Store(rows, a.dim, 1, SGD, compression=comp, row_sparse=False)
        s.meter.reset()
        full = np.zeros((rows, a.dim), np.float32)
        s.store.push("emb", full)
        dense_sizes[str(comp)] = s.bytes()[0]
        s.close()
    f32, two = dense_sizes["None"], dense_sizes[str({"type": "2bit", "threshold": 0.5e-3})]
    print(f"   a dense push of the {rows:,}-row table: float32 {f32 / 1e6:.2f} MB, 2-bit "
          f"{two / 1e6:.3f} MB ({f32 / two:.1f}x fewer; target >= 12x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000,
                    help="rows of the large table (the issue's target: 20000000)")
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--small-rows", type=int, default=100_000,
                    help="rows of the table the dense path is compared on")
    ap.add_argument("--batch", type=int, default=4096, help="ids per step")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--zipf", type=float, default=1.2, help="the ids' power-law exponent")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--parts", nargs="+", default=["large", "small", "torch", "compression"],
                    choices=["large", "small", "torch", "compression"])
    a = ap.parse_args()
    if a.rounds < 5:
        ap.error("--rounds must be at least 5")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} CPUs")
    for part in a.parts:
        globals()[f"part_{part}"](a)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
