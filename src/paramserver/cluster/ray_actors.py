"""The actors of the Ray backend: a server and a worker, around the embedded code.

Both are built from plain data (:mod:`paramserver.cluster.ray_wire`): the configurations as
their declarations' JSON, the server ranges and Params as numbers and arrays, the modules
that register a user's components by name.

:class:`ServerActor` holds one :class:`~paramserver.cluster.server.Server` and passes each
request to its handler, on a thread of its own; a request whose reply must wait (an update
before its group's step is complete, a get before its version) waits until the handler
answers it, and the replies made from one state of the server share one object-store copy
of the values.

:class:`WorkerActor` holds one :class:`~paramserver.cluster.worker.Worker` stub with its own
ParamSet replica, and runs a part of a run in one call: :func:`~.driver.work` on a thread of
its own, and a Ray streaming generator that yields the steps' outcomes to the driver in
batches (no call per step): an outcome waits at most :attr:`WorkerActor.linger` for the
ones after it, a failure goes at once. A yield costs the worker and the driver about as
much as a step's whole exchange with a server, so a fast run sends one per several steps;
and since nothing waits longer than ``linger``, a worker blocked in its step (waiting for
another worker, or for something the driver does after a step) has sent every step before.
The steps' thread wakes the sending thread only for the first outcome of a batch, a failure
and the end (with 2 workers and 2 servers on 2 cores, a wake-up per step cost a tenth of the
worker's CPU).
Its warnings travel with the outcomes.

Both also run the stages of a synchronous step compiled into a Ray graph
(:mod:`~paramserver.cluster.ray_compiled`): the worker's ``compute`` and ``adopt``, the
server's ``take`` and ``answer``, on the loop Ray keeps in each actor for the graph.
``where`` says on which Ray node an actor runs, from inside it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray

from ..config.job import ClusterConf
from ..updaters import create_updater
from .driver import DONE, work
from .gradfn import GradFnCache
from .keys import KeyServer
from .messages import Address, Reply, Request
from .node_link import Listener
from .passes import _SMALL as SMALL
from .passes import all_finite, sum_into
from .ray_compiled import Relay, ServerStages, WorkerStages, prepare_channels
from .ray_transport import RayTransport, picklable
from .ray_wire import (
    LARGE,
    decode,
    encode,
    import_modules,
    layout_from_data,
    pack,
    params_from_data,
    unpack,
)
from .server import Server
from .worker import Worker


def _thread_policy(threads: int | None = None) -> None:
    """Idle OpenMP threads sleep instead of spinning, and (``threads``: the spec's, the
    cluster's CPUs per actor) numba's kernels run on at most that many threads — unless the
    environment says otherwise. An actor runs its kernels in bursts between messages;
    threads spinning for ~0.2 s after each burst would take the cores of the actors beside
    it (the process that sends the next message, Ray's copies into the object store), and
    where the actors outnumber the cores a parallel kernel waits at its end for a thread
    that another actor's work keeps from a core (measured, a table's step at 2×2 on two
    cores: 3.45 ms with one thread each against 3.76 with two, medians of five alternating
    runs). Set before numba loads (it reads the count then); changes no result."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads:
        os.environ.setdefault("NUMBA_NUM_THREADS", str(min(threads, os.cpu_count() or 1)))


class _Slot:
    """Where one request's encoded reply lands, and the event its thread waits on."""

    __slots__ = ("data", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.data: bytes | tuple[Any, ...] = ("ErrorReply", "no reply", False)


class ServerActor:
    """One server as a Ray actor; see the module docstring.

    A threaded actor: each request runs on a thread of its own, and one whose reply must
    wait waits on an event that the handler sets when it answers. Every call of the handler
    holds :attr:`_lock`, and a reply is encoded inside that call, so the replies of one call
    see one state of the server, and their values share one object-store copy. Ray gives the
    actor enough threads for every request that can wait at once (``max_concurrency``).

    Args:
        spec: ``group``, ``layout``, ``updater`` and ``cluster`` (JSON), ``modules``,
            ``sys_path``, ``folder`` (its checkpoints), ``names`` (of the master servers).
    """

    def __init__(self, spec: Mapping[str, Any]):
        _thread_policy(spec.get("threads"))
        import_modules(spec["modules"], spec["sys_path"])
        layout = layout_from_data(spec["layout"])
        prepare_channels(layout.size * np.dtype(layout.dtype).itemsize)
        conf = ClusterConf.parse(json.loads(spec["cluster"]))
        folder = spec.get("folder")
        self.server: Server | KeyServer
        if spec.get("keys"):
            self.server = KeyServer(layout.index, conf, spec["updater"])
        else:
            self.server = Server(layout, create_updater(json.loads(spec["updater"])), conf,
                                 int(spec["group"]), Path(folder) if folder else None)
        self.names = dict(spec["names"])
        self.incarnation = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._memo: dict[int, Any] = {}
        self._listener: Listener | None = None  # links from senders on this node
        self._stages = (ServerStages(self.server, self._call, conf.nworkers_per_group)
                        if isinstance(self.server, Server) else None)
        _warm_up(self.server if isinstance(self.server, Server) else None)

    def ping(self) -> str:
        """This incarnation's id: another one after a restart."""
        return self.incarnation

    def where(self) -> str:
        return where()

    def connect(self, masters: Mapping[Address, Any]) -> None:
        """The master group's server actors (for a server of a group > 0; again after a
        restart: actor handles are not constructor arguments, which a restart re-reads)."""
        self.server.connect(RayTransport(masters, self.names).send)

    def _share(self, values: np.ndarray) -> Any:
        """An array of a reply, as it is now: a copy, or (large) one object-store object
        shared by the replies of this state."""
        if values.nbytes < LARGE:
            return values.copy()
        if not values.flags.writeable and values.flags.owndata:
            # the reply's own array (a batch's rows or values, read-only): nothing changes
            # it, so Ray stores it as it sends the reply (one object fewer to fetch)
            return values
        ref = self._memo.get(id(values))
        if ref is None:
            ref = self._memo[id(values)] = ray.put(values)
        return ref

    def _call(self, fn: Callable[[], None]) -> None:
        """Run the handler (``handle`` or ``abort``): replies made in it share a state."""
        with self._lock:
            self._memo = {}
            try:
                fn()
            finally:
                self._memo = {}

    def call(self, *data: Any) -> bytes | tuple[Any, ...]:
        """One request, as :func:`~paramserver.cluster.ray_wire.pack` (one ``bytes``) or
        :func:`~paramserver.cluster.ray_wire.encode` made it; its reply, packed when it is
        small, else encoded."""
        request = unpack(data[0]) if len(data) == 1 and isinstance(data[0], bytes) else (
            decode(data))
        return self._serve(request)

    def attach(self, node: str, name: str, pid: int, fd: int, size: int) -> tuple[str, str]:
        """The socket for links from a sender on node ``node`` whose shared memory is
        ``name`` (``RayTransport``), opened at the first: ``("", its name)``, or
        ``(why not, "")`` (another node; the sender's memory does not open here)."""
        if node != where():
            return "on another node", ""
        with self._lock:
            if self._listener is None:
                self._listener = Listener(
                    f"paramserver-{self.incarnation}",
                    lambda request, reply: self._call(
                        lambda: self.server.handle(request, reply)),
                    getattr(self.server, "name", "the server"))
        reason = self._listener.check(name, pid, fd, size)
        return (reason, "") if reason else ("", self._listener.name)

    def _serve(self, request: Request) -> bytes | tuple[Any, ...]:
        """Handle one request; its reply packed when it is small, else encoded."""
        slot = _Slot()

        def reply(answer: Reply) -> None:
            # Encoded at once, in the handler's call: before any other request changes
            # the values.
            data = pack(answer)
            slot.data = data if data is not None else encode(answer, self._share)
            slot.event.set()

        self._call(lambda: self.server.handle(request, reply))
        slot.event.wait()  # a stop (abort) or the next put answers every waiting request
        return slot.data

    def abort(self, reason: str) -> None:
        self._call(lambda: self.server.abort(reason))

    def reached(self, group: int, worker: int) -> int | None:
        """See :meth:`~paramserver.cluster.server.Server.reached` (None: a key server)."""
        reached = getattr(self.server, "reached", None)
        return reached(group, worker) if reached is not None else None

    def waiting_for(self) -> str:
        if self._stages is not None:
            return self._stages.waiting_for()
        return self.server.waiting_for()

    # -- the stages of compiled steps (ray_compiled.ServerStages) ----------------------------

    def begin(self) -> None:
        assert self._stages is not None
        self._stages.begin()

    def gate(self, step: int) -> None:
        assert self._stages is not None
        self._stages.gate(step)

    def take(self, gate: None, update: bytes | None) -> None:
        assert self._stages is not None
        self._stages.take(gate, update)

    def answer(self, *taken: None) -> tuple[bytes | None, ...]:
        assert self._stages is not None
        return self._stages.answer(*taken)

    def answer_one(self, gate: None, update: bytes | None) -> tuple[bytes | None, ...]:
        assert self._stages is not None
        return self._stages.answer_one(gate, update)

    def answered(self) -> int:
        assert self._stages is not None
        return self._stages.answered

    def unpark(self) -> None:
        assert self._stages is not None
        self._stages.parked.set()


def where() -> str:
    """The id of the Ray node this process runs on."""
    return str(ray.get_runtime_context().get_node_id())


def _warm_up(server: Server | None = None) -> None:
    """Compile (or load from numba's cache) what the first step runs, before it runs: a
    cold kernel costs a new process about a second, which a short cluster.timeout would
    take for a hang."""
    big = np.zeros(SMALL, np.float32)
    all_finite(big)
    if server is None:
        return
    dtype = server.layout.dtype
    ro = np.zeros(SMALL, dtype)
    ro.flags.writeable = False  # gradients arrive read-only from the object store
    sum_into(np.empty_like(ro), ro, ro)
    all_finite(ro)
    w = np.zeros(1, dtype)
    server.updater.apply(0, w, ro[:1], server.updater.init_state([0, 1], dtype),
                         grad_norm=0.0)
    if server.updater.conf.clip_norm > 0:
        server.updater.grad_sum_squares(ro, [0, SMALL])


class WorkerActor:
    """One worker as a Ray actor; see the module docstring.

    Args:
        spec: ``group``, ``index``, ``cluster`` (JSON), ``params`` (the ParamSet's structure),
            ``layouts``, ``names`` (of its servers), ``modules``, ``sys_path``, ``build``
            (a RemoteGradFn's data to build from the start on, on a thread of its own, or
            None: see ``RayBackend``'s ``build_ahead``).
        servers: the server actors of its server group, by address.
    """

    def __init__(self, spec: Mapping[str, Any], servers: Mapping[Address, Any]):
        _thread_policy(spec.get("threads"))
        import_modules(spec["modules"], spec["sys_path"])
        self._fns = GradFnCache()
        if spec.get("build") is not None:  # the run's gradient function, while this starts
            self._fns.build_ahead(tuple(spec["build"]))
        conf = ClusterConf.parse(json.loads(spec["cluster"]))
        params = params_from_data(spec["params"])
        layouts = [layout_from_data(d) for d in spec["layouts"]]
        prepare_channels(max((L.size * np.dtype(L.dtype).itemsize for L in layouts), default=0))
        relay = Relay(RayTransport(servers, dict(spec["names"])))
        self.worker = Worker(int(spec["group"]), int(spec["index"]), params, layouts, relay,
                             conf)
        self._stages = WorkerStages(self.worker, relay, self._fns, len(servers))
        _warm_up()

    def ping(self) -> int:
        return os.getpid()

    def where(self) -> str:
        return where()

    # -- the stages of compiled steps (ray_compiled.WorkerStages) ----------------------------

    def begin(self, first: int, fn: Any, live: bool) -> tuple[Any, ...] | None:
        return self._stages.begin(first, fn, live)

    def compute(self, step: int) -> Any:
        return self._stages.compute(step)

    def adopt(self, *answers: tuple[bytes | None, ...] | None) -> tuple[Any, ...] | None:
        return self._stages.adopt(*answers)

    def settle(self, step: int) -> tuple[Any, ...] | None:
        return self._stages.settle(step)

    def overdue(self, timeout: float) -> tuple[int, str] | None:
        return self._stages.overdue(timeout)

    def unpark(self) -> None:
        self._stages.parked.set()

    #: The longest an outcome waits for the next ones before it is sent (seconds).
    linger = 0.05

    def steps(self, first: int, last: int, fn: Any) -> Iterator[list[tuple[Any, ...]]]:
        """Steps ``[first, last)``: their outcomes as data, in batches (see the module
        docstring). A ``BaseException`` that is not an ``Exception`` (``SystemExit``) in the
        steps ends this call with it, as it would in the actor's own thread."""
        grad_fn = self._fns.get(fn)
        # The steps' thread appends to `batch` and wakes this one only for the first outcome
        # of a batch, a failure and the end: not once per step.
        ready = threading.Condition()
        batch: list[tuple[Any, ...]] = []
        urgent = False  # the batch holds an outcome that is not `done`
        end: list[BaseException | None] = []  # set once the steps are over

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def run() -> None:
                nonlocal urgent
                error: BaseException | None = None
                try:
                    for outcome in work(self.worker, grad_fn, first, last):
                        outcome.notes += [(w.category.__name__, str(w.message))
                                          for w in caught]
                        caught.clear()
                        outcome.cause = picklable(outcome.cause)
                        data = outcome.to_data()
                        with ready:
                            batch.append(data)
                            if outcome.kind != DONE:
                                urgent = True
                            if len(batch) == 1 or urgent:
                                ready.notify()
                except BaseException as e:  # SystemExit and the like: raised below
                    error = e
                finally:
                    with ready:
                        end.append(error)
                        ready.notify()

            threading.Thread(target=run, daemon=True, name="paramserver-steps").start()
            while True:
                with ready:
                    ready.wait_for(lambda: batch or end)
                    deadline = time.monotonic() + self.linger
                    # The first outcome waits up to `linger` for the ones after it.
                    while not (urgent or end):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        ready.wait(left)
                    out, batch[:] = list(batch), []
                    urgent = False
                    over = bool(end)
                if out:
                    yield out
                if over:
                    break
            if end[0] is not None:
                raise end[0]


__all__ = ["LARGE", "ServerActor", "WorkerActor"]
