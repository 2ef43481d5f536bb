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

Where a server actor runs on the sender's node (asked once per server, :meth:`RayTransport.
_link`), the messages whose replies always travel as plain data (:data:`LINKED`: the gets,
updates and batches of a step, not a state's dicts) do not go through Ray calls at all but
over a :class:`~paramserver.cluster.node_link.Link`: a Unix socket for a few numbers, the
bytes of a large message and of its reply in the sender's shared memory. A Ray actor call
costs its caller about 0.8 ms of CPU whatever it carries, 6 ms with a 1 MB argument and
reply; a message over a link costs a copy of its bytes each way (0.04 ms a MB).

Servers with nothing to hold have no actor: their (empty) requests are answered here, by
a local :class:`~paramserver.cluster.server.Server`.

Every wait has the cluster's timeout. A server actor that dies while a request waits is a
:class:`~paramserver.cluster.errors.ServerLost`, reported as soon as Ray reports the death.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from .errors import ClusterError, ServerLost
from .messages import NESTED, Address, Reply, Request
from .node_link import Link, LinkPending
from .ray_wire import decode, encode, pack, unpack
from .shared_memory import Region, supported
from .transport import Handler, LocalTransport, Pending

#: The requests that go over a link (their replies: values, acks, norms, errors); the others
#: (states, key inits and descriptions: dicts and tuples) through Ray calls.
LINKED = frozenset({"Get", "Update", "Clip", "Leave", "Sync", "Put", "Flush", "Save",
                    "Restore", "KeyBatch/Get", "KeyBatch/Update", "Keyed/Get", "Keyed/Update",
                    "KeyInits", "DescribeKeys", "SetUpdater", "Barrier"})


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


class RayPending(Pending):
    """The reply of a server actor to one request; see the module docstring."""

    __slots__ = ("_handle", "_ref", "_server")

    def __init__(self, ref: Any, what: str, address: Address, server: str, handle: Any):
        super().__init__(what, None, address)
        self._ref = ref
        self._server = server
        self._handle = handle

    @property
    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)

    def _diagnose(self) -> str:
        return ask_waiting_for(self._handle, self._server)

    def wait(self, timeout: float, who: str = "") -> Reply:
        who = who or "the caller"
        deadline = time.monotonic() + timeout
        try:
            data = ray.get(self._ref, timeout=timeout)

            def resolve(x: Any) -> Any:
                if isinstance(x, ray.ObjectRef):
                    return ray.get(x, timeout=max(0.0, deadline - time.monotonic()))
                return x

            reply: Reply = unpack(data) if isinstance(data, bytes) else decode(data, resolve)
        except GetTimeoutError:
            raise ClusterError(f"{who} waited {timeout:g} s for {self.what}; "
                               f"{self._diagnose()}") from None
        except (RayActorError, ObjectLostError) as e:
            raise ServerLost(f"{who} lost {self._server} while it waited for {self.what}: "
                             f"its Ray actor died ({type(e).__name__})", self.address) from None
        return self._result(reply)


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
                 idle: Mapping[Address, Handler] | None = None, links: bool = True):
        self.handles = dict(handles)
        self.names = dict(names)
        self.idle = LocalTransport(idle or {})
        self._linking = links and supported()
        self._region: Region | None = None
        self._links: dict[Address, Link | None] = {}  # None: the server is not linked
        self._expected: dict[tuple[Address, str], int] = {}  # reply bytes, by request kind
        self._node: str | None = None  # the Ray node of this process
        self._lock = threading.Lock()
        self._making = threading.Lock()  # held while a link is made
        #: requests sent over links (for tests and benchmarks)
        self.linked = 0

    def send(self, to: Address, request: Request, what: str) -> Pending:
        h = self.handles.get(to)
        if h is None:
            if to in self.idle.servers:
                return self.idle.send(to, request, what)
            raise ClusterError(f"no server at {to}")
        name = self.names.get(to, f"server {to[1]}")
        if self._linking:
            kind = _kind(request)
            link = self._link(to, h, name) if kind in LINKED else None
            if link is not None:
                pending = self._over(link, to, kind, request, what)
                if pending is not None:
                    return pending
        data = pack(request)
        ref = h.call.remote(data) if data is not None else h.call.remote(*encode(request))
        return RayPending(ref, what, to, name, h)

    def send_after(self, to: Address, request: Request, what: str,
                   before: Sequence[Pending]) -> Pending | None:
        """Send ``request`` over the link to server ``to`` when every request of ``before``
        went over that link (its server reads a connection's messages in order, on one
        thread); None, with nothing sent, otherwise (a Ray call to a threaded actor keeps
        no order)."""
        link = self._links.get(to)
        if link is None or link.closed or not all(
                isinstance(p, LinkPending) and p.link is link for p in before):
            return None
        kind = _kind(request)
        return self._over(link, to, kind, request, what) if kind in LINKED else None

    def _over(self, link: Link, to: Address, kind: str, request: Request, what: str
              ) -> LinkPending | None:
        """``request`` sent over ``link``, room left for the reply its kind had at most; None
        when it cannot go that way (:meth:`Link.send`)."""
        key = (to, kind)
        pending = link.send(request, what, self._expected.get(key, 0))
        if pending is not None:
            self.linked += 1
            pending.learn = lambda n: self._expect(key, n)
        return pending

    # -- links (see the module docstring) ----------------------------------------------------

    def _link(self, to: Address, h: Any, name: str) -> Link | None:
        """The link to server ``to``: made at the first message (None when the server is on
        another node, or cannot be asked); made again after its process ended (a restart)."""
        link = self._links.get(to)
        if to in self._links and (link is None or not link.closed):
            return link
        with self._making:  # one link per server, whichever thread asks first
            link = self._links.get(to)
            if to in self._links and (link is None or not link.closed):
                return link
            with self._lock:
                if self._region is None:
                    try:
                        self._region = Region()
                    except OSError:
                        self._linking = False
                        return None
                region = self._region
            try:
                if self._node is None:
                    self._node = str(ray.get_runtime_context().get_node_id())
                reason, address = ray.get(h.attach.remote(
                    self._node, region.name, region.pid, region.fd, region.size), timeout=60.0)
                made: Link | None = (Link(address, region, name, to,
                                          lambda: ask_waiting_for(h, name))
                                     if not reason else None)
            except Exception:  # dead, or not answering: the Ray path reports it
                made = None
            self._links[to] = made
            return made

    def _expect(self, key: tuple[Address, str], nbytes: int) -> None:
        """The next requests of a kind leave room in shared memory for a reply of
        ``nbytes`` (one came that did not fit)."""
        if nbytes > self._expected.get(key, 0):
            self._expected[key] = nbytes

    def close(self) -> None:
        """Close the links and free the shared memory (messages then go through Ray calls)."""
        with self._lock:
            self._linking = False
            links, self._links = [x for x in self._links.values() if x], {}
            region, self._region = self._region, None
        for link in links:
            link.close()
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


def _kind(request: Request) -> str:
    """A request's kind (a nested one's with what it asks)."""
    kind = type(request).__name__
    if kind in NESTED:
        kind += "/" + type(request.request).__name__  # type: ignore[union-attr]
    return kind


__all__ = ["LINKED", "RayPending", "RayTransport", "ask_waiting_for", "picklable"]
