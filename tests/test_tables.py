"""Row-sparse tables in a cluster (SPEC §10): a table's values lie after the dense Params'
and are sliced by rows; workers pull the rows they use and push rows by id; a run equals
the same run with the table dense (plain SGD, where lazy and dense updates agree); a job's
kEmbedding and a torch nn.Embedding(sparse=True) train this way, the latter the same on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.cluster import Cluster, plan_servers
from paramserver.cluster.ray_wire import params_from_data, params_to_data
from paramserver.config.job import ClusterConf, ParamConf, parse_job
from paramserver.params import ParamSet, ParamSpec, TableParam
from paramserver.train.layers import EmbeddingLayer
from paramserver.train.trainer import Trainer
from resume_rows import assert_rows_of_a_resume

ROWS, DIM = 300, 8


def specs(shared: bool = False) -> list[ParamSpec]:
    out = [ParamSpec("emb", (ROWS, DIM), ParamConf(), "t", True),
           ParamSpec("w", (DIM, 3), ParamConf(), "w"),
           ParamSpec("b", (3,), ParamConf(), "b")]
    if shared:
        out.append(ParamSpec("emb2", (ROWS, DIM), ParamConf(share_from="emb"), "s", True))
    return out


def test_tables_come_last_without_a_dense_gradient() -> None:
    ps = ParamSet(specs(), tables=True)
    assert [p.name for p in ps.owners] == ["w", "b", "emb"]
    assert ps.dense_size == DIM * 3 + 3 and ps.values.size == ps.dense_size + ROWS * DIM
    assert ps.grads.size == ps.dense_size
    emb = ps["emb"]
    assert isinstance(emb, TableParam) and emb.dim == DIM
    emb.data[...] = np.arange(ROWS * DIM).reshape(ROWS, DIM)
    np.testing.assert_array_equal(emb.rows([5, 2, 5]), emb.data[[5, 2, 5]])
    with pytest.raises(ParamError, match="'emb' is a row-sparse table: its gradient is rows"):
        emb.grad  # noqa: B018
    emb.add_grad_rows([4, 1], np.ones((2, DIM)))
    emb.add_grad_rows([4], np.full((1, DIM), 2.0))
    ids, rows = emb.take_grad_rows()
    assert ids.tolist() == [1, 4] and rows[:, 0].tolist() == [1.0, 3.0]
    emb.add_grad_rows([0], np.ones((1, DIM)))
    ps.zero_grads()
    assert emb.take_grad_rows()[0].size == 0
    # without tables (a net on its own), or shared: a dense Param as before
    assert not ParamSet(specs()).tables
    assert [t.name for t in ParamSet(specs(shared=True), tables=True).tables] == []


def test_a_workers_replica_does_not_hold_the_tables() -> None:
    ps = ParamSet(specs(), tables=True)
    remote = params_from_data(params_to_data(ps))
    assert remote.values.size == ps.dense_size and remote.offsets.tolist() == ps.offsets.tolist()
    with pytest.raises(ParamError, match="held by the servers; a worker reads its rows by id"):
        remote["emb"].data  # noqa: B018
    rep = ps.replica(np.zeros(ps.dense_size, np.float32))
    assert not rep.holds_tables and isinstance(rep["emb"], TableParam)


def test_servers_slice_a_table_by_rows() -> None:
    ps = ParamSet(specs(), tables=True)
    layouts = plan_servers(ps, 3)
    for L in layouts:
        for s in L.tables:
            assert L.dims[s] == DIM and (L.start + L.offsets[s] - ps.dense_size) % DIM == 0
            assert L.first_rows[s] == (L.start + L.offsets[s] - ps.dense_size) // DIM
    assert sum(int(L.offsets[s + 1] - L.offsets[s]) for L in layouts for s in L.tables) == (
        ROWS * DIM)


SGD = {"type": "kSGD", "learning_rate": {"base_lr": 0.1}}


def batch(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng([rank, step]).integers(0, ROWS, 12)


def loss_grads(rows: np.ndarray, w: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d/d(rows, w, b) of sum((rows @ w + b)^2) / 2."""
    out = rows @ w + b
    return out @ w.T, rows.T @ out, out.sum(0)


def sparse_fn(worker: Any, step: int) -> None:
    ids = batch(worker.rank, step)
    table = worker.params["emb"]
    rows = table.rows(ids)
    w, b = worker.params["w"].data, worker.params["b"].data
    g_rows, g_w, g_b = loss_grads(rows, w, b)
    table.add_grad_rows(ids, g_rows)
    worker.params["w"].grad = g_w
    worker.params["b"].grad = g_b


def dense_fn(worker: Any, step: int) -> None:
    ids = batch(worker.rank, step)
    p = worker.params["emb"]
    w, b = worker.params["w"].data, worker.params["b"].data
    g_rows, g_w, g_b = loss_grads(p.data[ids], w, b)
    p.grad[...] = 0
    np.add.at(p.grad, ids, g_rows)
    worker.params["w"].grad = g_w
    worker.params["b"].grad = g_b


