"""Param and ParamSet (SPEC §3): named arrays, their gradients, sharing, flat memory.

A :class:`ParamSet` keeps every owner Param's values in one contiguous buffer and every
Param's gradient in another (owners first, in the same layout as the values, then the
sharers'), with each Param a view into them. A slice of the job is then a ``(start, stop)``
range of the buffers, an update over many Params one kernel call, and a checkpoint a few
arrays.

Row-sparse tables (SPEC §10): a ParamSet made with ``tables=True`` makes every spec marked
``row_sparse`` (an embedding's table, say) that no Param shares a :class:`TableParam`. Its
values come after every dense owner's in the values buffer (servers slice them by rows), it
has no dense gradient — its gradient is rows by id (:meth:`TableParam.add_grad_rows`) — and
a worker's replica need not hold its values at all (``hold_tables=False``): it pulls the
rows it needs (:meth:`TableParam.rows`).
"""

from __future__ import annotations

import copy
import difflib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ParamError
from .config.job import ParamConf, ParamGenConf
from .config.parameter import changes
from .config.textformat import paused_gc
from .state import UpdaterState

_DTYPES = {np.dtype(np.float32), np.dtype(np.float64)}


def _dtype(dtype: Any) -> np.dtype[Any]:
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise ParamError(f"Param dtype must be float32 or float64, not {dt}")
    return dt


def _shape(shape: Any, name: str) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        raise ParamError(f"Param '{name}': shape must be non-negative integers, not {shape}")
    return tuple(int(d) for d in shape)


