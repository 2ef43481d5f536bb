"""Whether a small call may take its NumPy form (:mod:`.rng_arrays`, :mod:`.small_updates`).

A small uniform fill and a small update of float state have NumPy forms that write what the
compiled kernels write, bit for bit, so that a small job need not load numba's compiler
(about 85 MB). They are taken only while no compiled kernel has been loaded in the process:
once one has (:func:`note_compiler`, from :mod:`.cache`), the compiler's memory is spent, and
the compiled kernels are the faster (SINGA's momentum over 9,610 values in four Params, the
main job's update: 78 µs compiled against 238 µs in NumPy, medians of 9 interleaved rounds
on a quiet machine). :func:`compiled_only` turns them off for a block: for
:func:`.kernels.warmup`, whose work is to compile, and for tests of the compiled kernels
themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["compiled_only", "note_compiler", "numpy_allowed"]

_COMPILED_ONLY: ContextVar[bool] = ContextVar("paramserver_compiled_only", default=False)
_compiler_loaded = False


def numpy_allowed() -> bool:
    """Whether small calls may take their NumPy forms: no compiled kernel loaded in this
    process yet, and not inside :func:`compiled_only`."""
    return not _compiler_loaded and not _COMPILED_ONLY.get()


def note_compiler() -> None:
    """A compiled kernel is being loaded or compiled in this process (numba's compiler with
    it): from now on every call takes the compiled kernels."""
    global _compiler_loaded
    _compiler_loaded = True


@contextlib.contextmanager
def compiled_only() -> Iterator[None]:
    """Within the block (in this thread or task), every call takes the compiled kernels."""
    token = _COMPILED_ONLY.set(True)
    try:
        yield
    finally:
        _COMPILED_ONLY.reset(token)
