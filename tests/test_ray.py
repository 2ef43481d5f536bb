"""The Ray backend (SPEC §7): the same job on Ray gives the embedded run's values bit for
bit, server groups end a run holding every update, and actors get their configuration as
data. Failures (dead workers and servers, timeouts, non-finite gradients) are tested on
both backends in test_cluster_failures.py.

The tests that need Ray share one local Ray instance (started once, ~5 s; conftest.py) and
are skipped where Ray is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.checkpoint import checkpoint_name, load_checkpoint
from paramserver.cluster import Cluster, plan_servers
from paramserver.cluster.errors import ClusterError
from paramserver.cluster.gradfn import RemoteGradFn, build_grad_fn
from paramserver.cluster.messages import Get, Put, State, Update, Values
from paramserver.cluster.ray_wire import (
    LARGE,
    decode,
    encode,
    layout_from_data,
    layout_to_data,
    pack,
    params_from_data,
    params_to_data,
    unpack,
)
from paramserver.config.job import ClusterConf, parse_job
from paramserver.numerics import quant
from paramserver.params import ParamSet
from paramserver.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from conftest import on_this_node  # noqa: E402
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


def test_small_messages_travel_as_one_bytes_object() -> None:
    g = np.arange(7, dtype=np.float32)[::2]  # not contiguous: packed all the same
    for msg in (Update(1, 2, np.int64(3), g), Update(0, 0, 5, None), Get(0, 1, 2, clock=4),
                Values(np.zeros(0, np.float64), np.array([3, 4]), np.bool_(False)),
                Put(None, np.ones((2, 3), np.int64), 9)):
        data = pack(msg)
        assert isinstance(data, bytes)
        back = unpack(data)
        assert type(back) is type(msg)
        for f in msg.__dataclass_fields__:
            a, b = getattr(msg, f), getattr(back, f)
            if isinstance(a, np.ndarray):
                assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
                assert not b.flags.writeable  # a view of the bytes: read-only
            else:
                assert a == b and type(b) in (type(a), int, bool)
    # Dicts of arrays and large arrays go the other way (tuples; the object store).
    assert pack(State({"values": g})) is None
    assert pack(Update(0, 0, 0, np.zeros(LARGE // 4, np.float32))) is None
    with pytest.raises(ParamError, match="unknown message"):
        unpack(pack(Get(0, 0, 0)).replace(b'"Get"', b'"Gex"'))  # type: ignore[union-attr]


def test_bfloat16_values_travel_as_bfloat16() -> None:
    """A server's values under ``value_dtype: bfloat16`` are bfloat16 numbers held in
    float32: between processes they move as their 2-byte patterns and arrive as the same
    float32 values, whichever way the message goes (one bytes object, or the object store)."""
    rng = np.random.default_rng(3)
    values = quant.bf16_decode(quant.bf16_encode(rng.standard_normal(1000).astype(np.float32)))
    values[:3] = [0.0, -np.inf, np.nan]
    plain, narrow = (Values(values, np.arange(4), True, b) for b in (False, True))
    small, large = pack(plain), pack(narrow)
    assert small is not None and large is not None
    assert len(small) - len(large) == values.nbytes // 2  # 2 bytes a value, not 4
    back = unpack(large)
    assert back.bfloat16 and back.values.dtype == np.float32
    assert np.array_equal(back.values.view(np.uint32), values.view(np.uint32))
    big = quant.bf16_decode(quant.bf16_encode(rng.standard_normal(LARGE).astype(np.float32)))
    sent = encode(Values(big, np.arange(2), True, True))
    assert sent[1].dtype == np.uint16 and sent[1].nbytes == big.nbytes // 2
    assert np.array_equal(decode(sent).values, big)


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
        name = checkpoint_name(step)
        a, _ = load_checkpoint(tmp_path / "local" / "checkpoints" / name)
        b, _ = load_checkpoint(tmp_path / "ray" / "checkpoints" / name)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # The servers wrote their own checkpoints (values, updater state, versions).
    servers = tmp_path / "ray" / "checkpoints" / "servers"
    assert sorted(p.name for p in servers.iterdir()) == ["server-0-0", "server-0-1"]


def linked(worker: Any, step: int) -> dict[str, int]:
    """``fill``, and how many of this worker's messages went over links so far."""
    return {**fill(worker, step), "linked": worker._transport.inner.linked}


@pytest.mark.parametrize(("one_node", "compiled"), [(True, False), (False, False),
                                                    (False, True)])
