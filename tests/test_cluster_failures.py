"""Failures on the cluster, the same on both backends: a worker that raises or dies, a
server lost mid-run or before the first step, non-finite gradients under ``error`` and
``skip``, a worker stuck or hung past the timeout. Each is a clear error or the documented
policy, never a hang; every scenario runs embedded and on Ray (skipped without Ray).

On Ray the actors spread over the tests' three nodes (messages between nodes are Ray calls);
the scenarios that a run handles on its way (a failing, dead or hung worker, a stop asked
for, a lost server) also run with every actor on one node (``ray-node``), where every
message goes over a link, as on one machine; a dead worker and a lost server also with the
steps through a Compiled Graph (``ray-graph``: ``compiled=True``, on one node: across
nodes, Ray 2.60's raylet can crash when an actor of a graph dies, ray-project/ray#63229).

Events order the scenarios, never sleeps: a worker that is to die waits until the driver
has reported the step before (a Ray actor carries the event across processes); a stuck
worker waits on an event released after the run has given up on it. Timeouts are only what
is tested, and nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import Error, ParamError
from paramserver.checkpoint import checkpoint_name, list_checkpoints
from paramserver.cluster import Cluster, ClusterError, LocalTransport, Server, plan_servers
from paramserver.cluster import messages as msg
from paramserver.cluster.errors import ServerLost
from paramserver.cluster.passes import all_finite, nonfinite_counts, sum_into
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet
from paramserver.updaters import create_updater

sys.path.insert(0, str(Path(__file__).parent))
from conftest import on_this_node

SGD = {"type": "kSGD", "momentum": 0.5, "learning_rate": {"base_lr": 0.1}}
PLAIN = {"type": "kSGD", "learning_rate": {"base_lr": 1.0}}
#: Timeouts where a timeout is what is tested: Ray's messages cross processes.
TIMEOUT = {"local": 0.5, "ray": 2.0, "ray-node": 2.0, "ray-graph": 2.0}
#: A scenario that also runs with every actor on one node (conftest's ``backend``).
ONE_NODE = pytest.mark.parametrize("backend", ["local", "ray", "ray-node"], indirect=True)
#: ... and through a Compiled Graph too.
GRAPH = pytest.mark.parametrize("backend", ["local", "ray", "ray-node", "ray-graph"],
                                indirect=True)


# -- the two backends --------------------------------------------------------------------------

class _SignalActor:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def set(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


class Signal:
    """An event that a worker can wait on wherever it runs (a thread, a Ray actor)."""

    def __init__(self, backend: str):
        self._event = threading.Event() if backend == "local" else None
        if backend != "local":
            import ray

            self._actor = ray.remote(_SignalActor).remote()

    def set(self) -> None:
        if self._event is not None:
            self._event.set()
        else:
            import ray

            ray.get(self._actor.set.remote())

    def wait(self) -> None:
        if self._event is not None:
            self._event.wait(120)
        else:
            import ray

            ray.get(self._actor.wait.remote(), timeout=120)


def die(backend: str) -> None:
    """End the worker as a crash would: its process on Ray, its thread embedded."""
    if backend != "local":
        os._exit(3)
    raise SystemExit(3)


def make_params(seed: int = 0) -> ParamSet:
    ps = ParamSet([("w", (4, 6)), ("b", (6,))])
    ps.values[:] = np.random.default_rng(seed).standard_normal(ps.values.size)
    return ps


def grad_of(rank: int, step: int, size: int = 30) -> np.ndarray:
    return np.random.default_rng([rank, step]).standard_normal(size).astype(np.float32)


def fill(worker: Any, step: int) -> dict[str, int]:
    worker.params.grads[:] = grad_of(worker.rank, step)
    return {"rank": worker.rank}


def make(backend: str, params: ParamSet | None = None, updater: Any = SGD, **kw: Any
         ) -> tuple[Cluster, ParamSet]:
    options = {k: kw.pop(k) for k in ("max_restarts", "checkpoint_freq", "checkpoint_dir")
               if k in kw}
    kw.setdefault("timeout", 20.0)
    ps = params if params is not None else make_params()
    if backend in ("ray-node", "ray-graph"):
        options.update(on_this_node(), compiled=backend == "ray-graph")
        backend = "ray"
    return Cluster(ClusterConf(backend=backend, **kw), ps, updater, **options), ps


def reference(contributions: Callable[[int], list[int]], steps: int,
              updater: Any = SGD) -> np.ndarray:
    """Values after applying, per step, the mean of the given ranks' gradients by hand."""
    ps = make_params()
    up = create_updater(updater)
    state = up.init_state(ps.offsets, ps.dtype)
    for step in range(steps):
        ranks = contributions(step)
        total = grad_of(ranks[0], step)
        for r in ranks[1:]:
            total = total + grad_of(r, step)
        up.apply(step, ps.values, total, state, 1.0, 1.0, 1.0 / len(ranks))
    return ps.values


