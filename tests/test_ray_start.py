"""An existing Ray cluster, made as docs/ray.md says: ``ray start --head`` and a second node
``ray start --address …`` with its own resources, as processes of their own on this
machine; ``paramserver train … --address`` then trains on it, its servers and workers on
both nodes (the placement the command logs), and the cluster stays up after it.

The nodes run in the foreground (``--block``) in a folder of the test's own (its sockets,
logs, and the address of the "current" cluster), on ports of their own; they are stopped
by their process ids, never with ``ray stop`` (which stops every Ray of the machine), and
the test checks that none of their processes is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import JOB

pytest.importorskip("ray")
RAY = Path(sys.executable).parent / "ray"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pids: set[int]) -> set[int]:
    """``pids`` and every process below them (Linux's /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = set(pids)
    while True:
        more = {p for p, pp in parent.items() if pp in found} - found
        if not more:
            return found
        found |= more


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()
            and "zombie" not in _state(p)}


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
                .lower())
    except (OSError, IndexError):
        return "zombie"


class Node:
    """``ray start … --block``: a node of the cluster, in the foreground, until stopped."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen([str(RAY), "start", "--block", *args], env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT)

    def wait_started(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while b"Ray runtime started." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ray start failed:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)  # polling a log file: no event to wait on

    def stop(self) -> None:
        """SIGTERM (Ray then stops the node's processes), SIGKILL if it does not end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def started_cluster() -> Iterator[tuple[str, dict[str, str], list[Node]]]:
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc to check that no Ray process is left")
    folder = Path(tempfile.mkdtemp(prefix="psrs-"))  # short: Ray's socket paths
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_TMPDIR", "RAY_ADDRESS")}
    env.update({"RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH")]))})
    common = ["--num-cpus=1", f"--temp-dir={folder}", "--disable-usage-stats",
              f"--dashboard-agent-listen-port={free_port()}"]
    nodes: list[Node] = []
    pids: set[int] = set()
    try:
        head = Node(["--head", f"--port={port}", "--node-name=head", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}", *common], env,
                    folder / "head.log")
        nodes.append(head)
        head.wait_started()
        second = Node([f"--address=127.0.0.1:{port}", "--node-name=second",
                       '--resources={"second": 4}', *common], env, folder / "second.log")
        nodes.append(second)
        second.wait_started()
        yield f"127.0.0.1:{port}", env, nodes
        pids = descendants({n.proc.pid for n in nodes})
    finally:
        pids |= descendants({n.proc.pid for n in nodes})
        for node in reversed(nodes):
            node.stop()
        deadline = time.monotonic() + 30
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)  # processes end on their own once their raylet is gone
        left = alive(pids)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
    assert not left, f"Ray processes left after the nodes stopped: {sorted(left)}"


def test_train_on_a_cluster_started_with_ray_start(started_cluster: Any,
                                                   tmp_path: Path) -> None:
    address, env, nodes = started_cluster
    job = tmp_path / "tiny.conf"
    job.write_text(JOB.format(steps=6, ckpt=0, ws=tmp_path / "ws"))
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", str(job), "--backend",
                           "ray", "--address", address], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    placed = [line for line in (proc.stdout + proc.stderr).splitlines()
              if line.startswith("on Ray: ")]
    assert len(placed) == 1, proc.stdout + proc.stderr
    line = placed[0]
    assert line.startswith("on Ray: 2 server(s) and 2 worker(s) on 2 node(s): 'head' ("), line
    assert "; 'second' (" in line, line
    assert (tmp_path / "ws" / "metrics.csv").read_text().count("\n") > 1
    # The cluster is still up, both nodes in it.
    assert all(n.proc.poll() is None for n in nodes)
