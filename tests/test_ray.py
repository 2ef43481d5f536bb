"""The Ray backend (SPEC §7): the same job on Ray gives the embedded run's values bit for
bit, a killed server actor is restarted and the run completes exactly, a killed worker is a
clear error (or, if configured, the run goes on without it), and actors get their
configuration as data.

The tests that need Ray share one local Ray instance (started once, ~5 s) and are skipped
where Ray is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.checkpoint import load_checkpoint
from paramserver.cluster import Cluster, ClusterError, plan_servers
from paramserver.cluster.gradfn import RemoteGradFn, build_grad_fn
from paramserver.cluster.ray_wire import (
    layout_from_data,
    layout_to_data,
    params_from_data,
    params_to_data,
)
from paramserver.config.job import ClusterConf, parse_job
from paramserver.params import ParamSet
from paramserver.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import JOB  # noqa: E402

SGD = {"type": "kSGD", "momentum": 0.5, "learning_rate": {"base_lr": 0.1}}


def make_params(seed: int = 0) -> ParamSet:
    ps = ParamSet([("w", (40, 60)), ("b", (60,)), ("t", (60,), {"share_from": "b"}),
                   ("v", (300,))])
    ps.values[:] = np.random.default_rng(seed).standard_normal(ps.values.size)
    return ps


def conf(**kw: Any) -> ClusterConf:
    kw.setdefault("timeout", 20.0)
    return ClusterConf(**kw)


def on_ray(c: ClusterConf) -> ClusterConf:
    return ClusterConf(**{**c.to_dict(), "backend": "ray"})


def fill(worker: Any, step: int) -> dict[str, int]:
    g = np.random.default_rng([worker.rank, step]).standard_normal(worker.params.grads.size)
    worker.params.grads[:] = g.astype(worker.params.dtype)
    return {"rank": worker.rank, "step": step}


def dies_at(rank: int, step: int) -> Any:
    def grads(worker: Any, s: int) -> dict[str, int]:
        if worker.rank == rank and s == step:
            time.sleep(0.3)  # the reply to the step before leaves the process first
            os._exit(3)  # the worker's process dies: its actor is gone
        return fill(worker, s)
    return grads


def fails_at(rank: int, step: int) -> Any:
    def grads(worker: Any, s: int) -> dict[str, int]:
        if worker.rank == rank and s == step:
            raise ValueError("boom")
        return fill(worker, s)
    return grads


def embedded(c: ClusterConf, grad_fn: Any, steps: int, **kw: Any) -> tuple[ParamSet, Any]:
    ps = make_params()
    cluster = Cluster(c.copy(), ps, SGD)
    return ps, cluster.run(grad_fn, steps, **kw)


# -- what travels as data (no Ray needed) ------------------------------------------------------

def test_layouts_and_params_travel_as_plain_data() -> None:
    ps = make_params()
    for layout in plan_servers(ps, 3):
        data = layout_to_data(layout)
        assert all(isinstance(v, (int, str, list, np.ndarray)) for v in data.values())
        back = layout_from_data(json.loads(json.dumps(
            {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in data.items()})))
        assert (back.index, back.start, back.stop, back.names, back.dtype) == (
            layout.index, layout.start, layout.stop, layout.names, layout.dtype)
        for k in ("slice_ids", "slice_offsets", "slice_owners", "offsets", "owners",
                  "lr_scale", "wd_scale"):
            assert np.array_equal(getattr(back, k), getattr(layout, k)), k
    data = params_to_data(ps)
    rebuilt = params_from_data(json.loads(json.dumps(data)))
    assert rebuilt.names == ps.names and rebuilt["t"].owner is rebuilt["b"]
    assert np.array_equal(rebuilt.offsets, ps.offsets)
    assert np.array_equal(rebuilt.num_shares, ps.num_shares)
    data["num_shares"] = [1, 1, 1]
    with pytest.raises(ParamError, match="do not have the layout of the driver's"):
        params_from_data(data)


def test_a_remote_grad_fn_is_an_import_path_and_json() -> None:
    spec = RemoteGradFn("paramserver.train.trainer:net_grad_fn", {"job": "{}", "x": [1]})
    assert spec.to_data() == ("paramserver.train.trainer:net_grad_fn",
                              '{"job": "{}", "x": [1]}')
    with pytest.raises(ParamError, match="must be JSON data"):
        RemoteGradFn("m:f", {"x": object()}).to_data()
    job = parse_job(JOB.format(steps=3, ckpt=0, ws="unused"))
    fn = build_grad_fn(RemoteGradFn("paramserver.train.trainer:net_grad_fn",
                                    {"job": job.to_json()}).to_data())
    assert callable(fn)


def test_the_ray_backend_is_chosen_by_the_job_and_needs_ray(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ParamError, match=r"needs Ray: pip install 'paramserver\[ray\]'"):
        Cluster(conf(backend="ray"), make_params(), SGD)


# -- on Ray ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_session() -> Any:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_job(ws: Path, steps: int, backend: str) -> Any:
    job = parse_job(JOB.format(steps=steps, ckpt=10, ws=ws))
    job.cluster.update({"backend": backend})
    return job


def test_a_synchronous_job_on_ray_equals_the_embedded_run_bit_for_bit(
        ray_session: Any, tmp_path: Path) -> None:
    """2 servers, 2 workers (the trainer test's job, with tests and checkpoints)."""
    local = Trainer(ray_job(tmp_path / "local", 30, "local"), progress=False)
    local.train()
    remote = Trainer(ray_job(tmp_path / "ray", 30, "ray"), progress=False)
    try:
        assert type(remote.cluster.backend).__name__ == "RayBackend" and remote.nets == []
        remote.train()
    finally:
        remote.close()
    assert np.array_equal(local.params.values, remote.params.values)
    assert [p.version for p in remote.params.owners] == [30] * 4
    assert ((tmp_path / "local" / "metrics.csv").read_bytes()
            == (tmp_path / "ray" / "metrics.csv").read_bytes())
    for step in (10, 20, 30):
        name = f"step-{step:08d}.ckpt.npz"
        a, _ = load_checkpoint(tmp_path / "local" / "checkpoints" / name)
        b, _ = load_checkpoint(tmp_path / "ray" / "checkpoints" / name)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # The servers wrote their own checkpoints (values, updater state, versions).
    servers = tmp_path / "ray" / "checkpoints" / "servers"
    assert sorted(p.name for p in servers.iterdir()) == ["server-0-0", "server-0-1"]


def test_a_killed_server_actor_is_restarted_and_the_run_completes_exactly(
        ray_session: Any) -> None:
    c = conf(nworkers_per_group=2, nservers_per_group=2)
    expected, expected_metrics = embedded(c, fill, 12)
    ps = make_params()
    cluster = Cluster(on_ray(c), ps, SGD, checkpoint_freq=4)
    reported: list[int] = []

    def on_step(step: int, metrics: Any) -> None:
        reported.append(step)
        if step == 5:  # mid-part: steps 4.. run again from the servers' checkpoint of 4
            ray_session.kill(cluster.servers[(0, 1)], no_restart=False)

    try:
        with pytest.warns(RuntimeWarning, match="a server was lost"):
            metrics = cluster.run(fill, 8, on_step=on_step)
        # Between runs too: the next run starts from the checkpoint the last one ended with.
        ray_session.kill(cluster.servers[(0, 0)], no_restart=False)
        with pytest.warns(RuntimeWarning, match="a server was lost"):
            metrics += cluster.run(fill, 4, on_step=on_step)
    finally:
        cluster.close()
    assert reported == list(range(12))  # each step reported once, in order
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.values)
    assert [p.version for p in ps.owners] == [12, 12, 12]


