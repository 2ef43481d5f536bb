"""An MXNet key-value store script, run on paramserver: only the two imports differ.

With MXNet the first lines read ``from mxnet import nd`` and ``from mxnet import kvstore``;
here NumPy is ``nd`` and paramserver's key-value store is ``kvstore``. Everything below is
MXNet's KVStore API as its tutorials use it: ``create``, ``init``, ``push`` and ``pull``
(single keys and lists), ``pushpull``, ``broadcast``, ``is_capable``, an updater function
run in-process (``_set_updater``), integer values that hold counts, a declared update
method (``set_optimizer``), and ``save_optimizer_states(..., dump_optimizer=True)`` /
``load_optimizer_states``.

    python examples/mxnet_kvstore.py [FOLDER]    # FOLDER: where the states file goes
"""

import sys
import tempfile

import numpy as nd  # with MXNet: from mxnet import nd

import paramserver.kv as kvstore  # with MXNet: from mxnet import kvstore

shape = (2, 3)
kv = kvstore.create("local")
print("type", kv.type, "rank", kv.rank, "workers", kv.num_workers)
print("optimizer on the servers:", kv.is_capable(kvstore.KVStore.OPTIMIZER))

# init, push, pull: pushes of one key are summed; without an updater the sum replaces
kv.init(3, nd.ones(shape) * 2)
a = nd.zeros(shape)
kv.pull(3, out=a)
print("init", float(a.sum()))
kv.push(3, [nd.ones(shape), nd.ones(shape) * 2])
kv.pull(3, out=a)
print("pushed", float(a.sum()))


# an updater function, run where the values are (in this process)
def update(key, input, stored):
    print("update on key:", key)
    stored += input * 2


kv._set_updater(update)
kv.push(3, nd.ones(shape))
kv.pull(3, out=a)
print("updated", float(a.sum()))

# lists of keys, pushpull, broadcast
keys = [5, 7, 9]
kv.init(keys, [nd.ones(shape)] * len(keys))
kv.push(keys, [nd.ones(shape)] * len(keys))
b = [nd.zeros(shape) for _ in keys]
kv.pull(keys, out=b)
print("list", [float(x.sum()) for x in b])
kv.pushpull(5, nd.ones(shape), out=a)
print("pushpull", float(a.sum()))
out = nd.zeros(shape)
kv.broadcast(11, nd.ones(shape) * 4, out=out)
print("broadcast", float(out.sum()))

# integer values: counts, added up by an updater function
def add(key, input, stored):
    stored += input


kv._set_updater(add)
kv.init(20, nd.zeros(shape, dtype="int64"))
for _ in range(3):
    kv.push(20, nd.ones(shape, dtype="int64"))
counts = nd.zeros(shape, dtype="int64")
kv.pull(20, out=counts)
print("counts", int(counts.sum()), counts.dtype)

# a declared update method on the servers, its state saved with it and loaded back
kv.set_optimizer({"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.1}})
kv.push(5, nd.ones(shape))
folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
fname = folder + "/kv.states"
kv.save_optimizer_states(fname, dump_optimizer=True)
kv.push(5, nd.ones(shape))
kv.pull(5, out=a)
after = a.sum()
kv.load_optimizer_states(fname)
kv.push(5, nd.ones(shape))
kv.pull(5, out=a)
print("resumed", bool(a.sum() == after))
kv.close()
