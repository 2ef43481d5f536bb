"""Markers at the moments a crash matters, and a kill switch on them, for crash tests.

paramserver calls :func:`marker` where a crash would leave something half done: at every
phase of an atomic file write (:mod:`paramserver.atomic`: the temporary made, its bytes
written, flushed to disk, renamed into place) and after every training step. Nothing
happens unless the environment asks for it:

- ``PARAMSERVER_KILL_AT=N`` kills the process with ``SIGKILL`` at its ``N``-th marker (from
  1), as a power cut or the kernel's OOM killer would: no ``finally``, no flush, no atexit;
  ``PARAMSERVER_KILL_AT=EVENT:N`` at the ``N``-th marker named ``EVENT`` or
  ``EVENT.<phase>`` (``write.sync:2``: the second file written is on disk under its
  temporary name, not yet renamed; ``step:7``: after the seventh step this process ran).
- ``PARAMSERVER_MARKERS=FILE`` appends a line ``EVENT PATH`` to ``FILE`` per marker, so that
  a test can see the moments of a run and aim a kill at any one of them.

The crash suite (``tests/test_crash.py``, ``benchmarks/crash_resume.py``) kills ``train``
at such moments and checks that ``--resume`` ends with the files of an uninterrupted run.
Unset (as outside tests), a marker costs one look-up in ``os.environ``.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "PARAMSERVER_KILL_AT"
MARKERS = "PARAMSERVER_MARKERS"

_counts: dict[str, int] = {}
_pid = [0]


def marker(event: str, path: object = "") -> None:
    """A moment named ``event``, about ``path`` (a file, or a step number). The events:
    ``write.open`` (a temporary file made, empty), ``write.data`` (its bytes written, not
    flushed), ``write.sync`` (flushed to disk, not renamed), ``write.done`` (renamed into
    place), ``step`` (a training step done)."""
    kill_at = os.environ.get(KILL_AT)
    log = os.environ.get(MARKERS)
    if kill_at is None and log is None:
        return
    if _pid[0] != os.getpid():  # a forked child counts its own markers
        _counts.clear()
        _pid[0] = os.getpid()
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{event} {path}\n")
    if not kill_at:
        return
    name, _, number = kill_at.rpartition(":")
    key = name if name and (event == name or event.startswith(name + ".")) else ""
    if name and not key:
        return
    _counts[key] = _counts.get(key, 0) + 1
    if str(_counts[key]) == number.strip():
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["KILL_AT", "MARKERS", "marker"]