def test_continue_goes_on_without_a_dead_worker(ray_session: Any) -> None:
    c = conf(nworkers_per_group=3, on_worker_failure="continue")
    with pytest.warns(RuntimeWarning):
        expected, _ = embedded(c, fails_at(1, 2), 6)
    ps = make_params()
    cluster = Cluster(on_ray(c), ps, SGD)
    try:
        with pytest.warns(RuntimeWarning, match=r"worker 1 of group 0 \(rank 1\) died at step "
                                                r"2: .*; the run goes on without it"):
            metrics = cluster.run(dies_at(1, 2), 6)
        assert metrics[1] == [{"rank": r, "step": 1} for r in range(3)]
        assert metrics[2] == [{"rank": 0, "step": 2}, None, {"rank": 2, "step": 2}]
        assert np.array_equal(ps.values, expected.values)
        cluster.run(fill, 2)  # later runs go on without it too
        assert cluster.step == 8
    finally:
        cluster.close()


def test_failures_are_clear_errors_within_the_timeout(ray_session: Any) -> None:
    """A gradient function that raises, a worker that hangs, a worker that dies: each stops
    the run with the message the embedded cluster gives (or says that the actor died)."""
    cluster = Cluster(conf(nworkers_per_group=2, timeout=0.5, backend="ray"), make_params(),
                      SGD)
    try:
        with pytest.raises(ClusterError) as e:
            cluster.run(fails_at(1, 3), 10)
        assert str(e.value) == "worker 1 of group 0 (rank 1) failed at step 3: ValueError: boom"
        assert isinstance(e.value.__cause__, ValueError)

        def hangs(worker: Any, step: int) -> None:
            if worker.rank == 1 and step == 1:
                time.sleep(1.5)
            fill(worker, step)

        with pytest.raises(ClusterError) as e:
            cluster.run(hangs, 3)
        assert str(e.value) == (
            "worker 0 of group 0 at step 1 waited 0.5 s for server 0's reply to its update; "
            "server 0 waits for updates from workers [1] of group 0 for step 1")
        with pytest.raises(ClusterError, match="previous run is still busy"):
            cluster.run(fill, 2)
        time.sleep(1.5)  # the hung step ends (the servers answer it with the stop)
        assert cluster.run(fill, 2)[1] == [{"rank": 0, "step": 1}, {"rank": 1, "step": 1}]

        t0 = time.monotonic()
        with pytest.raises(ClusterError) as e:
            cluster.run(dies_at(1, 4), 10)
        assert time.monotonic() - t0 < 0.5 + 0.3
        assert str(e.value).startswith("worker 1 of group 0 (rank 1) died at step 4: its Ray "
                                       "actor is gone")
        assert cluster.step == 2
        with pytest.raises(ClusterError, match=r"died at step 4; with cluster.on_worker_failure"
                                               r" 'stop' this cluster does not run without it"):
            cluster.run(fill, 1)
    finally:
        cluster.close()


