"""Partitioning within a worker group (partition_dim 0 and 1): a partitioned job computes
what the unpartitioned one does, to float tolerance."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from paramserver import ParamError
from paramserver.config.job import JobConf, parse_job
from paramserver.singa.datasets import write_dataset
from paramserver.train.jobfile import read_job_file
from paramserver.train.net import Net
from paramserver.train.trainer import Trainer

HYBRID = Path(__file__).resolve().parents[1] / "examples" / "singa" / "cifar10" / "hybrid.conf"

MLP = """
train_steps: {steps} seed: 2 disp_freq: 1
updater {{ type: kSGD momentum: 0.9 weight_decay: 0.001 learning_rate {{ base_lr: 0.1 }} }}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ batchsize: 12 shuffle: false }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data" partition_dim: {a}
           innerproduct_conf {{ num_output: 16 }} }}
  layer {{ name: "act" type: kSTanh srclayers: "fc1" partition_dim: {a} }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act" partition_dim: {b}
           innerproduct_conf {{ num_output: 12 transpose: true }} }}
  layer {{ name: "fc3" type: kInnerProduct srclayers: "fc2"
           innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc3" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: {k} workspace: "{ws}" }}
"""

CONV = """
train_steps: {steps} seed: 4 disp_freq: 1
updater {{ type: kSGD momentum: 0.5 learning_rate {{ base_lr: 0.05 }} }}
neuralnet {{
  partition_dim: {a}
  layer {{ name: "data" type: kData data_conf {{ batchsize: 8 shuffle: false
           source: "{data}" }} }}
  layer {{ name: "conv" type: kConvolution srclayers: "data"
           convolution_conf {{ num_filters: 4 kernel: 3 pad: 1 }}
           param {{ name: "w" init {{ type: kGaussian std: 0.3 }} }} }}
  layer {{ name: "pool" type: kPooling srclayers: "conv" pooling_conf {{ kernel: 2 }} }}
  layer {{ name: "relu" type: kReLU srclayers: "pool" }}
  layer {{ name: "ip" type: kInnerProduct srclayers: "relu" partition_dim: 0
           innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: {k} workspace: "{ws}" }}
"""


def trained(job: JobConf, tmp_path: Path) -> tuple[dict[str, np.ndarray], list[float]]:
    trainer = Trainer(job, progress=False, tensorboard=False, base_dir=tmp_path)
    try:
        trainer.train()
    finally:
        trainer.close()
    values = {p.name: p.data.copy() for p in trainer.params.owners}
    return values, [r.loss for r in trainer.log.rows if r.phase == "train"]


def assert_same(a: tuple[dict[str, np.ndarray], list[float]],
                b: tuple[dict[str, np.ndarray], list[float]]) -> None:
    assert a[0].keys() == b[0].keys()
    for name in a[0]:
        np.testing.assert_allclose(a[0][name], b[0][name], rtol=2e-4, atol=2e-6,
                                   err_msg=name)
    np.testing.assert_allclose(a[1], b[1], rtol=2e-4)


@pytest.mark.parametrize(("a", "b"), [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_feature_partitioned_mlp_equals_the_unpartitioned_one(tmp_path: Path, a: int,
                                                               b: int) -> None:
    def job(k: int) -> JobConf:
        return parse_job(MLP.format(steps=4, a=a, b=b, k=k, ws=tmp_path / f"ws{k}"))

    one = trained(job(1), tmp_path)
    assert_same(trained(job(2), tmp_path), one)
    assert_same(trained(job(4), tmp_path), one)


def images(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    np.savez(tmp_path / "images.npz", x=x.reshape(-1, 1, 8, 8) / 16, y=y)


def test_feature_partitioned_convolution_equals_the_unpartitioned_one(tmp_path: Path) -> None:
    images(tmp_path)

    def job(k: int, a: int) -> JobConf:
        return parse_job(CONV.format(steps=3, a=a, k=k, ws=tmp_path / f"ws{k}{a}",
                                     data=tmp_path / "images.npz"))

    one = trained(job(1, 1), tmp_path)
    assert_same(trained(job(2, 1), tmp_path), one)
    assert_same(trained(job(2, 0), tmp_path), one)  # the batch: as today


def test_the_connection_layers_of_a_partitioned_net(tmp_path: Path) -> None:
    from paramserver.train.partition import Comm, GroupExchange

    conf = parse_job(MLP.format(steps=1, a=1, b=0, k=2, ws=tmp_path)).neuralnet
    net = Net(conf, phases=("kTrain",), comm=Comm(1, 2, GroupExchange(2)))
    names = [x.name for x in net.layers]
    assert names == ["data", "concate(data)@batch", "fc1", "act", "concate(act)@features",
                     "slice(concate(act)@features)@batch", "fc2", "fc3", "loss"]
    assert net["fc1"].out_shape == (8,) and net["act"].out_shape == (8,)
    assert [s.shape for s in net.param_specs()][:2] == [(16, 64), (16,)]  # the whole


def test_singas_hybrid_cifar10_equals_its_unpartitioned_run(tmp_path: Path) -> None:
    """SINGA's cifar10/hybrid.conf (2 workers: convolutions on the batch, the last inner
    product on the features) against the same job on one worker."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        for split in ("train", "test"):
            write_dataset("digits", f"examples/cifar10/{split}_data.bin", split=split,
                          shape=(3, 32, 32), mean="examples/cifar10/image_mean.bin"
                          if split == "train" else None)
        runs = []
        for k in (2, 1):
            job = read_job_file(HYBRID, [
                "train_steps=3", "test_freq=0", "test_steps=0", "disp_freq=1",
                "neuralnet.layer[data].store_conf.batchsize=8", f"workspace=ws{k}",
                f"cluster.nworkers_per_group={k}",
                "updater.learning_rate.fixedstep_conf.step_lr=[0.05, 0.01, 0.001]"]).job
            runs.append(trained(job, tmp_path))
        assert_same(runs[0], runs[1])
    finally:
        os.chdir(old)


def test_what_cannot_be_partitioned_on_the_features(tmp_path: Path) -> None:
    from paramserver.train.partition import Comm, GroupExchange

    bad = MLP.format(steps=1, a=1, b=0, k=2, ws=tmp_path).replace(
        "num_output: 16", "num_output: 15")
    with pytest.raises(ParamError, match=r"layer 'fc1' \(kInnerProduct\): num_output 15 does "
                                         "not split among the 2 workers"):
        Net(parse_job(bad).neuralnet, phases=("kTrain",), comm=Comm(0, 2, GroupExchange(2)))
    images(tmp_path)
    lrn = CONV.format(steps=1, a=1, k=2, ws=tmp_path, data=tmp_path / "images.npz").replace(
        'layer { name: "relu" type: kReLU', 'layer { name: "relu" type: kLRN')
    with pytest.raises(ParamError, match=r"layer 'relu' \(kLRN\) cannot be partitioned on the "
                                         "features"):
        Net(parse_job(lrn).neuralnet, phases=("kTrain",), comm=Comm(0, 2, GroupExchange(2)))
    # a worker whose group's workers are elsewhere (a Ray actor) waits for them in vain
    alone = GroupExchange(2, timeout=0.05)
    with pytest.raises(ParamError, match=r"worker 0 of the group waited 0.05 s .* from "
                                         r"workers \[1\]: partition_dim 1 needs the workers "
                                         r"of a group in one process"):
        alone.all_gather(0, 0, np.zeros(1), "layer 'fc1' (forward)")



def test_feature_partitioning_on_ray_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Ray runs every worker in its own process: the parts could not be exchanged. The job
    is refused when the trainer is made (no actor started, no timeout waited for)."""
    text = MLP.format(steps=1, a=1, b=0, k=2, ws=tmp_path / "ws").replace(
        "nworkers_per_group: 2", 'nworkers_per_group: 2 backend: "ray"')
    with pytest.raises(ParamError, match=r"layers 'fc1', 'act' are partitioned on the "
                                         r"features \(partition_dim 1\): .* cluster.backend "
                                         "'ray' runs every worker in a process of its own"):
        Trainer(parse_job(text), progress=False, tensorboard=False, base_dir=tmp_path)
    assert Net(parse_job(text).neuralnet, phases=("kTrain",)).partitioned_on_features() == [
        "fc1", "act"]
