"""Ends the processes of a local Ray whose driver died without stopping it (Linux).

A Ray that ``ray.init`` starts is stopped by ``ray.shutdown``, or at the driver's exit. A
driver killed outright (``kill -9``, the out-of-memory killer) stops nothing: the GCS and
the raylet notice and end, but the raylet's dashboard and runtime-env agents (about 85 MB
each) stay for a minute or two, until their own checks give up. So when paramserver starts
a Ray of its own it also starts this small process (:func:`watch`), which is told the
processes of that Ray (their ids and start times) and holds the read end of a pipe whose
only writer is the driver: when the driver ends without saying ``done``, the pipe reads
empty and every process of the list still running (the same process: the same start time)
is sent SIGTERM, then SIGKILL a second later.

Run as a script (``python -I ray_reaper.py``): it imports nothing but the standard library
and ignores Ctrl-C (the terminal's interrupt goes to the driver, which stops Ray itself).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None when none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` now (children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Reaper:
    """The driver's side: the watcher process and what it is told."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-I", __file__], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def watch(self) -> None:
        """Tell the watcher every process below this one now (Ray's, just started)."""
        if self._proc is None or self._proc.stdin is None:
            return
        own = self._proc.pid
        lines = []
        for pid in descendants(os.getpid()):
            started = start_time(pid)
            if pid != own and started is not None:
                lines.append(f"{pid} {started}\n")
        self._send("".join(lines))

    def done(self) -> None:
        """Ray was stopped: the watcher ends, reaping nothing."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            if proc.stdin is not None:
                proc.stdin.write(b"done\n")
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def _send(self, text: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(text.encode())
            self._proc.stdin.flush()
        except OSError:  # the watcher is gone: nothing to be done about it
            pass


def watch(stream: IO[str]) -> None:
    """The watcher: read ``PID START`` lines until ``done`` (end quietly) or the end of
    the stream (the driver died: reap)."""
    processes: dict[int, str] = {}
    for line in stream:
        if line.strip() == "done":
            return
        number, _, started = line.strip().partition(" ")
        if number.isdigit() and started:
            processes[int(number)] = started
    left = [p for p, s in processes.items() if start_time(p) == s]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            left = [p for p in left if start_time(p) == processes[p]]
            if not left:
                return
            time.sleep(0.05)  # waiting for processes of another parent: no event to wait on


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(sys.stdin)
