"""MXNet's remaining KVStore calls (issue 27): ``broadcast``, ``is_capable``,
``save_optimizer_states(dump_optimizer=...)``, integer values, an updater function run
in-process; a key left out of a push is not touched; and an MXNet script that runs with
only its imports changed (``examples/mxnet_kvstore.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import paramserver.kv as kv
from paramserver import ParamError

ROOT = Path(__file__).resolve().parents[1]
ADAM = {"type": "kAdam", "learning_rate": {"base_lr": 0.01}, "weight_decay": 0.1}
MOMENTUM = {"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.1}}


def grad(step: int, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    return np.random.default_rng(step).standard_normal(shape).astype(np.float32)


def test_a_key_left_out_of_a_push_is_not_touched(tmp_path: Path) -> None:
    """Values, updater state and update count stay as they were; its next push goes on
    from its own count (Adam's bias correction), as if the other pushes had not been."""
    with kv.create("local", num_servers=2) as store:
        store.init(["a", "b"], [np.ones((3, 4), np.float32)] * 2)
        store.set_updater(ADAM)
        store.push(["a", "b"], [grad(0), grad(0)])
        before = store.pull("b")
        store.save(str(tmp_path / "before"))
        for step in (1, 2):
            store.push("a", grad(step))  # b is left out
        assert np.array_equal(store.pull("b"), before)
        store.save(str(tmp_path / "after"))
        kept, now = _state(tmp_path / "before", "b"), _state(tmp_path / "after", "b")
        assert kept.keys() == now.keys() and "b/state/count" in kept
        assert all(np.array_equal(kept[n], now[n]) for n in kept)  # m, v, count, version
        store.push(["a", "b"], [grad(3), grad(3)])
        got = store.pull("b")
    with kv.create("local") as alone:  # b's pushes alone
        alone.init("b", np.ones((3, 4), np.float32))
        alone.set_updater(ADAM)
        alone.push("b", grad(0))
        alone.push("b", grad(3))
        np.testing.assert_array_equal(alone.pull("b"), got)


def _state(path: Path, key: str) -> dict[str, np.ndarray]:
    from paramserver.checkpoint import load_checkpoint

    arrays, _ = load_checkpoint(path)
    return {n: a for n, a in arrays.items() if n.startswith(f"{key}/")}


def test_broadcast_gives_every_worker_rank_0s_value() -> None:
    with kv.create("local") as store:
        out = np.zeros((2, 3), np.float32)
        store.broadcast("3", np.full((2, 3), 2, np.float32), out=out)
        assert (out == 2).all()
        outs = [np.zeros(2), np.zeros(2)]
        store.broadcast(["x", "y"], [np.ones(2), np.full(2, 5.0)], out=outs)
        assert outs[0].tolist() == [1, 1] and outs[1].tolist() == [5, 5]
        with pytest.raises(ParamError, match="initialised already"):
            store.broadcast("3", np.ones((2, 3), np.float32), out=out)  # once, as MXNet's

    def worker(store: kv.KVStore) -> list[float]:
        out = np.zeros(4)
        store.broadcast(7, np.full(4, float(store.rank + 1)), out=out)
        return out.tolist()

    with kv.create("dist_sync", num_workers=3) as store:
        assert store.run(worker) == [[1.0] * 4] * 3


def test_is_capable_of_an_optimizer_and_nothing_unknown() -> None:
    with kv.create("local") as store:
        assert store.is_capable("optimizer") and store.is_capable(kv.KVStore.OPTIMIZER)
        with pytest.raises(ValueError, match="Unknown capability: sparsity"):
            store.is_capable("sparsity")


def test_save_optimizer_states_with_and_without_the_optimizer(tmp_path: Path) -> None:
    def steps(store: kv.KVStore, first: int, n: int) -> None:
        for step in range(first, first + n):
            store.push("w", grad(step))

    with kv.create("local") as store:
        store.init("w", np.zeros((3, 4), np.float32))
        store.set_optimizer(MOMENTUM)
        steps(store, 0, 2)
        store.save_optimizer_states(str(tmp_path / "dumped"), dump_optimizer=True)
        store.save_optimizer_states(str(tmp_path / "states"))  # MXNet's default: no optimizer
        steps(store, 2, 2)
        want = store.pull("w")
    with kv.create("local") as store:  # the dumped optimizer replaces the store's
        store.init("w", np.zeros((3, 4), np.float32))
        store.set_optimizer(ADAM)
        store.load_optimizer_states(str(tmp_path / "dumped"))
        steps(store, 2, 2)
        np.testing.assert_array_equal(store.pull("w"), want)
    with kv.create("local") as store:  # the states alone: the store's optimizer is theirs
        store.set_optimizer(MOMENTUM)
        store.load_optimizer_states(str(tmp_path / "states"))
        steps(store, 2, 2)
        np.testing.assert_array_equal(store.pull("w"), want)
    with kv.create("local") as store:  # ... and without one, the momentum has no home
        store.init("w", np.zeros((3, 4), np.float32))
        with pytest.raises(ParamError, match="history"):
            store.load_optimizer_states(str(tmp_path / "states"))


def test_integer_values_hold_counts() -> None:
    with kv.create("local", num_servers=2) as store:
        store.init(["n", "m"], [np.zeros(5, np.int64), np.arange(4, dtype=np.int32)])
        store.push("n", [np.ones(5, np.int64), np.full(5, 2, np.int64)])  # summed: replaces
        assert store.pull("n").tolist() == [3] * 5 and store.pull("n").dtype == np.int64
        store.set_updater(lambda key, given, stored: np.add(stored, given, out=stored))
        for _ in range(4):
            store.push("m", np.ones(4, np.int32))
        got = store.pull("m")
        assert got.tolist() == [4, 5, 6, 7] and got.dtype == np.int32
        with pytest.raises(ParamError, match="pushes are integers \\(it holds int64\\), not "
                                             "float64"):
            store.push("n", np.ones(5))
        store.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        store.push("n", np.full(5, 7, np.int64))  # counts travel exactly, uncompressed
        assert store.pull("n").tolist() == [7 + 3] * 5  # the function still adds
        store.set_updater(ADAM)
        with pytest.raises(ParamError, match="holds int64 values \\(counts\\), which the "
                                             "update method kAdam does not update"):
            store.push("n", np.ones(5, np.int64))
        with pytest.raises(ParamError, match="values must be float32 or float64 \\(or int32 "
                                             "or int64, for counts\\), not int16"):
            store.init("s", np.zeros(3, np.int16))
        with pytest.raises(ParamError, match="row-sparse tables and fills hold floats"):
            store.init("t", np.zeros((3, 2), np.int64), row_sparse=True)

    def count(store: kv.KVStore) -> list[int]:
        store.init("c", np.zeros(3, np.int64))
        store.push("c", np.full(3, store.rank + 1, np.int64))
        return store.pull("c").tolist()

    with kv.create("dist_sync", num_workers=2) as store:  # one round: the sum of both
        assert store.run(count) == [[3, 3, 3]] * 2


def test_an_updater_function_runs_in_process_as_mxnets() -> None:
    seen: list[Any] = []

    def update(key: Any, given: np.ndarray, stored: np.ndarray) -> None:
        seen.append((key, given.shape, stored.shape))
        stored += given * 2

    with kv.create("local", num_servers=3, bound=10) as store:
        store.init(3, np.full((2, 3), 2, np.float32))
        store._set_updater(update)  # MXNet's (private) name, and set_updater
        store.push(3, np.ones((2, 3), np.float32))
        assert (store.pull(3) == 4).all() and seen == [(3, (2, 3), (2, 3))]
        store.init(4, np.zeros(40, np.float32))  # made later: updated by it too, in pieces
        store.push(4, np.ones(40, np.float32))
        assert (store.pull(4) == 2).all() and sum(s[1][0] for s in seen[1:]) == 40
        with pytest.raises(ParamError, match=r"a Python function .*dump_optimizer=False"):
            store.save_optimizer_states("unused", dump_optimizer=True)
        store.set_updater(MOMENTUM)  # a declaration replaces it
        calls = len(seen)
        store.push(3, np.ones((2, 3), np.float32))
        assert len(seen) == calls and np.allclose(store.pull(3), 4 - 0.1)

    def worker(store: kv.KVStore) -> None:
        store.set_updater(update)

    with kv.create("dist_sync", num_workers=2) as store, \
            pytest.raises(Exception, match="set it on the store create\\(\\) returned"):
        store.run(worker)


def test_an_updater_function_is_refused_on_ray(ray_session: Any) -> None:
    with kv.create("local", backend="ray") as store, \
            pytest.raises(ParamError, match="its servers are Ray actors in other processes"):
        store.set_updater(lambda key, given, stored: None)


def test_an_mxnet_script_runs_with_its_imports_changed(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "mxnet_kvstore.py"),
                          str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, check=True).stdout
    lines = out.splitlines()
    assert "optimizer on the servers: True" in lines
    assert lines.count("update on key: 3") == 1
    for want in ("init 12.0", "pushed 18.0", "updated 30.0", "list [18.0, 18.0, 18.0]",
                 "pushpull 30.0", "broadcast 24.0", "counts 18 int64", "resumed True"):
        assert want in lines, (want, out)


