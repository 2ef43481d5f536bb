"""The embedded cluster (SPEC §7): synchronous and asynchronous training, shares, versions,
server groups, checkpoints, and the transport boundary.

Failures (dead workers, timeouts, non-finite gradients) are in test_cluster_failures.py.
"""

import copy
import threading

import numpy as np
import pytest

import paramserver.cluster as cluster_pkg
from paramserver import ParamError
from paramserver.cluster import (
    Cluster,
    ClusterError,
    LocalTransport,
    Pending,
    Server,
    plan_servers,
)
from paramserver.cluster import messages as msg
from paramserver.config.job import ClusterConf, JobConf
from paramserver.params import ParamSet
from paramserver.updaters import create_updater

SHAPES = ((6, 5), (5,), (40,), (3, 3))
MOMENTUM = {"type": "kSGD", "momentum": 0.9, "weight_decay": 0.01,
            "learning_rate": {"base_lr": 0.1}}
ADAM = {"type": "kAdam", "learning_rate": {"base_lr": 0.01}}
PLAIN = {"type": "kSGD", "learning_rate": {"base_lr": 1.0}}  # w = w - g, exact on integers


def make_params(shapes=SHAPES, dtype=np.float32, seed=0, extra=()):
    ps = ParamSet([*((f"p{i}", s) for i, s in enumerate(shapes)), *extra], dtype)
    ps.values[:] = np.random.default_rng(seed).standard_normal(ps.values.size)
    return ps


def grad_of(rank, step, size, dtype=np.float32):
    return np.random.default_rng([rank, step]).standard_normal(size).astype(dtype)


def fill_random(worker, step):
    worker.params.grads[:] = grad_of(worker.rank, step, worker.params.grads.size,
                                     worker.params.dtype)
    return {"rank": worker.rank, "step": step}


def conf(**kw):
    # Long enough for a first-use numba compile on a loaded machine: these tests are not about
    # timeouts (test_cluster_failures.py is), so a short one could only make them flaky.
    kw.setdefault("timeout", 120.0)
    return ClusterConf(**kw)


# -- synchronous within a group ---------------------------------------------------------------

@pytest.mark.parametrize("updater", [MOMENTUM, ADAM], ids=["momentum", "adam"])
@pytest.mark.parametrize("nservers", [1, 3])
def test_sync_workers_equal_one_worker_with_the_mean_gradient(updater, nservers):
    n, steps = 4, 5
    many = make_params()
    Cluster(conf(nworkers_per_group=n, nservers_per_group=nservers), many,
            updater).run(fill_random, steps)

    one = make_params()

    def mean_of_all(worker, step):
        total = grad_of(0, step, one.values.size)
        for rank in range(1, n):
            total = total + grad_of(rank, step, one.values.size)  # worker order, float32
        worker.params.grads[:] = total / np.float32(n)

    Cluster(conf(), one, updater).run(mean_of_all, steps)
    assert np.array_equal(many.values, one.values)


def test_sync_equals_the_updater_applied_by_hand():
    n, steps = 3, 4
    ps = make_params()
    Cluster(conf(nworkers_per_group=n, nservers_per_group=2), ps, MOMENTUM).run(fill_random,
                                                                                 steps)
    ref = make_params()
    up = create_updater(MOMENTUM)
    state = up.init_state(ref.offsets, ref.dtype)
    for step in range(steps):
        total = grad_of(0, step, ref.values.size)
        for rank in range(1, n):
            total = total + grad_of(rank, step, ref.values.size)
        up.apply(step, ref.values, total, state, 1.0, 1.0, 1.0 / n)
    assert np.array_equal(ps.values, ref.values)


