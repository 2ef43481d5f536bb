"""The messages of :mod:`paramserver.cluster.messages` between processes, over Ray.

:class:`RayTransport` is the :class:`~paramserver.cluster.transport.Transport` of the Ray
backend: a request becomes one call of the server actor's ``call`` method with the message
as one ``bytes`` argument when it is small (:func:`~paramserver.cluster.ray_wire.pack`: one
serialisation per message), else as a tuple of plain fields
(:func:`~paramserver.cluster.ray_wire.encode`), so that Ray moves its large arrays through
its object store and the server reads them where they lie (read-only, no copy). Replies
travel the same way; a reply's large arrays come back as one object-store reference per
server state (shared by every worker answered from it); :meth:`RayPending.wait` fetches
them.

Where a server actor runs on the sender's node (asked once per server: :meth:`RayTransport.
_reaches`), a message of :data:`SHARED_MIN` bytes or more (with the reply expected) does not
travel in the call at all: the sender writes it (:func:`~paramserver.cluster.ray_wire.pack`'s
format) into its :class:`~paramserver.cluster.shared_memory.Region`, and the call carries only
where it lies (a few ints: ``ServerActor.call_shared``). The server copies the message out at
once and writes its reply into the same place when it fits there (the place is as large as
the largest reply of that kind of request so far), returning the reply's length; the sender
copies the reply out and frees the place. A reply that does not fit, or a message with a dict
(a state), travels as above. A Ray actor call with a 1 MB argument and a 1 MB reply costs its
caller about 6 ms of CPU here; with the bytes in shared memory it costs what a call of a few
bytes costs (0.8 ms) and two copies of 1 MB (0.04 ms each).

Servers with nothing to hold have no actor: their (empty) requests are answered here, by
a local :class:`~paramserver.cluster.server.Server`.

Every wait has the cluster's timeout. A server actor that dies while a request waits is a
:class:`~paramserver.cluster.errors.ServerLost`, reported as soon as Ray reports the death.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from .errors import ClusterError, ServerLost
from .messages import NESTED, Address, Reply, Request, State
from .ray_wire import decode, encode, pack, packed, unpack
from .shared_memory import Region, supported
from .transport import Handler, LocalTransport, Pending

#: Messages (with the reply expected) of at least this many bytes go through shared memory
#: where the server is on the sender's node.
SHARED_MIN = 8 << 10


def ask_waiting_for(handle: Any, name: str) -> str:
    """What a server actor is waiting for, in words (for a timeout's message)."""
    try:
        return str(ray.get(handle.waiting_for.remote(), timeout=5.0))
    except Exception as e:  # a diagnosis must not hide the timeout
        return f"(could not ask {name}: {type(e).__name__})"


def picklable(e: BaseException | None) -> BaseException | None:
    """``e`` if it can travel to the driver (pickled by Ray), else None (its message
    travels all the same)."""
    if e is None:
        return None
    try:
        ray.cloudpickle.dumps(e)
    except Exception:
        return None
    return e


class _Place:
    """Where a message sent through shared memory lies, until its reply has been read (or,
    its :class:`RayPending` dropped unread, until the server has answered)."""

    __slots__ = ("finalizer", "offset", "transport")

    def __init__(self, transport: RayTransport, offset: int):
        self.transport = transport
        self.offset = offset
        self.finalizer: weakref.finalize | None = None

    def read(self, nbytes: int) -> Reply:
        """The reply written there (arrays copied out), and the place freed."""
        region = self.transport._region
        assert region is not None
        reply: Reply = unpack(region.view(self.offset, nbytes), copy=True)
        self.free()
        return reply

    def free(self) -> None:
        if self.finalizer is not None:
            self.finalizer.detach()
            self.finalizer = None
            region = self.transport._region
            if region is not None:
                region.give(self.offset)


class RayPending(Pending):
    """The reply of a server actor to one request; see the module docstring."""

    __slots__ = ("__weakref__", "_handle", "_kind", "_place", "_ref", "_server", "_transport")

    def __init__(self, ref: Any, what: str, address: Address, server: str, handle: Any,
                 transport: RayTransport | None = None, kind: str = "",
                 place: _Place | None = None):
        super().__init__(what, None, address)
        self._ref = ref
        self._server = server
        self._handle = handle
        self._transport = transport  # (sharing memory with the server: learns reply sizes)
        self._kind = kind
        self._place = place
        if place is not None:
            assert transport is not None
            place.finalizer = weakref.finalize(self, transport._abandon, ref, place.offset)

    @property
    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0, fetch_local=False)
        return bool(ready)

    def _diagnose(self) -> str:
        return ask_waiting_for(self._handle, self._server)

    def wait(self, timeout: float, who: str = "") -> Reply:
        if self._reply is not None:  # read before (its place is free now)
            return self._result(self._reply)
        who = who or "the caller"
        deadline = time.monotonic() + timeout
        try:
            data = ray.get(self._ref, timeout=timeout)

            def resolve(x: Any) -> Any:
                if isinstance(x, ray.ObjectRef):
                    return ray.get(x, timeout=max(0.0, deadline - time.monotonic()))
                return x

            if isinstance(data, int):  # the reply is in shared memory, where the message was
                assert self._place is not None
                reply: Reply = self._place.read(data)
            else:
                reply = unpack(data) if isinstance(data, bytes) else decode(data, resolve)
                if self._transport is not None:
                    self._transport._expect_reply(self.address, self._kind, reply)
                if self._place is not None:
                    self._place.free()
        except GetTimeoutError:
            raise ClusterError(f"{who} waited {timeout:g} s for {self.what}; "
                               f"{self._diagnose()}") from None
        except (RayActorError, ObjectLostError) as e:
            if self._place is not None:  # a dead server writes nothing more
                self._place.free()
            raise ServerLost(f"{who} lost {self._server} while it waited for {self.what}: "
                             f"its Ray actor died ({type(e).__name__})", self.address) from None
        self._reply = reply
        return self._result(reply)