class Param:
    """A named array of parameters with its gradient.

    ``Param("w", (3, 4))`` makes one on its own, with its own memory; a :class:`ParamSet`
    makes them as views of its flat buffers. A sharer (``share_from``) views its owner's
    values and has its own gradient.
    """

    # A ParamSet may hold a million Params, so a Param is a few slots, and what it views of
    # its set (values, gradient, version, updater state) and its own copy of a configuration
    # it shares with other Params are made when first asked for (``__dict__`` stays, so
    # that users may still set attributes of their own).
    __slots__ = ("__dict__", "__weakref__", "_at", "_conf", "_data", "_grad", "_idx",
                 "_own_conf", "_set", "_state", "_version", "dtype", "name", "owner", "shape")

    #: A row-sparse table (:class:`TableParam`).
    row_sparse = False

    def __init__(self, name: str, shape: Sequence[int] | int, dtype: Any = np.float32,
                 conf: ParamConf | None = None, *, data: np.ndarray | None = None,
                 grad: np.ndarray | None = None, owner: Param | None = None):
        self.name = name
        self.shape = _shape(shape, name)
        self.dtype = _dtype(dtype)
        self._conf = conf if conf is not None else ParamConf(name=name)
        self._own_conf = True
        self.owner = owner
        self._set: ParamSet | None = None
        self._idx = self._at = 0
        self._data: np.ndarray | None = (np.zeros(self.shape, self.dtype) if data is None
                                         else self._fit(data, "data"))
        self._grad: np.ndarray | None = (np.zeros(self.shape, self.dtype) if grad is None
                                         else self._fit(grad, "grad"))
        self._version = 0
        self._state: UpdaterState | None = None

    @classmethod
    def _member(cls, pset: ParamSet, name: str, shape: tuple[int, ...], conf: ParamConf,
                own_conf: bool, idx: int, at: int, owner: Param | None = None) -> Any:
        """A Param of ``pset``: its ``idx``-th owner, values and gradient at ``at`` of the
        set's buffers, or a sharer of ``owner``, its gradient at ``at``. Made without
        checks (the set has checked every Param at once) and without views (made when
        first asked for). ``own_conf``: ``conf`` is this Param's alone (else it is shared,
        and :attr:`conf` makes the Param a copy of its own when first asked for)."""
        p = cls.__new__(cls)
        p.name, p.shape, p.dtype = name, shape, pset.dtype
        p._conf, p._own_conf, p.owner = conf, own_conf, owner
        p._set, p._idx, p._at = pset, idx, at
        p._data = p._grad = p._state = None
        p._version = 0
        return p

    # ``data`` and ``grad`` are views into the flat buffers that servers, kernels and
    # checkpoints read: ``p.grad = g`` copies g into that memory (replacing the view would
    # leave the buffers, and so the update, unchanged).

    @property
    def data(self) -> np.ndarray:
        """The values: a view of the ParamSet's flat buffer (the owner's, for a sharer)."""
        data = self._data
        if data is None:
            if self.owner is not None:
                data = self.owner.data.reshape(self.shape)
            else:
                data = _view(self._set.values, self._at, self.shape)  # type: ignore[union-attr]
            self._data = data
        return data

    @data.setter
    def data(self, value: Any) -> None:
        self._write("data", self.data, value)

    @property
    def grad(self) -> np.ndarray:
        """The gradient: a view of the ParamSet's flat gradient buffer."""
        grad = self._grad
        if grad is None:
            grad = self._grad = _view(self._set.grads, self._at, self.shape)  # type: ignore[union-attr]
        return grad

    @grad.setter
    def grad(self, value: Any) -> None:
        self._write("grad", self.grad, value)

    @property
    def conf(self) -> ParamConf:
        """This Param's configuration (SINGA's ``param { }``), its name this Param's, and a
        sharer's ``share_from`` its owner; changes to it are this Param's alone."""
        if not self._own_conf:
            conf = self._conf.copy()
            conf.__dict__["name"] = self.name
            if self.owner is not None:
                conf.__dict__["share_from"] = self.owner.name
            self._conf, self._own_conf = conf, True
        return self._conf

    @conf.setter
    def conf(self, conf: ParamConf) -> None:
        self._conf, self._own_conf = conf, True
        if self._set is not None:
            self._set._scales = None  # its lr_scale and wd_scale may be others

    @property
    def init_conf(self) -> ParamGenConf:
        """``conf.init``, read without making the Param its own copy of a configuration it
        shares (what :func:`~paramserver.init.init_params` reads for a million Params)."""
        return self._conf.init  # type: ignore[no-any-return]

    def _write(self, role: str, into: np.ndarray, value: Any) -> None:
        """``p.data = x`` / ``p.grad = g``: write the values into this Param's memory."""
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise ParamError(f"Param '{self.name}': cannot assign {type(value).__name__} to "
                             f"{role}: {e}") from None
        if arr.shape != self.shape and arr.size != 1:
            raise ParamError(f"Param '{self.name}': cannot assign an array of shape "
                             f"{arr.shape} to {role} of shape {self.shape}")
        if arr.dtype.kind not in "iuf":
            raise ParamError(f"Param '{self.name}': cannot assign {arr.dtype} values to "
                             f"{role} ({self.dtype})")
        into[...] = arr

    def _fit(self, a: np.ndarray, role: str) -> np.ndarray:
        """Memory given for ``role``: fills and updates work on it in place, as one block."""
        if not isinstance(a, np.ndarray):
            raise ParamError(f"Param '{self.name}': {role} must be a numpy array, "
                             f"not {type(a).__name__}")
        if a.shape != self.shape:
            raise ParamError(f"Param '{self.name}': {role} has shape {a.shape}, "
                             f"expected {self.shape}")
        if a.dtype != self.dtype:
            raise ParamError(f"Param '{self.name}': {role} has dtype {a.dtype}, "
                             f"expected {self.dtype}")
        if not a.flags.c_contiguous:
            raise ParamError(f"Param '{self.name}': {role} must be C-contiguous (it is "
                             "filled and updated in place as one block)")
        return a

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def lr_scale(self) -> float:
        return float(self._conf.lr_scale)

    @property
    def wd_scale(self) -> float:
        return float(self._conf.wd_scale)

    @property
    def is_owner(self) -> bool:
        return self.owner is None

    @property
    def version(self) -> int:
        """Updates applied to the values; a sharer reports its owner's."""
        if self.owner is not None:
            return self.owner.version
        return int(self._set._versions[self._idx]) if self._set is not None else self._version

    @version.setter
    def version(self, value: int) -> None:
        if self.owner is not None:
            raise ParamError(f"Param '{self.name}' shares '{self.owner.name}': "
                             "its version is the owner's")
        if self._set is not None:
            self._set._versions[self._idx] = int(value)
        else:
            self._version = int(value)

    @property
    def updater_state(self) -> UpdaterState | None:
        """Its updater state (an owner's), made by the updater that first updates it: its
        segment of the ParamSet's :attr:`~ParamSet.updater_state` once the set has one,
        unless it was given one of its own."""
        if self._state is not None or self._set is None or self.owner is not None:
            return self._state
        held = self._set.updater_state
        return None if held is None else held.segments(self._idx, self._idx + 1)

    @updater_state.setter
    def updater_state(self, state: UpdaterState | None) -> None:
        self._state = state
        if self._set is not None and self.owner is None:
            if state is None:
                self._set._own_states.discard(self._idx)
            else:
                self._set._own_states.add(self._idx)

    @property
    def fan_in(self) -> int:
        """``shape[1]`` of a 2-D Param, as SINGA counts it."""
        return self._require_2d("fan_in")[1]

    @property
    def fan_out(self) -> int:
        """``shape[0]`` of a 2-D Param."""
        return self._require_2d("fan_out")[0]

    def _require_2d(self, what: str) -> tuple[int, ...]:
        if len(self.shape) != 2:
            raise ParamError(f"Param '{self.name}' has shape {self.shape}: {what} needs a 2-D "
                             "Param (rows = fan_out, columns = fan_in)")
        return self.shape

    def __repr__(self) -> str:
        share = f", owner={self.owner.name!r}" if self.owner is not None else ""
        return (f"Param({self.name!r}, shape={self.shape}, dtype={self.dtype.name}, "
                f"version={self.version}{share})")


