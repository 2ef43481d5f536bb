"""A click-through model with large embedding tables, trained with the key-value API.

A logistic matrix factorisation: the probability that user ``u`` clicks item ``i`` is
``sigmoid(U[u] · V[i] + b[i])``. The data are generated: hidden factors of a few dimensions
give each (user, item) pair its true click probability, and users and items are drawn from a
power law (Zipf), as the ids of recommendation and language models are — a few very
frequent, most rare. ``U``, ``V`` and ``b`` are row-sparse keys (SPEC §10): the servers hold
them, sliced by rows; each worker pulls the rows of its share of a step's batch
(``row_sparse_pull``), computes the gradient of its examples and pushes it as rows by id;
in ``dist_sync`` the servers sum every worker's rows and update the rows touched (lazily:
Adam's state of the other rows does not decay).

    python examples/embedding/train.py                         # embedded, 2 workers
    python examples/embedding/train.py --backend ray           # the same on Ray
    python examples/embedding/train.py --compression 2bit --threshold 0.002

It prints the held-out log loss before and after training (and that of always predicting
the base rate: a model that learnt nothing), every ``--disp`` steps the training loss, and the
bytes the workers pushed.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver import kv


@dataclass
class Data:
    """Generated clicks: ``users``, ``items`` (ids) and ``clicks`` (0/1), train and test."""

    users: np.ndarray
    items: np.ndarray
    clicks: np.ndarray
    test_users: np.ndarray
    test_items: np.ndarray
    test_clicks: np.ndarray


def make_data(num_users: int, num_items: int, examples: int, zipf: float = 1.3,
              rank: int = 4, seed: int = 0) -> Data:
    """Clicks from hidden factors of ``rank`` dimensions, ids power-law distributed."""
    rng = np.random.default_rng(seed)
    true_u = rng.standard_normal((num_users, rank)).astype(np.float32)
    true_v = rng.standard_normal((num_items, rank)).astype(np.float32)
    # A power law over ids, its frequent ids spread over the table (not all at its start).
    u_perm, i_perm = rng.permutation(num_users), rng.permutation(num_items)
    n = examples + examples // 5
    users = u_perm[(rng.zipf(zipf, n) - 1) % num_users]
    items = i_perm[(rng.zipf(zipf, n) - 1) % num_items]
    logit = np.einsum("nk,nk->n", true_u[users], true_v[items]) - 1.0
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return Data(users[:examples], items[:examples], clicks[:examples],
                users[examples:], items[examples:], clicks[examples:])


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def predict(store: kv.KVStore, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    u = store.row_sparse_pull("U", row_ids=users)
    v = store.row_sparse_pull("V", row_ids=items)
    b = store.row_sparse_pull("b", row_ids=items)[:, 0]
    return 1 / (1 + np.exp(-(np.einsum("nk,nk->n", u, v) + b)))


@dataclass
class Job:
    data: Data
    num_users: int
    num_items: int
    dim: int
    steps: int
    batch: int
    disp: int
    seed: int


def train(store: kv.KVStore, job: Job) -> dict[str, Any]:
    """One worker's loop: its share of every step's batch; the losses it saw."""
    d = job.data
    if store.rank == 0:  # the others learn of the keys from the servers
        store.init(["U", "V", "b"],
                   [kv.Fill((job.num_users, job.dim), {"type": "kGaussian", "value": 0.1},
                            seed=job.seed),
                    kv.Fill((job.num_items, job.dim), {"type": "kGaussian", "value": 0.1},
                            seed=job.seed + 1),
                    np.zeros((job.num_items, 1), np.float32)],
                   row_sparse=True)
    store.barrier()
    losses = []
    n = d.users.size
    for step in range(job.steps):
        lo = (step * job.batch) % (n - job.batch + 1)
        share = slice(lo + store.rank, lo + job.batch, store.num_workers)
        users, items, y = d.users[share], d.items[share], d.clicks[share]
        u = store.row_sparse_pull("U", row_ids=users)
        v = store.row_sparse_pull("V", row_ids=items)
        b = store.row_sparse_pull("b", row_ids=items)
        p = 1 / (1 + np.exp(-(np.einsum("nk,nk->n", u, v) + b[:, 0])))
        losses.append(log_loss(p, y))
        # d(mean log loss over the whole batch)/d(logit): the workers' pushes are summed
        g = ((p - y) / job.batch).astype(np.float32)[:, None]
        store.push(["U", "V", "b"], [kv.RowSparse(users, g * v), kv.RowSparse(items, g * u),
                                     kv.RowSparse(items, g)])
    store.wait()
    return {"losses": losses}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["local", "ray"], default="local")
    ap.add_argument("--mode", choices=["dist_sync", "dist_async"], default="dist_sync")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--examples", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--compression", choices=["none", "bf16", "2bit"], default="none")
    ap.add_argument("--threshold", type=float, default=0.002,
                    help="2-bit compression's threshold (of the size of large gradients)")
    ap.add_argument("--disp", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    data = make_data(a.users, a.items, a.examples, seed=a.seed)
    compression = (None if a.compression == "none" else a.compression
                   if a.compression == "bf16" else {"type": "2bit", "threshold": a.threshold})
    updater = {"type": "kAdam", "learning_rate": {"base_lr": a.lr}}
    base_rate = float(data.clicks.mean())
    baseline = log_loss(np.full(data.test_clicks.size, base_rate), data.test_clicks)
    job = Job(data, a.users, a.items, a.dim, a.steps, a.batch, a.disp, a.seed)
    t = time.perf_counter()
    with kv.create(a.mode, num_workers=a.workers, num_servers=a.servers, backend=a.backend,
                   updater=updater, compression=compression) as store:
        results = store.run(train, job)
        seconds = time.perf_counter() - t
        test = log_loss(predict(store, data.test_users, data.test_items), data.test_clicks)
    losses = np.mean([r["losses"] for r in results], axis=0)
    for step in range(0, a.steps, a.disp):
        print(f"step {step:5d}  training loss {losses[step:step + a.disp].mean():.4f}")
    first = float(losses[:10].mean())
    last = float(losses[-max(1, min(a.disp, a.steps) // 2):].mean())
    print(f"held-out log loss {test:.4f} (the base rate's {baseline:.4f}); training loss "
          f"{first:.4f} -> {last:.4f}; {a.steps} steps in {seconds:.1f} s on {a.backend} "
          f"({a.mode}, {a.workers} workers, {a.servers} servers, compression "
          f"{a.compression}); tables of {a.users:,} + {a.items:,} rows x {a.dim}")
    return {"test_loss": test, "baseline_loss": baseline, "first_loss": first,
            "last_loss": last, "seconds": seconds,
            "finite": float(all(math.isfinite(x) for x in losses))}


if __name__ == "__main__":
    main(sys.argv[1:])
