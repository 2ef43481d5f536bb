"""Memory that a process shares with the processes of its node, for messages (Linux).

A Ray actor call moves its arguments and its reply through Ray's object store and its
RPCs: for a message of 1 MB that costs the caller about 6 ms of CPU where the copy itself
costs 0.04 ms. Between processes of one node, a :class:`~paramserver.cluster.node_link.Link`
therefore writes a large message's bytes here and sends only where they lie (a few
numbers); the reply is written back into the same place.

:class:`Region` is the sender's: an anonymous memory file (``memfd_create``: it has no name
in ``/dev/shm`` or anywhere else, so nothing is left behind whatever ends the processes —
the kernel frees it once its last descriptor and mapping are gone), grown when a message
does not fit, with the places of the messages in flight (:meth:`Region.take`,
:meth:`Region.give`). A receiver opens it through ``/proc/<pid>/fd/<fd>`` of the sender
(:class:`Attached`), after checking that the descriptor there is that region (its name holds
a random token), and keeps it mapped; it forgets the regions of senders that have ended.

This module does not import Ray.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import dataclass

from .errors import ClusterError

#: Messages start at multiples of this (their arrays at multiples of 8 within them).
ALIGN = 64
#: The first size of a region; it grows (doubling) as messages need.
FIRST_SIZE = 1 << 20


def supported() -> bool:
    """Whether this system has what a region needs (Linux's ``memfd_create`` and /proc)."""
    return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class Region:
    """A sender's shared memory and the places of its messages in flight.

    Attributes:
        name: unique (its pid and a random token): what the receivers check they opened.
        pid, fd: where a receiver opens it (``/proc/<pid>/fd/<fd>``).
        size: its bytes now.
    """

    def __init__(self, first_size: int = FIRST_SIZE):
        self.pid = os.getpid()
        self.name = f"paramserver-{self.pid}-{os.urandom(8).hex()}"
        self.fd: int | None = os.memfd_create(self.name, os.MFD_CLOEXEC)
        self.size = 0
        self._map: mmap.mmap | None = None
        self._busy: dict[int, int] = {}  # offset -> bytes of each message in flight
        self._lock = threading.Lock()
        try:
            self._grow(first_size)
        except BaseException:
            self.close()
            raise

    def _grow(self, size: int) -> None:
        assert self.fd is not None
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        os.ftruncate(self.fd, size)
        # the old mapping goes when the last view of it does (a reply being read)
        self._map = mmap.mmap(self.fd, size)
        self.size = size

    def take(self, nbytes: int) -> int | None:
        """The offset of a free place of ``nbytes`` (the first that fits; the region grows
        when none does), held until :meth:`give`; None when it is closed or cannot grow."""
        nbytes = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            if self.fd is None:
                return None
            at = 0
            for offset in sorted(self._busy):
                if offset - at >= nbytes:
                    break
                at = offset + self._busy[offset]
            if at + nbytes > self.size:
                try:
                    self._grow(max(2 * self.size, at + nbytes))
                except OSError:  # no memory for it: the message goes the other way
                    return None
            self._busy[at] = nbytes
            return at

    def give(self, offset: int) -> None:
        """The place at ``offset`` is free again (its message's reply was read)."""
        with self._lock:
            self._busy.pop(offset, None)

    @property
    def in_flight(self) -> int:
        """The places held now."""
        with self._lock:
            return len(self._busy)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """``nbytes`` of the region from ``offset``."""
        assert self._map is not None
        return memoryview(self._map)[offset:offset + nbytes]

    def close(self) -> None:
        """Close the region (its memory goes once no receiver maps it). Idempotent."""
        with self._lock:
            fd, self.fd = self.fd, None
            self._map = None
            self._busy.clear()
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "fd", None) is not None:
            self.close()


class RegionError(ClusterError):
    """A region could not be opened (a sender gone, no permission)."""


@dataclass
class _Map:
    name: str
    map: mmap.mmap
    size: int


class Attached:
    """The regions a receiver has opened, by their sender's (pid, fd); thread-safe."""

    #: How often (seconds, at most) the regions of ended senders are looked for.
    CHECK_EVERY = 5.0

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int], _Map] = {}
        self._lock = threading.Lock()
        self._checked = time.monotonic()

    def view(self, name: str, pid: int, fd: int, size: int) -> memoryview:
        """The region ``name`` (``size`` bytes or more), opened at its first message or
        when it has grown; raises :class:`RegionError` when it cannot be. Now and then,
        and at a sender's first message, the regions of senders that have ended (a worker
        that crashed) are unmapped: their memory is then freed."""
        with self._lock:
            m = self._maps.get((pid, fd))
            now = time.monotonic()
            if m is None or now - self._checked > self.CHECK_EVERY:
                self._checked = now
                self._forget_ended()
            if m is None or m.name != name or m.size < size:
                m = self._maps[(pid, fd)] = _Map(name, self._open(name, pid, fd, size), size)
            return memoryview(m.map)

    @staticmethod
    def _open(name: str, pid: int, fd: int, size: int) -> mmap.mmap:
        path = f"/proc/{int(pid)}/fd/{int(fd)}"
        try:
            # the descriptor there must be the region named (pids and fds are reused)
            if os.readlink(path) != f"/memfd:{name} (deleted)":
                raise RegionError(f"{path} is not the shared memory '{name}'")
            own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except RegionError:
            raise
        except OSError as e:
            raise RegionError(f"cannot open the shared memory '{name}' of process {pid}: "
                              f"{e.strerror or e}") from None
        try:
            if os.fstat(own).st_size < size:
                raise RegionError(f"the shared memory '{name}' is smaller than {size} bytes")
            return mmap.mmap(own, size)  # mmap keeps a descriptor of its own
        finally:
            os.close(own)

    def _forget_ended(self) -> None:
        """Unmap the regions of senders that have ended (their memory is then freed)."""
        for key in [k for k in self._maps if not os.path.exists(f"/proc/{k[0]}")]:
            del self._maps[key]

    def __len__(self) -> int:
        return len(self._maps)

    def close(self) -> None:
        with self._lock:
            self._maps.clear()


__all__ = ["ALIGN", "FIRST_SIZE", "Attached", "Region", "RegionError", "supported"]
