"""Messages through shared memory between the processes of one node (issue 34): a Ray
worker's pushes and pulls of a table travel as a few ints in the actor call, their bytes in
the worker's shared memory; the values are the embedded store's, a lost server is reported
as before, and nothing is left behind — no file in /dev/shm, no process holding the memory
— after the store is closed, a worker crashed or a server was killed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import kv
from paramserver.cluster.errors import ClusterError
from paramserver.cluster.messages import KeyBatch, Update, Values
from paramserver.cluster.ray_wire import packed, unpack
from paramserver.cluster.shared_memory import Attached, Region, RegionError, supported

pytestmark = pytest.mark.skipif(not supported(), reason="needs Linux's memfd_create and /proc")

ROWS, DIM = 5_000, 16
ADAM = {"type": "kAdam", "learning_rate": {"base_lr": 0.05}}
#: Every actor on the tests' server node: the workers' servers are on their node.
ONE_NODE = {"num_cpus": 0, "resources": {"server": 1}}


def holders(name: str) -> list[int]:
    """The processes that map or hold region ``name`` now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if name in (entry / "maps").read_text():
                found.append(int(entry.name))
                continue
            for fd in (entry / "fd").iterdir():
                if name in os.readlink(fd):
                    found.append(int(entry.name))
                    break
        except OSError:  # ended, or not ours to read
            continue
    return found


def left_behind(names: list[str]) -> dict[str, list[int]]:
    """What still holds the regions ``names`` once the processes that held them when the
    store closed have ended (its actors, killed by the close: waited for, as events, up to
    a minute each); this process must hold none of them at once."""
    import select

    for name in names:
        assert os.getpid() not in holders(name), f"the driver still holds {name}"
    for pid in {pid for name in names for pid in holders(name)}:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], 60.0)  # readable when the process has ended
        finally:
            os.close(fd)
    return {name: found for name in names if (found := holders(name))}


def ours_in_dev_shm() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").iterdir() if "paramserver" in p.name)


# -- the region, without Ray -------------------------------------------------------------------

