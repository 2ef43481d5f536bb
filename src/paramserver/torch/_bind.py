"""A torch module's parameters as paramserver Params, in one memory.

:func:`bind` lays the parameters out in a :class:`~paramserver.params.ParamSet` (one flat
buffer of owner values, one of gradients) and points every ``torch.nn.Parameter`` at its
place there: ``p.data`` becomes a view of the values, and ``p.grad`` -- None until autograd
writes it, as in torch -- a view of the gradients from the first step that finds a gradient
(:meth:`BoundTensors.attach_grads`). Autograd then accumulates into paramserver's gradient
buffer in place, and an update of the flat values is seen by the module at once.

Sharing (``share_from``) makes the sharer's tensor a view of its owner's values, reshaped
(row-major) to the sharer's shape, with a gradient of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..config import ParamError
from ..config.errors import Problem
from ..config.job import ParamConf
from ..params import Param, ParamSet, ParamSpec
from ..state import UpdaterState
from ..tensors import attach, views
from ..updaters import Updater
from ._rules import RulesLike, parse_rules, resolve

NamedParams = Iterable[tuple[str, torch.Tensor]]

_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}

#: The binding each tensor belongs to now (a tensor is in at most one).
_BOUND: WeakIdKeyDictionary = WeakIdKeyDictionary()


class BoundTensors:
    """What every binding of tensors to flat memory has: the tensors by name, their views of
    the flat values and gradients, and the checks that they still view them.

    The memory is the subclass's: host memory (:class:`TorchParams`), a device's
    (:class:`~paramserver.torch._device.DeviceParams`), or device tensors beside an fp32
    master on the host (:class:`~paramserver.torch._offload.OffloadParams`, which keeps
    no views). Subclasses set ``pset``, ``values``, ``grads`` and call :meth:`_set_views`.
    """

    pset: ParamSet
    values: torch.Tensor
    grads: torch.Tensor
    names: list[str]
    tensors: list[torch.Tensor]
    #: whether the tensors show the values at a lower precision than :attr:`pset` holds
    #: them (offloaded bfloat16 or float16 parameters with an fp32 master)
    lossy: bool = False

    def _set_views(self, names: list[str], tensors: list[torch.Tensor],
                   value_views: list[torch.Tensor],
                   grad_views: Sequence[torch.Tensor | None], *, keep_grads: bool) -> None:
        """Point every tensor's ``.data`` at its view of the values.

        With ``keep_grads`` (a user's tensors, bound for an optimizer) ``.grad`` stays as it
        is -- None until autograd writes it, as in torch; a dense gradient already there is
        copied into the buffer and the view takes its place -- and :meth:`attach_grads`
        makes it the view of the flat gradients at the first step it holds a gradient; from
        then on autograd adds into the flat buffer. Without (a cluster worker's replica,
        whose gradient buffer is the truth and whose idle parameters are told by hooks,
        :meth:`watch_grads`) every ``.grad`` is the view at once. A row-sparse table's
        tensor (SPEC §10) has no gradient view (None): a worker's replica computes with the
        rows of its batch (``torch/_tables.py``)."""
        self.names = names
        self.tensors = tensors
        self._index = {id(t): i for i, t in enumerate(tensors)}
        self._value_views = value_views
        self._grad_views = list(grad_views)
        self._ptrs = [v.data_ptr() for v in value_views]
        with torch.no_grad():
            for t, v, g in zip(tensors, value_views, grad_views, strict=True):
                old = t.grad
                if g is None or (keep_grads and old is None):
                    attach(t, v, None if g is None else old)
                elif keep_grads and old is not None and old.is_sparse \
                        and old.shape == g.shape:
                    attach(t, v, old)  # as it is: step() takes its rows
                else:
                    if keep_grads and old is not None and old.shape == g.shape:
                        g.copy_(old.detach())  # a gradient already there is kept
                    attach(t, v, g)

    # -- access -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(zip(self.names, self.tensors, strict=True))

    def name_of(self, tensor: torch.Tensor) -> str:
        """The name a tensor of this binding has."""
        i = self._index.get(id(tensor))
        if i is None or self.tensors[i] is not tensor:
            raise ParamError("the tensor is not one of this binding's")
        return self.names[i]

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[self.names.index(name)]
        except ValueError:
            self.pset[name]  # raises with a did-you-mean
            raise

    def param(self, name: str) -> Param:
        """The Param named ``name``."""
        return self.pset[name]

    @property
    def num_owner_values(self) -> int:
        return int(self.pset.offsets[-1])

    # -- keeping the tensors on the flat memory ---------------------------------------------

    def check(self) -> None:
        """Raise if a tensor no longer views the flat values (moved, cast, or re-assigned)."""
        for name, t, ptr, v in zip(self.names, self.tensors, self._ptrs, self._value_views,
                                   strict=True):
            if t.data_ptr() != ptr or t.shape != v.shape or t.dtype != v.dtype:
                raise ParamError(
                    f"parameter '{name}' no longer views paramserver's memory (was the module "
                    f"moved with .to()/.cuda(), cast, or the parameter re-assigned after "
                    f"binding?); bind the module again")

    #: Whether a sparse ``.grad`` (``nn.Embedding(sparse=True)``) of an unshared owner is
    #: kept as rows for a lazy update (:meth:`take_rows`) rather than made dense.
    lazy_rows: bool = False

    def attach_grads(self, lazy: bool = True) -> list[bool]:
        """Make every ``.grad`` a view of :attr:`grads`, keeping its gradient.

        A ``.grad`` that torch allocated (the first gradient a parameter gets, one after
        ``zero_grad()`` set it to None, or with ``create_graph=True``) is copied in and the
        view takes its place. A ``.grad`` that is None stays None (its part of the buffer
        reads as zero): that parameter got no gradient, and is not updated. A sparse
        ``.grad`` stays as it is (as torch keeps it): with ``lazy`` where the binding
        updates lazily (``lazy_rows``) its rows are kept for :meth:`take_rows`; otherwise
        it is copied in dense.

        Returns:
            For each tensor, whether its ``.grad`` was None (torch.optim skips those).
        """
        missing = [False] * len(self.tensors)
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        with torch.no_grad():
            for i, (t, g) in enumerate(zip(self.tensors, self._grad_views, strict=True)):
                cur = t.grad
                if cur is g or g is None:
                    continue
                if cur is None:
                    g.zero_()
                    missing[i] = True
                    continue
                if cur.is_sparse:
                    rows = self._rows_of(i, cur) if lazy and self.lazy_rows else None
                    if rows is not None:
                        self._rows[i] = rows
                        g.zero_()
                    else:
                        g.copy_(cur.detach().to_dense())
                    continue
                if cur.data_ptr() != g.data_ptr() or cur.stride() != g.stride():
                    g.copy_(cur.detach())
                t.grad = g
        return missing

    def _rows_of(self, i: int, grad: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
        """A sparse gradient of tensor ``i`` as ``(ids, rows)``, summed per id and sorted,
        when it is by rows (sparse in its first dimension) of an owner nobody shares."""
        p = self.pset[self.names[i]]
        if p.owner is not None or self.pset.num_shares[self.pset.owner_index(p.name)] > 1 \
                or grad.sparse_dim() != 1 or grad.dim() < 1:
            return None
        grad = grad.detach().coalesce()
        ids = grad.indices()[0].cpu().numpy().astype(np.int64)
        dim = int(np.prod(tuple(grad.shape[1:]), dtype=np.int64))
        rows = grad.values().reshape(len(ids), dim).to(self.values.dtype).cpu().numpy()
        return ids, np.ascontiguousarray(rows)

    def watch_grads(self) -> np.ndarray:
        """From now on, note per tensor whether autograd gives it a gradient (a hook on
        each; the flags are cleared at every call and returned, filled as backward runs).
        What tells a parameter that got no gradient from one whose gradient is zero while
        ``.grad`` stays a view of the flat buffer (a cluster worker's replica)."""
        got: np.ndarray | None = getattr(self, "_got", None)
        if got is None:
            got = self._got = np.zeros(len(self.tensors), bool)
            for i, t in enumerate(self.tensors):
                if t.requires_grad:
                    t.register_post_accumulate_grad_hook(functools.partial(_note, got, i))
        got[:] = False
        return got

    def idle_owners(self, got: np.ndarray, missing: Sequence[bool]) -> np.ndarray | None:
        """Per owner, whether none of its tensors got a gradient (``got`` from
        :meth:`watch_grads`, ``missing`` from :meth:`attach_grads`); None when all did."""
        idle = np.ones(len(self.pset.owners), bool)
        for i, name in enumerate(self.names):
            if got[i] and not missing[i]:
                idle[self.pset.owner_index(name)] = False
        for t in self.pset.tables:  # a table's gradient travels as its rows
            idle[self.pset.owner_index(t.name)] = False
        return idle if idle.any() else None

    def take_rows(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """The sparse gradients :meth:`attach_grads` kept, by owner index: ``(ids, rows)``."""
        rows = getattr(self, "_rows", {})
        self._rows = {}
        return {self.pset.owner_index(self.names[i]): r for i, r in rows.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch.optim's: every ``.grad`` set to None (the default), or zeroed in place
        (``set_to_none=False``: the views of the flat buffer in one pass; a ``.grad`` that is
        None stays None).

        Keeping the views (``set_to_none=False``) lets autograd add straight into the flat
        buffer; after None it allocates a gradient, which ``step()`` copies in. Either way a
        parameter whose ``.grad`` is None at ``step()`` (one that never had a gradient, or
        had it set to None) is not updated, as torch.optim skips it, and one with a zero
        gradient is."""
        with torch.no_grad():
            if set_to_none:
                for t, g in zip(self.tensors, self._grad_views, strict=True):
                    if g is not None:
                        t.grad = None
                return
            views = 0
            for t, g in zip(self.tensors, self._grad_views, strict=True):
                cur = t.grad
                if g is None or cur is None:
                    continue
                if cur is g:
                    views += 1
                else:
                    cur.detach_().zero_()
            if views:
                self.grads.zero_()


def _note(got: np.ndarray, i: int, tensor: torch.Tensor) -> None:
    got[i] = True


class HostUpdates:
    """Updates in host memory, by paramserver's fused kernels: the placement protocol of
    :class:`paramserver.torch.Optimizer` for bindings whose values, gradients and state
    are a ParamSet's (:class:`TorchParams`, and the offloaded master of
    :class:`~paramserver.torch._offload.OffloadParams`)."""

    pset: ParamSet
    _shared: list[tuple[int, int]]

    def owner_grads(self) -> np.ndarray:
        """The owners' gradients with every sharer's gradient added in.

        Without sharers this is the owners' range of :attr:`grads` itself; with sharers, the
        sums are made in that range and :meth:`restore_grads` puts the owners' own
        gradients back after the update, so that ``.grad`` keeps what autograd computed.
        """
        pset = self.pset
        if self._shared:
            self._saved = [pset.grads[lo:hi].copy() for lo, hi in self._shared]
            pset.sum_shared_grads()
        return pset.owner_grads()

    def restore_grads(self) -> None:
        """Undo :meth:`owner_grads`'s sums (see there)."""
        saved = getattr(self, "_saved", None)
        if saved:
            for (lo, hi), arr in zip(self._shared, saved, strict=True):
                self.pset.grads[lo:hi] = arr
            self._saved = []

    # -- updates (paramserver.torch.Optimizer's placement protocol) -------------------------

    def sum_squares(self, updater: Updater, grads: np.ndarray, a: int, b: int,
                    state: UpdaterState, grad_scale: np.ndarray) -> float:
        """Owners ``a:b``'s part of the squared global gradient norm."""
        lo, hi = int(self.pset.offsets[a]), int(self.pset.offsets[b])
        return updater.grad_sum_squares(grads[lo:hi], state.offsets, grad_scale)

    def update(self, updater: Updater, step: int, grads: np.ndarray, a: int, b: int,
               state: UpdaterState, lr_scale: np.ndarray, wd: np.ndarray,
               grad_scale: np.ndarray, grad_norm: float | None,
               skip: np.ndarray | None = None) -> None:
        """One fused kernel call over owners ``a:b`` (a run of one updater), passing over
        those ``skip`` marks (no gradient)."""
        lo, hi = int(self.pset.offsets[a]), int(self.pset.offsets[b])
        updater.apply(step, self.pset.values[lo:hi], grads[lo:hi], state, lr_scale, wd,
                      grad_scale, grad_norm=grad_norm, skip=skip)

    def update_rows(self, updater: Updater, step: int, k: int, ids: np.ndarray,
                    rows: np.ndarray, state: UpdaterState, lr_scale: float, wd: float,
                    grad_scale: float) -> None:
        """A lazy update of owner ``k`` on the rows of its sparse gradient (SPEC section 10:
        only those rows, and their state, change)."""
        lo, hi = int(self.pset.offsets[k]), int(self.pset.offsets[k + 1])
        updater.apply_rows(step, self.pset.values[lo:hi], ids, rows, rows.shape[1], state,
                           lr_scale, wd, grad_scale)

    def finish(self) -> None:
        """Nothing to publish: the tensors view the updated values."""

    def ensure_state(self, state: UpdaterState) -> None:
        """The state lives in host memory, where the update runs."""

    def state_view(self, state: UpdaterState, role: str, lo: int, hi: int) -> torch.Tensor:
        return torch.from_numpy(state[role][lo:hi])

    def to_host(self, state: UpdaterState, values: bool = True) -> None:
        """Values and state are in host memory already."""

    def from_host(self, state: UpdaterState, values: bool = True) -> None:
        """Values and state are in host memory already."""

    def close(self) -> None:
        """Nothing to release."""



class TorchParams(HostUpdates, BoundTensors):
    """Torch tensors whose values and gradients live in a :class:`ParamSet`'s flat buffers.

    Made by :func:`bind`. Every tensor's ``.data`` views :attr:`values` (a sharer's its
    owner's part) and its ``.grad`` views :attr:`grads`.

    Attributes:
        pset: the ParamSet; its Params are named as the tensors are.
        names: the tensors' names, in the ParamSet's declaration order.
        tensors: the tensors, in the same order.
        values: the flat values as a torch tensor (shares memory with ``pset.values``).
        grads: the flat gradients as a torch tensor (shares memory with ``pset.grads``).
    """

    pset: ParamSet
    lazy_rows = True

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]],
                 confs: Mapping[str, ParamConf] | None = None, *,
                 initialise: Collection[str] = (), seed: int = 0,
                 pset: ParamSet | None = None, tables: Collection[str] = ()):
        names = [n for n, _ in named]
        tensors = [t for _, t in named]
        dtype = _check_tensors(names, tensors)
        keep_grads = pset is None
        if pset is not None:  # adopt a ParamSet's memory: the tensors take its values
            _check_same(pset, names, tensors)
        else:
            confs = confs or {}
            specs = [ParamSpec(n, tuple(t.shape), confs.get(n) or ParamConf(name=n),
                               f"parameter '{n}'", n in tables) for n, t in named]
            pset = ParamSet(specs, dtype, tables=bool(tables))
            by_name = dict(named)
            with torch.no_grad():
                for p in pset.owners:
                    p.data[...] = by_name[p.name].detach().numpy()
            _init(pset, set(initialise), seed)
        self.pset = pset
        self.values = torch.from_numpy(pset.values)
        self.grads = torch.from_numpy(pset.grads)
        # The owners whose gradients the sharers' are added into, by range of the owner
        # gradients; with their saved copy, :meth:`restore_grads` leaves ``.grad`` as it was.
        self._shared = [(int(pset.offsets[i]), int(pset.offsets[i + 1]))
                        for i, k in enumerate(pset.num_shares) if k > 1]
        held = {t.name for t in pset.tables}
        pairs = [views(pset, n) if n not in held else (torch.from_numpy(pset[n].data), None)
                 for n in names]
        self._set_views(names, tensors, [v for v, _ in pairs], [g for _, g in pairs],
                        keep_grads=keep_grads)
        for t in tensors:
            _BOUND[t] = self

    # -- replicas ---------------------------------------------------------------------------

    def replica(self, module_or_params: torch.nn.Module | NamedParams,
                values: np.ndarray | None = None) -> TorchParams:
        """Bind another instance of the module (same names and shapes) as a worker's copy.

        The replica's tensors view ``values`` -- by default this binding's own values, the
        same memory (an in-process worker) -- and have their own gradient buffer, laid out
        like :attr:`grads` (:meth:`ParamSet.replica`).
        """
        return TorchParams(_named(module_or_params), pset=self.pset.replica(values))

    @classmethod
    def on(cls, pset: ParamSet, module_or_params: torch.nn.Module | NamedParams) -> TorchParams:
        """Bind a module to an existing ParamSet (a cluster worker's replica, say).

        The module's parameters must have the ParamSet's names and shapes; they take its
        values (the same memory) and its gradients.
        """
        return cls(_named(module_or_params), pset=pset)

    def __repr__(self) -> str:
        return (f"TorchParams({len(self.tensors)} tensors, {len(self.pset.owners)} owners, "
                f"{self.num_owner_values} values, {self.values.dtype})")


