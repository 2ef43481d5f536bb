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

Servers with nothing to hold have no actor: their (empty) requests are answered here, by
a local :class:`~paramserver.cluster.server.Server`.

Every wait has the cluster's timeout. A server actor that dies while a request waits is a
:class:`~paramserver.cluster.errors.ServerLost`, reported as soon as Ray reports the death.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from .errors import ClusterError, ServerLost
from .messages import Address, Reply, Request
from .ray_wire import decode, encode, pack, unpack
from .transport import Handler, LocalTransport, Pending


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
                 idle: Mapping[Address, Handler] | None = None):
        self.handles = dict(handles)
        self.names = dict(names)
        self.idle = LocalTransport(idle or {})

    def send(self, to: Address, request: Request, what: str) -> Pending:
        h = self.handles.get(to)
        if h is None:
            if to in self.idle.servers:
                return self.idle.send(to, request, what)
            raise ClusterError(f"no server at {to}")
        packed = pack(request)
        ref = h.call.remote(packed) if packed is not None else h.call.remote(*encode(request))
        return RayPending(ref, what, to, self.names.get(to, f"server {to[1]}"), h)

    def abort(self, reason: str) -> None:
        """Stop the run on every server (waits up to a few seconds; a dead one is skipped)."""
        self.idle.abort(reason)
        refs = [h.abort.remote(reason) for h in self.handles.values()]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)
        except Exception:  # a dead server has nothing to stop
            pass


__all__ = ["RayPending", "RayTransport", "ask_waiting_for", "picklable"]
