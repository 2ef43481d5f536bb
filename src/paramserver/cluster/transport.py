"""The transport boundary: how requests reach servers and replies come back.

Server and worker stub code never call each other; they exchange the messages of
:mod:`paramserver.cluster.messages` through a :class:`Transport`:

- ``send(to, request)`` delivers a request to a server and returns a :class:`Pending`, the
  promise of its one reply;
- a server answers by calling the ``reply`` callback it was handed with the request, at
  once or later, from whatever thread completes the work;
- ``Pending.wait(timeout)`` is the only place anyone waits for a reply, and it raises a
  :class:`ClusterError` that says what was waited for, for how long, and what the server is
  still waiting for itself.

:class:`LocalTransport` is the embedded one: it calls the server's handler in the sender's
thread and passes the messages as they are, so arrays travel as views and nothing is
copied. A transport between processes (Ray) only has to move the same messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from .errors import ClusterError
from .messages import Address, ErrorReply, Reply, Request

if TYPE_CHECKING:
    from .server import Server


class Pending:
    """The one reply to a request, once it comes.

    Args:
        what: what the waiter waits for, as a phrase that completes "… waited N s at step S
            for …" (e.g. "server 0's reply to its update").
        describe: says what the server itself is waiting for, for timeout messages.
    """

    __slots__ = ("_describe", "_event", "_reply", "what")

    def __init__(self, what: str, describe: Callable[[], str] | None = None):
        self.what = what
        self._describe = describe
        self._event = threading.Event()
        self._reply: Reply | None = None

    def resolve(self, reply: Reply) -> None:
        """Deliver the reply (the first one counts)."""
        if self._reply is None:
            self._reply = reply
            self._event.set()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float, who: str = "") -> Reply:
        """The reply; raises :class:`ClusterError` on timeout or on an :class:`ErrorReply`.

        Args:
            timeout: seconds to wait.
            who: the waiter and its step, e.g. "worker 1 of group 0 … at step 3", for
                messages; the phrase is "<who> waited <timeout> s for <what>".
        """
        if not self._event.wait(timeout):
            detail = ""
            if self._describe is not None:
                try:
                    detail = self._describe()
                except Exception as e:  # a diagnosis must not hide the timeout
                    detail = f"(could not ask: {e})"
            who = who or "the caller"
            raise ClusterError(f"{who} waited {timeout:g} s for {self.what}"
                               + (f"; {detail}" if detail else ""))
        reply = self._reply
        if isinstance(reply, ErrorReply):
            raise ClusterError(reply.message)
        assert reply is not None
        return reply


class Transport(Protocol):
    """Moves requests to servers and replies back; see the module docstring."""

    def send(self, to: Address, request: Request, what: str) -> Pending:
        """Deliver ``request`` to server ``to``; ``what`` names its reply for messages."""
        ...

    def abort(self, reason: str) -> None:
        """Stop the run: every pending and later request is answered with ``reason``."""
        ...


class LocalTransport:
    """Servers in this process: the handler runs in the sender's thread; nothing is copied."""

    def __init__(self, servers: Mapping[Address, Server]):
        self.servers = dict(servers)

    def send(self, to: Address, request: Request, what: str) -> Pending:
        server = self.servers[to]
        pending = Pending(what, server.waiting_for)
        server.handle(request, pending.resolve)
        return pending

    def abort(self, reason: str) -> None:
        for server in self.servers.values():
            server.abort(reason)


__all__ = ["LocalTransport", "Pending", "Transport"]
