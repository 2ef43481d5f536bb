"""The key-value store (SPEC §10): MXNet's KVStore semantics on paramserver's servers.

Pushes of one key are summed; ``dist_sync`` equals one worker pushing the sum; ``dist_async``
applies every push once; only rank 0's init counts; int and str keys (not both); a second
init is refused; row-sparse pushes and pulls move the rows only; the servers' state (values
and updater state) saves and loads; a synchronous run is the same bit for bit on Ray.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

import paramserver.kv as kv
from paramserver import ClusterError, ParamError
from paramserver.cluster.keys import KeyServer, plan_key
from paramserver.cluster.transport import LocalTransport, MeteredTransport
from paramserver.init import init_params
from paramserver.params import ParamSet

ADAM = {"type": "kAdam", "learning_rate": {"base_lr": 0.01}, "weight_decay": 0.001}
SGD = {"type": "kSGD", "learning_rate": {"base_lr": 1.0}}
ROWS, DIM = 50, 6


@pytest.fixture
def local() -> Iterator[kv.KVStore]:
    with kv.create("local") as store:
        yield store


def grad(rank: int, step: int, shape: tuple[int, ...] = (4, 5)) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(shape).astype(np.float32)


def rows(rank: int, step: int) -> kv.RowSparse:
    rng = np.random.default_rng([rank, step, 1])
    ids = rng.integers(0, ROWS, 8)  # unsorted, with repeats
    return kv.RowSparse(ids, rng.standard_normal((8, DIM)).astype(np.float32))


# -- pushes and pulls ----------------------------------------------------------------------------

def test_pushes_of_one_key_are_summed_and_replace_the_value_without_an_updater(
        local: kv.KVStore) -> None:
    a, b, c = (np.full((2, 3), x, np.float32) for x in (1, 2, 4))
    local.init(3, np.zeros((2, 3), np.float32))
    local.push(3, [a, b, c])
    assert local.pull(3).tolist() == [[7.0] * 3] * 2
    local.init([5, 7], [np.zeros(2, np.float32), np.zeros(1, np.float64)])
    local.push([5, 7], [[a[0, :2], b[0, :2]], np.ones(1)])
    out = [np.empty(2, np.float32), np.empty(2, np.float32)]
    local.pull(5, out=out)
    assert [o.tolist() for o in out] == [[3.0, 3.0]] * 2
    assert local.pull(7).dtype == np.float64


def test_with_an_updater_a_push_is_one_update_with_the_sum(local: kv.KVStore) -> None:
    local.init("w", np.ones(4, np.float32))
    local.set_updater({"type": "kSGD", "momentum": 0.5, "learning_rate": {"base_lr": 0.1}})
    local.push("w", [np.ones(4, np.float32), np.ones(4, np.float32)])
    local.push("w", np.ones(4, np.float32))
    # h = -0.2; w = 0.8; h = 0.5 * -0.2 - 0.1 = -0.2; w = 0.6
    np.testing.assert_allclose(local.pull("w"), 0.6, rtol=1e-6)
    w = np.empty(4, np.float32)
    assert local.pushpull("w", np.zeros(4, np.float32), out=w) is w
    np.testing.assert_allclose(w, 0.5, rtol=1e-6)  # momentum alone: h = -0.1


def test_the_caller_may_change_its_gradient_once_push_returns() -> None:
    with kv.create("dist_sync", num_workers=2) as store:
        def train(s: kv.KVStore) -> list[float]:
            s.init("w", np.zeros(3, np.float32))
            g = np.full(3, s.rank + 1.0, np.float32)
            s.push("w", g)
            g[...] = 100  # the round may not be complete yet
            return s.pull("w").tolist()

        assert store.run(train) == [[3.0] * 3] * 2


def test_row_sparse_pull_takes_rows_in_any_order_with_repeats(local: kv.KVStore) -> None:
    table = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM)
    local.init("emb", table, row_sparse=True)
    ids = np.array([7, 2, 7, 49, 0])
    np.testing.assert_array_equal(local.row_sparse_pull("emb", row_ids=ids), table[ids])
    whole = np.full((ROWS, DIM), -1, np.float32)
    local.row_sparse_pull("emb", out=whole, row_ids=[3, 1])  # the others 0, as MXNet's
    assert (whole[[1, 3]] == table[[1, 3]]).all() and (whole[0] == 0).all()
    np.testing.assert_array_equal(local.pull("emb"), table)
    with pytest.raises(ParamError, match="row id 50 is outside the table's rows"):
        local.row_sparse_pull("emb", row_ids=[50])
    with pytest.raises(ParamError, match="not row-sparse"):
        local.init("dense", np.zeros(3, np.float32))
        local.row_sparse_pull("dense", row_ids=[0])


def test_row_sparse_pushes_sum_repeated_ids_and_touch_only_their_rows(local: kv.KVStore) -> None:
    local.init("emb", np.zeros((ROWS, DIM), np.float32), row_sparse=True)
    local.set_updater(SGD)
    local.push("emb", [kv.RowSparse([4, 1, 4], np.ones((3, DIM), np.float32)),
                       (np.array([1]), np.ones((1, DIM), np.float32))])
    table = local.pull("emb")
    assert table[4].tolist() == [-2.0] * DIM and table[1].tolist() == [-2.0] * DIM
    assert np.count_nonzero(table) == 2 * DIM


def test_a_tables_push_in_one_process_is_applied_at_once_as_its_message_would_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store the only worker of servers in its process: a push of one table's rows goes
    straight to its server (KeyServer.push_rows), and ends as the push as a message ends,
    bit for bit (values, versions, updater state); a NaN still refuses the push and names
    the key, and a table on two servers goes as messages."""
    real = KeyServer.push_rows
    taken: list[bool] = []

    def spy(self: KeyServer, *args: Any) -> bool:
        taken.append(real(self, *args))
        return taken[-1]

    def run(shortcut: bool, servers: int = 1) -> dict[str, np.ndarray]:
        with monkeypatch.context() as m:
            m.setattr(KeyServer, "push_rows", spy if shortcut else lambda *_: False)
            with kv.create("local", num_servers=servers, bound=ROWS * DIM // 2) as store:
                store.init("emb", kv.Fill((ROWS, DIM), {"type": "kGaussian", "std": 1.0}),
                           row_sparse=True)
                store.set_updater(ADAM)
                for step in range(4):
                    store.push("emb", rows(0, step))  # unsorted ids, with repeats
                    store.row_sparse_pull("emb", row_ids=[3, 1, 3])
                store.push("emb", (np.array([9, 2]), np.ones((2, DIM))))  # float64 rows
                ids = np.array([1, 7, 30, 48])  # (on both servers of two)
                out = np.full((4, DIM), np.nan, np.float32)
                assert store.row_sparse_pull("emb", out=out, row_ids=ids) is out
                np.testing.assert_array_equal(out, store.pull("emb")[ids])
                bad = np.ones((1, DIM), np.float32)
                bad[0, 2] = np.nan
                with pytest.raises(ClusterError, match=r"non-finite .* 'emb' \(1 NaN\)"):
                    store.push("emb", kv.RowSparse([5], bad))  # (two servers: refused here)
                    store.wait()
                store.save(tmp_path / f"{shortcut}-{servers}.safetensors")
        return load_file(tmp_path / f"{shortcut}-{servers}.safetensors")

    want = run(False)
    got = run(True)
    assert taken == [True] * 5 + [False]  # the NaN: as a message, which names it
    assert want.keys() == got.keys() and "emb/state/m" in want
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    taken.clear()
    two = run(True, servers=2)
    assert not taken  # two pieces: as messages
    np.testing.assert_array_equal(two["emb/values"], want["emb/values"])


def test_a_closed_store_refuses_a_tables_push_and_pull_in_one_process() -> None:
    # (they go to the server without a message, whose sending would have said so)
    store = kv.create("local")
    store.init("emb", np.zeros((ROWS, DIM), np.float32), row_sparse=True)
    store.close()
    with pytest.raises(ParamError, match="the key-value store is closed"):
        store.push("emb", kv.RowSparse([1], np.ones((1, DIM), np.float32)))
    with pytest.raises(ParamError, match="the key-value store is closed"):
        store.row_sparse_pull("emb", out=np.empty((1, DIM), np.float32), row_ids=[1])


def test_only_the_rows_pushed_and_pulled_travel() -> None:
    meter: list[MeteredTransport] = []

    def metered(servers: Any) -> MeteredTransport:
        meter.append(MeteredTransport(LocalTransport(servers)))
        return meter[0]

    with kv.create("local", num_servers=2, bound=100, transport=metered) as store:
        store.init("emb", kv.Fill((10_000, 16)), row_sparse=True)
        store.set_updater(ADAM)
        moved = {}
        for n in (10, 100):
            meter[0].reset()
            ids = np.arange(n) * 97
            store.push("emb", kv.RowSparse(ids, np.ones((n, 16), np.float32)))
            store.row_sparse_pull("emb", row_ids=ids)
            # int64 ids, float32 rows, and per server's message the bounds of the key's
            # part (two int64 for the rows, two for the ids) and its table flag
            assert 0 <= meter[0].sent["Update"] - n * (8 + 16 * 4) <= 2 * (4 * 8 + 1)
            moved[n] = meter[0].received["Values"]
        # rows, and a version per reply (one reply per server to the push and to the pull)
        assert all(0 <= moved[n] - n * 16 * 4 <= 4 * 8 for n in moved)


# -- keys and init -------------------------------------------------------------------------------

def test_int_and_str_keys_but_not_both(local: kv.KVStore) -> None:
    local.init(0, np.zeros(1, np.float32))
    with pytest.raises(ParamError, match="a store's keys are all int or all str"):
        local.init("w", np.zeros(1, np.float32))
    with kv.create("local") as other:
        other.init(["w", "b"], [np.zeros(1, np.float32), np.zeros(2, np.float32)])
        with pytest.raises(ParamError, match="key 3 is an int"):
            other.push(3, np.zeros(1, np.float32))
    with pytest.raises(ParamError, match="a key must be an int or a str, not float"):
        local.init(1.5, np.zeros(1, np.float32))


def test_a_second_init_is_refused_and_changes_nothing(local: kv.KVStore) -> None:
    local.init("w", np.ones(3, np.float32))
    with pytest.raises(ParamError, match="key 'w': it is initialised already"):
        local.init(["v", "w"], [np.zeros(1, np.float32), np.zeros(3, np.float32)])
    assert local.pull("w").tolist() == [1.0] * 3
    with pytest.raises(ParamError, match="key 'v' is not initialised"):
        local.pull("v", out=np.zeros(1, np.float32))  # "v" was not made either


def test_only_rank_0s_init_is_used_and_the_others_must_agree() -> None:
    with kv.create("dist_sync", num_workers=3, num_servers=2, bound=4) as store:
        def train(s: kv.KVStore) -> list[float]:
            s.init("w", np.full(10, s.rank + 1.0, np.float32))
            return s.pull("w").tolist()

        assert store.run(train) == [[1.0] * 10] * 3

        def bad(s: kv.KVStore) -> None:
            s.init("v", np.zeros((2, 3) if s.rank == 0 else (3, 2), np.float32))

        with pytest.raises(ClusterError, match=r"rank 1: float32 \(3, 2\), but rank 0 "
                                               r"initialised it as float32 \(2, 3\)"):
            store.run(bad)


def test_a_key_made_by_the_stores_maker_is_known_to_the_workers() -> None:
    with kv.create("dist_sync", num_workers=2, num_servers=3) as store:
        store.init(["a", "b"], [np.arange(5, dtype=np.float32), kv.Fill((6, 2))],)
        assert store.run(lambda s: s.pull("a").tolist()) == [[0, 1, 2, 3, 4]] * 2
        with pytest.raises(ClusterError, match="initialised already"):
            store.run(lambda s: s.init("a", np.zeros(5, np.float32)))


def test_a_fill_on_the_servers_equals_the_fill_of_the_whole_param() -> None:
    init = {"type": "kGaussian", "std": 0.5}
    ps = ParamSet([("emb", (1000, 7), {"init": init})])
    init_params(ps, seed=3)
    for servers in (1, 3):
        with kv.create("local", num_servers=servers, bound=10) as store:
            store.init("emb", kv.Fill((1000, 7), init, seed=3), row_sparse=True)
            assert len(plan_key("emb", False, (1000, 7), True, servers, 10)) == servers
            np.testing.assert_array_equal(store.pull("emb"), ps.values.reshape(1000, 7))


def test_large_keys_are_sliced_and_small_ones_spread() -> None:
    assert plan_key("w", False, (3, 4), False, 4, 100) == [(plan_key("w", False, (1,), False,
                                                                      4, 100)[0][0], 0, 12)]
    assert {plan_key(k, True, (2,), False, 4)[0][0] for k in ("0", "1", "2", "3")} == {
        0, 1, 2, 3}
    pieces = plan_key("big", False, (1000, 10), True, 3, 100)
    assert [p[0] for p in pieces] == [0, 1, 2] and pieces[-1][2] == 1000
    assert all(a[2] == b[1] for a, b in itertools.pairwise(pieces))


def test_updaters_are_declarations() -> None:
    with kv.create("local") as store:
        with pytest.raises(ParamError, match="not a object object"):
            store.set_updater(object())
        store.set_updater('type: kAdaGrad learning_rate { base_lr: 0.5 }')
        with pytest.raises(ParamError, match="Invalid Input: 'kNope'"):
            store.set_updater({"type": "kNope"})


# -- workers ------------------------------------------------------------------------------------

def _run_sync(backend: str, updater: dict[str, Any] = ADAM, steps: int = 4,
              threads: list[str | None] | None = None) -> dict[str, np.ndarray]:
    with kv.create("dist_sync", num_workers=3, num_servers=2, bound=30,
                   backend=backend) as store:
        store.init(["w", "emb"], [np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5),
                                  kv.Fill((ROWS, DIM), {"type": "kUniform"})],
                   row_sparse=[False, True])
        store.set_updater(updater)

        def train(s: kv.KVStore) -> str | None:
            for step in range(steps):
                s.push("w", grad(s.rank, step))
                s.push("emb", rows(s.rank, step))
                s.row_sparse_pull("emb", row_ids=rows(s.rank, step + 1).ids)
            return os.environ.get("NUMBA_NUM_THREADS")

        found = store.run(train)
        if threads is not None:
            threads += found
        return {"w": store.pull("w"), "emb": store.pull("emb")}


