"""Synchronous steps over Ray Compiled Graphs: a step's exchange through shared memory.

An ordinary Ray actor call costs a millisecond or more of scheduling and object-store
traffic; a training step of a small model is shorter than that. For the steps of a
*synchronous* run — every server group serving one worker group, whose workers each push
one update per server per step and wait for its reply — the graph of calls is the same at
every step, so it is compiled once (``ray.dag``, ``experimental_compile``): Ray then keeps a
loop running in every actor and moves each message through a shared-memory channel
(between nodes, a channel Ray copies across), with no scheduling per call. The backend
compiles one only when asked (``compiled=True``): on one node the links of
:mod:`~paramserver.cluster.node_link` are quicker (whoever waits for a message blocks; the
graph's channels spin, see below), and across nodes Ray 2.60's raylet can crash when an
actor of a graph dies mid-step (a channel closed under a push: ray-project/ray#63229).

The graph of one step (``step`` is its input)::

    worker w:  compute(step)      gradient function, push: one packed Update per server
    server s:  gate(step)         (waits there between parts: see below)
               take(update of w)  for each worker of its group, in worker order (held)
               answer(...)        the held updates to the Server at once; its replies
                                  (a group of one worker: answer_one(update), both at once)
    worker w:  adopt(replies)     the new values; the step's outcome (the graph's output)

The step's messages and code are those of the other path: :func:`~.driver.gradients`, the
:class:`~.worker.Worker` stub's push and collect (through a :class:`Relay`, which holds its
updates for the graph and resolves their replies from it), the :class:`~.server.Server`'s
handler, :func:`~.driver.done` and :func:`~.driver.failure`. A server takes a step's
updates all at once, so a step that stops midway (a worker gone) left nothing on it.

:class:`CompiledSteps` is the driver's side: it runs a part of a run, a few steps in flight
(the driver's own round trip is off the critical path), delivers the outcomes, and stands
in for what the other path's workers do on their own: a worker's wait that exceeds the
cluster's timeout is reported as the worker would report it. A step that fails in a
worker (its gradient function raises, a non-finite gradient) halts every worker at that
step, as a run stops; a worker that leaves (``on_worker_failure: continue``) takes no part
from then on. When an actor dies, Ray tears the graph down: the dead workers are reported,
a lost server is a lost server (the driver brings the servers back from their checkpoints,
and the next part compiles a new graph), and under ``continue`` the other workers finish
the part on the ordinary path of actor calls (:mod:`~paramserver.cluster.ray_backend`).

Ray's channels wait for a message by spinning (``sched_yield``), quickest where every
actor has a core and costly where they share cores. So the driver reads the steps'
outcomes in batches, when they are about due (:class:`_Pace`); it does not stop the steps
at the places where a run may stop early (a Ctrl-C's checkpoint): the graph drains there
(the driver has reported every step before) and goes on unless a stop was asked for
(:class:`~.driver.Pauses`). At the end of a part it sends the
graph a step that *parks* every actor's loop (blocked on an event, not spinning) until
the next part wakes them: an idle cluster takes no CPU while the driver tests or saves.

Asynchronous runs (worker groups sharing a server group), the updater's ``clip_norm`` (a
second exchange per step), row-sparse tables (rows pulled during a step) and key-value
stores use the ordinary path.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import (
    GetTimeoutError,
    RayActorError,
    RayChannelError,
    RayError,
    RaySystemError,
)

from ..config.job import ClusterConf
from ..params import ParamSet
from ..updaters import Updater
from .driver import DONE, ENDED, ERROR, LEFT, Outcome, Pauses, done, failure, gradients
from .errors import ClusterError
from .gradfn import GradFnCache
from .messages import Address, Reply, Request, Update
from .ray_transport import RayTransport, ask_waiting_for, picklable
from .ray_wire import pack, unpack
from .server import Server
from .transport import Pending
from .worker import Worker

Deliver = Callable[[Outcome], None]

#: The graph's inputs besides the steps: one that starts the actors' loops, and one that
#: parks them until the next part (see :class:`CompiledSteps`).
WARM, PARK = -1, -2


def compiled_reason(conf: ClusterConf, params: ParamSet, updater: Updater | None,
                    keys: bool) -> str | None:
    """Why a cluster's steps cannot run over a compiled graph, or None when they can."""
    if keys or updater is None:
        return "a key-value store's clients push and pull as they go"
    if conf.nworker_groups != conf.nserver_groups:
        return "worker groups share a server group (asynchronous)"
    if updater.conf.clip_norm > 0:
        return "clip_norm adds a second exchange to a step"
    if params.tables:
        return "row-sparse tables pull their rows during a step"
    return None


