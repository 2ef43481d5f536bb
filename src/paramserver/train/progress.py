"""The progress display of ``paramserver train``, and the clock of its steps per second.

On a terminal it is a live display drawn by `rich <https://rich.readthedocs.io>`_: the phase,
a bar, step/total, elapsed time, ETA and steps/s on one line, and under it the mean training
loss and accuracy of the last display window (the row ``metrics.csv`` got at the last display
step; before the first display step, the mean of the steps so far) with the learning rate.
Messages logged while it shows (test results, checkpoints, the notice that kernels are being
compiled) are printed above it, and it stays on screen when the run ends or is interrupted, so
the last training loss remains visible. Elsewhere (a log file, CI, a pipe) it is one plain
line per display step.

Steps/s and the ETA come from a :class:`Rate`: training steps over the time spent in training
steps in the last :data:`RATE_WINDOW` seconds of it. The time of tests, validations and
checkpoints between steps is not counted, nor the warm-up: a run's first step (the first
forward pass, threads starting, the first put) and every step during which numba compiled a
kernel (:class:`CompileNotice`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, TextIO

from ..console import write_line

#: Seconds of recent training time that steps/s and the ETA are measured over.
RATE_WINDOW = 10.0

log = logging.getLogger(__name__)


def clock() -> float:
    """The clock of :class:`Rate` (``time.monotonic``; a test may replace it)."""
    return time.monotonic()


class Rate:
    """Training steps per second over the last ``window`` seconds of training time.

    The trainer calls :meth:`start` when steps start (the run's start, after a test or a
    checkpoint) and :meth:`add` after each step; what lies between a :meth:`start` and the
    next :meth:`add` counts for that step. A step is not counted, neither its time nor
    itself, when it is the first after :meth:`skip_next` (the warm-up) or when a
    :meth:`hold` (a compile) was on at any time during it.
    """

    def __init__(self, window: float = RATE_WINDOW):
        self.window = window
        self._mark: float | None = None
        self._time = 0.0  # training time counted so far
        self._steps = 0  # steps counted so far
        self._samples: deque[tuple[float, int]] = deque([(0.0, 0)])
        self._lock = threading.Lock()
        self._held = 0
        self._skip = False

    def start(self) -> None:
        """Steps start (again) now: the time since the last step is not training time."""
        self._mark = clock()

    def skip_next(self) -> None:
        """Count neither the time nor the step of the next :meth:`add`."""
        with self._lock:
            self._skip = True

    def hold(self, on: bool) -> None:
        """While held (``on``, then ``False``; nestable), and in the steps during which a
        hold began or ended, no step is counted (called from the thread that compiles)."""
        with self._lock:
            self._held += 1 if on else -1
            self._skip = True

    def add(self, steps: int = 1) -> float | None:
        """``steps`` more steps done now; returns :attr:`value`."""
        now = clock()
        mark, self._mark = self._mark, now
        with self._lock:
            counted = not (self._skip or self._held) and mark is not None
            self._skip = False
        if counted:
            assert mark is not None
            self._time += now - mark
            self._steps += steps
            samples = self._samples
            if len(samples) > 2 and self._time - samples[-2][0] < self.window / 256:
                samples[-1] = (self._time, self._steps)  # a few hundred samples a window
            else:
                samples.append((self._time, self._steps))
            while len(samples) > 2 and self._time - samples[1][0] >= self.window:
                samples.popleft()
        return self.value

    @property
    def value(self) -> float | None:
        """Steps per second, or None while no step has been counted."""
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


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
        self._live: Any = None
        self._task: Any = None
        self._metrics = ""
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

    def update(self, step: int, rate: float | None,
               metrics: tuple[float, float, float] | None = None,
               force: bool = False, extra: Mapping[str, float] | None = None) -> None:
        """The state after ``step`` steps: ``rate`` steps/s (None: not known yet) and, when
        given, the ``(loss, accuracy, lr)`` to show from now on, with ``extra``, the net's own
        metrics (rnnlm's ``ppl``). A live display takes every update; a plain one writes a
        line only when ``force`` is given (a display step)."""
        if not self.enabled or not (self.tty or force):
            return
        self.step = step
        eta = (self.total - step) / rate if rate else None
        if metrics is not None:
            loss, accuracy, lr = metrics
            acc = f"{accuracy:6.2%}" if accuracy == accuracy else "     -"
            self._metrics = f"loss {loss:.4f}  acc {acc}  lr {lr:.3g}" + "".join(
                f"  {name} {value:.4g}" for name, value in (extra or {}).items()
                if value == value)
        if self._live is not None:
            self._fields = {"metrics": self._metrics, "rate": f"{rate_text(rate)} steps/s",
                            "eta": clock_text(eta)}
            self._live.update(self._task, completed=step, **self._fields)
            return
        if self.tty:  # a terminal, outside ``with``: nothing live to update
            return
        width = len(str(self.total))
        percent = 100 * step / self.total
        write_line(self.stream,
                   f"{self.phase} step {step:>{width}}/{self.total} ({percent:3.0f}%)  "
                   f"{self._metrics}  {rate_text(rate)} steps/s  "
                   f"elapsed {clock_text(time.monotonic() - self._t0)}  ETA {clock_text(eta)}")


#: What a compile is said to be making, by the module of the function compiled.
_KINDS = {"paramserver.numerics.rng_kernels": "random fills"}
_DEFAULT_KIND = "update kernels"


class CompileNotice:
    """While the block runs, says when numba compiles kernels (on an empty cache: a job's
    first run), as log messages: ``compiling update kernels, first run only…`` when a
    compile begins, and how long it took when it ends; a :class:`Rate` given is held
    meanwhile. Nothing is said when every kernel comes from the cache.

    Args:
        rate: the rate to hold while kernels compile.
    """

    def __init__(self, rate: Rate | None = None):
        self.rate = rate
        self._depth = 0
        self._since = 0.0
        self._kind = ""
        self._lock = threading.Lock()
        self._context: Any = None

    def __enter__(self) -> CompileNotice:
        from ..numerics import compile_events  # numba only where a kernel needs it

        self._context = compile_events.reporting(self._event)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(*exc)

    def _event(self, name: str, starting: bool) -> None:
        # A compile's callees compile inside it (nested events): only the outermost counts.
        with self._lock:
            self._depth += 1 if starting else -1
            edge = self._depth == (1 if starting else 0)
            if edge and starting:
                self._since = time.monotonic()
                self._kind = _kind_of(name)
            kind, seconds = self._kind, time.monotonic() - self._since
        if not edge:
            return
        if self.rate is not None:
            self.rate.hold(starting)
        from ..numerics import cache

        if not starting:
            log.info("compiled %s in %.1f s", kind, seconds)
        elif cache.caching():
            log.info("compiling %s, first run only…", kind)
        else:
            log.info("compiling %s (there is no folder to cache them in: every run "
                     "compiles them)…", kind)


def _kind_of(name: str) -> str:
    module = name.rpartition(":")[0]
    return _KINDS.get(module, _DEFAULT_KIND)


def rate_text(rate: float | None) -> str:
    """Steps/s with the digits that matter: ``1,364``, ``96.3``, ``0.52``; ``-`` when not
    known yet."""
    if rate is None:
        return "-"
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


__all__ = ["RATE_WINDOW", "CompileNotice", "Progress", "Rate", "clock", "clock_text",
           "rate_text"]