# -- MXNet 1.9.1's optimizers (issue 35) ---------------------------------------------------------
#
# Each reference below is the update MXNet 1.9.1 computes (python/mxnet/optimizer/optimizer.py
# and the kernels of src/operator/optimizer_op-inl.h), written in NumPy, step by step; the store
# must agree within 1e-6 after 30 steps with rescale_grad, clip_gradient and wd all set.
# (benchmarks/peers/mxnet_optimizers.py runs real MXNet beside paramserver.)

RESCALE, CLIP, WD, STEPS = 0.5, 1.0, 0.1, 30


def _clip(x: np.ndarray, c: float = CLIP) -> np.ndarray:
    return np.clip(x, -c, c)


def _mx_reference(name: str, kw: dict[str, Any], w: np.ndarray, grads: list[np.ndarray],
                  rescale: float = RESCALE, clip: float = CLIP, wd: float = WD) -> np.ndarray:
    """MXNet's update of ``w`` by each gradient in turn (float64)."""
    w = w.copy()
    lr = kw.get("learning_rate", 0.01)
    z = [np.zeros_like(w) for _ in range(3)]
    for t, grad in enumerate(grads, start=1):
        if name == "sgd":  # sgd_mom_update / sgd_update
            g, m = _clip(rescale * grad, clip), kw.get("momentum", 0.0)
            if m:
                z[0] = m * z[0] - lr * wd * w - lr * g
                w = w + z[0]
            else:
                w = (1 - lr * wd) * w - lr * g
        elif name == "nag":  # nag_mom_update, in place (out=weight) as the store runs it:
            m = kw["momentum"]  # the momentum's weight decay reads the new weight
            c = _clip(rescale * grad, clip)
            z[0] = m * z[0]
            w = w - z[0] + (m + 1) * (z[0] - lr * (c + wd * w))
            z[0] = z[0] - lr * (c + wd * w)
        elif name == "nag-copy":  # nag_mom_update into a copy (MXNet's row_sparse weight)
            m = kw["momentum"]
            g = _clip(rescale * grad, clip) + wd * w
            z[0] = m * z[0]
            w = w - z[0] + (m + 1) * (z[0] - lr * g)
            z[0] = z[0] - lr * g
        elif name == "adam":  # Adam.update + adam_update
            b1, b2, eps = kw.get("beta1", 0.9), kw.get("beta2", 0.999), kw.get("epsilon", 1e-8)
            lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            g = _clip(rescale * grad + wd * w, clip)
            z[0] = b1 * z[0] + (1 - b1) * g
            z[1] = b2 * z[1] + (1 - b2) * g * g
            w = w - lr_t * z[0] / (np.sqrt(z[1]) + eps)
        elif name == "adagrad":  # AdaGrad.update (dense)
            g = _clip(rescale * grad, clip)
            z[0] += g * g
            w = w + (g / np.sqrt(z[0] + kw.get("eps", 1e-7)) + w * wd) * -lr
        elif name == "rmsprop" and not kw.get("centered"):  # rmsprop_update
            g = _clip(rescale * grad + wd * w, clip)
            z[0] = (1 - kw["gamma1"]) * g * g + kw["gamma1"] * z[0]
            w = w - lr * g / np.sqrt(z[0] + kw.get("epsilon", 1e-8))
        elif name == "rmsprop":  # rmspropalex_update
            g1, g2 = kw["gamma1"], kw["gamma2"]
            g = _clip(rescale * grad + wd * w, clip)
            z[0] = (1 - g1) * g * g + g1 * z[0]
            z[1] = (1 - g1) * g + g1 * z[1]
            z[2] = g2 * z[2] - lr * g / np.sqrt(z[0] - z[1] * z[1] + kw.get("epsilon", 1e-8))
            w = w + z[2]
        elif name == "adadelta":  # AdaDelta.update: no learning rate
            rho, eps = kw.get("rho", 0.9), kw.get("epsilon", 1e-5)
            g = _clip(rescale * grad, clip)
            z[0] = rho * z[0] + (1 - rho) * g * g
            cur = np.sqrt(z[1] + eps) / np.sqrt(z[0] + eps) * g
            z[1] = rho * z[1] + (1 - rho) * cur * cur
            w = w - (cur + wd * w)
        elif name == "ftrl":  # ftrl_update
            l1, beta = kw.get("lamda1", 0.01), kw.get("beta", 1.0)
            g = _clip(rescale * grad, clip)
            z[0] += g - (np.sqrt(z[1] + g * g) - np.sqrt(z[1])) * w / lr
            z[1] += g * g
            w = ((np.sign(z[0]) * l1 - z[0]) / ((beta + np.sqrt(z[1])) / lr + wd)
                 * (np.abs(z[0]) > l1))
        elif name == "signum" and kw.get("momentum", 0.9):  # signum_update
            m, wd_lh = kw.get("momentum", 0.9), kw.get("wd_lh", 0.0)
            z[0] = m * z[0] - (1 - m) * wd * w - (1 - m) * _clip(rescale * grad, clip)
            w = (1 - lr * wd_lh) * w + lr * np.sign(z[0])
        elif name == "signum":  # signsgd_update: no rescale, no clip
            w = (1 - lr * wd) * w - lr * np.sign(grad)
        elif name == "lamb":  # lamb_update_phase1 and 2
            b1, b2, eps = kw.get("beta1", 0.9), kw.get("beta2", 0.999), kw.get("epsilon", 1e-6)
            g = _clip(rescale * grad, clip)
            z[0] = b1 * z[0] + (1 - b1) * g
            z[1] = b2 * z[1] + (1 - b2) * g * g
            u = (z[0] / (1 - b1**t)) / (np.sqrt(z[1] / (1 - b2**t)) + eps) + wd * w
            r1, r2 = np.linalg.norm(w), np.linalg.norm(u)
            if kw.get("lower_bound"):
                r1 = max(r1, kw["lower_bound"])
            if kw.get("upper_bound"):
                r1 = min(r1, kw["upper_bound"])
            w = w - (lr * r1 / r2 if r1 and r2 else lr) * u
        else:
            raise AssertionError(name)
    return w


