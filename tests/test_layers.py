"""Layers: values, gradients against central differences, shape checks, configuration.

Every layer type's backward pass (hand-written, or autograd's of its forward) is checked
against central differences in float64 (:func:`layer_tools.check_gradients`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from layer_tools import (  # noqa: E402
    F64,
    Source,
    check_gradients,
    data_layer,
    make,
    randn,
    run,
)
from paramserver import ParamError  # noqa: E402
from paramserver.config.components import layers  # noqa: E402
from paramserver.config.job import LayerConf, parse_job  # noqa: E402
from paramserver.params import Param  # noqa: E402
from paramserver.train.data import Batch  # noqa: E402
from paramserver.train.layers import (  # noqa: E402
    DropoutLayer,
    EmbeddingLayer,
    InnerProductLayer,
    Layer,
    SoftmaxLossLayer,
)


def arr(t: Any) -> np.ndarray:
    return t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)


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
    run(fc)
    w, b = fc.params[0].data, fc.params[1].data
    np.testing.assert_allclose(arr(fc.data), x.arr @ w.T + b)
    assert fc.out_shape == (2,)

    t = make("kInnerProduct", [x], num_output=2, transpose=True, bias_term=False)
    assert t.param_shapes() == [(3, 2)]
    run(t)
    np.testing.assert_allclose(arr(t.data), x.arr @ t.params[0].data)


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
        fc.bind([Param("w", (3, 2), F64), Param("b", (2,), F64)], [None, None])
    with pytest.raises(ParamError, match="needs 2 Params, 1 given"):
        fc.bind([Param("w", (2, 3), F64)], [None])


def test_wrong_number_of_srclayers() -> None:
    a, b = Source(randn(2, 3), "a"), Source(randn(2, 3), "b")
    with pytest.raises(ParamError, match=r"layer 'fc' \(kInnerProduct\): has 2 srclayers; "
                                         r"kInnerProduct reads 1"):
        make("kInnerProduct", [a, b], "fc", num_output=2)
    with pytest.raises(ParamError, match=r"layer 'r' \(kReLU\): has 0 srclayers"):
        make("kReLU", [], "r")
    with pytest.raises(ParamError, match=r"layer 'd' \(kData\): has 1 srclayers; kData reads 0"):
        make("kData", [a], "d")


# -- activations, dropout, softmax --------------------------------------------------------

ACTIVATIONS = {
    "kReLU": lambda x: np.maximum(x, 0),
    "kSigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "kTanh": np.tanh,
    "kSTanh": lambda x: 1.7159047 * np.tanh(2 * x / 3),
}


@pytest.mark.parametrize("type_", sorted(ACTIVATIONS))
def test_activation_values_and_gradients(type_: str) -> None:
    x = randn(3, 2, 4)
    x[np.abs(x) < 0.05] = 0.5  # keep away from ReLU's kink
    layer = make(type_, [Source(x)])
    run(layer)
    np.testing.assert_allclose(arr(layer.data), ACTIVATIONS[type_](x), rtol=1e-12)
    assert layer.out_shape == (2, 4)
    check_gradients(layer)


@pytest.mark.parametrize("function", ["RELU", "SIGMOID", "TANH", "STANH"])
@pytest.mark.parametrize("type_", ["kActivation", "kCudnnActivation"])
def test_activation_chosen_by_its_conf(type_: str, function: str) -> None:
    x = randn(2, 5) + 0.01
    layer = make(type_, [Source(x)], activation_conf={"type": function})
    run(layer)
    name = {"RELU": "kReLU", "SIGMOID": "kSigmoid", "TANH": "kTanh", "STANH": "kSTanh"}
    np.testing.assert_allclose(arr(layer.data), ACTIVATIONS[name[function]](x), rtol=1e-12)
    check_gradients(layer)


def test_sigmoid_does_not_overflow() -> None:
    layer = make("kSigmoid", [Source(np.array([[-1000.0, 1000.0]], np.float32))],
                 dtype=np.float32)
    run(layer)
    np.testing.assert_array_equal(arr(layer.data), [[0.0, 1.0]])


def test_dropout_train_and_test() -> None:
    x = np.ones((200, 50))
    drop = make("kDropout", [Source(x)], dropout_ratio=0.3)
    assert isinstance(drop, DropoutLayer)
    run(drop, seed=5)
    kept = arr(drop.data) != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(arr(drop.data)[kept], 1 / 0.7)  # inverted: the mean is kept
    first = arr(drop.data).copy()
    run(drop, seed=5)
    np.testing.assert_array_equal(arr(drop.data), first)  # the mask is the generator's
    run(drop, seed=6)
    assert not np.array_equal(arr(drop.data), first)
    run(drop, "test")
    np.testing.assert_array_equal(arr(drop.data), x)
    with pytest.raises(ParamError, match="needs a random generator"):
        drop.forward("train", None)


def test_dropout_gradients() -> None:
    check_gradients(make("kDropout", [Source(randn(4, 6))], dropout_ratio=0.5))
    check_gradients(make("kDropout", [Source(randn(4, 6))], dropout_ratio=0.5), phase="test")


@pytest.mark.parametrize("type_", ["kSoftmax", "kCudnnSoftmax"])
def test_softmax_groups(type_: str) -> None:
    x = randn(3, 2, 3)
    layer = make(type_, [Source(x)], softmax_conf={"num_softmax_per_instance": 2})
    run(layer)
    e = np.exp(x - x.max(axis=2, keepdims=True))
    np.testing.assert_allclose(arr(layer.data), e / e.sum(axis=2, keepdims=True))
    check_gradients(layer)
    with pytest.raises(ParamError, match="num_softmax_per_instance 4 does not divide the 6"):
        make(type_, [Source(x)], softmax_conf={"num_softmax_per_instance": 4})


# -- loss and output layers -----------------------------------------------------------------

def loss_layer(logits: np.ndarray, labels: list[int], type_: str = "kSoftmaxLoss",
               **own: Any) -> SoftmaxLossLayer:
    n = len(labels)
    data = Source(np.zeros((n, 2)), "data", needs_grad=False, labels=np.array(labels))
    layer = make(type_, [Source(logits), data], "loss", **own)
    assert isinstance(layer, SoftmaxLossLayer)
    return layer


def test_softmax_loss_hand_example() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]])
    layer = loss_layer(logits, [2, 1])
    run(layer)
    p0 = np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum()
    p1 = np.exp([1, 0, 0]) / np.exp([1, 0, 0]).sum()
    np.testing.assert_allclose(arr(layer.data), [p0, p1])
    assert float(layer.loss) == pytest.approx((-np.log(p0[2]) - np.log(p1[1])) / 2)
    assert float(layer.accuracy) == 0.5  # row 0 right; row 1: class 0 scores above label 1
    assert layer.metrics() == {"loss": pytest.approx(float(layer.loss)), "accuracy": 0.5}
    layer.srcs[0].grad = None
    with torch.no_grad():
        layer.backward()
    np.testing.assert_allclose(arr(layer.srcs[0].grad),
                               (np.array([p0, p1]) - [[0, 0, 1], [0, 1, 0]]) / 2)


def test_softmax_loss_topk_ties_and_scale() -> None:
    logits = np.array([[1.0, 0.0, 0.0], [0.0, 5.0, 5.0], [3.0, 2.0, 1.0]])
    top2 = loss_layer(logits, [1, 2, 2], topk=2, scale=2.0)
    run(top2)
    # label 1 of row 0 ties for second: fewer than 2 score strictly higher; row 1 ties for
    # first; row 2's label is third
    assert float(top2.accuracy) == pytest.approx(2 / 3)
    top1 = loss_layer(logits, [1, 2, 2])
    run(top1)
    assert float(top1.accuracy) == pytest.approx(1 / 3)
    assert float(top2.loss) == pytest.approx(2 * float(top1.loss))


def test_softmax_loss_is_stable_for_large_logits() -> None:
    layer = loss_layer(np.array([[1000.0, 0.0, -1000.0]]), [0])
    run(layer)
    assert float(layer.loss) == 0.0 and float(layer.accuracy) == 1.0


@pytest.mark.parametrize("type_", ["kSoftmaxLoss", "kCudnnSoftmaxLoss"])
def test_softmax_loss_gradients(type_: str) -> None:
    check_gradients(loss_layer(randn(4, 3), [0, 2, 1, 2], type_, scale=1.5))


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
    with pytest.raises(ParamError, match="srclayer 'other' \\(kReLU\\) gives no labels"):
        make("kSoftmaxLoss", [Source(randn(2, 4)), Source(randn(2, 4), "other")], "loss")
    with pytest.raises(ParamError, match="cannot tell where the labels come from: srclayer "
                                         "'src' depends on layers giving labels none"):
        make("kSoftmaxLoss", [Source(randn(2, 4))], "loss")


def test_softmax_loss_finds_the_labels_upstream(tmp_path: Path) -> None:
    data = data_layer(tmp_path, np.zeros((6, 2)), np.arange(6) % 3)
    fc = make("kInnerProduct", [data], "fc", num_output=3)
    loss = make("kSoftmaxLoss", [fc], "loss")
    assert isinstance(loss, SoftmaxLossLayer) and loss.label_layer is data


def test_euclidean_loss_values_and_gradient() -> None:
    a, b = randn(3, 4), randn(3, 2, 2, seed=1)
    layer = make("kEuclideanLoss", [Source(a, "a"), Source(b, "b")])
    run(layer)
    assert float(layer.loss) == pytest.approx(((a - b.reshape(3, 4)) ** 2).sum() / 3)
    # SINGA's gradient is that of half the loss, and the second source gets none
    layer.srcs[0].grad = layer.srcs[1].grad = None
    with torch.no_grad():
        layer.backward()
    np.testing.assert_allclose(arr(layer.srcs[0].grad), (a - b.reshape(3, 4)) / 3)
    assert layer.srcs[1].grad is None
    with pytest.raises(ParamError, match="srclayer 'a' gives 4 values per sample but 'b' 5"):
        make("kEuclideanLoss", [Source(a, "a"), Source(randn(3, 5), "b")])


def test_argsort_and_accuracy() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0], [0.0, 0.1, 0.9]])
    top2 = make("kArgSort", [Source(scores)], argsort_conf={"topk": 2})
    run(top2)
    np.testing.assert_array_equal(arr(top2.data), [[1, 2], [0, 1], [2, 1]])
    assert top2.int_output and top2.out_shape == (2,)
    labels = Source(np.zeros((3, 1)), "data", needs_grad=False, labels=np.array([2, 1, 0]))
    acc = make("kAccuracy", [Source(scores), labels], argsort_conf={"topk": 2})
    run(acc)
    assert acc.metrics() == {"accuracy": pytest.approx(2 / 3)}
    with pytest.raises(ParamError, match="topk 4 is more than the 3 scores"):
        make("kArgSort", [Source(scores)], argsort_conf={"topk": 4})


def test_csv_and_record_output(tmp_path: Path) -> None:
    from paramserver.singa import stores

    src = Source(np.array([[0.5, 1.0], [2.0, -3.0]]), labels=np.array([1, 0]))
    csv = make("kCSVOutput", [src], store_conf={"path": str(tmp_path / "out.csv")})
    run(csv, "test")
    run(csv, "test")
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines == ["1,0.5,1.0", "0,2.0,-3.0"] * 2
    rec = make("kRecordOutput", [src], store_conf={"path": str(tmp_path / "out.bin")})
    run(rec, "test")
    run(rec, "test")
    samples = stores.read_records(tmp_path / "out.bin")
    np.testing.assert_array_equal(samples.x, np.array([[0.5, 1.0], [2.0, -3.0]] * 2))
    np.testing.assert_array_equal(samples.y, [1, 0, 1, 0])


# -- convolution, pooling, LRN --------------------------------------------------------------

@pytest.mark.parametrize("channels", [2, 1])
@pytest.mark.parametrize("type_", ["kConvolution", "kCConvolution", "kCudnnConv"])
def test_convolution_layout_values_and_gradients(type_: str, channels: int) -> None:
    x = randn(2, channels, 5, 4)
    conv = make(type_, [Source(x)], convolution_conf={"num_filters": 3, "kernel": 3,
                                                      "pad": 1, "stride": 2})
    assert conv.param_shapes() == [(3, channels * 3 * 3), (3,)]  # SINGA's (filters, c·k·k)
    assert conv.out_shape == (3, 3, 2)  # (5 + 2 - 3) // 2 + 1, (4 + 2 - 3) // 2 + 1
    run(conv)
    w = conv.params[0].data.reshape(3, channels, 3, 3)
    b = conv.params[1].data
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 3, 3, 2))
    for n in range(2):
        for f in range(3):
            for i in range(3):
                for j in range(2):
                    patch = padded[n, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
                    want[n, f, i, j] = (patch * w[f]).sum() + b[f]
    np.testing.assert_allclose(arr(conv.data), want, rtol=1e-10)
    check_gradients(conv)


@pytest.mark.parametrize("channels", [1, 3])
def test_a_float32_conv_stack_on_the_cpu_is_autograds_planar_one(channels: int) -> None:
    """Convolution and max pooling work channels-last on the CPU (oneDNN's kernels, in
    float32): their outputs and every gradient are what autograd gives for the same layers
    on planar images, within float32's rounding, and each layer hands on channels-last
    memory (a one-channel image needs no copy for it)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, channels, 12, 12)).astype(np.float32)
    conv1 = make("kCConvolution", [Source(x)], "conv1", dtype=np.float32,
                 convolution_conf={"num_filters": 5, "kernel": 3, "pad": 1})
    pool = make("kCPooling", [conv1], "pool1", dtype=np.float32, params=False,
                pooling_conf={"pool": "MAX", "kernel": 2, "stride": 2})
    conv2 = make("kCConvolution", [pool], "conv2", dtype=np.float32, seed=8,
                 convolution_conf={"num_filters": 6, "kernel": 3})
    stack = [conv1, pool, conv2]
    for layer in stack:
        layer.requires_grad = True
        run(layer, training=True)
        assert layer.data.is_contiguous(memory_format=torch.channels_last), layer.name
    if channels == 1:  # one channel is channels-last as it lies: no copy
        assert conv1.images().data_ptr() == conv1.srcs[0].data.data_ptr()
    g = torch.from_numpy(rng.standard_normal((4, *conv2.out_shape)).astype(np.float32))
    conv2.grad = g
    for layer in stack:
        layer.srcs[0].grad = None
        for w in layer.weights:
            w.grad.zero_()
    with torch.no_grad():
        for layer in reversed(stack):
            layer.backward()

    f = torch.nn.functional
    leaf = torch.from_numpy(x.copy()).requires_grad_(True)
    w1, b1 = (torch.from_numpy(p.data.copy()).requires_grad_(True) for p in conv1.params)
    w2, b2 = (torch.from_numpy(p.data.copy()).requires_grad_(True) for p in conv2.params)
    y1 = f.conv2d(leaf, w1.view(5, channels, 3, 3), b1, padding=1)
    y2 = f.conv2d(f.max_pool2d(y1, 2, 2), w2.view(6, 5, 3, 3), b2)
    y2.backward(g)
    close = {"rtol": 1e-4, "atol": 1e-4}  # sums of a few hundred float32 products of ~1
    torch.testing.assert_close(conv2.data, y2.detach(), **close)
    torch.testing.assert_close(conv1.srcs[0].grad.reshape(leaf.shape), leaf.grad, **close)
    for layer, want in ((conv1, (w1, b1)), (conv2, (w2, b2))):
        for got, w in zip(layer.weights, want, strict=True):
            torch.testing.assert_close(got.grad, w.grad, **close)


