"""Who hears that a kernel is compiling: :func:`reporting`, with no numba imported.

A progress display listens from the start of a run (:class:`~paramserver.train.progress.
CompileNotice`), though most runs never load numba (a job whose calls are all small takes
their NumPy forms, :mod:`.forms`). So the listeners are kept here, and :mod:`.cache`, once
numba is imported, passes numba's compile events on to them (:func:`tell`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["reporting", "tell"]

Callback = Callable[[str, bool], None]
_listeners: list[Callback] = []
_lock = threading.Lock()


@contextlib.contextmanager
def reporting(callback: Callback) -> Iterator[None]:
    """While the block runs, call ``callback(name, True)`` when a kernel starts compiling
    (it was not in the cache, or there is none) and ``callback(name, False)`` when it is
    done, from the thread that compiles. ``name`` is ``module:qualname`` of the function
    compiled; the functions a kernel calls compile inside its compile (nested calls)."""
    with _lock:
        _listeners.append(callback)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(callback)


def tell(name: str, starting: bool) -> None:
    """A compile of ``name`` starts or ends: every listener hears it (a listener's trouble
    never stops a compile)."""
    with _lock:
        listeners = list(_listeners)
    for callback in listeners:
        try:
            callback(name, starting)
        except Exception:
            pass
