"""The job's ``gpu``: a worker's net on that GPU when torch sees one (the cuDNN-named layers
then use cuDNN through torch), the same values as on the CPU; else the CPU, with a warning.
The GPU tests are skipped where torch sees no CUDA device."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from paramserver.config.job import parse_job  # noqa: E402
from paramserver.train import trainer as trainer_module  # noqa: E402
from paramserver.train.trainer import Trainer, worker_device  # noqa: E402

CUDA = torch.cuda.is_available()

JOB = """
train_steps: 4 seed: 3 disp_freq: 1 {gpu}
updater {{ type: kSGD momentum: 0.9 learning_rate {{ base_lr: 0.05 }} }}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ batchsize: 16 source: "{data}" }} }}
  layer {{ name: "conv" type: kCudnnConv srclayers: "data"
           convolution_conf {{ num_filters: 4 kernel: 3 pad: 1 }}
           param {{ name: "w" init {{ type: kGaussian std: 0.3 }} }} }}
  layer {{ name: "pool" type: kCudnnPool srclayers: "conv" pooling_conf {{ kernel: 2 }} }}
  layer {{ name: "norm" type: kCudnnLRN srclayers: "pool" lrn_conf {{ local_size: 3 }} }}
  layer {{ name: "act" type: kCudnnActivation srclayers: "norm" }}
  layer {{ name: "ip" type: kInnerProduct srclayers: "act" innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kCudnnSoftmaxLoss srclayers: "ip" srclayers: "data" }}
}}
cluster {{ workspace: "{ws}" }}
"""


def job_text(tmp_path: Path, gpu: str, ws: str) -> str:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    np.savez(tmp_path / "images.npz", x=x.reshape(-1, 1, 8, 8) / 16, y=y)
    return JOB.format(gpu=gpu, data=tmp_path / "images.npz", ws=tmp_path / ws)


def train(text: str) -> dict[str, np.ndarray]:
    trainer = Trainer(parse_job(text), progress=False, tensorboard=False)
    trainer.train()
    return {p.name: p.data.copy() for p in trainer.params.owners}


def test_without_a_gpu_the_job_runs_on_the_cpu(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    trainer_module._warned_gpu.clear()
    job = parse_job(job_text(tmp_path, "gpu: 7", "ws"))
    with caplog.at_level(logging.WARNING, logger="paramserver"):
        device = worker_device(job, 0)
    if CUDA and torch.cuda.device_count() > 7:
        assert device == "cuda:7"
        return
    assert device is None
    assert "the job asks for GPU 7 (gpu) but torch sees" in caplog.text
    assert "computing on the CPU" in caplog.text


@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
def test_the_gpu_computes_what_the_cpu_does(tmp_path: Path) -> None:
    on_gpu = train(job_text(tmp_path, "gpu: 0", "gpu"))
    on_cpu = train(job_text(tmp_path, "", "cpu"))
    for name, value in on_cpu.items():
        np.testing.assert_allclose(on_gpu[name], value, rtol=1e-3, atol=1e-5, err_msg=name)


@pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
def test_a_net_on_the_gpu_keeps_its_params_on_the_host(tmp_path: Path) -> None:
    from paramserver.train.net import Net

    job = parse_job(job_text(tmp_path, "gpu: 0", "ws"))
    net = Net(job.neuralnet, phases=("kTrain",), device="cuda:0")
    pset = net.make_params()
    assert str(net["conv"].weights[0].device).startswith("cuda")
    net.train_step(0)
    assert np.any(pset["w"].grad != 0)  # the gradients come back to host memory
    trainer = Trainer(job, progress=False, tensorboard=False)
    before = trainer.params["w"].data.copy()
    trainer.train()
    assert not np.array_equal(trainer.params["w"].data, before)