def _view(buffer: np.ndarray, at: int, shape: tuple[int, ...]) -> np.ndarray:
    """The ``shape`` view of ``buffer`` from ``at``."""
    return buffer[at:at + math.prod(shape)].reshape(shape)


#: Gradient values from which :func:`coalesce_rows` sums in a compiled loop.
_NUMBA_ROWS = 1 << 12


def coalesce_rows(ids: np.ndarray, rows: np.ndarray, dim: int, dtype: Any
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Rows by id with each id once: the sorted ids, and per id the sum of its rows in the
    order given (``((a + b) + c)``: a fixed order, the same sum on every run)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    rows = np.asarray(rows).reshape(ids.size, dim)
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, np.ascontiguousarray(rows, dtype)
    union, at = np.unique(ids, return_inverse=True)
    if union.size == ids.size:  # only out of order
        order = np.argsort(ids, kind="stable")
        return ids[order], np.ascontiguousarray(rows[order], dtype)
    out = np.zeros((union.size, dim), dtype)
    if rows.dtype != out.dtype or rows.size < _NUMBA_ROWS:
        np.add.at(out, at, rows)  # one row after the other, in the order given
        return union, out
    from .numerics.rows import sum_rows_in_order  # the same sums, without add.at's dispatch

    order = np.argsort(at, kind="stable")
    bounds = np.searchsorted(at[order], np.arange(union.size + 1)).astype(np.int64)
    sum_rows_in_order(np.ascontiguousarray(rows), order, bounds, out)
    return union, out


class TableParam(Param):
    """A row-sparse table (SPEC §10): rows first (``shape[0]``), each of ``dim`` values.

    Its values may be held (a view of the ParamSet's buffer) or not (a worker's replica:
    :attr:`data` is then an error); :meth:`rows` reads rows by id — through :attr:`fetch`
    when a worker has set it (the servers' rows), else from the values held. Its gradient is
    rows by id, added with :meth:`add_grad_rows` and summed per id by
    :meth:`take_grad_rows`; it has no dense ``grad``.
    """

    __slots__ = ("fetch", "grad_rows")

    row_sparse = True

    def __init__(self, name: str, shape: Sequence[int] | int, dtype: Any = np.float32,
                 conf: ParamConf | None = None, *, data: np.ndarray | None = None):
        self.name = name
        self.shape = _shape(shape, name)
        if len(self.shape) < 1:
            raise ParamError(f"Param '{name}': a row-sparse table has rows (shape[0])")
        self.dtype = _dtype(dtype)
        self._set = None
        self._idx = self._at = 0
        self.conf = conf if conf is not None else ParamConf(name=name)
        self.owner = None
        self._data = None if data is None else self._fit(data, "data")
        self._grad = None
        self._version = 0
        self._state = None
        #: The row-sparse gradient added since the last :meth:`zero_grad`: ``(ids, rows)``.
        self.grad_rows: list[tuple[np.ndarray, np.ndarray]] = []
        #: ``fetch(name, ids)``: the rows ``ids`` (unique, sorted) from where they are held.
        self.fetch: Any = None

    @classmethod
    def _member(cls, pset: ParamSet, name: str, shape: tuple[int, ...], conf: ParamConf,
                own_conf: bool, idx: int, at: int, owner: Param | None = None) -> Any:
        """As :meth:`Param._member`; the values viewed at once when the set holds them
        (``data`` of a table that is not held is an error, not a view made late)."""
        t = super()._member(pset, name, shape, conf, own_conf, idx, at)
        if pset.holds_tables:
            t._data = _view(pset.values, at, shape)
        t.grad_rows, t.fetch = [], None
        return t

    @property
    def dim(self) -> int:
        """Values per row."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def num_rows(self) -> int:
        return int(self.shape[0])

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            raise ParamError(f"Param '{self.name}' is a row-sparse table held by the servers; "
                             "a worker reads its rows by id (rows(ids))")
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._write("data", self.data, value)

    @property
    def grad(self) -> np.ndarray:
        raise ParamError(f"Param '{self.name}' is a row-sparse table: its gradient is rows by "
                         "id (add_grad_rows), it has no dense gradient")

    @grad.setter
    def grad(self, value: Any) -> None:
        self.grad  # noqa: B018 (the error)

    def rows(self, ids: Any) -> np.ndarray:
        """Rows ``ids`` (any order, repeats allowed): ``len(ids) × dim`` values, a copy."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_rows):
            bad = ids[(ids < 0) | (ids >= self.num_rows)][0]
            raise ParamError(f"Param '{self.name}': row id {int(bad)} is outside the table's "
                             f"rows [0, {self.num_rows})")
        if self.fetch is None:
            return self.data.reshape(self.num_rows, self.dim)[ids]
        unique, at = np.unique(ids, return_inverse=True)
        got = np.asarray(self.fetch(self.name, unique)).reshape(unique.size, self.dim)
        return got[at]

    def add_grad_rows(self, ids: Any, rows: Any) -> None:
        """Add gradient rows (``rows[i]`` for row ``ids[i]``; repeats are summed)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        rows = np.asarray(rows, self.dtype).reshape(ids.size, self.dim)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_rows):
            raise ParamError(f"Param '{self.name}': gradient rows outside the table's rows "
                             f"[0, {self.num_rows})")
        self.grad_rows.append((ids, rows))

    def take_grad_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The gradient rows added so far, summed per id (sorted ids); they are cleared."""
        parts, self.grad_rows = self.grad_rows, []
        if not parts:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), self.dtype)
        if len(parts) == 1:
            return coalesce_rows(parts[0][0], parts[0][1], self.dim, self.dtype)
        return coalesce_rows(np.concatenate([p[0] for p in parts]),
                             np.concatenate([p[1] for p in parts]), self.dim, self.dtype)

    def zero_grad(self) -> None:
        self.grad_rows = []

    def __repr__(self) -> str:
        held = "" if self._data is not None else ", not held"
        return (f"TableParam({self.name!r}, shape={self.shape}, dtype={self.dtype.name}, "
                f"version={self.version}{held})")


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """What a Param needs before memory exists: name, shape, configuration, and its place.
    ``row_sparse``: a table whose gradient is rows by id (an embedding's), made a
    :class:`TableParam` by a ParamSet with tables.

    ``conf_shared``: ``conf`` is shared by many specs (those :func:`plan_params` makes from
    tuples given the same configuration) and names none of them (the spec's ``name`` is the
    name); each Param made from it gets a copy of its own, named, when it first asks for its
    :attr:`Param.conf`. Otherwise the Param's configuration is ``conf`` itself."""

    name: str
    shape: tuple[int, ...]
    conf: ParamConf
    place: str  # e.g. "layer 'fc1', param 0": where errors point
    row_sparse: bool = False
    conf_shared: bool = False


