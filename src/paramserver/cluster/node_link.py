"""A sender's connection to a server on its node: the messages of
:mod:`~paramserver.cluster.messages` without a Ray call each (Linux).

A Ray actor call costs its caller about 0.8 ms of CPU and a few ms of latency on a loaded
machine, whatever it carries; ps-lite's whole step of a 1 MB table costs 2.7 ms. So where a
server actor runs on the sender's node, :class:`~paramserver.cluster.ray_transport.
RayTransport` sends it messages over a Unix socket of the abstract namespace (no file
anywhere: it goes with the server's process) and the bytes of a large message through the
sender's shared memory (:class:`~paramserver.cluster.shared_memory.Region`):

- a frame (:data:`FRAME`: the request's number, how it travels, four numbers) goes over
  the socket, followed by the message's bytes (:func:`~paramserver.cluster.ray_wire.pack`'s
  format) when it is small (``INLINE``), or naming the place in the sender's region where
  they lie (``PLACED``: offset, length, the room for the reply, the region's size);
- the server (:class:`Listener`, one thread per connection) copies a placed message out at
  once, hands it to its handler in the order sent, and writes each reply, when the handler
  answers, into the message's place when it fits there, else after the frame;
- the sender's :class:`Link` reads the replies on a thread of its own, copies a placed reply
  out, frees its place and resolves the request's :class:`LinkPending`.

When the server's process ends, its socket closes: every request waiting for a reply is a
:class:`~paramserver.cluster.errors.ServerLost`, as the Ray path reports one.

This module does not import Ray.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from .errors import ClusterError, ServerLost
from .messages import Address, ErrorReply, Reply, Request
from .ray_wire import packed, unpack
from .shared_memory import Attached, Region, RegionError
from .transport import Pending

#: Messages (or the replies expected) of at least this many bytes travel through shared
#: memory; smaller ones after their frame.
SHARED_MIN = 8 << 10
#: A frame: request number, how the bytes travel, then four numbers (see the docstring).
FRAME = struct.Struct("<QB7xQQQQ")
INLINE, PLACED, HELLO = 0, 1, 2


def _same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of ``sock`` runs as this process's user. A name
    in the abstract namespace has no file and so no permissions: any local user can connect
    to it, or bind it first; a link is only between processes of one user (as the sender's
    shared memory, opened through /proc, is)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _read(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes; EOFError when the other end has closed."""
    buf = bytearray(n)
    view, at = memoryview(buf), 0
    while at < n:
        got = sock.recv_into(view[at:])
        if not got:
            raise EOFError
        at += got
    return buf


class LinkPending(Pending):
    """The reply to a request sent over a :class:`Link`."""

    __slots__ = ("_diagnosis", "_lost", "_server", "learn", "link", "place")

    def __init__(self, what: str, address: Address, server: str,
                 diagnosis: Callable[[], str], place: int | None, link: Link):
        super().__init__(what, None, address)
        self.link = link  # the link it went over
        self._server = server
        self._diagnosis = diagnosis
        self._lost: str | None = None
        self.place = place  # its place in the sender's region, until the reply is read
        #: told the bytes of a reply that came after its frame (it did not fit the place)
        self.learn: Callable[[int], None] | None = None

    def lose(self, how: str) -> None:
        self._lost = how
        self._event.set()

    def wait(self, timeout: float, who: str = "") -> Reply:
        who = who or "the caller"
        if not self._event.wait(timeout):
            raise ClusterError(f"{who} waited {timeout:g} s for {self.what}; "
                               f"{self._diagnosis()}")
        if self._lost is not None:
            raise ServerLost(f"{who} lost {self._server} while it waited for {self.what}: "
                             f"its Ray actor died ({self._lost})", self.address)
        return self._result(self._reply)


