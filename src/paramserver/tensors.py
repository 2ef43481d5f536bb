"""Torch tensors that view a ParamSet's flat buffers: the one home of the binding that the
torch adaptor (:mod:`paramserver.torch`, a user's module) and the layers
(:mod:`paramserver.train`) compute with.

A Param's tensor is a leaf whose ``.data`` views the Param's values (a sharer's, its
owner's) and whose ``.grad`` views its gradient, so that autograd and in-place updates
work on paramserver's memory: nothing is copied. Importing this module imports PyTorch.
"""

from __future__ import annotations

import torch

from .params import ParamSet


def views(pset: ParamSet, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and the gradient of Param ``name``, as tensors viewing the buffers."""
    p = pset[name]
    return torch.from_numpy(p.data), torch.from_numpy(p.grad)


def attach(tensor: torch.Tensor, value: torch.Tensor, grad: torch.Tensor | None) -> None:
    """Make ``tensor`` (a leaf) view ``value`` and its ``.grad`` view ``grad`` (None: a
    row-sparse table's, whose gradient is rows by id)."""
    with torch.no_grad():
        tensor.data = value
        tensor.grad = grad


def param_tensors(pset: ParamSet) -> dict[str, torch.nn.Parameter]:
    """A new leaf tensor for every Param of ``pset``, by name, viewing its values and
    gradient; not for its row-sparse tables (rows by id, no dense gradient)."""
    out = {}
    tables = {t.name for t in pset.tables}
    for name in pset.names:
        if name in tables:
            continue
        value, grad = views(pset, name)
        t = torch.nn.Parameter(torch.empty(0, dtype=value.dtype))
        attach(t, value, grad)
        out[name] = t
    return out


__all__ = ["attach", "param_tensors", "views"]