def failing_at(rank: int, step: int) -> Callable[[Any, int], Any]:
    def grads(worker: Any, s: int) -> dict[str, int]:
        if worker.rank == rank and s == step:
            raise ValueError("boom")
        return fill(worker, s)
    return grads


def dying_at(rank: int, step: int, backend: str, signal: Signal) -> Callable[[Any, int], Any]:
    def grads(worker: Any, s: int) -> dict[str, int]:
        if worker.rank == rank and s == step:
            signal.wait()  # the driver has every outcome of the step before
            die(backend)
        return fill(worker, s)
    return grads


def at_step(step: int, fn: Callable[[], None]) -> Callable[[int, Any], None]:
    return lambda s, metrics: fn() if s == step else None


# -- a worker's gradient function raises -------------------------------------------------------

@ONE_NODE
def test_a_failing_worker_stops_the_run_with_its_exception(backend: str) -> None:
    c, _ = make(backend, nworkers_per_group=3, nservers_per_group=2)
    try:
        with pytest.raises(ClusterError) as e:
            c.run(failing_at(1, 3), 10)
        assert str(e.value) == "worker 1 of group 0 (rank 1) failed at step 3: ValueError: boom"
        assert isinstance(e.value.__cause__, ValueError)
        assert c.step == 0  # the run did not complete
        c.run(fill, 2)  # the cluster can run again: the next put restarts the servers
        assert c.step == 2
    finally:
        c.close()


def test_continue_goes_on_without_a_failing_worker(backend: str) -> None:
    c, ps = make(backend, nworkers_per_group=3, on_worker_failure="continue")
    try:
        with pytest.warns(RuntimeWarning, match=r"worker 1 of group 0 \(rank 1\) failed at "
                                                r"step 2: ValueError: boom; the run goes on"):
            metrics = c.run(failing_at(1, 2), 5)
    finally:
        c.close()
    assert metrics[1] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert metrics[2] == [{"rank": 0}, None, {"rank": 2}]
    assert np.array_equal(ps.values, reference(lambda s: [0, 1, 2] if s < 2 else [0, 2], 5))


def test_every_worker_failing_is_an_error(backend: str) -> None:
    c, _ = make(backend, nworkers_per_group=2, on_worker_failure="continue")

    def broken(worker: Any, step: int) -> None:
        raise KeyError(f"no data for rank {worker.rank}")

    try:
        with pytest.warns(RuntimeWarning), pytest.raises(ClusterError) as e:
            c.run(broken, 3)
    finally:
        c.close()
    assert str(e.value).startswith("every worker failed; the first: worker ")
    assert isinstance(e.value.__cause__, KeyError)


def test_an_exception_in_on_step_stops_the_workers_and_is_raised(backend: str) -> None:
    c, _ = make(backend, nworkers_per_group=2)

    def on_step(step: int, metrics: Any) -> None:
        if step == 1:
            raise OSError("disk full")

    try:
        with pytest.raises(OSError, match="disk full"):
            c.run(fill, 1000, on_step=on_step)
        assert c.backend.busy() == []  # the workers stopped before run returned
    finally:
        c.close()


# -- a stop asked for (Ctrl-C) -----------------------------------------------------------------