MX_CASES = {
    "sgd": {"momentum": 0.9, "learning_rate": 0.05},
    "sgd-plain": {"learning_rate": 0.05},
    "nag": {"momentum": 0.9, "learning_rate": 0.05},
    "adam": {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.99},
    "adagrad": {"learning_rate": 0.1, "eps": 1e-6},
    "rmsprop": {"learning_rate": 0.01, "gamma1": 0.8},
    "rmsprop-centered": {"learning_rate": 0.01, "gamma1": 0.8, "gamma2": 0.7,
                         "centered": True},
    "adadelta": {"rho": 0.8, "learning_rate": 0.5},  # not used, as MXNet's
    "ftrl": {"learning_rate": 0.3, "lamda1": 0.05, "beta": 0.5},
    "signum": {"learning_rate": 0.01, "momentum": 0.8, "wd_lh": 0.2},
    "signum-sgd": {"learning_rate": 0.01, "momentum": 0.0},
    "lamb": {"learning_rate": 0.01, "upper_bound": 8.0},
}


def _mx_grads(shape: tuple[int, ...], steps: int = STEPS) -> list[np.ndarray]:
    rng = np.random.default_rng(35)
    return [rng.standard_normal(shape) * 3 for _ in range(steps)]  # many beyond the clip


@pytest.mark.parametrize("case", list(MX_CASES))
def test_mxnets_optimizers_compute_what_mxnet_computes(case: str) -> None:
    name = case.split("-")[0]
    kw = MX_CASES[case]
    w0 = np.random.default_rng(1).standard_normal((6, 5)) * 2  # |wd·w| matters to the clip
    grads = _mx_grads(w0.shape)
    opt = kv.optimizer.create(name, rescale_grad=RESCALE, clip_gradient=CLIP, wd=WD, **kw)
    with kv.create("local") as store:
        store.init("w", w0)
        store.set_optimizer(opt)
        for g in grads:
            store.push("w", g)
        got = store.pull("w")
    want = _mx_reference(name, kw, w0, grads)
    assert np.abs(got - want).max() <= 1e-6, (case, np.abs(got - want).max())
    assert np.abs(want - w0).max() > 1e-2  # it moved