def bind(module_or_params: torch.nn.Module | NamedParams, param_conf: RulesLike = None, *,
         seed: int = 0) -> TorchParams:
    """Put a module's parameters into paramserver's flat memory, configured by name pattern.

    Args:
        module_or_params: a ``torch.nn.Module`` (its ``named_parameters()``) or an iterable
            of ``(name, tensor)`` pairs. Tensors must be leaf, float32 or float64, on the
            CPU, all of one dtype.
        param_conf: per-parameter configuration (``lr_scale``, ``wd_scale``, ``init``,
            ``share_from``) by glob pattern over the names: a dict such as
            ``{"*.bias": {"lr_scale": 2, "wd_scale": 0}}``, a list of ``ParamConf``, the
            text of ``param { name: "*.bias" ... }`` blocks or a job file's, or a path.
        seed: the seed of paramserver's initialisation, used for the parameters a rule gives
            an ``init``; the others keep the module's values.

    Returns:
        The binding. Tensors keep their identity (``module.parameters()`` yields the same
        objects), so optimizers, hooks and ``state_dict`` go on working.

    Raises:
        ParamError: for a pattern that matches nothing, an unknown or cyclic ``share_from``,
            a sharer whose element count differs from its owner's, or a tensor that cannot
            live in host memory as float32/float64.
    """
    named = _named(module_or_params)
    resolved = resolve([n for n, _ in named], parse_rules(param_conf))
    return TorchParams(named, resolved.confs, initialise=resolved.initialised, seed=seed)


