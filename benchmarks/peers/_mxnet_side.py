"""MXNet's side of ``kv_mxnet.py``: run in MXNet's side venv (mxnet 1.9.1, numpy < 1.24),
never imported by paramserver.

``python _mxnet_side.py local|dist_sync PHASE``: makes the key-value store (``dist_sync``:
ps-lite's worker; the ``DMLC_*`` variables say where the scheduler is), initialises the keys
of PHASE's shapes and sets its update method, prints ``ready``, then answers commands, one
JSON line each on stdin: ``{"shape": name, "first": step, "iters": n}`` runs steps
``first .. first + n - 1`` of the shape (the first untimed) and prints
``{"rank": r, "times": [...], "cpu": [...], "sample": [...]}``: the seconds (and the
process's CPU seconds) of each timed push + pull, and the sampled values pulled at the last
step. An empty line ends it.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mxnet as mx
from _workload import (
    BETA1,
    BETA2,
    EPS,
    LR,
    MOMENTUM,
    SHAPES,
    TABLE_INIT,
    Grads,
    initial,
    row_ids,
    sample,
    shapes_of,
)


def optimizer(phase: str):
    if phase == "sgd":
        return mx.optimizer.SGD(learning_rate=LR["sgd"], momentum=MOMENTUM, wd=0.0,
                                rescale_grad=1.0)
    if phase == "adam":
        return mx.optimizer.Adam(learning_rate=LR["adam"], beta1=BETA1, beta2=BETA2,
                                 epsilon=EPS, wd=0.0, rescale_grad=1.0)
    return None


def main() -> None:
    mode, phase = sys.argv[1], sys.argv[2]
    kv = mx.kv.create(mode)
    rank = kv.rank
    for name in shapes_of(phase):
        s = SHAPES[name]
        init = initial(name)
        for key in s["keys"]:
            if s.get("rows"):
                kv.init(key, mx.nd.full(s["shape"], TABLE_INIT).tostype("row_sparse"))
            elif init is not None:
                kv.init(key, mx.nd.array(init.reshape(s["shape"])))
            else:
                kv.init(key, mx.nd.zeros(s["shape"]))
    opt = optimizer(phase)
    if opt is not None:
        kv.set_optimizer(opt)
    if mode != "local":
        kv._barrier()
    grads = {name: Grads(name, rank) for name in shapes_of(phase)}
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        cmd = json.loads(line)
        name = cmd["shape"]
        s, g = SHAPES[name], grads[name]
        keys = s["keys"]
        times, cpu, outs = [], [], []
        for step in range(cmd["first"], cmd["first"] + cmd["iters"]):
            if s.get("rows"):
                ids = row_ids(step, s["rows"], s["shape"][0])
                ids_nd = mx.nd.array(ids, dtype="int64")
                grad = mx.nd.sparse.row_sparse_array(
                    (mx.nd.array(g.at(step)[0].reshape(len(ids), -1)), ids_nd),
                    shape=s["shape"])
                out = mx.nd.sparse.zeros("row_sparse", s["shape"])
                mx.nd.waitall()
                t0, c0 = time.perf_counter(), time.process_time()
                kv.push(keys[0], grad)
                kv.row_sparse_pull(keys[0], out=out, row_ids=ids_nd)
                out.wait_to_read()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                outs = [out.data.asnumpy()]
            else:
                # fresh arrays every step: dist_sync's pull writes into what was pushed
                pushed = [mx.nd.array(a.reshape(s["shape"])) for a in g.at(step)]
                pulled = [mx.nd.empty(s["shape"]) for _ in keys]
                mx.nd.waitall()
                t0, c0 = time.perf_counter(), time.process_time()
                if len(keys) == 1:
                    kv.push(keys[0], pushed[0])
                    kv.pull(keys[0], out=pulled[0])
                else:
                    kv.push(keys, pushed)
                    kv.pull(keys, out=pulled)
                mx.nd.waitall()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                outs = pulled
        got = sample([o.asnumpy() if hasattr(o, "asnumpy") else o for o in outs])
        print(json.dumps({"rank": rank, "times": times[1:], "cpu": cpu[1:], "sample": got}),
              flush=True)


if __name__ == "__main__":
    main()