class ParamSet:
    """The Params of a job in flat buffers; see the module docstring.

    Args:
        items: the Params' specs (``ParamSpec``, ``(name, shape)`` or ``(name, shape,
            conf)``; see :func:`plan_params`), or their plan.
        dtype: float32 or float64.
        alloc: makes the two flat buffers: ``alloc(n, dtype)`` gives a C-contiguous array
            of ``n`` zeros (pinned host memory for transfers to a GPU, say); default NumPy's.
        tables: make the specs marked ``row_sparse`` that no Param shares tables.
        hold_tables: keep the tables' values (False: a worker's replica, ``values`` then
            holds the dense owners' only).

    Attributes:
        params: every Param, in declaration order.
        owners: the Params that own values (not sharers), in declaration order.
        values: one flat array with every owner's values.
        grads: one flat array with every Param's gradient, owners first.
        offsets: int64 array, ``offsets[i]:offsets[i + 1]`` is owner i's range of ``values``.
        num_shares: int64 array, for owner i the number of Params using its values (>= 1).
        updater_state: the updater state of the owners (one segment each; each owner's
            ``updater_state`` views its part), made by the updater that first updates them.
        idle: None, or per owner whether it got no gradient in the step about to be applied
            (its Params and sharers all took no part: torch's ``.grad is None``). Such an
            owner is not updated (SPEC section 5); the update (or a worker's push) takes the
            flags and sets this back to None.
        tables: the row-sparse tables (:class:`TableParam`), the last owners.
        dense_size: the values of the dense owners (a prefix of the values; all without
            tables). ``grads`` holds the dense owners' and the sharers' gradients.
    """

    def __init__(self, items: Iterable[ParamSpec | tuple[Any, ...]] | ParamPlan,
                 dtype: Any = np.float32, *, tables: bool = False, hold_tables: bool = True,
                 alloc: Callable[[int, np.dtype[Any]], np.ndarray] | None = None):
        self.dtype = _dtype(dtype)
        plan = items if isinstance(items, ParamPlan) else plan_params(items)
        is_table = plan.table_names() if tables else set()
        owners = plan.ordered_owners(tables)
        self.offsets = np.empty(len(owners) + 1, np.int64)
        self.offsets[0] = 0
        np.cumsum(np.fromiter((math.prod(s.shape) for s in owners), np.int64, len(owners)),
                  out=self.offsets[1:])
        total = plan.num_values
        self.dense_size = int(self.offsets[len(owners) - len(is_table)])
        self.with_tables = bool(tables)
        self.holds_tables = bool(hold_tables)
        plan.check_memory(self.dtype)
        try:
            num_values = total if hold_tables else self.dense_size
            num_grads = plan.num_grads - (total - self.dense_size)
            if alloc is None:
                self.values = np.zeros(num_values, self.dtype)
                self.grads = np.zeros(num_grads, self.dtype)
            else:  # memory of the caller's kind (pinned host memory, for transfers to a GPU)
                self.values = _fit_buffer(alloc(num_values, self.dtype), num_values, self.dtype)
                self.grads = _fit_buffer(alloc(num_grads, self.dtype), num_grads, self.dtype)
        except MemoryError:
            raise ParamError(plan.too_big(self.dtype)) from None
        self._versions = np.zeros(len(owners), np.int64)
        owner_of = plan.owner_of
        with paused_gc():
            self._populate(
                [(TableParam if is_table and s.name in is_table else Param, s.name, s.shape,
                  s.conf, not s.conf_shared) for s in owners],
                [(s.name, s.shape, owner_of[s.name], None, False) for s in plan.sharers],
                [s.name for s in plan.specs], len(is_table))

    def _populate(self, owners: list[tuple[type[Param], str, tuple[int, ...], ParamConf, bool]],
                  sharers: list[tuple[str, tuple[int, ...], str, ParamConf | None, bool]],
                  names: list[str], num_tables: int) -> None:
        """Make the Params: ``owners`` (class, name, shape, configuration, whether it is that
        Param's own) in the order of the values buffer, ``sharers`` (name, shape, owner's
        name, configuration or None, whether it is its own) in the order of their
        gradients, and :attr:`params` in the order of ``names``; the last ``num_tables``
        owners are tables. A sharer given no configuration takes its owner's (a copy, named
        as the sharer, is made when asked for)."""
        self._state: UpdaterState | None = None
        self._own_states: set[int] = set()  # owners holding updater state of their own
        self._scales: tuple[int, np.ndarray, np.ndarray] | None = None
        starts = self.offsets.tolist()
        by_name: dict[str, Param] = {}
        new, dtype = Param.__new__, self.dtype
        for i, (cls, name, shape, conf, own) in enumerate(owners):
            if cls is not Param:
                by_name[name] = cls._member(self, name, shape, conf, own, i, starts[i])
                continue
            p = by_name[name] = new(Param)  # Param._member, without a call per Param
            p.name, p.shape, p.dtype, p._conf, p._own_conf, p.owner = (name, shape, dtype,
                                                                        conf, own, None)
            p._set, p._idx, p._at, p._data, p._grad, p._state, p._version = (self, i,
                                                                             starts[i], None,
                                                                             None, None, 0)
        self.owners: list[Param] = list(by_name.values())
        self._sharers: list[Param] = []
        pos = self.dense_size
        for name, shape, owner_name, given, own in sharers:
            owner = by_name[owner_name]
            p = Param._member(self, name, shape, owner._conf if given is None else given, own,
                              owner._idx, pos, owner)
            by_name[name] = p
            self._sharers.append(p)
            pos += math.prod(shape)
        self.params: list[Param] = [by_name[n] for n in names]
        self.tables: list[TableParam] = [  # the last owners
            p for p in self.owners[len(self.owners) - num_tables:] if num_tables]  # type: ignore[misc]
        self._by_name = by_name
        #: per owner, whether it got no gradient in the step about to be applied (None: all
        #: did); :meth:`~paramserver.updaters.Updater.update_params` leaves those untouched
        self.idle: np.ndarray | None = None
        self.num_shares = np.bincount(np.fromiter((p._idx for p in self._sharers), np.int64,
                                                  len(self._sharers)),
                                      minlength=len(self.owners)).astype(np.int64) + 1

    # -- access -----------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Param:
        try:
            return self._by_name[name]
        except KeyError:
            raise ParamError(f"no Param named '{name}'{_did_you_mean(name, self._by_name)}"
                             ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Param]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def owner_index(self, name: str) -> int:
        """Position of a Param's owner among :attr:`owners`."""
        return self[name]._idx

    def _scales_of_owners(self) -> tuple[int, np.ndarray, np.ndarray]:
        """The owners' ``lr_scale`` and ``wd_scale``, read once and again only after a
        configuration changed (:func:`paramserver.config.parameter.changes`): an update of a
        million Params would otherwise spend more time reading them than updating."""
        now = changes()
        if self._scales is None or self._scales[0] != now:
            n = len(self.owners)
            self._scales = (now,
                            np.fromiter((p._conf.lr_scale for p in self.owners), np.float64, n),
                            np.fromiter((p._conf.wd_scale for p in self.owners), np.float64, n))
        return self._scales

    @property
    def lr_scales(self) -> np.ndarray:
        """Per owner, its ``lr_scale`` (a new array)."""
        return self._scales_of_owners()[1].copy()

    @property
    def wd_scales(self) -> np.ndarray:
        """Per owner, its ``wd_scale`` (a new array)."""
        return self._scales_of_owners()[2].copy()

    @property
    def versions(self) -> np.ndarray:
        """Per owner, its version (a new array)."""
        return self._versions.copy()

    def set_versions(self, versions: np.ndarray | int) -> None:
        """Set every owner's version: one number for all, or one per owner."""
        self._versions[...] = versions

    @property
    def updater_state(self) -> UpdaterState | None:
        """The owners' updater state (one segment each), made by the updater that first
        updates them; each owner's ``updater_state`` views its segment."""
        return self._state

    @updater_state.setter
    def updater_state(self, state: UpdaterState | None) -> None:
        # From now on every owner views its segment of this state: state an owner was given
        # of its own (an update of that Param alone) is let go.
        self._state = state
        for i in self._own_states:
            self.owners[i]._state = None
        self._own_states.clear()

    def owner_states(self) -> dict[int, UpdaterState]:
        """The owners that hold updater state of their own (not a segment of the set's), by
        position among :attr:`owners`."""
        return {i: self.owners[i]._state for i in sorted(self._own_states)}  # type: ignore[misc]

    # -- gradients --------------------------------------------------------------------------

    def owner_grads(self) -> np.ndarray:
        """The (dense) owners' gradient range of :attr:`grads` (a view)."""
        return self.grads[: self.dense_size]

    def sum_shared_grads(self) -> None:
        """Add every sharer's gradient into its owner's (in declaration order)."""
        for p in self._sharers:
            p.owner.grad += p.grad.reshape(p.owner.shape)  # type: ignore[union-attr]

    def zero_grads(self, keep: Iterable[Param] = ()) -> None:
        """Zero every gradient (the tables' too), except those of ``keep``: dense Params of
        this set whose gradients the caller is about to write whole (zeroing them first
        would be a pass over memory for nothing)."""
        spans = []
        for p in keep:
            if p._set is not self or isinstance(p, TableParam):
                raise ParamError(f"Param '{p.name}' is not a dense Param of this ParamSet")
            spans.append((p._at, p._at + p.size))
        at = 0
        for a, b in sorted(spans):
            if a > at:
                self.grads[at:a] = 0
            at = max(at, b)
        if at < self.grads.size:
            self.grads[at:] = 0
        for t in self.tables:
            t.zero_grad()

    def replica(self, values: np.ndarray | None = None) -> ParamSet:
        """A worker's copy: the same Params, layout and configurations, viewing ``values``
        (by default this set's own, the same memory) and with its own zeroed gradients.

        Versions start at this set's. Nothing of this set changes.
        """
        values = self.values if values is None else values
        total = int(self.offsets[-1])
        held = values.size == total if isinstance(values, np.ndarray) else True
        if (not isinstance(values, np.ndarray) or values.shape not in ((total,),
                                                                        (self.dense_size,))
                or values.dtype != self.dtype or not values.flags.c_contiguous):
            what = (f"{values.dtype} array of shape {values.shape}"
                    if isinstance(values, np.ndarray) else type(values).__name__)
            raise ParamError(f"replica values must be a C-contiguous {self.dtype} array of "
                             f"shape ({total},) (or ({self.dense_size},): the dense owners' "
                             f"without the tables), not {what}")
        rep = copy.copy(self)  # every attribute as it is; then what the replica has its own
        rep.values = values
        rep.holds_tables = held
        rep.grads = np.zeros_like(self.grads)
        rep._versions = self._versions.copy()
        with paused_gc():
            rep._populate(
                [(type(p), p.name, p.shape, p._conf, p._own_conf) for p in self.owners],
                [(p.name, p.shape, p.owner.name, p._conf, p._own_conf)  # type: ignore[union-attr]
                 for p in self._sharers],
                self.names, len(self.tables))
        return rep

    def __repr__(self) -> str:
        return (f"ParamSet({len(self.params)} params, {len(self.owners)} owners, "
                f"{self.values.size} values, {self.dtype.name})")


