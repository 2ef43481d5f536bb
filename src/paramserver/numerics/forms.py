"""Whether a small call may take its NumPy form (:mod:`.rng_arrays`, :mod:`.small_updates`).

A small uniform fill and a small update of float state have NumPy forms that write what the
compiled kernels write, bit for bit, so that a small job need not load numba's compiler.
:func:`compiled_only` turns them off for a block: for :func:`.kernels.warmup`, whose work is
to compile, and for tests of the compiled kernels themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["compiled_only", "numpy_allowed"]

_COMPILED_ONLY: ContextVar[bool] = ContextVar("paramserver_compiled_only", default=False)


def numpy_allowed() -> bool:
    """Whether small calls may take their NumPy forms here (not inside :func:`compiled_only`)."""
    return not _COMPILED_ONLY.get()


@contextlib.contextmanager
def compiled_only() -> Iterator[None]:
    """Within the block (in this thread or task), every call takes the compiled kernels."""
    token = _COMPILED_ONLY.set(True)
    try:
        yield
    finally:
        _COMPILED_ONLY.reset(token)