def test_convolution_kernel_x_y_and_no_bias() -> None:
    conv = make("kConvolution", [Source(randn(1, 6, 7))],
                convolution_conf={"num_filters": 2, "kernel_x": 3, "kernel_y": 2,
                                  "bias_term": False})
    assert conv.param_shapes() == [(2, 1 * 2 * 3)]
    assert conv.out_shape == (2, 5, 5)
    check_gradients(conv)
    with pytest.raises(ParamError, match="num_filters must be set"):
        make("kConvolution", [Source(randn(1, 2, 6, 6))], convolution_conf={"kernel": 3})
    with pytest.raises(ParamError, match=r"the height 2 .* is smaller than the kernel 3"):
        make("kConvolution", [Source(randn(1, 1, 2, 6))],
             convolution_conf={"num_filters": 1, "kernel": 3})


@pytest.mark.parametrize("type_", ["kPooling", "kCPooling", "kCudnnPool"])
@pytest.mark.parametrize("pool", ["MAX", "AVG"])
def test_pooling_values_and_gradients(type_: str, pool: str) -> None:
    x = randn(2, 3, 7, 7)
    layer = make(type_, [Source(x)], pooling_conf={"pool": pool, "kernel": 3, "stride": 2})
    assert layer.out_shape == (3, 3, 3)  # (7 - 3) // 2 + 1
    run(layer)
    windows = np.stack([[x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3] for j in range(3)]
                        for i in range(3)])  # (3, 3, n, c, 3, 3)
    reduce = np.max if pool == "MAX" else np.mean
    want = reduce(windows, axis=(4, 5)).transpose(2, 3, 0, 1)
    np.testing.assert_allclose(arr(layer.data), want, rtol=1e-12)
    check_gradients(layer)


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize(("kernel", "stride", "pad"), [(2, 2, 0), (3, 2, 1)])
def test_max_pooling_ties_and_nans_as_torchs_autograd(channels: int, kernel: int, stride: int,
                                                      pad: int) -> None:
    """Max pooling's own backward pass (the indices of its forward pass, taken in the
    channels-last layout) gives what autograd of torch's max_pool2d gives, bit for bit:
    ties (ReLU's zeros) and NaNs go to the same input."""
    x = np.random.default_rng(5).integers(0, 3, (3, channels, 9, 8)).astype(np.float32)
    x[0, 0, :3, :3] = np.nan
    x[1, -1, 2, 4] = np.nan
    layer = make("kCPooling", [Source(x)], dtype=np.float32,
                 pooling_conf={"pool": "MAX", "kernel": kernel, "stride": stride, "pad": pad})
    layer.requires_grad = True
    run(layer, training=True)
    g = torch.from_numpy(np.random.default_rng(6).standard_normal(
        (3, *layer.out_shape)).astype(np.float32))
    layer.srcs[0].grad = None
    layer.grad = g
    with torch.no_grad():
        layer.backward()
    leaf = torch.from_numpy(x.copy()).requires_grad_(True)
    want = torch.nn.functional.max_pool2d(leaf, kernel, stride, pad)
    want.backward(g)
    assert torch.equal(layer.data.isnan(), want.isnan())
    assert torch.equal(layer.data.nan_to_num(), want.detach().nan_to_num())
    assert torch.equal(layer.srcs[0].grad, leaf.grad)


