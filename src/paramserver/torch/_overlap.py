"""Overlapped offload steps: a bucket's host update starts during backward.

With ``placement="offload"`` the host update of every parameter normally starts in
``step()``, after the backward pass. ``overlap=True`` (or an :class:`Overlap`) starts it
earlier, without changing the arithmetic:

- the owners are cut into *buckets* of about ``bucket`` values, in reverse registration order
  (about the layers' order reversed, the order backward finishes them), each within one run
  of equal settings;
- as soon as every gradient of a bucket has landed in the host buffer (the offload binding's
  post-accumulate-grad hook copied it), the bucket's update is started on a host worker
  thread (the numba kernels release the GIL) with the step number, learning rates, decays and
  gradient scales ``step()`` would use, and its values are published back to the parameters
  while later buckets are still updating;
- ``step()`` waits for what was started, *commits* a bucket only if nothing it used changed
  (below), and updates the rest as the serial step does (buckets with a parameter whose
  gradient never came, a sparse one, a partly frozen share group, ...).

An early update must never differ silently from the serial one. Before a bucket's update,
its master values and updater state are saved (a host copy as large as the master and the
state, made once); a bucket is *rolled back* -- values and state restored and published
again -- and updated by ``step()`` when, between its start and ``step()``:

- one of its gradients changed (a new tensor, or its version counter moved: clipping by
  ``clip_grad_norm_``, ``GradScaler.unscale_``, an edit by hand) or became None;
- the step's settings for it changed (a group's ``lr`` or ``weight_decay`` written after
  backward, another setting, ``clip_norm`` turned on).

A parameter written between backward and ``step()`` (``load_state_dict``, an in-place op
under ``no_grad``) after its bucket started may have read, or been overwritten by, the
published early update: ``step()`` then raises, with everything rolled back and the write
undone (the gradients kept, so that ``step()`` may be called again). Writes before the forward
pass or after ``step()`` are taken as without overlap.

``zero_grad()`` (a step skipped, as ``GradScaler`` skips one on an inf), ``state_dict()``,
``load_state_dict()``, checkpoints and new param groups roll back whatever was started:
nothing is kept that ``step()`` did not commit.

What cannot be undone is a forward pass that already computed with early-updated values.
Hence gradient accumulation is a contract: ``Overlap(accumulate=k)`` says that ``step()``
follows every ``k``-th backward pass (the default 1); the early updates run only in the
``k``-th pass since the last step. A further backward pass before ``step()`` after early
updates started is an error (raised from that ``backward()``, with everything rolled back).
A pass begins where a gradient lands that already landed since the last step (a gradient
lands once per pass), so a reentrant activation checkpoint's inner backward is no pass of its
own; a parameter used both inside such a segment and outside it lands twice in one pass and
is taken for a new pass (use ``use_reentrant=False``, torch's recommended form).

``clip_norm`` in the updater needs every gradient before any update: with it, only the
gradient copies overlap the backward pass (as without ``overlap``), and the update runs in
``step()``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..cluster.passes import kernel_guard
from ..config import ParamError
from ..state import UpdaterState

if TYPE_CHECKING:
    from ..updaters import Updater
    from ._offload import OffloadParams

#: Values per bucket by default (a bucket is at least one parameter).
BUCKET = 1 << 22


@dataclass(frozen=True)
class Overlap:
    """How an offloaded step overlaps the backward pass (see :mod:`._overlap`).

    Args:
        bucket: values per bucket (at least one parameter each): smaller buckets start
            sooner, larger ones cost fewer kernel calls.
        accumulate: backward passes per ``step()`` (gradient accumulation); the early
            updates run in the last of them.
    """

    bucket: int = BUCKET
    accumulate: int = 1

    def __post_init__(self) -> None:
        problems = []
        for name in ("bucket", "accumulate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                problems.append(f"Overlap.{name} is {v!r}: it must be an integer >= 1")
        if problems:
            raise ParamError(problems)


OverlapLike = bool | Overlap | None


def overlap_conf(overlap: Any, placement: str) -> Overlap | None:
    """The :class:`Overlap` asked for (``True``: the defaults), or None; refused with a
    placement other than ``"offload"``."""
    if overlap is None or overlap is False:
        return None
    if overlap is True:
        overlap = Overlap()
    if not isinstance(overlap, Overlap):
        raise ParamError(f"overlap must be True, False or a paramserver.torch.Overlap, not "
                         f"{overlap!r}")
    if placement != "offload":
        raise ParamError(f"overlap=... applies to placement='offload' (the host update "
                         f"overlapping the backward pass), not placement={placement!r}")
    return overlap


@dataclass
class _Bucket:
    """Owners ``a:b`` (one run of equal settings) and the tensors whose gradients they need."""

    index: int
    a: int
    b: int
    updater: Updater
    needed: list[int]
    waiting: int = 0
    spoiled: bool = False  # a sparse gradient: left to step()
    saved: bool = False  # its values and state are in the backup (it may have changed them)
    future: Future[None] | None = None
    seen: dict[int, tuple[Any, int]] = field(default_factory=dict)


@dataclass
class _Armed:
    """What the early updates of one backward pass use: ``step()``'s numbers."""

    step: int
    lr_scale: np.ndarray
    wd: np.ndarray
    gscale: np.ndarray
    skip: np.ndarray
    buckets: list[_Bucket]
    bucket_of: dict[int, _Bucket]