def test_the_steps_go_over_links_on_one_node_and_a_compiled_graph_gives_the_same(
        ray_session: Any, one_node: bool, compiled: bool) -> None:
    """A synchronous run whose actors share a node sends every step's messages over links;
    spread over the tests' nodes, as Ray calls where a link does not reach; with
    ``compiled=True``, through a Compiled Graph. Every way ends as the embedded run, bit
    for bit."""
    c = conf(nworkers_per_group=2, nservers_per_group=2)
    want, want_metrics = embedded(c, fill, 6)
    ps = make_params()
    cluster = Cluster(on_ray(c), ps, SGD, compiled=compiled,
                      **(on_this_node() if one_node else {}))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cluster.backend.halts is compiled  # a graph goes on through the pauses
            metrics = cluster.run(linked, 6)
    finally:
        cluster.close()
    assert np.array_equal(ps.values, want.values)
    assert [[{k: v for k, v in m.items() if k != "linked"} for m in step] for step in metrics
            ] == want_metrics
    # across nodes, the graph's risk to Ray's raylet is said, once
    risks = [str(w.message) for w in caught if "ray-project/ray#63229" in str(w.message)]
    assert len(risks) == (1 if compiled and not one_node else 0), risks
    counts = [m["linked"] for m in metrics[-1]]
    if compiled:  # at most the first pull: the updates go through the graph's channels
        assert all(n <= 2 for n in counts), counts
    elif one_node:  # the first pull and, at each step before, an update to each server
        assert all(n >= 1 + 2 * 5 for n in counts), counts


def test_bfloat16_values_with_a_master_on_ray_equal_the_embedded_run(
        ray_session: Any, tmp_path: Path) -> None:
    """``value_dtype: bfloat16``: workers on Ray pull the master's bfloat16 rounding (as 2
    bytes a value) and train exactly as the embedded run."""
    runs = {}
    for backend in ("local", "ray"):
        job = ray_job(tmp_path / backend, 8, backend)
        job.updater.update({"value_dtype": "bfloat16"})
        t = Trainer(job, progress=False)
        try:
            t.train()
        finally:
            t.close()
        runs[backend] = t.params.values.copy()
    assert np.array_equal(runs["local"], runs["ray"])
    assert np.array_equal(runs["ray"], quant.bf16_decode(quant.bf16_encode(runs["ray"])))


LISTENING = r'''
import json, os, sys
from pathlib import Path
from paramserver.cluster.ray_backend import start_ray
import ray
assert start_ray()
@ray.remote
class Actor:
    def pid(self): return os.getpid()
actor = Actor.remote()
ray.get(actor.pid.remote())
def children(pids):
    parent = {}
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            try: parent[int(e.name)] = int((e / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError: pass
    found = set(pids)
    while True:
        more = {p for p, q in parent.items() if q in found} - found
        if not more: return found
        found |= more
inodes = {}
for pid in children({os.getpid()}):
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes[target[8:-1]] = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        pass
out = []
for table in ("tcp", "tcp6"):
    for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # listening
            out.append([table, f[1].split(":")[0], inodes[f[9]]])
print(json.dumps(out))
ray.shutdown()
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_local_ray_of_its_own_listens_on_the_loopback_interface_only() -> None:
    """Ray binds every interface even with a loopback node address; paramserver's own
    local Ray uses Ray's single-machine mode, in which all its services (the GCS, the
    raylet, the agents, every worker's RPC server) listen on 127.0.0.1."""
    pytest.importorskip("ray")
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    proc = subprocess.run([sys.executable, "-c", LISTENING], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sockets = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {name for _, _, name in sockets}
    assert {"gcs_server", "raylet"} <= names and len(sockets) >= 5, sockets
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, v4 in v6
    assert [s for s in sockets if s[1] not in loopback] == [], sockets


def test_a_gradient_function_built_ahead_that_fails_fails_the_run_saying_why(
        ray_session: Any) -> None:
    """``build_ahead`` (what ``paramserver train`` gives): the workers build it as they start;
    a build that fails there fails the first run with the build's own error."""
    with pytest.raises(ParamError, match="build_ahead must be a RemoteGradFn"):
        Cluster(conf(backend="ray"), make_params(), SGD, build_ahead=print)
    missing = RemoteGradFn("paramserver_no_such_module:grad_fn")
    with Cluster(conf(backend="ray"), make_params(), SGD, build_ahead=missing) as c:
        with pytest.raises(ClusterError, match="paramserver_no_such_module"):
            c.run(missing, 2)
