"""The net: building from a job, Params, training steps, determinism, data and workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.config.job import NetConf, parse_job
from paramserver.params import ParamSet
from paramserver.train.data import Batch, load_dataset, split_indices
from paramserver.train.net import Net
from paramserver.updaters import create_updater

MLP = """
  layer { name: "data" type: kData data_conf { batchsize: 32 } }
  layer { name: "fc1" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 16 }
          param { name: "w1" init { type: kUniformSqrtFanIn } }
          param { name: "b1" init { type: kConstant value: 0 } } }
  layer { name: "act" type: kSTanh srclayers: "fc1" }
  layer { name: "fc2" type: kInnerProduct srclayers: "act" innerproduct_conf { num_output: 10 } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc2" }
"""


def net_conf(layers: str = MLP) -> NetConf:
    return parse_job(f"train_steps: 1\nneuralnet {{ {layers} }}", "job.conf").neuralnet


def mlp(seed: int = 1, dtype: Any = np.float32, layers: str = MLP) -> tuple[Net, ParamSet]:
    net = Net(net_conf(layers), seed, dtype)
    return net, net.make_params()


def sgd(lr: float = 0.5) -> Any:
    return create_updater({"type": "kSGD", "learning_rate": {"base_lr": lr}})


def train(net: Net, pset: ParamSet, steps: int, lr: float = 0.5) -> list[float]:
    updater = sgd(lr)
    losses = []
    for step in range(steps):
        losses.append(net.train_step(step)["loss"])
        updater.update_params(step, pset)
    return losses


# -- building -------------------------------------------------------------------------------

def test_params_are_named_and_placed() -> None:
    net = Net(net_conf(), seed=0)
    specs = net.param_specs()
    assert [(s.name, s.shape) for s in specs] == [
        ("w1", (16, 64)), ("b1", (16,)), ("fc2_0", (10, 16)), ("fc2_1", (10,))]
    assert [s.place for s in specs] == [
        "layer 'fc1', param 0", "layer 'fc1', param 1", "layer 'fc2', param 0",
        "layer 'fc2', param 1"]
    assert specs[0].conf.init.type == "kUniformSqrtFanIn"
    assert specs[2].conf.name == "fc2_0" and specs[2].conf.init.type == "kUniformSqrtFanInOut"
    assert specs[3].conf.init.type == "kConstant" and specs[3].conf.init.value == 0
    assert [layer.out_shape for layer in net.layers] == [(64,), (16,), (16,), (10,), (10,)]
    assert net["fc1"].type == "kInnerProduct"


def test_net_from_a_dict() -> None:
    net = Net({"layer": [
        {"name": "data", "type": "data", "batchsize": 8},
        {"name": "fc", "type": "fc", "srclayers": ["data"], "num_output": 10},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
    ]})
    assert [layer.type for layer in net.layers] == ["kData", "kInnerProduct", "kSoftmaxLoss"]


@pytest.mark.parametrize(("layers", "message"), [
    ('layer { name: "a" type: kReLU srclayers: "b" } layer { name: "b" type: kReLU }',
     "layer 'a' reads 'b', which comes later; list every layer after the layers it reads"),
    ('layer { name: "a" type: kReLU srclayers: "a" }', "layer 'a' reads itself"),
    ('layer { name: "data" type: kData } layer { name: "fc" type: kInnerProduct '
     'innerproduct_conf { num_output: 10 } srclayers: "data" }',
     "a net needs a loss layer (kSoftmaxLoss, kEuclideanLoss, ...) in phase kTrain to train "
     "by kBP; found none"),
    ('layer { name: "d1" type: kData } layer { name: "d2" type: kData }'
     'layer { name: "fc" type: kInnerProduct innerproduct_conf { num_output: 10 } '
     'srclayers: "d1" } layer { name: "loss" type: kSoftmaxLoss srclayers: ["fc", "d1"] }',
     "a net needs exactly one input layer (kData, kRecordInput, kShardData, kCSVInput, "
     "kCharRNN, ...); found 2: 'd1', 'd2' in phase kTrain"),
])
def test_structure_errors(layers: str, message: str) -> None:
    with pytest.raises(ParamError) as info:
        Net(net_conf(layers)).check_trainable()
    assert message in str(info.value)


def test_unknown_source_is_refused_with_its_place() -> None:
    with pytest.raises(ParamError, match=r"job.conf:\d+:\d+: layer 'fc1' reads unknown layer "
                                         "'dta'"):
        net_conf(MLP.replace('srclayers: "data"', 'srclayers: "dta"'))


def test_shapes_that_do_not_fit_name_the_layer() -> None:
    with pytest.raises(ParamError, match=r"layer 'loss' \(kSoftmaxLoss\): the labels of 'data' "
                                         r"go up to 9 \(10 classes\) but srclayer 'fc2' gives "
                                         r"5 scores"):
        Net(net_conf(MLP.replace("num_output: 10", "num_output: 5")))


def test_too_many_param_entries() -> None:
    layers = MLP.replace('layer { name: "act" type: kSTanh srclayers: "fc1" }',
                         'layer { name: "act" type: kSTanh srclayers: "fc1" param { } }')
    with pytest.raises(ParamError, match=r"layer 'act' \(kSTanh\): has 0 Params but 1 param"):
        Net(net_conf(layers))


def test_excluded_layers() -> None:
    extra = 'layer { name: "drop" type: kDropout srclayers: "act" exclude: kTest }'
    net = Net(net_conf(MLP.replace('layer { name: "fc2"', extra + ' layer { name: "fc2"')
                       .replace('srclayers: "act" innerproduct_conf { num_output: 10 }',
                                'srclayers: "act" innerproduct_conf { num_output: 10 }'))
              , 0)
    assert "drop" in [x.name for x in net.phase_layers("kTrain")]
    assert "drop" not in [x.name for x in net.phase_layers("test")]
    # fc2 reads the dropout layer, which does not run in tests
    bad = MLP.replace('layer { name: "fc2" type: kInnerProduct srclayers: "act"',
                      extra + ' layer { name: "fc2" type: kInnerProduct srclayers: "drop"')
    with pytest.raises(ParamError, match="layer 'fc2' reads 'drop', which is excluded from "
                                         "kTest; exclude 'fc2' too"):
        Net(net_conf(bad))


def test_train_step_needs_params() -> None:
    net = Net(net_conf())
    with pytest.raises(ParamError, match="call bind"):
        net.train_step(0)
    with pytest.raises(ParamError, match="ParamSet is float64 but the net computes in float32"):
        net.bind(ParamSet(net.param_specs(), np.float64))


# -- training -------------------------------------------------------------------------------

def test_loss_decreases_with_plain_sgd() -> None:
    net, pset = mlp()
    before = net.evaluate()
    losses = train(net, pset, 50)
    after = net.evaluate()
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])
    assert after["loss"] < 0.5 * before["loss"]
    assert after["accuracy"] > 0.8 > before["accuracy"]
    assert all(p.version == 50 for p in pset.owners)


def test_same_seed_same_bits() -> None:
    dropout = MLP.replace('layer { name: "fc2" type: kInnerProduct srclayers: "act"',
                          'layer { name: "drop" type: kDropout srclayers: "act" } '
                          'layer { name: "fc2" type: kInnerProduct srclayers: "drop"')
    runs = []
    for _ in range(2):
        net, pset = mlp(seed=5, layers=dropout)
        runs.append((train(net, pset, 10), pset.values.copy(), net.evaluate()))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]
    net, pset = mlp(seed=6, layers=dropout)
    assert train(net, pset, 10) != runs[0][0]


def test_gradients_of_the_whole_net() -> None:
    """train_step's gradients against central differences of the loss (float64)."""
    layers = MLP.replace("num_output: 16", "num_output: 3").replace("batchsize: 32",
                                                                    "batchsize: 4")
    net, pset = mlp(dtype=np.float64, layers=layers)
    batch = net.batch(3)
    net.train_step(batch)
    grads = pset.grads.copy()
    rng = np.random.default_rng(0)
    for i in rng.choice(pset.values.size, 25, replace=False):
        old = pset.values[i]
        pset.values[i] = old + 1e-6
        hi = net.forward(batch)["loss"]
        pset.values[i] = old - 1e-6
        lo = net.forward(batch)["loss"]
        pset.values[i] = old
        assert grads[i] == pytest.approx((hi - lo) / 2e-6, rel=1e-5, abs=1e-9)


def test_shared_weights_keep_their_own_gradients() -> None:
    # tied weights: fc2 computes h · W with fc1's W (16, 64) stored as (num_input, num_output)
    layers = """
      layer { name: "data" type: kData data_conf { batchsize: 8 } }
      layer { name: "fc1" type: kInnerProduct srclayers: "data"
              innerproduct_conf { num_output: 16 } param { name: "w" } }
      layer { name: "fc2" type: kInnerProduct srclayers: "fc1"
              innerproduct_conf { num_output: 64 transpose: true }
              param { name: "wt" share_from: "w" } }
      layer { name: "fc3" type: kInnerProduct srclayers: "fc2"
              innerproduct_conf { num_output: 10 } }
      layer { name: "loss" type: kSoftmaxLoss srclayers: "fc3" }
    """
    net, pset = mlp(layers=layers)
    assert pset["wt"].shape == pset["w"].shape == (16, 64) and pset["wt"].owner is pset["w"]
    assert net["fc2"].params[0].data.base is not None
    np.testing.assert_array_equal(pset["wt"].data, pset["w"].data)
    net.train_step(0)
    assert np.any(pset["w"].grad != 0) and np.any(pset["wt"].grad != 0)
    assert not np.allclose(pset["w"].grad, pset["wt"].grad)


def test_train_step_zeroes_gradients_first() -> None:
    net, pset = mlp()
    net.train_step(0)
    first = pset.grads.copy()
    net.train_step(0)
    np.testing.assert_array_equal(pset.grads, first)
    net.train_step(0, zero_grads=False)
    np.testing.assert_allclose(pset.grads, 2 * first, rtol=1e-6, atol=1e-9)


def test_gradients_written_whole_are_the_added_ones_and_never_stale(tmp_path: Path) -> None:
    # A step that zeroes first lets the only writer of a gradient write it (no zeroing
    # pass); a layer no gradient reaches ("side") must still end the step with zeros.
    # (Params that several layers add into, unrolled copies', are
    # test_rnn.py::test_bptt_against_a_plain_pytorch_reference.)
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "img.npz", x=rng.standard_normal((16, 2, 6, 6)).astype(np.float32),
             y=np.arange(16) % 4)
    net = npz_net(tmp_path / "img.npz", """
        layer { name: "conv" type: kConvolution srclayers: "data"
                convolution_conf { num_filters: 3 kernel: 3 } }
        layer { name: "fc1" type: kInnerProduct srclayers: "conv"
                innerproduct_conf { num_output: 8 } param { name: "w" } }
        layer { name: "act" type: kSTanh srclayers: "fc1" }
        layer { name: "side" type: kInnerProduct srclayers: "act"
                innerproduct_conf { num_output: 5 } }
        layer { name: "fc2" type: kInnerProduct srclayers: "act"
                innerproduct_conf { num_output: 4 } }
        layer { name: "loss" type: kSoftmaxLoss srclayers: "fc2" }""")
    pset = net.make_params()
    assert [x.name for x in net._net("kTrain").fresh] == ["conv", "fc1", "side", "fc2"]
    pset.zero_grads()
    net.train_step(0, zero_grads=False)  # every gradient added into zeros
    added = pset.grads.copy()
    pset.grads.fill(np.nan)  # what an earlier step left, at its worst
    net.train_step(0)
    np.testing.assert_array_equal(pset.grads, added)
    assert not pset["side_0"].grad.any() and not pset["side_1"].grad.any()
    assert pset["w"].grad.any() and pset["conv_0"].grad.any()
    assert not any(x.fresh_grads for x in net.layers)
    # a failed backward pass leaves no stale gradient behind either
    pset.grads.fill(np.nan)
    fc2 = net["fc2"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fc2, "backward", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            net.train_step(0)
    for name in ("w", "conv_0", "side_0", "fc2_0"):
        assert not np.isnan(pset[name].grad).any(), name
    assert not any(x.fresh_grads for x in net.layers)


def test_only_writers_of_a_whole_gradient_skip_its_zeroing() -> None:
    pset = ParamSet([("a", (3,)), ("b", (2, 2)), ("c", (4,)), ("d", (3,), {"share_from": "a"})])
    pset.grads.fill(7)
    pset.zero_grads(keep=[pset["c"], pset["a"]])
    assert pset["a"].grad.tolist() == [7, 7, 7] and pset["c"].grad.tolist() == [7] * 4
    assert not pset["b"].grad.any() and not pset["d"].grad.any()
    other = ParamSet([("a", (3,))])
    with pytest.raises(ParamError, match="'a' is not a dense Param of this ParamSet"):
        pset.zero_grads(keep=[other["a"]])


def test_evaluate_whole_split_or_some_batches() -> None:
    net, _ = mlp()
    assert net.dataset.num_test == 359 and net.dataset.num_train == 1438
    whole = net.evaluate()
    first = net.evaluate(steps=1)
    manual = net.forward(next(net.dataset.test_batches(32)), "test")
    assert first == pytest.approx(manual)
    assert whole != first
    assert net.evaluate(batchsize=359) == pytest.approx(whole)


# -- data -----------------------------------------------------------------------------------

def test_batches_cover_each_epoch_in_a_new_order() -> None:
    net, _ = mlp()
    per_epoch = net.steps_per_epoch
    assert per_epoch == 1438 // 32
    x = net.dataset.x_train

    def rows(step: int) -> list[int]:
        b = net.batch(step)
        return [int(np.flatnonzero((x == r).all(axis=1))[0]) for r in b.x]

    # digits has duplicate images; map each batch row to its first match in the split
    epoch0 = [i for s in range(per_epoch) for i in rows(s)]
    assert len(epoch0) == per_epoch * 32
    assert net.batch(per_epoch).epoch == 1 and net.batch(per_epoch - 1).epoch == 0
    assert rows(per_epoch) != rows(0)


def test_worker_shards_are_disjoint_and_make_the_batch() -> None:
    net, _ = mlp()
    whole = net.batch(7)
    for workers in (1, 2, 3, 4):
        shards = [net.batch(7, rank, workers) for rank in range(workers)]
        np.testing.assert_array_equal(np.concatenate([s.x for s in shards]), whole.x)
        np.testing.assert_array_equal(np.concatenate([s.y for s in shards]), whole.y)
        assert [s.size for s in shards] == [len(a) for a in np.array_split(range(32), workers)]
        assert all(s.global_size == 32 and s.num_workers == workers for s in shards)
    with pytest.raises(ParamError, match=r"worker rank 4 is not in \[0, 4\)"):
        net.batch(0, 4, 4)
    with pytest.raises(ParamError, match="batchsize 32 is smaller than the number of workers"):
        net.batch(0, 0, 33)


def test_workers_gradients_average_to_the_whole_batch() -> None:
    """Each worker its own Net and ParamSet replica; equal shards average to one batch."""
    nets = [mlp(seed=2, dtype=np.float64) for _ in range(5)]
    single, single_pset = nets[0]
    single.train_step(single.batch(4))
    grads = []
    for rank, (net, pset) in enumerate(nets[1:]):
        np.testing.assert_array_equal(pset.values, single_pset.values)
        net.train_step(net.batch(4, rank, 4))
        grads.append(pset.grads.copy())
    np.testing.assert_allclose(np.mean(grads, axis=0), single_pset.grads, rtol=1e-10,
                               atol=1e-14)


def test_split_is_deterministic_and_disjoint() -> None:
    train, test = split_indices(100, 0.25, seed=3)
    assert len(test) == 25 and len(train) == 75
    assert not set(train) & set(test) and set(train) | set(test) == set(range(100))
    again = split_indices(100, 0.25, seed=3)
    np.testing.assert_array_equal(again[1], test)
    assert not np.array_equal(split_indices(100, 0.25, seed=4)[1], test)
    assert len(split_indices(10, 0.01, seed=0)[1]) == 1  # at least one test sample


def test_split_seed_overrides_the_job_seed() -> None:
    fixed = MLP.replace("batchsize: 32", "batchsize: 32 split_seed: 9")
    a, b = Net(net_conf(fixed), 1), Net(net_conf(fixed), 2)
    np.testing.assert_array_equal(a.dataset.y_test, b.dataset.y_test)
    np.testing.assert_array_equal(a.dataset.x_test, b.dataset.x_test)
    c, d = Net(net_conf(), 1), Net(net_conf(), 2)
    assert not np.array_equal(c.dataset.x_test, d.dataset.x_test)


def test_digits_are_normalised() -> None:
    ds = load_dataset("digits", split_seed=0)
    assert ds.x_train.dtype == np.float32 and ds.x_train.max() == 1.0 and ds.x_train.min() == 0
    raw = load_dataset("digits", split_seed=0, normalize=False)
    assert raw.x_train.max() == 16.0
    assert ds.num_classes == 10 and ds.sample_shape == (64,)
    assert load_dataset("digits", split_seed=0) is ds  # loaded once for every worker


def npz_net(path: Path, layers: str = "", **data_conf: Any) -> Net:
    conf = " ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}"
                    for k, v in data_conf.items())
    return Net(net_conf(f"""
        layer {{ name: "data" type: kData data_conf {{ source: "{path}" batchsize: 4 {conf} }} }}
        {layers or '''layer { name: "fc" type: kInnerProduct srclayers: "data"
                             innerproduct_conf { num_output: 3 } }
                     layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" }'''}"""))


