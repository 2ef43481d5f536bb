"""Offloading: the host's Adam step of a 100M-parameter model, and (with a GPU) the
offloaded training step.

CPU part (runs anywhere). The step that an offloading optimizer runs on the host -- Adam over
fp32 master values, gradients and two moments in host memory -- for a model of ~100M
parameters (24 tensors of 2048x2048 and their biases), by:

- ``paramserver``: ``paramserver.torch.Adam`` with the values and the state in paramserver's
  flat buffers (one fused numba kernel over all of them);
- ``deepspeed``: DeepSpeed's ``DeepSpeedCPUAdam`` (ZeRO-Offload's CPU Adam, AVX C++), when
  DeepSpeed is installed and its op builds (``pip install deepspeed``; the first build
  takes a minute or two);
- ``torch fused``: ``torch.optim.Adam(fused=True)`` on the CPU, always.

Each contender has its own copy of the parameters with the same gradients, and steps in
turn, round by round (the order rotating), so that machine noise falls on all alike. The
table gives min / median / max per contender and the ratio of each baseline's median to
paramserver's (the target is >= 1.0 against DeepSpeed's CPU Adam, or torch's fused Adam
where DeepSpeed is not installed); the load average is printed before and after.

GPU part (with CUDA only): a small transformer-like stack of Linear layers in bfloat16
trained with ``paramserver.torch.Adam(placement="offload")`` against the same model trained
fully on the GPU with ``torch.optim.Adam(fused=True)`` (fp32 parameters under bf16
autocast): training-step time, forward and backward included; the same offload with
``overlap=pst.Overlap(bucket=...)`` (each bucket's host update started during backward); and
the GPU's idle time per offloaded step, serial and overlapped (the step's time less the time
of its forward and backward alone: what the GPU waits for the host). Then 50 steps of the
serial and the overlapped offload from the same start, whose values must be equal bit for
bit.

    python benchmarks/offload.py [--rounds 7] [--params 100] [--bucket 4194304]
                                 [--no-deepspeed] [--gpu-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import paramserver.torch as pst

WIDTH = 2048


def free_memory() -> int | None:
    """Bytes of memory available now (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def make_params(millions: float) -> list[torch.Tensor]:
    """Weights of WIDTH x WIDTH and their biases, ~``millions`` million values in all, with
    gradients (random, once: a step's cost does not depend on where they come from)."""
    n = max(1, round(millions * 1e6 / (WIDTH * WIDTH + WIDTH)))
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        for shape in ((WIDTH, WIDTH), (WIDTH,)):
            p = torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02)
            p.grad = torch.randn(shape, generator=g) * 1e-3
            out.append(p)
    return out


def copy_params(params: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


def deepspeed_adam(params: list[torch.Tensor]) -> Any:
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False)


def summary(times: list[float]) -> str:
    return (f"{min(times) * 1e3:8.1f} {statistics.median(times) * 1e3:8.1f} "
            f"{max(times) * 1e3:8.1f}")