@pytest.mark.parametrize(("backend", "asked_at"), [
    *((b, at) for b in ("local", "ray") for at in (13, 0, None)), ("ray-node", 13)],
    indirect=["backend"])
def test_a_stop_asked_for_ends_the_run_at_the_next_pause_and_it_goes_on_exactly(
        backend: str, asked_at: int | None) -> None:
    """``pauses`` and ``stop`` (what the trainer's Ctrl-C uses): asked during step 13's
    ``on_step``, the run ends at the next pause, 20, every step before it done by every
    worker; the next run goes on from there to the values and metrics of a run never
    stopped. Asked before the first step: it ends at the first pause. Never asked: no end
    before the last step."""
    kw = dict(nworkers_per_group=2, nservers_per_group=2)
    expected, _ = make("local", **kw)
    expected_metrics = expected.run(fill, 30)
    c, ps = make(backend, **kw)
    asked = threading.Event()
    if asked_at == 0:
        asked.set()
    reported: list[int] = []

    def on_step(step: int, metrics: Any) -> None:
        reported.append(step)
        if step == asked_at:
            asked.set()

    try:
        metrics = c.run(fill, 30, on_step=on_step, pauses={10, 20}, stop=asked.is_set)
        stopped = {13: 20, 0: 10, None: 30}[asked_at]
        assert c.step == stopped and reported == list(range(stopped))
        assert len(metrics) == stopped
        metrics += c.run(fill, 30 - stopped, on_step=on_step)
    finally:
        c.close()
    assert reported == list(range(30))
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.params.values)
    assert [p.version for p in ps.owners] == [30, 30]


# -- a worker dies -----------------------------------------------------------------------------

@GRAPH
def test_a_dead_worker_stops_the_run(backend: str) -> None:
    signal = Signal(backend)
    c, _ = make(backend, nworkers_per_group=2)
    try:
        with pytest.raises(ClusterError) as e:
            c.run(dying_at(1, 4, backend, signal), 10, on_step=at_step(3, signal.set))
        assert str(e.value).startswith("worker 1 of group 0 (rank 1) died at step 4: its ")
        assert c.step == 0
        with pytest.raises(ClusterError, match=r"died at step 4; with cluster.on_worker_failure"
                                               r" 'stop' this cluster does not run without it"):
            c.run(fill, 1)
    finally:
        c.close()


@ONE_NODE
def test_continue_goes_on_without_a_dead_worker(backend: str) -> None:
    signal = Signal(backend)
    c, ps = make(backend, nworkers_per_group=3, on_worker_failure="continue")
    try:
        with pytest.warns(RuntimeWarning, match=r"worker 1 of group 0 \(rank 1\) died at step "
                                                r"2: .*; the run goes on without it"):
            metrics = c.run(dying_at(1, 2, backend, signal), 6, on_step=at_step(1, signal.set))
        assert metrics[1] == [{"rank": r} for r in range(3)]
        assert metrics[2] == [{"rank": 0}, None, {"rank": 2}]
        assert np.array_equal(ps.values, reference(lambda s: [0, 1, 2] if s < 2 else [0, 2],
                                                   6))
        c.run(fill, 2)  # later runs go on without it too
        assert c.step == 8
    finally:
        c.close()


# -- a server is lost --------------------------------------------------------------------------

def test_earlier_server_checkpoints_are_removed_only_once_a_run_saves(
        backend: str, tmp_path: Path) -> None:
    """Making a cluster deletes nothing (a trainer takes its workspace's lock only to run:
    another run may still be using the folder); its first run removes what earlier runs
    left, before its own first checkpoint."""
    stale = tmp_path / "server-0-0" / checkpoint_name(900)
    stale.parent.mkdir()
    stale.write_bytes(b"an earlier run's")
    c, _ = make(backend, max_restarts=1, checkpoint_dir=tmp_path)
    try:
        assert stale.exists()
        c.run(fill, 2)
    finally:
        c.close()
    assert not stale.exists()
    assert [s for s, _ in list_checkpoints(stale.parent)] == [0, 2]


