"""A list of keys pushed and pulled every step (MXNet's way) is planned once by the store and
held as one group of pieces by each server (values, versions and updater state in one
buffer each, one updater call a step): it must end exactly as the same pushes key by key —
values, update counts, versions and updater state bit for bit — whatever comes between
(a key pushed alone, a list that leaves keys out, another list, a save and a load, a new
updater, workers in step or not)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import paramserver.kv as kv
from paramserver import ParamError
from paramserver.checkpoint import load_checkpoint
from paramserver.cluster.keys import KeyServer
from paramserver.cluster.messages import (
    KEY_SEPARATOR,
    Ack,
    ErrorReply,
    Get,
    KeyBatch,
    KeyInit,
    Update,
    Values,
)
from paramserver.cluster.server import Server
from paramserver.config.job import ClusterConf

ADAM = {"type": "kAdam", "learning_rate": {"type": "kStep", "base_lr": 0.01,
                                           "step_conf": {"gamma": 0.5, "change_freq": 3}},
        "weight_decay": 0.001}
SGD = {"type": "kSGD", "momentum": 0.9, "learning_rate": {"base_lr": 0.1}}
KEYS = list(range(12))
SIZES = [3, 8, 1, 5, 64, 2, 7, 9, 300, 4, 6, 10]  # key 8 is cut over the servers (bound 100)


def grad(key: int, step: int, rank: int = 0) -> np.ndarray:
    rng = np.random.default_rng([key, step, rank])
    return rng.standard_normal(SIZES[key]).astype(np.float32)


def held_groups(store: kv.KVStore) -> int:
    """How many groups of keys the embedded store's servers hold now."""
    return sum(1 for server in store._transport.servers.values()  # type: ignore[attr-defined]
               for g in server._groups.values() if g.alive)


def make(updater: Any, servers: int = 2) -> kv.KVStore:
    store = kv.create("local", num_servers=servers, bound=100, updater=updater)
    store.init(KEYS, [np.random.default_rng(k).standard_normal(n).astype(np.float32)
                      for k, n in zip(KEYS, SIZES, strict=True)])
    return store


def saved(store: kv.KVStore, path: Path) -> dict[str, np.ndarray]:
    store.save(str(path))
    arrays, _ = load_checkpoint(path)
    return dict(arrays)