# -- a worker actor's side --------------------------------------------------------------------

class Relay:
    """A worker's transport in compiled steps: while it holds (during a push), an
    :class:`Update` is packed and held for the graph, and its :class:`Pending` is resolved
    by :meth:`WorkerStages.adopt`; every other message (the first pull, a leave) goes
    through the ordinary actor calls."""

    #: as its inner transport's, and a held update is packed (a copy) as it is sent
    copies = True

    def __init__(self, inner: RayTransport):
        self.inner = inner
        self.holding = False
        self.held: list[bytes] = []

    def send(self, to: Address, request: Request, what: str) -> Pending:
        if not (self.holding and isinstance(request, Update)):
            return self.inner.send(to, request, what)
        data = pack(request, limit=None)
        assert data is not None  # an update holds arrays and numbers only
        handle, name = self.inner.handles[to], self.inner.names[to]
        self.held.append(data)
        return Pending(what, lambda: ask_waiting_for(handle, name), to)

    def send_after(self, to: Address, request: Request, what: str,
                   before: Sequence[Pending]) -> Pending | None:
        if self.holding and isinstance(request, Update):
            return None
        return self.inner.send_after(to, request, what, before)

    def abort(self, reason: str) -> None:
        self.inner.abort(reason)


def channel_bytes(largest: int) -> int:
    """The first size of a graph's channels, for messages of at most ``largest`` bytes of
    arrays (and a header). Ray does not free a graph's buffers when it is torn down
    (ray-project/ray#43836), so they are kept to what the messages need (Ray grows a
    channel that a message outgrows)."""
    return largest + (16 << 10)


def prepare_channels(largest: int) -> None:
    """In one of our actors, before a graph is compiled over it: its channels' first size
    (:func:`channel_bytes`; Ray takes it from the actor's own context for the channels the
    actor makes), and no torch tensors in them. Ray would otherwise import torch (seconds,
    and a few hundred MB) in every actor when its loop of a graph starts, only to look for
    GPUs to move tensors with; our messages are bytes (Ray keeps that setting in a private
    field of its channel context: skipped if Ray no longer has it). The driver's context is
    changed only while it compiles (the user's own graphs may move tensors)."""
    from ray.dag import DAGContext
    from ray.experimental.channel.common import ChannelContext

    DAGContext.get_current().buffer_size_bytes = channel_bytes(largest)
    context = ChannelContext.get_current()
    if getattr(context, "_torch_available", True) is None:
        context._torch_available = False