def _run_one(updater: dict[str, Any] = ADAM, steps: int = 4) -> dict[str, np.ndarray]:
    with kv.create("local", num_servers=2, bound=30) as store:
        store.init(["w", "emb"], [np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5),
                                  kv.Fill((ROWS, DIM), {"type": "kUniform"})],
                   row_sparse=[False, True])
        store.set_updater(updater)
        for step in range(steps):
            store.push("w", [grad(r, step) for r in range(3)])
            store.push("emb", [rows(r, step) for r in range(3)])
        return {"w": store.pull("w"), "emb": store.pull("emb")}


def test_dist_sync_equals_one_worker_pushing_the_sum() -> None:
    got, want = _run_sync("local"), _run_one()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_dist_async_applies_every_push_exactly_once() -> None:
    with kv.create("dist_async", num_workers=3, num_servers=2, bound=5) as store:
        store.init(["w", "emb"], [np.zeros(8, np.float32), np.zeros((ROWS, DIM), np.float32)],
                   row_sparse=False)
        store.set_updater(SGD)

        def train(s: kv.KVStore) -> None:
            for _ in range(5 + s.rank):
                s.push("w", np.ones(8, np.float32))
                s.push("emb", np.ones((ROWS, DIM), np.float32))

        store.run(train)
        assert store.pull("w").tolist() == [-18.0] * 8
        assert (store.pull("emb") == -18).all()