class Link:
    """A sender's connection to one server (see the module docstring).

    Args:
        address: the server's socket (abstract namespace).
        region: the sender's shared memory.
        server: the server's name, for messages.
        diagnosis: asks the server what it waits for (a timeout's message).
    """

    def __init__(self, address: str, region: Region, server: str, to: Address,
                 diagnosis: Callable[[], str]):
        self.region = region
        self.server = server
        self.to = to
        self.diagnosis = diagnosis
        self.closed = False
        self._pending: dict[int, LinkPending] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect("\0" + address)
            mine = _same_user(self._sock)
            if mine:
                hello = json.dumps([region.name, region.pid, region.fd]).encode()
                self._sock.sendall(FRAME.pack(0, HELLO, len(hello), 0, 0, region.size) + hello)
        except OSError:
            self._sock.close()
            raise
        if not mine:  # another user's socket under the server's name: no link
            self._sock.close()
            raise ClusterError(f"the socket of {server} belongs to another user")
        threading.Thread(target=self._replies, daemon=True,
                         name=f"paramserver-link-{to[0]}-{to[1]}").start()

    def send(self, request: Request, what: str, room: int) -> LinkPending | None:
        """Send ``request``: its bytes in the region when they (or the reply, ``room``
        bytes expected) are large, else after the frame; None when it cannot travel this
        way (a dict field; the link closed)."""
        p = packed(request, limit=None)
        if p is None or self.closed:
            return None
        place = None
        if max(p.size, room) >= SHARED_MIN:
            place = self.region.take(max(p.size, room))
        pending = LinkPending(what, self.to, self.server, self.diagnosis, place, self)
        if place is not None:
            p.write(self.region.view(place, p.size))
            frame: Any = [FRAME.pack(0, PLACED, place, p.size, max(p.size, room),
                                     self.region.size)]
        else:
            frame = [FRAME.pack(0, INLINE, p.size, 0, 0, 0), *p.parts()]
        with self._lock:
            if self.closed:
                self._free(pending)
                return None
            self._seq += 1
            seq = self._seq
            self._pending[seq] = pending
            frame[0] = struct.pack("<Q", seq) + frame[0][8:]
            try:
                self._sock.sendall(b"".join(frame))
            except OSError:
                del self._pending[seq]
                self._free(pending)
                self._close_locked()
                return None
        return pending

    def _free(self, pending: LinkPending) -> None:
        if pending.place is not None:
            self.region.give(pending.place)
            pending.place = None

    def _replies(self) -> None:
        """Read the replies until the connection closes (the server has ended, or
        :meth:`close`); then every waiting request is lost."""
        try:
            while True:
                seq, how, n, _, _, _ = FRAME.unpack(_read(self._sock, FRAME.size))
                with self._lock:
                    pending = self._pending.pop(seq, None)
                if how == PLACED:
                    assert pending is not None and pending.place is not None
                    reply: Reply = unpack(self.region.view(pending.place, n), copy=True)
                else:
                    reply = unpack(bytes(_read(self._sock, n)))
                    if pending is not None and pending.learn is not None:
                        pending.learn(n)
                if pending is not None:
                    self._free(pending)
                    pending.resolve(reply)
        except (EOFError, OSError, ValueError, AssertionError):
            pass
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self.closed = True
        waiting, self._pending = list(self._pending.values()), {}
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for pending in waiting:
            self._free(pending)
            pending.lose("its connection closed")

    def close(self) -> None:
        with self._lock:
            self._close_locked()
        self._sock.close()


class Listener:
    """A server's socket for the links of senders on its node (see the module docstring).

    Args:
        name: the socket's name (unique: the server's incarnation).
        handle: runs a request; its second argument is called once with the reply.
        who: the server's name, for messages.
    """

    def __init__(self, name: str, handle: Callable[[Request, Callable[[Reply], None]], None],
                 who: str):
        self.name = name
        self._handle = handle
        self._who = who
        self._attached = Attached()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + name)
        self._sock.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="paramserver-links").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not _same_user(conn):  # another local user: no link to this server
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="paramserver-link").start()

    def _serve(self, conn: socket.socket) -> None:
        lock = threading.Lock()  # replies come from any thread of the server

        def send(parts: list[Any]) -> None:
            try:
                with lock:
                    conn.sendall(b"".join(parts))
            except OSError:  # the sender has ended: nobody waits for it
                pass

        def replier(seq: int, into: memoryview | None) -> Callable[[Reply], None]:
            def reply(answer: Reply) -> None:
                p = packed(answer, limit=None)
                if p is None:  # (every reply of the requests sent this way packs)
                    p = packed(ErrorReply(f"{self._who}: a {type(answer).__name__} reply "
                                          "cannot travel over a link"), limit=None)
                    assert p is not None
                if into is not None and p.size <= len(into):
                    p.write(into)
                    send([FRAME.pack(seq, PLACED, p.size, 0, 0, 0)])
                else:
                    send([FRAME.pack(seq, INLINE, p.size, 0, 0, 0), *p.parts()])
            return reply

        try:
            _, how, n, _, _, size = FRAME.unpack(_read(conn, FRAME.size))
            if how != HELLO:
                return
            name, pid, fd = json.loads(bytes(_read(conn, n)))
            self._attached.view(name, pid, fd, size)
            while True:
                seq, how, a, b, c, size = FRAME.unpack(_read(conn, FRAME.size))
                if how == PLACED:
                    region = self._attached.view(name, pid, fd, size)
                    request = unpack(region[a:a + b], copy=True)  # its place is the reply's
                    into: memoryview | None = region[a:a + c]
                else:
                    request, into = unpack(bytes(_read(conn, a))), None
                reply = replier(seq, into)
                try:
                    self._handle(request, reply)
                except Exception as e:  # as a failed Ray call: the sender raises it
                    reply(ErrorReply(f"{self._who}: {type(e).__name__}: {e}"))
        except (EOFError, OSError, ValueError, RegionError):
            pass
        finally:
            conn.close()

    def check(self, name: str, pid: int, fd: int, size: int) -> str:
        """Whether a sender's region opens here: "" when it does, else why not."""
        try:
            self._attached.view(name, pid, fd, size)
        except RegionError as e:
            return str(e)
        return ""

    def close(self) -> None:
        self._sock.close()
        self._attached.close()


__all__ = ["FRAME", "SHARED_MIN", "Link", "LinkPending", "Listener"]
