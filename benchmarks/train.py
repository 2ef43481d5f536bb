"""Training steps/s of paramserver against a plain PyTorch loop of the same model, same run.

Two jobs: the main job (``examples/digits_mlp.conf``: a 64-128-10 MLP with SINGA's scaled
tanh, SGD with momentum, weight decay, a step schedule and per-Param lr/wd scales) and
SINGA's cifar10 job (``v0.2.0/examples/cifar10/job.conf``: three convolutions with max and
average pooling and LRN, on digits resampled to 3x32x32 by ``paramserver data``, made in a
temporary folder). For each job:

* **paramserver**: :meth:`Trainer.run_steps` — the embedded cluster, a worker computing the
  layers with torch (tensors viewing the flat Param buffers), the servers' updater;
* **plain PyTorch**: the same model as ``torch.nn`` modules with the same initial values,
  ``torch.optim.SGD`` (momentum, weight decay, lr and wd scales as parameter groups, the
  job's learning-rate schedule each step), ``cross_entropy``, ``loss.item()`` per step.

Both read the same batches (the job's input layer) and use the same torch threads (the
job's ``num_openblas_threads``, or ``--threads``). The contenders alternate, round after
round, so that machine noise falls on both; the table gives min / median / max steps/s,
the ratio of the medians (target: paramserver at least 0.85 of the plain loop) and the load
average.

    python benchmarks/train.py [--rounds 5] [--mlp-steps 1500] [--cifar-steps 12]
                               [--threads N] [--jobs mlp cifar10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from paramserver.singa.datasets import write_dataset
from paramserver.train.jobfile import read_job_file
from paramserver.train.layers.dense import STANH_A, STANH_B
from paramserver.train.net import Net
from paramserver.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
MLP_JOB = ROOT / "examples" / "digits_mlp.conf"
CIFAR_JOB = ROOT / "tests" / "data" / "singa" / "v0.2.0" / "examples" / "cifar10" / "job.conf"
TARGET = 0.85


class STanh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * STANH_B) * STANH_A


class Flatten(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1)


def mlp_model() -> tuple[torch.nn.Module, list[str]]:
    """The main job's net; the Param names of its parameters, in order."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), STanh(), torch.nn.Linear(128, 10))
    return model, ["w1", "b1", "w2", "b2"]


def cifar_model() -> tuple[torch.nn.Module, list[str]]:
    """SINGA's cifar10 net (conv, max pool, relu, LRN; conv, relu, avg pool, LRN; conv,
    relu, avg pool; inner product)."""
    lrn = dict(size=3, alpha=5e-05, beta=0.75, k=1.0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, 1, 2), torch.nn.MaxPool2d(3, 2), torch.nn.ReLU(),
        torch.nn.LocalResponseNorm(**lrn),
        torch.nn.Conv2d(32, 32, 5, 1, 2), torch.nn.ReLU(), torch.nn.AvgPool2d(3, 2),
        torch.nn.LocalResponseNorm(**lrn),
        torch.nn.Conv2d(32, 64, 5, 1, 2), torch.nn.ReLU(), torch.nn.AvgPool2d(3, 2),
        Flatten(), torch.nn.Linear(64 * 3 * 3, 10))
    return model, ["w1", "b1", "w2", "b2", "w3", "b3", "w4", "b4"]