def test_repeated_sync_runs_are_bit_identical():
    def once():
        ps = make_params(dtype=np.float64)
        c = Cluster(conf(nworkers_per_group=3, nservers_per_group=2), ps, ADAM)
        metrics = c.run(fill_random, 6)
        return ps.values.copy(), c.state_dict(), metrics

    (v1, s1, m1), (v2, s2, m2) = once(), once()
    assert np.array_equal(v1, v2)
    assert s1.keys() == s2.keys() and all(np.array_equal(s1[k], s2[k]) for k in s1)
    assert m1 == m2
    assert m1[2] == [{"rank": r, "step": 2} for r in range(3)]


def test_shared_params_get_the_mean_of_their_shares_gradients():
    extra = [("w_t", (5, 6), {"share_from": "p0"}), ("w_2", (30,), {"share_from": "w_t"})]
    ps = make_params(extra=extra)
    assert ps.num_shares.tolist() == [3, 1, 1, 1]
    start = ps.values.copy()
    c = Cluster(conf(nworkers_per_group=2), ps, {"type": "kSGD",
                                                 "learning_rate": {"base_lr": 0.5}})

    def grads(worker, step):
        p = worker.params
        p["p0"].grad[...] = 1.0 + worker.index
        p["w_t"].grad[...] = np.arange(30, dtype=np.float32).reshape(5, 6)
        p["w_2"].grad[...] = -4.0
        for name in ("p1", "p2", "p3"):
            p[name].grad[...] = 2.0

    c.run(grads, 1)
    share_sum = [1.0 + i + np.arange(30) - 4.0 for i in range(2)]  # per worker, flat order
    mean = (share_sum[0] + share_sum[1]) / 6  # 2 workers x 3 shares
    np.testing.assert_allclose(ps["p0"].data.reshape(-1), start[:30] - 0.5 * mean, rtol=1e-6)
    np.testing.assert_allclose(ps.values[30:], start[30:] - 0.5 * 2.0, rtol=1e-6)
    assert np.shares_memory(ps["w_t"].data, ps["p0"].data)  # sharers see the new values


def test_versions_advance_by_one_per_update():
    ps = make_params()
    c = Cluster(conf(nworkers_per_group=2, nservers_per_group=2), ps, MOMENTUM)
    seen = []

    def record(worker, step):
        seen.append((worker.rank, step, worker.version,
                     [p.version for p in worker.params.owners]))
        return fill_random(worker, step)

    c.run(record, 5)
    for _rank, step, version, param_versions in seen:
        assert version == step and param_versions == [step] * len(SHAPES)
    assert [s.versions.tolist() for s in c.servers.values()] == [
        [5] * L.num_slices for L in c.layouts]
    assert [p.version for p in ps.owners] == [5] * len(SHAPES)
    assert [w.version for w in c.workers] == [5, 5]
    c.run(record, 2)  # a second run goes on from step 5
    assert seen[-1][1:3] == (6, 6) and c.step == 7


def test_a_get_for_a_version_waits_until_it_is_reached():
    ps = make_params()
    (layout,) = plan_servers(ps, 1)
    server = Server(layout, create_updater(PLAIN), conf())
    transport = LocalTransport({(0, 0): server})
    grads = np.ones(ps.values.size, np.float32)
    transport.send((0, 0), msg.Put(ps.values, np.ones(4, np.int64), 0), "put").wait(1)
    get = transport.send((0, 0), msg.Get(0, 0, 0, version=2), "version 2")
    for step in range(2):
        assert not get.done
        reply = transport.send((0, 0), msg.Update(0, 0, step, grads), "update").wait(1)
        assert reply.versions.tolist() == [step + 1] * layout.num_slices
    reply = get.wait(1)
    assert isinstance(reply, msg.Values) and reply.versions.tolist() == [2] * 4
    assert reply.values is ps.values  # inside one process: the server's own memory


# -- asynchronous between groups ---------------------------------------------------------------