@GRAPH
def test_a_lost_server_is_brought_back_and_the_run_completes_exactly(backend: str) -> None:
    kw = dict(nworkers_per_group=2, nservers_per_group=2)
    expected, _ = make("local", **kw)
    expected_metrics = expected.run(fill, 12)
    c, ps = make(backend, max_restarts=2, checkpoint_freq=4, **kw)
    reported: list[int] = []

    def on_step(step: int, metrics: Any) -> None:
        reported.append(step)
        if step == 5:  # mid-part: steps 4.. run again from the servers' checkpoint of 4
            c.kill_server((0, 1))

    try:
        with pytest.warns(RuntimeWarning, match="a server was lost"):
            metrics = c.run(fill, 8, on_step=on_step)
        c.kill_server((0, 0))  # between runs: the next starts from the last one's checkpoint
        with pytest.warns(RuntimeWarning, match="a server was lost"):
            metrics += c.run(fill, 4, on_step=on_step)
    finally:
        c.close()
    assert reported == list(range(12))  # each step reported once, in order
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.params.values)
    assert [p.version for p in ps.owners] == [12, 12]


@pytest.mark.parametrize("during, warning", [
    (True, "a server was lost.* the servers go back to their checkpoint of step 4"),
    (False, r"a server was lost: server 1 \(after the run's last step\); the servers go back "
            "to their checkpoint of step 8"),
])
def test_a_server_lost_at_the_servers_last_save_goes_back_to_their_last_checkpoint(
        during: bool, warning: str) -> None:
    """A server lost while the servers write their checkpoint at the end of the run's last
    part (``during``: its steps all done before the loss was seen; the loss made as Ray
    reports it, the server's save failing with ServerLost after the other server saved), or
    just after they wrote it, before the run hands back their values: the servers go back
    to their last complete checkpoint (each keeps its newest two) — step 4, and the part
    runs again; or step 8 — and the run ends as one never interrupted."""
    kw = dict(nservers_per_group=2)
    expected, _ = make("local", **kw)
    expected.run(fill, 8)
    c, ps = make("local", max_restarts=2, checkpoint_freq=4, **kw)
    every = c._driver._every
    lost: list[int] = []

    def saving(make_request: Any, what: str) -> Any:
        if what != "a checkpoint" or make_request((0, 0)).step != 8 or lost:
            return every(make_request, what)
        lost.append(8)
        out = c._driver._ask({(0, 0): make_request((0, 0))} if during else
                             {a: make_request(a) for a in c._driver.addresses}, what)
        c.kill_server((0, 1))
        if during:
            raise ServerLost("server 1 was lost", (0, 1))
        return out

    c._driver._every = saving  # type: ignore[method-assign]
    try:
        with pytest.warns(RuntimeWarning, match=warning):
            c.run(fill, 8)
        c.run(fill, 0)  # and the cluster serves on
    finally:
        c.close()
    assert lost == [8]
    assert np.array_equal(ps.values, expected.params.values)
    assert [p.version for p in ps.owners] == [8, 8]


def test_a_server_lost_before_the_first_step_is_brought_back(backend: str) -> None:
    c, ps = make(backend, max_restarts=2, nservers_per_group=2)
    try:
        c.kill_server((0, 1))
        with pytest.warns(RuntimeWarning, match=r"a server was lost: server 1 \(its process"):
            c.run(fill, 3)
    finally:
        c.close()
    assert np.array_equal(ps.values, reference(lambda s: [0], 3))


@pytest.mark.filterwarnings("ignore:a server was lost")
def test_a_lost_server_without_restarts_is_an_error_naming_it(backend: str) -> None:
    c, _ = make(backend, max_restarts=0, nservers_per_group=2, timeout=TIMEOUT[backend])
    try:
        c.run(fill, 2)
        c.kill_server((0, 1))
        with pytest.raises(ClusterError, match="server 1"):
            c.run(fill, 2)
    finally:
        c.close()


# -- non-finite gradients ----------------------------------------------------------------------

