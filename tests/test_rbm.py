"""RBMs and contrastive divergence (kCD) against a reference written out in NumPy, and SINGA's
rbm1 -> rbm2 -> rbm3 -> rbm4 -> autoencoder chain through checkpoint_path."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from paramserver import ParamError
from paramserver.cli import main
from paramserver.config.job import TrainOneBatchConf, parse_job
from paramserver.singa.datasets import write_dataset
from paramserver.train import algorithms
from paramserver.train.metrics import MetricsLog
from paramserver.train.net import Net

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "singa" / "rbm"


def rbm_net(tmp_path: Path, gaussian: bool = False, below: bool = False) -> Net:
    x = np.random.default_rng(0).random((12, 6))
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(12, np.int64))
    layers = f"""
      layer {{ name: "data" type: kData data_conf {{ source: "{tmp_path / 'd.npz'}"
               batchsize: 4 test_fraction: 0 shuffle: false }} }}
      {'layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf '
       '{ num_output: 6 } param { name: "wf" init { type: kGaussian std: 0.3 } } } '
       'layer { name: "sig" type: kSigmoid srclayers: "fc" }' if below else ''}
      layer {{ name: "vis" type: kRBMVis srclayers: "{'sig' if below else 'data'}"
               srclayers: "hid" rbm_conf {{ hdim: 3 }}
               param {{ name: "w" init {{ type: kGaussian std: 0.5 }} }}
               param {{ name: "c" init {{ type: kGaussian std: 0.1 }} }} }}
      layer {{ name: "hid" type: kRBMHid srclayers: "vis"
               rbm_conf {{ hdim: 3 gaussian: {str(gaussian).lower()} }}
               param {{ name: "w_" share_from: "w" }}
               param {{ name: "b" init {{ type: kGaussian std: 0.1 }} }} }}"""
    job = parse_job(f"train_one_batch {{ alg: kCD }} neuralnet {{ {layers} }}")
    net = Net(job.neuralnet, seed=3, dtype=np.float64, phases=("kTrain",))
    net.make_params()
    return net


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_cd_k_against_a_reference(tmp_path: Path, gaussian: bool, k: int) -> None:
    net = rbm_net(tmp_path, gaussian)
    w, c, b = (net["vis"].params[0].data.copy(), net["vis"].params[1].data.copy(),
               net["hid"].params[1].data.copy())
    batch = net.batch(0)
    metrics = algorithms.contrastive_divergence(net, batch, k, np.random.default_rng(9))
    # the reference, with the same draws from the same generator
    gen = np.random.default_rng(9)
    v_pos = batch.x
    h_pos = v_pos @ w.T + b if gaussian else sigmoid(v_pos @ w.T + b)

    def sample(h: np.ndarray) -> np.ndarray:
        if gaussian:
            return h + gen.standard_normal(h.shape)
        return (gen.random(h.shape) < h).astype(np.float64)

    h = h_pos
    for i in range(k):
        v_neg = sigmoid(sample(h) @ w + c)
        if i == 0:
            error = ((v_pos - v_neg) ** 2).sum() / 4
        h = v_neg @ w.T + b if gaussian else sigmoid(v_neg @ w.T + b)
    h_neg = h
    pset = net._pset
    assert pset is not None
    np.testing.assert_allclose(pset["w"].grad, (h_neg.T @ v_neg - h_pos.T @ v_pos) / 4,
                               rtol=1e-10)
    np.testing.assert_allclose(pset["c"].grad, (v_neg - v_pos).mean(0), rtol=1e-10)
    np.testing.assert_allclose(pset["b"].grad, (h_neg - h_pos).mean(0), rtol=1e-10)
    assert not np.any(pset["w_"].grad)  # the hidden layer's share gets no gradient
    assert metrics["loss"] == pytest.approx(error)


def test_cd_trains_only_the_rbm_and_freezes_the_rest(tmp_path: Path) -> None:
    net = rbm_net(tmp_path, below=True)
    alg = TrainOneBatchConf.parse({"alg": "kCD", "cd_conf": {"cd_k": 1}})
    assert algorithms.frozen_params(net, alg) == {"wf", "fc_1"}
    assert algorithms.frozen_params(net, TrainOneBatchConf.parse({"alg": "kBP"})) == set()
    algorithms.train_step(net, alg, net.batch(0), np.random.default_rng(0))
    assert net._pset is not None and not np.any(net._pset["wf"].grad)
    with pytest.raises(ParamError, match="cd_k must be at least 1"):
        algorithms.contrastive_divergence(net, net.batch(0), 0)


def test_rbm_structure_errors(tmp_path: Path) -> None:
    base = ('layer { name: "data" type: kData data_conf { batchsize: 4 } } '
            'layer { name: "vis" type: kRBMVis srclayers: "data" rbm_conf { hdim: 3 } } ')
    loss = 'layer { name: "l" type: kEuclideanLoss srclayers: "vis" srclayers: "data" }'
    with pytest.raises(ParamError, match="reads its input and its hidden layer"):
        Net(parse_job("neuralnet { " + base + loss + " }").neuralnet)
    with pytest.raises(ParamError, match="reads its kRBMVis"):
        Net(parse_job('neuralnet { layer { name: "data" type: kData } layer { name: "hid" '
                      'type: kRBMHid srclayers: "data" rbm_conf { hdim: 3 } } }').neuralnet)


def losses(workspace: str) -> list[float]:
    log = MetricsLog(Path(workspace) / "metrics.csv")
    log.load()
    return [r.loss for r in log.rows if r.phase == "train"]


def test_the_rbm_chain_as_written(cwd: Path) -> None:
    """rbm1 -> rbm2 -> rbm3 -> rbm4 -> autoencoder, each loading the one before (all of
    them, for the autoencoder) from SINGA checkpoints: a few steps each."""
    for split in ("train", "test"):
        write_dataset("digits", f"examples/mnist/{split}_data.bin", split=split,
                      shape=(28, 28))
    steps = 4
    for name in ("rbm1", "rbm2", "rbm3", "rbm4", "autoencoder"):
        shutil.copy(EXAMPLES / f"{name}.conf", f"{name}.conf")
        args = ["train", f"{name}.conf", "--steps", str(steps), "--quiet", "--no-tensorboard",
                "--set", "disp_freq=2", "--set", "test_freq=0", "--set", "test_steps=1"]
        if name != "rbm1":  # the files name step6000 checkpoints: these runs made step4's
            before = ["rbm4", "rbm3", "rbm2", "rbm1"] if name == "autoencoder" else \
                [f"rbm{int(name[-1]) - 1}"]
            paths = ", ".join(f'"examples/rbm/{b}/checkpoint/step{steps}-worker0"'
                              for b in before)
            args += ["--set", f"checkpoint_path=[{paths}]"]
        assert main(args) == 0, name
        got = losses(f"examples/rbm/{name}")
        assert all(math.isfinite(x) for x in got) and got[-1] < got[0], (name, got)
    # rbm2 started from rbm1's weights: its frozen w1 is rbm1's last
    from paramserver.singa.checkpoints import read_checkpoint

    w1 = {s.name: s.values for s in read_checkpoint(
        f"examples/rbm/rbm1/checkpoint/step{steps}-worker0")}["0#w1"]  # v0.2.0's names
    again = {s.name: s.values for s in read_checkpoint(
        f"examples/rbm/rbm2/checkpoint/step{steps}-worker0")}["0#w1"]
    np.testing.assert_array_equal(w1, again)