def same_files(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


#: Steps: the keys each pushes as one list (None: every key), what comes after it.
SCRIPT: list[tuple[list[int] | None, str]] = [
    (None, ""), (None, ""), (None, "pull"), (None, ""),
    ([0, 1, 2, 3, 4, 5], ""),           # a list leaving keys out: they are not touched
    (None, "alone"),                     # then a key pushed alone
    (None, ""), ([4, 5, 6, 7, 8, 9, 10, 11], "pull"), (None, "save"), (None, ""),
    (None, "other list pull"), (None, ""), (None, ""),
]


def run_script(store: kv.KVStore, batched: bool, tmp: Path) -> list[np.ndarray]:
    seen: list[np.ndarray] = []
    for step, (keys, then) in enumerate(SCRIPT):
        keys = KEYS if keys is None else keys
        grads = [grad(k, step) for k in keys]
        if batched:
            store.push(keys, grads)
        else:
            for k, g in zip(keys, grads, strict=True):
                store.push(k, g)
        if "alone" in then:
            store.push(3, grad(3, 100 + step))
        if "save" in then:
            store.save(str(tmp / f"mid-{batched}.safetensors"))
        if "other list" in then:
            seen += store.pull([11, 2, 7])
        if "pull" in then or step == len(SCRIPT) - 1:
            if batched:
                seen += store.pull(KEYS)
            else:
                seen += [store.pull(k) for k in KEYS]
    return seen


@pytest.mark.parametrize("updater", [None, SGD, ADAM], ids=["none", "sgd", "adam"])
def test_a_list_of_keys_ends_as_the_same_pushes_key_by_key(updater: Any, tmp_path: Path
                                                          ) -> None:
    with make(updater) as batched, make(updater) as alone:
        got = run_script(batched, True, tmp_path)
        assert held_groups(batched) == 2  # the list is held as one group on each server
        want = run_script(alone, False, tmp_path)
        assert held_groups(alone) == 0
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        # values, versions, update counts and updater state, bit for bit
        same_files(saved(batched, tmp_path / "a.safetensors"),
                   saved(alone, tmp_path / "b.safetensors"))
        same_files(dict(load_checkpoint(tmp_path / "mid-True.safetensors")[0]),
                   dict(load_checkpoint(tmp_path / "mid-False.safetensors")[0]))


def test_a_key_left_out_of_a_list_keeps_its_count_and_state() -> None:
    with make(ADAM, servers=1) as store, make(ADAM, servers=1) as ref:
        for step in range(4):
            store.push(KEYS, [grad(k, step) for k in KEYS])
            ref.push(KEYS, [grad(k, step) for k in KEYS])
        before = store.pull(11)
        store.push(KEYS[:-1], [grad(k, 9) for k in KEYS[:-1]])  # key 11 left out
        np.testing.assert_array_equal(store.pull(11), before)
        store.push(KEYS, [grad(k, 10) for k in KEYS])
        for k in KEYS[:-1]:
            ref.push(k, grad(k, 9))
        ref.push(KEYS, [grad(k, 10) for k in KEYS])
        for g, w in zip(store.pull(KEYS), ref.pull(KEYS), strict=True):
            np.testing.assert_array_equal(g, w)


def test_a_new_updater_and_a_load_between_steps_of_a_list(tmp_path: Path) -> None:
    def steps(store: kv.KVStore, first: int, batched: bool) -> None:
        for step in range(first, first + 3):
            if batched:
                store.push(KEYS, [grad(k, step) for k in KEYS])
            else:
                for k in KEYS:
                    store.push(k, grad(k, step))

    ends = []
    for batched in (True, False):
        with make(ADAM) as store:
            steps(store, 0, batched)
            store.save(str(tmp_path / f"{batched}.safetensors"))
            steps(store, 3, batched)
            store.set_updater(SGD)  # its state starts from zero, every key's
            steps(store, 6, batched)
            store.load(str(tmp_path / f"{batched}.safetensors"), take_updater=True)
            steps(store, 9, batched)
            ends.append((store.pull(KEYS), saved(store, tmp_path / f"end-{batched}")))
    for g, w in zip(ends[0][0], ends[1][0], strict=True):
        np.testing.assert_array_equal(g, w)
    same_files(ends[0][1], ends[1][1])


def test_an_updater_function_sees_every_key_of_a_list_every_step() -> None:
    calls: list[int] = []

    def add_twice(key: int, given: np.ndarray, stored: np.ndarray) -> None:
        calls.append(key)
        stored += 2 * given

    with make(None, servers=1) as store:
        store.set_updater(add_twice)
        start = store.pull(KEYS)
        for step in range(3):
            store.push(KEYS, [np.full(n, step + 1, np.float32) for n in SIZES])
        assert sorted(calls) == sorted(KEYS * 3)
        for s, got in zip(start, store.pull(KEYS), strict=True):
            want = s.copy()
            for step in range(3):
                want += 2 * np.full(s.size, step + 1, np.float32)
            np.testing.assert_array_equal(got, want)


def test_workers_in_step_with_a_key_missing_from_one_workers_list(backend: str = "local"
                                                                  ) -> None:
    def train(s: kv.KVStore) -> list[np.ndarray]:
        if s.rank == 0:
            s.init(KEYS, [np.zeros(n, np.float32) for n in SIZES])
        s.barrier()
        for step in range(5):
            if s.rank == 1 and step == 2:  # key 5 later, alone: the round waits for it
                rest = [k for k in KEYS if k != 5]
                s.push(rest, [grad(k, step, s.rank) for k in rest])
                s.push(5, grad(5, step, s.rank))
            else:
                s.push(KEYS, [grad(k, step, s.rank) for k in KEYS])
            s.pull(KEYS)
        return s.pull(KEYS)

    with kv.create("dist_sync", num_workers=2, num_servers=2, bound=100, backend=backend,
                   updater={"type": "kSGD", "learning_rate": {"base_lr": 1.0}}) as store:
        results = store.run(train)
    for got in results:
        for k, values in zip(KEYS, got, strict=True):
            want = np.zeros(SIZES[k], np.float32)
            for step in range(5):
                want = want - (grad(k, step, 0) + grad(k, step, 1))
            np.testing.assert_array_equal(values, want)


def test_workers_in_step_pushing_lists_on_ray_end_as_key_by_key(ray_session: Any) -> None:
    test_workers_in_step_with_a_key_missing_from_one_workers_list("ray")


def test_workers_pushing_a_list_with_a_table_end_as_key_by_key(monkeypatch: Any) -> None:
    # a list of a dense key, a table (cut over both servers) and a dense key cut over both:
    # each server sums the workers' pushes of the list itself (a table's rows per id, the
    # two workers' ids overlapping) and applies them in one step per key
    table = 5  # (a store's keys are all ints or all strs)
    summed: list[bool] = []
    apply_summed = Server.apply_summed

    def counting(self: Server, group: int, total: np.ndarray, ids: Any = None) -> Any:
        summed.append(ids is not None)
        return apply_summed(self, group, total, ids)

    monkeypatch.setattr(Server, "apply_summed", counting)

    def rows(step: int, rank: int) -> kv.RowSparse:
        rng = np.random.default_rng([step, rank, 7])
        ids = np.sort(rng.choice(60, size=9 + rank, replace=False))
        return kv.RowSparse(ids, rng.standard_normal((ids.size, 4)).astype(np.float32))

    def train(s: kv.KVStore, batched: bool) -> list[np.ndarray]:
        keys: list[Any] = [0, table, 8]
        if s.rank == 0:
            s.init(0, np.zeros(SIZES[0], np.float32))
            s.init(table, kv.Fill((60, 4), {"type": "kConstant", "value": 0.25}),
                   row_sparse=True)
            s.init(8, np.zeros(SIZES[8], np.float32))
        s.barrier()
        for step in range(4):
            values = [grad(0, step, s.rank), rows(step, s.rank), grad(8, step, s.rank)]
            if batched:
                s.push(keys, values)
            else:
                for k, v in zip(keys, values, strict=True):
                    s.push(k, v)
            s.barrier()  # both workers' pushes of the step reach the servers before the next
            s.pull(0)
        return [s.pull(0), s.row_sparse_pull(table, row_ids=np.arange(60)), s.pull(8)]

    ends = []
    for batched in (True, False):
        summed.clear()
        with kv.create("dist_sync", num_workers=2, num_servers=2, bound=100,
                       updater=ADAM) as store:
            ends.append(store.run(train, batched))
        if batched:  # the tables' steps summed by the key servers (key by key, the workers'
            assert any(summed)  # single pushes may meet in any order: no claim on the path)
    for got, want in zip(*ends, strict=True):  # per worker
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def _key_server() -> tuple[KeyServer, Callable[[int, str], list[Any]]]:
    """A key server of two workers holding keys a, b and c (two zeros each, SGD with rate
    1), and a push of a list of them by a worker (every value ``worker + 1``), which
    returns the replies heard so far."""
    server = KeyServer(0, ClusterConf(nworkers_per_group=2, timeout=10.0),
                       '{"type": "kSGD", "learning_rate": {"base_lr": 1.0}}')
    server.connect(lambda *a, **k: None)
    for k in "abc":
        server.handle(KeyInit(k, (2,), "float32", False, False, True, (0, 2),
                              np.zeros(2, np.float32)), lambda reply: None)

    def push(worker: int, keys: str) -> list[Any]:
        heard: list[Any] = []
        server.handle(KeyBatch(KEY_SEPARATOR.join(keys), Update(0, worker, -1, None),
                               np.arange(0, 2 * len(keys) + 1, 2, dtype=np.int64),
                               np.full(2 * len(keys), worker + 1, np.float32)), heard.append)
        return heard

    return server, push


def _ended_in_step(server: KeyServer, *heard: list[Any]) -> None:
    assert server.waiting_for() == "server 0 is not waiting"
    assert all(len(h) == 1 and isinstance(h[0], Ack) for h in heard), heard
    for k in "abc":  # one step: 0 - (1 + 2)
        np.testing.assert_array_equal(server.keys[k].values, [-3.0, -3.0])


def test_a_get_sent_behind_a_push_is_answered_once_the_push_is() -> None:
    """A worker's get made ``after`` (sent right behind its push, on a channel that keeps
    their order) is held until that push is answered — here once the other worker has
    pushed too — and sees the step; a get not made so is answered at once, and another
    worker's get made so does not wait for this worker's push. An abort answers a held
    get."""
    server, push = _key_server()

    def get(worker: int, after: bool) -> list[Any]:
        heard: list[Any] = []
        server.handle(KeyBatch(KEY_SEPARATOR.join("abc"), Get(0, worker, 0, after=after)),
                      heard.append)
        return heard

    first = push(0, "abc")
    at_once, behind = get(0, after=False), get(0, after=True)
    other = get(1, after=True)  # worker 1 has no push waiting
    assert first == [] and behind == []
    for heard in (at_once, other):
        assert len(heard) == 1 and isinstance(heard[0], Values)
        np.testing.assert_array_equal(heard[0].values, np.zeros(6, np.float32))
    second = push(1, "abc")
    _ended_in_step(server, first, second)
    assert len(behind) == 1 and isinstance(behind[0], Values)
    np.testing.assert_array_equal(behind[0].values, np.full(6, -3.0, np.float32))
    # a get held behind a push that an abort answers is answered too
    held = push(0, "abc")
    behind = get(0, after=True)
    assert held == [] and behind == []
    server.abort("stopped")
    assert [type(h[0]) for h in (held, behind)] == [ErrorReply, ErrorReply]


def test_a_push_is_not_held_for_a_batch_while_its_keys_pieces_have_requests_on_the_way(
        ) -> None:
    # CI's deadlock: worker 1 pushes [a, b], worker 0 [a, b, c], worker 1 [c]. Worker 0's
    # list was handed to each key's piece key by key; worker 1's [c] must not then be held
    # waiting for a batch of worker 0's, while c's piece waits for worker 1.
    server, push = _key_server()
    _ended_in_step(server, push(1, "ab"), push(0, "abc"), push(1, "c"))


def test_a_piece_with_a_request_on_its_way_from_another_thread_is_not_held_in_a_batch(
        ) -> None:
    server, push = _key_server()
    piece = server.keys["c"]
    entered, go = threading.Event(), threading.Event()
    handle = piece.handle

    def slow(request: Any, reply: Any) -> None:  # worker 0's push of c, on its way
        piece.handle = handle  # type: ignore[method-assign]
        entered.set()
        assert go.wait(10)
        handle(request, reply)

    piece.handle = slow  # type: ignore[method-assign]
    first = push(1, "ab")
    heard: list[list[Any]] = []
    sender = threading.Thread(target=lambda: heard.append(push(0, "abc")))
    sender.start()
    assert entered.wait(10)
    last = push(1, "c")  # c's piece has worker 0's push on its way: key by key
    go.set()
    sender.join(10)
    _ended_in_step(server, first, heard[0], last)


def test_asynchronous_workers_pushing_lists_have_every_push_applied_once() -> None:
    def train(s: kv.KVStore) -> None:
        if s.rank == 0:
            s.init(KEYS, [np.zeros(n, np.float32) for n in SIZES])
        s.barrier()
        for step in range(6):  # whole numbers: the sum does not depend on the order
            s.push(KEYS, [np.full(n, (s.rank + 1) * (step + 1), np.float32) for n in SIZES])
            s.pull(KEYS)
        s.barrier()

    with kv.create("dist_async", num_workers=3, num_servers=2, bound=100,
                   updater={"type": "kSGD", "learning_rate": {"base_lr": 1.0}}) as store:
        store.run(train)
        got = store.pull(KEYS)
    total = sum((r + 1) * (s + 1) for r in range(3) for s in range(6))
    for values in got:
        np.testing.assert_array_equal(values, np.full(values.size, -total, np.float32))


def test_a_planned_list_checks_each_value_and_out_and_a_bad_one_changes_nothing() -> None:
    with make(None) as store:
        store.push(KEYS, [grad(k, 0) for k in KEYS])
        bad = [grad(k, 1) for k in KEYS]
        bad[4] = np.zeros(5, np.float32)
        with pytest.raises(ParamError, match=r"push of key 4: a value of shape \(5,\), "
                                             r"the key's is \(64,\)"):
            store.push(KEYS, bad)
        outs = [np.empty(n, np.float32) for n in SIZES]
        outs[7] = np.empty(3, np.float32)
        with pytest.raises(ParamError, match=r"pull of key 7: out must be a numpy array of "
                                            r"shape \(9,\)"):
            store.pull(KEYS, out=outs)
        got = store.pull(KEYS)
        for k, values in zip(KEYS, got, strict=True):
            np.testing.assert_array_equal(values, grad(k, 0))


def test_a_tables_rows_in_one_process_are_read_where_pushed_and_gathered_into_out() -> None:
    # one worker in this process: the push reads the caller's rows (applied before push
    # returns: changing them after changes nothing) and a pull of sorted distinct ids
    # into an out of one row per id is gathered there by the server
    table = (1000, 8)
    ids = np.array([3, 17, 400, 999], np.int64)
    with kv.create("local") as store, kv.create("local", num_servers=2, bound=100) as two:
        for s in (store, two):
            s.init(5, kv.Fill(table, {"type": "kConstant", "value": 0.5}), row_sparse=True)
            s.set_updater(SGD)
        for step in range(3):
            rows = np.random.default_rng(step).standard_normal((4, 8)).astype(np.float32)
            for s in (store, two):
                given = rows.copy()
                s.push(5, kv.RowSparse(ids, given))
                given[:] = np.nan  # after push returned: not the store's
        out = np.empty((4, 8), np.float32)
        store.row_sparse_pull(5, out=out, row_ids=ids)
        want = two.row_sparse_pull(5, row_ids=ids)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(store.pull(5), two.pull(5))
        with pytest.raises(ParamError, match="row id 1000 is outside"):
            store.row_sparse_pull(5, out=out, row_ids=np.array([3, 17, 400, 1000]))