def test_bounded_staleness_holds_a_pull_until_the_slowest_is_close_enough() -> None:
    def train(s: kv.KVStore) -> None:
        s.init("w", np.zeros(2, np.float32))
        pushes = 1 if s.rank == 1 else 3
        for _ in range(pushes):
            s.push("w", np.ones(2, np.float32))
        if s.rank == 0:
            s.pull("w")  # 3 pushes against worker 1's 1
        s.barrier()

    with kv.create("dist_async", num_workers=2, staleness=2) as store:
        store.run(train)  # 3 - 1 <= 2

    # 3 - 1 > 1: worker 0's pull waits for worker 1, which waits (outside the store, so
    # that no timeout of its own can come first) until worker 0 has given up
    pulled = threading.Event()

    def held(s: kv.KVStore) -> None:
        s.init("w", np.zeros(2, np.float32))
        for _ in range(1 if s.rank == 1 else 3):
            s.push("w", np.ones(2, np.float32))
        if s.rank == 1:
            pulled.wait()
            return
        try:
            s.pull("w")
        finally:
            pulled.set()

    with kv.create("dist_async", num_workers=2, staleness=1, timeout=1.0) as store:
        with pytest.raises(ClusterError, match="waited 1 s for server 0's values of key 'w'"):
            store.run(held)