class WorkerStages:
    """What a worker actor does in the compiled graph (see the module docstring).

    Attributes:
        out: the worker takes no part in the steps (not begun, gone, or halted by a failed
            step): ``compute`` sends nothing and ``adopt`` reports nothing.
    """

    def __init__(self, worker: Worker, relay: Relay, fns: GradFnCache, servers: int):
        self.worker = worker
        self.relay = relay
        self.fns = fns
        self.grad_fn: Callable[..., Any] | None = None
        self.out = True
        self.stopped: Outcome | None = None  # compute's failure, reported by adopt
        self.step = -1
        self.metrics: Any = None
        self.notes: list[tuple[str, str]] = []
        self.pendings: list[Pending] = []
        self.since: float | None = None  # when its push began to wait for the replies
        self.last: tuple[int, tuple[Any, ...]] | None = None  # its last outcome, as data
        self.servers = servers  # of its group, with something to hold: compute's outputs
        self.parked = threading.Event()  # set: go on

    def begin(self, first: int, fn: Any, live: bool) -> tuple[Any, ...] | None:
        """Before a part: the gradient function and the first pull (the servers were put or
        restored); an error's outcome, or None."""
        self.out, self.stopped, self.pendings, self.since, self.last = True, None, [], None, None
        if not live:
            return None
        try:
            self.grad_fn = self.fns.get(fn)
            self.worker.pull(first)
        except Exception as e:
            return _as_data(failure(self.worker, first, e))
        self.out = False
        return None

    def _nothing(self) -> Any:
        return None if self.servers == 1 else (None,) * self.servers

    def compute(self, step: int) -> Any:
        """The gradient function and the push: one packed update per server (None: none).
        :data:`WARM` does nothing; :data:`PARK` waits until :meth:`unpark`."""
        if step == PARK:
            park(self.parked)
        if self.out or step < 0:
            return self._nothing()
        w = self.worker
        assert self.grad_fn is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics, stopped = gradients(w, self.grad_fn, step)
            if stopped is None:
                self.relay.holding = True
                try:
                    self.pendings = w.push(step)
                except Exception as e:
                    stopped = failure(w, step, e)
                finally:
                    self.relay.holding = False
        held, self.relay.held = self.relay.held, []
        notes = [(c.category.__name__, str(c.message)) for c in caught]
        if stopped is not None:
            stopped.notes += notes
            self.stopped, self.out = stopped, True
            return self._nothing()
        self.step, self.metrics, self.notes, self.since = step, metrics, notes, time.monotonic()
        return held[0] if len(held) == 1 else tuple(held)

    def adopt(self, *answers: tuple[bytes | None, ...] | None) -> tuple[Any, ...] | None:
        """The servers' replies to this worker's updates (each server answers every worker of
        its group); the step's outcome as data, or None (no part in it)."""
        if self.stopped is not None:
            stopped, self.stopped = self.stopped, None
            return self._keep(stopped.step, _as_data(stopped))
        if self.out:
            return None
        w, step = self.worker, self.step
        self.since = None
        mine = [a[w.index] if a is not None else None for a in answers]
        if any(m is None for m in mine):  # the step stopped in another worker
            self.out = True
            return None
        for pending, data in zip(self.pendings, mine, strict=True):
            assert data is not None
            pending.resolve(unpack(data))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                w.collect(self.pendings, step)
                outcome = done(w, step, self.metrics)
            except Exception as e:
                outcome = failure(w, step, e)
                self.out = True
        outcome.notes = [*self.notes, *outcome.notes,
                         *((c.category.__name__, str(c.message)) for c in caught)]
        return self._keep(step, _as_data(outcome))

    def _keep(self, step: int, data: tuple[Any, ...]) -> tuple[Any, ...]:
        self.last = (step, data)
        return data

    def settle(self, step: int) -> tuple[Any, ...] | None:
        """After the graph broke: this worker's outcome of ``step``, when its servers had
        answered it (``adopt`` may not have run: the values come with the next pull)."""
        if self.last is not None and self.last[0] == step:
            return self.last[1]
        if self.step == step and self.since is not None:
            self.since = None
            return _as_data(done(self.worker, step, self.metrics))
        return None

    def overdue(self, timeout: float) -> tuple[int, str] | None:
        """When its push has waited ``timeout`` for the replies: the step, and the timeout's
        message as the worker's own wait would give it."""
        since, pendings = self.since, self.pendings
        if since is None or not pendings or time.monotonic() - since < timeout:
            return None
        step = self.step
        return step, str(pendings[0]._timeout(timeout, f"{self.worker.name} at step {step}"))


def park(event: threading.Event) -> None:
    """Wait (blocked, not spinning) until ``event`` is set, then clear it. Between parts of
    a run the actors' loops wait here: Ray's channels wait for a message by spinning, which
    would take the cores from everything else while the driver tests, saves or idles."""
    event.wait()
    event.clear()


def _as_data(outcome: Outcome) -> tuple[Any, ...]:
    outcome.cause = picklable(outcome.cause)
    return outcome.to_data()


# -- a server actor's side --------------------------------------------------------------------

