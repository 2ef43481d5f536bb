"""What the ``paramserver`` command prints besides its results: log messages and errors.

The library reports through :mod:`logging` (the ``paramserver`` logger) and never prints;
the command installs a handler for the time of one run (:func:`attach`) that writes each
message as a plain line: what a run reports (test results, checkpoints, the end) on stdout
with its results and progress, so that ``paramserver train job.conf > log`` keeps them;
warnings and errors on stderr — above the live progress display when one is shown (rich
redirects both while it draws). Python warnings are shown the same way, as ``warning:
<message>``, without the source line they came from.

Every message is printed with its characters that do not print escaped (``\\x1b``, ``\\x07``,
``\\u202e``, ``\\udcff`` for a byte of a file name that is not UTF-8): a file name holding a
terminal's escape sequence is shown as what it is, never obeyed by the terminal, whichever
message names it.

When stdout's reader goes away (``paramserver train job.conf | grep -m1 "step 250"``), the
write that finds the pipe closed (:func:`write_line`) makes stdout a sink for the rest of the
process and tells the listeners registered with :func:`on_output_closed`: a run stops at its
next step boundary as on Ctrl-C, with its checkpoint, instead of failing where it wrote.

``--log-format singa`` prints every message as SINGA's logs (glog's) did: ``I0817
07:15:24.462602 34073 trainer.py:412] Train @ step 10  Loss = 2.223607, accuracy =
0.189063`` (the training's, tests' and validations' lines in the words of the job's SINGA
release: :mod:`paramserver.singa.logs`), for programs that parse SINGA's logs.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .config import ParamError
from .config.errors import Error, printable

LOGGER = "paramserver"
#: What ``train --log-format`` takes: paramserver's messages, or SINGA's (glog's) lines.
LOG_FORMATS = ("paramserver", "singa")
#: Longest line of a message printed whole; a longer one (a value of a megabyte quoted back)
#: is cut in the middle.
MAX_LINE = 2000
#: The characters that do not print but that a message may hold as they are.
_KEEP = "\n\t"


def cut(text: str, limit: int = MAX_LINE) -> str:
    """``text`` cut in the middle to about ``limit`` characters, saying how many were left
    out; each line on its own."""
    if len(text) <= limit:
        return text
    if "\n" in text:
        return "\n".join(cut(line, limit) for line in text.split("\n"))
    head, tail = limit * 3 // 4, limit // 5
    return f"{text[:head]}...[{len(text) - head - tail:,} characters]...{text[-tail:]}"


class OutputClosed(Error):
    """A run stopped, its checkpoint written, because stdout's reader went away (the
    command exits with :data:`EXIT_OUTPUT_CLOSED`)."""


#: The exit status of a run stopped by its closed stdout: a shell's for a command that a
#: closed pipe ended (128 + SIGPIPE), as Ctrl-C's is 130 (128 + SIGINT).
EXIT_OUTPUT_CLOSED = 141

_closed_listeners: list[Callable[[], None]] = []
_closed_lock = threading.Lock()


@contextmanager
def on_output_closed(listener: Callable[[], None]) -> Iterator[None]:
    """Within the block, ``listener`` is called (from the thread that wrote) each time a
    write through :func:`write_line` finds its stream's reader gone."""
    with _closed_lock:
        _closed_listeners.append(listener)
    try:
        yield
    finally:
        with _closed_lock:
            _closed_listeners.remove(listener)


def write_line(stream: TextIO, text: str) -> None:
    """Write ``text`` and a newline to ``stream`` and flush it. A closed pipe (EPIPE) is no
    error of the writer's: the stream's file descriptor is pointed at the null device, so
    that what is still buffered and every later write (Python's own at exit too) go nowhere,
    and the listeners of :func:`on_output_closed` are told."""
    try:
        stream.write(text + "\n")
        stream.flush()
    except BrokenPipeError:
        _sink(stream)
        with _closed_lock:
            listeners = list(_closed_listeners)
        for listener in listeners:
            listener()


def _sink(stream: TextIO) -> None:
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # no descriptor: its writes keep failing
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = printable(record.getMessage(), _KEEP)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return text


class GlogFormatter(logging.Formatter):
    """glog's line, as SINGA wrote its logs: severity letter, month and day, time to the
    microsecond, thread, the file and line that logged, then the message."""

    def format(self, record: logging.LogRecord) -> str:
        letter = "IWEF"[min(max(record.levelno // 10 - 2, 0), 3)]
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micro = int((record.created % 1) * 1e6)
        return (f"{letter}{stamp}.{micro:06d} {record.thread or 0} {record.filename}:"
                f"{record.lineno}] {printable(record.getMessage(), _KEEP)}")


class LineHandler(logging.Handler):
    """Writes each record as a line on the current ``sys.stdout`` (below WARNING) or
    ``sys.stderr``, looked up at every message, so that a live display's redirection and
    test captures see it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream: TextIO = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            write_line(stream, self.format(record))
        except Exception:
            self.handleError(record)


def attach(quiet: bool = False, log_format: str = "paramserver") -> Callable[[], None]:
    """Route the ``paramserver`` logger and Python warnings to stdout and stderr for one
    command; ``quiet`` keeps only warnings and errors; ``log_format`` ``singa`` writes
    glog's lines. Returns the function that undoes it."""
    logger = logging.getLogger(LOGGER)
    handler = LineHandler()
    handler.setFormatter(GlogFormatter() if log_format == "singa" else _Formatter())
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
    own (a problem's further lines, such as dmlc's list of arguments, follow it); characters
    that do not print escaped."""
    problems: list[Any] = (error.problems if isinstance(error, ParamError) else [error])
    lines = []
    for p in problems:
        first, _, rest = str(p).partition("\n")
        lines.append(cut(f"paramserver {command}: {what}: {first}"))
        further = rest.removesuffix("\n").split("\n") if rest else []
        # dmlc's "Did you mean" ends its list of ~50 arguments: the hint goes first.
        hints = [x for x in further if x.startswith("Did you mean ")]
        lines += [cut(x) for x in hints + [x for x in further if x not in hints]]
    return "\n".join(printable(line, keep="\t") for line in lines)


__all__ = [
    "EXIT_OUTPUT_CLOSED",
    "LOGGER",
    "LOG_FORMATS",
    "MAX_LINE",
    "GlogFormatter",
    "LineHandler",
    "OutputClosed",
    "attach",
    "cut",
    "error_text",
    "on_output_closed",
    "write_line",
]
