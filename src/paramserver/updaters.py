"""Updaters (SPEC §5): one shape for every method, one fused kernel call per range.

An :class:`Updater` is a rule and a learning-rate schedule: it turns gradients into new
values and holds no state of its own. The state of a method (``history``, Adam's ``m`` and
``v``, the update counts) is an :class:`~paramserver.state.UpdaterState` that its holder
keeps: a server for its range, a torch optimizer for its tensors, and, for the calls on
Params below, the Params themselves (as SINGA keeps a Param's history with the Param).

Its core is :meth:`Updater.apply`: one update of a range of flat buffers holding many Params
("segments"), which is what a server calls for its slices. :meth:`Updater.update` (one
Param) and :meth:`Updater.update_params` (a whole :class:`~paramserver.params.ParamSet` in one
call) use the state the Param or ParamSet holds (:meth:`Updater.state_of`, made on first
use); a ParamSet's owners view their parts of its state, so the two calls can be mixed.

Per update, in this order: clip into ``[clip_low, clip_high]`` (when ``clip_high >
clip_low``), scale by ``grad_scale`` (times the global-norm factor, with ``clip_norm``), add
``weight_decay × wd_scale × w``, then the method's rule with ``lr = learning_rate(step) ×
lr_scale``. ``form: torch`` selects torch.optim's form of the rules where it differs from
SINGA's (one field, read by each method's kernel call: no second copy of a kernel).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np

from .config import ParamError, Parameter, field
from .config.components import updaters
from .config.job import UpdaterConf, conf_from
from .config.types import format_number
from .numerics import quant
from .params import Param, ParamSet
from .schedules import create_lr_method
from .state import COUNT, Role, UpdaterState, roles_of

T = TypeVar("T", bound=type)

#: The role of the float32 master copy of the values (``value_dtype: bfloat16``).
MASTER = "master"


class Updater:
    """Base of every update method; see the module docstring.

    Subclasses set ``state_roles`` (the names, or :class:`~paramserver.state.Role` s, of
    their state arrays, zero at start; the per-segment update count is kept for every
    method), and either override :meth:`_run` with a fused kernel (built-ins) or
    :meth:`rule` in NumPy (users' methods).
    """

    Config: ClassVar[type[Parameter] | None] = None
    state_roles: ClassVar[tuple[str | Role, ...]] = ()
    #: Whether the method can keep its state in bfloat16 or 8-bit codes (``state_dtype``).
    low_precision_state: ClassVar[bool] = False
    #: The names torch.optim gives the roles of the same state (``m`` is Adam's
    #: ``exp_avg``); the update count is torch's ``step``. Used by paramserver.torch's
    #: torch-style optimizers, whose ``state_dict`` is torch.optim's.
    torch_names: ClassVar[dict[str, str]] = {}
    #: Where MXNet 1.9.1 clips this method's gradient (``kernels.CLIP_SCALED``: after
    #: ``rescale_grad``; ``CLIP_DECAYED``: after the weight decay is added too); None: the
    #: method has no ``form: mxnet``.
    mxnet_clip: ClassVar[int | None] = None

    def __init__(self, conf: UpdaterConf):
        self.conf = conf
        self.own: Any = conf.own
        self.lr = create_lr_method(conf.learning_rate)
        if conf.state_dtype != "float32" and not self.low_precision_state:
            raise ParamError(f"state_dtype {conf.state_dtype}: {type(self).__name__} keeps "
                             "its state as it declares it; bfloat16 and int8 state are for "
                             "the built-in methods")
        if self.mxnet_form and self.mxnet_clip is None:
            have = ", ".join(sorted(n for n, c in updaters.items()
                                    if getattr(c, "mxnet_clip", None) is not None))
            raise ParamError(f"form mxnet: {type(self).__name__} has no MXNet form; the "
                             f"methods with one are {have}")

    @property
    def mxnet_form(self) -> bool:
        """Whether the rules take MXNet 1.9.1's form (``form: mxnet``)."""
        return bool(self.conf.form == "mxnet")

    @property
    def clip_at(self) -> int:
        """Where the kernels clip the gradient: before ``grad_scale`` (SPEC §5), or where
        MXNet does (``form: mxnet``; :data:`paramserver.numerics.kernels.CLIP_SCALED`)."""
        return int(self.mxnet_clip) if self.mxnet_form and self.mxnet_clip is not None else 0

    # -- state ------------------------------------------------------------------------------

    @property
    def roles(self) -> tuple[Role, ...]:
        """The roles of this method's state, the update count first (and the master copy of
        the values last, with ``value_dtype: bfloat16``)."""
        return roles_of((*self.state_roles, *self._master_role()))

    @property
    def keeps_master(self) -> bool:
        """Whether the values are bfloat16 roundings of a float32 master copy in the state
        (``value_dtype: bfloat16``)."""
        return bool(self.conf.value_dtype == "bfloat16")

    def _master_role(self) -> tuple[Role, ...]:
        return (Role(MASTER, "float32"),) if self.keeps_master else ()

    def adopt(self, values: np.ndarray, state: UpdaterState,
              skip: np.ndarray | None = None) -> None:
        """With a master copy: round the values of every segment not yet updated (update
        count 0) to bfloat16 in place and take them as its master, so that what workers read
        is the master's rounding from the first pull on (a server adopts the values it is
        put; :meth:`apply` the values it is given, but those of the segments it ``skip`` s).
        Idempotent. Without a master: nothing."""
        if not self.keeps_master:
            return
        master = state[MASTER]
        fresh = state.counts == 0
        if skip is not None:
            fresh &= ~skip
        if not fresh.any():
            return
        if fresh.all():
            parts = [(0, state.size)]
        else:
            off = state.offsets
            parts = [(int(off[i]), int(off[i + 1])) for i in np.flatnonzero(fresh)]
        for lo, hi in parts:
            values[lo:hi] = quant.bf16_decode(quant.bf16_encode(values[lo:hi]))
            np.copyto(master[lo:hi], values[lo:hi])

    def initial_state(self) -> dict[str, float]:
        """The roles whose segments start from another value than 0, and that value: a
        segment's arrays of those roles are set to it just before its first update (its
        update count 0 before it; AdaGrad's ``initial_accumulator_value``)."""
        return {}

    def _start(self, state: UpdaterState, first: np.ndarray) -> None:
        """Set the :meth:`initial_state` of the segments ``first`` (their first update)."""
        for role, value in self.initial_state().items():
            whole = state[role]
            if whole.dtype.kind == "f" and first.all():  # every segment at once (one pass,
                whole[...] = value                         # not a call per Param)
                continue
            for i in np.flatnonzero(first):
                fill_segment(state, role, int(i), value)

    def init_state(self, offsets: np.ndarray | list[int], dtype: Any) -> UpdaterState:
        """Zeroed state for a range of values cut into segments at ``offsets``.

        Refuses a ``delta`` that is 0 in ``dtype`` (see :meth:`check_dtype`).
        """
        self.check_dtype(dtype)
        return UpdaterState(self.roles, offsets, dtype)

    @property
    def torch_form(self) -> bool:
        """Whether the rules take torch.optim's form (``form: torch``)."""
        return bool(self.conf.form == "torch")

    #: see :attr:`uses_momentum` (a method whose answer never depends on its settings)
    reads_momentum: ClassVar[bool] = True

    @property
    def uses_momentum(self) -> bool:
        """Whether the rule reads ``momentum`` (a user's rule may: True unless a method says
        otherwise); the torch optimizer's param groups show the key only then."""
        return self.reads_momentum

    def check_dtype(self, dtype: Any) -> None:
        """Refuse values of ``dtype`` where ``delta`` is 0 (1e-300 in float32): every
        division it guards would give Inf or NaN; and other values than float32 for
        bfloat16 or int8 state."""
        dt = np.dtype(dtype)
        if self.keeps_master and dt != np.float32:
            raise ParamError(f"value_dtype bfloat16 (with a float32 master copy) is for "
                             f"float32 Params; these are {dt.name}")
        if self.conf.state_dtype != "float32" and dt != np.float32:
            raise ParamError(f"state_dtype {self.conf.state_dtype} is for float32 Params; "
                             f"these are {dt.name} (keep state_dtype: float32 for them)")
        if dt.kind == "f" and not dt.type(self.conf.delta) > 0:
            raise ParamError(
                f"value {format_number(self.conf.delta)} for Parameter delta should be greater "
                f"than 0 in {dt.name}, where it rounds to 0 (the smallest is "
                f"{np.finfo(dt).smallest_subnormal!s})\n"
                f"delta: {UpdaterConf.fields()['delta'].doc}")

    def state_of(self, target: Param | ParamSet) -> UpdaterState:
        """The state a Param or a ParamSet holds for this method, made (zero) on first use.

        A ParamSet's state covers its owners (one segment each), and each owner views its
        segment, keeping state it already had.
        """
        if isinstance(target, ParamSet):
            held = target.updater_state
            if held is None:
                held = self.init_state(target.offsets, target.dtype)
                for i, alone in target.owner_states().items():  # what an owner built up
                    piece = held.segments(i, i + 1)
                    for r in held.roles:
                        if r.name in alone:
                            piece[r.name][...] = alone[r.name]
            held = held.with_roles(self.roles)
            if held is not target.updater_state:
                target.updater_state = held  # every owner views its segment from now on
            return held
        if target.owner is not None:
            raise ParamError(f"Param '{target.name}' shares the values of "
                             f"'{target.owner.name}': update the owner")
        own = target.updater_state
        if own is None:
            own = target.updater_state = self.init_state([0, target.size], target.dtype)
        elif any(r.name not in own for r in self.roles):
            own = target.updater_state = own.with_roles(self.roles)
        return own

    # -- the batched core -------------------------------------------------------------------

    def apply(self, step: int, values: np.ndarray, grads: np.ndarray, state: UpdaterState,
              lr_scale: np.ndarray | float = 1.0, wd_scale: np.ndarray | float = 1.0,
              grad_scale: np.ndarray | float = 1.0, *, refuse_nonfinite: bool = False,
              grad_norm: float | None = None, skip: np.ndarray | None = None) -> int:
        """One update of a range of flat buffers, in place.

        Returns the number of gradient elements that were NaN or Inf, counted in the same
        pass (the update is applied regardless, unless ``refuse_nonfinite``).

        A segment that ``skip`` marks (a Param that got no gradient in this step: torch's
        ``.grad is None``, a key left out of a push) is not updated at all: its values, its
        state and its update count stay as they are (SPEC section 5). A gradient of zeros is
        a gradient, and is applied.

        Args:
            step: the training step; the learning rate is ``learning_rate(step)``.
            values: 1-D values, updated in place.
            grads: 1-D gradients of the same length and dtype; only read.
            state: this range's state (its segments are the range's), updated in place;
                every segment's update count goes up by one.
            lr_scale, wd_scale, grad_scale: per segment (arrays) or for all (numbers).
            refuse_nonfinite: read the gradient first (a read-only pass in the same kernel
                call); if it holds NaN or Inf, write nothing at all (values, state, counts).
            grad_norm: with ``clip_norm``, the global L2 norm of every gradient of the job
                (:meth:`grad_sum_squares` of each range, added, square-rooted); required then.
            skip: per segment, whether it got no gradient (bool); None: none did.
        """
        n = state.num_segments
        if values.shape != (state.size,):
            raise ParamError(f"values of shape {values.shape} for a state of {state.size} "
                             "values")
        gscale = _per_segment(grad_scale, n) * self.conf.rescale_grad
        if self.conf.clip_norm > 0:
            if grad_norm is None:
                raise ParamError(
                    "clip_norm clips by the L2 norm of every gradient of the job, which this "
                    "call does not see: update a whole ParamSet with update_params (or pass "
                    "grad_norm, the global norm, to apply)")
            from .numerics.norm import clip_factor

            gscale = gscale * clip_factor(grad_norm, self.conf.clip_norm)
        lr = self.lr(step) * _per_segment(lr_scale, n)
        wd = self.conf.weight_decay * _per_segment(wd_scale, n)
        counts = state.counts
        if skip is not None:
            skip = np.asarray(skip, bool)
            if skip.shape != (n,):
                raise ParamError(f"skip has {skip.size} entries for {n} segments")
            if skip.all():
                return 0
            if not skip.any():
                skip = None
        ran = 1 if skip is None else (~skip).astype(counts.dtype)
        w, out = values, None
        if self.keeps_master:  # the update runs on the master; the values get its rounding
            self.adopt(values, state, skip)
            w, out = state[MASTER], values
        np.add(counts, ran, out=counts)  # this update's number, as the rule sees it
        self._start(state, (counts == 1) if skip is None else (counts == 1) & ~skip)
        nonfinite = self._run(w, grads, state, lr, wd, gscale, refuse_nonfinite, out, skip)
        if nonfinite and refuse_nonfinite:
            np.subtract(counts, ran, out=counts)  # refused: nothing else was written
        return nonfinite

    def apply_rows(self, step: int, values: np.ndarray, ids: np.ndarray, rows: np.ndarray,
                   dim: int, state: UpdaterState, lr_scale: float = 1.0,
                   wd_scale: float = 1.0, grad_scale: float = 1.0, *,
                   refuse_nonfinite: bool = False) -> int:
        """One lazy update of some rows of a table, in place (SPEC §10).

        The table is ``values`` (``num_rows × dim``, flat) and ``state`` its state, of one
        segment. Only rows ``ids`` of the values and of the per-element state are read and
        written (:mod:`paramserver.numerics.rows`); the update count goes up by one, as for a
        dense update of the table. Returns the number of NaN or Inf gradient values.

        Args:
            step: the training step; the learning rate is ``learning_rate(step)``.
            values: the table's values, flat (1-D); rows ``ids`` updated in place.
            ids: strictly increasing row indices (int64).
            rows: one row of ``dim`` gradient values per id (``len(ids) × dim``); only read.
            dim: values per row.
            state: the table's state (one segment covering ``values``).
            lr_scale, wd_scale, grad_scale: the table's.
            refuse_nonfinite: read the rows first; if they hold NaN or Inf, write nothing.
        """
        if state.num_segments != 1 or values.shape != (state.size,):
            raise ParamError(f"a row-sparse update needs the state of one table "
                             f"(values of shape {values.shape}, state {state!r})")
        if self.keeps_master:
            raise ParamError("row-sparse updates do not keep a float32 master copy yet: "
                             "use value_dtype float32 for a table")
        if not self.conf.lazy_update:  # every row: a dense update, zero where not pushed
            from .numerics.rows import check_rows

            dim = int(dim)
            ids = check_rows(ids, values.size // dim if dim else 0)
            dense = np.zeros((values.size // dim, dim), values.dtype)
            dense[ids] = np.asarray(rows).reshape(ids.size, dim)
            return self.apply(step, values, dense.reshape(-1), state, lr_scale, wd_scale,
                              grad_scale, refuse_nonfinite=refuse_nonfinite)
        odd = [r.name for r in state.roles[1:] if r.per == "block"
               or (r.per == "element" and r.type_for(state.dtype) != state.dtype)]
        if odd:
            raise ParamError(f"row-sparse updates keep state of the values' type, one entry per "
                             f"value; {type(self).__name__}'s roles {odd} are not (low-precision "
                             f"or block state is not supported with row-sparse gradients yet)")
        lr = self.lr(step) * float(lr_scale)
        wd = self.conf.weight_decay * float(wd_scale)
        counts = state.counts
        np.add(counts, 1, out=counts)
        self._start(state, counts == 1)
        nonfinite = self._run_rows(values, rows, ids, int(dim), state, lr, wd,
                                   float(grad_scale) * self.conf.rescale_grad,
                                   refuse_nonfinite)
        if nonfinite and refuse_nonfinite:
            np.subtract(counts, 1, out=counts)
        return nonfinite

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        """The update of rows ``ids``; by default :meth:`rule` on the gathered rows (values
        and per-element state), which are then written back: the same lazy semantics."""
        from .numerics.rows import check_rows

        ids = check_rows(ids, w.size // dim if dim else 0)
        g = np.asarray(g).reshape(-1)
        nonfinite = int(g.size - np.count_nonzero(np.isfinite(g)))
        if check and nonfinite:
            return nonfinite
        at = (ids[:, None] * dim + np.arange(dim)).reshape(-1)
        piece = UpdaterState(state.roles, [0, at.size], state.dtype,
                             {r.name: (state[r.name][at] if r.per == "element"
                                       else state[r.name]) for r in state.roles})
        wr = w[at]
        self._run(wr, g.astype(w.dtype, copy=False), piece, np.array([lr]), np.array([wd]),
                  np.array([gscale]))
        w[at] = wr
        for r in state.roles:
            if r.per == "element":
                state[r.name][at] = piece[r.name]
        return nonfinite

    def grad_sum_squares(self, grads: np.ndarray, offsets: np.ndarray | list[int],
                         grad_scale: np.ndarray | float = 1.0) -> float:
        """This range's part of the squared global norm: ``Σ (clip(g) · grad_scale)²`` over its
        segments (cut at ``offsets``), with this updater's ``clip_low``/``clip_high``."""
        from .numerics.norm import sum_squares

        return sum_squares(grads, offsets, grad_scale, self.conf.clip_low, self.conf.clip_high)

    def _run(self, w: np.ndarray, g: np.ndarray, state: UpdaterState, lr: np.ndarray,
             wd: np.ndarray, gscale: np.ndarray, check: bool = False,
             bf16_values: np.ndarray | None = None, skip: np.ndarray | None = None) -> int:
        """The update over segments; by default :meth:`rule` on each segment, in NumPy.
        Returns the number of non-finite gradient elements; with ``check``, writes nothing
        when there are any. With ``bf16_values``, ``w`` is the master copy and
        ``bf16_values`` gets its new values rounded to bfloat16. Segments that ``skip``
        marks are not touched."""
        c = self.conf
        offsets = state.offsets
        nonfinite = int(g.size - np.count_nonzero(np.isfinite(g)))
        if check and nonfinite:
            return nonfinite
        for i in range(state.num_segments):
            if skip is not None and skip[i]:
                continue
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            gi = g[lo:hi].astype(w.dtype, copy=True)
            if c.clip_high > c.clip_low:
                np.clip(gi, c.clip_low, c.clip_high, out=gi)
            gi *= w.dtype.type(gscale[i])
            if wd[i] > 0:
                gi += w.dtype.type(wd[i]) * w[lo:hi]
            self.rule(w[lo:hi], gi, state.segment(i), float(lr[i]))
            if bf16_values is not None:
                bf16_values[lo:hi] = quant.bf16_decode(quant.bf16_encode(w[lo:hi]))
        return nonfinite

    def rule(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
             lr: float) -> None:
        """A user method's rule on one segment: update ``w`` and ``state`` in place.

        ``g`` is already clipped, scaled and weight-decayed (a private copy); ``state``
        holds the segment's arrays by role, ``state["count"]`` its update count (this
        update included).
        """
        raise NotImplementedError(f"{type(self).__name__} must define rule() or _run()")

    # -- Params -----------------------------------------------------------------------------

    def update(self, step: int, param: Param, grad_scale: float = 1.0) -> int:
        """Update one owner Param from its gradient; its version goes up by one.

        Returns the number of NaN or Inf elements the gradient held (0 when it was finite).
        With ``clip_norm`` (a norm over all Params) use :meth:`update_params`.
        """
        state = self.state_of(param)
        nonfinite = self.apply(step, param.data.reshape(-1), param.grad.reshape(-1), state,
                               param.lr_scale, param.wd_scale, grad_scale)
        param.version += 1
        return nonfinite

    def update_params(self, step: int, params: ParamSet,
                      grad_scale: np.ndarray | float | None = None) -> int:
        """Update every owner of a ParamSet in one call over its flat buffers (and each
        row-sparse table on the rows of its gradient, which are then cleared); returns the
        number of NaN or Inf gradient elements.

        ``grad_scale`` defaults to ``1 / num_shares`` per owner: the mean of the gradients
        of the Params sharing it, once :meth:`ParamSet.sum_shared_grads` has summed them.
        With ``clip_norm``, the gradients are clipped by the L2 norm of all of them (scaled).
        Owners that :attr:`ParamSet.idle` marks (no gradient this step) are not updated, nor
        their versions raised; the flags are taken (set back to None).
        """
        state = self.state_of(params)
        idle, params.idle = params.idle, None
        scale = 1.0 / params.num_shares if grad_scale is None else grad_scale
        grads = params.owner_grads()
        if not params.tables:
            norm = (math.sqrt(self.grad_sum_squares(grads, params.offsets, scale))
                    if self.conf.clip_norm > 0 else None)
            nonfinite = self.apply(step, params.values, grads, state,
                                   params.lr_scales, params.wd_scales, scale, grad_norm=norm,
                                   skip=idle)
        else:  # the dense owners in one call, each table on the rows of its gradient
            n = len(params.owners)
            nd = n - len(params.tables)
            lr, wd = params.lr_scales, params.wd_scales
            scale = np.broadcast_to(np.asarray(scale, np.float64), (n,))
            off = params.offsets
            taken = [t.take_grad_rows() for t in params.tables]
            norm = None
            factor = 1.0
            if self.conf.clip_norm > 0:  # the global norm covers the tables' rows too
                from .numerics.norm import clip_factor

                squares = self.grad_sum_squares(grads, off[:nd + 1], scale[:nd])
                for i, (_, rows) in enumerate(taken, start=nd):
                    squares += self.grad_sum_squares(rows.reshape(-1), [0, rows.size],
                                                     scale[i])
                norm = math.sqrt(squares)
                factor = clip_factor(norm, self.conf.clip_norm)
            nonfinite = self.apply(step, params.values[:params.dense_size], grads,
                                   state.segments(0, nd), lr[:nd], wd[:nd], scale[:nd],
                                   grad_norm=norm, skip=None if idle is None else idle[:nd])
            for i, (table, (ids, rows)) in enumerate(zip(params.tables, taken, strict=True),
                                                     start=nd):
                nonfinite += self.apply_rows(step, params.values[off[i]:off[i + 1]], ids, rows,
                                             table.dim, state.segments(i, i + 1), lr[i],
                                             wd[i], scale[i] * factor)
        if idle is None:
            params.set_versions(params.versions + 1)
        else:  # an owner without a gradient keeps its version (tables, the last, count all)
            bump = np.where(idle, 0, 1).astype(np.int64)
            bump[len(params.owners) - len(params.tables):] = 1
            params.set_versions(params.versions + bump)
        return nonfinite

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.conf!r})"


def fill_segment(state: UpdaterState, role: str, i: int, value: float | np.ndarray) -> None:
    """Set segment ``i`` of ``role`` to ``value`` (a number, or the segment's values), as the
    role is kept: its type, bfloat16 patterns, or 8-bit codes with their block scales
    (``<role>_scale``)."""
    piece = state.segment(i)[role]
    x = np.broadcast_to(np.asarray(value, np.float64), piece.shape)
    element = state.role(role).per == "element"
    if element and piece.dtype == np.uint16:
        piece[...] = quant.bf16_encode(x.astype(np.float32))
    elif element and piece.dtype.itemsize == 1:
        codes, scales = quant.block_encode(x.astype(np.float32), np.array([0, piece.size]),
                                           quant.code_of(piece.dtype))
        piece[...] = codes
        state.segment(i)[role + quant.SCALE][...] = scales
    else:
        piece[...] = x


def _per_segment(x: np.ndarray | float, n: int) -> np.ndarray:
    arr = np.asarray(x, np.float64)
    return np.full(n, float(arr)) if arr.ndim == 0 else arr


def register_updater(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
    """Register an updater class under ``name`` (SPEC §8)."""
    return updaters.register(name, aliases=aliases)  # type: ignore[return-value]


def create_updater(x: UpdaterConf | dict[str, Any] | str) -> Updater:
    """An updater from its configuration, a nested dict, or an ``updater`` block's text."""
    conf = conf_from(UpdaterConf, x, "updater")
    updater: Updater = updaters.get(conf.component)(conf)
    return updater


# -- built-in methods: each one fused kernel ------------------------------------------------

class _Fused(Updater):
    """Built-ins: ``_run`` is one call of the method's kernel in :mod:`paramserver.kernels`."""

    #: The kernel function (``kernels.adam``) and the per-element rule it runs
    #: (``quant.SIGNED_STATE`` says which of the rule's state may be negative).
    kernel: ClassVar[str]
    kernel_rule: ClassVar[str]
    low_precision_state = True

    def extra(self) -> dict[str, Any]:
        """The method's hyper-parameters, as the kernel takes them."""
        return {}

    def extra_for(self, state: UpdaterState) -> dict[str, Any]:
        """The kernel's keyword arguments besides the common ones, for this state (by default
        :meth:`extra`)."""
        return self.extra()

    #: Whether the kernel takes the update counts (as ``step``).
    counted: ClassVar[bool] = False
    #: State besides the per-element arrays of ``state_roles`` (NAdam's per-segment
    #: ``mu_product``), kept as it is declared.
    extra_roles: ClassVar[tuple[Role, ...]] = ()

    @property
    def roles(self) -> tuple[Role, ...]:
        """The roles of this method's state, the update count first: each per-element
        array kept as ``state_dtype`` says (:func:`paramserver.quant.roles`)."""
        names = [str(r) for r in self.state_roles]
        return roles_of((*quant.roles(names, self.conf.state_dtype,
                                      quant.SIGNED_STATE[self.kernel_rule][:len(names)]),
                         *self.extra_roles, *self._master_role()))

    def state_arrays(self, state: UpdaterState) -> list[Any]:
        """The state as the kernel takes it: arrays, or (codes, scales) of 8-bit state."""
        out: list[Any] = []
        for r in self.state_roles:
            a = state[str(r)]
            scales = str(r) + quant.SCALE
            out.append((a, state[scales]) if a.dtype.itemsize == 1 and scales in state else a)
        return out

    def _run(self, w: np.ndarray, g: np.ndarray, state: UpdaterState, lr: np.ndarray,
             wd: np.ndarray, gscale: np.ndarray, check: bool = False,
             bf16_values: np.ndarray | None = None, skip: np.ndarray | None = None) -> int:
        from .numerics import kernels

        kw = self.extra_for(state)
        if bf16_values is not None:
            kw["bf16_values"] = bf16_values
        if self.counted or self.conf.stochastic_rounding:
            kw["step"] = state.counts
        nonfinite: int = getattr(kernels, self.kernel)(
            w, g, *self.state_arrays(state), state.offsets, lr, wd, gscale,
            clip_low=self.conf.clip_low, clip_high=self.conf.clip_high, check=check,
            stochastic=self.conf.stochastic_rounding, skip=skip, clip_at=self.clip_at, **kw)
        return nonfinite

    #: see :attr:`has_row_kernel` (a method whose answer never depends on its settings)
    row_kernel: ClassVar[bool] = True

    @property
    def has_row_kernel(self) -> bool:
        """Whether :mod:`paramserver.numerics.rows` has this method's kernel; without, a
        row-sparse update gathers the rows, updates them with the dense kernel and puts them
        back (:meth:`Updater._run_rows`: the same lazy semantics, two passes more)."""
        return self.row_kernel

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        from .numerics import rows as row_kernels

        if not self.has_row_kernel:
            return Updater._run_rows(self, w, g, ids, dim, state, lr, wd, gscale, check)
        arrays = [state[r.name] for r in self.roles[1:]]
        kw = self.extra()
        if self.counted:
            kw["step"] = float(state.counts[0])
        nonfinite: int = getattr(row_kernels, self.kernel)(
            w, g, ids, dim, *arrays, lr, wd, gscale, clip_low=self.conf.clip_low,
            clip_high=self.conf.clip_high, check=check, clip_at=self.clip_at, **kw)
        return nonfinite


class SGDConf(Parameter):
    dampening: float = field(0.0, lower=0.0, upper=1.0,
                             doc="torch.optim.SGD's dampening: the gradient enters the "
                                 "momentum times 1 - dampening, except at a Param's first "
                                 "update (SINGA has none: 0).")


@register_updater("kSGD", aliases=("sgd",))
class SGD(_Fused):
    """``h = momentum·h − lr·g; w = w + h`` (``w = w − lr·g`` without momentum); with
    ``form: torch``, torch.optim.SGD's ``buf = momentum·buf + (1 − dampening)·g;
    w = w − lr·buf``."""

    Config = SGDConf
    kernel = "sgd"
    mxnet_clip: ClassVar[int | None] = 1  # kernels.CLIP_SCALED: clip(rescale_grad·g) + wd·w
    torch_names: ClassVar[dict[str, str]] = {"history": "momentum_buffer"}

    @property
    def kernel_rule(self) -> str:  # type: ignore[override]
        return "momentum" if self.conf.momentum > 0 else "sgd"

    @property
    def state_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("history",) if self.conf.momentum > 0 else ()

    def extra(self) -> dict[str, Any]:
        return {"momentum": self.conf.momentum}

    def state_arrays(self, state: UpdaterState) -> list[Any]:
        # Without momentum the kernel takes an empty history (and leaves any held alone).
        return super().state_arrays(state) or [np.zeros(0, state.dtype)]

    def extra_for(self, state: UpdaterState) -> dict[str, Any]:
        damp = self.own.dampening if self.own is not None else 0.0
        # torch starts a buffer from the gradient itself: no dampening at the first update.
        dampening = np.where(state.counts == 1, 0.0, damp) if damp > 0 else 0.0
        return {**self.extra(), "dampening": dampening, "torch_form": self.torch_form}

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        from .numerics import rows as row_kernels

        h = state["history"] if "history" in state and self.conf.momentum > 0 else w[:0]
        damp = self.own.dampening if self.own is not None else 0.0
        return row_kernels.sgd(w, g, ids, dim, h, lr, wd, gscale,
                                momentum=self.conf.momentum,
                                dampening=0.0 if int(state.counts[0]) == 1 else damp,
                                torch_form=self.torch_form, clip_low=self.conf.clip_low,
                                clip_high=self.conf.clip_high, check=check,
                                clip_at=self.clip_at)


@register_updater("kNesterov", aliases=("nesterov",))
class Nesterov(_Fused):
    """``h0 = h; h = momentum·h + lr·g; w = w − ((1 + momentum)·h − momentum·h0)``; with
    ``form: torch``, torch.optim.SGD's ``nesterov=True``: ``buf = momentum·buf + g;
    w = w − lr·(g + momentum·buf)``."""

    kernel = "nesterov"
    mxnet_clip: ClassVar[int | None] = 1  # MXNet's NAG (see in_place)
    state_roles = ("history",)
    torch_names: ClassVar[dict[str, str]] = {"history": "momentum_buffer"}

    def __init__(self, conf: UpdaterConf):
        super().__init__(conf)
        #: form mxnet: MXNet's in-place nag_mom_update (its store's dense keys); False: the
        #: formula, as MXNet updates a row-sparse weight (densely, through a copy)
        self.in_place = self.mxnet_form

    @property
    def kernel_rule(self) -> str:  # type: ignore[override]
        return "nag_mxnet" if self.in_place else "nesterov"

    def extra(self) -> dict[str, Any]:
        return {"momentum": self.conf.momentum, "torch_form": self.torch_form,
                "mxnet": self.in_place}

    def apply_rows(self, step: int, values: np.ndarray, ids: np.ndarray, rows: np.ndarray,
                   dim: int, state: UpdaterState, lr_scale: float = 1.0,
                   wd_scale: float = 1.0, grad_scale: float = 1.0, *,
                   refuse_nonfinite: bool = False) -> int:
        updater = self
        if self.in_place and not self.conf.lazy_update:  # MXNet's dense update of a table
            updater = copy.copy(self)
            updater.in_place = False
        return Updater.apply_rows(updater, step, values, ids, rows, dim, state, lr_scale,
                                  wd_scale, grad_scale, refuse_nonfinite=refuse_nonfinite)


class AdaGradConf(Parameter):
    lr_decay: float = field(0.0, lower=0.0, finite=True,
                            doc="torch.optim.Adagrad's lr_decay: the rate of a Param's t-th "
                                "update is lr / (1 + (t - 1) * lr_decay).")
    initial_accumulator_value: float = field(
        0.0, lower=0.0, finite=True,
        doc="torch.optim.Adagrad's: the sum of squared gradients starts at this value.")


@register_updater("kAdaGrad", aliases=("adagrad",))
class AdaGrad(_Fused):
    """``h = h + g²; w = w − lr·g / sqrt(h + delta)`` (momentum not used); with
    ``form: torch``, ``w = w − lr·g / (sqrt(h) + delta)`` as torch.optim.Adagrad."""

    Config = AdaGradConf
    kernel = "adagrad"
    kernel_rule = "adagrad"
    mxnet_clip: ClassVar[int | None] = 1
    state_roles = ("history",)
    torch_names: ClassVar[dict[str, str]] = {"history": "sum"}

    reads_momentum = False

    def extra(self) -> dict[str, Any]:
        return {"delta": self.conf.delta, "torch_form": self.torch_form,
                "decoupled": self.mxnet_form}

    def initial_state(self) -> dict[str, float]:
        # torch's sum starts at this value (a table's first update sets every row's)
        own = self.own
        value = own.initial_accumulator_value if own is not None else 0.0
        return {"history": value} if value > 0 else {}

    def _run(self, w: np.ndarray, g: np.ndarray, state: UpdaterState, lr: np.ndarray,
             wd: np.ndarray, gscale: np.ndarray, check: bool = False,
             bf16_values: np.ndarray | None = None, skip: np.ndarray | None = None) -> int:
        own = self.own
        if own is not None and own.lr_decay > 0:
            lr = lr / (1.0 + np.maximum(state.counts - 1, 0) * own.lr_decay)
        return super()._run(w, g, state, lr, wd, gscale, check, bf16_values, skip)

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        own = self.own
        if own is not None and own.lr_decay > 0:
            lr = lr / (1.0 + (float(state.counts[0]) - 1) * own.lr_decay)
        return super()._run_rows(w, g, ids, dim, state, lr, wd, gscale, check)


class RMSPropConf(Parameter):
    rho: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the running mean of g².")
    centered: bool = field(False, doc="Keep the running mean a of g too, and divide by the "
                                      "square root of the variance h - a² instead of h "
                                      "(torch.optim.RMSprop's centered=True; beyond SINGA).")


@register_updater("kRMSProp", aliases=("rmsprop",))
class RMSProp(_Fused):
    """``h = rho·h + (1 − rho)·g²; w = w − lr·g / sqrt(h + delta)``; with ``form: torch``,
    torch.optim.RMSprop's ``avg = sqrt(h) + delta``, and its momentum when ``momentum > 0``
    (``buf = momentum·buf + g / avg; w = w − lr·buf``; SINGA's form does not use momentum).
    With ``centered``, the running mean ``a = rho·a + (1 − rho)·g`` is kept (role
    ``grad_avg``) and ``h − a²`` takes the place of ``h``."""

    Config = RMSPropConf
    kernel = "rmsprop"
    mxnet_clip: ClassVar[int | None] = 2  # kernels.CLIP_DECAYED: clip(rescale_grad·g + wd·w)
    torch_names: ClassVar[dict[str, str]] = {"history": "square_avg",
                                             "momentum_buffer": "momentum_buffer",
                                             "grad_avg": "grad_avg"}

    def __init__(self, conf: UpdaterConf):
        super().__init__(conf)
        if self.mxnet_form and conf.momentum > 0 and not self.centered:
            raise ParamError("form mxnet: MXNet's RMSProp uses momentum (its gamma2) only "
                             "when centered (rmsprop_conf { centered: true }); give momentum "
                             "0 or centered")

    @property
    def uses_momentum(self) -> bool:
        return (self.torch_form or (self.mxnet_form and self.centered)) \
            and self.conf.momentum > 0

    @property
    def centered(self) -> bool:
        return bool(self.own.centered)

    @property
    def has_row_kernel(self) -> bool:
        return not self.centered

    @property
    def state_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("history", *(("momentum_buffer",) if self.uses_momentum else ()),
                *(("grad_avg",) if self.centered else ()))

    @property
    def kernel_rule(self) -> str:  # type: ignore[override]
        rule = "rmsprop_centered" if self.centered else "rmsprop"
        return rule + "_momentum" if self.uses_momentum else rule

    def state_arrays(self, state: UpdaterState) -> list[Any]:
        # the momentum buffer goes as u, the gradient's mean as a (extra_for)
        return super().state_arrays(state)[:1]

    def extra_for(self, state: UpdaterState) -> dict[str, Any]:
        c = self.conf
        momentum = c.momentum if self.uses_momentum else 0.0
        kw = {"rho": self.own.rho, "delta": c.delta, "torch_form": self.torch_form,
              "momentum": momentum, "centered": self.centered,
              "lr_in_buffer": self.mxnet_form}
        arrays = super().state_arrays(state)
        if momentum > 0:
            kw["u"] = arrays[1]
        if self.centered:
            kw["a"] = arrays[-1]
        return kw

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        from .numerics import rows as row_kernels

        if not self.has_row_kernel:
            return Updater._run_rows(self, w, g, ids, dim, state, lr, wd, gscale, check)
        c = self.conf
        momentum = c.momentum if self.uses_momentum else 0.0
        return row_kernels.rmsprop(w, g, ids, dim, state["history"], lr, wd, gscale,
                                    rho=self.own.rho, delta=c.delta, torch_form=self.torch_form,
                                    momentum=momentum,
                                    u=state["momentum_buffer"] if momentum > 0 else None,
                                    clip_low=c.clip_low, clip_high=c.clip_high, check=check,
                                    clip_at=self.clip_at)


class AdaDeltaConf(Parameter):
    rho: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the running means (SINGA's "
                                                      "default, 0.9).")


@register_updater("kAdaDelta", aliases=("adadelta",))
class AdaDelta(_Fused):
    """``h = rho·h + (1−rho)·g²; t = g·sqrt(u + delta)/sqrt(h + delta);
    u = rho·u + (1−rho)·t²; w = w − lr·t``."""

    Config = AdaDeltaConf
    kernel = "adadelta"
    kernel_rule = "adadelta"
    mxnet_clip: ClassVar[int | None] = 1
    state_roles = ("history", "update")
    torch_names: ClassVar[dict[str, str]] = {"history": "square_avg", "update": "acc_delta"}

    reads_momentum = False

    def extra(self) -> dict[str, Any]:
        return {"rho": self.own.rho, "delta": self.conf.delta, "decoupled": self.mxnet_form}


class AdamConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")
    bias_correction: bool = field(True, doc="Correct the moments' bias towards 0, as users "
                                            "expect today; false: SINGA v0.3's kAdam "
                                            "exactly (no correction, delta under the square "
                                            "root: w -= lr*m/sqrt(v + delta)).")
    amsgrad: bool = field(False, doc="AMSGrad (Reddi et al. 2018, torch.optim.Adam's "
                                     "amsgrad=True): keep the running maximum of v (role "
                                     "vmax) and divide by its square root; beyond SINGA.")

    def check(self) -> list[str]:
        # At 1 the bias correction 1 - beta^t is 0: every value would become Inf or NaN.
        if not self.bias_correction:
            return (["amsgrad: true is Adam's with bias correction (bias_correction: true)"]
                    if self.amsgrad else [])
        return _betas_below_one(self, ("beta1", "beta2"))


def _betas_below_one(conf: Parameter, names: tuple[str, ...], why: str = "the bias "
                     "correction divides by 1 - {name}^t") -> list[str]:
    return [f"value 1 for Parameter {name} should be less than 1 ({why.format(name=name)})"
            for name in names if getattr(conf, name) == 1.0]


_ADAM_NAMES = {"m": "exp_avg", "v": "exp_avg_sq"}


@register_updater("kAdam", aliases=("adam",))
class Adam(_Fused):
    """Adam with bias correction; weight decay added to the gradient (L2). With
    ``amsgrad``, AMSGrad: the running maximum of ``v`` (role ``vmax``) in the
    denominator."""

    Config: ClassVar[type[Parameter] | None] = AdamConf
    kernel = "adam"
    counted = True
    decoupled = False
    mxnet_clip: ClassVar[int | None] = 2
    torch_names: ClassVar[dict[str, str]] = {**_ADAM_NAMES, "vmax": "max_exp_avg_sq"}

    @property
    def amsgrad(self) -> bool:
        return bool(getattr(self.own, "amsgrad", False))

    @property
    def state_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("m", "v", "vmax") if self.amsgrad else ("m", "v")

    @property
    def kernel_rule(self) -> str:  # type: ignore[override]
        return "amsgrad" if self.amsgrad else "adam"

    @property
    def has_row_kernel(self) -> bool:
        return not self.amsgrad

    reads_momentum = False

    def state_arrays(self, state: UpdaterState) -> list[Any]:
        return super().state_arrays(state)[:2]  # vmax goes by name (extra_for)

    def extra(self) -> dict[str, Any]:
        kw = {"beta1": self.own.beta1, "beta2": self.own.beta2, "delta": self.conf.delta,
              "decoupled": self.decoupled, "bias_correction": self.own.bias_correction}
        if self.mxnet_form:  # MXNet's: lr·sqrt(1 - beta2^t)/(1 - beta1^t)·m/(sqrt(v) + delta)
            kw["delta_before_correction"] = True
        return kw

    def extra_for(self, state: UpdaterState) -> dict[str, Any]:
        kw = self.extra()
        if self.amsgrad:
            kw["vmax"] = super().state_arrays(state)[2]
        return kw


@register_updater("kAdamW", aliases=("adamw",))
class AdamW(Adam):
    """Adam with decoupled weight decay: ``w = w·(1 − lr·wd)`` before the Adam step."""

    conf_name = "adamw_conf"
    decoupled = True
    mxnet_clip: ClassVar[int | None] = None


class SparseAdamConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")

    def check(self) -> list[str]:
        return _betas_below_one(self, ("beta1", "beta2"))


@register_updater("kSparseAdam", aliases=("sparseadam",))
class SparseAdam(Adam):
    """torch.optim.SparseAdam's Adam: delta added to ``sqrt(v)`` before the bias correction
    (``w −= lr·sqrt(1 − beta2^t)/(1 − beta1^t) · m/(sqrt(v) + delta)``), and lazy on a
    row-sparse gradient (only its rows, and their state, are updated; SPEC section 10)."""

    Config = SparseAdamConf
    mxnet_clip: ClassVar[int | None] = None

    def extra(self) -> dict[str, Any]:
        return {"beta1": self.own.beta1, "beta2": self.own.beta2, "delta": self.conf.delta,
                "delta_before_correction": True}


class NAdamConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")
    momentum_decay: float = field(4e-3, lower=0.0, finite=True,
                                  doc="The decay of the momentum schedule: mu_t = beta1 * "
                                      "(1 - 0.5 * 0.96^(t * momentum_decay)).")
    decoupled_weight_decay: bool = field(False, doc="Decay the values, w *= 1 - lr*wd, "
                                                    "instead of adding wd*w to the gradient "
                                                    "(torch.optim.NAdam's).")

    def check(self) -> list[str]:
        return _betas_below_one(self, ("beta2",)) + _betas_below_one(
            self, ("beta1",), "the momentum schedule divides by 1 - {name}^t")


class _AdamLike(_Fused):
    """Adam's two moments, without a row kernel of their own (NAdam, RAdam)."""

    state_roles = ("m", "v")
    counted = True
    torch_names: ClassVar[dict[str, str]] = _ADAM_NAMES

    reads_momentum = False
    row_kernel = False


@register_updater("kNAdam", aliases=("nadam",))
class NAdam(_AdamLike):
    """NAdam, Adam with Nesterov momentum (Dozat 2016), as torch.optim.NAdam: the product of
    the momentum schedule is kept per Param (role ``mu_product``, float64); see
    :func:`paramserver.numerics.kernels.nadam`."""

    Config = NAdamConf
    kernel = "nadam"
    kernel_rule = "nadam"
    extra_roles = (Role("mu_product", "float64", "segment"),)
    torch_names: ClassVar[dict[str, str]] = {**_ADAM_NAMES, "mu_product": "mu_product"}

    def initial_state(self) -> dict[str, float]:
        return {"mu_product": 1.0}

    def extra_for(self, state: UpdaterState) -> dict[str, Any]:
        own = self.own
        return {"beta1": own.beta1, "beta2": own.beta2, "delta": self.conf.delta,
                "momentum_decay": own.momentum_decay,
                "decoupled": own.decoupled_weight_decay, "mu_product": state["mu_product"]}


class RAdamConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")
    decoupled_weight_decay: bool = field(False, doc="Decay the values, w *= 1 - lr*wd, "
                                                    "instead of adding wd*w to the gradient "
                                                    "(torch.optim.RAdam's).")

    def check(self) -> list[str]:
        return _betas_below_one(self, ("beta1", "beta2"))


@register_updater("kRAdam", aliases=("radam",))
class RAdam(_AdamLike):
    """RAdam, Adam with the variance of its rate rectified (Liu et al. 2020), as
    torch.optim.RAdam: momentum SGD while the variance is intractable (``rho_t <= 5``),
    then rectified Adam; see :func:`paramserver.numerics.kernels.radam`."""

    Config = RAdamConf
    kernel = "radam"
    kernel_rule = "radam"

    def extra(self) -> dict[str, Any]:
        own = self.own
        return {"beta1": own.beta1, "beta2": own.beta2, "delta": self.conf.delta,
                "decoupled": own.decoupled_weight_decay}


class AdamMaxConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the infinity norm.")
    bias_correction: bool = field(True, doc="Correct the first moment's bias towards 0 "
                                            "(Kingma & Ba); false: SINGA v0.3's kAdamMax "
                                            "exactly (no correction, u = max(beta2*u, |g|) + "
                                            "delta).")

    def check(self) -> list[str]:
        if self.bias_correction and self.beta1 == 1.0:
            return ["value 1 for Parameter beta1 should be less than 1 (the bias correction "
                    "divides by 1 - beta1^t)"]
        return []


@register_updater("kAdamMax", aliases=("adamax",))
class AdamMax(_Fused):
    """AdaMax, Adam with the infinity norm (Kingma & Ba, section 7.1; SINGA v0.3's
    kAdamMax): ``m = beta1·m + (1−beta1)·g; u = max(beta2·u, |g| + delta);
    w = w − lr/(1−beta1^t)·m/u``."""

    Config = AdamMaxConf
    kernel = "adamax"
    kernel_rule = "adamax"
    state_roles = ("m", "u")
    counted = True
    torch_names: ClassVar[dict[str, str]] = {"m": "exp_avg", "u": "exp_inf"}

    reads_momentum = False

    def extra(self) -> dict[str, Any]:
        return {"beta1": self.own.beta1, "beta2": self.own.beta2, "delta": self.conf.delta,
                "bias_correction": self.own.bias_correction}


class FtrlConf(Parameter):
    lamda1: float = field(0.01, lower=0.0, finite=True,
                          doc="The L1 regularisation (MXNet's spelling): a value whose z is "
                              "within [-lamda1, lamda1] is 0.")
    beta: float = field(1.0, lower=0.0, finite=True,
                        doc="The per-coordinate rate's beta: lr / (beta + sqrt(n)).")


@register_updater("kFtrl", aliases=("ftrl",))
class Ftrl(_Fused):
    """FTRL-Proximal (McMahan et al. 2013), as MXNet's Ftrl: ``z += g − (sqrt(n + g²) −
    sqrt(n))·w/lr; n += g²; w = (sign(z)·lamda1 − z) / ((beta + sqrt(n))/lr + wd)`` where
    ``|z| > lamda1``, else 0. ``weight_decay`` is the L2 term of that closed form (it is not
    added to the gradient); momentum is not used. Sparse solutions for click-through models."""

    Config = FtrlConf
    kernel = "ftrl"
    kernel_rule = "ftrl"
    mxnet_clip: ClassVar[int | None] = 1
    state_roles = ("z", "n")

    def __init__(self, conf: UpdaterConf):
        super().__init__(conf)
        if conf.learning_rate.base_lr <= 0:
            raise ParamError("kFtrl divides by the learning rate: base_lr must be > 0")

    reads_momentum = False
    row_kernel = False

    def extra(self) -> dict[str, Any]:
        return {"lamda1": self.own.lamda1, "beta": self.own.beta}

    def _run(self, w: np.ndarray, g: np.ndarray, state: UpdaterState, lr: np.ndarray,
             wd: np.ndarray, gscale: np.ndarray, check: bool = False,
             bf16_values: np.ndarray | None = None, skip: np.ndarray | None = None) -> int:
        # The closed form divides by the rate: a segment of rate 0 (lr_scale 0, a frozen
        # Param) is left as it is, values and state.
        frozen = np.asarray(lr) == 0
        if frozen.any():
            skip = frozen if skip is None else (np.asarray(skip, bool) | frozen)
            if skip.all():
                return 0 if not check else int(g.size - np.count_nonzero(np.isfinite(g)))
            lr = np.where(frozen, 1.0, lr)
        return super()._run(w, g, state, lr, wd, gscale, check, bf16_values, skip)


class SignumConf(Parameter):
    wd_lh: float = field(0.0, lower=0.0, finite=True,
                         doc="Decoupled weight decay (Loshchilov & Hutter): w *= 1 - lr*wd_lh "
                             "at each step, besides weight_decay in the momentum (with "
                             "momentum > 0 only).")


@register_updater("kSignum", aliases=("signum",))
class Signum(_Fused):
    """Signum (Bernstein et al. 2018), as MXNet's: ``u = momentum·u + (1 − momentum)·g;
    w = (1 − lr·wd_lh)·w − lr·sign(u)``; with momentum 0, signSGD: ``w = (1 − lr·wd)·w −
    lr·sign(g)`` (the weight decay decoupled)."""

    Config = SignumConf
    kernel = "signum"
    mxnet_clip: ClassVar[int | None] = 1

    @property
    def kernel_rule(self) -> str:  # type: ignore[override]
        return "signum" if self.conf.momentum > 0 else "signsgd"

    @property
    def state_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("momentum",) if self.conf.momentum > 0 else ()

    def __init__(self, conf: UpdaterConf):
        super().__init__(conf)
        if conf.momentum >= 1:
            raise ParamError("kSignum's momentum must be < 1 (the gradient enters it times "
                             "1 - momentum)")
        if conf.momentum == 0 and self.own.wd_lh > 0:
            raise ParamError("signum_conf { wd_lh } is the decoupled decay of Signum with "
                             "momentum; without momentum (signSGD) weight_decay is decoupled "
                             "already: give weight_decay")

    def state_arrays(self, state: UpdaterState) -> list[Any]:
        return super().state_arrays(state) or [np.zeros(0, state.dtype)]

    row_kernel = False

    def extra(self) -> dict[str, Any]:
        return {"momentum": self.conf.momentum, "wd_lh": self.own.wd_lh}


class LAMBConf(Parameter):
    beta1: float = field(0.9, lower=0.0, upper=1.0, doc="Decay of the first moment.")
    beta2: float = field(0.999, lower=0.0, upper=1.0, doc="Decay of the second moment.")
    bias_correction: bool = field(True, doc="Correct the moments' bias towards 0.")
    lower_bound: float | None = field(None, lower=0.0, finite=True,
                                      doc="Clamp ||w|| of the trust ratio from below "
                                          "(None: no clamp).")
    upper_bound: float | None = field(None, lower=0.0, finite=True,
                                      doc="Clamp ||w|| of the trust ratio from above "
                                          "(None: no clamp).")

    def check(self) -> list[str]:
        return _betas_below_one(self, ("beta1", "beta2")) if self.bias_correction else []


@register_updater("kLAMB", aliases=("lamb",))
class LAMB(_Fused):
    """LAMB (You et al. 2020), as MXNet's: Adam's moments of the gradient, ``u = m̂/(sqrt(v̂) +
    delta) + wd·w``, and the step ``lr·(||w||/||u||)·u`` with the norms of the whole Param
    (or key piece): two passes (:func:`paramserver.numerics.kernels.lamb`). Float state;
    a row-sparse table needs ``lazy_update: false`` (the norms are of the whole table)."""

    Config = LAMBConf
    kernel = "lamb"
    kernel_rule = "lamb"
    mxnet_clip: ClassVar[int | None] = 1
    counted = True
    low_precision_state = False
    state_roles = ("m", "v")
    torch_names: ClassVar[dict[str, str]] = _ADAM_NAMES

    @property
    def roles(self) -> tuple[Role, ...]:  # float state, as the values
        return Updater.roles.fget(self)  # type: ignore[attr-defined,no-any-return]

    reads_momentum = False
    row_kernel = False

    def _run_rows(self, w: np.ndarray, g: np.ndarray, ids: np.ndarray, dim: int,
                  state: UpdaterState, lr: float, wd: float, gscale: float,
                  check: bool = False) -> int:
        raise ParamError("kLAMB's trust ratio takes the norms of the whole table: a "
                         "row-sparse table's update needs lazy_update: false")

    def extra(self) -> dict[str, Any]:
        own = self.own
        return {"beta1": own.beta1, "beta2": own.beta2, "delta": self.conf.delta,
                "bias_correction": own.bias_correction, "lower_bound": own.lower_bound,
                "upper_bound": own.upper_bound}


__all__ = ["COUNT", "Updater", "create_updater", "fill_segment", "register_updater"]