def start(ps: ParamSet) -> ParamSet:
    rng = np.random.default_rng(0)
    for name in ("emb", "w", "b"):
        ps[name].data[...] = rng.standard_normal(ps[name].shape) * 0.1
    return ps


def test_a_synchronous_run_with_a_table_equals_the_dense_run() -> None:
    """SGD without momentum or decay: the lazy update of the rows pushed is the dense one,
    bit for bit (one group of two workers, two servers)."""
    conf = ClusterConf(nworkers_per_group=2, nservers_per_group=2, timeout=20)
    sparse = start(ParamSet(specs(), tables=True))
    dense = start(ParamSet(specs()))
    with Cluster(conf, sparse, SGD) as c:
        c.run(sparse_fn, 4)
    with Cluster(conf, dense, SGD) as c:
        c.run(dense_fn, 4)
    for name in ("emb", "w", "b"):
        np.testing.assert_array_equal(sparse[name].data, dense[name].data)


def constant_rows_fn(worker: Any, step: int) -> None:
    """Gradient rows that do not depend on the values: the end result does not depend on
    the order in which asynchronous groups' pushes arrive."""
    ids = batch(worker.rank, step)
    worker.params["emb"].add_grad_rows(ids, np.ones((ids.size, DIM)) * (1 + worker.rank))
    worker.params["w"].grad = np.zeros((DIM, 3))
    worker.params["b"].grad = np.zeros(3)


def test_asynchronous_groups_apply_every_rows_push_once() -> None:
    conf = ClusterConf(nworker_groups=2, nservers_per_group=2, timeout=20)
    ps = start(ParamSet(specs(), tables=True))
    before = ps["emb"].data.copy()
    with Cluster(conf, ps, SGD) as c:
        c.run(constant_rows_fn, 4)
    expected = before.astype(np.float64)
    for rank in range(2):
        for step in range(4):
            np.add.at(expected, batch(rank, step), -0.1 * (1 + rank))
    np.testing.assert_allclose(ps["emb"].data, expected, rtol=0, atol=1e-5)


JOB = """
name: "emb"
train_steps: {steps}
disp_freq: 3
checkpoint_freq: 3
workspace: "{ws}"
seed: 2
updater {{ {updater} learning_rate {{ base_lr: 0.2 }} }}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "{data}" batchsize: 16 }} }}
  layer {{ name: "emb" type: kEmbedding srclayers: "data"
          embedding_conf {{ vocab_size: 40 feature_dim: 4 }} }}
  layer {{ name: "fc" type: kInnerProduct srclayers: "emb" innerproduct_conf {{ num_output: 2 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: 2 nservers_per_group: 2 timeout: 30 backend: "{backend}" }}
"""


def embedding_job(tmp_path: Path, name: str, backend: str = "local", steps: int = 6,
                  updater: str = "type: kSGD") -> Any:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 40, (256, 3))
    np.savez(tmp_path / "ids.npz", x=x, y=(x == 1).any(axis=1).astype(np.int64))
    return parse_job(JOB.format(ws=tmp_path / name, data=tmp_path / "ids.npz",
                                backend=backend, steps=steps, updater=updater))


def test_a_job_with_a_table_resumes_exactly(tmp_path: Path) -> None:
    """Adam's lazy state of the table's rows is the servers': checkpointed and restored."""
    adam = "type: kAdam"
    straight = Trainer(embedding_job(tmp_path, "a", updater=adam), progress=False,
                       tensorboard=False)
    straight.train()
    Trainer(embedding_job(tmp_path, "b", steps=3, updater=adam), progress=False,
            tensorboard=False).train()
    second = Trainer(embedding_job(tmp_path, "b", updater=adam), progress=False,
                     tensorboard=False)
    second.train(resume=True)
    np.testing.assert_array_equal(straight.params.values, second.params.values)
    assert_rows_of_a_resume(tmp_path / "a", tmp_path / "b", 3)


def test_a_jobs_embedding_trains_as_a_table(tmp_path: Path, monkeypatch: Any) -> None:
    sparse = Trainer(embedding_job(tmp_path, "sparse"), progress=False, tensorboard=False)
    assert [t.name for t in sparse.params.tables] == ["emb_0"]
    sparse.train()
    monkeypatch.setattr(EmbeddingLayer, "row_sparse_params", ())
    dense = Trainer(embedding_job(tmp_path, "dense"), progress=False, tensorboard=False)
    assert not dense.params.tables
    dense.train()
    for name in ("emb_0", "fc_0", "fc_1"):
        np.testing.assert_array_equal(sparse.params[name].data, dense.params[name].data)


def torch_model(sparse: bool) -> Any:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 4, sparse=sparse, padding_idx=0),
                               torch.nn.Flatten(), torch.nn.Linear(12, 1))