class ServerStages:
    """What a server actor does in the compiled graph: take the updates of its group's
    workers (held), then hand them to the :class:`Server` at once and answer each.

    Args:
        server: the server.
        call: runs the handler under the actor's lock (as its ordinary requests are).
        nworkers: workers per group.
    """

    def __init__(self, server: Server, call: Callable[[Callable[[], None]], None],
                 nworkers: int):
        self.server = server
        self.call = call
        self.nworkers = nworkers
        self.held: dict[int, Update] = {}
        self.answered = -1  # the last step it answered in the graph
        self.parked = threading.Event()  # set: go on

    def gate(self, step: int) -> None:
        """The first stage of every step: :data:`PARK` waits until the next part."""
        if step == PARK:
            park(self.parked)

    def take(self, _: None, data: bytes | None) -> None:
        if data is not None:
            update = unpack(data)
            self.held[update.worker] = update

    def answer(self, *_: None) -> tuple[bytes | None, ...]:
        """The held updates, in worker order, to the server; each worker's packed reply
        (None: it sent nothing, or the step did not complete)."""
        held, self.held = self.held, {}
        replies: dict[int, bytes] = {}
        packed: dict[int, bytes] = {}  # the replies of one state are one object

        def reply_to(worker: int) -> Callable[[Reply], None]:
            def reply(answer: Reply) -> None:
                data = packed.get(id(answer))
                if data is None:
                    data = pack(answer, limit=None)
                    assert data is not None, type(answer).__name__
                    packed[id(answer)] = data
                replies[worker] = data
            return reply

        def hand() -> None:
            for worker, update in sorted(held.items()):
                self.server.handle(update, reply_to(worker))

        self.call(hand)
        if held and replies.keys() >= held.keys():
            self.answered = next(iter(held.values())).step
        return tuple(replies.get(i) for i in range(self.nworkers))

    def answer_one(self, _: None, data: bytes | None) -> tuple[bytes | None, ...]:
        """:meth:`take` and :meth:`answer` in one stage, for a group of one worker."""
        self.take(None, data)
        return self.answer()

    def begin(self) -> None:
        """Before a part: forget updates held by a graph that broke midway."""
        self.held = {}

    def waiting_for(self) -> str:
        held = dict(self.held)
        if not held:
            return self.server.waiting_for()
        group, step = self.server.group, next(iter(held.values())).step
        return self.server.waiting_for({group: (step, held.keys())})


# -- the driver's side ------------------------------------------------------------------------

class _QuietCancel(logging.Filter):
    """Ray logs, with its traceback, every actor it could not cancel while it tears a graph
    down — which it does itself when an actor of the graph died (the actor is gone, cannot
    be placed again, or its channel closed). The driver reports the dead actor in its own
    words; this drops those records only."""

    def filter(self, record: logging.LogRecord) -> bool:
        gone = record.exc_info is not None and isinstance(record.exc_info[1], RayError)
        return not (gone and record.getMessage().startswith("Error cancelling"))


logging.getLogger("ray.dag.compiled_dag_node").addFilter(_QuietCancel())


class _Pace:
    """When the driver reads the outcomes of the steps in flight. Ray's channels wait by
    spinning: the driver would spin for most of every step, taking a core from the actors,
    and waking for every step costs the actors a core as often. With the next steps already
    given to the workers it need not read at once: it reads them in batches of ``batch``
    steps, sleeping until most of a batch's time (as the last batches took; at most 0.2 s)
    has gone since the last batch was read, then reading its outcomes one after another.
    The batch is a quarter of the steps in flight: the workers have the rest to go on with
    even when the driver wakes late (a busy machine).

    A batch's time is measured only when its last outcome had to be waited for; one that
    was there before the driver looked says that it slept too long (the workers may have
    run out of steps meanwhile, and the time measured would be its own sleep): the time
    a step takes is then taken as half of what it was."""

    def __init__(self, batch: int) -> None:
        self.batch = max(1, batch)
        self.mark: float | None = None  # when the last batch was read
        self.step = 0.0  # seconds a step takes, smoothed
        self.count = 0  # outcomes read of this batch

    def wait(self) -> None:
        """Before the oldest outcome in flight is read (later steps are in flight too)."""
        if self.count == 0 and self.mark is not None:
            left = self.mark + 0.8 * self.batch * self.step - time.monotonic()
            if left > 0:
                time.sleep(min(left, 0.2))

    def arrived(self, waited: float) -> None:
        """An outcome was read, after ``waited`` seconds in Ray's wait for it."""
        self.count += 1
        if self.count < self.batch:
            return
        now = time.monotonic()
        if self.mark is not None:
            if waited < 0.1 * self.step:  # there before the driver looked: it slept too long
                self.step *= 0.5
            else:
                per = (now - self.mark) / self.batch
                self.step += 0.2 * (per - self.step) if self.step else per
        self.mark, self.count = now, 0