def test_a_message_and_its_reply_cross_processes_where_they_lie() -> None:
    region = Region(first_size=4096)
    try:
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((300, DIM)).astype(np.float32)
        message = KeyBatch("5", Update(0, 1, -1, None), np.array([0, rows.size]),
                           rows.reshape(-1), np.array([True]), np.arange(300) * 3,
                           np.array([0, 300]))
        p = packed(message, limit=None)
        assert p is not None
        first = region.take(64)
        at = region.take(p.size)  # past the first place; the region grows to hold it
        assert first == 0 and at is not None and at >= 64 and region.size >= at + p.size
        p.write(region.view(at, p.size))
        # another process opens it by its name, reads the message, writes a reply there
        code = (
            "import sys, numpy as np\n"
            "from paramserver.cluster.shared_memory import Attached\n"
            "from paramserver.cluster.ray_wire import packed, unpack\n"
            "from paramserver.cluster.messages import Values\n"
            "name, pid, fd, size, at, n = sys.argv[1:]\n"
            "view = Attached().view(name, int(pid), int(fd), int(size))\n"
            "m = unpack(view[int(at):int(at) + int(n)], copy=True)\n"
            "r = packed(Values(m.data * 2, m.ids, True, False), limit=None)\n"
            "r.write(view[int(at):]); print(r.size)\n")
        done = subprocess.run([sys.executable, "-c", code, region.name, str(region.pid),
                               str(region.fd), str(region.size), str(at), str(p.size)],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        reply = unpack(region.view(at, int(done.stdout)), copy=True)
        region.give(at)
        assert isinstance(reply, Values)
        assert np.array_equal(reply.values, rows.reshape(-1) * 2)
        assert np.array_equal(reply.versions, np.arange(300) * 3)
        assert region.take(p.size) == at  # its place is free again
        # a name that is not the region's: refused, nothing opened
        with pytest.raises(RegionError, match="is not the shared memory"):
            Attached().view(region.name + "x", region.pid, region.fd, region.size)
    finally:
        region.close()
    assert holders(region.name) == []


# -- Ray -----------------------------------------------------------------------------------------

def _ids_rows(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([rank, step])
    ids = np.sort(rng.choice(ROWS, 600, replace=False))
    return ids, rng.standard_normal((600, DIM)).astype(np.float32)


def _steps(s: kv.KVStore, first: int, steps: int) -> dict[str, Any]:
    """Pushes and pulls of the table and of a dense key; what the worker pulled, and its
    transport's shared memory."""
    pulled = []
    for step in range(first, first + steps):
        ids, rows = _ids_rows(s.rank, step)
        s.push(["emb", "w"], [kv.RowSparse(ids, rows), rows[:100].reshape(-1)])
        pulled.append(s.row_sparse_pull("emb", row_ids=_ids_rows(s.rank, step + 1)[0]))
        pulled.append(s.pull("w"))
    t = getattr(s._transport, "inner", s._transport)
    region = getattr(t, "_region", None)  # (embedded: none)
    return {"pulled": pulled, "linked": getattr(t, "linked", 0), "pid": os.getpid(),
            "region": region.name if region is not None else None}


def _store(backend: str, **options: Any) -> kv.KVStore:
    store = kv.create("dist_sync", num_workers=2, num_servers=2, bound=20_000,
                      backend=backend, updater=ADAM, timeout=120.0, **options)
    store.init(["emb", "w"], [kv.Fill((ROWS, DIM), {"type": "kUniform"}),
                              np.zeros(100 * DIM, np.float32)], row_sparse=[True, False])
    return store


def test_a_table_through_shared_memory_ends_as_embedded_and_leaves_nothing(
        ray_session: Any) -> None:
    with _store("local") as store:
        want = store.run(_steps, 0, 3)
        want_end = store.pull("emb")
    before = ours_in_dev_shm()
    with _store("ray", server_options=ONE_NODE, worker_options=ONE_NODE) as store:
        got = store.run(_steps, 0, 3)
        got_end = store.pull("emb")
        regions = [g["region"] for g in got]
        assert all(r is not None and holders(r) for r in regions)
    # the same values, pull by pull, and the table at the end
    for g, w in zip(got, want, strict=True):
        assert g["linked"] >= 3 * 3  # every step's push and pulls at least
        for a, b in zip(g["pulled"], w["pulled"], strict=True):
            assert np.array_equal(a, b)
    assert np.array_equal(got_end, want_end)
    # closed: no process holds the workers' shared memory; nothing in /dev/shm
    assert left_behind(regions) == {}
    assert ours_in_dev_shm() == before == []


def _crash(s: kv.KVStore) -> None:
    if s.rank == 1:
        os._exit(3)  # a worker's process dies, its pushes through shared memory behind it
    s.barrier()


def _kill_a_server(s: kv.KVStore) -> None:
    import ray

    t = getattr(s._transport, "inner", s._transport)
    if s.rank == 0:
        ray.kill(t.handles[(0, 1)], no_restart=True)
    _steps(s, 5, 1)


def test_a_crashed_worker_or_a_lost_server_leaves_nothing_behind(ray_session: Any) -> None:
    with _store("ray", server_options=ONE_NODE, worker_options=ONE_NODE) as store:
        regions = [g["region"] for g in store.run(_steps, 0, 1)]
        with pytest.raises(ClusterError):
            store.run(_crash)
    assert left_behind(regions) == {}
    with _store("ray", server_options=ONE_NODE, worker_options=ONE_NODE) as store:
        regions = [g["region"] for g in store.run(_steps, 0, 1)]
        # a server lost while workers send through shared memory: reported as before, by
        # the worker that waited for it or by the driver that found it dead first
        with pytest.raises(ClusterError, match=r"lost server 1 while it waited|server 1 died "
                                               r"and Ray did not restart it"):
            store.run(_kill_a_server)
    assert left_behind(regions) == {}
    assert ours_in_dev_shm() == []


# -- who may connect -----------------------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_a_server_socket_takes_no_link_from_another_user() -> None:
    """A socket name of the abstract namespace has no permissions: any local user could
    connect to a server's. The listener takes a link only from a process of its own user:
    another user's connection -- a well-formed hello naming its own shared memory, then a
    message -- is closed before anything it sent is handled, while this user's is served."""
    import threading

    from paramserver.cluster.messages import Barrier
    from paramserver.cluster.node_link import Link, Listener

    handled: list[Any] = []
    answered = threading.Event()

    def handle(request: Any, reply: Any) -> None:
        handled.append(request)
        reply(Values(np.zeros(1, np.float32), np.zeros(1, np.int64), True, False))
        answered.set()

    name = f"paramserver-test-{os.getpid()}-peer"
    Listener(name, handle, "server 0")
    # the other user speaks the link's protocol itself (it need not use our Link, whose own
    # check of the server's user would refuse first)
    code = (
        "import json, os, socket, sys\n"
        "from paramserver.cluster.messages import Barrier\n"
        "from paramserver.cluster.node_link import FRAME, HELLO, INLINE\n"
        "from paramserver.cluster.ray_wire import packed\n"
        "from paramserver.cluster.shared_memory import Region\n"
        "region = Region(first_size=4096)\n"
        "hello = json.dumps([region.name, region.pid, region.fd]).encode()\n"
        "p = packed(Barrier(0, 0, 1), limit=None)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "os.setgid(65534); os.setuid(65534)  # the rest as another user (who connects counts)\n"
        "s.connect('\\0' + sys.argv[1])\n"
        "try:\n"
        "    s.sendall(FRAME.pack(0, HELLO, len(hello), 0, 0, region.size) + hello\n"
        "              + FRAME.pack(1, INLINE, p.size, 0, 0, 0) + b''.join(p.parts()))\n"
        "    print('refused' if s.recv(64) == b'' else 'answered')\n"
        "except OSError:\n"
        "    print('refused')\n")
    other = subprocess.run([sys.executable, "-c", code, name], capture_output=True,
                           text=True, timeout=120, cwd="/",
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert other.stdout.startswith("refused"), other.stdout + other.stderr
    assert handled == []
    # this user's link is served
    region = Region(first_size=4096)
    try:
        link = Link(name, region, "server 0", ("server", 0), lambda: "")
        pending = link.send(Barrier(0, 0, 1), "a barrier", 0)
        assert pending is not None
        assert isinstance(pending.wait(60.0), Values)
        assert answered.is_set() and len(handled) == 1
        link.close()
    finally:
        region.close()