class Overlapper:
    """The early updates of one optimizer's offload binding (see the module docstring)."""

    def __init__(self, opt: Any, tp: OffloadParams, conf: Overlap):
        self._opt = weakref.ref(opt)
        self.tp = tp
        self.conf = conf
        pset = tp.pset
        self._sharers: list[list[Any]] = [[] for _ in pset.owners]
        for p in pset.params:
            if p.owner is not None:
                self._sharers[pset.owner_index(p.name)].append(p)
        self._backup_values = np.empty_like(pset.values)
        self._backup_state: UpdaterState | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="paramserver-overlap")
        #: ``(event, bucket index)`` as they happen, when a list (the tests read it):
        #: ``("land", tensor index)``, ``("start", bucket)``, ``("done", bucket)``,
        #: ``("commit", bucket)``, ``("rollback", bucket)``, ``("pass", number)``
        self.trace: list[tuple[str, int]] | None = None
        self._hooks = [t.register_post_accumulate_grad_hook(self._on_landed)
                       for t in tp.tensors if t.requires_grad]
        self._reset()

    def _reset(self) -> None:
        self._passes = 0  # backward passes begun since the last step
        self._landed: set[int] = set()  # the tensors whose gradients landed in this pass
        self._armed: _Armed | None = None
        self._started: list[_Bucket] = []

    def _log(self, what: str, n: int) -> None:
        if self.trace is not None:
            self.trace.append((what, n))

    # -- during backward --------------------------------------------------------------------

    def _on_landed(self, t: torch.Tensor) -> None:
        """A gradient is in the host buffer (the binding's hook ran first): start its bucket
        if it was the last one the bucket waited for."""
        i = self.tp._index[id(t)]
        if self._passes == 0 or i in self._landed:
            # A gradient lands once per backward pass: again, it is the next pass. (Not an
            # end-of-pass callback: a reentrant checkpoint's inner backward would end it.)
            self._begin_pass()
        self._landed.add(i)
        self._log("land", i)
        armed = self._armed
        if armed is None:
            return
        bucket = armed.bucket_of.get(i)
        if bucket is None or bucket.future is not None or bucket.spoiled:
            return
        g = t.grad
        seen = self.tp._copied[i]
        if g is None or g.is_sparse or seen is None:
            bucket.spoiled = True
            return
        bucket.seen[i] = seen
        bucket.waiting -= 1
        if bucket.waiting == 0:
            self._start(armed, bucket)

    def _begin_pass(self) -> None:
        if self._started:
            self.cancel(check=False)
            raise ParamError(
                f"a backward pass after early updates started (overlap: "
                f"Overlap(accumulate={self.conf.accumulate}) says step() follows every "
                f"{self.conf.accumulate} backward pass(es)); that forward pass used values "
                "already updated. Everything was rolled back: give Overlap(accumulate=...) "
                "the number of backward passes per step, or call step() or zero_grad() first")
        self._passes += 1
        self._landed = set()
        self._armed = None
        self._log("pass", self._passes)
        if self._passes == self.conf.accumulate:
            self._armed = self._arm()

    def _arm(self) -> _Armed | None:
        """The buckets and ``step()``'s numbers for them, or None where nothing may start."""
        opt = self._opt()
        tp = self.tp
        if opt is None or opt.params is not tp:
            return None
        try:
            tp.check()
            lr_scale, wd, sign = opt._sync_groups()
            opt._plan()
        except ParamError:
            return None  # step() says what is wrong
        if any(run.updater.conf.clip_norm > 0 for run in opt._runs):
            return None  # the global norm needs every gradient: only the copies overlap
        state = opt._state
        if (self._backup_state is None or self._backup_state.names != state.names):
            self._backup_state = UpdaterState(state.roles, state.offsets, state.dtype)
        n = len(tp.pset.owners)
        skip = np.zeros(n, bool)
        eligible = np.zeros(n, bool)
        for k, share in enumerate(opt._share_group):
            grads = [tp.tensors[i].requires_grad for i in share]
            unwritten = all(tp.tensors[i]._version == tp._versions[i] for i in share)
            eligible[k] = unwritten and (all(grads) or not any(grads))
            skip[k] = not any(grads)
        offsets = tp.pset.offsets
        buckets: list[_Bucket] = []
        for run in reversed(opt._runs):
            k = run.b
            while k > run.a:
                if not eligible[k - 1]:
                    k -= 1
                    continue
                j = k - 1
                while (j > run.a and eligible[j - 1]
                       and offsets[k] - offsets[j] < self.conf.bucket):
                    j -= 1
                needed = [i for o in range(j, k) for i in opt._share_group[o] if not skip[o]]
                if needed:
                    buckets.append(_Bucket(len(buckets), j, k, run.updater, needed,
                                           waiting=len(needed)))
                k = j
        bucket_of = {i: b for b in buckets for i in b.needed}
        return _Armed(opt.step_count, lr_scale, wd, opt._grad_scale * sign, skip, buckets,
                      bucket_of)

    def _start(self, armed: _Armed, bucket: _Bucket) -> None:
        event = None
        if self.tp.cuda:  # the worker waits for the gradient copies on the side stream
            event = torch.cuda.Event()
            event.record(self.tp._d2h)
        self._log("start", bucket.index)
        bucket.future = self._pool.submit(self._update, armed, bucket, event)
        self._started.append(bucket)

    def _update(self, armed: _Armed, bucket: _Bucket, event: Any) -> None:
        """On the worker: save, update and publish owners ``a:b`` (``step()``'s kernel call
        on them, with the sharers' gradients summed in as ``owner_grads`` sums them)."""
        if event is not None:
            event.synchronize()
        tp, a, b = self.tp, bucket.a, bucket.b
        pset = tp.pset
        lo, hi = int(pset.offsets[a]), int(pset.offsets[b])
        opt = self._opt()
        assert opt is not None and self._backup_state is not None
        state = opt._state.segments(a, b)
        _copy(self._backup_values[lo:hi], pset.values[lo:hi])
        self._backup_state.segments(a, b).copy_from(state, _copy)
        bucket.saved = True
        grads = pset.grads[lo:hi]
        sharers = [p for k in range(a, b) for p in self._sharers[k]]
        if sharers:
            grads = grads.copy()
            for p in pset._sharers:  # declaration order, as ParamSet.sum_shared_grads
                if p in sharers:
                    k = pset.owner_index(p.name)
                    o = int(pset.offsets[k]) - lo
                    grads[o:o + p.size] += p.grad.reshape(-1)
        skip = armed.skip[a:b]
        with kernel_guard():  # numba's workqueue layer: one parallel launch at a time
            bucket.updater.apply(armed.step, pset.values[lo:hi], grads, state,
                                 armed.lr_scale[a:b], armed.wd[a:b], armed.gscale[a:b],
                                 grad_norm=None, skip=skip if skip.any() else None)
        tp._publish(k for k in range(a, b) if not armed.skip[k])
        self._log("done", bucket.index)

    # -- at step() and elsewhere ------------------------------------------------------------

    def _join(self) -> BaseException | None:
        error = None
        for bucket in self._started:
            assert bucket.future is not None
            e = bucket.future.exception()
            if e is not None and error is None:
                error = e
        return error

    def settle(self) -> np.ndarray | None:
        """At ``step()``, before it reads the gradients: wait for the started buckets, keep
        those whose inputs are as they were, roll back the others. Returns, per owner,
        whether it is updated already (None: none is)."""
        started, armed = self._started, self._armed
        error = self._join()
        if error is not None:
            self.cancel(check=False)
            raise error
        if not started or armed is None:
            self._reset()
            return None
        opt = self._opt()
        assert opt is not None
        tp = self.tp
        try:
            tp.check()
            lr_scale, wd, sign = opt._sync_groups()
            opt._plan()
        except ParamError:
            self.cancel(check=False)
            raise
        self._refuse_writes(opt)
        clip = any(run.updater.conf.clip_norm > 0 for run in opt._runs)
        gscale = opt._grad_scale * sign
        done = np.zeros(len(tp.pset.owners), bool)
        undo = []
        for bucket in started:
            a, b = bucket.a, bucket.b
            same = (not clip and opt.step_count == armed.step
                    and np.array_equal(lr_scale[a:b], armed.lr_scale[a:b])
                    and np.array_equal(wd[a:b], armed.wd[a:b])
                    and np.array_equal(gscale[a:b], armed.gscale[a:b])
                    and all(opt._owner_updaters[k] is bucket.updater for k in range(a, b))
                    and self._unchanged(opt, armed, bucket))
            if same:
                done[a:b] = True
                self._log("commit", bucket.index)
            else:
                undo.append(bucket)
        self._rollback(undo)
        self._reset()
        return done if done.any() else None

    def _unchanged(self, opt: Any, armed: _Armed, bucket: _Bucket) -> bool:
        """The bucket's gradients and parameters are what its update used."""
        tp = self.tp
        for k in range(bucket.a, bucket.b):
            for i in opt._share_group[k]:
                t = tp.tensors[i]
                if t._version != tp._versions[i] or t.requires_grad == armed.skip[k]:
                    return False
        for i, (ref, version) in bucket.seen.items():
            g = tp.tensors[i].grad
            if g is None or ref() is not g or g._version != version or g.is_sparse:
                return False
        return True

    def _refuse_writes(self, opt: Any) -> None:
        """Raise, everything rolled back, if a parameter of a started bucket was written."""
        tp = self.tp
        written = sorted({i for bucket in self._started for k in range(bucket.a, bucket.b)
                          for i in opt._share_group[k]
                          if tp.tensors[i]._version != tp._versions[i]})
        if not written:
            return
        # What was written may have read (or been overwritten by) an early update's values:
        # neither the write nor the update can be trusted.
        self._rollback(self._started, keep_writes=False)
        for i in written:
            tp._versions[i] = tp.tensors[i]._version
        self._reset()
        raise ParamError(
            f"parameter(s) {[tp.names[i] for i in written]} written between backward and "
            "step() after overlap had started updating them: the write is undone and the "
            "parameters are as before this step (their gradients kept); with overlap, write "
            "parameters after step() or before the forward pass")

    def cancel(self, check: bool = True) -> None:
        """Roll back everything started and not committed (``zero_grad()`` without a step,
        ``state_dict()``, ``load_state_dict()``, a new layout, an error); with ``check``,
        raise if a parameter it had updated was written meanwhile (see :meth:`settle`)."""
        self._join()
        opt = self._opt()
        if check and opt is not None:
            self._refuse_writes(opt)
        self._rollback(self._started, keep_writes=False)
        self._reset()

    def _rollback(self, buckets: list[_Bucket], keep_writes: bool = True) -> None:
        """Buckets' values and state as they were before their update, published again
        (with ``keep_writes``, but to parameters written since, whose writes ``step()``
        takes)."""
        if not buckets:
            return
        tp = self.tp
        pset = tp.pset
        opt = self._opt()
        assert opt is not None and self._backup_state is not None
        if tp.cuda:
            tp._h2d.synchronize()
        owners = []
        for bucket in buckets:
            a, b = bucket.a, bucket.b
            if not bucket.saved:
                continue  # it raised before it changed anything
            lo, hi = int(pset.offsets[a]), int(pset.offsets[b])
            _copy(pset.values[lo:hi], self._backup_values[lo:hi])
            opt._state.segments(a, b).copy_from(self._backup_state.segments(a, b), _copy)
            owners += [k for k in range(a, b)
                       if not keep_writes or all(tp.tensors[i]._version == tp._versions[i]
                                                 for i in opt._share_group[k])]
            self._log("rollback", bucket.index)
        tp._publish(owners)
        tp.finish()

    def close(self) -> None:
        """Roll back what is pending, remove the hooks, stop the worker."""
        self.cancel(check=False)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._pool.shutdown(wait=True)


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` on torch's intra-op threads, without the GIL: the backup of a bucket
    is as large as its master values and updater state (three times the values for Adam), and
    NumPy's one-threaded copy of it took longer than the bucket's update (on the CPU here, 64 ms
    against 43 ms a step for 16M Adam values; a GPU host's 16 cores copy in parallel)."""
    torch.from_numpy(dst).copy_(torch.from_numpy(src))



__all__ = ["BUCKET", "Overlap", "OverlapLike", "Overlapper", "overlap_conf"]
