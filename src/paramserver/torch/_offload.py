"""Offloading: a model on a GPU, its master values and updater state in paramserver's memory.

What ZeRO-Offload and DeepSpeed's CPU Adam do, on paramserver's own parts: the module keeps
its parameters where it computes (a CUDA device, in float32, bfloat16 or float16), while the
*master* values -- float32 (float64 for a float64 module) -- their gradients and the updater
state live in a :class:`~paramserver.params.ParamSet` in host memory, pinned for fast
transfers, and are updated there by the fused numba kernels, as a server updates its range.

A step's data flow:

1. backward: as soon as a parameter's gradient is complete, a hook
   (``register_post_accumulate_grad_hook``) copies it to the host buffer on a side stream,
   converting it to the master's type on the GPU: the copies overlap the rest of the
   backward pass. At the end of the backward pass the compute stream waits for those copies
   (without blocking the host), so that a further backward (gradient accumulation) cannot
   overwrite a gradient still being read.
2. ``step()``: waits for the copies; a gradient changed after its copy (by
   ``clip_grad_norm_``, ``GradScaler.unscale_``, or by hand: its version counter moved on),
   or set without a backward pass, is copied again then; a parameter whose ``.grad`` is None
   is skipped, as torch.optim skips it.
3. the update runs in pieces of about ``chunk`` values (the last ``chunk`` values in pieces
   of an eighth of that, so that the copy the GPU waits for after the host is done is
   short); as soon as a piece is updated, its values are copied back to the parameters
   (host to device, on another side stream, converted to the parameters' type on the GPU),
   while the host updates the next piece. The compute stream waits for those copies before
   the next forward pass.

On a CPU "device" (a bfloat16 module on the CPU with a float32 master, or for tests) the same
code runs with plain synchronous copies.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ..config import ParamError
from ..config.job import ParamConf
from ..params import ParamSet, ParamSpec
from ..state import UpdaterState
from ..updaters import Updater
from ._bind import _BOUND, BoundTensors, HostUpdates, _init

#: Values per piece of the update, each copied back to the device as soon as it is done.
CHUNK = 1 << 24


class OffloadParams(HostUpdates, BoundTensors):
    """Parameters on a device with their master values, gradients and updater state in
    (pinned) host memory; see the module docstring. A sparse gradient
    (``nn.Embedding(sparse=True)``) is taken at ``step()`` as rows, updated lazily on the
    host as the host binding's are.

    Args:
        named: ``(name, tensor)`` pairs: leaf floating-point tensors on one device.
        confs: each name's configuration (``lr_scale``, ``wd_scale``, ``init``, sharing).
        initialise: the names whose values paramserver's initialisation gives (the master is
            filled, then copied to the parameters); the others' masters take their values.
        seed: the seed of that initialisation.
        previous: an earlier offload binding of some of these tensors, whose masters are
            taken as they are (not read back from the lower-precision parameters).
        chunk: values per piece of the update (see the module docstring).
    """

    lazy_rows = True

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]],
                 confs: dict[str, ParamConf] | None = None, *, initialise: Any = (),
                 seed: int = 0, previous: OffloadParams | None = None, chunk: int = CHUNK):
        names = [n for n, _ in named]
        tensors = [t for _, t in named]
        _check(named)
        device = tensors[0].device
        master = torch.float64 if all(t.dtype == torch.float64 for t in tensors) \
            else torch.float32
        self.device = device
        self.cuda = device.type == "cuda"
        self.lossy = any(t.dtype != master for t in tensors)
        self.chunk = max(1, int(chunk))
        alloc = _pinned if self.cuda else None
        confs = confs or {}
        specs = [ParamSpec(n, tuple(t.shape), confs.get(n) or ParamConf(name=n),
                           f"parameter '{n}'") for n, t in named]
        pset = ParamSet(specs, np.float32 if master == torch.float32 else np.float64,
                        alloc=alloc)
        self.pset = pset
        self.values = torch.from_numpy(pset.values)
        self.grads = torch.from_numpy(pset.grads)
        self.names = names
        self.tensors = tensors
        self._index = {id(t): i for i, t in enumerate(tensors)}
        self._shared = [(int(pset.offsets[i]), int(pset.offsets[i + 1]))
                        for i, k in enumerate(pset.num_shares) if k > 1]
        self._masters = [torch.from_numpy(pset[n].data) for n in names]  # sharers: owner's
        self._host_grads = [torch.from_numpy(pset[n].grad) for n in names]
        self._kinds = [(t.device, t.dtype, tuple(t.shape)) for t in tensors]
        owner_index = {p.name: i for i, p in enumerate(pset.owners)}
        #: per owner, the tensors that show its values (the owner's and its sharers')
        self._shows: list[list[int]] = [[] for _ in pset.owners]
        #: per tensor, the owner whose master it shows
        self._owner_of = [owner_index[(pset[n].owner or pset[n]).name] for n in names]
        for i, k in enumerate(self._owner_of):
            self._shows[k].append(i)
        if previous is not None:
            previous.take_writes()  # what was written since its last step is the master
        with torch.no_grad():
            for p in pset.owners:
                t = tensors[self._index_of(p.name)]
                kept = previous._master_of(t) if previous is not None else None
                source = kept if kept is not None else t.detach()
                self._masters[self._index_of(p.name)].copy_(source.reshape(p.shape))
        init = set(initialise)
        if init:
            _init(pset, init, seed)
        if self.cuda:
            self._d2h = torch.cuda.Stream(device)
            self._h2d = torch.cuda.Stream(device)
        self._end_queued = False
        #: per tensor, the gradient last copied and its version then
        self._copied: list[tuple[Any, int] | None] = [None] * len(tensors)
        self._hooks = [t.register_post_accumulate_grad_hook(self._on_grad)
                       for t in tensors if t.requires_grad]
        self._publish(range(len(pset.owners)))
        if self.cuda:
            torch.cuda.current_stream(device).wait_stream(self._h2d)
        #: per tensor, its version counter when its master was last taken or given: our
        #: copies go through ``.data``, whose counter is not the parameter's, so a counter
        #: that moved means someone else wrote the parameter
        self._versions = [t._version for t in tensors]
        for t in tensors:
            _BOUND[t] = self

    def _index_of(self, name: str) -> int:
        return self.names.index(name)

    def _master_of(self, t: torch.Tensor) -> torch.Tensor | None:
        i = self._index.get(id(t))
        return self._masters[i] if i is not None and self.tensors[i] is t else None

    # -- gradients: device to host ----------------------------------------------------------

    def _on_grad(self, t: torch.Tensor) -> None:
        """A parameter's gradient is complete: copy it to its host buffer (converted)."""
        i = self._index[id(t)]
        g = t.grad
        if g is None or g.is_sparse:  # a sparse one is taken at step() (its rows)
            return
        dst = self._host_grads[i]
        if self.cuda:
            self._d2h.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._d2h):
                dst.copy_(g.detach(), non_blocking=True)
            g.record_stream(self._d2h)
            if not self._end_queued:
                self._end_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        else:
            dst.copy_(g.detach())
        self._copied[i] = (weakref.ref(g), g._version)

    def _backward_done(self) -> None:
        """The compute stream waits for the gradient copies (the host does not)."""
        self._end_queued = False
        torch.cuda.current_stream(self.device).wait_stream(self._d2h)

    def check(self) -> None:
        """Raise if a parameter was moved, cast or reshaped since it was bound."""
        for name, t, kind in zip(self.names, self.tensors, self._kinds, strict=True):
            if (t.device, t.dtype, tuple(t.shape)) != kind:
                raise ParamError(f"parameter '{name}' was {kind[1]} of shape {kind[2]} on "
                                 f"{kind[0]} when the optimizer was made and is now {t.dtype} "
                                 f"of shape {tuple(t.shape)} on {t.device}; make the optimizer "
                                 "after moving or casting the module")

    def attach_grads(self, lazy: bool = True) -> list[bool]:
        """Every gradient in its host buffer: the hooks' copies waited for, the others
        made now. Returns, per tensor, whether its ``.grad`` was None (skipped)."""
        if self.cuda:
            self._d2h.synchronize()
            self._h2d.synchronize()  # the last step's values are out: the masters may change
            # A backward pass that raised never ran its end-of-pass callback: the next one
            # must queue its own, or gradient accumulation could race the copies.
            self._end_queued = False
        self.take_writes()
        missing = [False] * len(self.tensors)
        self._rows = {}
        with torch.no_grad():
            for i, t in enumerate(self.tensors):
                g = t.grad
                if g is None:
                    self._host_grads[i].zero_()
                    missing[i] = True
                    continue
                if g.is_sparse:  # its rows (lazy), or made dense, as the host binding's
                    rows = self._rows_of(i, g) if lazy else None
                    if rows is not None:
                        self._rows[i] = rows
                        self._host_grads[i].zero_()
                    else:
                        self._host_grads[i].copy_(g.detach().to_dense())
                    self._copied[i] = None
                    continue
                seen = self._copied[i]
                if seen is None or seen[0]() is not g or seen[1] != g._version:
                    self._host_grads[i].copy_(g.detach())
                    self._copied[i] = (weakref.ref(g), g._version)
        return missing

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch.optim: the parameters' gradients set to None (or zeroed)."""
        self._end_queued = False  # see attach_grads
        for t in self.tensors:
            if t.grad is not None:
                if set_to_none:
                    t.grad = None
                else:
                    t.grad.detach_().zero_()

    # -- values: host to device -------------------------------------------------------------

    def take_writes(self) -> None:
        """Parameters written since the optimizer last gave them values -- by
        ``module.load_state_dict``, ``torch.nn.init``, an in-place op under ``no_grad`` --
        make their masters what was written, as torch.optim's parameters would be (the
        tensors that show the same master are given it too). A written value equal to the
        master's cast (the same bfloat16 weights loaded again) keeps the master's precision.
        """
        touched = []
        with torch.no_grad():
            for i, t in enumerate(self.tensors):
                version = t._version
                if version == self._versions[i]:
                    continue
                self._versions[i] = version
                master = self._masters[i]
                written = t.detach().reshape(master.shape).to("cpu")
                if not torch.equal(written, master.to(written.dtype)):
                    master.copy_(written)
                    touched.append(self._owner_of[i])
        if touched:
            self._publish(sorted(set(touched)))

    def _publish(self, owners: Iterable[int]) -> None:
        """Copy the masters of ``owners`` to the tensors that show them (async on CUDA)."""
        if self.cuda:
            self._h2d.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._h2d), torch.no_grad():
                for k in owners:
                    for i in self._shows[k]:
                        self.tensors[i].data.copy_(self._masters[i], non_blocking=True)
        else:
            with torch.no_grad():
                for k in owners:
                    for i in self._shows[k]:
                        self.tensors[i].data.copy_(self._masters[i])

    def update(self, updater: Updater, step: int, grads: np.ndarray, a: int, b: int,
               state: UpdaterState, lr_scale: np.ndarray, wd: np.ndarray,
               grad_scale: np.ndarray, grad_norm: float | None,
               skip: np.ndarray | None = None) -> None:
        """Owners ``a:b`` updated on the host in pieces, each copied out when done; those
        ``skip`` marks (no gradient) neither updated nor copied. The last ``chunk`` values
        go in pieces of an eighth of that: the GPU waits for the last piece's copy after the
        host is done, so the last piece is kept small."""
        offsets = self.pset.offsets
        tail = max(1, self.chunk // 8)
        i = a
        while i < b:
            size = self.chunk if offsets[b] - offsets[i] > self.chunk else tail
            j = i + 1
            while j < b and offsets[j] - offsets[i] < size:
                j += 1
            lo, hi = int(offsets[i]), int(offsets[j])
            part = None if skip is None else skip[i - a:j - a]
            updater.apply(step, self.pset.values[lo:hi], grads[lo:hi],
                          state.segments(i - a, j - a), lr_scale[i - a:j - a],
                          wd[i - a:j - a], grad_scale[i - a:j - a], grad_norm=grad_norm,
                          skip=part)
            self._publish(k for k in range(i, j) if part is None or not part[k - i])
            i = j

    def update_rows(self, updater: Updater, step: int, k: int, ids: np.ndarray,
                    rows: np.ndarray, state: UpdaterState, lr_scale: float, wd: float,
                    grad_scale: float) -> None:
        """The host binding's lazy update of owner ``k``'s rows, then its values copied out."""
        super().update_rows(updater, step, k, ids, rows, state, lr_scale, wd, grad_scale)
        self._publish([k])

    def finish(self) -> None:
        """The compute stream waits for the values' copies before the next forward pass."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self._h2d)

    def to_host(self, state: UpdaterState, values: bool = True) -> None:
        """The masters are the values: nothing to copy, but what was written to the
        parameters since (see :meth:`take_writes`)."""
        if self.cuda:
            self._h2d.synchronize()
        self.take_writes()

    def from_host(self, state: UpdaterState, values: bool = True) -> None:
        """The masters changed (a checkpoint was read): the parameters take them."""
        if not values:
            return
        if self.cuda:
            self._h2d.synchronize()
        self._publish(range(len(self.pset.owners)))
        self.finish()

    def close(self) -> None:
        """Remove the gradient hooks (the binding is replaced)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __repr__(self) -> str:
        return (f"OffloadParams({len(self.tensors)} tensors on {self.device}, "
                f"{len(self.pset.owners)} owners, {self.pset.values.size} master values, "
                f"{self.pset.dtype})")


def _pinned(n: int, dtype: np.dtype[Any]) -> np.ndarray:
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    out: np.ndarray = torch.zeros(n, dtype=tdtype, pin_memory=True).numpy()
    return out


def _check(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    problems = []
    if not named:
        problems.append("no parameters to bind")
    devices = {t.device for _, t in named}
    if len(devices) > 1:
        problems.append(f"parameters on several devices {sorted(map(str, devices))}: "
                        "offloading takes a module on one")
    seen: dict[int, str] = {}
    for n, t in named:
        if id(t) in seen:
            problems.append(f"parameter '{n}' is the same tensor as '{seen[id(t)]}'")
        seen[id(t)] = n
        if not t.is_floating_point():
            problems.append(f"parameter '{n}' is {t.dtype}, not floating point")
        elif not t.is_leaf:
            problems.append(f"parameter '{n}' is not a leaf tensor")
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        problems.append(f"parameter names used twice: "
                        f"{sorted({n for n in names if names.count(n) > 1})}")
    if problems:
        raise ParamError(problems)


__all__ = ["CHUNK", "OffloadParams"]
