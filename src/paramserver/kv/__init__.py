"""A key-value client on paramserver's servers (SPEC §10), in the spirit of MXNet's KVStore.

- :func:`create`: a store (``local``, ``dist_sync``, ``dist_async``; embedded or on Ray) and
  the caller's :class:`KVStore` of it: ``init``, ``push``, ``pull``, ``pushpull``,
  ``row_sparse_pull``, ``set_updater``, ``barrier``, ``save``/``load``, and ``run`` for a
  function on every worker;
- :class:`RowSparse` (:func:`row_sparse`): a row-sparse gradient ``(ids, rows)``;
- :class:`Fill`: a value the servers fill themselves with an init method;
- :mod:`optimizer` (:mod:`.mxnet_optimizers`): MXNet 1.9.1's optimizers by MXNet's names and
  arguments, for ``set_optimizer``.

See ``docs/kv.md`` for how MXNet's KVStore calls map.
"""

from __future__ import annotations

from . import mxnet_optimizers as optimizer
from .store import MODES, KVStore, create
from .values import Fill, RowSparse, row_sparse

__all__ = ["MODES", "Fill", "KVStore", "RowSparse", "create", "optimizer", "row_sparse"]
