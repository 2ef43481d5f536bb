"""A server: holds a range of the values and the updater state, applies updates (SPEC §7).

The server is a message handler and nothing else: :meth:`Server.handle` takes a request of
:mod:`paramserver.cluster.messages` and a ``reply`` callback, and calls it once — at once,
or later from the thread that completes the work (in the embedded cluster, the thread of
the worker whose update completes a step). It never waits for workers itself, so any
transport can drive it; the one wait it does is for the master's reply to a sync.

Consistency:
- *within a worker group* (BSP): an update of step ``t`` waits until every live worker of
  the group has sent its update of ``t``; their gradients are then summed in worker order
  (worker 0 + worker 1 + …, never by arrival), and the range updated once with
  ``grad_scale = 1 / (num_shares × contributions)`` per segment: the mean over workers and
  shares. One contribution is used where it lies: no sum, no copy.
- *between worker groups* (Downpour / Hogwild): each group's step is applied as it comes,
  under the server's lock, exactly once; the version goes up by one per applied step.
- *bounded staleness*: the server keeps every worker group's clock (steps completed);
  a :class:`Get` with ``clock = c`` is answered once every live group it serves is at ``c``.
- *server groups*: a server of a group other than 0 sends, every ``sync_freq`` of its
  updates (and when the driver flushes it at the end of a run), its change since the last
  sync to the same server of group 0 (the master), which adds it and answers with its
  values; the server then takes those values (SINGA's scheme, with the server locked
  meanwhile so no update is lost).
- *row-sparse tables* (SPEC §10): the segments of tables come after the dense ones; an
  update carries the dense part's gradients and, per table, ``(ids, rows)``. The rows of
  the step's workers are summed per id in worker order (sorted ids; fixed order, so a
  synchronous run is reproducible) and the table updated on those rows only
  (:meth:`Updater.apply_rows <paramserver.updaters.Updater.apply_rows>`, lazy state); a get
  of some rows answers with those rows, and a worker's get or update reply carries the
  dense part only.
- *sum or mean*: a cluster's server updates with the mean of its workers' gradients
  (``average``), a key-value store's with their sum (MXNet's KVStore).
- *compression*: a compressed update (:mod:`.compression`) is decoded as it arrives.
- *global-norm clipping* (the updater's ``clip_norm``): once every update of a step has
  come, the server answers each with :class:`Norm`, its range's part of the squared norm of
  the step's (summed, scaled) gradient, and holds the step; each worker adds the parts of
  all its servers, in server order, and sends every server the same norm in a :class:`Clip`;
  the step is applied once every live worker's clip has come, the gradient scaled by
  :func:`~paramserver.numerics.norm.clip_factor` of it. One reduction across the servers per
  step; the norm pass also checks the gradient for ``nonfinite: error`` (no second read).
  Tables' rows count in the norm as the dense part does (as ``update_params``).
- *non-finite gradients*: under ``nonfinite: error`` a step whose gradient (or the sum of its
  workers' gradients) holds a NaN or an Inf is refused before anything is written: the
  values and the updater state stay as they were, and every waiter of the step hears why.
  The check is fused into the fixed-order sum (several workers: free), or is a read-only pass
  over the one gradient inside the update's own kernel call.

Checkpoints of its own (for a backend whose servers can be lost and restarted):
:class:`Save` writes its values, updater state and versions to ``folder`` (atomically, no
pickle), :class:`Restore` serves from such a file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from ..config import ParamError
from ..config.job import ClusterConf
from ..updaters import Updater
from .compression import decode, decode_ids
from .errors import ClusterError
from .layout import ServerLayout
from .messages import (
    Ack,
    Address,
    Clip,
    ErrorReply,
    Flush,
    Get,
    GetState,
    Leave,
    Norm,
    Problems,
    Put,
    Reply,
    Request,
    Restore,
    Save,
    SetState,
    State,
    Sync,
    Update,
    Values,
)
from .passes import (
    kernel_guard,
    nonfinite_counts,
    nonfinite_text,
    sum_all,
    sum_rows,
    workers_check,
)
from .transport import Pending, ReplyFn

Send = Callable[[Address, Request, str], Pending]

SERVER_FORMAT = "paramserver-server-checkpoint/1"
#: Checkpoints kept per server (the newest ones).
KEEP = 2
#: Requests a stopped (aborted) server still answers: the driver's.
_CONTROL = (Put, GetState, SetState, Save, Restore)


#: One worker's rows of each table segment: ``(ids, rows)`` per table, in segment order.
TableRows = list[tuple[np.ndarray, np.ndarray]]
#: A step's gradients as a server uses them (:meth:`Server._gather`): the dense gradients
#: sent, their sum, whether all is finite, each table's summed rows, the scale per segment.
Gathered = tuple[list[np.ndarray], np.ndarray | None, bool, TableRows, np.ndarray]


@dataclass
class _Round:
    """The updates of one step of one worker group, until all have come."""

    step: int
    grads: dict[int, np.ndarray | None] = field(default_factory=dict)
    rows: dict[int, TableRows | None] = field(default_factory=dict)
    #: per worker, its dense segments that got no gradient (None: none)
    idle: dict[int, np.ndarray | None] = field(default_factory=dict)
    replies: list[ReplyFn] = field(default_factory=list)
    #: With ``clip_norm``, once every update came: the summed gradient (None: every push
    #: was dropped) and the workers' clips (their global norms), until every live one came.
    measured: bool = False
    gathered: Gathered | None = None
    norms: dict[int, float] = field(default_factory=dict)

    def senders(self) -> list[int]:
        """The workers whose gradients count (not dropped), in worker order."""
        return [w for w in sorted(self.grads)
                if self.grads[w] is not None or self.rows.get(w) is not None]


def failure_reply(name: str, request: Request, e: Exception) -> ErrorReply:
    """What the sender of ``request`` hears when handling it raised ``e``: a user-facing
    error as it is, anything else with the request and the exception's type named."""
    if isinstance(e, (ClusterError, ParamError)):
        return ErrorReply(f"{name}: {e}")
    return ErrorReply(f"{name}: {type(request).__name__} failed: {type(e).__name__}: {e}")