class Contender:
    """A job trained two ways; each ``run_*`` returns the seconds of ``steps`` steps."""

    def __init__(self, job_path: Path, model: tuple[torch.nn.Module, list[str]],
                 settings: dict[str, Any], threads: int | None, workdir: Path):
        self.job_file = read_job_file(job_path)
        job = self.job_file.job
        job.update({"test_freq": 0, "test_steps": 0, "checkpoint_freq": 0,
                    "workspace": str(workdir / "ws"), **settings})
        if threads is not None:
            job.update({"num_openblas_threads": threads})
        self.job = job
        self.model, self.names = model
        self.step = 0
        trainer = self.trainer()
        self.input = Net(job.neuralnet, seed=job.seed, phases=("kTrain",),
                         base_dir=self.job_file.base_dir).data_layer
        with torch.no_grad():  # the same initial values as paramserver's Params
            for p, name in zip(self.model.parameters(), self.names, strict=True):
                p.copy_(torch.from_numpy(trainer.params[name].data).reshape(p.shape))
        self.lr = trainer.cluster.updater.lr
        u = job.updater
        groups = []
        for p, name in zip(self.model.parameters(), self.names, strict=True):
            spec = trainer.params[name]
            groups.append({"params": [p], "lr_scale": spec.lr_scale,
                           "weight_decay": float(u.weight_decay) * spec.wd_scale})
        self.optimizer = torch.optim.SGD(groups, lr=self.lr(0), momentum=float(u.momentum))
        trainer.close()

    def trainer(self) -> Trainer:
        return Trainer(self.job, progress=False, tensorboard=False,
                       base_dir=self.job_file.base_dir)

    def run_paramserver(self, steps: int) -> float:
        trainer = self.trainer()
        trainer.run_steps(1)  # warm-up: the first put, first allocations
        t = time.perf_counter()
        trainer.run_steps(steps, start=1)
        seconds = time.perf_counter() - t
        trainer.close()
        return seconds

    def run_plain(self, steps: int) -> float:
        before = torch.get_num_threads()
        torch.set_num_threads(int(self.job.num_openblas_threads))
        try:
            self._plain_steps(1, 0)
            t = time.perf_counter()
            self._plain_steps(steps, 1)
            return time.perf_counter() - t
        finally:
            torch.set_num_threads(before)

    def _plain_steps(self, steps: int, start: int) -> None:
        model, opt = self.model, self.optimizer
        for step in range(start, start + steps):
            batch = self.input.batch(step)
            x = torch.from_numpy(self.input.transform(batch.x))
            y = torch.from_numpy(batch.y)
            lr = self.lr(step)
            for group in opt.param_groups:
                group["lr"] = lr * group["lr_scale"]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()


def measure(name: str, contender: Contender, steps: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"paramserver": [], "plain PyTorch": []}
    order: list[tuple[str, Callable[[int], float]]] = [
        ("paramserver", contender.run_paramserver), ("plain PyTorch", contender.run_plain)]
    for r in range(rounds):
        for label, fn in (order if r % 2 == 0 else order[::-1]):
            runs[label].append(steps / fn(steps))
        print(f"  {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {v[-1]:.1f}" for k, v in runs.items()) + " steps/s", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mlp-steps", type=int, default=1500)
    parser.add_argument("--cifar-steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both (default: the job's "
                             "num_openblas_threads, 1)")
    parser.add_argument("--jobs", nargs="+", default=["mlp", "cifar10"],
                        choices=["mlp", "cifar10"])
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cwd = os.getcwd()
        os.chdir(work)  # SINGA's data paths start at the working folder
        try:
            if "mlp" in args.jobs:
                c = Contender(MLP_JOB, mlp_model(), {}, args.threads, work / "mlp")
                results["main job (digits MLP)"] = measure("mlp", c, args.mlp_steps,
                                                           args.rounds)
            if "cifar10" in args.jobs:
                for split in ("train", "test"):
                    write_dataset("digits", f"examples/cifar10/{split}_data.bin",
                                  split=split, shape=(3, 32, 32),
                                  mean="examples/cifar10/image_mean.bin"
                                  if split == "train" else None)
                c = Contender(CIFAR_JOB, cifar_model(), {}, args.threads, work / "cifar")
                results["cifar10 (SINGA's job)"] = measure("cifar10", c, args.cifar_steps,
                                                           args.rounds)
        finally:
            os.chdir(cwd)
    load = os.getloadavg()
    threads = args.threads or "the job's (1)"
    print(f"\ntorch {torch.__version__}, {os.cpu_count()} CPUs, torch threads "
          f"{threads}; {args.rounds} rounds, interleaved; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'job':<24} {'contender':<14} {'min':>9} {'median':>9} {'max':>9}  "
          "ratio of medians (paramserver / plain)")
    for job, runs in results.items():
        ps, plain = (statistics.median(runs[k]) for k in ("paramserver", "plain PyTorch"))
        for label, values in runs.items():
            extra = ""
            if label == "paramserver":
                ratio = ps / plain
                extra = f"  {ratio:.2f} ({'meets' if ratio >= TARGET else 'below'} the " \
                        f"target {TARGET})"
            print(f"{job:<24} {label:<14} {min(values):9.1f} {statistics.median(values):9.1f} "
                  f"{max(values):9.1f}{extra}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
