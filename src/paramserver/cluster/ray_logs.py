"""Ray's own messages kept out of the user's terminal, in a log file of the workspace.

Ray's C++ core, inside this process, logs to the process's stderr (file descriptor 2:
``gcs_client.cc: Failed to get cluster ID …``, ``raylet_client.cc: Error pushing mutable
object …``), its Python loggers (``ray``) to ``sys.stderr``, and by default the actors'
output is printed here too (``log_to_driver``). :class:`RayOutput` sends all of that to a
file while it is open, and leaves the terminal to paramserver: descriptor 2 is pointed at
the file, ``sys.stderr`` at a copy of the terminal's descriptor (so Python code of this
process, paramserver's messages and warnings, still reach the terminal), and the ``ray``
logger's handlers write to the file. :meth:`RayOutput.close` puts everything back.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path
from typing import Any, TextIO


class RayOutput:
    """Ray's messages into ``path`` (appended; the folder made) from now until
    :meth:`close`; see the module docstring. Does nothing where descriptor 2 is not this
    process's stderr (``sys.stderr`` replaced, as pytest's capture does)."""

    def __init__(self, path: Path):
        self.path = path
        self._saved_fd: int | None = None
        self._stderr: TextIO | None = None
        self._terminal: TextIO | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        self._made = [p for p in (path, *path.parents) if not p.exists()]  # to undo
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
        try:
            if sys.stderr is None or _fd(sys.stderr) != 2:
                return
            sys.stderr.flush()
            self._saved_fd = os.dup(2)
            self._stderr = sys.stderr
            self._terminal = io.TextIOWrapper(os.fdopen(os.dup(self._saved_fd), "wb", 0),
                                              encoding=sys.stderr.encoding,
                                              errors="backslashreplace", line_buffering=True,
                                              write_through=True)
            os.dup2(self._file.fileno(), 2)
            sys.stderr = self._terminal
            self.capture_loggers()
        except BaseException:
            self.close()
            raise

    def capture_loggers(self) -> None:
        """The ``ray`` logger's stream handlers write to the file (again after
        ``ray.init``, which may make new ones)."""
        if self._saved_fd is None:
            return
        held = {id(h) for h, _ in self._handlers}
        for handler in logging.getLogger("ray").handlers:
            if isinstance(handler, logging.StreamHandler) and id(handler) not in held:
                self._handlers.append((handler, handler.stream))
                handler.setStream(self._file)

    def close(self, discard: bool = False) -> None:
        """Everything as it was; with ``discard`` (Ray could not be started or joined: the
        run changes nothing), also without the file and folders made here. Idempotent."""
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers = []
        if self._saved_fd is not None:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None
            if sys.stderr is self._terminal:
                sys.stderr = self._stderr
            if self._terminal is not None:
                self._terminal.close()
                self._terminal = None
        if not self._file.closed:
            self._file.close()
        if discard:
            for made in self._made:  # the file, then its folders, while empty
                try:
                    if made == self.path:
                        made.unlink()
                    else:
                        made.rmdir()
                except OSError:
                    break
            self._made = []


def _fd(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


__all__ = ["RayOutput"]