def test_a_failing_worker_stops_the_run_with_its_error() -> None:
    def train(s: kv.KVStore) -> None:
        s.init("w", np.zeros(2, np.float32))
        if s.rank == 1:
            raise ValueError("boom")
        s.push("w", np.ones(2, np.float32))
        s.pull("w")

    with kv.create("dist_sync", num_workers=2, timeout=20) as store:
        with pytest.raises(ClusterError, match="boom") as e:
            store.run(train)
        assert isinstance(e.value.__cause__, ValueError)


def test_a_nonfinite_push_is_refused_and_named() -> None:
    with kv.create("local") as store:
        store.init("w", np.zeros(2, np.float32))
        store.set_updater(SGD)
        store.push("w", np.array([1.0, np.nan], np.float32))
        with pytest.raises(ClusterError, match=r"non-finite gradient .* 'w' \(1 NaN\)"):
            store.pull("w")
        assert store.pull("w").tolist() == [0.0, 0.0]


@pytest.mark.parametrize("servers", [2, 3])
def test_a_nonfinite_push_of_a_key_on_several_servers_changes_no_piece(servers: int) -> None:
    """A key cut across servers: under 'error' the push is refused before any server has
    it (no piece is updated); under 'skip' it is dropped with a warning. (A server sees only
    its piece: its own check alone updated the other pieces, and 'skip' applied NaN.)"""
    g = np.ones(16, np.float32)
    g[12] = np.nan
    with kv.create("local", num_servers=servers, bound=4) as store:
        store.init("w", np.zeros(16, np.float32))
        store.set_updater(SGD)
        with pytest.raises(ClusterError, match=r"non-finite gradient in the push of key 'w' "
                                               r"\(1 NaN\): the push is refused"):
            store.push("w", g)
        assert store.pull("w").tolist() == [0.0] * 16
    with kv.create("local", num_servers=servers, bound=4, nonfinite="skip") as store:
        store.init("w", np.zeros(16, np.float32))
        store.set_updater(SGD)
        with pytest.warns(RuntimeWarning, match="the push is dropped"):
            store.push("w", g)
        assert store.pull("w").tolist() == [0.0] * 16
        store.push("w", np.ones(16, np.float32))
        assert np.all(store.pull("w") < 0)


