"""The names of key-value store types: paramserver's three modes and MXNet's names for them.

MXNet 1.9.1 (``src/kvstore/kvstore.cc``, ``python/mxnet/kvstore/base.py``) reads a type name
in lower case: a name with ``dist`` is a distributed store (asynchronous with ``_async``,
else synchronous; ``device`` says where it reduces), ``nccl`` is NCCL's all-reduce of one
machine's GPUs, ``horovod`` and ``byteps`` are other frameworks' all-reduce, and every other
name is a local store (``local``, ``device``, ``local_allreduce_cpu``,
``local_allreduce_device``, ``local_update_cpu``, ...). Here:

- a name with ``dist``: ``dist_async`` with ``_async``, else ``dist_sync``;
- ``local``, ``device``, ``nccl`` and any name starting with ``local``: ``local`` (one
  worker; a push of a list of values sums them, as MXNet's stores sum the values of a
  machine's devices — on the host here, there are no devices);
- ``horovod``, ``byteps``: refused (no servers: gradients are all-reduced between workers);
- another name: refused with the valid ones (MXNet would make a local store of it).
"""

from __future__ import annotations

from ..config import ParamError

#: paramserver's modes, and MXNet's names for them (any other ``local*`` name and ``dist*``
#: name are read as :func:`mode_of` says).
MODES = {"local": "local", "device": "local", "nccl": "local",
         "local_allreduce_cpu": "local", "local_allreduce_device": "local",
         "local_update_cpu": "local", "dist_sync": "dist_sync",
         "dist_sync_device": "dist_sync", "dist_device_sync": "dist_sync",
         "dist": "dist_sync", "dist_async": "dist_async", "dist_device_async": "dist_async"}

_ELSEWHERE = {"horovod": "Horovod", "byteps": "BytePS"}


def mode_of(name: str) -> str:
    """The mode (``local``, ``dist_sync``, ``dist_async``) of a store type name, MXNet's or
    paramserver's (any case); refuses a name that is neither, with the valid ones."""
    if not isinstance(name, str):
        raise ParamError(f"the key-value store type must be a str, not "
                         f"{type(name).__name__}")
    low = name.lower()
    if low in MODES:
        return MODES[low]
    if "dist" in low:
        return "dist_async" if "_async" in low else "dist_sync"
    if low.startswith("local"):
        return "local"
    if low in _ELSEWHERE:
        raise ParamError(f"key-value store type '{name}': {_ELSEWHERE[low]} all-reduces "
                         "gradients between workers, without servers; paramserver's store "
                         "keeps the values on servers: use 'dist_sync' (the same sum of "
                         "every worker's gradient each step)")
    raise ParamError(f"Invalid Input: '{name}', valid values are: "
                     f"{{{', '.join(repr(m) for m in MODES)}}} (key-value store type; MXNet's "
                     "other 'local...' and 'dist...' names too)")


__all__ = ["MODES", "mode_of"]