def test_async_groups_apply_every_push_exactly_once():
    groups, steps = 8, 1000
    ps = ParamSet([("w", (16,)), ("b", (3,))])
    c = Cluster(conf(nworker_groups=groups), ps, PLAIN)
    versions: list[int] = []
    lock = threading.Lock()

    def ones(worker, step):
        if step > 0:
            with lock:
                versions.append(worker.version)  # the version its last push made
        worker.params.grads[:] = 1.0

    c.run(ones, steps)
    versions += [w.version for w in c.workers]
    assert np.array_equal(ps.values, np.full(19, -groups * steps, np.float32))
    assert c.servers[(0, 0)].versions.tolist() == [groups * steps] * 2
    assert sorted(versions) == list(range(1, groups * steps + 1))  # one each, none lost


def test_async_groups_with_several_servers():
    ps = ParamSet([("w", (100,)), ("b", (7,))])
    c = Cluster(conf(nworker_groups=3, nworkers_per_group=2, nservers_per_group=3), ps, PLAIN)
    c.run(lambda w, s: w.params.grads.fill(1.0), 50)
    assert np.array_equal(ps.values, np.full(107, -3 * 50, np.float32))


def staleness_run(staleness, groups=3, steps=12):
    """Group 0 is the slow one: before each step s it waits until every other group has
    started step s + staleness, as far ahead as the bound allows (a condition, not a clock).
    A wait that cannot be met means the bound held the others back too far."""
    ps = ParamSet([("w", (8,))])
    c = Cluster(conf(nworker_groups=groups, staleness=staleness), ps, PLAIN)
    started = [0] * groups  # steps each group has started
    violations, too_strict = [], []
    cond = threading.Condition()

    def grads(worker, step):
        with cond:
            started[worker.group] = step + 1
            cond.notify_all()
            lead = step - min(started[g] for g in range(groups) if g != worker.group)
            if lead > staleness:
                violations.append((worker.group, step, list(started)))
            if worker.group == 0:
                bound = min(step + staleness, steps - 1) + 1
                if not cond.wait_for(lambda: min(started[1:]) >= bound, timeout=10):
                    too_strict.append((step, list(started)))
        worker.params.grads[:] = 1.0

    c.run(grads, steps)
    return violations, too_strict, ps


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_bounded_staleness_never_lets_a_group_pass_the_bound(staleness):
    violations, too_strict, ps = staleness_run(staleness)
    assert violations == []
    assert too_strict == []  # the others could always run ahead by the whole bound
    assert np.array_equal(ps.values, np.full(8, -36, np.float32))


# -- server groups ----------------------------------------------------------------------------

@pytest.mark.parametrize("sync_freq", [1, 3])
def test_server_groups_sync_every_update_into_the_master(sync_freq):
    ps = ParamSet([("w", (12,)), ("b", (5,))])
    c = Cluster(conf(nworker_groups=4, nserver_groups=2, nservers_per_group=2,
                     sync_freq=sync_freq), ps, PLAIN)
    c.run(lambda w, s: w.params.grads.fill(1.0), 10)
    assert np.array_equal(ps.values, np.full(17, -40, np.float32))  # every update arrived
    assert not np.shares_memory(c.workers[1].params.values, ps.values)  # group 1: a copy
    assert np.shares_memory(c.workers[2].params.values, ps.values)  # group 2: server group 0


@pytest.mark.parametrize("sync_freq", [1, 3])
def test_async_server_groups_end_a_run_with_every_update_in_every_group(backend, sync_freq):
    """4 asynchronous worker groups on 2 server groups: at the end of a run every server
    group holds the sum of every applied delta, exactly (a final sync)."""
    if backend == "ray" and sync_freq == 1:
        pytest.skip("one sync_freq is enough on Ray (8 actors: slow to start)")
    ps = ParamSet([("w", (12,)), ("b", (5,))])  # zeros: the sums below are exact
    c = Cluster(ClusterConf(backend=backend, nworker_groups=4, nserver_groups=2,
                            nservers_per_group=2, sync_freq=sync_freq, timeout=20.0), ps, PLAIN)

    def grads(worker, step):
        worker.params.grads.fill(float(worker.group + 1))  # a delta of its own per group

    try:
        c.run(grads, 10)
        state = c.state_dict()
        c.run(grads, 1)
        after = c.state_dict()
    finally:
        c.close()
    for g in (0, 1):
        for i, L in enumerate(c.layouts):
            assert np.array_equal(state[f"server/{g}/{i}/values"],
                                  np.full(L.size, -10 * (1 + 2 + 3 + 4), np.float32))
            assert np.array_equal(after[f"server/{g}/{i}/values"],
                                  np.full(L.size, -11 * 10, np.float32))
    assert np.array_equal(ps.values, np.full(17, -110, np.float32))