def test_npz_data_with_its_own_test_split(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(path, features=rng.standard_normal((20, 5)), labels=np.arange(20) % 3,
             x_test=rng.standard_normal((6, 5)), y_test=np.arange(6) % 3)
    net = npz_net(path, x_key="features", y_key="labels")
    assert (net.dataset.num_train, net.dataset.num_test) == (20, 6)
    assert net.dataset.x_train.dtype == np.float32
    net.make_params()
    assert set(net.evaluate()) == {"loss", "accuracy"}


def test_relative_data_paths_start_at_base_dir(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 2)), y=np.arange(8) % 3)
    net = Net(net_conf("""
        layer { name: "data" type: kData data_conf { source: "d.npz" batchsize: 2 } }
        layer { name: "fc" type: kInnerProduct srclayers: "data"
                innerproduct_conf { num_output: 3 } }
        layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" }"""), base_dir=tmp_path)
    assert net.dataset.num_train + net.dataset.num_test == 8


def test_embedding_net_learns(tmp_path: Path) -> None:
    # the label is whether id 1 occurs among a sample's 4 ids
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, (400, 4))
    y = (x == 1).any(axis=1).astype(np.int64)
    path = tmp_path / "ids.npz"
    np.savez(path, x=x, y=y)
    net = npz_net(path, """
        layer { name: "emb" type: kEmbedding srclayers: "data"
                embedding_conf { vocab_size: 6 feature_dim: 3 } }
        layer { name: "fc" type: kInnerProduct srclayers: "emb"
                innerproduct_conf { num_output: 2 } }
        layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" }""")
    assert net.data_layer.int_output and net["emb"].out_shape == (4, 3)
    pset = net.make_params()
    losses = train(net, pset, 150, lr=0.2)
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20])
    assert net.evaluate()["accuracy"] > 0.8


