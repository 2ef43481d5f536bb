"""The progress line of ``paramserver train``: step, loss, accuracy, rate, steps/s."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A bar redrawn in place on a terminal; one line per report elsewhere (logs, CI)."""

    def __init__(self, total: int, start: int = 0, stream: TextIO | None = None,
                 enabled: bool = True, width: int = 24):
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._t0 = time.perf_counter()
        self._start = start
        self._open = False

    def rate(self, step: int) -> float:
        elapsed = time.perf_counter() - self._t0
        return (step - self._start) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, loss: float, accuracy: float, lr: float,
               force: bool = False) -> None:
        """Show the state after ``step`` steps; on a terminal always, elsewhere if forced."""
        if not self.enabled or not (self.tty or force):
            return
        filled = int(self.width * step / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        text = (f"[{bar}] step {step}/{self.total}  loss {loss:.4f}  acc {accuracy:6.2%}  "
                f"lr {lr:.3g}  {self.rate(step):.0f} steps/s")
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (a test result, a checkpoint), above the bar."""
        if not self.enabled:
            return
        if self._open:
            self.stream.write("\r\x1b[K")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


__all__ = ["Progress"]
