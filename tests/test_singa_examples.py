"""SINGA's released examples run as written, on data made by ``paramserver data`` at the
paths their files name (in a temporary working folder), a few steps each with small
settings given by ``--set`` where the example is large; the loss is finite and falls."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from paramserver.cli import main
from paramserver.singa.datasets import write_dataset
from paramserver.train.metrics import MetricsLog

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "singa"
V010 = Path(__file__).parent / "data" / "singa" / "v0.1.0" / "examples"
V030 = Path(__file__).parent / "data" / "singa" / "v0.3.0" / "examples"


def data(path: str, shape: tuple[int, ...], fmt: str = "kvfile", mean: str | None = None
         ) -> None:
    for split, where in (("train", path), ("test", path.replace("train", "test"))):
        write_dataset("digits", where, fmt=fmt, split=split, shape=shape,
                      mean=mean if split == "train" else None)


def train(job: Path, steps: int, *settings: str, disp: int = 2) -> list[float]:
    """Train ``job`` (copied into the working folder) for ``steps`` steps; the training
    losses of its display rows."""
    local = Path(job.name)
    if not local.exists():
        shutil.copy(job, local)
    args = ["train", str(local), "--steps", str(steps), "--quiet", "--no-tensorboard",
            "--overwrite", "--set", f"disp_freq={disp}", "--set", "checkpoint_freq=0"]
    for s in settings:
        args += ["--set", s]
    assert main(args) == 0
    workspace = next(Path(".").rglob("metrics.csv"))
    log = MetricsLog(workspace)
    log.load()
    workspace.unlink()
    return [r.loss for r in log.rows if r.phase == "train"]


def falls(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_mnist_mlp_and_conv(cwd: Path) -> None:
    data("examples/mnist/train_data.bin", (28, 28))
    losses = train(EXAMPLES / "mnist" / "job.conf", 6, "test_steps=1")
    assert falls(losses), losses
    losses = train(EXAMPLES / "mnist" / "conv.conf", 6, "test_steps=1",
                   "neuralnet.layer[data].store_conf.batchsize=32")
    assert falls(losses), losses


@pytest.mark.parametrize("name", ["job.conf", "cudnn.conf"])
def test_cifar10_with_and_without_cudnn_names(cwd: Path, name: str) -> None:
    data("examples/cifar10/train_data.bin", (3, 32, 32), mean="examples/cifar10/image_mean.bin")
    losses = train(EXAMPLES / "cifar10" / name, 8, "test_steps=1",
                   "neuralnet.layer[data].store_conf.batchsize=16",
                   "updater.learning_rate.fixedstep_conf.step_lr=[0.01, 0.001, 0.0001]",
                   disp=4)
    assert falls(losses), losses


def test_v030_cifar10_with_batch_normalisation(cwd: Path) -> None:
    """v0.3.0's cudnn_bm.conf: kCudnnBM after each convolution, as written; its scale and
    bias train, SINGA's running statistics (s13, s14, ...) stay as initialised."""
    data("examples/cifar10/train_data.bin", (3, 32, 32), mean="examples/cifar10/image_mean.bin")
    losses = train(V030 / "cifar10" / "cudnn_bm.conf", 8, "test_steps=1",
                   "neuralnet.layer[data].store_conf.batchsize=16", disp=4)
    assert falls(losses), losses
    from paramserver.singa.checkpoints import read_checkpoint

    saved = {p.name[2:]: p.values for p in read_checkpoint("examples/cifar10/checkpoint/"
                                                           "step8-worker0")}  # 0#s11, ...
    for bm in ("1", "2", "3"):
        assert not np.any(saved[f"s{bm}3"]) and not np.any(saved[f"s{bm}4"])
        assert np.any(saved[f"s{bm}1"] != 1) and np.any(saved[f"s{bm}2"] != 0)


def test_alexnet_structure_on_small_images(cwd: Path) -> None:
    """AlexNet as written, on 3x72x72 images cropped to 67 (the smallest its pooling
    takes), two steps of batch 2."""
    data("examples/alexnet/train_record.bin", (3, 72, 72),
         mean="examples/alexnet/image_mean.bin")
    text = (EXAMPLES / "alexnet" / "job.conf").read_text()
    local = cwd / "job.conf"
    local.write_text(text.replace("/data/dataset/imagenet/", "examples/alexnet/")
                     .replace("val_record", "test_record"))
    losses = train(local, 2, "test_steps=1", "neuralnet.layer[data].store_conf.batchsize=2",
                   "neuralnet.layer[data].store_conf.shape=[3, 72, 72]",
                   "neuralnet.layer[image].rgbimage_conf.cropsize=67", disp=1)
    assert all(math.isfinite(x) for x in losses) and len(losses) == 2


def test_v010_shard_examples(cwd: Path) -> None:
    """v0.1.0's DataShard input with its parser layers (kMnist, kLabel, kRGBImage)."""
    data("examples/mnist/mnist_train_shard", (28, 28), fmt="shard")
    losses = train(V010 / "mnist" / "job.conf", 6, "test_steps=1",
                   "neuralnet.layer[data].sharddata_conf.batchsize=50")
    assert falls(losses), losses
    data("examples/cifar10/cifar10_train_shard", (3, 32, 32), fmt="shard",
         mean="examples/cifar10/image_mean.bin")
    losses = train(V010 / "cifar10" / "job.conf", 4, "test_steps=1",
                   "neuralnet.layer[data].sharddata_conf.batchsize=16", disp=1)
    assert all(math.isfinite(x) for x in losses)


def test_store_input_reads_in_order_after_a_random_skip(cwd: Path) -> None:
    from paramserver.config.job import LayerConf
    from paramserver.train.layers import RecordInputLayer

    write_dataset("digits", "d.bin", split="all", shape=(8, 8), encoding="float",
                  scale=1.0)
    conf = LayerConf.parse({"name": "data", "type": "kRecordInput", "store_conf": {
        "path": "d.bin", "batchsize": [500], "random_skip": 50, "shape": [64],
        "mean_value": 1.0, "std_value": 2.0}})
    layer = RecordInputLayer(conf, [], seed=3)
    layer.setup()
    n = layer.x.shape[0]
    first = layer.batch(0)
    assert 0 <= layer.skip <= 50
    np.testing.assert_array_equal(first.x, layer.x[layer.skip:layer.skip + 500])
    wrap = layer.batch(3)  # wraps around the store
    start = (layer.skip + 1500) % n
    np.testing.assert_array_equal(wrap.x, layer.x[(start + np.arange(500)) % n])
    np.testing.assert_allclose(layer.transform(first.x), (first.x - 1.0) / 2.0)
    shards = [layer.batch(0, r, 3) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate([s.x for s in shards]), first.x)