# -- compression -------------------------------------------------------------------------------

def test_compressed_pushes_deliver_what_was_pushed_in_the_end() -> None:
    """2-bit with error feedback: the pushed gradients less the residual kept, which stays
    below the threshold where the gradients do; bf16: each value to 2^-8 relative."""
    g = np.random.default_rng(0).uniform(-0.24, 0.24, (ROWS, DIM)).astype(np.float32)
    with kv.create("local", compression={"type": "2bit", "threshold": 0.25}) as store:
        store.init(["w", "emb"], [np.zeros((ROWS, DIM), np.float32)] * 2)
        store.init("t", np.zeros((ROWS, DIM), np.float32), row_sparse=True)
        store.set_updater(SGD)
        for _ in range(40):
            store.push(["w", "t"], [g, kv.RowSparse(np.arange(ROWS), g)])
        for name in ("w", "t"):
            np.testing.assert_allclose(store.pull(name), -40 * g, atol=0.25 + 1e-5)
    with kv.create("local", compression="bf16") as store:
        store.init("w", np.zeros((ROWS, DIM), np.float32))
        store.set_updater(SGD)
        store.push("w", g)
        np.testing.assert_allclose(store.pull("w"), -g, rtol=2 ** -8)
    with pytest.raises(ParamError, match="valid values are"):
        kv.create("local", compression={"type": "1bit"})


