"""paramserver.torch on the cluster: module replicas per worker, BSP means, job files."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError  # noqa: E402

F = torch.nn.functional
UPDATER = "type: kSGD momentum: 0.9 weight_decay: 0.001 learning_rate { base_lr: 0.1 }"
BATCH = 12


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3)
        self.fc = torch.nn.Linear(3 * 6 * 6, 10)

    def forward(self, x: Any) -> Any:
        return self.fc(F.relu(self.conv(x)).flatten(1))


def make_net() -> Net:
    torch.manual_seed(0)
    return Net().double()


def data(step: int) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(step)
    return (torch.randn(BATCH, 1, 8, 8, generator=g, dtype=torch.float64),
            torch.randint(0, 10, (BATCH,), generator=g))


def shard_loss(model: Any, step: int, rank: int, num_workers: int) -> Any:
    """The mean loss over this worker's equal share of the step's batch."""
    x, y = data(step)
    k = BATCH // num_workers
    return F.cross_entropy(model(x[rank * k:(rank + 1) * k]), y[rank * k:(rank + 1) * k])


def mean_of_halves(model: Any, step: int) -> None:
    """One worker's gradient: the mean of the two halves' gradients, in the order and
    rounding the servers use (sum in worker order, then × 1/2)."""
    model.zero_grad(set_to_none=False)
    shard_loss(model, step, 0, 2).backward()
    shard_loss(model, step, 1, 2).backward()
    for p in model.parameters():
        p.grad.mul_(0.5)


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_two_synchronous_workers_equal_one_worker_with_the_mean_gradient() -> None:
    two = make_net()
    tc2 = pst.TorchCluster(two, {"nworkers_per_group": 2}, UPDATER)
    metrics = tc2.run(shard_loss, 6)
    assert len(metrics) == 6 and all(set(m) == {"loss"} for m in metrics[-1] if m)
    assert tc2.step == 6 and tc2.cluster.params.owners[0].version == 6

    one = make_net()
    tc1 = pst.TorchCluster(one, {"nworkers_per_group": 1}, UPDATER)

    def grad_fn(worker: Any, step: int) -> None:
        mean_of_halves(tc1.replica(worker.rank), step)

    tc1.cluster.run(grad_fn, 6)
    assert params_equal(one, two)  # bit for bit
    assert not params_equal(one, make_net())

    # and the Optimizer in one process, from the same mean gradient, agrees too
    solo = make_net()
    opt = pst.Optimizer(solo.parameters(), UPDATER)
    for step in range(6):
        mean_of_halves(solo, step)
        opt.step()
    assert params_equal(solo, two)


def test_replicas_view_the_servers_values_and_own_their_gradients() -> None:
    model = make_net()
    tc = pst.TorchCluster(model, {"nworkers_per_group": 2}, UPDATER)
    r0, r1 = tc.replica(0), tc.replica(1)
    assert r0 is not r1 and r0 is not model
    assert r0.fc.weight.data_ptr() == model.fc.weight.data_ptr() == r1.fc.weight.data_ptr()
    assert r0.fc.weight.grad.data_ptr() != r1.fc.weight.grad.data_ptr()
    before = model.fc.weight.detach().clone()
    tc.run(shard_loss, 2)
    assert not torch.equal(model.fc.weight, before)  # the module is the trained model
    assert torch.equal(r0.fc.weight, model.fc.weight)


def test_train_on_cluster_from_a_job_file(tmp_path: Any) -> None:
    path = tmp_path / "job.conf"
    path.write_text("""
        name: "torch-job"
        train_steps: 3
        seed: 4
        updater { type: kSGD momentum: 0.9 learning_rate { base_lr: 0.05 } }
        cluster { nworkers_per_group: 2 nservers_per_group: 2 }
        param { name: "*.bias" lr_scale: 0 }
        param { name: "fc.weight" init { type: kGaussian std: 0.01 } }
    """)
    job = pst.load_job(path)
    assert job.conf.train_steps == 3 and [r.pattern for r in job.params] == ["*.bias",
                                                                             "fc.weight"]
    model = make_net()
    bias = model.conv.bias.detach().clone()
    seen: list[int] = []
    metrics = pst.train_on_cluster(model, shard_loss, path,
                                   on_step=lambda step, m: seen.append(step))
    assert len(metrics) == 3 and seen == [0, 1, 2]
    assert torch.equal(model.conv.bias, bias)  # lr_scale 0
    assert float(model.fc.weight.detach().std()) < 0.05  # initialised by the rule


def test_job_errors_name_the_place() -> None:
    with pytest.raises(ParamError, match=r"<job>:1:\d+.*nworkers_per_grop"):
        pst.TorchCluster(make_net(), "train_steps: 1 cluster { nworkers_per_grop: 2 }")


def test_cluster_state_round_trip_continues_bit_for_bit() -> None:
    a = make_net()
    tca = pst.TorchCluster(a, {"nworkers_per_group": 2}, UPDATER)
    tca.run(shard_loss, 2)
    state = {k: v.copy() for k, v in tca.state_dict().items()}
    tca.run(shard_loss, 2)

    b = make_net()
    tcb = pst.TorchCluster(b, {"nworkers_per_group": 2}, UPDATER)
    tcb.load_state_dict(state)
    assert tcb.step == 2
    tcb.run(shard_loss, 2)
    assert params_equal(a, b)


def test_the_grad_function_travels_and_builds_its_replica_where_it_runs() -> None:
    """What a backend with workers in other processes (Ray) relies on: the grad function
    pickles without its replicas and binds a fresh one to the worker's ParamSet there."""
    import pickle
    from types import SimpleNamespace

    from paramserver.torch._cluster import _GradFn

    model = make_net()
    tp = pst.bind(model)
    fn = pickle.loads(pickle.dumps(_GradFn(model, shard_loss, 2)))
    worker = SimpleNamespace(params=tp.pset.replica(tp.pset.values.copy()), rank=1)
    metrics = fn(worker, 0)
    assert set(metrics) == {"loss"}
    module = fn.replicas[1][0]
    assert module is not model
    assert module.fc.weight.data_ptr() == worker.params["fc.weight"].data.ctypes.data
    expected = make_net()
    shard_loss(expected, 0, 1, 2).backward()
    assert torch.equal(torch.from_numpy(worker.params["fc.weight"].grad), expected.fc.weight.grad)


