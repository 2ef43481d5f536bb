"""What the ``paramserver`` command prints besides its results: log messages and errors.

The library reports through :mod:`logging` (the ``paramserver`` logger) and never prints;
the command installs a handler for the time of one run (:func:`attach`) that writes each
message as a plain line on stderr — above the live progress display when one is shown
(rich redirects stderr while it draws) — and shows Python warnings the same way, as
``warning: <message>``, without the source line they came from.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from .config import ParamError

LOGGER = "paramserver"
#: Longest line of a message printed whole; a longer one (a value of a megabyte quoted back)
#: is cut in the middle.
MAX_LINE = 2000


def cut(text: str, limit: int = MAX_LINE) -> str:
    """``text`` cut in the middle to about ``limit`` characters, saying how many were left
    out; each line on its own."""
    if len(text) <= limit:
        return text
    if "\n" in text:
        return "\n".join(cut(line, limit) for line in text.split("\n"))
    head, tail = limit * 3 // 4, limit // 5
    return f"{text[:head]}...[{len(text) - head - tail:,} characters]...{text[-tail:]}"


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return text


class LineHandler(logging.Handler):
    """Writes each record as a line on the current ``sys.stderr`` (looked up at every
    message, so that a live display's redirection and test captures see it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream: TextIO = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def attach(quiet: bool = False) -> Callable[[], None]:
    """Route the ``paramserver`` logger and Python warnings to stderr for one command;
    ``quiet`` keeps only warnings and errors. Returns the function that undoes it."""
    logger = logging.getLogger(LOGGER)
    handler = LineHandler()
    handler.setFormatter(_Formatter())
    saved = (logger.level, logger.propagate, warnings.showwarning)
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        logger.warning("%s", message)

    warnings.showwarning = show

    def detach() -> None:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        warnings.showwarning = saved[2]

    return detach


def error_text(command: str, error: ParamError | str, what: str = "error") -> str:
    """``paramserver CMD: error: PLACE: MESSAGE`` for every problem, each on a line of its
    own (a problem's further lines, such as dmlc's list of arguments, follow it)."""
    problems: list[Any] = (error.problems if isinstance(error, ParamError) else [error])
    lines = []
    for p in problems:
        first, _, rest = str(p).partition("\n")
        lines.append(cut(f"paramserver {command}: {what}: {first}"))
        if rest:
            lines.append(cut(rest))
    return "\n".join(lines)


__all__ = ["LOGGER", "MAX_LINE", "LineHandler", "attach", "cut", "error_text"]