@pytest.mark.parametrize(("content", "message"), [
    (None, "data file '{path}' does not exist"),
    (b"not a zip file", "data file '{path}' cannot be read as an .npz file"),
    ("npy", "data file '{path}' holds a single array (.npy)"),
    ({"x": np.zeros((4, 2))}, "data file '{path}' has no array 'y'; it holds: 'x'"),
    ({"x": np.zeros((4, 2)), "y": np.array([0, 1, 0])},
     "data file '{path}': 'x' has 4 samples but 'y' 3 labels"),
    ({"x": np.zeros((4, 2)), "y": np.array([0.5, 1, 0, 1])},
     "data file '{path}': 'y' must hold whole class labels"),
    ({"x": np.zeros((4, 2)), "y": np.array([0, -1, 0, 1])},
     "data file '{path}': 'y' holds a negative label (-1)"),
    ({"x": np.array([[np.nan, 0]] * 4), "y": np.zeros(4, int)},
     "data file '{path}': 'x' holds NaN or infinite values"),
    ({"x": np.array(["a", "b", "c", "d"]), "y": np.zeros(4, int)},
     "data file '{path}': 'x' must hold numbers, not <U1"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4, int), "x_test": np.zeros((2, 2))},
     "data file '{path}' has 'x_test' but no 'y_test'"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4, int), "x_test": np.zeros((2, 3)),
      "y_test": np.zeros(2, int)},
     "data file '{path}': samples of 'x_test' have shape (3,) but those of 'x' (2,)"),
])
def test_bad_data_files(tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "bad.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    elif isinstance(content, dict):
        np.savez(path, **content)
    with pytest.raises(ParamError) as info:
        npz_net(path)
    assert str(info.value).startswith("layer 'data' (kData): " + message.format(path=path))


def test_object_arrays_are_not_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([{"a": 1}, None], dtype=object), y=np.array([0, 1]))
    with pytest.raises(ParamError, match=r"array 'x' holds Python objects, which are not read "
                                         r"\(allow_pickle=False\)"):
        npz_net(path)


def test_no_test_split(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((8, 2)), y=np.arange(8) % 3)
    net = npz_net(path, test_fraction=0)
    net.make_params()
    with pytest.raises(ParamError, match="there is no test split"):
        net.evaluate()


def test_a_hand_made_batch(tmp_path: Path) -> None:
    net, _ = mlp()
    batch = Batch(np.zeros((3, 64), np.float32), np.array([0, 1, 2]), step=0)
    metrics = net.train_step(batch)
    assert metrics["loss"] > 0 and 0 <= metrics["accuracy"] <= 1