def _kind(request: Request) -> str:
    """A request's kind, for the size of its reply (a batch's: with what it asks)."""
    kind = type(request).__name__
    if kind in NESTED:
        kind += "/" + type(request.request).__name__  # type: ignore[union-attr]
    return kind


class RayTransport:
    """Requests to server actors; see the module docstring.

    Args:
        handles: the server actors by address.
        names: each server's name for messages ("server 0", "server 1 of server group 1").
        idle: servers with nothing to hold, answered in this process.
    """

    #: ``send`` has copied a request's arrays when it returns (Ray serialises the call's
    #: arguments then: small ones packed, large ones into the object store).
    copies = True

    def __init__(self, handles: Mapping[Address, Any], names: Mapping[Address, str],
                 idle: Mapping[Address, Handler] | None = None, shared: bool = True):
        self.handles = dict(handles)
        self.names = dict(names)
        self.idle = LocalTransport(idle or {})
        self._sharing = shared and supported()
        self._region: Region | None = None
        self._reach: dict[Address, bool] = {}  # whether a server reads our shared memory
        self._expected: dict[tuple[Address, str], int] = {}  # reply bytes, by request kind
        self._abandoned: list[tuple[Any, int]] = []  # (call, place) of replies not read
        self._node: str | None = None  # the Ray node of this process
        self._lock = threading.Lock()
        #: messages sent through shared memory (for tests and benchmarks)
        self.shared_sent = 0

    def send(self, to: Address, request: Request, what: str) -> Pending:
        h = self.handles.get(to)
        if h is None:
            if to in self.idle.servers:
                return self.idle.send(to, request, what)
            raise ClusterError(f"no server at {to}")
        name = self.names.get(to, f"server {to[1]}")
        sharing = self._sharing and self._reaches(to, h)
        kind = ""
        if sharing:
            kind = _kind(request)
            pending = self._send_shared(to, h, request, kind, what, name)
            if pending is not None:
                return pending
        data = pack(request)
        ref = h.call.remote(data) if data is not None else h.call.remote(*encode(request))
        return RayPending(ref, what, to, name, h, self if sharing else None, kind)

    # -- shared memory (see the module docstring) -------------------------------------------

    def _reaches(self, to: Address, h: Any) -> bool:
        """Whether server ``to`` is on this node and reads this transport's region (asked
        of it once; a server that cannot be asked is not)."""
        reach = self._reach.get(to)
        if reach is None:
            with self._lock:
                if self._region is None:
                    try:
                        self._region = Region()
                    except OSError:
                        self._sharing = False
                        return False
                region = self._region
            try:
                if self._node is None:
                    self._node = str(ray.get_runtime_context().get_node_id())
                reason = ray.get(h.attach.remote(self._node, region.name, region.pid, region.fd,
                                                 region.size), timeout=60.0)
            except Exception:  # dead, or not answering: the ordinary path says so
                reason = "not asked"
            reach = self._reach[to] = reason == ""
        return reach

    def _send_shared(self, to: Address, h: Any, request: Request, kind: str, what: str,
                     name: str) -> RayPending | None:
        """Send ``request`` through shared memory, or None when it is small (with the
        reply expected), or has what the format does not hold (a dict)."""
        p = packed(request, limit=None)
        if p is None:
            return None
        room = max(p.size, self._expected.get((to, kind), 0))
        if room < SHARED_MIN:
            return None
        region = self._region
        if self._abandoned:
            self._reclaim()
        offset = region.take(room) if region is not None else None
        if region is None or offset is None:
            return None
        try:
            p.write(region.view(offset, p.size))
            ref = h.call_shared.remote(region.name, region.pid, region.fd, region.size, offset,
                                       p.size, room)
        except BaseException:
            region.give(offset)
            raise
        self.shared_sent += 1
        return RayPending(ref, what, to, name, h, self, kind, _Place(self, offset))

    def _expect_reply(self, to: Address, kind: str, reply: Reply) -> None:
        """A reply that came in the call: the next requests of its kind leave room for one
        as large in shared memory (unless it cannot be written there: a dict)."""
        if isinstance(reply, State):
            return
        p = packed(reply, limit=None)
        if p is None:
            return
        key = (to, kind)
        if p.size > self._expected.get(key, 0):
            self._expected[key] = p.size

    def _abandon(self, ref: Any, offset: int) -> None:
        """A pending reply dropped unread: its place is freed once the server has answered
        (it may still write there)."""
        with self._lock:
            self._abandoned.append((ref, offset))

    def _reclaim(self) -> None:
        with self._lock:
            abandoned, self._abandoned = self._abandoned, []
        if not abandoned:
            return
        ready, _ = ray.wait([r for r, _ in abandoned], num_returns=len(abandoned), timeout=0,
                            fetch_local=False)
        done = set(ready)
        region = self._region
        for ref, offset in abandoned:
            if ref in done:
                if region is not None:
                    region.give(offset)
            else:
                self._abandon(ref, offset)

    def close(self) -> None:
        """Free this transport's shared memory (its messages then travel in the calls)."""
        with self._lock:
            self._sharing = False
            region, self._region = self._region, None
        if region is not None:
            region.close()

    def abort(self, reason: str) -> None:
        """Stop the run on every server (waits up to a few seconds; a dead one is skipped)."""
        self.idle.abort(reason)
        refs = [h.abort.remote(reason) for h in self.handles.values()]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)
        except Exception:  # a dead server has nothing to stop
            pass


__all__ = ["SHARED_MIN", "RayPending", "RayTransport", "ask_waiting_for", "picklable"]