def test_server_groups_start_from_the_values_the_first_run_finds():
    ps = ParamSet([("w", (6,))])
    c = Cluster(conf(nworker_groups=2, nserver_groups=2, sync_freq=4), ps, PLAIN)
    ps.values[:] = 5.0  # initialised after the cluster was made
    first = {}

    def grads(worker, step):
        first.setdefault(worker.group, worker.params.values.copy())
        worker.params.grads.fill(1.0)

    c.run(grads, 3)
    assert [first[g].tolist() for g in (0, 1)] == [[5.0] * 6] * 2
    assert np.array_equal(ps.values, np.full(6, 5 - 6, np.float32))


def test_one_worker_group_and_one_server_group_sync_nothing():
    ps = make_params()
    c = Cluster(conf(sync_freq=2), ps, MOMENTUM)
    c.run(fill_random, 3)
    assert all(s._last_sync is None for s in c.servers.values())


# -- memory and messages ----------------------------------------------------------------------

def test_nothing_is_copied_inside_one_process():
    ps = make_params()
    updater = create_updater(MOMENTUM)
    calls = []
    apply = updater.apply

    def spy(step, values, grads, *rest, **kw):
        calls.append((values, grads))
        return apply(step, values, grads, *rest, **kw)

    updater.apply = spy
    c = Cluster(conf(), ps, updater)
    c.run(fill_random, 2)
    worker = c.workers[0]
    for values, grads in calls:
        assert np.shares_memory(values, ps.values)
        assert np.shares_memory(grads, worker.params.grads)
    assert np.shares_memory(worker.params.values, ps.values)


def copied(message):
    """The message as it arrives in another process: every array a copy."""
    message = copy.copy(message)
    for name, value in vars(message).items():
        if isinstance(value, np.ndarray):
            object.__setattr__(message, name, value.copy())
    return message


class CopyingTransport(LocalTransport):
    """What a transport between processes does: requests and replies travel as copies."""

    def __init__(self, servers):
        super().__init__(servers)
        self.kinds = set()

    def send(self, to, request, what):
        self.kinds.add(type(request).__name__)
        server = self.servers[to]
        pending = Pending(what, server.waiting_for)
        server.handle(copied(request), lambda reply: pending.resolve(copied(reply)))
        return pending


@pytest.mark.parametrize("groups", [1, 2])
def test_messages_are_the_whole_interface(groups):
    """Across a transport that copies every array, training gives the same values."""
    kw = dict(nworker_groups=groups, nserver_groups=groups, nworkers_per_group=2,
              nservers_per_group=2)
    local = make_params()
    Cluster(conf(**kw), local, MOMENTUM).run(fill_random, 4)
    remote = make_params()
    made = []

    def factory(servers):
        made.append(CopyingTransport(servers))
        return made[0]

    c = Cluster(conf(**kw), remote, MOMENTUM, transport=factory)
    c.run(fill_random, 4)
    if groups == 1:  # asynchronous groups need not agree
        assert np.array_equal(local.values, remote.values)
    assert not np.shares_memory(c.servers[(0, 0)].values, remote.values)
    assert made[0].kinds == {"Put", "Get", "Update"} | ({"Sync", "Flush"} if groups > 1
                                                       else set())


# -- checkpoints ------------------------------------------------------------------------------