# -- state -------------------------------------------------------------------------------------

def test_save_and_load_continue_bit_for_bit_on_any_number_of_servers(tmp_path: Path) -> None:
    def steps(store: kv.KVStore, first: int) -> None:
        for step in range(first, first + 3):
            store.push("w", grad(0, step))
            store.push("emb", rows(0, step))

    with kv.create("local", num_servers=2, bound=30) as store:
        store.init(["w", "emb"], [np.zeros((4, 5), np.float32),
                                  kv.Fill((ROWS, DIM), {"type": "kUniform"})],
                   row_sparse=[False, True])
        store.set_updater(ADAM)
        steps(store, 0)
        store.save(tmp_path / "kv.safetensors")
        steps(store, 3)
        want = {k: store.pull(k) for k in ("w", "emb")}
    with kv.create("local", num_servers=3, bound=30) as store:
        store.load(tmp_path / "kv.safetensors")  # makes the keys, sets the file's updater
        steps(store, 3)
        for k in want:
            np.testing.assert_array_equal(store.pull(k), want[k])
    with kv.create("local") as store:
        store.init("w", np.zeros((5, 4), np.float32))
        with pytest.raises(ParamError, match=r"key 'w' is float32 \(5, 4\) here, float32 "
                                             r"\(4, 5\) in"):
            store.load(tmp_path / "kv.safetensors")
        store.set_updater(SGD)
        with pytest.raises(ParamError, match="set_updater\\(\\) the file's first"):
            store.load(tmp_path / "kv.safetensors")


# -- Ray ----------------------------------------------------------------------------------------

