"""The GPU paths, checked on a GPU: the parts of ``benchmarks/gpu_check.sh`` written in Python.

    python benchmarks/gpu_check.py device-update [--params 100] [--steps 100] [--rounds 7]
    python benchmarks/gpu_check.py resume
    python benchmarks/gpu_check.py autocast

- ``device-update``: ``placement="device"`` (torch operations compiled by ``torch.compile``)
  against torch's fused CUDA optimizers -- SGD with momentum, Adam, AdamW -- on a model of
  ``--params`` million float32 parameters (tensors of 2048 x 2048 and their biases). Both get
  the same gradients (drawn on the GPU from a seeded generator, step by step) for ``--steps``
  steps; the largest difference of the values must be at most 1e-6. Then the step alone is
  timed, the two interleaved, ``--rounds`` rounds: min / median / max and the ratio of the
  medians.
- ``resume``: a checkpoint written by a GPU optimizer (``placement="device"``) is loaded by a
  CPU one (``placement="host"``): values and state bit for bit; the CPU one continues; its
  checkpoint is loaded back on the GPU: bit for bit again, and the GPU run continued from it
  equals the uninterrupted GPU run bit for bit. Then the same for an offloaded bfloat16
  module (fp32 master on the host): the state_dicts of the GPU run continue on the CPU bit for
  bit, since both update the master with the same host kernels.
- ``autocast``: a float32 model under ``torch.autocast("cuda", torch.bfloat16)`` with
  ``paramserver.torch.Adam(placement="offload")`` against ``torch.optim.Adam(fused=True)`` on
  the GPU, 50 steps: the losses agree within 0.1 %, and the values are no farther from the
  fused run than 3x the distance of the same fused run started one float32 ulp away (the
  noise floor: a rounding difference, magnified by bf16 products).

Each prints its figures and ends with ``PASS`` or ``FAIL`` lines; the exit status is 1 when
any check failed. Without a GPU each says so and exits 0.
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

import torch

import paramserver.torch as pst

WIDTH = 2048
FAILED: list[str] = []
#: Where the "GPU" side runs: CUDA, or (GPU_CHECK_DEVICE=cpu) the CPU, to try the logic of
#: this script on a machine without a GPU (device placement then runs eagerly).
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def verdict(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        FAILED.append(what)


def summary(times: list[float]) -> str:
    return (f"{min(times) * 1e3:8.3f} {statistics.median(times) * 1e3:8.3f} "
            f"{max(times) * 1e3:8.3f}")


# -- device-update ------------------------------------------------------------------------------


def big_params(millions: float, device: str) -> list[torch.nn.Parameter]:
    n = max(1, round(millions * 1e6 / (WIDTH * WIDTH + WIDTH)))
    g = torch.Generator(device=device).manual_seed(0)
    out = []
    for _ in range(n):
        for shape in ((WIDTH, WIDTH), (WIDTH,)):
            out.append(torch.nn.Parameter(
                torch.randn(shape, generator=g, device=device) * 0.02))
    return out


def clones(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def set_grads(params: list[torch.nn.Parameter], grads: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)


def draw_grads(like: list[torch.nn.Parameter], step: int) -> list[torch.Tensor]:
    g = torch.Generator(device=like[0].device).manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g, device=p.device) * 1e-2 for p in like]


OPTIMIZERS: dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any]]] = {
    "SGD momentum": (torch.optim.SGD, pst.SGD, {"lr": 1e-2, "momentum": 0.9}),
    "Adam": (torch.optim.Adam, pst.Adam, {"lr": 1e-3}),
    "AdamW": (torch.optim.AdamW, pst.AdamW, {"lr": 1e-3, "weight_decay": 1e-2}),
}


def device_update(args: argparse.Namespace) -> None:
    base = big_params(args.params, DEVICE)
    n = sum(p.numel() for p in base)
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU"
    print(f"{n / 1e6:.1f}M float32 parameters in {len(base)} tensors on {where}; "
          f"torch {torch.__version__}")
    for name, (torch_cls, ours_cls, kw) in OPTIMIZERS.items():
        theirs, ours = clones(base), clones(base)
        opt_t = torch_cls(theirs, fused=True, **kw)
        t0 = time.perf_counter()
        opt_p = ours_cls(ours, placement="device", **kw)
        placement = type(opt_p.params).__name__
        worst = 0.0
        first = 0.0
        for step in range(args.steps):
            grads = draw_grads(base, step)
            set_grads(theirs, grads)
            set_grads(ours, grads)
            opt_t.step()
            opt_p.step()
            if step == 0:
                sync()
                first = time.perf_counter() - t0  # the binding and the compile included
        sync()
        for a, b in zip(theirs, ours, strict=True):
            worst = max(worst, (a.detach() - b.detach()).abs().max().item())
        print(f"{name}: {placement}; first step (binding and torch.compile) {first:.1f} s; "
              f"largest difference after {args.steps} steps {worst:.3g}")
        verdict(worst <= 1e-6, f"{name} on the device within 1e-6 of torch's fused CUDA "
                f"{torch_cls.__name__} after {args.steps} steps ({worst:.3g})")
        steps = {"paramserver": opt_p.step, "torch fused": opt_t.step}
        times: dict[str, list[float]] = {k: [] for k in steps}
        for r in range(args.rounds):
            for k in (list(steps) if r % 2 == 0 else list(reversed(steps))):
                sync()
                t = time.perf_counter()
                for _ in range(args.inner):
                    steps[k]()
                sync()
                times[k].append((time.perf_counter() - t) / args.inner)
        print(f"  step, ms over {args.rounds} rounds of {args.inner} (min median max):")
        for k, v in times.items():
            print(f"  {k:<14} {summary(v)}")
        ratio = statistics.median(times["paramserver"]) / statistics.median(times["torch fused"])
        print(f"  paramserver / torch fused: {ratio:.2f}x (median)")
        del opt_t, opt_p, theirs, ours
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


# -- resume -------------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def batch(step: int, device: str, dtype: torch.dtype = torch.float32
          ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 64, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    return x.to(device, dtype), y.to(device)


def train(model: torch.nn.Module, opt: Any, steps: range) -> None:
    device = str(next(model.parameters()).device)
    dtype = next(model.parameters()).dtype
    for s in steps:
        x, y = batch(s, device, dtype)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].detach().cpu(), b[k].detach().cpu()) for k in a)


def flat_state(opt: Any) -> dict[str, torch.Tensor]:
    sd = opt.state_dict()
    out = {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            out[f"{i}/{k}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
    return out


def values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters()}


def resume(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    # the reference: 40 steps on the GPU without a break
    torch.manual_seed(0)
    ref = MLP().to(DEVICE)
    opt_ref = pst.Adam(ref.parameters(), lr=1e-2, weight_decay=1e-4, placement="device")
    train(ref, opt_ref, range(40))

    torch.manual_seed(0)
    gpu = MLP().to(DEVICE)
    opt_gpu = pst.Adam(gpu.parameters(), lr=1e-2, weight_decay=1e-4, placement="device")
    verdict(type(opt_gpu.params).__name__ == "DeviceParams", "a CUDA module's optimizer is on "
            "the device")
    train(gpu, opt_gpu, range(20))
    opt_gpu.save_checkpoint(folder / "gpu.ckpt.safetensors")
    cpu = MLP()
    opt_cpu = pst.Adam(cpu.parameters(), lr=1e-2, weight_decay=1e-4, placement="host")
    verdict(type(opt_cpu.params).__name__ == "TorchParams", "a CPU module's optimizer is on "
            "the host")
    opt_cpu.load_checkpoint(folder / "gpu.ckpt.safetensors")
    verdict(same_tensors(values(gpu), values(cpu)), "values written on the GPU load on the "
            "CPU bit for bit")
    verdict(same_tensors(flat_state(opt_gpu), flat_state(opt_cpu)), "updater state written on "
            "the GPU loads on the CPU bit for bit")
    verdict(opt_cpu.step_count == opt_gpu.step_count == 20, "the step count travels")
    train(cpu, opt_cpu, range(20, 21))  # the CPU continues (its own kernels)
    opt_cpu.load_checkpoint(folder / "gpu.ckpt.safetensors")  # and goes back to step 20
    opt_cpu.save_checkpoint(folder / "cpu.ckpt.safetensors")
    back = MLP().to(DEVICE)
    opt_back = pst.Adam(back.parameters(), lr=1e-2, weight_decay=1e-4, placement="device")
    opt_back.load_checkpoint(folder / "cpu.ckpt.safetensors")
    verdict(same_tensors(values(gpu), values(back)) and same_tensors(flat_state(opt_gpu),
                                                                     flat_state(opt_back)),
            "GPU -> CPU -> GPU: values and state bit for bit")
    train(back, opt_back, range(20, 40))
    verdict(same_tensors(values(ref), values(back)), "the GPU run resumed from the CPU's "
            "checkpoint equals the uninterrupted GPU run bit for bit")

    # offloaded bfloat16 module: state_dicts across devices (the master is on the host)
    torch.manual_seed(0)
    m_ref = MLP().to(DEVICE, torch.bfloat16)
    o_ref = pst.Adam(m_ref.parameters(), lr=1e-2, placement="offload")
    train(m_ref, o_ref, range(30))
    torch.manual_seed(0)
    m_gpu = MLP().to(DEVICE, torch.bfloat16)
    o_gpu = pst.Adam(m_gpu.parameters(), lr=1e-2, placement="offload")
    train(m_gpu, o_gpu, range(15))
    sd_model = {k: v.cpu() for k, v in m_gpu.state_dict().items()}
    sd_opt = o_gpu.state_dict()
    m_cpu = MLP().to(torch.bfloat16)
    o_cpu = pst.Adam(m_cpu.parameters(), lr=1e-2, placement="offload")
    m_cpu.load_state_dict(sd_model)
    o_cpu.load_state_dict(sd_opt)
    verdict(same_tensors(flat_state(o_gpu), flat_state(o_cpu)), "offloaded bfloat16 module: "
            "the GPU's state_dict loads on the CPU bit for bit")
    train(m_cpu, o_cpu, range(15, 16))
    m_back = MLP().to(DEVICE, torch.bfloat16)
    o_back = pst.Adam(m_back.parameters(), lr=1e-2, placement="offload")
    m_back.load_state_dict(sd_model)
    o_back.load_state_dict(sd_opt)
    train(m_back, o_back, range(15, 30))
    verdict(same_tensors(values(m_ref), values(m_back)), "offloaded bfloat16 module resumed on "
            "the GPU from state_dicts equals the uninterrupted run bit for bit")


# -- autocast -----------------------------------------------------------------------------------


def autocast(args: argparse.Namespace) -> None:
    """Three copies of a model under bf16 autocast: paramserver's offloaded Adam, torch's
    fused Adam on the GPU, and torch's fused Adam again from values nudged by one float32
    ulp. paramserver's fp32 update rounds differently from torch's (the same rule, other
    operations); bf16 products magnify any such difference (Adam turns a gradient near zero
    into a whole step either way), and how far the nudged copy drifts is the noise floor
    against which paramserver's distance from torch is judged."""
    torch.manual_seed(0)
    models = [MLP().to(DEVICE) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    with torch.no_grad():
        for p in models[2].parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    opts = [pst.Adam(models[0].parameters(), lr=1e-3, placement="offload"),
            torch.optim.Adam(models[1].parameters(), lr=1e-3, fused=True),
            torch.optim.Adam(models[2].parameters(), lr=1e-3, fused=True)]
    worst_loss = 0.0
    losses: list[float] = []
    for s in range(50):
        x, y = batch(s, DEVICE)
        losses = []
        for m, o in zip(models, opts, strict=True):
            o.zero_grad()
            with torch.autocast(DEVICE, torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            o.step()
            losses.append(loss.item())
        worst_loss = max(worst_loss, abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-12))

    def distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
        return max((p - q).abs().max().item()
                   for p, q in zip(a.parameters(), b.parameters(), strict=True))

    ours, noise = distance(models[0], models[1]), distance(models[2], models[1])
    print(f"bf16 autocast, 50 steps: losses at the end {losses[0]:.5f} (paramserver, "
          f"offloaded), {losses[1]:.5f} (torch fused), {losses[2]:.5f} (torch fused, nudged); "
          f"largest relative loss difference from fused {worst_loss:.3g}; largest value "
          f"difference from torch: paramserver {ours:.3g}, torch nudged by 1 ulp {noise:.3g}")
    verdict(worst_loss <= 1e-3 and ours <= max(3 * noise, 1e-6),
            "bf16 autocast with the offload optimizer trains as torch's fused Adam does "
            "(losses within 0.1%, values no farther than 3x the 1-ulp noise floor)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("device-update", "resume", "autocast"))
    ap.add_argument("--params", type=float, default=100.0, help="millions (device-update)")
    ap.add_argument("--steps", type=int, default=100, help="steps compared (device-update)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds, at least 5")
    ap.add_argument("--inner", type=int, default=10, help="steps per timed round")
    args = ap.parse_args()
    args.rounds = max(5, args.rounds)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(f"{args.part}: torch sees no CUDA device; nothing to check here")
        return 0
    {"device-update": device_update, "resume": resume, "autocast": autocast}[args.part](args)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed", file=sys.stderr)
    return 1 if FAILED else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