def test_mxnets_adam_puts_epsilon_outside_the_bias_correction() -> None:
    """Gradients near 1e-6: MXNet's Adam and torch's (paramserver's form singa) part by far
    more than the tolerance; form mxnet is MXNet's."""
    w0 = np.ones(8)
    grads = [g * 1e-6 for g in _mx_grads((8,), 10)]
    got = {}
    for form in ("mxnet", "singa"):
        with kv.create("local") as store:
            store.init(0, w0)
            store.set_optimizer({"type": "kAdam", "form": form,
                                 "learning_rate": {"base_lr": 0.01}})
            for g in grads:
                store.push(0, g)
            got[form] = store.pull(0)
    want = _mx_reference("adam", {"learning_rate": 0.01}, w0, grads, 1.0, 1e9, 0.0)
    assert np.abs(got["mxnet"] - want).max() <= 1e-9
    assert np.abs(got["singa"] - want).max() > 1e-3


def test_mxnets_lazy_update_on_a_table() -> None:
    """A row-sparse push: SGD with momentum and Adam update only the rows pushed
    (lazy_update, MXNet's default), and every row as a dense update with lazy_update=False;
    AdaGrad and Ftrl are lazy, the others dense, as MXNet's store updates them."""
    w0 = np.random.default_rng(2).standard_normal((5, 3))
    ids = np.array([3, 1])
    grads = [g[:2] for g in _mx_grads((5, 3), 4)]
    for name, kw, lazy in (("sgd", {"momentum": 0.9}, True), ("adam", {}, True),
                           ("sgd", {"momentum": 0.9, "lazy_update": False}, False),
                           ("adam", {"lazy_update": False}, False), ("ftrl", {}, True),
                           ("adagrad", {}, True), ("rmsprop", {"gamma1": 0.9}, False),
                           ("lamb", {}, False), ("nag", {"momentum": 0.9}, False)):
        kw = {**kw, "learning_rate": 0.05}
        opt = kv.optimizer.create(name, rescale_grad=RESCALE, clip_gradient=CLIP, wd=WD, **kw)
        with kv.create("local") as store:
            store.init("t", w0, row_sparse=True)
            store.set_optimizer(opt)
            for g in grads:
                store.push("t", kv.RowSparse(ids, g))
            got = store.pull("t")
        dense = []
        for g in grads:
            d = np.zeros_like(w0)
            d[ids] = g
            dense.append(d)
        if lazy:  # the rows pushed, as a dense update of them alone; the others untouched
            want = w0.copy()
            want[ids] = _mx_reference(name, kw, w0[ids], [d[ids] for d in dense])
        else:  # MXNet's dense update of a row_sparse weight (through a copy: NAG's formula)
            want = _mx_reference("nag-copy" if name == "nag" else name, kw, w0, dense)
        assert np.abs(got - want).max() <= 1e-6, (name, kw)


