"""Failures on the cluster: dead workers, timeouts, non-finite gradients — a clear error or
the documented policy, never a hang. Every wait has a timeout whose message says what it
waited for; these tests use short timeouts, and check messages rather than clocks."""

import threading

import numpy as np
import pytest

from paramserver.cluster import Cluster, ClusterError, LocalTransport, Server, plan_servers
from paramserver.cluster import messages as msg
from paramserver.cluster.numerics import all_finite, nonfinite_counts, sum_into
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet
from paramserver.updaters import create_updater

SGD = {"type": "kSGD", "momentum": 0.5, "learning_rate": {"base_lr": 0.1}}


def make_params(seed=0):
    ps = ParamSet([("w", (4, 6)), ("b", (6,))])
    ps.values[:] = np.random.default_rng(seed).standard_normal(ps.values.size)
    return ps


def grad_of(rank, step, size=30):
    return np.random.default_rng([rank, step]).standard_normal(size).astype(np.float32)


def conf(**kw):
    kw.setdefault("timeout", 10.0)
    return ClusterConf(**kw)


def reference(contributions, steps, updater=SGD):
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


def failing_at(rank, step, exc=None):
    def grads(worker, s):
        if worker.rank == rank and s == step:
            raise exc or ValueError("boom")
        worker.params.grads[:] = grad_of(worker.rank, s)
        return {"rank": worker.rank}
    return grads


# -- dead workers -----------------------------------------------------------------------------

def test_a_failing_worker_stops_the_run_with_its_exception():
    c = Cluster(conf(nworkers_per_group=3, nservers_per_group=2), make_params(), SGD)
    with pytest.raises(ClusterError) as e:
        c.run(failing_at(1, 3), 10)
    assert str(e.value) == "worker 1 of group 0 (rank 1) failed at step 3: ValueError: boom"
    assert isinstance(e.value.__cause__, ValueError)
    assert c.step == 0  # the run did not complete
    # The cluster can run again: the next put restarts the servers.
    c.run(failing_at(-1, -1), 2)
    assert c.step == 2


def test_continue_goes_on_without_a_dead_worker():
    ps = make_params()
    c = Cluster(conf(nworkers_per_group=3, on_worker_failure="continue"), ps, SGD)
    with pytest.warns(RuntimeWarning, match=r"worker 1 of group 0 \(rank 1\) failed at step 2"
                                            r": ValueError: boom; the run goes on without it"):
        metrics = c.run(failing_at(1, 2), 5)
    assert metrics[1] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert metrics[2] == [{"rank": 0}, None, {"rank": 2}]
    expected = reference(lambda step: [0, 1, 2] if step < 2 else [0, 2], 5)
    assert np.array_equal(ps.values, expected)


def test_continue_with_a_whole_group_gone_does_not_block_bounded_staleness():
    ps = ParamSet([("w", (4, 6)), ("b", (6,))])  # zeros: the sums below are exact
    c = Cluster(conf(nworker_groups=2, staleness=0, on_worker_failure="continue"), ps,
                {"type": "kSGD", "learning_rate": {"base_lr": 1.0}})
    with pytest.warns(RuntimeWarning, match="group 1"):
        c.run(lambda w, s: failing_at(1, 3)(w, s) and w.params.grads.fill(1.0), 8)
    assert np.array_equal(ps.values, np.full(30, -(8 + 3), np.float32))


def test_every_worker_failing_is_an_error():
    c = Cluster(conf(nworkers_per_group=2, on_worker_failure="continue"), make_params(), SGD)

    def broken(worker, step):
        raise KeyError(f"no data for rank {worker.rank}")

    with pytest.warns(RuntimeWarning), pytest.raises(ClusterError) as e:
        c.run(broken, 3)
    assert str(e.value).startswith("every worker failed; the first: worker ")
    assert isinstance(e.value.__cause__, KeyError)


def test_an_exception_in_on_step_stops_the_workers_and_is_raised():
    c = Cluster(conf(nworkers_per_group=2), make_params(), SGD)

    def on_step(step, metrics):
        if step == 1:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        c.run(failing_at(-1, -1), 1000, on_step=on_step)
    assert not any(t.is_alive() for t in c._threads)


# -- timeouts ---------------------------------------------------------------------------------

def test_a_hung_worker_times_out_with_a_message_naming_whom_it_waited_for():
    release = threading.Event()
    c = Cluster(conf(nworkers_per_group=2, timeout=0.3), make_params(), SGD)

    def hangs(worker, step):
        if worker.index == 1 and step == 1:
            release.wait(30)
        worker.params.grads[:] = grad_of(worker.rank, step)

    try:
        with pytest.raises(ClusterError) as e:
            c.run(hangs, 5)
        assert str(e.value) == (
            "worker 0 of group 0 at step 1 waited 0.3 s for server 0's reply to its update; "
            "server 0 waits for updates from workers [1] of group 0 for step 1")
        with pytest.raises(ClusterError, match="previous run is still busy"):
            c.run(hangs, 1)
    finally:
        release.set()
    for t in c._threads:
        t.join(5)


