"""Test-wide settings, applied before numba or torch load.

OpenMP threads spin while they wait by default; on a busy two-core machine (CI) that makes
small parallel kernels and torch loops many times slower. Passive waiting changes no result.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray for every test that needs it (started once, a few seconds); skipped
    where Ray is not installed. Its processes can import the test modules (for actors the
    tests define) and the sources under test."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    path = os.pathsep.join([str(Path(__file__).parent),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def backend(request: Any) -> str:
    """Each backend in turn: the embedded one, and Ray (skipped where not installed)."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return str(request.param)