def test_mxnet_optimizers_by_name_and_from_mxnets_attributes() -> None:
    assert kv.optimizer.create("Adam", learning_rate=0.1).declaration()["type"] == "kAdam"
    with pytest.raises(ParamError, match="Cannot find optimizer 'adamw'"):
        kv.optimizer.create("adamw")
    with pytest.raises(ParamError, match="unknown argument 'gamma1'"):
        kv.optimizer.Adam(gamma1=0.9)
    with pytest.raises(ParamError, match="lr_scheduler is an MXNet object"):
        kv.optimizer.SGD(lr_scheduler=object())
    with pytest.raises(ParamError, match="clip_weights"):
        kv.optimizer.RMSProp(clip_weights=1.0)
    with pytest.raises(ParamError, match="wd must be a number"):
        kv.optimizer.SGD(wd="much")

    class Adam:  # MXNet's object as set_optimizer sees it: read by its attributes
        __module__ = "mxnet.optimizer.optimizer"

        def __init__(self) -> None:
            self.lr, self.wd, self.rescale_grad, self.clip_gradient = 0.1, 0.01, 0.5, 2.0
            self.beta1, self.beta2, self.epsilon, self.lazy_update = 0.8, 0.9, 1e-7, True
            self.lr_scheduler, self.begin_num_update, self.multi_precision = None, 0, False
            self.lr_mult: dict[str, float] = {}

    got = kv.optimizer.from_mxnet(Adam())
    assert got == kv.optimizer.Adam(learning_rate=0.1, wd=0.01, rescale_grad=0.5,
                                    clip_gradient=2.0, beta1=0.8, beta2=0.9,
                                    epsilon=1e-7).declaration()