class ParamPlan:
    """What a :class:`ParamSet` will hold, worked out before any memory exists: each Param's
    owner and the owners' sizes. ``paramserver check`` reads it, so a job whose model would
    not fit is still checked, and a ParamSet is built from it.

    Attributes:
        specs: every Param, in declaration order.
        owner_of: each Param's owner name (its own for owners).
        owners, sharers: the specs of owners and of sharers, in declaration order.
        sizes: the owners' numbers of elements, in order.
    """

    def __init__(self, specs: list[ParamSpec]):
        self.specs = specs
        self.sharers = [s for s in specs if s.conf.share_from is not None]
        self.owner_of = _resolve_sharing(specs, self.sharers)
        self.owners = ([s for s in specs if s.conf.share_from is None] if self.sharers
                       else list(specs))
        self.sizes = [math.prod(s.shape) for s in self.owners]

    @property
    def num_values(self) -> int:
        """Elements of the values buffer (the owners')."""
        return sum(self.sizes)

    def table_names(self) -> set[str]:
        """The owners a ParamSet with tables makes row-sparse tables: those marked
        ``row_sparse`` that no Param shares (a shared table stays dense)."""
        shared = {self.owner_of[x.name] for x in self.sharers}
        return {s.name for s in self.owners
                if s.row_sparse and s.name not in shared and len(s.shape) >= 1}

    def ordered_owners(self, tables: bool = True) -> list[ParamSpec]:
        """The owners in the order of the values buffer: the dense ones, then (``tables``)
        the tables, each in declaration order."""
        names = self.table_names() if tables else set()
        return ([s for s in self.owners if s.name not in names]
                + [s for s in self.owners if s.name in names])

    def server_sizes(self, tables: bool = True) -> tuple[list[int], list[int]]:
        """The owners' sizes in the values buffer's order, and each one's values per row
        (a table's; 0 for a dense owner): what servers slice."""
        names = self.table_names() if tables else set()
        owners = self.ordered_owners(tables)
        return ([math.prod(s.shape) for s in owners],
                [math.prod(s.shape[1:]) if s.name in names else 0 for s in owners])

    @property
    def num_grads(self) -> int:
        """Elements of the gradient buffer (every Param's: owners', then sharers')."""
        return self.num_values + sum(math.prod(s.shape) for s in self.sharers)

    def nbytes(self, dtype: Any = np.float32) -> int:
        """Bytes of the values and gradient buffers in ``dtype``."""
        return (self.num_values + self.num_grads) * np.dtype(dtype).itemsize

    def too_big(self, dtype: Any, available: int | None = None) -> str:
        """The message for a model whose buffers cannot be allocated."""
        dt = np.dtype(dtype)
        big = sorted(self.specs, key=lambda s: -math.prod(s.shape))[:3]
        largest = ", ".join(f"'{s.name}' {'x'.join(map(str, s.shape))} ({s.place})"
                            for s in big)
        have = f"; this machine has {_bytes(available)} of memory" if available else ""
        return (f"the model does not fit in memory: its Params hold {self.num_values:,} values "
                f"and {self.num_grads:,} gradient elements, {_bytes(self.nbytes(dt))} in "
                f"{dt.name}{have} (largest: {largest})")

    def check_memory(self, dtype: Any) -> None:
        """Refuse, before allocating, buffers larger than the machine's physical memory
        (where the system lets memory be promised beyond it, the allocation would succeed
        and the process be killed later, when initialisation touches the pages)."""
        available = physical_memory()
        if available is not None and self.nbytes(dtype) > available:
            raise ParamError(self.too_big(dtype, available))


