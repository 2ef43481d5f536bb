"""Where an overlapped offloaded step's time goes (``overlap=True``), on a GPU.

    python benchmarks/overlap_probe.py            # 100M parameters (benchmarks/offload.py's model)

Times, per step of the overlapped offload (steps 3-7 of 7), the host worker's parts: the wait
for a bucket's gradient copies, the backup of its values and updater state (what a rollback
restores), the update with the publishing of its values, and the publishing alone; once with
the backup copied on torch's threads (as ``_overlap`` does) and once with NumPy's one-threaded
copy (as it did before), alternated twice. It wraps the overlap's own functions to time them
(a probe, not a user's path); the arithmetic is unchanged. Without a GPU it runs a tiny model
on the CPU, to check that it runs.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from offload import Block

import paramserver.torch as pst
from paramserver.torch import _overlap

DEV = "cuda" if torch.cuda.is_available() else "cpu"
WIDTH, DEPTH, BATCH, SEQ = (1024, 12, 16, 256) if DEV == "cuda" else (64, 2, 2, 8)
TIMES: collections.defaultdict[str, float] = collections.defaultdict(float)
_update, _copy = _overlap.Overlapper._update, _overlap._copy


def timed(name: str, f: Any) -> Any:
    def g(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            TIMES[name] += time.perf_counter() - t
    return g


class TimedEvent:
    def __init__(self, event: Any):
        self.event = event

    def synchronize(self) -> None:
        timed("wait for the gradient copies", self.event.synchronize)()


def update(self: Any, armed: Any, bucket: Any, event: Any) -> None:
    TIMES["buckets"] += 1
    timed("update, whole", _update)(self, armed, bucket,
                                    None if event is None else TimedEvent(event))


def run(label: str, copy: Any) -> None:
    _overlap._copy = timed("backup and restore", copy)  # type: ignore[assignment]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(WIDTH) for _ in range(DEPTH)]).to(DEV).bfloat16()
    opt = pst.Adam(model.parameters(), lr=1e-4, placement="offload", overlap=True)
    opt.params._publish = timed("publish", opt.params._publish)
    x = torch.randn(BATCH, SEQ, WIDTH, device=DEV).bfloat16()
    steps = []
    for s in range(7):
        if s == 2:
            TIMES.clear()
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        if DEV == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        opt.step()
        if DEV == "cuda":
            torch.cuda.synchronize()
        if s >= 2:
            steps.append((time.perf_counter() - t0, t1 - t0))
    n = len(steps)
    parts = ", ".join(f"{k} {v / n * 1e3:.1f}" for k, v in TIMES.items() if k != "buckets")
    print(f"{label}: step {statistics.median(a for a, _ in steps) * 1e3:.1f} ms, forward and "
          f"backward {statistics.median(b for _, b in steps) * 1e3:.1f} ms; per step, ms: "
          f"{parts}; {TIMES['buckets'] / n:.0f} buckets", flush=True)
    TIMES.clear()


def main() -> None:
    _overlap.Overlapper._update = update  # type: ignore[method-assign]
    n = sum(p.numel() for p in torch.nn.Sequential(*[Block(WIDTH) for _ in range(DEPTH)])
            .parameters())
    print(f"{DEV}: {n / 1e6:.1f}M parameters; torch threads {torch.get_num_threads()}")
    for label, copy in [("backup on torch's threads", _copy), ("backup by NumPy", np.copyto)] * 2:
        run(label, copy)


if __name__ == "__main__":
    main()
