"""Layers: values, gradients against central differences, shape checks, configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError
from paramserver.config.components import layers
from paramserver.config.job import LayerConf, parse_job
from paramserver.params import Param
from paramserver.train.data import Batch
from paramserver.train.layers import (
    DataLayer,
    DropoutLayer,
    EmbeddingLayer,
    InnerProductLayer,
    Layer,
    SoftmaxLossLayer,
)

F64 = np.float64


class Source(Layer):
    """A layer whose output is set by the test."""

    min_srcs = 0
    max_srcs = 0

    def __init__(self, data: np.ndarray, name: str = "src", *, needs_grad: bool = True):
        super().__init__(LayerConf.parse({"name": name, "type": "kReLU"}), [],
                         dtype=data.dtype if data.dtype.kind == "f" else F64)
        self.data = data
        self.out_shape = tuple(data.shape[1:])
        self.int_output = data.dtype.kind in "iu"
        self.grad = np.zeros(data.shape, self.dtype) if needs_grad and not self.int_output \
            else None

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        pass


def make(type_: str, srcs: list[Layer], name: str = "l", *, params: bool = True,
         dtype: Any = F64, **own: Any) -> Layer:
    """A set-up layer of ``type_`` reading ``srcs``; its Params (if any) random."""
    conf = LayerConf.parse({"name": name, "type": type_,
                            "srclayers": [s.name for s in srcs], **own})
    layer: Layer = layers.get(type_)(conf, srcs, dtype=dtype)
    layer.setup()
    if params:
        rng = np.random.default_rng(7)
        ps = [Param(f"{name}_{i}", shape, dtype) for i, shape in
              enumerate(layer.param_shapes())]
        for p in ps:
            p.data[...] = rng.standard_normal(p.shape)
        layer.bind(ps)
    return layer


def data_layer(tmp_path: Path, x: np.ndarray, y: np.ndarray, name: str = "data",
               **own: Any) -> DataLayer:
    path = tmp_path / f"{name}.npz"
    np.savez(path, x=x, y=y)
    own.setdefault("batchsize", 2)
    own.setdefault("test_fraction", 0.0)
    layer = make("kData", [], name, source=str(path), **own)
    assert isinstance(layer, DataLayer)
    return layer


def numeric_grad(f: Callable[[], float], arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros(arr.shape)
    flat, g = arr.reshape(-1), out.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = f()
        flat[i] = old - eps
        lo = f()
        flat[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return out


def check_gradients(layer: Layer, phase: str = "train", seed: int = 3) -> None:
    """``backward`` against central differences of ``sum(data × r)`` (or a loss layer's loss),
    for every float source and every Param."""
    def objective() -> float:
        layer.forward(phase, np.random.default_rng(seed))
        if isinstance(layer, SoftmaxLossLayer):
            return layer.loss
        return float(np.sum(layer.data * r))

    layer.forward(phase, np.random.default_rng(seed))
    r = np.random.default_rng(1).standard_normal(np.shape(layer.data))
    for s in layer.srcs:
        if s.grad is not None:
            s.grad[...] = 0
    for p in layer.params:
        p.grad[...] = 0
    layer.grad = r.copy()
    layer.backward()
    for s in layer.srcs:
        if s.grad is not None:
            np.testing.assert_allclose(s.grad, numeric_grad(objective, s.data),
                                       rtol=1e-6, atol=1e-8, err_msg=f"source {s.name}")
    for p in layer.params:
        np.testing.assert_allclose(p.grad, numeric_grad(objective, p.data), rtol=1e-6,
                                   atol=1e-8, err_msg=f"param {p.name}")


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


# -- registration and configuration ---------------------------------------------------------

@pytest.mark.parametrize(("spelling", "canonical"), [
    ("kData", "kData"), ("data", "kData"), ("input", "kData"),
    ("kInnerProduct", "kInnerProduct"), ("inner_product", "kInnerProduct"),
    ("fc", "kInnerProduct"), ("dense", "kInnerProduct"),
    ("kReLU", "kReLU"), ("relu", "kReLU"), ("kSigmoid", "kSigmoid"), ("kTanh", "kTanh"),
    ("kSTanh", "kSTanh"), ("scaled_tanh", "kSTanh"), ("kDropout", "kDropout"),
    ("kSoftmaxLoss", "kSoftmaxLoss"), ("softmax_loss", "kSoftmaxLoss"),
    ("kEmbedding", "kEmbedding"), ("embedding", "kEmbedding"),
])
def test_layer_names(spelling: str, canonical: str) -> None:
    assert layers.lookup(spelling) == canonical


@pytest.mark.parametrize(("type_", "key"), [
    ("kData", "data_conf"), ("kInnerProduct", "innerproduct_conf"),
    ("kDropout", "dropout_conf"), ("kSoftmaxLoss", "softmaxloss_conf"),
    ("kEmbedding", "embedding_conf"), ("kReLU", "relu_conf"), ("kSTanh", None),
])
def test_conf_block_names(type_: str, key: str | None) -> None:
    assert layers.conf_name(type_) == key


def test_layer_confs_read_from_a_job_file() -> None:
    job = parse_job("""
        train_steps: 1
        neuralnet {
          layer { name: "data" type: kData data_conf { batchsize: 16 test_fraction: 0.25 } }
          layer { name: "fc1" type: kInnerProduct srclayers: "data"
                  innerproduct_conf { num_output: 100 bias_term: false transpose: true } }
          layer { name: "drop" type: kDropout srclayers: "fc1" dropout_conf { dropout_ratio: 0.1 }
                  exclude: kTest }
          layer { name: "loss" type: kSoftmaxLoss srclayers: "drop"
                  softmaxloss_conf { topk: 5 scale: 0.5 } }
        }""", "job.conf")
    data, fc1, drop, loss = job.neuralnet.layer
    assert (data.own.batchsize, data.own.test_fraction, data.own.source) == (16, 0.25, "digits")
    assert (fc1.own.num_output, fc1.own.bias_term, fc1.own.transpose) == (100, False, True)
    assert drop.own.dropout_ratio == 0.1 and drop.exclude == ["kTest"]
    assert (loss.own.topk, loss.own.scale) == (5, 0.5)


@pytest.mark.parametrize(("conf", "message"), [
    ({"type": "kInnerProduct"}, "Required parameter num_output of int is not presented"),
    ({"type": "kInnerProduct", "num_output": 0},
     "value 0 for Parameter num_output should be greater equal to 1"),
    ({"type": "kDropout", "dropout_ratio": 1}, "dropout_ratio must be below 1, got 1"),
    ({"type": "kDropout", "dropout_ratio": -0.5},
     "value -0.5 for Parameter dropout_ratio exceed bound [0,1]"),
    ({"type": "kData", "batchsize": 0}, "value 0 for Parameter batchsize should be greater"),
    ({"type": "kData", "test_fraction": 1}, "test_fraction must be below 1"),
    ({"type": "kSoftmaxLoss", "topk": 0}, "value 0 for Parameter topk should be greater"),
    ({"type": "kEmbedding", "feature_dim": 0},
     "value 0 for Parameter feature_dim should be greater equal to 1"),
    ({"type": "kReLU", "num_output": 3}, "Cannot find argument 'num_output'"),
])
def test_bad_layer_confs(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=None) as info:
        LayerConf.parse({"name": "l", **conf})
    assert message in str(info.value)


# -- inner product --------------------------------------------------------------------------

def test_inner_product_layout_and_values() -> None:
    x = Source(randn(4, 3))
    fc = make("kInnerProduct", [x], num_output=2)
    assert fc.param_shapes() == [(2, 3), (2,)]
    assert fc.params[0].fan_in == 3 and fc.params[0].fan_out == 2
    fc.forward("train", None)
    w, b = fc.params[0].data, fc.params[1].data
    np.testing.assert_allclose(fc.data, x.data @ w.T + b)
    assert fc.out_shape == (2,)

    t = make("kInnerProduct", [x], num_output=2, transpose=True, bias_term=False)
    assert t.param_shapes() == [(3, 2)]
    t.forward("train", None)
    np.testing.assert_allclose(t.data, x.data @ t.params[0].data)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("bias_term", [False, True])
def test_inner_product_gradients(transpose: bool, bias_term: bool) -> None:
    x = Source(randn(3, 2, 2))  # each sample flattened to 4 inputs
    fc = make("kInnerProduct", [x], num_output=3, transpose=transpose, bias_term=bias_term)
    assert fc.num_input == 4  # type: ignore[attr-defined]
    check_gradients(fc)


def test_inner_product_default_params() -> None:
    fc = make("kInnerProduct", [Source(randn(2, 5))], params=False, num_output=4)
    w, b = fc.param_confs()
    assert w.init.type == "kUniformSqrtFanInOut" and w.name is None
    assert b.init.type == "kConstant" and b.init.value == 0


def test_too_many_param_entries() -> None:
    conf = LayerConf.parse({"name": "fc9", "type": "kInnerProduct", "num_output": 2,
                            "bias_term": False, "param": [{"name": "w"}, {"name": "b"}]})
    fc = InnerProductLayer(conf, [Source(randn(2, 3))])
    fc.setup()
    with pytest.raises(ParamError, match=r"layer 'fc9' \(kInnerProduct\): has 1 Param but 2 "
                                         r"param \{ \} entries are given"):
        fc.param_confs()


def test_bind_checks_shapes() -> None:
    fc = make("kInnerProduct", [Source(randn(2, 3))], "fc1", params=False, num_output=2)
    with pytest.raises(ParamError, match=r"layer 'fc1' .*Param 0 \('w'\) has shape \(3, 2\), "
                                         r"expected \(2, 3\)"):
        fc.bind([Param("w", (3, 2), F64), Param("b", (2,), F64)])
    with pytest.raises(ParamError, match="needs 2 Params, 1 given"):
        fc.bind([Param("w", (2, 3), F64)])


def test_wrong_number_of_srclayers() -> None:
    a, b = Source(randn(2, 3), "a"), Source(randn(2, 3), "b")
    with pytest.raises(ParamError, match=r"layer 'fc' \(kInnerProduct\): has 2 srclayers; "
                                         r"kInnerProduct reads 1"):
        make("kInnerProduct", [a, b], "fc", num_output=2)
    with pytest.raises(ParamError, match=r"layer 'r' \(kReLU\): has 0 srclayers"):
        make("kReLU", [], "r")
    with pytest.raises(ParamError, match=r"layer 'd' \(kData\): has 1 srclayers; kData reads 0"):
        make("kData", [a], "d")


# -- activations and dropout ----------------------------------------------------------------

def test_activation_values() -> None:
    x = np.array([[-2.0, -0.5, 0.5, 3.0]])
    src = Source(x)
    expected = {
        "kReLU": np.maximum(x, 0),
        "kSigmoid": 1 / (1 + np.exp(-x)),
        "kTanh": np.tanh(x),
        "kSTanh": 1.7159047 * np.tanh(2 * x / 3),
    }
    for type_, want in expected.items():
        layer = make(type_, [src])
        layer.forward("train", None)
        np.testing.assert_allclose(layer.data, want, rtol=1e-12)
        assert layer.out_shape == (4,)


def test_sigmoid_does_not_overflow() -> None:
    layer = make("kSigmoid", [Source(np.array([[-1000.0, 1000.0]], np.float32))],
                 dtype=np.float32)
    with np.errstate(all="raise"):
        layer.forward("train", None)
    np.testing.assert_array_equal(layer.data, [[0.0, 1.0]])


@pytest.mark.parametrize("type_", ["kReLU", "kSigmoid", "kTanh", "kSTanh"])
def test_activation_gradients(type_: str) -> None:
    x = randn(3, 2, 4)
    x[np.abs(x) < 0.05] = 0.5  # keep away from ReLU's kink
    check_gradients(make(type_, [Source(x)]))


def test_dropout_train_and_test() -> None:
    x = np.ones((200, 50))
    drop = make("kDropout", [Source(x)], dropout_ratio=0.3)
    assert isinstance(drop, DropoutLayer)
    drop.forward("train", np.random.default_rng(5))
    kept = drop.data != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(drop.data[kept], 1 / 0.7)  # inverted: the mean is kept
    first = drop.data.copy()
    drop.forward("train", np.random.default_rng(5))
    np.testing.assert_array_equal(drop.data, first)  # the mask is the generator's
    drop.forward("train", np.random.default_rng(6))
    assert not np.array_equal(drop.data, first)
    drop.forward("test", None)
    np.testing.assert_array_equal(drop.data, x)
    with pytest.raises(ParamError, match="needs a random generator"):
        drop.forward("train", None)


def test_dropout_gradients() -> None:
    check_gradients(make("kDropout", [Source(randn(4, 6))], dropout_ratio=0.5))
    check_gradients(make("kDropout", [Source(randn(4, 6))], dropout_ratio=0.5), phase="test")


# -- softmax loss ---------------------------------------------------------------------------

def loss_layer(tmp_path: Path, logits: np.ndarray, labels: list[int], classes: int = 3,
               **own: Any) -> SoftmaxLossLayer:
    n = len(labels)
    data = data_layer(tmp_path, np.zeros((max(n, classes), 2)),
                      np.arange(max(n, classes)) % classes)
    data.feed(Batch(np.zeros((n, 2)), np.array(labels), 0))
    layer = make("kSoftmaxLoss", [Source(logits), data], "loss", **own)
    assert isinstance(layer, SoftmaxLossLayer)
    return layer


def test_softmax_loss_hand_example(tmp_path: Path) -> None:
    logits = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]])
    layer = loss_layer(tmp_path, logits, [2, 1])
    layer.forward("train", None)
    p0 = np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum()
    p1 = np.exp([1, 0, 0]) / np.exp([1, 0, 0]).sum()
    np.testing.assert_allclose(layer.data, [p0, p1])
    assert layer.loss == pytest.approx((-np.log(p0[2]) - np.log(p1[1])) / 2)
    assert layer.accuracy == 0.5  # row 0 right, row 1: class 0 scores higher than label 1
    assert layer.metrics() == {"loss": layer.loss, "accuracy": 0.5}
    grad = layer.srcs[0].grad
    assert grad is not None
    grad[...] = 0
    layer.backward()
    np.testing.assert_allclose(grad, (np.array([p0, p1]) - [[0, 0, 1], [0, 1, 0]]) / 2)


def test_softmax_loss_topk_ties_and_scale(tmp_path: Path) -> None:
    logits = np.array([[1.0, 0.0, 0.0], [0.0, 5.0, 5.0], [3.0, 2.0, 1.0]])
    top2 = loss_layer(tmp_path, logits, [1, 2, 2], topk=2, scale=2.0)
    top2.forward("train", None)
    # label 1 of row 0 ties for second: fewer than 2 score strictly higher; row 1 ties for
    # first; row 2's label is third
    assert top2.accuracy == pytest.approx(2 / 3)
    top1 = loss_layer(tmp_path, logits, [1, 2, 2])
    top1.forward("train", None)
    assert top1.accuracy == pytest.approx(1 / 3)
    assert top2.loss == pytest.approx(2 * top1.loss)


def test_softmax_loss_is_stable_for_large_logits(tmp_path: Path) -> None:
    layer = loss_layer(tmp_path, np.array([[1000.0, 0.0, -1000.0]]), [0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        layer.forward("train", None)
    assert layer.loss == 0.0 and layer.accuracy == 1.0


def test_softmax_loss_gradients(tmp_path: Path) -> None:
    check_gradients(loss_layer(tmp_path, randn(4, 3), [0, 2, 1, 2], scale=1.5))


def test_softmax_loss_shape_errors(tmp_path: Path) -> None:
    data = data_layer(tmp_path, np.zeros((6, 2)), np.arange(6) % 4)  # 4 classes
    with pytest.raises(ParamError, match=r"layer 'loss' \(kSoftmaxLoss\): the labels of 'data' "
                                         r"go up to 3 \(4 classes\) but srclayer 'src' gives "
                                         r"3 scores"):
        make("kSoftmaxLoss", [Source(randn(2, 3)), data], "loss")
    with pytest.raises(ParamError, match=r"layer 'loss' \(kSoftmaxLoss\): srclayer 'src' gives "
                                         r"shape \(4, 2\); kSoftmaxLoss needs one score per "
                                         r"class"):
        make("kSoftmaxLoss", [Source(randn(2, 4, 2)), data], "loss")
    with pytest.raises(ParamError, match="topk 5 is more than the 4 classes"):
        make("kSoftmaxLoss", [Source(randn(2, 4)), data], "loss", topk=5)
    with pytest.raises(ParamError, match="the second srclayer gives the labels and must be a "
                                         "data layer; 'other' is kReLU"):
        make("kSoftmaxLoss", [Source(randn(2, 4)), Source(randn(2, 4), "other")], "loss")
    with pytest.raises(ParamError, match="cannot tell where the labels come from: srclayer "
                                         "'src' depends on data layers none"):
        make("kSoftmaxLoss", [Source(randn(2, 4))], "loss")


def test_softmax_loss_finds_the_data_layer_upstream(tmp_path: Path) -> None:
    data = data_layer(tmp_path, np.zeros((6, 2)), np.arange(6) % 3)
    fc = make("kInnerProduct", [data], "fc", num_output=3)
    loss = make("kSoftmaxLoss", [fc], "loss")
    assert isinstance(loss, SoftmaxLossLayer) and loss.label_layer is data


# -- embedding ------------------------------------------------------------------------------

def test_embedding_lookup_and_gradient() -> None:
    ids = Source(np.array([[0, 3, 3], [2, 0, 3]]))
    emb = make("kEmbedding", [ids], "emb", vocab_size=5, feature_dim=2)
    assert isinstance(emb, EmbeddingLayer)
    assert emb.param_shapes() == [(5, 2)] and emb.out_shape == (3, 2)
    emb.forward("train", None)
    table = emb.params[0].data
    np.testing.assert_array_equal(emb.data, table[[[0, 3, 3], [2, 0, 3]]])
    emb.params[0].grad[...] = 0
    emb.grad = np.ones((2, 3, 2))
    emb.backward()
    np.testing.assert_array_equal(emb.params[0].grad[:, 0], [2, 0, 1, 3, 0])  # repeats add
    check_gradients(emb)


def test_embedding_checks_its_input(tmp_path: Path) -> None:
    with pytest.raises(ParamError, match=r"layer 'emb' \(kEmbedding\): srclayer 'src' gives "
                                         "floats; kEmbedding reads integer ids"):
        make("kEmbedding", [Source(randn(2, 3))], "emb", vocab_size=5, feature_dim=2)
    data = data_layer(tmp_path, np.array([[1, 7], [0, 2]]), np.array([0, 1]))
    with pytest.raises(ParamError, match=r"the ids of 'data' are in \[0, 7\], outside "
                                         r"\[0, vocab_size\) = \[0, 5\)"):
        make("kEmbedding", [data], "emb", vocab_size=5, feature_dim=2)
    emb = make("kEmbedding", [Source(np.array([[1, 9]]))], "emb", vocab_size=5, feature_dim=2)
    with pytest.raises(ParamError, match=r"layer 'emb' \(kEmbedding\): an id is outside"):
        emb.forward("train", None)


def test_embedding_default_init() -> None:
    emb = make("kEmbedding", [Source(np.array([[1]]))], params=False, vocab_size=5,
               feature_dim=2)
    assert emb.param_confs()[0].init.type == "kGaussian"


# -- data layer -----------------------------------------------------------------------------

def test_data_layer_feeds_batches(tmp_path: Path) -> None:
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    data = data_layer(tmp_path, x, np.arange(10) % 2, batchsize=4, test_fraction=0.2)
    assert data.out_shape == (2,) and not data.int_output
    assert data.dataset.num_train == 8 and data.dataset.num_test == 2
    batch = data.batch(0)
    data.feed(batch)
    data.forward("train", None)
    np.testing.assert_array_equal(data.data, batch.x)
    np.testing.assert_array_equal(data.labels, batch.y)
    with pytest.raises(ParamError, match=r"fed samples of shape \(3,\)"):
        data.feed(Batch(np.zeros((2, 3)), np.zeros(2, np.int64), 0))


def test_data_layer_needs_a_batch(tmp_path: Path) -> None:
    data = data_layer(tmp_path, np.zeros((4, 2)), np.zeros(4, np.int64))
    with pytest.raises(ParamError, match="has no batch"):
        data.forward("train", None)


def test_data_layer_batchsize_larger_than_the_data(tmp_path: Path) -> None:
    with pytest.raises(ParamError, match=r"layer 'data' \(kData\): batchsize 8 is larger than "
                                         r"the training split \(4 samples"):
        data_layer(tmp_path, np.zeros((4, 2)), np.zeros(4, np.int64), batchsize=8)


# -- users' layers and the documentation ----------------------------------------------------

def test_a_user_layer_in_a_net() -> None:
    from paramserver.config import Parameter, field
    from paramserver.train.layers import register_layer
    from paramserver.train.net import Net

    @register_layer("Scale")
    class Scale(Layer):
        class Config(Parameter):
            factor: float = field(2.0, doc="The factor.")

        def forward(self, phase: str, rng: np.random.Generator | None) -> None:
            self.data = self._input() * self.own.factor

        def backward(self) -> None:
            assert self.grad is not None
            if self.srcs[0].grad is not None:
                self.srcs[0].grad += self.grad * self.own.factor

    try:
        job = parse_job("""train_steps: 1 neuralnet {
            layer { name: "data" type: kData data_conf { batchsize: 8 } }
            layer { name: "fc" type: kInnerProduct srclayers: "data"
                    innerproduct_conf { num_output: 10 } }
            layer { name: "s" type: Scale srclayers: "fc" [scale_conf] { factor: 3 } }
            layer { name: "loss" type: kSoftmaxLoss srclayers: "s" } }""")
        net = Net(job.neuralnet, dtype=F64)
        assert net["s"].own.factor == 3.0
        pset = net.make_params()
        net.train_step(0)
        g = pset.grads.copy()
        fc_out = net["fc"].data
        np.testing.assert_array_equal(net["s"].data, 3 * fc_out)
        assert np.any(g != 0)
    finally:
        layers.remove("Scale")


def test_docs_describe_every_layer_and_field() -> None:
    text = (Path(__file__).parents[1] / "docs" / "layers.md").read_text(encoding="utf-8")
    for name, cls in layers.items():
        if cls.__module__ != "paramserver.train.layers":
            continue
        assert f"`{name}`" in text, name
        if cls.Config is not None:
            assert f"`{layers.conf_name(name)}`" in text, name
            for field_name in cls.Config.fields():
                assert f"`{field_name}`" in text, (name, field_name)
