"""What a training run leaves for a person to look at: ``metrics.csv`` and ``metrics.png``.

The CSV holds only what is a function of the job and the step (no timings), so a resumed
run writes exactly the file a straight run writes. Its columns are ``step, phase, loss,
accuracy, lr``, then the net's own metrics (rnnlm's ``ppl``) in the order they first
appear; a metric a row does not have is ``nan``.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_atomically
from ..config import ParamError
from .plot import COLORS, Panel, Series, render

COLUMNS = ("step", "phase", "loss", "accuracy", "lr")
PHASES = ("train", "val", "test")  # the phases of rows
#: The most points of the plot's learning-rate curve (one per step up to this many steps).
LR_POINTS = 5000
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    step: int
    phase: str      # "train" (the mean over the display window), "test" or "val"
    loss: float
    accuracy: float
    lr: float
    extra: Mapping[str, float] = field(default_factory=dict)  # the net's own (rnnlm's ppl)

    def cells(self, extras: Sequence[str] = ()) -> list[str]:
        return [str(self.step), self.phase, repr(float(self.loss)), repr(float(self.accuracy)),
                repr(float(self.lr)),
                *(repr(float(self.extra.get(name, math.nan))) for name in extras)]


class MetricsError(ParamError):
    """A ``metrics.csv`` that cannot be read back on resume; names the file and line."""


_FIX = (" (fix the line, or move the file away to resume without the rows of the earlier "
        "steps)")


def _parse_row(cells: list[str], where: str, extras: Sequence[str]) -> Row:
    names = (*COLUMNS, *extras)
    if len(cells) != len(names):
        raise MetricsError(f"{where}: expected {len(names)} values "
                           f"({','.join(names)}), found {len(cells)}" + _FIX)
    step, phase, *numbers = cells
    if not step.isascii() or not step.isdigit():
        raise MetricsError(f"{where}: step '{step}' is not a non-negative integer" + _FIX)
    if phase not in PHASES:
        raise MetricsError(f"{where}: phase '{phase}' is not one of {', '.join(PHASES)}" + _FIX)
    values = []
    for name, text in zip(names[2:], numbers):
        try:
            values.append(float(text))
        except ValueError:
            raise MetricsError(f"{where}: {name} '{text}' is not a number" + _FIX) from None
    loss, accuracy, lr = values[:3]
    return Row(int(step), phase, loss, accuracy, lr, dict(zip(extras, values[3:])))


class MetricsLog:
    """The rows of ``metrics.csv``; :meth:`resume_at` forgets rows of steps not yet redone."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.rows: list[Row] = []

    def load(self) -> None:
        """Read the file (none: no rows). A damaged file is refused, naming its line: the
        rows of the steps before a resume are kept from it, so they must be right."""
        self.rows = []
        if not self.path.exists():
            return
        try:
            with self.path.open(newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise MetricsError(f"{self.path}: cannot read the metrics of the run: {e}"
                               ) from None
        if not rows or tuple(rows[0][:len(COLUMNS)]) != COLUMNS:
            raise MetricsError(f"{self.path}:1: the metrics file does not start with the "
                               f"header {','.join(COLUMNS)}" + _FIX)
        extras = rows[0][len(COLUMNS):]
        for number, cells in enumerate(rows[1:], start=2):
            self.rows.append(_parse_row(cells, f"{self.path}:{number}", extras))

    def resume_at(self, step: int, keep: Callable[[Row], bool]) -> None:
        """Read the file of a run that stopped at ``step``, keeping the rows ``keep`` says
        a straight run has there, and dropping every row after ``step``. The file is
        rewritten only when that changes it."""
        self.load()
        kept = [r for r in self.rows if r.step <= step and keep(r)]
        if kept != self.rows:
            self.rows = kept
            self.write()

    def add(self, row: Row) -> None:
        self.rows.append(row)

    @property
    def extras(self) -> list[str]:
        """The names of the net's own metrics, in the order they first appear."""
        return list(dict.fromkeys(name for r in self.rows for name in r.extra))

    def write(self) -> None:
        """Write the whole file atomically (it is small)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        extras = self.extras
        w.writerow([*COLUMNS, *extras])
        for r in self.rows:
            w.writerow(r.cells(extras))
        data = buf.getvalue().encode("utf-8")
        write_atomically(self.path, lambda tmp: tmp.write_bytes(data))

    def lr_points(self, lr: Callable[[int], float] | None,
                  most: int = LR_POINTS) -> tuple[list[int], list[float]]:
        """The learning-rate curve of the plot: with the schedule ``lr`` (the rate of step
        ``s``, counted from 0), its value at every step up to the last train row's (at most
        ``most`` steps, evenly spread), drawn at the step count after it (``s + 1``), so that
        a smooth schedule is smooth and a step schedule a staircase; without it, the train
        rows' own rates."""
        train = [r for r in self.rows if r.phase == "train"]
        if not train:
            return [], []
        if lr is None:
            return [r.step for r in train], [r.lr for r in train]
        last = max(r.step for r in train)
        stride = max(1, -(-last // most))
        steps = [*range(0, last, stride), *([last - 1] if (last - 1) % stride else [])]
        return [s + 1 for s in steps], [float(lr(s)) for s in steps]

    def panels(self, lr: Callable[[int], float] | None = None) -> list[Panel]:
        """What :meth:`plot` draws: loss, accuracy and learning rate against the step, a
        curve per phase (train a line, test circles on a line, val squares on a dashed line).

        A metric the net does not compute (NaN: an RBM's accuracy) has no panel. The
        learning rate is the schedule ``lr`` at every step (:meth:`lr_points`): a kInverse
        schedule a smooth curve, a kStep one a staircase; without it the train rows' rates,
        each held over its display window. On a log scale where it spans more than a decade.
        The accuracy axis spans the data (97 % and 99.7 % look different), not 0 to 1.
        """
        names = [name for name in ("loss", "accuracy")
                 if any(not math.isnan(getattr(r, name)) for r in self.rows)]
        panels = [Panel(name, name) for name in names]
        by_name = dict(zip(names, panels, strict=True))
        for phase, marker, dashed in (("train", "", False), ("test", "o", False),
                                      ("val", "s", True)):
            rows = [r for r in self.rows if r.phase == phase]
            for name in names:
                points = [(float(r.step), float(getattr(r, name))) for r in rows
                          if not math.isnan(getattr(r, name))]
                if points:
                    xs, ys = zip(*points, strict=True)
                    by_name[name].series.append(Series(phase, xs, ys, COLORS[phase], marker,
                                                       dashed))
        if "accuracy" in by_name:
            by_name["accuracy"].ylim = accuracy_limits([r.accuracy for r in self.rows])
            by_name["accuracy"].percent = True
        lr_panel = Panel("learning rate", "learning rate")
        steps, rates = self.lr_points(lr)
        if steps:
            lr_panel.series.append(Series("train", tuple(map(float, steps)),
                                          tuple(map(float, rates)), COLORS["train"],
                                          steps=lr is None))
            lr_panel.log = _spans_decades(rates)
        return [*panels, lr_panel]

    def plot(self, path: str | os.PathLike[str], title: str,
             lr: Callable[[int], float] | None = None) -> Path | None:
        """A PNG of :meth:`panels` under ``title``; None without Pillow (the ``examples``
        extra)."""
        panels = self.panels(lr)
        try:
            image = render(panels, title)
        except ImportError:
            log.warning("no metrics.png: Pillow is not installed (pip install "
                        "'paramserver[examples]')")
            return None
        return write_atomically(path, lambda tmp: image.save(tmp, format="PNG"))


def accuracy_limits(values: Sequence[float]) -> tuple[float, float]:
    """The accuracy axis: the data's range with a margin, within [0, 1]."""
    finite = [v for v in values if v == v]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    margin = max((hi - lo) * 0.1, 0.005)
    return max(0.0, lo - margin), min(1.0, hi + margin)


def _spans_decades(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(positive) and max(positive) > 10 * min(
        positive)


__all__ = ["COLUMNS", "MetricsError", "MetricsLog", "Row", "accuracy_limits"]
