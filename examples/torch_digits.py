"""A small convolutional network on scikit-learn's digits, trained through paramserver.

The model is an ordinary ``torch.nn.Module``; paramserver manages its parameters: SINGA's
SGD updater with momentum and a step learning-rate schedule, biases with twice the rate and
no weight decay (as SINGA's examples configure them), all from one job text.

    python examples/torch_digits.py               # one process: paramserver.torch.Optimizer
    python examples/torch_digits.py --workers 2   # 2 synchronous workers on the cluster
    python examples/torch_digits.py --state-dtype int8   # the updater's state in 8 bits
    python examples/torch_digits.py --save digits.ckpt.safetensors   # and keep a checkpoint,
    paramserver export digits.ckpt.safetensors --to digits.safetensors   # then the model:
    # DigitsCNN().load_state_dict(safetensors.torch.load_file("digits.safetensors"))

Needs ``pip install 'paramserver[torch,examples]'`` (PyTorch and scikit-learn).
"""

from __future__ import annotations

import os

# OpenMP threads that spin while they wait (the default) steal the CPU from one another when
# the cores are shared (torch's and numba's threads, several workers, a busy machine); set
# before torch and numba load OpenMP. See docs/torch.md, "Threads".
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import paramserver.torch as pst

JOB = """
name: "torch-digits"
train_steps: 300
seed: 1
updater {
  type: kSGD
  momentum: 0.9
  weight_decay: 0.0005
  learning_rate { type: kStep base_lr: 0.05 step_conf { change_freq: 120 gamma: 0.3 } }
}
cluster { nworkers_per_group: 1 }
param { name: "*.bias" lr_scale: 2 wd_scale: 0 }
"""
BATCH = 64


class DigitsCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def load() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (n, 1, 8, 8) in [0, 1]
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.2,
                                              random_state=0, stratify=digits.target)
    return (torch.from_numpy(x_tr), torch.from_numpy(y_tr).long(),
            torch.from_numpy(x_te), torch.from_numpy(y_te).long())


def batch_indices(step: int, n: int, seed: int) -> torch.Tensor:
    """The examples of ``step``: epochs in a fresh order each, a function of the step alone."""
    per_epoch = n // BATCH
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return order[k * BATCH:(k + 1) * BATCH]


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description="CNN on digits, trained through paramserver")
    ap.add_argument("--workers", type=int, default=0,
                    help="train on the embedded cluster with this many synchronous workers "
                         "(default: one process, paramserver.torch.Optimizer)")
    ap.add_argument("--save", metavar="CKPT", help="write a paramserver checkpoint here at the "
                    "end (paramserver export turns it into a model file)")
    ap.add_argument("--steps", type=int, help="train this many steps (default: the job's)")
    ap.add_argument("--state-dtype", choices=("float32", "bfloat16", "int8"),
                    help="keep the updater's state (the momentum history) in this type "
                         "(default: the job's, float32)")
    args = ap.parse_args()
    job = pst.parse_job(JOB, "torch_digits.job")
    if args.state_dtype:
        job.conf.updater.state_dtype = args.state_dtype
    steps, seed = args.steps or job.conf.train_steps, job.conf.seed
    x_tr, y_tr, x_te, y_te = load()
    torch.manual_seed(seed)
    model = DigitsCNN()
    loss_of = torch.nn.functional.cross_entropy
    t0 = time.perf_counter()

    if args.workers <= 0:
        opt = pst.Optimizer(model.named_parameters(), job.conf.updater, param_conf=job.params)
        for step in range(steps):
            idx = batch_indices(step, len(x_tr), seed)
            opt.zero_grad()
            loss = loss_of(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            if step % 100 == 0 or step == steps - 1:
                print(f"step {step:4d}  loss {loss.item():.4f}  "
                      f"lr {opt.param_groups[0]['lr']:.4f}")
        how = "paramserver.torch.Optimizer"
        if args.save:
            opt.save_checkpoint(args.save)
    else:
        job.conf.cluster.nworkers_per_group = args.workers

        def loss_fn(m: torch.nn.Module, step: int, rank: int, nworkers: int) -> torch.Tensor:
            idx = batch_indices(step, len(x_tr), seed)
            share = idx[rank::nworkers]  # each worker its share of the step's batch
            return loss_of(m(x_tr[share]), y_tr[share])

        def report(step: int, metrics: list) -> None:
            if step % 100 == 0 or step == steps - 1:
                losses = [m["loss"] for m in metrics if m]
                print(f"step {step:4d}  loss {np.mean(losses):.4f} (mean of "
                      f"{len(losses)} workers)")

        tc = pst.TorchCluster(model, job)
        tc.run(loss_fn, steps, on_step=report)
        how = f"{args.workers} workers on paramserver's embedded cluster"
        if args.save:
            tc.save_checkpoint(args.save)

    print(f"trained {steps} steps with {how} in {time.perf_counter() - t0:.1f} s")
    print(f"test accuracy: {accuracy(model, x_te, y_te):.4f} "
          f"(train {accuracy(model, x_tr, y_tr):.4f})")
    if args.save:
        print(f"checkpoint: {args.save} (paramserver export {args.save} --to model.safetensors)")


if __name__ == "__main__":
    main()
