"""paramserver's key-value store beside real MXNet 1.9.1's: the same optimizer, the same pushes.

    python benchmarks/peers/mxnet_optimizers.py [--venv PATH] [--steps 30]

For each of MXNet's nine optimizers (and the variants: SGD without momentum, the centred
RMSProp, Signum without momentum), with ``rescale_grad``, ``clip_gradient`` and ``wd`` all
set: MXNet's ``kv.create('local')``, ``init``, ``set_optimizer(mx.optimizer.create(...))``
and ``push`` of the same float32 gradients, and paramserver's store with
``set_optimizer(kv.optimizer.create(...))``; prints the largest absolute difference of the
values after every step, and of the values after the last (float32 both). Then a row-sparse
table (lazy updates: SGD with momentum, Adam, AdaGrad, Ftrl; dense: the others) and
``row_sparse_pull`` into a table-shaped out with ids ``[3, 3, 0, 1]``.

MXNet runs in its own interpreter (the side venv: MXNet 1.9.1 wants numpy < 1.24); this
script runs itself there with ``--mxnet`` and reads its results from ``.npy`` files (no
pickle). Without the venv it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mxnet_venv import find_or_make

RESCALE, CLIP, WD = 0.5, 1.0, 0.1
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("sgd", {"momentum": 0.9, "learning_rate": 0.05}),
    "sgd-plain": ("sgd", {"learning_rate": 0.05}),
    "nag": ("nag", {"momentum": 0.9, "learning_rate": 0.05}),
    "adam": ("adam", {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.99}),
    "adagrad": ("adagrad", {"learning_rate": 0.1, "eps": 1e-6}),
    "rmsprop": ("rmsprop", {"learning_rate": 0.01, "gamma1": 0.8}),
    "rmsprop-centered": ("rmsprop", {"learning_rate": 0.01, "gamma1": 0.8, "gamma2": 0.7,
                                     "centered": True}),
    "adadelta": ("adadelta", {"rho": 0.8}),
    "ftrl": ("ftrl", {"learning_rate": 0.3, "lamda1": 0.05, "beta": 0.5}),
    "signum": ("signum", {"learning_rate": 0.01, "momentum": 0.8, "wd_lh": 0.2}),
    "signum-sgd": ("signum", {"learning_rate": 0.01, "momentum": 0.0}),
    "lamb": ("lamb", {"learning_rate": 0.01, "upper_bound": 8.0}),
}
#: Row-sparse tables: what MXNet's store does with such a push (lazily: SGD, Adam, AdaGrad,
#: Ftrl; densely, all rows: the others). MXNet's sparse AdaGrad takes no wd (it refuses it).
SPARSE = ["sgd", "adam", "adagrad", "ftrl", "rmsprop", "nag", "signum", "lamb", "adadelta"]
SPARSE_WD = {"adagrad": 0.0}
SHAPE, ROWS, IDS = (6, 5), (8, 4), np.array([5, 1, 6])


def data(steps: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(35)
    w0 = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    grads = [(rng.standard_normal(SHAPE) * 3).astype(np.float32) for _ in range(steps)]
    t0 = (rng.standard_normal(ROWS) * 2).astype(np.float32)
    rows = [(rng.standard_normal((IDS.size, ROWS[1])) * 3).astype(np.float32)
            for _ in range(steps)]
    return w0, grads, t0, rows


def run_mxnet(steps: int, out: Path) -> None:
    """In MXNet's venv: every case's values after each step, as .npy files."""
    import mxnet as mx

    w0, grads, t0, rows = data(steps)
    for case, (name, kw) in CASES.items():
        kv = mx.kv.create("local")
        kv.init(0, mx.nd.array(w0))
        kv.set_optimizer(mx.optimizer.create(name, rescale_grad=RESCALE, clip_gradient=CLIP,
                                             wd=WD, **kw))
        got = mx.nd.zeros(SHAPE)
        trace = []
        for g in grads:
            kv.push(0, mx.nd.array(g))
            kv.pull(0, out=got)
            trace.append(got.asnumpy())
        np.save(out / f"{case}.npy", np.stack(trace), allow_pickle=False)
    for case in SPARSE:
        name, kw = CASES[case]
        kv = mx.kv.create("local")
        kv.init(0, mx.nd.array(t0).tostype("row_sparse"))
        kv.set_optimizer(mx.optimizer.create(name, rescale_grad=RESCALE, clip_gradient=CLIP,
                                             wd=SPARSE_WD.get(case, WD), **kw))
        for r in rows:
            kv.push(0, mx.nd.sparse.row_sparse_array((r, IDS), shape=ROWS))
        got = mx.nd.zeros(ROWS, stype="row_sparse")
        kv.row_sparse_pull(0, out=got, row_ids=mx.nd.arange(ROWS[0]))
        np.save(out / f"sparse-{case}.npy", got.asnumpy(), allow_pickle=False)
    kv = mx.kv.create("local")
    kv.init("t", mx.nd.array(np.arange(12).reshape(4, 3) + 1).tostype("row_sparse"))
    got = mx.nd.array(np.full((4, 3), 7.0)).tostype("row_sparse")
    kv.row_sparse_pull("t", out=got, row_ids=mx.nd.array([3, 3, 0, 1]))
    np.save(out / "pull.npy", got.asnumpy(), allow_pickle=False)


def run_paramserver(steps: int) -> dict[str, np.ndarray]:
    import paramserver.kv as kv

    w0, grads, t0, rows = data(steps)
    got: dict[str, np.ndarray] = {}
    for case, (name, kw) in CASES.items():
        with kv.create("local") as store:
            store.init(0, w0)
            store.set_optimizer(kv.optimizer.create(name, rescale_grad=RESCALE,
                                                    clip_gradient=CLIP, wd=WD, **kw))
            trace = []
            for g in grads:
                store.push(0, g)
                trace.append(store.pull(0))
            got[case] = np.stack(trace)
    for case in SPARSE:
        name, kw = CASES[case]
        with kv.create("local") as store:
            store.init(0, t0, row_sparse=True)
            store.set_optimizer(kv.optimizer.create(name, rescale_grad=RESCALE,
                                                    clip_gradient=CLIP,
                                                    wd=SPARSE_WD.get(case, WD), **kw))
            for r in rows:
                store.push(0, kv.RowSparse(IDS, r))
            got[f"sparse-{case}"] = store.pull(0)
    with kv.create("local") as store:
        store.init("t", (np.arange(12).reshape(4, 3) + 1).astype(np.float32), row_sparse=True)
        out = np.full((4, 3), 7.0, np.float32)
        store.row_sparse_pull("t", out=out, row_ids=np.array([3, 3, 0, 1], np.float32))
        got["pull"] = out
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default=None,
                    help="MXNet's side venv (default: MXNET_VENV, else "
                         "benchmarks/peers/.mxnet-venv; see mxnet_venv.py)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mxnet", help=argparse.SUPPRESS)  # (in MXNet's venv) write here
    args = ap.parse_args(argv)
    if args.mxnet:
        run_mxnet(args.steps, Path(args.mxnet))
        return 0
    python, why = find_or_make(args.venv, make=False)
    if python is None:
        print(f"skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MXNET_ENGINE_TYPE": "NaiveEngine"}
        env.pop("PYTHONPATH", None)
        subprocess.run([str(python), __file__, "--mxnet", tmp, "--steps", str(args.steps)],
                       check=True, env=env, capture_output=True)
        theirs = {p.stem: np.load(p, allow_pickle=False) for p in Path(tmp).glob("*.npy")}
    ours = run_paramserver(args.steps)
    rows = []
    for case in CASES:
        a, b = ours[case].astype(np.float64), theirs[case].astype(np.float64)
        diff = np.abs(a - b)
        scale = np.abs(b - data(args.steps)[0]).max()  # how far MXNet moved the values
        rows.append({"case": case, "max_diff_any_step": float(diff.max()),
                     "max_diff_last": float(diff[-1].max()), "moved": float(scale)})
    for case in SPARSE:
        k = f"sparse-{case}"
        rows.append({"case": k, "max_diff_last": float(np.abs(ours[k].astype(np.float64)
                                                               - theirs[k]).max())})
    rows.append({"case": "row_sparse_pull [3,3,0,1]",
                 "max_diff_last": float(np.abs(ours["pull"] - theirs["pull"]).max())})
    print(f"MXNet 1.9.1 against paramserver, float32, {args.steps} steps, rescale_grad "
          f"{RESCALE}, clip_gradient {CLIP}, wd {WD}")
    print(f"{'case':28} {'max |diff| any step':>20} {'after the last':>15} {'moved':>8}")
    for r in rows:
        any_step = r.get("max_diff_any_step")
        moved = r.get("moved")
        print(f"{r['case']:28} {'' if any_step is None else f'{any_step:.3g}':>20} "
              f"{r['max_diff_last']:>15.3g} {'' if moved is None else f'{moved:.3g}':>8}")
    if os.environ.get("MXNET_COMPARE_JSON"):
        Path(os.environ["MXNET_COMPARE_JSON"]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
