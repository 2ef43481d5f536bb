"""bfloat16 values with a float32 master copy (``value_dtype: bfloat16``): the master is
exactly the float32 run, the values are its rounding to bfloat16 (what workers pull), and a
resumed run is the same run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from paramserver import ParamError, ParamSet, Updater, create_updater
from paramserver.config.components import updaters
from paramserver.numerics import kernels, quant
from test_quant import CONFS, JOB, OFFSETS, N


def bf16(x: np.ndarray) -> np.ndarray:
    return quant.bf16_decode(quant.bf16_encode(np.asarray(x, np.float32)))


def pair(method: str, state_dtype: str) -> tuple[Any, Any]:
    conf = {**CONFS[method], "state_dtype": state_dtype, "learning_rate": {"base_lr": 0.01}}
    return create_updater(conf), create_updater({**conf, "value_dtype": "bfloat16"})


def steps(plain: Any, mastered: Any, offsets: np.ndarray, n: int, count: int) -> tuple[
        np.ndarray, np.ndarray, Any, Any]:
    rng = np.random.default_rng(7)
    w = rng.standard_normal(n).astype(np.float32)
    wp, wm = bf16(w), w.copy()  # the master starts as the values' rounding
    sp, sm = plain.init_state(offsets, np.float32), mastered.init_state(offsets, np.float32)
    for step in range(count):
        g = rng.standard_normal(n).astype(np.float32)
        lr_scale = rng.uniform(0.5, 2, len(offsets) - 1)
        plain.apply(step, wp, g, sp, lr_scale, 1.0, 0.5)
        mastered.apply(step, wm, g, sm, lr_scale, 1.0, 0.5)
    return wp, wm, sp, sm


@pytest.mark.parametrize("method,state_dtype", [*((m, "float32") for m in CONFS),
                                                ("adam", "int8"), ("momentum", "bfloat16")])
def test_master_is_the_float32_run_and_values_its_rounding(method: str, state_dtype: str) -> None:
    plain, mastered = pair(method, state_dtype)
    assert mastered.roles[-1].name == "master" and mastered.roles[-1].dtype == "float32"
    wp, wm, sp, sm = steps(plain, mastered, OFFSETS, N, 4)
    np.testing.assert_array_equal(sm["master"], wp)
    np.testing.assert_array_equal(wm, bf16(wp))
    assert not np.array_equal(wm, wp)  # the values really are rounded
    for k in sp.names:
        np.testing.assert_array_equal(sm[k], sp[k])


def test_parallel_kernel_with_master() -> None:
    n = 3 * kernels.CHUNK + 1000
    offsets = np.array([0, 17, kernels.CHUNK + 5, n], np.int64)
    plain, mastered = pair("adam", "int8")
    wp, wm, _, sm = steps(plain, mastered, offsets, n, 2)
    np.testing.assert_array_equal(sm["master"], wp)
    np.testing.assert_array_equal(wm, bf16(wp))


def test_a_user_method_updates_the_master() -> None:
    @updaters.register("kTestMasterUser")
    class Mine(Updater):
        def rule(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
                 lr: float) -> None:
            w -= lr * g

    try:
        up = create_updater({"type": "kTestMasterUser", "value_dtype": "bfloat16",
                             "learning_rate": {"base_lr": 0.001}})
        ref = create_updater({"type": "kSGD", "learning_rate": {"base_lr": 0.001}})
        w = np.linspace(-1, 1, 100, dtype=np.float32)
        wr = bf16(w)
        s, sr = up.init_state([0, 100], np.float32), ref.init_state([0, 100], np.float32)
        for step in range(3):
            g = np.full(100, 0.3, np.float32)
            up.apply(step, w, g, s)
            ref.apply(step, wr, g, sr)
        np.testing.assert_array_equal(s["master"], wr)
        np.testing.assert_array_equal(w, bf16(wr))
    finally:
        updaters.remove("kTestMasterUser")


def test_params_adopt_on_first_use_and_checkpoint_the_master() -> None:
    specs = [("a", (3, 100)), ("b", (7,))]
    params = ParamSet(specs)
    rng = np.random.default_rng(2)
    params.values[:] = rng.standard_normal(params.values.size)
    first = params.values.copy()
    up = create_updater({"type": "kAdam", "value_dtype": "bfloat16", "state_dtype": "int8",
                         "learning_rate": {"base_lr": 0.01}})
    params.grads[:] = rng.standard_normal(params.values.size)
    up.update_params(0, params)
    state = params.updater_state
    assert state is not None
    np.testing.assert_array_equal(params.values, bf16(state["master"]))
    exported = state.export([p.name for p in params.owners])
    assert exported["a/master"].dtype == np.float32 and exported["a/master"].size == 300
    assert not np.array_equal(exported["a/master"], first[:300])


def test_configuration_is_checked() -> None:
    with pytest.raises(ParamError, match=r"'float16', valid values are: "
                                         r"\{'bfloat16', 'float32'\}"):
        create_updater("type: kAdam value_dtype: float16")
    up = create_updater("type: kAdam value_dtype: bfloat16")
    with pytest.raises(ParamError, match=r"value_dtype bfloat16 .* is for float32 Params"):
        up.init_state([0, 4], np.float64)
    w = np.zeros(10, np.float32)
    with pytest.raises(ParamError, match="must not overlap"):
        kernels.sgd(w, w.copy(), w[:0], [0, 10], 0.1, bf16_values=w)
    with pytest.raises(ParamError, match=r"bf16_values .* must be float32"):
        kernels.sgd(w, w.copy(), w[:0], [0, 10], 0.1, bf16_values=np.zeros(10))


def test_one_server_group_only() -> None:
    from paramserver.cluster.layout import plan_servers
    from paramserver.cluster.server import Server
    from paramserver.config.job import ClusterConf

    (layout,) = plan_servers(ParamSet([("a", (10,))]), 1)
    up = create_updater("type: kSGD value_dtype: bfloat16")
    with pytest.raises(ParamError, match=r"needs cluster\.nserver_groups 1, not 2"):
        Server(layout, up, ClusterConf(nserver_groups=2, nworker_groups=2))


def test_a_server_says_its_values_are_bfloat16() -> None:
    """Its replies mark the values as bfloat16 numbers, so that between processes they
    travel in 2 bytes (paramserver.cluster.ray_wire); without a master they are float32."""
    from paramserver.cluster.layout import plan_servers
    from paramserver.cluster.messages import Get, Put, Values
    from paramserver.cluster.server import Server
    from paramserver.config.job import ClusterConf

    ps = ParamSet([("a", (10,))])
    ps.values[:] = np.linspace(-1, 1, 10)
    (layout,) = plan_servers(ps, 1)
    for conf, expected in (("type: kSGD value_dtype: bfloat16", True), ("type: kSGD", False)):
        server = Server(layout, create_updater(conf), ClusterConf())
        replies: list[Any] = []
        server.handle(Put(ps.values.copy(), np.ones(1, np.int64), 0), replies.append)
        server.handle(Get(0, 0, 0), replies.append)
        assert isinstance(replies[-1], Values) and replies[-1].bfloat16 is expected
        if expected:
            np.testing.assert_array_equal(replies[-1].values, bf16(replies[-1].values))


def test_training_pulls_the_masters_rounding_and_resumes_exactly(tmp_path: Any) -> None:
    from paramserver.checkpoint import checkpoint_name, load_checkpoint
    from paramserver.config.job import parse_job
    from paramserver.train.trainer import Trainer

    state = "value_dtype: bfloat16 state_dtype: bfloat16"

    def job(ws: Any, steps: int) -> Any:
        return parse_job(JOB.format(steps=steps, ws=ws, state=state))

    straight = Trainer(job(tmp_path / "a", 40), progress=False)
    straight.train()
    Trainer(job(tmp_path / "b", 20), progress=False).train()
    second = Trainer(job(tmp_path / "b", 40), progress=False)
    second.train(resume=True)
    assert np.array_equal(straight.params.values, second.params.values)
    a, _ = load_checkpoint(tmp_path / "a" / "checkpoints" / checkpoint_name(40))
    b, _ = load_checkpoint(tmp_path / "b" / "checkpoints" / checkpoint_name(40))
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    # What the workers hold (pulled) is the rounding of the servers' float32 masters.
    values = straight.params.values
    np.testing.assert_array_equal(values, bf16(values))
    servers = [k[:-len("values")] for k in a if k.endswith("/values")]
    assert len(servers) == 2
    for prefix in servers:
        masters = [a[k] for k in a if k.startswith(prefix + "state/") and k.endswith("/master")]
        assert masters and all(m.dtype == np.float32 for m in masters)
        master = np.concatenate(masters)
        assert not np.array_equal(master, bf16(master))
        np.testing.assert_array_equal(np.sort(a[prefix + "values"]), np.sort(bf16(master)))


def test_torch_optimizer_keeps_the_master_and_resumes_exactly() -> None:
    torch = pytest.importorskip("torch")
    import paramserver.torch as pst

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Linear(30, 3))
        opt = pst.Optimizer(model.named_parameters(), "type: kAdam value_dtype: bfloat16 "
                            "state_dtype: int8 learning_rate { base_lr: 0.01 }")
        return model, opt

    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(1))

    def step(model: Any, opt: Any) -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    model, opt = make()
    for _ in range(3):
        step(model, opt)
    saved = opt.state_dict()
    w = model[0].weight.detach().numpy().ravel()
    master = saved["state"][0]["master"].numpy().ravel()
    assert saved["state"][0]["master"].dtype == torch.float32
    np.testing.assert_array_equal(w, bf16(master))
    model2, opt2 = make()
    with torch.no_grad():
        for p, q in zip(model2.parameters(), model.parameters()):
            p.copy_(q)
    opt2.load_state_dict(saved)
    step(model, opt)
    step(model2, opt2)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_row_sparse_updates_refuse_a_master_copy() -> None:
    up = create_updater("type: kAdam value_dtype: bfloat16")
    state = up.init_state([0, 8], np.float32)
    w = np.zeros(8, np.float32)
    with pytest.raises(ParamError, match="row-sparse updates do not keep a float32 master"):
        up.apply_rows(0, w, np.array([1]), np.ones((1, 2), np.float32), 2, state)
    assert not w.any() and not state.counts.any()