def binding_of(tensor: torch.Tensor) -> TorchParams | None:
    """The binding a tensor belongs to, if any."""
    found: TorchParams | None = _BOUND.get(tensor)
    return found


def _named(x: torch.nn.Module | NamedParams) -> list[tuple[str, torch.Tensor]]:
    if isinstance(x, torch.nn.Module):
        return list(x.named_parameters())
    out = []
    for i, item in enumerate(x):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise ParamError(f"item {i}: expected a (name, tensor) pair, "
                             f"not {type(item).__name__}")
        out.append((str(item[0]), item[1]))
    return out


def _check_tensors(names: list[str], tensors: list[torch.Tensor]) -> Any:
    problems = []
    if not tensors:
        problems.append("no parameters to bind")
    seen: dict[int, str] = {}
    for n, t in zip(names, tensors, strict=True):
        if id(t) in seen:
            problems.append(f"parameter '{n}' is the same tensor as '{seen[id(t)]}'; give it "
                            f"once (torch's own tying) or use share_from")
        seen[id(t)] = n
        if t.device.type != "cpu":
            problems.append(f"parameter '{n}' is on {t.device}: paramserver keeps parameters "
                            f"in host memory (bind the module before moving it, or keep it "
                            f"on the CPU)")
        elif t.dtype not in _DTYPES:
            problems.append(f"parameter '{n}' is {t.dtype}: paramserver's Params are float32 "
                            f"or float64")
        elif not t.is_leaf:
            problems.append(f"parameter '{n}' is not a leaf tensor")
    dtypes = {t.dtype for t in tensors if t.dtype in _DTYPES}
    if len(dtypes) > 1:
        problems.append(f"parameters of several dtypes {sorted(str(d) for d in dtypes)}: "
                        f"bind them separately or convert the module to one")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        problems.append(f"parameter names used twice: {dup}")
    if problems:
        raise ParamError(problems)
    return _DTYPES[tensors[0].dtype]


