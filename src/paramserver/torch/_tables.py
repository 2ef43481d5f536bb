"""``torch.nn.Embedding(sparse=True)`` on the cluster as a row-sparse table (SPEC §10).

A module's sparse embeddings are the tables of :class:`~paramserver.torch.TorchCluster`:
their weights live on the servers (sliced by rows), and a worker's replica of the module
holds none of them. In the replica each such embedding is a :class:`RowEmbedding`: its
forward pulls the rows of the batch's ids once each (from the servers that hold them) into
a small leaf tensor and looks the ids up in it with ``torch.nn.functional.embedding``, so
``padding_idx`` and ``scale_grad_by_freq`` act as torch's; after the backward pass
:meth:`RowEmbedding.push_grads` hands that tensor's gradient to the table as rows by id, and
the servers update only those rows (lazily, for stateful updaters: torch's ``SparseAdam``
semantics).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..config import ParamError
from ..params import ParamSet, TableParam


def sparse_embeddings(module: torch.nn.Module) -> dict[str, torch.nn.Embedding]:
    """The module's ``nn.Embedding(sparse=True)`` submodules, by their weight's name.

    Raises:
        ParamError: for one with ``max_norm`` (it renormalises rows of the whole table in
            place at lookup, which a worker that does not hold the table cannot do).
    """
    out = {}
    for prefix, m in module.named_modules():
        if isinstance(m, torch.nn.Embedding) and m.sparse:
            name = f"{prefix}.weight" if prefix else "weight"
            if m.max_norm is not None:
                raise ParamError(f"embedding '{prefix or '<module>'}': max_norm is not supported "
                                 "for a row-sparse table held by the servers; drop max_norm "
                                 "or make it sparse=False (a dense Param)")
            out[name] = m
    return out


class RowEmbedding(torch.nn.Module):
    """A worker's stand-in for an ``nn.Embedding(sparse=True)``: rows by id from a table.

    Args:
        name: the table's Param name (the embedding's weight name).
        like: the embedding it stands in for (its sizes and lookup options).
    """

    def __init__(self, name: str, like: torch.nn.Embedding):
        super().__init__()
        self.param_name = name
        self.num_embeddings = int(like.num_embeddings)
        self.embedding_dim = int(like.embedding_dim)
        self.padding_idx = like.padding_idx
        self.scale_grad_by_freq = bool(like.scale_grad_by_freq)
        self.table: TableParam | None = None
        self._looked_up: list[tuple[np.ndarray, torch.Tensor]] = []

    def bind(self, pset: ParamSet) -> None:
        """Read and train the rows of ``pset``'s table of this name."""
        table = pset[self.param_name]
        if not isinstance(table, TableParam):
            raise ParamError(f"'{self.param_name}' is not a row-sparse table of the ParamSet")
        self.table = table
        self._looked_up = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            raise ParamError(f"embedding '{self.param_name}' is not bound to a table")
        unique, at = np.unique(ids.detach().cpu().numpy().reshape(-1), return_inverse=True)
        rows = torch.from_numpy(self.table.rows(unique)).requires_grad_(True)
        self._looked_up.append((unique, rows))
        pad = None
        if self.padding_idx is not None:
            where = np.searchsorted(unique, self.padding_idx)
            if where < unique.size and unique[where] == self.padding_idx:
                pad = int(where)
        index = torch.from_numpy(at.reshape(ids.shape)).to(ids.device)
        return torch.nn.functional.embedding(index, rows, pad, None, 2.0,
                                             self.scale_grad_by_freq, False)

    def push_grads(self) -> None:
        """Give the table the gradient rows of every lookup since the last call."""
        assert self.table is not None
        looked_up, self._looked_up = self._looked_up, []
        for unique, rows in looked_up:
            if rows.grad is None:
                continue
            keep = unique != self.padding_idx  # torch's padding row is never trained
            grad = rows.grad.numpy()
            if self.padding_idx is not None and not keep.all():
                unique, grad = unique[keep], grad[keep]
            self.table.add_grad_rows(unique, grad)

    def clear(self) -> None:
        """Forget lookups whose gradient was not taken."""
        self._looked_up = []

    def extra_repr(self) -> str:
        return (f"'{self.param_name}', {self.num_embeddings}, {self.embedding_dim}, "
                "rows from the servers")


def without_tables(module: torch.nn.Module, tables: dict[str, torch.nn.Embedding]
                   ) -> torch.nn.Module:
    """A copy of ``module`` whose sparse embeddings ``tables`` are :class:`RowEmbedding`:
    the tables' weights are not copied (a worker's replica holds none of them)."""
    memo: dict[int, Any] = {id(m.weight): None for m in tables.values()}
    light = copy.deepcopy(module, memo)
    for name, m in tables.items():
        path = name.rsplit(".", 1)[0] if "." in name else ""
        row = RowEmbedding(name, m)
        if not path:
            return row
        parent_path, _, leaf = path.rpartition(".")
        parent = light.get_submodule(parent_path) if parent_path else light
        setattr(parent, leaf, row)
    return light


def row_embeddings(module: torch.nn.Module) -> Iterator[RowEmbedding]:
    return (m for m in module.modules() if isinstance(m, RowEmbedding))


__all__ = ["RowEmbedding", "row_embeddings", "sparse_embeddings", "without_tables"]
