"""An existing Ray cluster, made by the README's lines from a fresh HOME: ``paramserver
ray-token``, ``RAY_AUTH_MODE=token ray start --head …`` and a second node ``ray start
--address …`` with its own resources, as processes of their own on this machine;
``paramserver train … --address`` then trains on it, its servers and workers on both nodes
(the placement the command logs and writes), and the cluster stays up after it. The
cluster asks every connection for the token: a driver without it is refused (exit 2, one
line, none of Ray's own lines on the terminal); the token file is 0600.

The nodes run in the foreground (``--block``) in a folder of the test's own (its sockets,
logs, and the address of the "current" cluster), on ports of their own; they are stopped
by their process ids, never with ``ray stop`` (which stops every Ray of the machine), and
the test checks that none of their processes is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
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

ROOT = Path(__file__).resolve().parents[1]
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


def readme_lines() -> dict[str, tuple[dict[str, str], list[str]]]:
    """The README's lines for a cluster (under "Running on Ray"), by what they do: the
    environment each sets and its command's words (comments left out)."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Running on Ray"):].split("\n\n")[2]
    lines = {}
    for line in block.splitlines():
        words = shlex.split(line.split("#")[0])
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[:2] == ["paramserver", "ray-token"]:
            lines["token"] = env, words
        elif words[:2] == ["ray", "start"]:
            lines["head" if "--head" in words else "node"] = env, words
        elif words[:2] == ["paramserver", "train"] and "--address" in words:
            lines["train"] = env, words
    assert set(lines) == {"token", "head", "node", "train"}, block
    return lines


def as_run(words: list[str], port: int, job: str = "") -> list[str]:
    """A README line's words, run here: this venv's commands, the test's port for 6379,
    127.0.0.1 for HEAD, the test's job file for job.conf."""
    tool = {"ray": str(RAY), "paramserver": sys.executable}[words[0]]
    rest = [w.replace("6379", str(port)).replace("HEAD", "127.0.0.1").replace(
        "job.conf", job) for w in words[1:]]
    return [tool, *(["-m", "paramserver"] if words[0] == "paramserver" else []), *rest]


class Node:
    """``ray start … --block``: a node of the cluster, in the foreground, until stopped."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen([*command, "--block"], env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT)

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
    home = folder / "home"  # a fresh HOME: no token anywhere yet
    home.mkdir()
    port = free_port()
    lines = readme_lines()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_TMPDIR", "RAY_ADDRESS") and not k.startswith("RAY_AUTH")}
    # The kernels compiled already stay where they are (a fresh cache would compile every
    # kernel again in every actor, a minute on a busy machine).
    env.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    env.update({"HOME": str(home), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                            os.environ.get("PYTHONPATH")]))})
    # The token first, as the README says; readable by its owner only.
    made = subprocess.run(as_run(lines["token"][1], port), env={**env, **lines["token"][0]},
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    token = Path(made.stdout.strip())
    assert token == home / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    # This machine's ports and files: the nodes' own, and one CPU each.
    common = ["--num-cpus=1", f"--temp-dir={folder}", "--disable-usage-stats",
              f"--dashboard-agent-listen-port={free_port()}"]
    nodes: list[Node] = []
    pids: set[int] = set()
    try:
        head_env, head_words = lines["head"]
        head = Node([*as_run(head_words, port), "--node-name=head",
                     "--include-dashboard=false", f"--ray-client-server-port={free_port()}",
                     *common], {**env, **head_env}, folder / "head.log")
        nodes.append(head)
        head.wait_started()
        assert "Token authentication is disabled" not in head.log.read_text()
        node_env, node_words = lines["node"]
        second = Node([*as_run(node_words, port), "--node-name=second",
                       '--resources={"second": 4}', *common], {**env, **node_env},
                      folder / "second.log")
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


def test_the_readmes_cluster_trains_and_refuses_a_driver_without_its_token(
        started_cluster: Any, tmp_path: Path) -> None:
    address, env, nodes = started_cluster
    port = int(address.rsplit(":", 1)[1])
    job = tmp_path / "tiny.conf"
    job.write_text(JOB.format(steps=6, ckpt=0, ws=tmp_path / "ws"))
    train_env, train_words = readme_lines()["train"]
    proc = subprocess.run(as_run(train_words, port, str(job)), env={**env, **train_env},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    placed = [line for line in (proc.stdout + proc.stderr).splitlines()
              if line.startswith("on Ray: ")]
    assert len(placed) == 1, proc.stdout + proc.stderr
    line = placed[0]
    assert line.startswith("on Ray: 2 server(s) and 2 worker(s) on 2 node(s): 'head' ("), line
    assert "; 'second' (" in line, line
    assert (tmp_path / "ws" / "metrics.csv").read_text().count("\n") > 1
    # Where the actors were, without Ray's dashboard: the workspace's placement.json.
    where = json.loads((tmp_path / "ws" / "placement.json").read_text())["actors"]
    assert sorted(where) == ["server 0", "server 1", "worker 0 of group 0",
                             "worker 1 of group 0"]
    assert {a["node"].split(" ")[0] for a in where.values()} == {"'head'", "'second'"}
    # A driver without the token (RAY_AUTH_MODE not set) is refused: the user's mistake,
    # one line, Ray's own lines in the workspace's log, nothing else made.
    refused = subprocess.run([*as_run(["paramserver", *train_words[1:]], port, str(job)),
                              "--workspace", str(tmp_path / "refused")], env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.splitlines() == [
        f"paramserver train: error: cannot join the Ray cluster at {address}: the cluster "
        "asks for a token and this process sends none: set RAY_AUTH_MODE=token, with the "
        f"cluster's token in {env['HOME']}/.ray/auth_token (or RAY_AUTH_TOKEN)"], refused.stderr
    assert not (tmp_path / "refused").exists()
    # The cluster is still up, both nodes in it.
    assert all(n.proc.poll() is None for n in nodes)


DRIVER = """
import os, sys
from paramserver.cluster.ray_backend import start_ray
start_ray(num_cpus=1)
print("ready", flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_paramservers_own_ray_ends_with_its_driver_killed_and_its_token_is_private(
        tmp_path: Path) -> None:
    """A driver of paramserver's own local Ray killed outright (kill -9): every process of
    that Ray ends (its dashboard and runtime-env agents too, which Ray leaves for a minute
    or two); the token it made in a fresh HOME is its owner's only."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS",) and not k.startswith("RAY_AUTH")}
    env.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    folder = Path(tempfile.mkdtemp(prefix="psrk-"))  # short: Ray's socket paths
    env.update({"HOME": str(home), "RAY_TMPDIR": str(folder)})
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids: set[int] = set()
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == "ready\n"
        pids = descendants({driver.pid}) - {driver.pid}
        names = {Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0] for p in alive(pids)}
        assert any(b"DashboardAgent" in n or b"RuntimeEnvAgent" in n for n in names), names
        token = home / ".ray" / "auth_token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(60)
        deadline = time.monotonic() + 30
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)  # processes of another parent: polling /proc
        left = alive(pids)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(60)
        for pid in alive(pids):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left]