def test_asynchronous_groups_and_server_groups_on_ray(ray_session: Any) -> None:
    ps = ParamSet([("w", (4, 6)), ("b", (6,))])  # zeros: the sums below are exact
    cluster = Cluster(conf(nworker_groups=2, nserver_groups=2, staleness=0, backend="ray"), ps,
                      {"type": "kSGD", "learning_rate": {"base_lr": 1.0}})
    try:
        ones = lambda w, s: w.params.grads.fill(1.0)  # noqa: E731
        cluster.run(ones, 5)
        assert np.array_equal(ps.values, np.full(30, -10, np.float32))
        state = cluster.state_dict()
        # Server group 0 holds all the work; group 1 holds its values as of its last sync
        # (its final sync can come before group 0's last update lands).
        assert np.array_equal(state["server/0/0/values"], ps.values[:len(
            state["server/0/0/values"])])
        assert int(state["step"]) == 5 and state["server/0/0/versions"].tolist() == [5, 5]
        cluster.run(ones, 2)
        assert np.array_equal(ps.values, np.full(30, -14, np.float32))
        cluster.load_state_dict(state)  # back to step 5, into the actors
        assert np.array_equal(ps.values, np.full(30, -10, np.float32)) and cluster.step == 5
        cluster.run(ones, 1)
        assert np.array_equal(ps.values, np.full(30, -12, np.float32))
        assert [p.version for p in ps.owners] == [6, 6]
    finally:
        cluster.close()
