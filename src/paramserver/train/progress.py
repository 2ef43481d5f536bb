"""The progress display of ``paramserver train``.

On a terminal it is a live line drawn by `rich <https://rich.readthedocs.io>`_: the phase,
a bar, step/total, elapsed time, ETA, steps/s, and the loss, accuracy and learning rate of
the last display window. Messages logged while it shows (test results, checkpoints) are
printed above it, and it stays on screen when the run ends or is interrupted, so the last
training loss remains visible. Elsewhere (a log file, CI, a pipe) it is one plain line per
display step.

Steps/s and the ETA are measured over the last :data:`RATE_WINDOW` seconds, not since the
start, so that warm-up (compilation, the first put) does not skew them.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, TextIO

#: Seconds of recent steps that steps/s and the ETA are measured over.
RATE_WINDOW = 10.0


class Rate:
    """Steps per second over the last ``window`` seconds (at least the last two reports)."""

    def __init__(self, step: int, window: float = RATE_WINDOW, clock: Any = time.monotonic):
        self.window = window
        self.clock = clock
        self._samples: deque[tuple[float, int]] = deque([(clock(), step)])

    def add(self, step: int) -> float:
        now = self.clock()
        samples = self._samples
        samples.append((now, step))
        while len(samples) > 2 and now - samples[1][0] >= self.window:
            samples.popleft()
        return self.value

    @property
    def value(self) -> float:
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def clock_text(seconds: float | None) -> str:
    """``1:02:03`` (as rich shows elapsed time); ``-:--:--`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-:--:--"
    h, rest = divmod(round(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Progress:
    """The display of one run; see the module docstring.

    Args:
        total: the last step of the run (the job's ``train_steps``).
        start: the step the run starts at (a resumed run's).
        stream: where it goes (default: stderr). A terminal gets the live display.
        enabled: False shows nothing (``--quiet``).
    """

    def __init__(self, total: int, start: int = 0, stream: TextIO | None = None,
                 enabled: bool = True):
        self.total = max(total, 1)
        self.start = start
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and _isatty(self.stream)
        self.phase = "train"
        self.step = start
        self._t0 = time.monotonic()
        self._rate = Rate(start)
        self._live: Any = None
        self._task: Any = None
        self._fields: dict[str, str] = {"metrics": "", "rate": "", "eta": clock_text(None)}

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        if self.tty:
            self._start_live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, highlight=False)
        self._live = _live_display()(
            TextColumn("[bold]{task.description:<5}"), BarColumn(bar_width=24),
            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[rate]}"),
            console=console, refresh_per_second=8, transient=False)
        self._task = self._live.add_task(self.phase, total=self.total, completed=self.start,
                                         **self._fields)
        self._live.start()

    def close(self) -> None:
        """Leave the display as it is on screen (a live one stops redrawing) and end its
        line, so that whatever is printed next starts on a line of its own."""
        live, self._live = self._live, None
        if live is not None:
            live.refresh()
            live.stop()

    # -- reports ----------------------------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        """Show that the run is in ``phase`` now (``train``, ``test``, ...)."""
        self.phase = phase
        if self._live is not None:
            self._live.update(self._task, description=phase, refresh=True)

    def update(self, step: int, loss: float, accuracy: float, lr: float,
               force: bool = False, extra: Mapping[str, float] | None = None) -> None:
        """The state after ``step`` steps (``extra``: the net's own metrics, rnnlm's
        ``ppl``). A live display takes every update; a plain one writes a line only when
        ``force`` is given (a display step)."""
        if not self.enabled or not (self.tty or force):
            return
        self.step = step
        rate = self._rate.add(step)
        eta = (self.total - step) / rate if rate > 0 else None
        acc = f"{accuracy:6.2%}" if accuracy == accuracy else "     -"
        metrics = f"loss {loss:.4f}  acc {acc}  lr {lr:.3g}" + "".join(
            f"  {name} {value:.4g}" for name, value in (extra or {}).items() if value == value)
        if self._live is not None:
            self._fields = {"metrics": metrics, "rate": f"{rate_text(rate)} steps/s",
                            "eta": clock_text(eta)}
            self._live.update(self._task, completed=step, **self._fields)
            return
        if self.tty:  # a terminal, outside ``with``: nothing live to update
            return
        width = len(str(self.total))
        percent = 100 * step / self.total
        self.stream.write(
            f"{self.phase} step {step:>{width}}/{self.total} ({percent:3.0f}%)  {metrics}  "
            f"{rate_text(rate)} steps/s  elapsed {clock_text(time.monotonic() - self._t0)}  "
            f"ETA {clock_text(eta)}\n")
        self.stream.flush()


def rate_text(rate: float) -> str:
    """Steps/s with the digits that matter: ``1,364``, ``96.3``, ``0.52``."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2f}"


def _live_display() -> Any:
    """rich's Progress, drawn on two lines: the bar, times and rate (within 80 columns),
    then the metrics of the last display window."""
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class LiveDisplay(RichProgress):
        def get_renderables(self) -> Any:
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                yield Text(f"      {task.fields.get('metrics', '')}")

    return LiveDisplay


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


__all__ = ["RATE_WINDOW", "Progress", "Rate", "clock_text", "rate_text"]