class Halves(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 3)


def halves_loss(model: Any, step: int, rank: int, num_workers: int) -> Any:
    """Both halves at steps 0 and 1; then only a, but worker 1 at step 3 uses b too."""
    g = torch.Generator().manual_seed(10 * step + rank)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    out = model.a(x)
    if step < 2 or (step == 3 and rank == 1):
        out = out + model.b(x)
    return (out ** 2).mean()


def test_a_parameter_no_worker_gives_a_gradient_stays_put_on_the_cluster() -> None:
    torch.manual_seed(0)
    model = Halves().double()
    updater = "type: kAdamW weight_decay: 0.1 learning_rate { base_lr: 0.1 }"
    tc = pst.TorchCluster(model, {"nworkers_per_group": 2, "nservers_per_group": 2}, updater)
    tc.run(halves_loss, 2)
    b = [p.detach().clone() for p in model.b.parameters()]
    tc.run(halves_loss, 1)  # step 2: nobody uses b
    assert all(torch.equal(p, q) for p, q in zip(model.b.parameters(), b, strict=True))
    tc.run(halves_loss, 2)  # step 3: worker 1 uses b (the mean with worker 0's none); 4: idle
    assert not torch.equal(model.b.weight, b[0])

    # the same as the optimizer in one process, whose b gets .grad None at steps 2 and 4
    torch.manual_seed(0)
    solo = Halves().double()
    opt = pst.Optimizer(solo.parameters(), updater)
    for step in range(5):
        opt.zero_grad()
        for rank in range(2):
            halves_loss(solo, step, rank, 2).backward()
        for p in solo.parameters():
            if p.grad is not None:
                p.grad.mul_(0.5)
        opt.step()
    assert params_equal(solo, model)  # bit for bit
    counts = {k: int(v.reshape(-1)[0]) for k, v in tc.state_dict().items()
              if k.endswith("/count") and ".weight" in k}
    assert counts == {k: 3 if "/b.weight/" in k else 5 for k in counts} and counts