@pytest.mark.parametrize("updater", [MOMENTUM, ADAM], ids=["momentum", "adam"])
def test_resume_from_state_dict_continues_bit_for_bit(updater, tmp_path):
    kw = dict(nworkers_per_group=2, nservers_per_group=3)
    whole = make_params()
    Cluster(conf(**kw), whole, updater).run(fill_random, 6)

    first = make_params()
    c = Cluster(conf(**kw), first, updater)
    c.run(fill_random, 3)
    state = c.state_dict()
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in state.values())
    np.savez(tmp_path / "ckpt.npz", **state)
    with np.load(tmp_path / "ckpt.npz", allow_pickle=False) as f:
        loaded = dict(f)

    resumed = make_params(seed=99)  # other values: the state brings them back
    c2 = Cluster(conf(**kw), resumed, updater)
    c2.load_state_dict(loaded)
    assert c2.step == 3 and [p.version for p in resumed.owners] == [3] * len(SHAPES)
    c2.run(fill_random, 3)
    assert np.array_equal(resumed.values, whole.values)


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    ps = make_params()
    c = Cluster(conf(nservers_per_group=2), ps, MOMENTUM)
    state = c.state_dict()
    history = next(k for k in state if k.startswith("server/0/1/state/")
                   and k.endswith("/history"))
    state[history] = np.zeros(3, np.float32)
    state["server/0/7/values"] = np.zeros(3, np.float32)
    del state["server/0/0/versions"]
    before = ps.values.copy()
    state["server/0/0/values"] = np.zeros_like(before[:c.layouts[0].size])
    with pytest.raises(ParamError) as e:
        c.load_state_dict(state)
    text = str(e.value)
    assert f"'{history}' is float32 of 3 entries, expected float32 of " in text
    assert "'server/0/7/values' is not a key of this cluster's state" in text
    assert "'server/0/0/versions' is missing" in text
    assert np.array_equal(ps.values, before)
    other = Cluster(conf(nservers_per_group=3), make_params(), MOMENTUM).state_dict()
    with pytest.raises(ParamError, match="other server ranges"):
        c.load_state_dict(other)


# -- the API ----------------------------------------------------------------------------------

def test_cluster_from_a_job_uses_its_updater_and_cluster():
    job = JobConf.parse({"train_steps": 3, "neuralnet": {},
                         "updater": PLAIN, "cluster": {"nworkers_per_group": 2}})
    ps = ParamSet([("w", (4,))])
    c = Cluster(job, ps)
    metrics = c.run(lambda w, s: w.params.grads.fill(2.0) or {"loss": 1.0 * s},
                    job.train_steps)
    assert np.array_equal(ps.values, np.full(4, -6, np.float32))
    assert metrics == [[{"loss": 0.0}] * 2, [{"loss": 1.0}] * 2, [{"loss": 2.0}] * 2]
    assert cluster_pkg.Cluster is Cluster


def test_on_step_is_called_in_order_in_the_caller_thread():
    ps = make_params()
    c = Cluster(conf(nworker_groups=2, nworkers_per_group=2), ps, MOMENTUM)
    calls = []
    c.run(fill_random, 5, start_step=10,
          on_step=lambda step, m: calls.append((step, m, threading.current_thread())))
    assert [s for s, _, _ in calls] == list(range(10, 15))
    assert all(t is threading.main_thread() for _, _, t in calls)
    assert calls[0][1] == [{"rank": r, "step": 10} for r in range(4)]


def test_configuration_mistakes():
    ps = make_params()
    with pytest.raises(ParamError, match=r"nserver_groups \(2\) is more than nworker_groups"):
        Cluster(conf(nserver_groups=2), ps, MOMENTUM)
    with pytest.raises(ParamError, match="Cluster needs an updater"):
        Cluster(conf(), ps)
    with pytest.raises(ParamError, match="steps must be an integer >= 0"):
        Cluster(conf(), ps, MOMENTUM).run(fill_random, -1)