def test_a_worker_stuck_in_its_gradient_function_does_not_hang_the_run():
    release = threading.Event()
    c = Cluster(conf(timeout=0.2), make_params(), SGD)

    def stuck(worker, step):
        if step == 2:
            release.wait(30)
        worker.params.grads[:] = grad_of(worker.rank, step)

    try:
        with pytest.raises(ClusterError, match=r"^the run waited 0.4 s \(twice cluster.timeout\) "
                                               r"without a step finishing; still running: "
                                               r"worker 0 of group 0 \(rank 0\) at step 2$"):
            c.run(stuck, 5)
    finally:
        release.set()
    for t in c._threads:
        t.join(5)


def test_a_staleness_wait_times_out_naming_the_slow_groups():
    release = threading.Event()
    c = Cluster(conf(nworker_groups=2, staleness=1, timeout=0.3), make_params(), SGD)

    def slow(worker, step):
        if worker.group == 0 and step == 2:
            release.wait(30)
        worker.params.grads[:] = grad_of(worker.rank, step)

    try:
        with pytest.raises(ClusterError) as e:
            c.run(slow, 10)
        assert str(e.value) == (
            "worker 0 of group 1 at step 4 waited 0.3 s for every worker group of server 0 "
            "to finish step 2 (staleness 1); server 0 is at version 6, its slowest worker "
            "groups [0] have finished 2 steps")
    finally:
        release.set()
    for t in c._threads:
        t.join(5)


def test_a_pending_reply_times_out_with_what_it_waited_for():
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(SGD), conf(nworkers_per_group=2))
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


def test_abort_answers_every_waiting_request():
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(SGD), conf(nworkers_per_group=2))
    t = LocalTransport({(0, 0): server})
    t.send((0, 0), msg.Put(ps.values, np.ones(2, np.int64), 0), "put").wait(1)
    update = t.send((0, 0), msg.Update(0, 0, 0, np.zeros(30, np.float32)), "update")
    get = t.send((0, 0), msg.Get(0, 0, 0, version=5), "version 5")
    t.abort("stopped by the test")
    for pending in (update, get, t.send((0, 0), msg.Get(0, 1, 0), "values")):
        with pytest.raises(ClusterError, match=r"^stopped by the test$"):
            pending.wait(1)


# -- non-finite gradients ---------------------------------------------------------------------

def poisoned(rank, step, value, name="b"):
    def grads(worker, s):
        worker.params.grads[:] = grad_of(worker.rank, s)
        if worker.rank == rank and s == step:
            worker.params[name].grad.reshape(-1)[[2, 4]] = value
    return grads


def test_a_nonfinite_gradient_is_an_error_naming_the_params_and_step():
    ps = make_params()
    c = Cluster(conf(nworkers_per_group=2), ps, SGD)
    with pytest.raises(ClusterError) as e:
        c.run(poisoned(1, 2, np.nan), 5)
    assert str(e.value) == (
        "server 0: non-finite gradient at step 2 from workers [1] of group 0: Params 'b' "
        "(2 NaN); this step's update is not usable and the run stops (checkpoints written "
        "before it are intact; cluster.nonfinite 'skip' drops such pushes instead)")
    # The kernels count NaN and Inf in the update's own pass, so the step was applied: its
    # values are not usable (the error says so), and the version did not advance for it.
    assert np.isnan(ps["b"].data).any()
    assert c.servers[(0, 0)].versions.tolist() == [2] * len(c.servers[(0, 0)].versions)


def test_skip_drops_the_push_and_warns():
    ps = make_params()
    c = Cluster(conf(nworkers_per_group=2, nonfinite="skip"), ps, SGD)
    with pytest.warns(RuntimeWarning, match=r"step 1 from worker 0 of group 0 \(rank 0\): "
                                            r"Params 'w' \(2 Inf\); the push is dropped"):
        c.run(poisoned(0, 1, np.inf, "w"), 4)
    assert c.skipped_pushes == 1
    assert np.array_equal(ps.values, reference(lambda s: [1] if s == 1 else [0, 1], 4))


def test_skip_of_every_push_of_a_step_leaves_values_and_version():
    ps = make_params()
    c = Cluster(conf(nonfinite="skip"), ps, SGD)
    seen = []

    def grads(worker, step):
        seen.append(worker.version)
        poisoned(0, 0, -np.inf)(worker, step)

    with pytest.warns(RuntimeWarning, match="the push is dropped"):
        c.run(grads, 3)
    assert seen == [0, 0, 1]
    assert [p.version for p in ps.owners] == [2, 2]


def test_nonfinite_checks_are_exact_on_large_arrays():
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
        sum_into(out, y, y)
        assert np.array_equal(out, y + y)