def torch_loss(model: Any, step: int, rank: int, num_workers: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(step * 10 + rank)
    ids = torch.randint(0, 50, (8, 3), generator=g)
    return ((model(ids) - 1) ** 2).mean()


def test_a_torch_sparse_embedding_is_a_table(tmp_path: Path) -> None:
    """nn.Embedding(sparse=True) under TorchCluster: the servers hold the table, a worker's
    module holds none of it, and training equals the dense embedding's (plain SGD)."""
    from paramserver.export import param_values
    from paramserver.torch import TorchCluster

    job = {"nworkers_per_group": 2, "nservers_per_group": 2, "timeout": 30}
    sgd = {"type": "kSGD", "learning_rate": {"base_lr": 0.1}}
    sparse_model, dense_model = torch_model(True), torch_model(False)
    sparse = TorchCluster(sparse_model, job, sgd)
    assert [t.name for t in sparse.params.pset.tables] == ["0.weight"]
    assert "0.weight" not in dict(sparse.replica(0).named_parameters())
    padding_row = sparse_model[0].weight[0].detach().clone()
    sparse.run(torch_loss, 5)
    dense = TorchCluster(dense_model, job, sgd)
    dense.run(torch_loss, 5)
    for (name, a), b in zip(sparse_model.state_dict().items(),
                            dense_model.state_dict().values(), strict=True):
        assert name and np.array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(sparse_model[0].weight[0].detach(), padding_row)
    # a checkpoint exports under the module's names, the table where it belongs
    from paramserver.checkpoint import load_checkpoint

    path = sparse.save_checkpoint(tmp_path / "ckpt")
    values = param_values(*load_checkpoint(path))
    for name, t in sparse_model.state_dict().items():
        np.testing.assert_array_equal(values[name], t.numpy())


def test_a_torch_table_refuses_max_norm() -> None:
    torch = pytest.importorskip("torch")
    from paramserver.torch import TorchCluster

    model = torch.nn.Sequential(torch.nn.Embedding(10, 2, sparse=True, max_norm=1.0))
    with pytest.raises(ParamError, match="embedding '0': max_norm is not supported"):
        TorchCluster(model, {"nworkers_per_group": 1}, "type: kSGD")


def test_export_puts_a_tables_values_under_its_name(tmp_path: Path) -> None:
    """The table's values lie after the dense Params' in a checkpoint: export reads them
    from there, with the checkpoint's Param table and with the job's (``--job``)."""
    from safetensors.numpy import load_file

    from paramserver.checkpoint import load_checkpoint, save_checkpoint
    from paramserver.cli import main
    from paramserver.export import TABLE

    trainer = Trainer(embedding_job(tmp_path, "ws"), progress=False, tensorboard=False)
    trainer.train()
    ckpt = sorted((tmp_path / "ws" / "checkpoints").glob("*.safetensors"))[-1]
    arrays, meta = load_checkpoint(ckpt)
    del meta[TABLE]  # an earlier release's: read with the job's table
    old = save_checkpoint(tmp_path / "step-00000006.ckpt.npz", arrays, meta)
    job = tmp_path / "job.conf"
    job.write_text(JOB.format(ws=tmp_path / "ws", data=tmp_path / "ids.npz", backend="local",
                              steps=6, updater="type: kSGD"))
    for args in ([str(ckpt)], [str(old), "--job", str(job)]):
        out = tmp_path / "model.safetensors"
        assert main(["export", *args, "--to", str(out)]) == 0
        model = load_file(str(out))
        for name in ("emb_0", "fc_0", "fc_1"):
            np.testing.assert_array_equal(model[name], trainer.params[name].data)


def test_a_torch_table_trains_the_same_on_ray(ray_session: Any) -> None:
    from paramserver.torch import TorchCluster

    sgd = {"type": "kSGD", "learning_rate": {"base_lr": 0.1}}
    got = {}
    for backend in ("local", "ray"):
        model = torch_model(True)
        TorchCluster(model, {"nworkers_per_group": 2, "nservers_per_group": 2, "timeout": 60,
                             "backend": backend}, sgd).run(torch_loss, 3)
        got[backend] = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    for name, value in got["local"].items():
        np.testing.assert_array_equal(got["ray"][name], value)


def test_clip_norm_counts_the_tables_rows_across_the_servers() -> None:
    """clip_norm with a table: the servers' parts of the norm cover the rows pushed, so the
    run equals the dense one (plain SGD; clipped: the norm is well above 0.05)."""
    clip = {**SGD, "clip_norm": 0.05}
    conf = ClusterConf(nworkers_per_group=2, nservers_per_group=2, timeout=20)
    sparse = start(ParamSet(specs(), tables=True))
    dense = start(ParamSet(specs()))
    unclipped = start(ParamSet(specs()))
    with Cluster(conf, sparse, clip) as c:
        c.run(sparse_fn, 4)
    with Cluster(conf, dense, clip) as c:
        c.run(dense_fn, 4)
    with Cluster(conf, unclipped, SGD) as c:
        c.run(dense_fn, 4)
    for name in ("emb", "w", "b"):
        np.testing.assert_allclose(sparse[name].data, dense[name].data, rtol=1e-6, atol=1e-7)
    assert np.abs(unclipped["w"].data - dense["w"].data).max() > 1e-3
