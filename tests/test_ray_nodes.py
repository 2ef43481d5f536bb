"""Several Ray nodes on one machine (Ray's own harness, the session's cluster of
conftest.py: a head, a node with the resource ``server``, one with ``worker``): actors are
placed by resources or spread, each says its node from inside itself, and a node lost in
the middle of a run — with a server on it, or with workers — is recovered as docs/ray.md
says, bit for bit as the embedded run; a node that never comes back is named with what it
held. The failure suite (test_cluster_failures.py) runs its Ray cases on the same cluster,
its actors spread over the nodes.

Nodes are removed as a crash would remove them (every process killed at once); Ray's
health checks see the node gone within about 4 s. Events order everything: a worker that
is to be lost waits in its step until the node is gone.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver.cluster import Cluster, ClusterError
from paramserver.config.job import ClusterConf
from paramserver.params import ParamSet

sys.path.insert(0, str(Path(__file__).parent))
from conftest import pinned

SGD = {"type": "kSGD", "momentum": 0.5, "learning_rate": {"base_lr": 0.1}}


def make_params() -> ParamSet:
    ps = ParamSet([("w", (4, 6)), ("b", (6,))])
    ps.values[:] = np.random.default_rng(0).standard_normal(ps.values.size)
    return ps


def fill(worker: Any, step: int) -> dict[str, int]:
    g = np.random.default_rng([worker.rank, step]).standard_normal(worker.params.grads.size)
    worker.params.grads[:] = g.astype(np.float32)
    return {"rank": worker.rank}


def conf(backend: str, **kw: Any) -> ClusterConf:
    return ClusterConf(backend=backend, timeout=20.0, **kw)


def on(resource: str) -> dict[str, Any]:
    """On a node with ``resource`` (with ``num_cpus`` 0: an actor given resources otherwise
    holds a CPU for its life, and a node of these has one)."""
    return {"num_cpus": 0, "resources": {resource: 1}}


def node_ids() -> dict[str, str]:
    import ray

    return {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


class _Gate:
    async def open(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()

    def __init__(self) -> None:
        self.event = asyncio.Event()


def gate() -> Any:
    """An event on the head node (never lost), that a worker on another node can wait on."""
    import ray

    return ray.remote(_Gate).options(**pinned(node_ids()["head"], soft=False)).remote()


def test_actors_go_where_their_resources_are_or_spread_over_the_nodes(
        ray_nodes: Any) -> None:
    import ray

    ids = node_ids()
    expected = Cluster(conf("local", nworkers_per_group=2, nservers_per_group=2),
                       make_params(), SGD)
    expected.run(fill, 3)
    ps = make_params()
    c = Cluster(conf("ray", nworkers_per_group=2, nservers_per_group=2), ps, SGD,
                placement=None, server_options=on("server"), worker_options=on("worker"))
    try:
        # Each actor said its node from inside itself (ray.get_runtime_context()).
        assert c.backend.nodes == {"server 0": ids["server-node"],
                                   "server 1": ids["server-node"],
                                   "worker 0 of group 0": ids["worker-node"],
                                   "worker 1 of group 0": ids["worker-node"]}
        here = ray.get(c.workers[1].actor.where.remote())
        assert here == ids["worker-node"]
        c.run(fill, 3)
    finally:
        c.close()
    assert np.array_equal(ps.values, expected.params.values)
    # By default the actors are spread (Ray's SPREAD, best effort: not all on one node, as
    # Ray's own default would pack them on this process's node).
    c = Cluster(conf("ray", nworkers_per_group=2, nservers_per_group=2), make_params(), SGD)
    try:
        assert len(set(c.backend.nodes.values())) >= 2, c.backend.nodes
    finally:
        c.close()


def test_a_node_lost_with_a_server_on_it_is_recovered_exactly(ray_nodes: Any,
                                                              tmp_path: Path) -> None:
    """Server 1 lives on a node of its own, which is lost while the worker is in its step
    5: Ray starts the server again on another node, which reads its checkpoint of step 4
    from the shared folder; steps 4 to 7 run again and the run ends as the embedded one,
    bit for bit."""
    import ray

    kw = dict(nworkers_per_group=1, nservers_per_group=2)
    expected = Cluster(conf("local", **kw), make_params(), SGD)
    expected_metrics = expected.run(fill, 12)
    doomed = ray_nodes.add("doomed-server")
    doomed_id = ray_nodes.id_of(doomed)
    ps = make_params()
    c = Cluster(conf("ray", **kw), ps, SGD, max_restarts=2, checkpoint_freq=4,
                checkpoint_dir=tmp_path, placement=None, worker_options=on("worker"),
                server_options=lambda a: pinned(doomed_id, soft=True) if a == (0, 1)
                else on("server"))
    reported: list[int] = []
    lost = gate()  # opened once Ray has the node dead: the worker's step 5 waits for it
    # (a part's steps run ahead of the driver, and the server's process may answer a
    # moment after its node's raylet is gone)

    def after_the_loss(worker: Any, step: int) -> dict[str, int]:
        if step == 5:
            ray.get(lost.wait.remote(), timeout=120)
        return fill(worker, step)

    def on_step(step: int, metrics: Any) -> None:
        reported.append(step)
        if step == 4:
            ray_nodes.remove(doomed)
            ray_nodes.wait_gone(doomed)
            ray.get(lost.open.remote())

    try:
        assert c.backend.nodes["server 1"] == doomed_id
        with pytest.warns(RuntimeWarning, match="a server was lost"):
            metrics = c.run(after_the_loss, 12, on_step=on_step)
        assert c.backend.nodes["server 1"] not in (doomed_id, None)  # elsewhere now
    finally:
        c.close()
        if doomed in ray_nodes.cluster.worker_nodes:
            ray_nodes.remove(doomed)
    assert reported == list(range(12))
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.params.values)
    assert [p.version for p in ps.owners] == [12, 12]


def test_a_node_lost_with_a_server_and_a_worker_on_it_is_survived_exactly(
        ray_nodes: Any, tmp_path: Path) -> None:
    """Server 1 and worker 1 live on a node that is lost while the worker is in its step 5
    (under the default ``on_worker_failure: stop``): Ray starts the server again
    elsewhere, from its checkpoint of step 4, a new actor takes the worker's place, steps 4
    to 7 run again, and the run ends as the embedded one, bit for bit."""
    import ray

    kw = dict(nworkers_per_group=2, nservers_per_group=2)
    expected = Cluster(conf("local", **kw), make_params(), SGD)
    expected_metrics = expected.run(fill, 12)
    doomed = ray_nodes.add("doomed-both")
    doomed_id = ray_nodes.id_of(doomed)
    ps = make_params()
    c = Cluster(conf("ray", **kw), ps, SGD, max_restarts=2, checkpoint_freq=4,
                checkpoint_dir=tmp_path, placement=None,
                worker_options=lambda rank: pinned(doomed_id, soft=True) if rank == 1
                else on("worker"),
                server_options=lambda a: pinned(doomed_id, soft=True) if a == (0, 1)
                else on("server"))

    never = gate()  # never opened: the worker on the doomed node dies waiting in step 5
    # (the steps before it may all be done before the driver hears of them: a part's steps
    # run ahead of the driver)

    def lost_in_5(worker: Any, step: int) -> dict[str, int]:
        if step == 5 and ray.get_runtime_context().get_node_id() == doomed_id:
            ray.get(never.wait.remote(), timeout=120)
        return fill(worker, step)

    def on_step(step: int, metrics: Any) -> None:
        if step == 4:
            ray_nodes.remove(doomed)

    try:
        assert c.backend.nodes["server 1"] == c.backend.nodes["worker 1 of group 0"] == (
            doomed_id)
        with pytest.warns(RuntimeWarning, match="were lost|was lost") as caught:
            metrics = c.run(lost_in_5, 12, on_step=on_step)
        assert c.backend.nodes["server 1"] != doomed_id
        assert c.backend.nodes["worker 1 of group 0"] != doomed_id
    finally:
        c.close()
        if doomed in ray_nodes.cluster.worker_nodes:
            ray_nodes.remove(doomed)
    texts = [str(w.message) for w in caught]
    assert any("new actors took the dead workers' places; the servers go back to their "
               "checkpoint of step 4" in t for t in texts), texts
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.params.values)
    assert [p.version for p in ps.owners] == [12, 12]


def test_a_node_lost_with_a_worker_on_it_goes_on_without_it(ray_nodes: Any) -> None:
    """Worker 1 lives on a node that is lost while the worker is in its step 3: with
    ``on_worker_failure: continue`` the run goes on without it, named with its node, and
    ends as the embedded run in which worker 1 leaves at step 3, bit for bit."""
    import ray

    kw = dict(nworkers_per_group=2, on_worker_failure="continue")

    def leaves_at_3(worker: Any, step: int) -> dict[str, int]:
        if worker.rank == 1 and step == 3:
            raise RuntimeError("gone")
        return fill(worker, step)

    expected = Cluster(conf("local", **kw), make_params(), SGD)
    with pytest.warns(RuntimeWarning):
        expected_metrics = expected.run(leaves_at_3, 8)
    doomed = ray_nodes.add("doomed-worker", doomed=1)
    never = gate()  # never opened: the worker dies waiting (its process a moment after
    # its node's raylet: were it let go, it could still push its step 3)

    def lost_at_3(worker: Any, step: int) -> dict[str, int]:
        if worker.rank == 1 and step == 3:
            ray.get(never.wait.remote(), timeout=120)
        return fill(worker, step)

    def on_step(step: int, metrics: Any) -> None:
        if step == 2:
            ray_nodes.remove(doomed)

    ps = make_params()
    c = Cluster(conf("ray", **kw), ps, SGD, placement=None, server_options=on("server"),
                worker_options=lambda rank: on("doomed") if rank == 1 else on("worker"))
    try:
        with pytest.warns(RuntimeWarning) as caught:
            metrics = c.run(lost_at_3, 8, on_step=on_step)
    finally:
        c.close()
        if doomed in ray_nodes.cluster.worker_nodes:
            ray_nodes.remove(doomed)
    texts = [str(w.message) for w in caught]
    assert any(t.startswith("worker 1 of group 0 (rank 1) died at step 3: its Ray actor is "
                            "gone") and "its node 'doomed-worker' (" in t
               and "left the Ray cluster (it held worker 1 of group 0)" in t
               for t in texts), texts
    assert metrics == expected_metrics
    assert np.array_equal(ps.values, expected.params.values)


@pytest.mark.filterwarnings("ignore:a server was lost")  # when Ray saw it mid-run
def test_a_node_that_never_comes_back_is_named_with_what_it_held(ray_nodes: Any) -> None:
    doomed = ray_nodes.add("doomed-forever")
    doomed_id = ray_nodes.id_of(doomed)
    c = Cluster(conf("ray"), make_params(), SGD, max_restarts=1, placement=None,
                server_options=pinned(doomed_id, soft=False), worker_options=on("worker"))
    try:
        c.run(fill, 2)
        ray_nodes.remove(doomed)
        ray_nodes.wait_gone(doomed)  # (its server may answer a moment longer)
        with pytest.raises(ClusterError) as e:
            c.run(fill, 2)
    finally:
        c.close()
        if doomed in ray_nodes.cluster.worker_nodes:
            ray_nodes.remove(doomed)
    message = str(e.value)
    assert message.startswith("server 0 died and Ray cannot start it again: "), message
    assert message.endswith(f"; its node 'doomed-forever' ({doomed_id[:8]}) left the Ray "
                            "cluster (it held server 0)"), message