def test_pooling_padding_counts_zeros_in_averages() -> None:
    x = np.ones((1, 1, 2, 2))
    layer = make("kPooling", [Source(x)], pooling_conf={"pool": "AVG", "kernel": 2, "stride": 2,
                                                        "pad": 1})
    run(layer)
    np.testing.assert_allclose(arr(layer.data), np.full((1, 1, 2, 2), 0.25))


@pytest.mark.parametrize("type_", ["kLRN", "kCudnnLRN"])
def test_lrn_values_and_gradients(type_: str) -> None:
    x = randn(2, 5, 3, 3)
    layer = make(type_, [Source(x)], lrn_conf={"local_size": 3, "alpha": 0.5, "beta": 0.75,
                                               "knorm": 2.0})
    run(layer)
    sq = np.pad(x ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    np.testing.assert_allclose(arr(layer.data), x / (2.0 + 0.5 / 3 * window) ** 0.75,
                               rtol=1e-10)
    check_gradients(layer)


@pytest.mark.parametrize("type_", ["kBM", "kCudnnBM"])
def test_batch_normalisation_values_and_gradients(type_: str) -> None:
    """SINGA v0.3.0's kCudnnBM (cuDNN's spatial batch normalisation), on images and on
    flat features: per channel, over the batch and the image."""
    x = randn(4, 3, 2, 5) * 3.0 + 1.5
    layer = make(type_, [Source(x)], bm_conf={})
    assert layer.param_shapes() == [(1, 3, 1, 1)] * 4
    assert layer.untrained_params == (2, 3)  # type: ignore[attr-defined]
    run(layer)
    scale, bias = (p.data.reshape(1, 3, 1, 1) for p in layer.params[:2])
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(arr(layer.data), (x - mean) / np.sqrt(var + 1e-5) * scale
                               + bias, rtol=1e-10)
    check_gradients(layer, rtol=1e-5, atol=1e-7)
    assert not np.any(layer.weights[2].grad.numpy()) and not np.any(
        layer.weights[3].grad.numpy())  # SINGA's running statistics: not trained
    flat = make(type_, [Source(randn(6, 4))], bm_conf={})
    run(flat)
    np.testing.assert_allclose(arr(flat.data).mean(axis=0) - flat.params[1].data.reshape(4),
                               0, atol=1e-9)
    check_gradients(flat, rtol=1e-5, atol=1e-7)
    with pytest.raises(ParamError, match=r"reads images \(channels, height, width\) or "
                                         "features"):
        make(type_, [Source(randn(2, 3, 4))], bm_conf={})


# -- connection layers ----------------------------------------------------------------------

def test_concate_values_and_gradients() -> None:
    a, b = Source(randn(2, 3, 2), "a"), Source(randn(2, 1, 2, seed=1), "b")
    cat = make("kConcate", [a, b], concate_conf={"concate_dim": 1, "num_concates": 2})
    assert cat.out_shape == (4, 2)
    run(cat)
    np.testing.assert_array_equal(arr(cat.data), np.concatenate([a.arr, b.arr], 1))
    check_gradients(cat)
    batch = make("kConcate", [a, Source(randn(3, 3, 2), "c")],
                 concate_conf={"concate_dim": 0, "num_concates": 2})
    run(batch)
    assert tuple(batch.data.shape) == (5, 3, 2)
    with pytest.raises(ParamError, match="num_concates is 3 but it reads 2 srclayers"):
        make("kConcate", [a, b], concate_conf={"concate_dim": 1, "num_concates": 3})
    with pytest.raises(ParamError, match="does not join"):
        make("kConcate", [a, Source(randn(2, 3, 3), "d")],
             concate_conf={"concate_dim": 1, "num_concates": 2})


@pytest.mark.parametrize("type_", ["kSplit", "kBridgeSrc", "kBridgeDst"])
def test_identity_connections(type_: str) -> None:
    layer = make(type_, [Source(randn(2, 3))])
    run(layer)
    np.testing.assert_array_equal(arr(layer.data), randn(2, 3))
    check_gradients(layer)


def test_dummy_layer() -> None:
    dummy = make("kDummy", [], dummy_conf={"input": True, "shape": [4, 3]})
    run(dummy)
    assert tuple(dummy.data.shape) == (4, 3) and dummy.out_shape == (3,)
    passing = make("kDummy", [Source(randn(2, 3))])
    check_gradients(passing)


# -- embedding ------------------------------------------------------------------------------

def test_embedding_lookup_and_gradient() -> None:
    ids = Source(np.array([[0, 3, 3], [2, 0, 3]]))
    emb = make("kEmbedding", [ids], "emb", vocab_size=5, feature_dim=2)
    assert isinstance(emb, EmbeddingLayer)
    assert emb.param_shapes() == [(5, 2)] and emb.out_shape == (3, 2)
    run(emb)
    table = emb.params[0].data
    np.testing.assert_array_equal(arr(emb.data), table[[[0, 3, 3], [2, 0, 3]]])
    emb.params[0].grad[...] = 0
    emb.grad = torch.ones((2, 3, 2), dtype=torch.float64)
    with torch.no_grad():
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
        run(emb)


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
    run(data)
    np.testing.assert_array_equal(arr(data.data), batch.x)
    np.testing.assert_array_equal(arr(data.labels), batch.y)
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

        def compute(self, x: Any) -> Any:  # its gradient is autograd's
            return x * self.own.factor

    try:
        job = parse_job("""train_steps: 1 neuralnet {
            layer { name: "data" type: kData data_conf { batchsize: 8 } }
            layer { name: "fc" type: kInnerProduct srclayers: "data"
                    innerproduct_conf { num_output: 10 } }
            layer { name: "s" type: Scale srclayers: "fc" [scale_conf] { factor: 3 } }
            layer { name: "loss" type: kSoftmaxLoss srclayers: "s" } }""")
        net = Net(job.neuralnet, dtype=F64)
        assert net["s"].own.factor == 3.0 and net["s"].type == "user:Scale"
        pset = net.make_params()
        net.train_step(0)
        g = pset.grads.copy()
        np.testing.assert_array_equal(arr(net["s"].data), 3 * arr(net["fc"].data))
        assert np.any(g != 0)
        check_gradients(make("Scale", [Source(randn(2, 3))], scale_conf={"factor": 3}))
    finally:
        layers.remove("Scale")


def test_docs_describe_every_layer_and_field() -> None:
    text = (Path(__file__).parents[1] / "docs" / "layers.md").read_text(encoding="utf-8")
    for name, cls in layers.items():
        if not cls.__module__.startswith("paramserver.train.layers") or not cls.built:
            continue
        assert f"`{name}`" in text, name
        if cls.Config is not None:
            assert f"`{layers.conf_name(name)}`" in text, name
            for field_name in cls.Config.fields():
                assert f"`{field_name}`" in text, (name, field_name)


def test_every_built_layer_is_gradient_checked() -> None:
    """Each built layer type appears in a gradient or reference test of this suite."""
    import re

    here = Path(__file__).parent
    text = "".join(p.read_text(encoding="utf-8") for p in here.glob("test_*.py"))
    missing = [name for name, cls in layers.items()
               if cls.__module__.startswith("paramserver.train.layers") and cls.built
               and not re.search(rf"\b{name}\b", text)]
    assert not missing