def test_a_synchronous_sparse_run_is_the_same_on_ray(ray_session: Any) -> None:
    threads: list[str | None] = []
    got, want = _run_sync("ray", threads=threads), _run_sync("local")
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    # each actor's kernels run on the cluster's CPUs per actor (3 workers, 2 servers),
    # unless the environment says how many
    per_actor = max(1, int(ray_session.cluster_resources()["CPU"]) // 5)
    want = os.environ.get("NUMBA_NUM_THREADS") or str(min(per_actor, os.cpu_count() or 1))
    assert threads == [want] * 3


# -- one message per server per call (ps-lite's key ranges) --------------------------------


def _grad(rank: int, step: int, key: int, size: int) -> np.ndarray:
    return np.random.default_rng([rank, step, key]).standard_normal(size).astype(np.float32)


def test_a_push_or_pull_of_many_keys_is_one_message_per_server() -> None:
    sent: list[tuple[int, str]] = []

    class Counting(LocalTransport):
        def send(self, to: Any, request: Any, what: str) -> Any:
            sent.append((to[1], type(request).__name__))
            return super().send(to, request, what)

    keys = [*range(50), 1000]  # key 1000 is cut over the servers (bound 100)
    sizes = [8] * 50 + [600]
    with kv.create("local", num_servers=3, bound=100, transport=Counting) as store:
        store.init(keys, [np.zeros(n, np.float32) for n in sizes])
        sent.clear()
        grads = [_grad(0, 0, k, n) for k, n in zip(keys, sizes, strict=True)]
        store.push(keys, grads)
        outs = [np.empty(n, np.float32) for n in sizes]
        store.pull(keys, out=outs)
        assert sorted(sent) == sorted([(s, "KeyBatch") for s in range(3)] * 2)
        for g, o in zip(grads, outs, strict=True):
            assert np.array_equal(o, g)


def test_workers_in_step_pushing_lists_of_keys_get_each_keys_sum_every_round() -> None:
    keys = [*range(30), 77]
    sizes = [5] * 30 + [300]

    def train(s: kv.KVStore) -> list[np.ndarray]:
        if s.rank == 0:
            s.init(keys, [np.zeros(n, np.float32) for n in sizes])
        s.barrier()
        got: list[np.ndarray] = []
        for step in range(3):
            s.push(keys, [_grad(s.rank, step, k, n) for k, n in zip(keys, sizes, strict=True)])
            got = s.pull(keys)
        return got

    with kv.create("dist_sync", num_workers=3, num_servers=2, bound=100) as store:
        results = store.run(train)
    for got in results:
        for k, n, values in zip(keys, sizes, got, strict=True):
            want = (_grad(0, 2, k, n) + _grad(1, 2, k, n)) + _grad(2, 2, k, n)
            assert np.array_equal(values, want)


def test_a_batch_push_with_a_key_pushed_alone_between_keeps_every_round() -> None:
    # worker by worker the rounds of a batch and of a key's own push interleave
    def train(s: kv.KVStore) -> np.ndarray:
        if s.rank == 0:
            s.init([0, 1, 2], [np.zeros(4, np.float32)] * 3)
        s.barrier()
        for step in range(2):
            s.push([0, 1], [np.full(4, s.rank + 1, np.float32)] * 2)
            s.push(2, [np.full(4, step, np.float32), np.ones(4, np.float32)])  # a list: alone
        return np.concatenate(s.pull([0, 1, 2]))

    with kv.create("dist_sync", num_workers=2, updater={"type": "kSGD", "learning_rate": {
            "base_lr": 1.0}}) as store:
        results = store.run(train)
    want = np.concatenate([np.full(4, -6.0), np.full(4, -6.0), np.full(4, -(2 + 4))])
    for got in results:
        assert np.array_equal(got, want.astype(np.float32))


def test_a_nan_in_a_batch_push_refuses_that_keys_update_only_and_names_it() -> None:
    with kv.create("local") as store:
        store.init([0, 1], [np.ones(4, np.float32), np.ones(4, np.float32)])
        bad = np.array([1, np.nan, 0, 0], np.float32)
        store.push([0, 1], [np.full(4, 2, np.float32), bad])
        with pytest.raises(ClusterError, match="non-finite gradient"):
            store.pull([0, 1])
        assert store.pull(0).tolist() == [2.0] * 4
        assert store.pull(1).tolist() == [1.0] * 4


def test_a_push_or_row_sparse_pull_of_many_tables_is_one_message_per_server() -> None:
    sent: list[tuple[int, str]] = []

    class Counting(LocalTransport):
        def send(self, to: Any, request: Any, what: str) -> Any:
            sent.append((to[1], type(request).__name__))
            return super().send(to, request, what)

    rng = np.random.default_rng(3)
    tables = [f"emb{i}" for i in range(6)] + ["big"]  # 'big' is cut over the servers
    shapes = [(50, 4)] * 6 + [(400, 3)]
    with kv.create("local", num_servers=3, bound=100, transport=Counting) as store:
        store.init(tables, [kv.Fill(s) for s in shapes], row_sparse=True)
        store.init("w", np.zeros(7, np.float32))
        sent.clear()
        ids = [rng.choice(s[0], 9, replace=False) for s in shapes]
        rows = [rng.standard_normal((9, s[1])).astype(np.float32) for s in shapes]
        w = rng.standard_normal(7).astype(np.float32)
        store.push([*tables, "w"], [*(kv.RowSparse(i, r) for i, r in zip(ids, rows,
                                                                         strict=True)), w])
        pulled = store.row_sparse_pull(tables, row_ids=ids)
        # every server holds a piece of 'big': one message to each per call
        assert sorted(sent) == sorted([(s, "KeyBatch") for s in range(3)] * 2)
        for r, p in zip(rows, pulled, strict=True):
            assert np.array_equal(p, r)
        assert np.array_equal(store.pull("w"), w)
        # out of the table's shape: the rows at their ids, every other row 0; repeats
        again, far = np.array([3, 3, 0, 1, 49, 0]), np.array([3, 3, 0, 1, 399, 0])
        outs = [np.full(shapes[0], 9, np.float32), np.empty((6, 3), np.float32)]
        store.row_sparse_pull(["emb0", "big"], out=outs, row_ids=[again, far])
        table0 = np.zeros(shapes[0], np.float32)
        table0[ids[0]] = rows[0]
        want0 = np.zeros(shapes[0], np.float32)
        want0[again] = table0[again]
        assert np.array_equal(outs[0], want0)
        big = store.pull("big")
        assert np.array_equal(outs[1], big[far])


def test_workers_in_step_pushing_many_tables_end_as_key_by_key(backend: str = "local"
                                                               ) -> None:
    # the same rounds, sums in worker order and lazy updates as pushes of one key at a time
    shapes = {"a": (60, 5), "b": (300, 2), "c": (40, 3)}

    def ids_rows(rank: int, step: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([rank, step, ord(name)])
        n, dim = shapes[name]
        ids = rng.integers(0, n, 12)  # repeats, any order
        return ids, rng.standard_normal((12, dim)).astype(np.float32)

    def train(s: kv.KVStore, batched: bool) -> list[np.ndarray]:
        if s.rank == 0:
            s.init(list(shapes), [kv.Fill(v, {"type": "kConstant", "value": 0.5})
                                  for v in shapes.values()], row_sparse=True)
        s.barrier()
        for step in range(3):
            grads = [kv.RowSparse(*ids_rows(s.rank, step, n)) for n in shapes]
            if batched:
                s.push(list(shapes), grads)
            else:
                for n, g in zip(shapes, grads, strict=True):
                    s.push(n, g)
            pulled = s.row_sparse_pull(list(shapes), row_ids=[np.arange(v[0]) for v in
                                                              shapes.values()])
        return pulled

    got = {}
    for batched in (True, False):
        with kv.create("dist_sync", num_workers=2, num_servers=2, bound=200,
                       updater=ADAM, backend=backend if batched else "local") as store:
            got[batched] = store.run(train, batched)
    for a, b in zip(got[True], got[False], strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)
    assert not np.array_equal(got[True][0][0], np.full((60, 5), 0.5, np.float32))


def test_batches_of_tables_inits_and_descriptions_on_ray_end_as_key_by_key(
        ray_session: Any) -> None:
    test_workers_in_step_pushing_many_tables_end_as_key_by_key("ray")


def test_an_init_of_many_keys_is_one_message_per_server_and_refuses_a_second_whole() -> None:
    sent: list[tuple[int, str]] = []

    class Counting(LocalTransport):
        def send(self, to: Any, request: Any, what: str) -> Any:
            sent.append((to[1], type(request).__name__))
            return super().send(to, request, what)

    keys = [*range(40), 1000]  # key 1000 is cut over the servers (bound 100)
    values = [np.full(n, k, np.float64 if k % 3 else np.float32)
              for k, n in zip(keys, [3] * 40 + [500], strict=True)]
    with kv.create("local", num_servers=3, bound=100, transport=Counting) as store:
        sent.clear()
        store.init(keys, values)
        # the home servers' messages, then the pieces of key 1000 on the two others
        assert sorted(sent) == sorted([(s, "KeyInits") for s in range(3)]
                                      + [(s, "KeyInit") for s in range(3)
                                         if s != 1000 % 3])
        for k, v in zip(keys, values, strict=True):
            got = store.pull(k)
            assert got.dtype == v.dtype and np.array_equal(got, v)
        # a batch with a key another store made: refused by its server, which makes none of
        # the batch's keys (key 42 lies there too; as before, an init of a list is not one
        # transaction across servers: key 10,000 lies on another)
        with pytest.raises(ClusterError, match="key '3' is initialised already"):
            other = kv.KVStore(store._spec, store._transport)
            other.init([3, 10_000, 42], [np.zeros(2, np.float32)] * 3)
        assert store.pull(3).tolist() == [3.0] * 3
        with pytest.raises(ParamError, match="key '42' is not initialised"):
            store.pull(42)


def test_workers_ask_for_many_keys_descriptions_in_one_message_per_server() -> None:
    sent: list[str] = []

    class Counting(LocalTransport):
        def send(self, to: Any, request: Any, what: str) -> Any:
            sent.append(type(request).__name__)
            return super().send(to, request, what)

    keys = list(range(30))

    def train(s: kv.KVStore) -> list[np.ndarray]:
        s.init(keys, [np.full(2, k, np.float32) for k in keys])  # rank 0's are used
        return s.pull(keys)

    with kv.create("dist_sync", num_workers=2, num_servers=3,
                   transport=Counting) as store:
        results = store.run(train)
    assert "Describe" not in sent and sent.count("DescribeKeys") == 3
    for got in results:
        assert [g.tolist() for g in got] == [[float(k)] * 2 for k in keys]