def _init(pset: ParamSet, names: set[str], seed: int) -> None:
    """Initialise the owners named, as :meth:`ParamSet.init` does all of them."""
    from ..init import create_param_generator, stream

    problems: list[Problem | str] = []
    for p in pset.owners:
        if p.name in names:
            try:
                create_param_generator(p.conf.init).fill(p, stream(seed, p.name))
            except ParamError as e:
                problems += e.at(f"init of '{p.name}'").problems
    for p in pset.params:
        if p.owner is not None and p.name in names:
            problems.append(f"parameter '{p.name}' shares the values of '{p.owner.name}': "
                            f"its init is the owner's; give init to '{p.owner.name}'")
    if problems:
        raise ParamError(problems)


def _check_same(pset: ParamSet, names: list[str], tensors: list[torch.Tensor]) -> None:
    """The tensors are the ParamSet's Params: the same names, shapes and dtype."""
    problems = []
    tables = {t.name for t in pset.tables}
    if names != pset.names and names != [n for n in pset.names if n not in tables]:
        problems.append(f"the module's parameters {names[:4]}... are not the ParamSet's "
                        f"{pset.names[:4]}...")
    else:
        want = torch.from_numpy(pset.values[:0]).dtype
        for n, t in zip(names, tensors, strict=True):
            if t.dtype != want:
                problems.append(f"parameter '{n}' is {t.dtype}, the ParamSet's {pset.dtype}")
            elif n in tables and not pset.holds_tables:
                problems.append(f"parameter '{n}' is a row-sparse table that this ParamSet "
                                "does not hold (a worker's): bind a module without it")
            elif tuple(t.shape) != pset[n].shape:
                problems.append(f"parameter '{n}' has shape {tuple(t.shape)}, the ParamSet's "
                                f"{pset[n].shape}")
    if problems:
        raise ParamError(problems)


__all__ = ["BoundTensors", "HostUpdates", "TorchParams", "bind", "binding_of"]
