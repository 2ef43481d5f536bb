"""Test-wide settings, applied before numba or torch load.

OpenMP threads spin while they wait by default; on a busy two-core machine (CI) that makes
small parallel kernels and torch loops many times slower. Passive waiting changes no result.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import shutil
import tempfile
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

    def add(self, name: str, **resources: float) -> Any:
        from paramserver.cluster.ray_backend import loopback_only

        with loopback_only():
            return self.cluster.add_node(num_cpus=1, node_name=name, resources=resources,
                                         object_store_memory=80 << 20)

    def remove(self, node: Any) -> None:
        """Kill every process of ``node`` at once (no goodbye to the cluster)."""
        self.cluster.remove_node(node, allow_graceful=False)

    @staticmethod
    def id_of(node: Any) -> str:
        return str(node.node_id)


@pytest.fixture(scope="session")
def ray_nodes() -> Iterator[RayNodes]:
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
            nodes.add("server-node", server=100)
            nodes.add("worker-node", worker=100)
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
        yield nodes
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_session(request: Any) -> Any:
    """Ray, connected to the tests' cluster (:func:`ray_nodes`), or to the Ray someone
    started before; skipped where Ray is not installed."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        request.getfixturevalue("ray_nodes")
    return ray


@pytest.fixture(params=["local", "ray"])
def backend(request: Any) -> str:
    """Each backend in turn: the embedded one, and Ray (skipped where not installed)."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return str(request.param)