def plan_params(items: Iterable[ParamSpec | tuple[Any, ...]]) -> ParamPlan:
    """The :class:`ParamPlan` of Param specs (or ``(name, shape[, conf])`` tuples); every
    naming and sharing error at once, and no memory allocated."""
    with paused_gc():
        return ParamPlan(_SpecMaker().specs(items))


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _bytes(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} bytes" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


class _SpecMaker:
    """Specs from ``(name, shape)`` and ``(name, shape, conf)`` tuples, at a few µs each
    (a model may declare a million Params): the Params given the same configuration (one
    ``ParamConf`` object, equal dicts, or none) share one copy of it, parsed and checked once
    and named by none of them (each Param's :attr:`Param.conf`, named, is made from it when
    asked for), and the Params of one shape one tuple."""

    def __init__(self) -> None:
        # key -> (what the key stands for, kept alive so that an id is not reused; the conf)
        self._confs: dict[Any, tuple[Any, ParamConf]] = {}
        self._shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def specs(self, items: Iterable[ParamSpec | tuple[Any, ...]]) -> list[ParamSpec]:
        """The specs of ``items`` (specs as they are), in order; one loop, the common case
        (a name, a tuple of ints seen before, a configuration seen before) without a call."""
        out: list[ParamSpec] = []
        append = out.append
        shapes, confs = self._shapes, self._confs
        for index, item in enumerate(items):
            if isinstance(item, ParamSpec):
                append(item)
                continue
            if len(item) not in (2, 3):
                raise ParamError(f"param {index}: expected (name, shape) or (name, shape, "
                                 "conf)")
            name, shape = item[0], item[1]
            given = item[2] if len(item) == 3 else None
            many_dims = (len(shape) if type(shape) is tuple else _ndim(shape)) >= 2
            found = confs.get(many_dims) if given is None else None
            if found is not None:
                conf, conf_name = found[1], None
            else:
                conf, conf_name = self._conf(given, many_dims)
            name = name or conf_name
            if not name:
                raise ParamError(f"param {index}: a name is needed")
            try:
                known = shapes.get(shape) if type(shape) is tuple else None
            except TypeError:  # not hashable: not a good shape either
                known = None
            if known is not shape:  # not this very tuple, checked before
                shape = self._shape(shape, name)
                if many_dims != (len(shape) >= 2):  # a shape that reads as one only once made
                    conf = self._conf(given, len(shape) >= 2)[0]
            append(ParamSpec(name, shape, conf, f"param {index}", conf_shared=True))
        return out

    def _conf(self, given: Any, many_dims: bool) -> tuple[ParamConf, str | None]:
        """The shared configuration for ``given`` (a ParamConf, a dict or None) on a Param of
        two or more dimensions or not (the default ``init`` differs), and the name it gives."""
        if given is None:
            key: Any = many_dims
        elif isinstance(given, ParamConf):
            key = ("conf", id(given))
        elif isinstance(given, dict) and "name" not in given:
            try:
                key = ("dict", _frozen(given), many_dims and "init" not in given)
                hash(key)
            except TypeError:  # a value that cannot be a key: parsed on its own
                key = None
        else:
            key = None
        found = self._confs.get(key) if key is not None else None
        if found is not None:
            return found[1], None if given is None or isinstance(given, dict) else given.name
        conf = (given.copy() if isinstance(given, ParamConf)  # the caller's stays as it is
                else ParamConf.parse(given) if isinstance(given, dict) else ParamConf())
        name = conf.name
        conf.__dict__["name"] = None
        given_init = isinstance(given, ParamConf) or (isinstance(given, dict) and "init" in given)
        if not given_init and conf.share_from is None:
            conf.__dict__["init"] = python_default_init((0, 0) if many_dims else (0,))
        if key is not None:
            self._confs[key] = (given, conf)
        return conf, name

    def _shape(self, shape: Any, name: str) -> tuple[int, ...]:
        """:func:`_shape`, one tuple per shape (kept under itself: the very tuple, met again,
        is known to be good)."""
        if not (type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape)):
            shape = _shape(shape, name)
        return self._shapes.setdefault(shape, shape)