class CompiledSteps:
    """The compiled graph of a synchronous step over the live actors; see the module
    docstring.

    Args:
        workers: the live workers (``RemoteWorker``: ``group``, ``index``, ``rank``,
            ``name``, ``actor``).
        servers: the server actors (with something to hold) by address.
        names: every server's name.
        conf: the cluster configuration.
        message_bytes: the size of the largest message (a server's range of the values):
            the channels' first size (Ray grows one that a message outgrows).
        across_nodes: some actor is on another node than this process.
        dead: says how a worker actor died (``(worker, step, exception)`` → its outcome).
        lost: the servers lost since the graph was made (``[]``: none).
    """

    #: Steps in flight at once, all actors on this process's node: the inputs of the next
    #: steps wait in the graph while one runs, so that the workers never wait for this
    #: process (on a busy machine it may take the outcomes a few steps late). Ray keeps as
    #: many buffers per channel.
    depth = 8
    #: ... with actors on other nodes (Ray 2.60's channels between nodes hang with more
    #: than about three buffers in flight, seen on one host's nodes), or with messages of
    #: more than :attr:`small` bytes (every channel keeps ``depth`` buffers of a message's
    #: size; and a step that moves that much is long enough for the driver): two keep the
    #: driver off the critical path.
    depth_large = 2
    small = 1 << 20

    def __init__(self, workers: Sequence[Any], servers: Mapping[Address, Any],
                 names: Mapping[Address, str], conf: ClusterConf, message_bytes: int,
                 across_nodes: bool, dead: Callable[[Any, int, BaseException], Outcome],
                 lost: Callable[[], list[Address]]):
        from ray.dag import DAGContext

        self.workers = list(workers)
        self.servers = dict(servers)
        self.names = dict(names)
        self.conf = conf
        self._dead = dead
        self._lost = lost
        self.broken = False
        self.inflight = (self.depth_large if across_nodes or message_bytes > self.small
                         else self.depth)
        # The channels' first size (channel_bytes), for every channel that this process
        # makes: Ray takes it from its context, not from the compile's argument.
        context = DAGContext.get_current()
        default, context.buffer_size_bytes = context.buffer_size_bytes, channel_bytes(
            message_bytes)
        try:
            self._graph = self._compile(conf)
        finally:
            context.buffer_size_bytes = default
        self._waiting: tuple[int, float] | None = None  # the step awaited, since when
        self._stopping = False  # a failure was delivered: the run stops
        self._parked: list[Any] | None = None  # the refs of the parking step, until unparked
        try:  # the actors' loops start with the first execution: a step that does nothing
            for ref in self._graph.execute(-1):
                ref.get(timeout=max(60.0, conf.timeout))
            self._parked = self._graph.execute(PARK)  # until the first part
        except BaseException:
            self.teardown()
            raise

    def _compile(self, conf: ClusterConf) -> Any:
        """The graph of a step over the actors (see the module docstring), compiled."""
        from ray.dag import InputNode, MultiOutputNode

        nsg = conf.nserver_groups
        order = sorted(self.servers)  # by group, then index: the workers' layout order
        with InputNode() as step:
            pushes: dict[tuple[int, Address], Any] = {}
            for w in self.workers:
                mine = [a for a in order if a[0] == w.group % nsg]
                out = (w.actor.compute.options(num_returns=len(mine)).bind(step)
                       if len(mine) > 1 else (w.actor.compute.bind(step),))
                pushes.update(((w.rank, a), o) for a, o in zip(mine, out, strict=True))
            answers = {}
            for a in order:
                group = [w for w in self.workers if w.group % nsg == a[0]]
                h = self.servers[a]
                gate = h.gate.bind(step)
                if len(group) == 1:  # nothing to hold while the others' updates come
                    answers[a] = h.answer_one.bind(gate, pushes[(group[0].rank, a)])
                else:
                    answers[a] = h.answer.bind(*[h.take.bind(gate, pushes[(w.rank, a)])
                                                 for w in group])
            outputs = [w.actor.adopt.bind(*[answers[a] for a in order
                                            if a[0] == w.group % nsg])
                       for w in self.workers]
            graph = MultiOutputNode(outputs)
        # An input waits only for a buffer the workers have read (never more than `depth`
        # steps are in flight); -1 ("no limit") would not do: Ray 2.60 takes it for 0 when
        # a reader is on another node.
        return graph.experimental_compile(_max_inflight_executions=self.inflight,
                                          _submit_timeout=max(60.0, conf.timeout))

    # -- a part of a run ----------------------------------------------------------------------

    def run(self, ranks: Sequence[int], fn: Any, first: int, last: int, deliver: Deliver,
            fallback: Callable[[Sequence[int], Any, int, int, Deliver], None],
            halt: Pauses | None = None) -> None:
        """Steps ``[first, last)`` of workers ``ranks`` (in a thread of its own): every
        outcome to ``deliver``, then one ``ended`` per rank (a rank handed to ``fallback``,
        the ordinary path, ends there). At a step of ``halt.steps`` the graph drains, and
        the part ends there if ``halt`` says so: else the steps go on without a pause."""
        ended = set(ranks)
        try:
            last = self._run(ranks, fn, first, last, deliver, fallback, ended, halt)
            if not self.broken:
                self._parked = self._graph.execute(PARK)
        except Exception as e:  # a failure of this thread stops the run, said as it is
            self.broken = True
            deliver(Outcome(min(ranks), first, ERROR, cause=e, message=(
                f"the compiled steps {first} to {last - 1} failed: {type(e).__name__}: {e}")))
        finally:
            for rank in sorted(ended):
                deliver(Outcome(rank, last, ENDED))

    def _unpark(self) -> None:
        """Let the actors' loops go on from where the last part parked them."""
        if self._parked is None:
            return
        wait = max(60.0, self.conf.timeout)
        ray.get([a.unpark.remote() for a in [*(w.actor for w in self.workers),
                                             *self.servers.values()]], timeout=wait)
        for ref in self._parked:
            ref.get(timeout=wait)
        self._parked = None  # (kept until read: an unread one must outlive the graph)

    def _run(self, ranks: Sequence[int], fn: Any, first: int, last: int, deliver: Deliver,
             fallback: Callable[[Sequence[int], Any, int, int, Deliver], None],
             ended: set[int], halt: Pauses | None) -> int:
        """See :meth:`run`; the step where the part ended (``last``, or where ``halt`` said)."""
        live = set(ranks)
        at = dict.fromkeys(live, first)  # the next step of each rank
        # No limit here: a worker building its gradient function takes what it takes, and
        # the driver's own limit (no step for twice the timeout) holds.
        try:
            self._unpark()
            begun = ray.get([w.actor.begin.remote(first, fn, w.rank in live)
                             for w in self.workers])
        except (RayActorError, RayChannelError) as e:  # an actor died since the last part
            self.broken = True
            self._graph_teardown()
            self._parked = None
            self._broke(e, live, at, fn, last, deliver, fallback, ended, False)
            return last
        errors = [Outcome.from_data(d) for d in begun if d is not None]
        for outcome in errors:
            deliver(outcome)
        if errors:
            return last
        watch = threading.Event()
        self._stopping = False
        watchdog = threading.Thread(target=self._watch, args=(watch, live, deliver),
                                    daemon=True, name="paramserver-ray-watchdog")
        watchdog.start()
        inflight: deque[tuple[int, Any]] = deque()
        step = first
        pace = _Pace(self.inflight // 4)
        try:
            while inflight or (step < last and not self._stopping):
                while not self._stopping and step < last and len(inflight) < self.inflight:
                    if halt is not None and step in halt.steps:
                        # A pause: asked once the steps before it are done (and reported)
                        if inflight:
                            break
                        if halt(step):
                            last = step
                            break
                    inflight.append((step, self._graph.execute(step)))
                    step += 1
                if not inflight:
                    break  # ended at a pause
                s, refs = inflight.popleft()
                self._waiting = (s, time.monotonic())
                if inflight:  # the workers have steps to go on with: no hurry
                    pace.wait()
                t = time.monotonic()
                results = [ref.get(timeout=-1) for ref in refs]  # one per worker
                pace.arrived(time.monotonic() - t)
                self._waiting = None
                for data in results:
                    if data is None:
                        continue
                    outcome = Outcome.from_data(data)
                    at[outcome.rank] = outcome.step + 1
                    deliver(outcome)
                    if outcome.kind == LEFT:
                        live.discard(outcome.rank)
                    elif outcome.kind != DONE:
                        self._stopping = True  # the run stops: what is in flight drains
        except (RayActorError, RayChannelError, RaySystemError) as e:
            self._waiting = None
            self.broken = True
            self._graph_teardown()  # before the refs in flight go: theirs would raise
            inflight.clear()
            self._broke(e, live, at, fn, last, deliver, fallback, ended, self._stopping)
        finally:
            watch.set()
        return last

    def _watch(self, stop: threading.Event, live: set[int], deliver: Deliver) -> None:
        """Report the first worker whose wait for its replies exceeds the timeout, as its own
        wait would (the graph itself waits without a limit)."""
        timeout = self.conf.timeout
        while not stop.wait(min(1.0, timeout / 4)):
            waiting = self._waiting
            if waiting is None or time.monotonic() - waiting[1] < timeout:
                continue
            for w in self.workers:
                if w.rank not in live:
                    continue
                try:
                    late = ray.get(w.actor.overdue.remote(timeout), timeout=10.0)
                except Exception:  # the graph's own failure says more
                    continue
                if late is not None:
                    step, message = late
                    self._stopping = True
                    deliver(Outcome(w.rank, step, ERROR, message=message,
                                    cause=ClusterError(message)))
                    return

    def _broke(self, e: BaseException, live: set[int], at: dict[int, int], fn: Any,
               last: int, deliver: Deliver,
               fallback: Callable[[Sequence[int], Any, int, int, Deliver], None],
               ended: set[int], stopping: bool) -> None:
        """The graph is gone (an actor died): report the dead workers, and a lost server
        (also when no actor is found dead: the driver then brings the servers back to their
        checkpoint, which is always right); under ``continue`` the other workers go on,
        from where their servers are, on the ordinary path. Nothing more when the run was
        stopping anyway."""
        self.broken = True
        alive, died = [], False
        for w in self.workers:
            if w.rank not in live:
                continue
            try:
                ray.get(w.actor.ping.remote(), timeout=30.0)
                alive.append(w)
            except RayActorError as gone:
                deliver(self._dead(w, at[w.rank], gone))
                live.discard(w.rank)
                died = True
            except GetTimeoutError:
                alive.append(w)  # busy in its step: not dead
        if stopping:
            return
        lost = self._lost()
        answered = self._answered() if died and not lost else {}
        # A group whose servers disagree (one completed the step, another not) goes back
        # to the checkpoint, as after a lost server.
        torn = any(lo != hi for lo, hi in answered.values())
        if lost or torn or (not died and live):
            first = min(alive, key=lambda w: w.rank, default=None)
            rank = first.rank if first is not None else min(at)
            who = f"{first.name} at step {at[rank]}" if first is not None else "the driver"
            names = ", ".join(self.names[a] for a in lost) or "a server"
            deliver(Outcome(rank, at[rank], ERROR, server_lost=True, message=(
                f"{who} lost {names} while it waited for its reply to its update: its Ray "
                f"actor died ({type(e).__name__})")))
            return
        if self.conf.on_worker_failure != "continue":
            return  # the dead workers stop the run
        handed: dict[int, list[int]] = {}
        for w in alive:
            step = at[w.rank]
            if answered.get(w.group % self.conf.nserver_groups, (-1, -1))[0] >= step:
                try:  # its servers completed the step: its outcome, the values pulled later
                    data = ray.get(w.actor.settle.remote(step), timeout=30.0)
                except RayActorError as gone:
                    deliver(self._dead(w, step, gone))
                    continue
                if data is not None:
                    deliver(Outcome.from_data(data))
                    step += 1
            if step < last:
                handed.setdefault(step, []).append(w.rank)
        for step, ranks in sorted(handed.items()):
            ended.difference_update(ranks)
            fallback(ranks, fn, step, last, deliver)

    def _answered(self) -> dict[int, tuple[int, int]]:
        """Per server group, the lowest and highest step its servers answered in the graph."""
        out: dict[int, tuple[int, int]] = {}
        for a, h in self.servers.items():
            try:
                n = int(ray.get(h.answered.remote(), timeout=30.0))
            except Exception:  # no answer: as if it answered nothing
                n = -1
            lo, hi = out.get(a[0], (n, n))
            out[a[0]] = (min(lo, n), max(hi, n))
        return out

    def teardown(self) -> None:
        if not self.broken:
            try:
                self._unpark()  # a parked loop would not see the teardown
            except Exception:  # an actor is gone: nothing to wake
                pass
        self._graph_teardown()
        self._parked = None

    def _graph_teardown(self) -> None:
        try:
            self._graph.teardown()
        except Exception:  # an actor is gone: its loop went with it
            pass


__all__ = ["CompiledSteps", "Relay", "ServerStages", "WorkerStages", "channel_bytes",
           "compiled_reason", "prepare_channels"]
