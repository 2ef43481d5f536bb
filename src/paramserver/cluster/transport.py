"""The transport boundary: how requests reach servers and replies come back.

Server and worker stub code never call each other; they exchange the messages of
:mod:`paramserver.cluster.messages` through a :class:`Transport`:

- ``send(to, request, what)`` delivers a request to a server and returns a
  :class:`Pending`, the promise of its one reply;
- a server is a :class:`Handler`: it answers by calling the ``reply`` callback it was handed
  with the request, at once or later, from whatever thread completes the work;
- ``Pending.wait(timeout)`` is the only place anyone waits for a reply, and it raises a
  :class:`ClusterError` that says what was waited for, for how long, and what the server is
  still waiting for itself (a :class:`ServerLost` when the server's process died).

:class:`LocalTransport` is the embedded one: it calls the handler in the sender's thread and
passes the messages as they are, so arrays travel as views and nothing is copied. A
transport between processes (Ray) only has to move the same messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .errors import ClusterError, ServerLost
from .messages import Address, ErrorReply, Reply, Request

ReplyFn = Callable[[Reply], None]


class Handler(Protocol):
    """What serves requests: :class:`~paramserver.cluster.server.Server` is one."""

    def handle(self, request: Request, reply: ReplyFn) -> None:
        """Handle one request; ``reply`` is called once, now or when the work is done."""
        ...

    def abort(self, reason: str) -> None:
        """Answer every waiting and later request with ``reason``, until the next put."""
        ...

    def waiting_for(self) -> str:
        """What the handler is waiting for, in words (for timeout messages)."""
        ...


class Pending:
    """The one reply to a request, once it comes.

    Args:
        what: what the waiter waits for, as a phrase that completes "… waited N s at step S
            for …" (e.g. "server 0's reply to its update").
        describe: says what the server itself is waiting for, for timeout messages.
        address: the server's address (named by a :class:`ServerLost`).
    """

    __slots__ = ("_describe", "_event", "_reply", "address", "what")

    def __init__(self, what: str, describe: Callable[[], str] | None = None,
                 address: Address = (0, 0)):
        self.what = what
        self.address = address
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

    def _timeout(self, timeout: float, who: str) -> ClusterError:
        detail = ""
        if self._describe is not None:
            try:
                detail = self._describe()
            except Exception as e:  # a diagnosis must not hide the timeout
                detail = f"(could not ask: {e})"
        return ClusterError(f"{who or 'the caller'} waited {timeout:g} s for {self.what}"
                            + (f"; {detail}" if detail else ""))

    def _result(self, reply: Reply | None) -> Reply:
        if isinstance(reply, ErrorReply):
            if reply.lost:
                raise ServerLost(reply.message, self.address)
            raise ClusterError(reply.message)
        assert reply is not None
        return reply

    def wait(self, timeout: float, who: str = "") -> Reply:
        """The reply; raises :class:`ClusterError` on timeout or on an :class:`ErrorReply`.

        Args:
            timeout: seconds to wait.
            who: the waiter and its step, e.g. "worker 1 of group 0 … at step 3", for
                messages; the phrase is "<who> waited <timeout> s for <what>".
        """
        if not self._event.wait(timeout):
            raise self._timeout(timeout, who)
        return self._result(self._reply)


class Transport(Protocol):
    """Moves requests to servers and replies back; see the module docstring.

    A transport may say, with a class attribute ``copies = True``, that ``send`` has copied
    the request's arrays by the time it returns (a transport between processes): a sender
    may then hand it views of memory it changes later."""

    def send(self, to: Address, request: Request, what: str) -> Pending:
        """Deliver ``request`` to server ``to``; ``what`` names its reply for messages."""
        ...

    def abort(self, reason: str) -> None:
        """Stop the run: every pending and later request is answered with ``reason``."""
        ...


def send_after(transport: Any, to: Address, request: Request, what: str,
               before: Sequence[Pending]) -> Pending | None:
    """Send ``request`` to server ``to`` as ``send`` does, when it reaches the server after
    every request of ``before`` sent there (on a channel that keeps their order: a
    transport's ``send_after``); None, with nothing sent, when the transport cannot say so
    (the caller waits for ``before`` first)."""
    method = getattr(transport, "send_after", None)
    return None if method is None else method(to, request, what, before)


class LocalTransport:
    """Handlers in this process: each runs in the sender's thread; nothing is copied."""

    def __init__(self, servers: Mapping[Address, Handler]):
        self.servers = dict(servers)

    def send(self, to: Address, request: Request, what: str) -> Pending:
        server = self.servers[to]
        pending = Pending(what, server.waiting_for, to)
        server.handle(request, pending.resolve)
        return pending

    def send_after(self, to: Address, request: Request, what: str,
                   before: Sequence[Pending]) -> Pending:
        """:meth:`send`: every request is handled in the sender's thread, in order."""
        return self.send(to, request, what)

    def abort(self, reason: str) -> None:
        for server in self.servers.values():
            server.abort(reason)


class _MeteredPending(Pending):
    """A pending reply whose bytes are counted when it is read."""

    __slots__ = ("_inner", "_meter")

    def __init__(self, inner: Pending, meter: MeteredTransport):
        super().__init__(inner.what, None, inner.address)
        self._inner = inner
        self._meter = meter

    @property
    def done(self) -> bool:
        return self._inner.done

    def wait(self, timeout: float, who: str = "") -> Reply:
        reply = self._inner.wait(timeout, who)
        self._meter.count("received", reply)
        return reply


class MeteredTransport:
    """A transport that counts the bytes of the arrays of every message it moves (by kind,
    requests ``sent`` and replies ``received``): what the messages would cost between
    processes. For benchmarks and tests; wraps another."""

    def __init__(self, inner: Transport):
        self.inner = inner
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, where: str, message: Request | Reply) -> None:
        from .messages import KeyBatch, Keyed, payload_bytes

        kind = type(message).__name__
        if isinstance(message, (Keyed, KeyBatch)):
            kind = type(message.request).__name__
        with self._lock:
            table = getattr(self, where)
            table[kind] = table.get(kind, 0) + payload_bytes(message)

    def reset(self) -> None:
        with self._lock:
            self.sent, self.received = {}, {}

    def send(self, to: Address, request: Request, what: str) -> Pending:
        self.count("sent", request)
        return _MeteredPending(self.inner.send(to, request, what), self)

    def send_after(self, to: Address, request: Request, what: str,
                   before: Sequence[Pending]) -> Pending | None:
        inner = [p._inner if isinstance(p, _MeteredPending) else p for p in before]
        pending = send_after(self.inner, to, request, what, inner)
        if pending is None:
            return None
        self.count("sent", request)
        return _MeteredPending(pending, self)

    def abort(self, reason: str) -> None:
        self.inner.abort(reason)


__all__ = ["Handler", "LocalTransport", "MeteredTransport", "Pending", "ReplyFn", "Transport",
           "send_after"]