def _ndim(shape: Any) -> int:
    """The number of dimensions ``shape`` will have, if it is well formed (an int: 1)."""
    if isinstance(shape, (int, np.integer)):
        return 1
    try:
        return len(shape)
    except TypeError:
        return 0


def _frozen(x: Any) -> Any:
    """A hashable key for a configuration dict: equal only for equal keys, values and value
    types (1, 1.0 and True parse alike, or not, depending on the field)."""
    if isinstance(x, dict):
        return (dict, tuple((k, _frozen(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_frozen(v) for v in x))
    return (type(x), x)


def _fit_buffer(a: np.ndarray, n: int, dtype: np.dtype[Any]) -> np.ndarray:
    if (not isinstance(a, np.ndarray) or a.shape != (n,) or a.dtype != dtype
            or not a.flags.c_contiguous):
        raise ParamError(f"alloc must give a C-contiguous {dtype} array of {n} zeros")
    return a


def python_default_init(shape: tuple[int, ...]) -> ParamGenConf:
    """The ``init`` of a Param declared in Python (``(name, shape)`` or a dict without
    ``init``): Keras' defaults, ``glorot_uniform`` for two or more dimensions and ``zeros``
    otherwise. **Decision:** SINGA's default, constant 1, would make every unit of a weight
    matrix equal for good; job files (and ``ParamConf`` objects) keep it."""
    return ParamGenConf.parse({"type": "glorot_uniform" if len(shape) >= 2 else "zeros"})


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _resolve_sharing(specs: list[ParamSpec], sharers: list[ParamSpec]) -> dict[str, str]:
    """Each Param's owner name (its own for owners); every sharing error at once.
    ``sharers``: the specs that name a ``share_from``."""
    problems: list[str] = []
    spec_of = {s.name: s for s in specs}
    if len(spec_of) != len(specs):
        place: dict[str, str] = {}
        for s in specs:
            if s.name in place:
                problems.append(f"Param name '{s.name}' is used twice: {place[s.name]} and "
                                f"{s.place}")
            else:
                place[s.name] = s.place
    owner_of = ({s.name: s.name for s in specs if s.conf.share_from is None} if sharers
                else {name: name for name in spec_of})
    for s in sharers:
        chain, cur = [s.name], s
        while cur.conf.share_from is not None:
            target = cur.conf.share_from
            if target in owner_of:  # resolved already: a chain is walked once
                cur = spec_of[owner_of[target]]
                continue
            if target not in spec_of:
                problems.append(f"Param '{cur.name}' ({cur.place}) shares from unknown Param "
                                f"'{target}'{_did_you_mean(target, spec_of)}")
                break
            if target in chain:
                order = {name: i for i, name in enumerate(spec_of)}  # first places
                cycle = chain[chain.index(target):]
                first = min(range(len(cycle)), key=lambda i: order[cycle[i]])
                cycle = cycle[first:] + cycle[:first]  # one spelling per cycle, reported once
                problems.append("share_from cycle: " + " -> ".join([*cycle, cycle[0]]))
                break
            chain.append(target)
            cur = spec_of[target]
        else:
            owner_of[s.name] = cur.name
            size, owner_size = math.prod(s.shape), math.prod(cur.shape)
            if size != owner_size:
                problems.append(f"Param '{s.name}' ({s.place}) has shape {s.shape} "
                                f"({size} elements) but shares from '{cur.name}' with shape "
                                f"{cur.shape} ({owner_size} elements); the counts must be equal")
    if problems:
        raise ParamError(dict.fromkeys(problems))
    return owner_of


__all__ = ["Param", "ParamPlan", "ParamSet", "ParamSpec", "TableParam", "coalesce_rows",
           "physical_memory", "plan_params", "python_default_init"]