def server_name(index: int, group: int, nserver_groups: int) -> str:
    """How messages name a server: "server 1", or "server 1 of server group 2"."""
    return (f"server {index}" if nserver_groups == 1
            else f"server {index} of server group {group}")


class Server:
    """One server of one server group; see the module docstring.

    Args:
        layout: the range it holds (the same for this index in every server group).
        updater: the update method; its state for the range lives here.
        conf: the cluster configuration (groups, ``sync_freq``, ``timeout``, ``nonfinite``).
        group: the server group this server belongs to (0: the master group).
        folder: where :class:`Save` writes its checkpoints (None: it writes none).
        average: update with the mean of a step's gradients over its workers (a cluster);
            False: with their sum (a key-value store).

    Attributes:
        values: its range of the values (None until the first put).
        state: the updater's state for the range (:class:`~paramserver.state.UpdaterState`).
        versions: per slice, the number of updates applied to it.
    """

    def __init__(self, layout: ServerLayout, updater: Updater, conf: ClusterConf,
                 group: int = 0, folder: str | Path | None = None, average: bool = True):
        self.layout = layout
        self.average = average
        self.updater = updater
        self.conf = conf
        self.group = group
        self.folder = Path(folder) if folder is not None else None
        self.name = server_name(layout.index, group, conf.nserver_groups)
        #: The worker groups this server's group serves.
        self.worker_groups = [g for g in range(conf.nworker_groups)
                              if g % conf.nserver_groups == group]
        self.values: np.ndarray | None = None
        self.num_shares = np.ones(layout.num_segments, np.int64)
        self.state = updater.init_state(layout.offsets, layout.dtype)
        #: The values are bfloat16 roundings of a float32 master copy (and travel so).
        self._bfloat16 = updater.keeps_master
        if updater.keeps_master and conf.nserver_groups > 1:
            raise ParamError("updater.value_dtype bfloat16 keeps the float32 master copy on "
                             "the servers of one group: it needs cluster.nserver_groups 1, "
                             f"not {conf.nserver_groups}")
        self.versions = np.zeros(layout.num_slices, np.int64)
        self._lock = threading.Lock()
        self._live = self._everyone()
        self._clock = dict.fromkeys(self.worker_groups, 0)
        #: per (worker group, worker), the step of its last update since the last put
        self._pushed: dict[tuple[int, int], int] = {}
        self._rounds: dict[int, _Round] = {}
        self._gets: list[tuple[Get, ReplyFn]] = []
        self._accs: dict[int, np.ndarray] = {}  # per worker group: a sum may wait (clip)
        self._aborted: str | None = None
        self._send: Send | None = None
        self._last_sync: np.ndarray | None = None
        self._since_sync = 0
        #: A key server's group of keys that holds this piece's clocks while it updates
        #: them in one call (:class:`~.keygroup.KeyGroup`); None: the server holds its own.
        self.held_by: Any = None

    def _own(self) -> None:
        """Acquire the lock, with no group of keys holding this piece: a group that holds
        it gives its clocks back first (:meth:`~.keygroup.KeyGroup.release`), outside this
        lock (the group takes its own lock, then writes to its pieces)."""
        while True:
            self._lock.acquire()
            group = self.held_by
            if group is None:
                return
            self._lock.release()
            group.release()

    def _everyone(self) -> dict[int, set[int]]:
        return {g: set(range(self.conf.nworkers_per_group)) for g in self.worker_groups}

    def connect(self, send: Send) -> None:
        """How to reach the master server group (needed by servers of groups > 0)."""
        self._send = send

    @property
    def is_master(self) -> bool:
        return self.group == 0

    @property
    def _clips(self) -> bool:
        """Whether a step is clipped by the global norm (``clip_norm``; a cluster's servers,
        whose workers reduce it across them: a key-value store's clients do not)."""
        return self.average and self.updater.conf.clip_norm > 0

    # -- requests ---------------------------------------------------------------------------

    def handle(self, request: Request, reply: ReplyFn) -> None:
        """Handle one request; ``reply`` is called once, now or when the work is done."""
        out: list[tuple[ReplyFn, Reply]]
        self._own()
        try:
            if self._aborted is not None and not isinstance(request, _CONTROL):
                out = [(reply, ErrorReply(self._aborted))]
            else:
                try:
                    out = self._dispatch(request, reply)
                except Exception as e:  # the sender hears of it
                    out = [(reply, failure_reply(self.name, request, e))]
        finally:
            self._lock.release()
        for fn, answer in out:  # outside the lock: a reply may run the caller's code
            fn(answer)

    def _dispatch(self, request: Request, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        if isinstance(request, Update):
            return self._update(request, reply)
        if isinstance(request, Get):
            if request.lag is not None:  # the asker's own group's clock, less the lag
                self._check_worker(request.group, request.worker)
                clock = self._clock[request.group] - request.lag
                request = replace(request, clock=clock if clock > 0 else None, lag=None)
            self._gets.append((request, reply))
            return self._ready_gets()
        if isinstance(request, Clip):
            return self._clip(request, reply)
        if isinstance(request, Leave):
            return self._leave(request, reply)
        if isinstance(request, Sync):
            return [(reply, self._sync_in(request))]
        if isinstance(request, Put):
            return self._put(request, reply)
        if isinstance(request, Flush):
            if not self.is_master and self._send is not None and self.values is not None:
                self._sync_out(request.step)
            return [(reply, Ack())]
        if isinstance(request, GetState):
            return [(reply, State(self._state_arrays()))]
        if isinstance(request, SetState):
            return [(reply, self._set_state(request))]
        if isinstance(request, Save):
            self._save(request.step)
            return [(reply, Ack())]
        if isinstance(request, Restore):
            return self._restore(request.step, reply)
        raise ClusterError(f"unknown request {type(request).__name__}")

    def _put(self, msg: Put, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        size, nseg = self.layout.size, self.layout.num_segments
        shares = np.asarray(msg.num_shares, np.int64)
        values = msg.values if msg.values is not None else self.values
        if values is None:
            raise ClusterError("a put without values, and none held (a restarted server "
                               "needs its checkpoint restored)")
        if values.shape != (size,) or values.dtype != self.layout.dtype:
            raise ClusterError(f"put of {values.dtype} values of shape {values.shape}, "
                               f"expected {self.layout.dtype} of shape ({size},)")
        if shares.shape != (nseg,) or np.any(shares < 1):
            raise ClusterError(f"put with num_shares {shares}, expected {nseg} counts >= 1")
        failed = self._drop_waiters("the server was restarted by a put")
        if not values.flags.writeable:  # it arrived from another process: ours to update
            values = values.copy()
        self.values, self.num_shares = values, shares
        self.updater.adopt(values, self.state)  # value_dtype bfloat16: the master copy
        self._aborted = None
        self._live = self._everyone()
        self._clock = dict.fromkeys(self.worker_groups, int(msg.step))
        self._pushed = {}
        if not self.is_master:
            self._last_sync = values.copy()
            self._since_sync = 0
        return [*failed, (reply, Ack()), *self._ready_gets()]

    def _check_worker(self, group: int, worker: int) -> None:
        if group not in self._live:
            raise ClusterError(f"worker group {group} is not served here (server group "
                               f"{self.group} serves groups {self.worker_groups})")
        if worker not in self._live[group]:
            raise ClusterError(f"worker {worker} of group {group} is not a live worker here")

    def _update(self, msg: Update, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        self._check_worker(msg.group, msg.worker)
        if self.values is None:
            raise ClusterError("no values yet: the driver has not put them")
        rnd = self._rounds.get(msg.group)
        if rnd is not None and ((rnd.step != msg.step and msg.step >= 0)
                                or msg.worker in rnd.grads):
            what = ("a second update" if rnd.step == msg.step
                    else f"an update while step {rnd.step} is open")
            raise ClusterError(f"{what} of step {msg.step} from worker {msg.worker} of "
                               f"group {msg.group}")
        grads, rows = self._gradients(msg)  # checked (and decoded) before the round counts it
        step = msg.step if msg.step >= 0 else rnd.step if rnd is not None else self._clock[
            msg.group]  # a key-value client's push: its group's next
        rnd = self._rounds.setdefault(msg.group, _Round(step))
        self._pushed[msg.group, msg.worker] = step
        rnd.grads[msg.worker] = grads
        rnd.rows[msg.worker] = rows
        rnd.idle[msg.worker] = self._idle(msg)
        rnd.replies.append(reply)
        return self._complete(msg.group) if rnd.grads.keys() >= self._live[msg.group] else []

    def _idle(self, msg: Update) -> np.ndarray | None:
        """An update's idle flags, checked: one bool per dense segment."""
        if msg.idle is None:
            return None
        idle = np.asarray(msg.idle)
        nd = self.layout.num_dense
        if idle.dtype != np.bool_ or idle.shape != (nd,):
            raise ClusterError(f"idle flags {idle.dtype} of shape {idle.shape}, expected "
                               f"({nd},) bool: one per dense segment")
        return idle

    def _skip(self, rnd: _Round) -> np.ndarray | None:
        """The dense segments no pushed gradient of the step covers (they are not updated:
        no gradient, no update)."""
        given = [w for w in rnd.senders() if rnd.grads[w] is not None]
        flags = [f for w in given if (f := rnd.idle.get(w)) is not None]
        if not flags or len(flags) < len(given):
            return None
        skip = np.logical_and.reduce(flags)
        return skip if skip.any() else None

    def _gradients(self, msg: Update) -> tuple[np.ndarray | None, TableRows | None]:
        """An update's dense gradients and rows per table, decoded and checked."""
        L = self.layout
        dtype = L.dtype
        grads = msg.grads
        if grads is not None:
            grads = decode(grads, msg.codec, L.dense_size, dtype, msg.threshold) if (
                msg.codec or grads.shape == (L.dense_size,)) else grads
            if grads.shape != (L.dense_size,) or grads.dtype != dtype:
                raise ClusterError(f"gradients of shape {grads.shape} and dtype {grads.dtype}, "
                                   f"expected ({L.dense_size},) {np.dtype(dtype)}")
        if msg.ids is None:
            if msg.rows is not None:
                raise ClusterError("an update with rows but no row ids")
            if L.num_dense < L.num_segments and grads is not None:
                return grads, [(np.zeros(0, np.int64), np.zeros(0, dtype))
                               for _ in L.tables]
            return grads, None
        if L.num_dense == L.num_segments:
            raise ClusterError(f"an update with row ids, but {self.name} holds no table")
        ntab = len(L.tables)
        # the splits as Python ints: a few numbers, read without a NumPy call each
        splits = ([0, msg.count if msg.codec else len(msg.ids)] if msg.splits is None
                  else np.asarray(msg.splits, np.int64).reshape(-1).tolist())
        if len(splits) != ntab + 1 or splits[0] != 0 or splits != sorted(splits):
            raise ClusterError(f"row splits {splits} for {ntab} tables")
        count = int(splits[-1])
        if msg.codec:
            ids = decode_ids(msg.ids, count, splits)
        else:
            ids = np.asarray(msg.ids)
            if ids.dtype != np.int64 or ids.shape != (count,):
                raise ClusterError(f"row ids must be {count} int64, not {ids.size} {ids.dtype}")
        from ..numerics.rows import check_rows  # loads numba: only for tables

        dims = L.dims
        total = sum(int(dims[s]) * (splits[j + 1] - splits[j]) for j, s in enumerate(L.tables))
        if msg.rows is None:
            raise ClusterError("an update with row ids but no rows")
        values = decode(msg.rows, msg.codec, total, dtype, msg.threshold)
        out: TableRows = []
        at = 0
        for j, s in enumerate(L.tables):
            part = ids[splits[j]:splits[j + 1]]
            dim = int(dims[s])
            num_rows = int(L.offsets[s + 1] - L.offsets[s]) // dim
            try:
                part = check_rows(part, num_rows, f"the row ids of '{L.names[s]}'")
            except ParamError as e:
                raise ClusterError(str(e)) from None
            out.append((part, values[at:at + part.size * dim].reshape(part.size, dim)))
            at += part.size * dim
        return grads, out

    def _complete(self, group: int) -> list[tuple[ReplyFn, Reply]]:
        """Apply the open step of a worker group once, answer its updates and ready gets;
        with ``clip_norm``, first answer them with this server's part of the norm."""
        rnd = self._rounds[group]
        if self._clips and not rnd.measured:
            try:
                return self._measure(rnd, group)
            except Exception as e:
                del self._rounds[group]
                return [(fn, self._failed(e, rnd, group)) for fn in rnd.replies]
        del self._rounds[group]
        try:
            applied = self._apply(rnd, group)
            self._clock[group] = rnd.step + 1
            if (self._send is not None and not self.is_master
                    and self._since_sync >= self.conf.sync_freq):
                self._sync_out(rnd.step)
        except Exception as e:  # every waiter of the step must hear of it
            error = self._failed(e, rnd, group)
            return [(fn, error) for fn in rnd.replies]
        assert self.values is not None
        answer = Values(self._dense(), self.versions.copy(), applied, self._bfloat16)
        return [*((fn, answer) for fn in rnd.replies), *self._ready_gets()]

    def _dense(self) -> np.ndarray:
        """What a worker is sent of the values: the dense part (all, without tables)."""
        assert self.values is not None
        n = self.layout.dense_size
        return self.values if n == self.values.size else self.values[:n]

    def _failed(self, e: Exception, rnd: _Round, group: int) -> ErrorReply:
        return ErrorReply(f"{self.name}: {e}" if isinstance(e, ClusterError) else
                          f"{self.name}: update of step {rnd.step} of group {group} failed: "
                          f"{type(e).__name__}: {e}")

    def _measure(self, rnd: _Round, group: int) -> list[tuple[ReplyFn, Reply]]:
        """``clip_norm``: the step's summed gradient, kept, and this range's part of the
        squared norm as the answer to every update of the step (the step stays open for the
        clips). Under ``nonfinite: error`` a part that is not finite refuses the step: the
        norm pass has read every element, so the update need not read them again."""
        part = 0.0
        L = self.layout
        if rnd.senders() and self.values is not None and L.size > 0:
            gathered = self._gather(rnd, group)
            _, total, finite, tables, scale = gathered
            nd = L.num_dense
            with kernel_guard():
                if total is not None:
                    part += self.updater.grad_sum_squares(total, L.offsets[:nd + 1],
                                                          scale[:nd])
                for s, (_, rows) in zip(L.tables, tables, strict=True):
                    part += self.updater.grad_sum_squares(rows.reshape(-1), [0, rows.size],
                                                          scale[s])
            if (not finite or not np.isfinite(part)) and self.conf.nonfinite == "error":
                raise ClusterError(self._nonfinite_message(rnd, total, tables, group))
            rnd.gathered = gathered
        rnd.measured = True
        answer = Norm(float(part))
        replies, rnd.replies = rnd.replies, []
        return [(fn, answer) for fn in replies]

    def _clip(self, msg: Clip, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        self._check_worker(msg.group, msg.worker)
        rnd = self._rounds.get(msg.group)
        if rnd is None or not rnd.measured or rnd.step != msg.step or msg.worker in rnd.norms:
            raise ClusterError(f"a clip of step {msg.step} from worker {msg.worker} of group "
                               f"{msg.group} that no measured step of this server waits for")
        rnd.norms[msg.worker] = float(msg.norm)
        rnd.replies.append(reply)
        return self._complete(msg.group) if rnd.norms.keys() >= self._live[msg.group] else []

    def _total(self, grads: list[np.ndarray], group: int) -> tuple[np.ndarray, bool]:
        """The fixed-order sum ``((g0 + g1) + g2) + ...`` and whether it is finite (counted
        in the sum's own pass; one gradient alone is the total, checked by the update)."""
        if len(grads) == 1:
            return grads[0], True
        assert self.values is not None
        key = group if self._clips else 0  # one buffer, unless a sum waits for its clips
        total = self._accs.get(key)
        if total is None or total.shape != grads[0].shape:
            total = self._accs[key] = np.empty_like(grads[0])
        return total, sum_all(total, grads) == 0

    def _gather(self, rnd: _Round, group: int) -> Gathered:
        """A step's gradients: the dense part summed in worker order (and whether it is
        finite), each table's rows summed per id, and the scale per segment."""
        L = self.layout
        senders = rnd.senders()
        grads = [g for w in senders if (g := rnd.grads[w]) is not None]
        total, finite = self._total(grads, group) if grads and L.dense_size else (None, True)
        assert self.values is not None
        summed = [sum_rows([r[j] for w in senders if (r := rnd.rows.get(w)) is not None],
                           int(L.dims[s]), self.values.dtype)
                  for j, s in enumerate(L.tables)]
        tables = [(ids, rows) for ids, rows, _ in summed]
        finite = finite and all(ok for _, _, ok in summed)
        scale = 1.0 / (self.num_shares * (len(senders) if self.average else 1))
        return grads, total, finite, tables, scale

    def _apply(self, rnd: _Round, group: int) -> bool:
        senders = rnd.senders()
        if not senders or self.values is None or self.layout.size == 0:
            return False
        L = self.layout
        nd = L.num_dense
        norm: float | None = None
        if rnd.measured:  # clip_norm: gathered, measured and checked by _measure
            if rnd.gathered is None:
                return False
            grads, total, finite, tables, scale = rnd.gathered
            norms = set(rnd.norms.values())
            if len(norms) != 1:
                raise ClusterError(f"the workers of group {group} sent different norms for "
                                   f"step {rnd.step}: {sorted(norms)}")
            norm = norms.pop()
        else:
            grads, total, finite, tables, scale = self._gather(rnd, group)
        if not finite:  # refused before anything is written
            raise ClusterError(self._nonfinite_message(rnd, total, tables, group))
        if norm is None:
            factor = 1.0
        else:
            from ..numerics.norm import clip_factor  # numba: loaded on the first update

            factor = clip_factor(norm, self.updater.conf.clip_norm)
        if total is not None:
            # One gradient under 'error' is read first in the update's own kernel call,
            # which writes nothing when it holds NaN or Inf (unless its worker checked it:
            # passes.workers_check; with clip_norm the norm's pass did).
            refuse = (len(grads) == 1 and self.conf.nonfinite == "error" and not rnd.measured
                      and not workers_check(self.conf))
            state = self.state if nd == L.num_segments else self.state.segments(0, nd)
            with kernel_guard():
                nonfinite = self.updater.apply(rnd.step, self.values[:L.dense_size], total,
                                               state, L.lr_scale[:nd], L.wd_scale[:nd],
                                               scale[:nd], refuse_nonfinite=refuse,
                                               grad_norm=norm, skip=self._skip(rnd))
            if nonfinite and refuse:
                raise ClusterError(self._nonfinite_message(rnd, total, tables, group))
        for s, (ids, rows) in zip(L.tables, tables, strict=True):
            lo, hi = int(L.offsets[s]), int(L.offsets[s + 1])
            with kernel_guard():
                self.updater.apply_rows(rnd.step, self.values[lo:hi], ids, rows, int(L.dims[s]),
                                        self.state if L.num_segments == 1  # (no view to make)
                                        else self.state.segments(s, s + 1),
                                        L.lr_scale[s], L.wd_scale[s], scale[s] * factor)
        self.versions += 1
        self._since_sync += 1
        return True

    def _nonfinite_message(self, rnd: _Round, total: np.ndarray | None,
                           tables: list[tuple[np.ndarray, np.ndarray]], group: int) -> str:
        """Which Params and workers sent NaN or Inf (the slow account, on the error path)."""
        L = self.layout
        parts = [total[L.offsets[i]:L.offsets[i + 1]] if total is not None else None
                 for i in range(L.num_dense)] + [rows for _, rows in tables]
        params = []
        for name, part in zip(L.names, parts, strict=True):
            counts = nonfinite_text(part) if part is not None else ""
            if counts:
                params.append(f"'{name}' ({counts})")
        senders = rnd.senders()

        def bad(w: int) -> bool:
            g, rows = rnd.grads[w], rnd.rows.get(w) or []
            return (g is not None and sum(nonfinite_counts(g)) > 0) or any(
                sum(nonfinite_counts(r)) > 0 for _, r in rows)

        workers = [w for w in senders if bad(w)]
        what = (f"non-finite gradient at step {rnd.step} from workers {workers} of group "
                f"{group}: Params {', '.join(params)}" if workers else
                f"the sum of the finite gradients of workers {senders} of group {group} at "
                f"step {rnd.step} overflowed (float {np.finfo(L.dtype).bits}-bit): "
                f"Params {', '.join(params)}")
        return (f"{what}; this step's update is refused and the run stops (the values and "
                "the updater state are as they were before the step; "
                + ("cluster.nonfinite 'skip' drops such pushes instead)" if workers else
                   "lower the learning rate or scale the loss)"))

    def _leave(self, msg: Leave, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        self._check_worker(msg.group, msg.worker)
        self._live[msg.group].discard(msg.worker)
        rnd = self._rounds.get(msg.group)
        out: list[tuple[ReplyFn, Reply]] = [(reply, Ack())]
        live = self._live[msg.group]
        if rnd is not None and rnd.measured and not rnd.norms and not live:
            del self._rounds[msg.group]  # measured, then every worker left: nothing to apply
        elif rnd is not None and (rnd.norms.keys() >= live if rnd.measured
                                  else rnd.grads.keys() >= live):
            out += self._complete(msg.group)
        return [*out, *self._ready_gets()]

    # -- gets and clocks --------------------------------------------------------------------

    def _min_clock(self) -> int | None:
        """The clock of the slowest worker group with a live worker (None: none is left)."""
        clocks = [self._clock[g] for g in self.worker_groups if self._live[g]]
        return min(clocks) if clocks else None

    def _ready(self, get: Get) -> bool:
        if self.values is None or (len(self.versions) and self.versions.min() < get.version):
            return False
        if get.clock is None:
            return True
        slowest = self._min_clock()
        return slowest is None or slowest >= get.clock

    def _ready_gets(self) -> list[tuple[ReplyFn, Reply]]:
        if not self._gets:
            return []
        ready = [(g, fn) for g, fn in self._gets if self._ready(g)]
        if not ready:
            return []
        self._gets = [(g, fn) for g, fn in self._gets if not self._ready(g)]
        assert self.values is not None
        versions = self.versions.copy()
        answers: dict[bool, Values] = {}
        out: list[tuple[ReplyFn, Reply]] = []
        for get, fn in ready:
            if get.ids is not None:
                out.append((fn, self._rows_answer(get, versions)))
            else:
                answer = answers.get(get.whole)
                if answer is None:
                    answer = answers[get.whole] = Values(
                        self.values if get.whole else self._dense(), versions,
                        bfloat16=self._bfloat16)
                out.append((fn, answer))
        return out

    def _rows_answer(self, get: Get, versions: np.ndarray) -> Reply:
        """Rows ``get.ids`` of table segment ``get.segment`` (a copy), or why not."""
        assert self.values is not None and get.ids is not None
        L = self.layout
        s = get.segment
        if s not in L.tables:
            return ErrorReply(f"{self.name}: a get of rows of segment {s}, which is not a "
                              f"table (its tables: {list(L.tables)})")
        dim = int(L.dims[s])
        table = self.values[int(L.offsets[s]):int(L.offsets[s + 1])].reshape(-1, dim)
        ids = np.asarray(get.ids)
        if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0
                                           or ids.max() >= len(table))):
            return ErrorReply(f"{self.name}: row ids of '{L.names[s]}' must be integers in "
                              f"[0, {len(table)})")
        return Values(table[ids].reshape(-1), versions)

    # -- server groups ----------------------------------------------------------------------

    def _sync_out(self, step: int) -> None:
        """Send the change since the last sync to the master; take its values."""
        assert self._send is not None and self.values is not None
        assert self._last_sync is not None
        delta = self.values - self._last_sync
        master = (0, self.layout.index)
        pending = self._send(master, Sync(self.group, delta),
                             f"the reply of server {self.layout.index} of server group 0 "
                             "to a sync")
        reply = pending.wait(self.conf.timeout, f"{self.name} at step {step}")
        assert isinstance(reply, Values)
        # The server is locked since the delta was taken: no update of its own came in
        # between, so SINGA's ``values += master - last_sync`` is exactly the master's.
        np.copyto(self.values, reply.values)
        np.copyto(self._last_sync, reply.values)
        self._since_sync = 0

    def _sync_in(self, msg: Sync) -> Reply:
        if not self.is_master:
            raise ClusterError("a sync request reached a server outside the master group")
        if self.values is None:
            raise ClusterError("a sync request came before the values were put")
        if msg.delta.shape != self.values.shape or msg.delta.dtype != self.values.dtype:
            raise ClusterError(f"sync delta of shape {msg.delta.shape}, expected "
                               f"{self.values.shape}")
        np.add(self.values, msg.delta, out=self.values)
        return Values(self.values.copy(), self.versions.copy())

    # -- a key-value store's -----------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether it holds values and answers requests (not stopped)."""
        return self.values is not None and self._aborted is None

    def takes_summed(self, group: int, table: bool = False) -> bool:
        """Whether a step of ``group`` may be given already summed (:meth:`apply_summed`):
        a piece of one segment, dense (or a table's, ``table``), serving, no step of the
        group open, no get waiting, no global-norm clipping, no master copy and no server
        group to sync with. (Read without the lock: the key server that asks holds every
        request to this piece, and asks only when none is on its way to it.)"""
        L = self.layout
        return (self.values is not None and self._aborted is None and not self._gets
                and group not in self._rounds and L.num_segments == 1
                and bool(L.tables) == table and not self._clips and not self._bfloat16
                and self._send is None and not self.average and group in self._live)

    def join(self, group: Any, updater: Updater) -> bool:
        """Be held by a group of keys (:class:`~.keygroup.KeyGroup`), which then updates
        this piece with the others in one call and keeps the clocks of all: only when no
        step is open and nothing waits, with ``updater``, as a plain dense piece of a
        key-value store (as :meth:`takes_summed`, for every worker group). False: not
        held."""
        self._own()
        try:
            L = self.layout
            if (self.values is None or self._aborted is not None or self._gets
                    or self._rounds or L.num_segments != 1 or L.tables or self._clips
                    or self._bfloat16 or self._send is not None or self.average
                    or self.updater is not updater or int(self.num_shares[0]) != 1):
                return False
            self.held_by = group
            return True
        finally:
            self._lock.release()

    @property
    def clocks(self) -> dict[int, int]:
        """Per worker group, the steps it completed here (a copy)."""
        return dict(self._clock)

    def leave_group(self, clocks: dict[int, int], steps: int) -> None:
        """Take back the clocks a group of keys kept (it applied ``steps`` steps); called
        by the group, which holds this piece (nothing else runs here meanwhile)."""
        self._clock = dict(clocks)
        self._since_sync += steps
        self.held_by = None

    def apply_summed(self, group: int, total: np.ndarray,
                     ids: np.ndarray | None = None) -> list[tuple[ReplyFn, Reply]]:
        """Apply a step of ``group`` whose pushes a key server summed (in worker order, and
        found finite) across a batch of keys: what :meth:`_apply` does with that sum, the
        update counted as one step of the group. ``ids``: a table piece's step, ``total``
        the summed rows of those ids (strictly increasing, in the piece: checked by the
        key server). Returns the replies of gets it readied."""
        self._own()
        try:
            assert self.values is not None
            L = self.layout
            step = self._clock[group]
            if ids is not None:
                dim = int(L.dims[0])
                if total.shape != (ids.size, dim) or total.dtype != self.values.dtype:
                    raise ClusterError(f"rows of shape {total.shape} and dtype {total.dtype}, "
                                       f"expected ({ids.size}, {dim}) {self.values.dtype}")
                with kernel_guard():
                    self.updater.apply_rows(step, self.values, ids, total, dim, self.state,
                                            L.lr_scale[0], L.wd_scale[0],
                                            1.0 / float(self.num_shares[0]))
            elif total.shape != self.values.shape or total.dtype != self.values.dtype:
                raise ClusterError(f"gradients of shape {total.shape} and dtype "
                                   f"{total.dtype}, expected {self.values.shape} "
                                   f"{self.values.dtype}")
            else:
                with kernel_guard():
                    self.updater.apply(step, self.values, total, self.state, L.lr_scale,
                                       L.wd_scale, 1.0 / self.num_shares)
            self.versions += 1
            self._since_sync += 1
            self._clock[group] = step + 1
            return self._ready_gets()
        finally:
            self._lock.release()

    def set_updater(self, updater: Updater) -> None:
        """Update with ``updater`` from now on, its state starting from zero."""
        self._own()
        try:
            self.updater = updater
            self.state = updater.init_state(self.layout.offsets, self.layout.dtype)
        finally:
            self._lock.release()

    def revive(self) -> list[tuple[ReplyFn, Reply]]:
        """Every worker is live again and requests are served (a new run of a key-value
        store); the waiting requests of the last run hear why they were dropped (the
        replies to send), the clocks stay."""
        self._own()
        try:
            out = self._drop_waiters("a new run began")
            self._aborted = None
            self._live = self._everyone()
        finally:
            self._lock.release()
        return out

    # -- stopping and diagnosis -------------------------------------------------------------

    def reached(self, group: int, worker: int) -> int | None:
        """The step that worker ``worker`` of worker group ``group`` was in, as far as this
        server can tell: that of its last update since the values were put, or the next
        once that step was applied (and answered); None when no update came. (Where a
        worker's outcomes reach the driver in batches, the step a dead worker died in.)"""
        with self._lock:
            last = self._pushed.get((group, worker))
            if last is None or self._clock.get(group, 0) <= last:
                return last
            return last + 1  # its step was applied: it went on to the next

    def _drop_waiters(self, reason: str, lost: bool = False) -> list[tuple[ReplyFn, Reply]]:
        error = ErrorReply(reason, lost)
        out: list[tuple[ReplyFn, Reply]] = [
            (fn, error) for rnd in self._rounds.values() for fn in rnd.replies]
        out += [(fn, error) for _, fn in self._gets]
        self._rounds.clear()
        self._gets = []
        return out

    def abort(self, reason: str, lost: bool = False) -> None:
        """Answer every waiting and later request with ``reason``, until the next put
        (``lost``: as a server that was lost)."""
        self._own()
        try:
            self._aborted = reason
            out = self._drop_waiters(reason, lost)
        finally:
            self._lock.release()
        for fn, answer in out:
            fn(answer)

    def waiting_for(self, held: Mapping[int, tuple[int, Collection[int]]] | None = None
                    ) -> str:
        """What this server is waiting for, in words (for timeout messages).

        Args:
            held: updates its transport holds for it, not handed yet (Ray's compiled steps
                hand a step's updates at once): per worker group, the step and the workers
                whose updates came; they count as a round of that step.
        """
        if not self._lock.acquire(timeout=1.0):
            return f"{self.name} is busy (an update or sync holds it)"
        try:
            if self.values is None:
                return f"{self.name} has no values yet (no put)"
            rounds: dict[int, tuple[int, str, Collection[int]]] = {
                g: (rnd.step, "clips (the global norm)" if rnd.measured else "updates",
                    (rnd.norms if rnd.measured else rnd.grads).keys())
                for g, rnd in self._rounds.items()}
            for g, (step, workers) in (held or {}).items():
                rounds.setdefault(g, (step, "updates", workers))
            parts = []
            for g, (step, what, came) in sorted(rounds.items()):
                missing = sorted(self._live[g] - set(came))
                parts.append(f"{self.name} waits for {what} from workers {missing} of group "
                             f"{g} for step {step}")
            if self._gets:
                slowest = self._min_clock()
                slow = [g for g in self.worker_groups if self._live[g]
                        and self._clock[g] == slowest]
                parts.append(f"{self.name} is at version {self.version}, its slowest worker "
                             f"groups {slow} have finished {slowest} steps")
            return "; ".join(parts) or f"{self.name} is at version {self.version}, not waiting"
        finally:
            self._lock.release()

    @property
    def version(self) -> int:
        """The number of updates applied (the smallest slice version)."""
        return int(self.versions.min()) if len(self.versions) else 0

    # -- state and checkpoints --------------------------------------------------------------

    def _state_arrays(self) -> dict[str, np.ndarray]:
        out = {"versions": self.versions.copy(),
               **{f"state/{k}": v for k, v in self.state.export(self.layout.names).items()}}
        if self.values is not None:
            out["values"] = self.values.copy()
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Values, slice versions and updater state (``state/<param>/<role>``), as copies."""
        self._own()
        try:
            return self._state_arrays()
        finally:
            self._lock.release()

    def check_state(self, state: dict[str, np.ndarray], prefix: str = "") -> list[str]:
        """The problems :meth:`load_state_dict` would refuse ``state`` for (keys shown with
        ``prefix``)."""
        want: dict[str, tuple[tuple[int, ...], Any]] = {"versions": (self.versions.shape,
                                                                     np.int64)}
        if self.values is not None:
            want["values"] = (self.values.shape, self.values.dtype)
        problems = [f"'{prefix}{k}' is missing" for k in want if k not in state]
        problems += [f"'{prefix}{k}' is not state of {self.name}" for k in state
                     if k not in want and not k.startswith("state/")]
        for k, (shape, dtype) in want.items():
            if k in state:
                arr = np.asarray(state[k])
                if arr.shape != shape or arr.dtype != np.dtype(dtype):
                    problems.append(f"'{prefix}{k}' is {arr.dtype} of shape {arr.shape}, "
                                    f"expected {np.dtype(dtype)} of shape {shape}")
                elif k == "versions" and arr.size and int(arr.min()) < 0:
                    problems.append(f"'{prefix}{k}' holds {int(arr.min())}: a version "
                                    "(updates applied) is >= 0")
        updater = {f"{prefix}{k}": v for k, v in state.items() if k.startswith("state/")}
        return problems + self.state.problems(updater, self.layout.names, f"{prefix}state/")

    def _set_state(self, msg: SetState) -> Problems:
        problems = self.check_state(msg.arrays, msg.prefix)
        if not problems and not msg.check_only:
            self._load(msg.arrays)
        return Problems(problems)

    def _load(self, state: dict[str, np.ndarray]) -> None:
        np.copyto(self.versions, state["versions"])
        self.state.load({k: v for k, v in state.items() if k.startswith("state/")},
                        self.layout.names, "state/")
        if self.values is not None:
            np.copyto(self.values, state["values"])
            if self._last_sync is not None:
                np.copyto(self._last_sync, state["values"])

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`'s output (checked whole before anything changes)."""
        self._own()
        try:
            problems = self.check_state(state)
            if problems:
                raise ParamError(problems)
            self._load(state)
        finally:
            self._lock.release()

    def _checkpoint_path(self, step: int) -> Path:
        if self.folder is None:
            raise ClusterError("it has no checkpoint folder")
        return self.folder / checkpoint_name(int(step))

    def _save(self, step: int) -> None:
        meta = {"format": SERVER_FORMAT, "address": [self.group, self.layout.index],
                "step": int(step), "start": self.layout.start, "stop": self.layout.stop,
                "num_shares": self.num_shares.tolist()}
        save_checkpoint(self._checkpoint_path(step), self._state_arrays(), meta)
        assert self.folder is not None
        for _, old in list_checkpoints(self.folder)[:-KEEP]:
            old.unlink(missing_ok=True)

    def _restore(self, step: int, reply: ReplyFn) -> list[tuple[ReplyFn, Reply]]:
        path = self._checkpoint_path(step)
        arrays, meta = load_checkpoint(path)
        L = self.layout
        if (meta.get("format") != SERVER_FORMAT
                or meta.get("address") != [self.group, L.index]
                or (meta.get("start"), meta.get("stop")) != (L.start, L.stop)):
            raise CheckpointError(f"{path}: not a checkpoint of {self.name}")
        values = np.array(arrays["values"], copy=True)
        if self.values is not None:  # keep serving the memory workers may view
            np.copyto(self.values, values)
            values = self.values
        out = self._put(Put(values, np.asarray(meta["num_shares"], np.int64), int(step)),
                        reply)
        problems = self.check_state(arrays)
        if problems:
            raise CheckpointError([f"{path}: {p}" for p in problems])
        self._load(arrays)
        return out

    def __repr__(self) -> str:
        return f"Server({self.name}, {self.layout!r}, version={self.version})"


__all__ = ["KEEP", "SERVER_FORMAT", "Server", "server_name"]