def test_zero_steps_and_empty_servers():
    ps = ParamSet([("w", (10,))])
    c = Cluster(conf(nservers_per_group=4, nworkers_per_group=2), ps, PLAIN)
    assert c.run(fill_random, 0) == []
    assert [L.size for L in c.layouts] == [4, 4, 2, 0]
    c.run(lambda w, s: w.params.grads.fill(1.0), 2)
    assert np.array_equal(ps.values, np.full(10, -2, np.float32))


def test_replica_shares_values_and_owns_gradients():
    ps = make_params(extra=[("t", (5, 6), {"share_from": "p0"})])
    ps["p1"].version = 4
    rep = ps.replica()
    assert np.shares_memory(rep.values, ps.values) and not np.shares_memory(rep.grads,
                                                                           ps.grads)
    assert rep["t"].owner is rep["p0"] and np.shares_memory(rep["t"].data, ps.values)
    assert rep["p1"].version == 4 and rep.names == ps.names
    other = ps.replica(np.zeros_like(ps.values))
    assert not np.shares_memory(other.values, ps.values) and other["t"].data.sum() == 0
    with pytest.raises(ParamError, match="replica values must be a C-contiguous float32"):
        ps.replica(np.zeros(3, np.float32))


def test_cluster_error_is_a_runtime_error():
    assert issubclass(ClusterError, RuntimeError)


# -- global-norm clipping across servers ---------------------------------------------------------

CLIP = {"type": "kSGD", "momentum": 0.9, "clip_norm": 0.5, "learning_rate": {"base_lr": 0.1}}
SHARED = (("t", (5,), {"share_from": "p1"}),)


def test_clip_norm_is_one_reduction_across_the_servers(backend):
    """clip_norm on the cluster: each server's part of the squared norm of the step's mean
    gradient, added by the workers, one factor for all; equal to a single-process update of
    the mean gradient, on 1 and 4 servers, with 1 and 2 workers per group."""
    def reference(nworkers, steps):
        ps = make_params(extra=SHARED)
        up = create_updater(CLIP)
        for step in range(steps):
            total = grad_of(0, step, ps.grads.size)
            for r in range(1, nworkers):
                total = total + grad_of(r, step, ps.grads.size)
            ps.grads[:] = total / np.float32(nworkers)
            ps.sum_shared_grads()
            up.update_params(step, ps)
        return ps.values

    runs = [(1, 1), (4, 1), (4, 2)] if backend == "local" else [(4, 2)]
    for nservers, nworkers in runs:
        ps = make_params(extra=SHARED)
        c = Cluster(conf(backend=backend, nservers_per_group=nservers,
                         nworkers_per_group=nworkers, timeout=20.0), ps, CLIP)
        try:
            c.run(fill_random, 4)
            state = c.state_dict()
        finally:
            c.close()
        expected = reference(nworkers, 4)
        np.testing.assert_allclose(ps.values, expected, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{nservers} servers, {nworkers} workers")
        assert int(state["step"]) == 4
    unclipped = make_params(extra=SHARED)
    Cluster(conf(nservers_per_group=4), unclipped, {**CLIP, "clip_norm": 0.0}).run(
        fill_random, 4)
    assert np.abs(unclipped.values - expected).max() > 0.1  # the norm (~8) was clipped to 0.5


def test_clip_norm_refuses_a_nan_step_with_values_unchanged():
    """Under nonfinite: error a NaN in one server's range refuses the step before anything
    is written on any server, and the run stops (with several servers a group, the worker's
    own check finds it before the push; the norm's exchange would too)."""
    ps = make_params()
    c = Cluster(conf(nservers_per_group=3), ps, CLIP)
    c.run(fill_random, 2)
    before = ps.values.copy()

    def nan_at_2(worker, step):
        fill_random(worker, step)
        worker.params.grads[-1] = np.nan

    with pytest.raises(ClusterError, match=r"non-finite gradient at step 2 from worker 0 of "
                                           r"group 0 \(rank 0\): .*the values and the "
                                           "updater state are as they were"):
        c.run(nan_at_2, 1)
    assert np.array_equal(ps.values, before)
