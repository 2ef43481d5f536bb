"""The messages of :mod:`paramserver.cluster.messages` between processes, over Ray.

:class:`RayTransport` is the :class:`~paramserver.cluster.transport.Transport` of the Ray
backend: a request becomes a call of the server actor's method of the same name
(``put``, ``get``, ``update``, ``leave``, ``sync``), with the arrays as top-level arguments,
so that Ray moves them through its object store and the server reads them where they lie
(read-only, no copy). A reply's values come back as one object-store reference per server
state (shared by every worker answered from it); :meth:`RayPending.wait` fetches them and
the worker stub copies them into its replica.

Every wait has the cluster's timeout. A server actor that dies while a request waits is a
:class:`ServerLost` (a :class:`ClusterError`): the driver then restores the servers from
their checkpoints and runs the steps again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from .errors import ClusterError
from .messages import Address, ErrorReply, Get, Leave, Put, Reply, Request, Sync, Update
from .ray_wire import ServerLost, decode_reply
from .transport import Pending


def fetch(ref: Any, timeout: float | None) -> Any:
    """``ray.get`` of one reference, with a timeout (None: no limit)."""
    return ray.get(ref, timeout=timeout)


class RayPending(Pending):
    """The reply of a server actor to one request; see the module docstring."""

    __slots__ = ("_address", "_handle", "_ref", "_server")

    def __init__(self, ref: Any, what: str, address: Address, server: str, handle: Any):
        super().__init__(what)
        self._ref = ref
        self._address = address
        self._server = server
        self._handle = handle

    @property
    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)

    def _diagnose(self) -> str:
        try:
            return str(fetch(self._handle.waiting_for.remote(), 5.0))
        except Exception as e:  # a diagnosis must not hide the timeout
            return f"(could not ask {self._server}: {type(e).__name__})"

    def wait(self, timeout: float, who: str = "") -> Reply:
        who = who or "the caller"
        deadline = time.monotonic() + timeout
        try:
            data = fetch(self._ref, timeout)

            def values(x: Any) -> np.ndarray:
                if isinstance(x, np.ndarray):
                    return x
                return fetch(x, max(0.0, deadline - time.monotonic()))  # type: ignore[no-any-return]

            reply = decode_reply(data, values)
        except GetTimeoutError:
            raise ClusterError(f"{who} waited {timeout:g} s for {self.what}; "
                               f"{self._diagnose()}") from None
        except (RayActorError, ObjectLostError) as e:
            raise ServerLost(f"{who} lost {self._server} while it waited for {self.what}: "
                             f"its Ray actor died ({type(e).__name__})", self._address) from None
        if isinstance(reply, ErrorReply):
            raise ClusterError(reply.message)
        return reply


class RayTransport:
    """Requests to server actors; see the module docstring.

    Args:
        handles: the server actors by address.
        names: each server's name for messages ("server 0", "server 1 of server group 1").
    """

    def __init__(self, handles: Mapping[Address, Any], names: Mapping[Address, str]):
        self.handles = dict(handles)
        self.names = dict(names)

    def send(self, to: Address, request: Request, what: str) -> Pending:
        h = self.handles[to]
        if isinstance(request, Update):
            ref = h.update.remote(request.group, request.worker, request.step, request.grads,
                                  request.flush)
        elif isinstance(request, Get):
            ref = h.get.remote(request.group, request.worker, request.step, request.version,
                               request.clock)
        elif isinstance(request, Put):
            ref = h.put.remote(request.values, request.num_shares, request.step)
        elif isinstance(request, Leave):
            ref = h.leave.remote(request.group, request.worker, request.step)
        elif isinstance(request, Sync):
            ref = h.sync.remote(request.server_group, request.delta)
        else:
            raise TypeError(f"unknown request {type(request).__name__}")
        return RayPending(ref, what, to, self.names.get(to, f"server {to[1]}"), h)

    def abort(self, reason: str) -> None:
        """Stop the run on every server (waits up to a few seconds; a dead one is skipped)."""
        refs = [h.abort.remote(reason) for h in self.handles.values()]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)
        except Exception:  # a dead server has nothing to stop
            pass


__all__ = ["RayPending", "RayTransport", "ServerLost", "fetch"]
