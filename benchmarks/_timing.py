"""How every benchmark here times its contenders (one home for it).

- Contenders run in *interleaved rounds*: round 1 runs each contender in turn, then round 2,
  and so on, so that a busy, shared machine slows them alike; at least :data:`MIN_ROUNDS`.
- A round of a contender starts with an untimed call (it absorbs the switch between thread
  pools, numba's and torch's, and brings its memory into cache), then times calls for
  ``per_round_s`` seconds (at least three); the round's figure is their median.
- What is printed is the min / median / max over the rounds, of times and of ratios (a
  ratio is taken within each round, between figures measured moments apart), and the load
  average before and after: a target is met only if the median meets it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: The fewest rounds a benchmark may run.
MIN_ROUNDS = 5


@dataclass(frozen=True)
class Spread:
    """The min, median and max of per-round figures."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Spread:
        return cls(min(xs), statistics.median(xs), max(xs))

    def scaled(self, k: float) -> Spread:
        return Spread(self.min * k, self.median * k, self.max * k)

    def fmt(self, digits: int = 2) -> str:
        """``median [min–max]``."""
        return f"{self.median:.{digits}f} [{self.min:.{digits}f}–{self.max:.{digits}f}]"


def ratios(num: Sequence[float], den: Sequence[float]) -> Spread:
    """The spread of the per-round ratios ``num[i] / den[i]``."""
    return Spread.of([a / b for a, b in zip(num, den, strict=True)])


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rounds_arg(parser: argparse.ArgumentParser, default: int = MIN_ROUNDS) -> None:
    """Add ``--rounds`` (at least :data:`MIN_ROUNDS`)."""

    def at_least(text: str) -> int:
        n = int(text)
        if n < MIN_ROUNDS:
            raise argparse.ArgumentTypeError(f"at least {MIN_ROUNDS} rounds, not {n}")
        return n

    parser.add_argument("--rounds", type=at_least, default=default,
                        help=f"interleaved rounds over the contenders (default {default}, "
                             f"at least {MIN_ROUNDS})")


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int,
                per_round_s: float, min_calls: int = 3) -> dict[str, list[float]]:
    """Per contender, the median seconds per call of each round (see the module docstring)."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"at least {MIN_ROUNDS} rounds, not {rounds}")
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            fn()
            calls: list[float] = []
            start = time.perf_counter()
            while len(calls) < min_calls or time.perf_counter() - start < per_round_s:
                t0 = time.perf_counter()
                fn()
                calls.append(time.perf_counter() - t0)
            out[name].append(statistics.median(calls))
    return out


__all__ = ["MIN_ROUNDS", "Spread", "interleaved", "load_average", "ratios", "rounds_arg"]
