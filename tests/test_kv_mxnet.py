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