# -- row_sparse_pull and the store types as MXNet's ------------------------------------------------


def test_row_sparse_pull_into_a_table_shaped_out_writes_by_id_as_mxnet() -> None:
    """Checked against MXNet 1.9.1: ids [3, 3, 0, 1] on a 4-row table give rows 0, 1 and 3 at
    their ids and row 2 zero (MXNet's out holds only the rows pulled), whatever out held —
    also when there are as many ids as rows."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    with kv.create("local") as store:
        store.init("t", table, row_sparse=True)
        out = np.full((4, 3), 7, np.float32)
        assert store.row_sparse_pull("t", out=out, row_ids=np.array([3, 3, 0, 1])) is out
        assert out.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0], [10, 11, 12]]
        for ids in (np.array([3.0, 3.0, 0.0, 1.0], np.float32),  # MXNet's float32 ids
                    np.array([[3, 0], [0, 1]]), [3, 3, 0, 1]):  # 2-D: read flat
            out = np.full((4, 3), 7, np.float32)
            store.row_sparse_pull("t", out=out, row_ids=ids)
            assert out.tolist() == [[1, 2, 3], [4, 5, 6], [0, 0, 0], [10, 11, 12]], ids
        rows = np.zeros((3, 3), np.float32)  # one row per id, in their order
        store.row_sparse_pull("t", out=rows, row_ids=np.array([2.0, 0.0, 2.0]))
        assert rows.tolist() == [[7, 8, 9], [1, 2, 3], [7, 8, 9]]
        with pytest.raises(ParamError, match=r"row id 1\.5 is not a whole number"):
            store.row_sparse_pull("t", out=rows, row_ids=np.array([1.5, 0, 0]))
        with pytest.raises(ParamError, match=r"whole numbers \(int or float\), not bool"):
            store.row_sparse_pull("t", row_ids=np.array([True]))
        with pytest.raises(ParamError, match=r"out must be a numpy array of shape \(2, 3\)"):
            store.row_sparse_pull("t", out=rows, row_ids=[0, 1])


def test_row_sparse_pull_of_lists_of_keys_and_outs_as_mxnet() -> None:
    t = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    u = np.arange(8, dtype=np.float32).reshape(4, 2)
    with kv.create("local") as store:
        store.init(["t", "u"], [t, u], row_sparse=True)
        o1 = [np.zeros((4, 3), np.float32) for _ in range(2)]
        o2 = [np.zeros((4, 2), np.float32) for _ in range(2)]
        store.row_sparse_pull(["t", "u"], out=[o1, o2],  # a list of outs per key, ids each
                              row_ids=[[np.array([0]), np.array([2])],
                                       [np.array([1.0]), np.array([3])]])
        # MXNet 1.9.1 gives exactly these
        assert [o.tolist() for o in o1] == [[[1, 2, 3], [0] * 3, [0] * 3, [0] * 3],
                                            [[0] * 3, [0] * 3, [7, 8, 9], [0] * 3]]
        assert [o.tolist() for o in o2] == [[[0, 0], [2, 3], [0, 0], [0, 0]],
                                            [[0, 0], [0, 0], [0, 0], [6, 7]]]
        outs = [np.zeros((4, 3), np.float32) for _ in range(2)]
        store.row_sparse_pull("t", out=outs, row_ids=np.array([1]))  # one ids for all outs
        assert all(o[1].tolist() == [4, 5, 6] and not o[[0, 2, 3]].any() for o in outs)
        got = store.row_sparse_pull(["t", "u"], row_ids=[[0], [3]])  # no out: the rows
        assert got[0].tolist() == [[1, 2, 3]] and got[1].tolist() == [[6, 7]]
        with pytest.raises(ParamError, match=r"the number of row_ids \(2\) doesn't match the "
                                             r"number of outs \(4\)"):
            store.row_sparse_pull(["t", "u"], out=[o1, o2], row_ids=[[0], [1]])


@pytest.mark.parametrize(("name", "mode"), [
    ("local", "local"), ("device", "local"), ("local_allreduce_cpu", "local"),
    ("local_allreduce_device", "local"), ("nccl", "local"), ("Local", "local"),
    ("dist_sync", "dist_sync"), ("dist_device_sync", "dist_sync"),
    ("dist_sync_device", "dist_sync"), ("dist", "dist_sync"), ("dist_async", "dist_async"),
    ("dist_device_async", "dist_async")])
def test_mxnets_store_types_are_paramservers_modes(name: str, mode: str) -> None:
    with kv.create(name, num_workers=1 if mode == "local" else 2) as store:
        assert store.type == mode


def test_store_types_that_cannot_apply_are_refused() -> None:
    with pytest.raises(ParamError, match="Horovod all-reduces gradients between workers"):
        kv.create("horovod")
    with pytest.raises(ParamError, match=r"Invalid Input: 'teststore', valid values are: "
                                         r"\{'local', 'device', 'nccl'"):
        kv.create("teststore")
