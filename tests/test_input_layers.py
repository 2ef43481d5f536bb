"""SINGA's input and parser layers against reference formulas, and kSlice's gradient in a
net against central differences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from layer_tools import Source, make, run  # noqa: E402
from paramserver import ParamError  # noqa: E402
from paramserver.config.job import parse_job  # noqa: E402
from paramserver.singa import stores  # noqa: E402
from paramserver.train.net import Net  # noqa: E402


def shard(tmp_path: Path, x: np.ndarray, y: np.ndarray) -> str:
    path = tmp_path / "shard"
    stores.write_records(path, stores.Samples(x, y), "shard")
    return str(path)


def test_shard_data_mnist_and_label(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (6, 4, 4)).astype(np.uint8)
    y = np.arange(6) % 3
    data = make("kShardData", [], "data", sharddata_conf={"path": shard(tmp_path, x, y),
                                                          "batchsize": 4})
    mnist = make("kMnist", [data], "mnist", mnist_conf={"norm_a": 127.5, "norm_b": 1})
    label = make("kLabel", [data], "label")
    data.feed(data.batch(1))  # records 4, 5, 0, 1: in order, wrapping around
    for layer in (data, mnist, label):
        run(layer)
    idx = [4, 5, 0, 1]
    np.testing.assert_allclose(mnist.data.numpy(), x[idx][:, None] / 127.5 - 1, rtol=1e-6)
    assert mnist.out_shape == (1, 4, 4)
    np.testing.assert_array_equal(label.data.numpy(), y[idx])
    with pytest.raises(ParamError, match="parses the records of a kShardData"):
        make("kMnist", [Source(np.zeros((2, 16)))], "m")


def test_rgb_image_mean_crop_mirror_and_scale(tmp_path: Path) -> None:
    x = np.random.default_rng(1).integers(0, 256, (4, 3, 6, 6)).astype(np.uint8)
    mean = np.random.default_rng(2).random((3, 6, 6)).astype(np.float32) * 100
    stores.write_mean(tmp_path / "mean.bin", mean, "shard")
    data = make("kShardData", [], "data", sharddata_conf={
        "path": shard(tmp_path, x, np.zeros(4, np.int64)), "batchsize": 4})
    rgb = make("kRGBImage", [data], "rgb", rgbimage_conf={
        "meanfile": str(tmp_path / "mean.bin"), "cropsize": 4, "mirror": True,
        "scale": 0.5})
    assert rgb.out_shape == (3, 4, 4)
    data.feed(data.batch(0))
    run(data)
    run(rgb, "test")  # tests: the centre, no mirror
    centred = (x - mean)[:, :, 1:5, 1:5] * 0.5
    np.testing.assert_allclose(rgb.data.numpy(), centred, rtol=1e-5)
    run(rgb, "train", seed=4)  # training: the crops and flips of the generator's draws
    gen = np.random.default_rng(4)
    top, left = gen.integers(0, 3, 4), gen.integers(0, 3, 4)
    flip = gen.random(4) < 0.5
    for k in range(4):
        want = (x[k] - mean)[:, top[k]:top[k] + 4, left[k]:left[k] + 4] * 0.5
        if flip[k]:
            want = want[:, :, ::-1]
        np.testing.assert_allclose(rgb.data[k].numpy(), want, rtol=1e-5)


def test_image_preprocess(tmp_path: Path) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 5))
    layer = make("kImagePreprocess", [Source(x)], rgbimage_conf={"cropsize": 3, "scale": 2})
    run(layer, "test")
    np.testing.assert_allclose(layer.data.numpy(), x[:, :, 1:4, 1:4] * 2)
    with pytest.raises(ParamError, match="cropsize 6 is larger than the images"):
        make("kImagePreprocess", [Source(x)], rgbimage_conf={"cropsize": 6})


def test_onehot_rnn_label_and_dummy(tmp_path: Path) -> None:
    ids = Source(np.array([[2], [0], [3]]), "ids")
    onehot = make("kOneHot", [ids], onehot_conf={"vocab_size": 4})
    run(onehot)
    np.testing.assert_array_equal(onehot.data.numpy(), np.eye(4)[[2, 0, 3]])
    bad = make("kOneHot", [Source(np.array([[5]]), "ids")], onehot_conf={"vocab_size": 4})
    with pytest.raises(ParamError, match=r"an id is outside \[0, 4\)"):
        run(bad)
    dummy = make("kRNNDummy", [], rnn_dummy_conf={"shape": [3], "integer": True, "low": 0,
                                                  "high": 5})
    assert dummy.id_range() == (0, 4) and dummy.batchsize == 3
    dummy.feed(dummy.batch(0))
    run(dummy)
    assert dummy.data.dtype == torch.int64 and int(dummy.data.max()) < 5
    with pytest.raises(ParamError, match="reads a kCharRNN"):
        make("kRNNLabel", [ids])
    vocab = tmp_path / "v.txt"
    vocab.write_text("xyz")
    out = make("kCharRNNOutput", [Source(np.array([[2], [0]]), "argsort")],
               char_rnn_conf={"vocab_path": str(vocab)})
    out.stream = open(tmp_path / "out.txt", "w")  # type: ignore[attr-defined]
    run(out)
    out.stream.close()  # type: ignore[attr-defined]
    assert out.text == "zx" and (tmp_path / "out.txt").read_text() == "zx"  # type: ignore


def test_char_rnn_input_checks_its_files(tmp_path: Path) -> None:
    vocab = tmp_path / "v.txt"
    vocab.write_text("ab")
    (tmp_path / "t.txt").write_text("abc")
    with pytest.raises(ParamError, match=r"holds characters that are not in the vocabulary"):
        make("kCharRNN", [], char_rnn_conf={"path": str(tmp_path / "t.txt"),
                                            "vocab_path": str(vocab)})
    vocab.write_text("aab")
    with pytest.raises(ParamError, match="holds a character twice"):
        make("kCharRNN", [], char_rnn_conf={"path": str(tmp_path / "t.txt"),
                                            "vocab_path": str(vocab)})


def test_slice_in_a_net_against_central_differences() -> None:
    """kSlice's pieces go to its readers in order; the whole net's gradient (float64)."""
    job = parse_job("""neuralnet {
      layer { name: "data" type: kData data_conf { batchsize: 4 } }
      layer { name: "fc" type: kInnerProduct srclayers: "data"
              innerproduct_conf { num_output: 6 } }
      layer { name: "slice" type: kSlice srclayers: "fc"
              slice_conf { slice_dim: 1 num_slices: 2 } }
      layer { name: "a" type: kTanh srclayers: "slice" }
      layer { name: "b" type: kSigmoid srclayers: "slice" }
      layer { name: "cat" type: kConcate srclayers: "b" srclayers: "a"
              concate_conf { concate_dim: 1 num_concates: 2 } }
      layer { name: "fc2" type: kInnerProduct srclayers: "cat"
              innerproduct_conf { num_output: 10 } }
      layer { name: "loss" type: kSoftmaxLoss srclayers: "fc2" } }""")
    net = Net(job.neuralnet, dtype=np.float64, phases=("kTrain",))
    pset = net.make_params()
    batch = net.batch(0)
    net.train_step(batch)
    fc = net["fc"].data.numpy()
    np.testing.assert_allclose(net["a"].data.numpy(), np.tanh(fc[:, :3]))
    np.testing.assert_allclose(net["b"].data.numpy(), 1 / (1 + np.exp(-fc[:, 3:])))
    grads = pset.grads.copy()
    for i in np.random.default_rng(0).choice(pset.values.size, 30, replace=False):
        old = pset.values[i]
        pset.values[i] = old + 1e-6
        hi = net.forward(batch)["loss"]
        pset.values[i] = old - 1e-6
        lo = net.forward(batch)["loss"]
        pset.values[i] = old
        assert grads[i] == pytest.approx((hi - lo) / 2e-6, rel=1e-5, abs=1e-9)
    bad = parse_job("""neuralnet { layer { name: "data" type: kData }
      layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf {
              num_output: 6 } }
      layer { name: "s" type: kSlice srclayers: "fc" slice_conf { slice_dim: 1
              num_slices: 4 } } }""")
    with pytest.raises(ParamError, match="num_slices 4 does not divide axis 1 of size 6"):
        Net(bad.neuralnet, phases=("kTrain",))


def test_the_shipped_digits_are_scikit_learns() -> None:
    """The main job's data ships with paramserver (no scikit-learn needed): the same values,
    labels and order as scikit-learn's load_digits, where it is installed."""
    from paramserver.train.data import DIGITS_FILE, _load_digits

    assert DIGITS_FILE.stat().st_size < 64 * 1024
    x, y = _load_digits(normalize=False)
    assert x.shape == (1797, 64) and y.shape == (1797,) and x.max() == 16
    datasets = pytest.importorskip("sklearn.datasets")
    want_x, want_y = datasets.load_digits(return_X_y=True)
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)