def poisoned(rank: int, step: int, value: float, name: str = "b") -> Callable[[Any, int], Any]:
    def grads(worker: Any, s: int) -> dict[str, int]:
        fill(worker, s)
        if worker.rank == rank and s == step:
            worker.params[name].grad.reshape(-1)[[2, 4]] = value
        return {"rank": worker.rank}
    return grads


def refused(backend: str, rank: int, **kw: Any
            ) -> tuple[str, dict[str, np.ndarray], ParamSet]:
    """A run whose worker ``rank`` sends NaN at step 2: the error's message, the cluster's
    state after it, and the driver's values."""
    c, ps = make(backend, **kw)
    try:
        with pytest.raises(ClusterError) as e:
            c.run(poisoned(rank, 2, np.nan), 5)
        return str(e.value), c.state_dict(), ps
    finally:
        c.close()


def test_a_nonfinite_gradient_is_refused_and_leaves_the_values_as_they_were(
        backend: str) -> None:
    message, state, ps = refused(backend, 1, nworkers_per_group=2)
    assert message == (
        "server 0: non-finite gradient at step 2 from workers [1] of group 0: Params 'b' "
        "(2 NaN); this step's update is refused and the run stops (the values and the "
        "updater state are as they were before the step; cluster.nonfinite 'skip' drops "
        "such pushes instead)")
    before = reference(lambda s: [0, 1], 2)  # steps 0 and 1, not 2
    assert np.array_equal(ps.values, before)
    assert np.array_equal(state["server/0/0/values"], before)
    assert state["server/0/0/versions"].tolist() == [2, 2]
    assert state["server/0/0/state/w/count"].tolist() == [2]


@pytest.mark.parametrize("nworkers", [1, 2])
def test_a_nonfinite_gradient_in_one_servers_range_is_refused_by_every_server(
        backend: str, nworkers: int) -> None:
    """With two servers a group, a NaN in server 1's range refuses the step on server 0
    too: the worker finds it before pushing, so no server writes the step (a server's own
    check would have left server 0's range updated)."""
    message, state, ps = refused(backend, 0, nworkers_per_group=nworkers,
                                 nservers_per_group=2)
    assert message == (
        "non-finite gradient at step 2 from worker 0 of group 0 (rank 0): Params 'b' (2 NaN); "
        "this step's update is refused and the run stops (the values and the updater state "
        "are as they were before the step; cluster.nonfinite 'skip' drops such pushes "
        "instead)")
    before = reference(lambda s: list(range(nworkers)), 2)  # steps 0 and 1, not 2
    assert np.array_equal(ps.values, before)
    held = np.concatenate([state["server/0/0/values"], state["server/0/1/values"]])
    assert np.array_equal(held, before)
    assert all(set(state[f"server/0/{i}/versions"].tolist()) == {2} for i in (0, 1))
    counts = [v.tolist() for k, v in sorted(state.items()) if k.endswith("/count")]
    assert counts and all(set(c) == {2} for c in counts)


def test_skip_drops_the_push_and_warns(backend: str) -> None:
    c, ps = make(backend, nworkers_per_group=2, nonfinite="skip")
    try:
        with pytest.warns(RuntimeWarning, match=r"step 1 from worker 0 of group 0 \(rank 0\): "
                                                r"Params 'w' \(2 Inf\); the push is dropped"):
            c.run(poisoned(0, 1, np.inf, "w"), 4)
        assert c.skipped_pushes == 1
    finally:
        c.close()
    assert np.array_equal(ps.values, reference(lambda s: [1] if s == 1 else [0, 1], 4))


def test_finite_gradients_whose_sum_overflows_name_the_step_and_params(backend: str) -> None:
    ps = ParamSet([("w", (4,)), ("b", (2,))])
    c, _ = make(backend, ps, PLAIN, nworkers_per_group=2)

    def huge(worker: Any, step: int) -> None:
        worker.params.grads[:] = 1.0
        if step == 1:
            worker.params["b"].grad[...] = 3e38  # finite; twice that is not, in float32

    try:
        with pytest.raises(ClusterError) as e:
            c.run(huge, 3)
    finally:
        c.close()
    assert str(e.value).startswith(
        "server 0: the sum of the finite gradients of workers [0, 1] of group 0 at step 1 "
        "overflowed (float 32-bit): Params 'b' (2 Inf); this step's update is refused")
    assert np.array_equal(ps.values, np.full(6, -1, np.float32))  # step 0 only


