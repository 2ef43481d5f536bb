"""What both sides of ``kv_mxnet.py`` do, in one place: the shapes, the gradients of each
worker at each step, the values a side must end with, and the update methods.

Imported by the benchmark (paramserver's venv) and by ``_mxnet_side.py`` (MXNet's side venv,
numpy < 1.24): numpy only, and nothing random that depends on numpy's version — every
gradient and row id is an exact function of (shape, rank, step).
"""

from __future__ import annotations

import numpy as np

#: The shapes: keys (int, as MXNet's), the shape of each key's value, and the phase (which
#: update method the store has while it runs).
SHAPES: dict[str, dict] = {
    "1 key of 4M": {"keys": [0], "shape": (1 << 22,), "phase": "plain"},
    "200 keys of 4,096": {"keys": list(range(1000, 1200)), "shape": (4096,),
                          "phase": "plain"},
    "10,000 keys of 64": {"keys": list(range(10_000, 20_000)), "shape": (64,),
                          "phase": "plain"},
    "row-sparse 1M x 64, 4,096 rows": {"keys": [5], "shape": (1_000_000, 64),
                                       "phase": "plain", "rows": 4096},
    "SGD-momentum update of 4M": {"keys": [1], "shape": (1 << 22,), "phase": "sgd"},
    "Adam update of 4M": {"keys": [2], "shape": (1 << 22,), "phase": "adam"},
}
PHASES = ("plain", "sgd", "adam")
#: The table's rows at first (not 0: ps-lite's servers refuse a row-sparse init of no rows).
TABLE_INIT = 0.5

#: The update methods: each side's declaration of the same rule.
LR = {"sgd": 0.01, "adam": 0.001}
MOMENTUM = 0.9
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
#: How many values of the pulled result are compared (spread evenly).
SAMPLES = 257


def shapes_of(phase: str) -> list[str]:
    return [name for name, s in SHAPES.items() if s["phase"] == phase]


def _pattern(n: int, salt: int) -> np.ndarray:
    """``n`` float32 values in [-0.5, 0.5), a fixed function of ``salt``."""
    i = np.arange(n, dtype=np.int64)
    return (((i * 2654435761 + salt * 40503) % 1000) / 1000.0 - 0.5).astype(np.float32)


def scale(step: int) -> np.float32:
    return np.float32(1.0 + (step % 5) * 0.25)


def row_ids(step: int, rows: int = 4096, table: int = 1_000_000) -> np.ndarray:
    """The rows pulled and pushed at ``step``: distinct, sorted, spread over the table."""
    return np.sort((np.arange(rows, dtype=np.int64) * 999_983 + 7919 * step) % table)


class Grads:
    """One worker's gradients of one shape: a fixed pattern per key, scaled per step."""

    def __init__(self, name: str, rank: int):
        s = SHAPES[name]
        self.name, self.rank = name, rank
        self.keys = list(s["keys"])
        self.rows = s.get("rows")
        size = (self.rows * int(np.prod(s["shape"][1:])) if self.rows
                else int(np.prod(s["shape"])))
        salt = 1 + 7 * rank + 101 * list(SHAPES).index(name)
        self.base = _pattern(size * len(self.keys), salt).reshape(len(self.keys), -1)

    def at(self, step: int) -> list[np.ndarray]:
        """Fresh arrays, one per key (a table's: its rows at ``step``)."""
        return [b * scale(step) for b in self.base]


def initial(name: str) -> np.ndarray | None:
    """The initial value of an update shape's key (the plain shapes' keys start at 0)."""
    s = SHAPES[name]
    return _pattern(int(np.prod(s["shape"])), 99) if s["phase"] != "plain" else None


def sample_index(total: int) -> np.ndarray:
    return np.linspace(0, total - 1, SAMPLES).astype(np.int64)


def sample(outs: list[np.ndarray]) -> list[float]:
    """The compared values of what a side pulled (every key's, one after the other)."""
    flat = np.concatenate([np.asarray(o, np.float32).reshape(-1) for o in outs])
    return [float(x) for x in flat[sample_index(flat.size)]]


class Reference:
    """What the pulled values must be, on the sampled values, after each step of a shape
    with ``workers`` workers: the sum of the pushes (plain) or the update method's result
    (in float64, compared with a tolerance: the two systems' kernels round differently)."""

    def __init__(self, name: str, workers: int):
        self.name, self.workers = name, workers
        self.phase = SHAPES[name]["phase"]
        self.grads = [Grads(name, r) for r in range(workers)]
        n = self.grads[0].base.size
        self.idx = sample_index(n)
        init = initial(name)
        self.w = (init[self.idx].astype(np.float64) if init is not None
                  else np.zeros(SAMPLES))
        self.m = np.zeros(SAMPLES)
        self.v = np.zeros(SAMPLES)
        self.t = 0

    def step(self, step: int) -> None:
        total = self.grads[0].base.reshape(-1)[self.idx] * scale(step)
        for g in self.grads[1:]:
            total = total + g.base.reshape(-1)[self.idx] * scale(step)  # float32, in order
        if self.phase == "plain":
            self.w = total.astype(np.float64)
            return
        g64 = total.astype(np.float64)
        self.t += 1
        if self.phase == "sgd":
            self.m = MOMENTUM * self.m - LR["sgd"] * g64
            self.w = self.w + self.m
        else:
            self.m = BETA1 * self.m + (1 - BETA1) * g64
            self.v = BETA2 * self.v + (1 - BETA2) * g64 * g64
            mhat = self.m / (1 - BETA1 ** self.t)
            vhat = self.v / (1 - BETA2 ** self.t)
            self.w = self.w - LR["adam"] * mhat / (np.sqrt(vhat) + EPS)

    def check(self, got: list[float], who: str) -> str | None:
        """None when ``got`` is right, else what is wrong."""
        got_ = np.asarray(got, np.float64)
        if self.phase == "plain":
            bad = np.flatnonzero(got_ != self.w)
        else:
            bad = np.flatnonzero(~np.isclose(got_, self.w, rtol=2e-4, atol=1e-6))
        if bad.size:
            i = int(bad[0])
            return (f"{who}, {self.name}: value {int(self.idx[i])} is {got_[i]!r}, expected "
                    f"{self.w[i]!r} ({bad.size} of {SAMPLES} sampled values differ)")
        return None