def cpu_part(args: argparse.Namespace) -> None:
    base = make_params(args.params)
    n = sum(p.numel() for p in base)
    per = n * 4 * 4  # values, gradients, two moments, float32
    contenders: dict[str, Callable[[], Any]] = {}
    available = free_memory()
    wanted = 3 if not args.no_deepspeed else 2
    if available is not None and per * (wanted + 1) > available:
        print(f"only {available / 2**30:.1f} GiB free for {wanted} contenders of "
              f"{per / 2**30:.1f} GiB each: fewer contenders")
    ours = copy_params(base)
    opt = pst.Adam(ours, lr=1e-3)  # host placement: paramserver's flat buffers
    for p, q in zip(ours, base, strict=True):
        p.grad.copy_(q.grad)  # .grad views paramserver's gradient buffer
    contenders["paramserver"] = opt.step
    baseline = "torch fused"
    if not args.no_deepspeed and (available is None or per * 3 < available):
        try:
            t = time.perf_counter()
            ds = deepspeed_adam(copy_params(base))
            print(f"DeepSpeed's CPU Adam ready in {time.perf_counter() - t:.1f} s")
            contenders["deepspeed"] = ds.step
            baseline = "deepspeed"
        except Exception as e:  # not installed, or its op does not build here
            print(f"DeepSpeed's CPU Adam unavailable ({type(e).__name__}: {e}); torch's "
                  "fused CPU Adam is the baseline")
    if available is None or per * (len(contenders) + 1) < available:
        contenders["torch fused"] = torch.optim.Adam(copy_params(base), lr=1e-3,
                                                     fused=True).step
    del base
    import numba

    print(f"{n / 1e6:.1f}M float32 parameters in {len(ours)} tensors; torch "
          f"{torch.__version__} with {torch.get_num_threads()} threads, numba with "
          f"{numba.get_num_threads()} threads, {os.cpu_count()} CPUs; load average before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    names = list(contenders)
    times: dict[str, list[float]] = {k: [] for k in names}
    for step in contenders.values():  # warm-up: compile, touch the state
        step()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            t = time.perf_counter()
            contenders[k]()
            times[k].append(time.perf_counter() - t)
    print(f"Adam step, {args.rounds} rounds, interleaved; ms:")
    print(f"{'contender':<14} {'min':>8} {'median':>8} {'max':>8}   median / paramserver's")
    ours_med = statistics.median(times["paramserver"])
    for k in names:
        print(f"{k:<14} {summary(times[k])}   {statistics.median(times[k]) / ours_med:.2f}x")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ratio = statistics.median(times[baseline]) / ours_med
    print(f"target: {baseline} / paramserver >= 1.0: {ratio:.2f} "
          f"({'met' if ratio >= 1.0 else 'NOT met'})")


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def gpu_part(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        print("GPU part: no CUDA device, skipped")
        return
    width, depth, batch = 1024, max(1, round(args.params / 8.4)), 16
    torch.manual_seed(0)
    x = torch.randn(batch, 256, width, device="cuda")

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[Block(width) for _ in range(depth)]).cuda()

    offloaded = model().to(torch.bfloat16)
    opt_off = pst.Adam(offloaded.parameters(), lr=1e-4, placement="offload")
    overlapped = model().to(torch.bfloat16)
    opt_ovl = pst.Adam(overlapped.parameters(), lr=1e-4, placement="offload",
                       overlap=pst.Overlap(bucket=args.bucket))
    resident = model()
    opt_gpu = torch.optim.Adam(resident.parameters(), lr=1e-4, fused=True)

    def fb_off() -> None:
        opt_off.zero_grad()
        offloaded(x.bfloat16()).float().pow(2).mean().backward()

    host_step: list[float] = []

    def step_off() -> None:
        fb_off()
        opt_off.step()
        torch.cuda.synchronize()

    def fb_only() -> None:  # the GPU's own work: forward, backward, gradient copies
        fb_off()
        torch.cuda.synchronize()

    def step_timed() -> None:  # the host's optimizer step alone, the GPU idle around it
        fb_off()
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt_off.step()
        host_step.append(time.perf_counter() - t)
        torch.cuda.synchronize()

    def step_ovl() -> None:
        opt_ovl.zero_grad()
        overlapped(x.bfloat16()).float().pow(2).mean().backward()
        opt_ovl.step()
        torch.cuda.synchronize()

    def step_gpu() -> None:
        opt_gpu.zero_grad()
        with torch.autocast("cuda", torch.bfloat16):
            loss = resident(x).float().pow(2).mean()
        loss.backward()
        opt_gpu.step()
        torch.cuda.synchronize()

    steps = {"offload (bf16, fp32 master on host)": step_off,
             "offload, overlapped (overlap=...)": step_ovl,
             "all on the GPU (fused Adam)": step_gpu,
             "offload: forward+backward only": fb_only,
             "offload: optimizer step alone": step_timed}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for s in steps.values():
        s()
    host_step.clear()
    for r in range(args.rounds):
        names = list(steps)
        for k in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            steps[k]()
            times[k].append(time.perf_counter() - t)
    n = sum(p.numel() for p in resident.parameters())
    print(f"GPU part: {n / 1e6:.1f}M parameters, {torch.cuda.get_device_name()}; "
          f"{args.rounds} rounds, interleaved; ms (min median max):")
    for k, v in times.items():
        print(f"  {k:<38} {summary(v)}")
    print(f"  {'  of which opt.step() on the host':<38} {summary(host_step)}")
    off = statistics.median(times["offload (bf16, fp32 master on host)"])
    gpu = statistics.median(times["all on the GPU (fused Adam)"])
    ovl = statistics.median(times["offload, overlapped (overlap=...)"])
    print(f"  offloaded / on the GPU: {off / gpu:.2f}x serial, {ovl / gpu:.2f}x overlapped")
    # The GPU waits while the host updates; the copies of gradients and values overlap the
    # backward pass and the update, so they should add nothing to that wait.
    idle = off - statistics.median(times["offload: forward+backward only"])
    opt_time = statistics.median(host_step)
    print(f"  GPU idle per offloaded step (step - forward+backward): {idle * 1e3:.1f} ms; "
          f"host optimizer step {opt_time * 1e3:.1f} ms; target idle <= step: "
          f"{'met' if idle <= opt_time else 'NOT met'}")
    # Overlapped: the GPU's own work is the same (same shapes, same kernels, same copies).
    idle_ovl = ovl - statistics.median(times["offload: forward+backward only"])
    print(f"  GPU idle per overlapped offloaded step: {idle_ovl * 1e3:.1f} ms "
          f"({idle_ovl / opt_time:.2f}x the host step; target <= 0.5x: "
          f"{'met' if idle_ovl <= 0.5 * opt_time else 'NOT met'})")
    same_after_steps(model, x, args.bucket, 50)


def same_after_steps(model: Callable[[], torch.nn.Module], x: torch.Tensor, bucket: int,
                     steps: int) -> None:
    """The serial and the overlapped offload, ``steps`` steps from the same start: their
    masters and parameters must be equal bit for bit."""
    models = [model().to(torch.bfloat16) for _ in range(2)]
    opts = [pst.Adam(models[0].parameters(), lr=1e-4, placement="offload"),
            pst.Adam(models[1].parameters(), lr=1e-4, placement="offload",
                     overlap=pst.Overlap(bucket=bucket))]
    for s in range(steps):
        for m, o in zip(models, opts, strict=True):
            o.zero_grad()
            m((x * (1 + s / steps)).bfloat16()).float().pow(2).mean().backward()
            o.step()
    torch.cuda.synchronize()
    same = (bool((opts[0].params.pset.values == opts[1].params.pset.values).all())
            and all(torch.equal(a, b) for a, b in zip(models[0].parameters(),
                                                        models[1].parameters(), strict=True)))
    print(f"  overlapped and serial offload after {steps} steps: "
          f"{'bit for bit equal' if same else 'DIFFERENT'}")
    if not same:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7, at least 5)")
    ap.add_argument("--params", type=float, default=100.0, help="millions of parameters "
                    "(default 100)")
    ap.add_argument("--bucket", type=int, default=1 << 22, help="values per bucket of the "
                    "overlapped offload (default 4194304)")
    ap.add_argument("--no-deepspeed", action="store_true", help="do not try DeepSpeed")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU part")
    args = ap.parse_args()
    args.rounds = max(5, args.rounds)
    if not args.gpu_only:
        cpu_part(args)
    gpu_part(args)


if __name__ == "__main__":
    main()