# -- stuck and hung workers --------------------------------------------------------------------

def test_a_worker_stuck_in_its_gradient_function_does_not_hang_the_run(backend: str) -> None:
    release = Signal(backend)
    t = TIMEOUT[backend]
    c, _ = make(backend, timeout=t)

    def stuck(worker: Any, step: int) -> None:
        if step == 2:
            release.wait()
        fill(worker, step)

    try:
        with pytest.raises(ClusterError, match=rf"^the run waited {2 * t:g} s \(twice "
                                               r"cluster.timeout\) without a step finishing; "
                                               r"still running: worker 0 of group 0 \(rank 0\)"
                                               r" at step 2$"):
            c.run(stuck, 5)
        with pytest.raises(ClusterError, match="previous run is still busy"):
            c.run(fill, 1)
        release.set()
        c.backend.wait(60)  # the stuck step ends (the servers answer it with the stop)
        assert c.run(fill, 2) == [[{"rank": 0}], [{"rank": 0}]]
    finally:
        release.set()
        c.close()


@ONE_NODE
def test_a_hung_worker_times_out_with_a_message_naming_whom_it_waited_for(
        backend: str) -> None:
    release = Signal(backend)
    t = TIMEOUT[backend]
    c, _ = make(backend, nworkers_per_group=2, timeout=t)

    def hangs(worker: Any, step: int) -> None:
        if worker.index == 1 and step == 1:
            release.wait()
        fill(worker, step)

    try:
        with pytest.raises(ClusterError) as e:
            c.run(hangs, 5)
        assert str(e.value) == (
            f"worker 0 of group 0 at step 1 waited {t:g} s for server 0's reply to its "
            "update; server 0 waits for updates from workers [1] of group 0 for step 1")
    finally:
        release.set()
        c.backend.wait(60)
        c.close()


def test_a_staleness_wait_times_out_naming_the_slow_groups(backend: str) -> None:
    release = Signal(backend)
    t = TIMEOUT[backend]
    c, _ = make(backend, nworker_groups=2, staleness=1, timeout=t)

    def slow(worker: Any, step: int) -> None:
        if worker.group == 0 and step == 2:
            release.wait()
        fill(worker, step)

    try:
        with pytest.raises(ClusterError) as e:
            c.run(slow, 10)
        assert str(e.value) == (
            f"worker 0 of group 1 at step 4 waited {t:g} s for every worker group of server 0 "
            "to finish step 2 (staleness 1); server 0 is at version 6, its slowest worker "
            "groups [0] have finished 2 steps")
    finally:
        release.set()
        c.backend.wait(60)
        c.close()


# -- the messages' own failures (embedded) -----------------------------------------------------

def test_a_pending_reply_times_out_with_what_it_waited_for() -> None:
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(SGD), ClusterConf(nworkers_per_group=2))
    t = LocalTransport({(0, 0): server})
    get = t.send((0, 0), msg.Get(0, 0, 0), "the values")
    with pytest.raises(ClusterError, match=r"^worker 0 waited 0.01 s for the values; "
                                           r"server 0 has no values yet \(no put\)$"):
        get.wait(0.01, "worker 0")
    t.send((0, 0), msg.Put(ps.values, np.ones(2, np.int64), 0), "put").wait(1)
    assert get.done  # the put answered the waiting get
    with pytest.raises(ClusterError, match="worker 5 of group 0 is not a live worker"):
        t.send((0, 0), msg.Update(0, 5, 0, None), "update").wait(1)
    t.send((0, 0), msg.Update(0, 0, 0, None), "update")
    with pytest.raises(ClusterError, match="an update while step 0 is open of step 1 from "
                                           "worker 1 of group 0"):
        t.send((0, 0), msg.Update(0, 1, 1, None), "update").wait(1)


