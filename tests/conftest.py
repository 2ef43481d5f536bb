"""Test-wide settings, applied before numba or torch load.

OpenMP threads spin while they wait by default; on a busy two-core machine (CI) that makes
small parallel kernels and torch loops many times slower. Passive waiting changes no result.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _not_in_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite never works in the repository: what the README's commands made there (the
    data of SINGA's examples, workspaces) changes nothing, and no test leaves files there.
    Every test (and every fixture) starts in a temporary folder; the repository's files are
    named by absolute paths."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(autouse=True)
def _a_folder_of_its_own(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def _registries_as_they_were() -> Iterator[None]:
    """A component a test registers (a user's layer, updater, ...) is forgotten after it:
    a Ray cluster started by a later test makes every actor import the modules of every
    registered component, and a test's module in its own temporary folder is not
    importable there (a CI run failed on exactly that)."""
    from paramserver.config.components import (
        is_users,
        layers,
        lr_methods,
        param_generators,
        updaters,
    )

    registries = (param_generators, updaters, lr_methods, layers)
    before = [set(r.names()) for r in registries]
    yield
    for registry, names in zip(registries, before, strict=True):
        for name, obj in registry.items():  # built-ins load lazily: only a user's go
            if name not in names and is_users(obj):
                registry.remove(name)


@pytest.fixture
def cwd(tmp_path: Path) -> Iterator[Path]:
    """Run the test in ``tmp_path`` (job files that name relative paths), then go back."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


class RayNodes:
    """The tests' Ray cluster: Ray's own multi-node harness (``ray.cluster_utils.Cluster``)
    on this machine — a head node (where this process is), a node with the resource
    ``server`` and one with ``worker``, each with its own raylet and object store, all
    listening on 127.0.0.1 only. Tests add nodes and remove them (as a crash would)."""

    def __init__(self, cluster: Any):
        self.cluster = cluster
        self.standing: dict[str, tuple[Any, dict[str, float]]] = {}

    def add(self, name: str, **resources: float) -> Any:
        from paramserver.cluster.ray_backend import loopback_only

        with loopback_only():
            return self.cluster.add_node(num_cpus=1, node_name=name, resources=resources,
                                         object_store_memory=80 << 20)

    def stand(self, name: str, **resources: float) -> None:
        """A node every test may count on (``server-node``, ``worker-node``)."""
        self.standing[name] = (self.add(name, **resources), resources)

    def heal(self) -> None:
        """Put back a standing node that died when no test removed it (a raylet of Ray
        2.60 once died in a CI run while actors were restarted): one lost node then fails
        the test it happened in, not every later test that needs its resources."""
        import ray

        alive = {n["NodeID"]: bool(n.get("Alive")) for n in ray.nodes()}
        for name, (node, resources) in list(self.standing.items()):
            # a process of its own that died is seen at once; Ray's view a few s later
            if alive.get(self.id_of(node), False) and not node.dead_processes():
                continue
            if node in self.cluster.worker_nodes:
                self.remove(node)
            self.stand(name, **resources)

    def remove(self, node: Any) -> None:
        """Kill every process of ``node`` at once (no goodbye to the cluster)."""
        self.cluster.remove_node(node, allow_graceful=False)

    def wait_gone(self, node: Any, timeout: float = 60.0) -> None:
        """Return once Ray's view has ``node`` dead (its health checks gave it up: about
        4 s). Until then an actor of the node may still answer calls, which go from process
        to process, not through its raylet."""
        import ray

        deadline = time.monotonic() + timeout
        while any(n["NodeID"] == self.id_of(node) and n.get("Alive") for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray still has node {self.id_of(node)[:8]} alive after "
                                   f"{timeout:g} s")
            time.sleep(0.1)  # Ray's own health checks decide; ask again

    @staticmethod
    def id_of(node: Any) -> str:
        return str(node.node_id)


#: A test on the tests' Ray cluster runs once more when, and only when, it failed because
#: Ray's own health check took one of the cluster's nodes for dead (a raylet of this 2-core
#: machine, busy starting actors' processes, missed its heartbeats: Ray then ends it), or
#: because its actors could not start on a node so lost. Any other failure fails at once;
#: the same failure twice fails. (pytest-rerunfailures; the node is put back by
#: RayNodes.heal before the rerun.)
RAY_INFRASTRUCTURE_FAILURES = [r"missing too many heartbeats", r"Ray actors of the cluster "
                               r"did not start within"]
_RAY_FIXTURES = {"ray_nodes", "ray_session", "ray_cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if names & _RAY_FIXTURES or params.get("backend") == "ray":
            item.add_marker(pytest.mark.flaky(reruns=1,
                                              only_rerun=RAY_INFRASTRUCTURE_FAILURES))


#: The tests' cluster while it is up (for :func:`ray_session`'s healing).
_CLUSTER: list[RayNodes] = []


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayNodes]:
    """One Ray cluster of three nodes for every test that needs Ray (started once, a few
    seconds); skipped where Ray is not installed. Its processes can import the test modules
    (for actors the tests define) and the sources under test. A node lost for good is seen
    within about 4 s (Ray's health checks every 0.5 s)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray was started by someone else: no test cluster of several nodes")
    from ray.cluster_utils import Cluster

    from paramserver.cluster.ray_backend import loopback_only

    path = os.pathsep.join([str(Path(__file__).parent),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    # Ray's files (sockets, logs, the address of the "current" cluster) in a folder of
    # this session's, not in the /tmp/ray that other Ray users of the machine share.
    temp = tempfile.mkdtemp(prefix="psray-")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    cluster = None
    try:
        with loopback_only():
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 2, "node_name": "head", "include_dashboard": False,
                "object_store_memory": 100 << 20, "_system_config": {
                    "health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                    "health_check_failure_threshold": 8}})
            nodes = RayNodes(cluster)
            nodes.stand("server-node", server=100)
            nodes.stand("worker-node", worker=100)
            _CLUSTER[:] = [nodes]
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
        yield nodes
    finally:
        _CLUSTER.clear()
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def ray_nodes(ray_cluster: RayNodes) -> RayNodes:
    """The tests' cluster (:func:`ray_cluster`), its standing nodes alive."""
    ray_cluster.heal()
    return ray_cluster


@pytest.fixture
def ray_session(request: Any) -> Any:
    """Ray, connected to the tests' cluster (:func:`ray_nodes`, its standing nodes alive),
    or to the Ray someone started before; skipped where Ray is not installed."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        request.getfixturevalue("ray_nodes")
    elif _CLUSTER:
        _CLUSTER[0].heal()
    return ray


@pytest.fixture(params=["local", "ray"])
def backend(request: Any) -> str:
    """Each backend in turn: the embedded one, and Ray (skipped where not installed). A
    test may also ask for ``"ray-node"`` or ``"ray-graph"`` (``indirect`` parametrisation):
    Ray with every actor on this process's node, as on one machine (:func:`on_this_node`);
    the second with a synchronous run's steps through a Compiled Graph."""
    if request.param.startswith("ray"):
        request.getfixturevalue("ray_session")
    return str(request.param)


def pinned(node_id: str, soft: bool) -> dict[str, Any]:
    """Ray's options of an actor that goes on node ``node_id`` (``soft``: or elsewhere when
    that node is gone)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=soft)}


def on_this_node() -> dict[str, Any]:
    """The Ray backend's options that put every actor on this process's node of the tests'
    cluster (whose actors otherwise spread over its nodes): every message of a run then
    goes over a link, as on one machine."""
    import ray

    here = pinned(ray.get_runtime_context().get_node_id(), soft=False)
    return {"server_options": here, "worker_options": here}