def test_abort_answers_every_waiting_request() -> None:
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(SGD), ClusterConf(nworkers_per_group=2))
    t = LocalTransport({(0, 0): server})
    t.send((0, 0), msg.Put(ps.values, np.ones(2, np.int64), 0), "put").wait(1)
    update = t.send((0, 0), msg.Update(0, 0, 0, np.zeros(30, np.float32)), "update")
    get = t.send((0, 0), msg.Get(0, 0, 0, version=5), "version 5")
    t.abort("stopped by the test")
    for pending in (update, get, t.send((0, 0), msg.Get(0, 1, 0), "values")):
        with pytest.raises(ClusterError, match=r"^stopped by the test$"):
            pending.wait(1)


def test_a_server_tells_the_step_each_worker_was_in() -> None:
    """What the driver asks the servers of a dead worker whose last outcomes it did not get
    (they come in batches): the step of its last update, or the next once that one was
    applied; nothing before its first update since the last put."""
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(SGD), ClusterConf(nworkers_per_group=2))
    t = LocalTransport({(0, 0): server})
    t.send((0, 0), msg.Put(ps.values, np.ones(2, np.int64), 3), "put").wait(1)
    assert server.reached(0, 0) is None and server.reached(0, 1) is None
    grads = np.zeros(30, np.float32)
    first = t.send((0, 0), msg.Update(0, 0, 3, grads), "update")
    assert (server.reached(0, 0), server.reached(0, 1)) == (3, None)  # 0 waits in step 3
    t.send((0, 0), msg.Update(0, 1, 3, grads), "update").wait(1)
    first.wait(1)
    assert (server.reached(0, 0), server.reached(0, 1)) == (4, 4)  # both went on to step 4
    t.send((0, 0), msg.Put(ps.values, np.ones(2, np.int64), 0), "put").wait(1)
    assert server.reached(0, 0) is None  # a put (a restart, a recovery) starts anew


@pytest.mark.parametrize("step", [-5, 2.7, np.array(2.7), np.array([3])])
def test_a_state_with_a_bad_step_is_refused_at_load(step: Any) -> None:
    c, _ = make("local")
    state = c.state_dict()
    state["step"] = step
    with pytest.raises(ParamError, match=r"'step' is .*: it must be an integer >= 0"):
        c.load_state_dict(state)
    assert c.step == 0


def test_a_state_with_negative_versions_or_counts_is_refused_at_load() -> None:
    c, ps = make("local")
    c.run(fill, 2)
    state = c.state_dict()
    state["server/0/0/versions"] = np.array([-1, 2])
    state["server/0/0/state/b/count"] = np.array([-3])
    before = ps.values.copy()
    state["server/0/0/values"] = np.zeros_like(before)
    with pytest.raises(ParamError) as e:
        c.load_state_dict(state)
    assert [p.message for p in e.value.problems] == [
        "'server/0/0/versions' holds -1: a version (updates applied) is >= 0",
        "'server/0/0/state/b/count' is -3: an update count is >= 0"]
    assert np.array_equal(ps.values, before)
    assert isinstance(e.value, Error)


# -- the passes over memory the checks use -----------------------------------------------------

def test_nonfinite_checks_are_exact_on_large_arrays() -> None:
    for dtype in (np.float32, np.float64):
        x = np.random.default_rng(0).standard_normal(300_000).astype(dtype)
        assert all_finite(x)
        x[-1] = np.finfo(dtype).max
        assert all_finite(x)
        x[123_456] = np.nan
        assert not all_finite(x) and nonfinite_counts(x) == (1, 0)
        x[123_456] = -np.inf
        assert not all_finite(x) and nonfinite_counts(x) == (0, 1)
        y = np.ones_like(x)
        out = np.empty_like(x)
        assert sum_into(out, y, y) == 0
        assert np.array_equal(out, y + y)
        big = np.full_like(x, np.finfo(dtype).max)
        big[:10] = 1.0
        assert sum_into(out, big, big) == x.size - 10  # overflow counted in the same pass
        assert sum_into(out, x, y) == 1  # the -inf
