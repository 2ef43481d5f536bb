"""What a run is given: the user's gradient function, or a description of one.

``grad_fn(worker, step)`` fills the gradients of ``worker.params`` and returns metrics; a
:class:`RemoteGradFn` describes one as data (a factory's import path and JSON arguments), so
that every worker builds its own where it runs — in this process (embedded) or in a Ray
actor — from configuration, never from a pickled object.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import ParamError

if TYPE_CHECKING:
    from .worker import Worker

#: ``grad_fn(worker, step)``: fill ``worker.params``' gradients, return metrics (or None).
GradFn = Callable[["Worker", int], "Mapping[str, Any] | None"]
#: ``on_step(step, metrics)``: called in the caller's thread, in step order, once every
#: live worker has finished the step; ``metrics`` by rank (None for a worker gone).
OnStep = Callable[[int, "list[Mapping[str, Any] | None]"], None]


@dataclass(frozen=True)
class RemoteGradFn:
    """A gradient function that each worker builds for itself, described as data.

    ``factory`` is ``"module:function"``; where the worker runs, ``function(**args)``
    returns the ``grad_fn(worker, step)`` of that worker. ``args`` must be JSON-able. The
    function is built once per worker and arguments, and reused by later runs.
    """

    factory: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def to_data(self) -> tuple[str, str]:
        try:
            return self.factory, json.dumps(dict(self.args), sort_keys=True)
        except TypeError as e:
            raise ParamError(f"RemoteGradFn({self.factory!r}): its arguments must be JSON "
                             f"data: {e}") from None


def build_grad_fn(data: tuple[str, str]) -> Callable[..., Any]:
    """The gradient function a :class:`RemoteGradFn`'s data describes."""
    factory, args = data
    module, _, name = factory.partition(":")
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    made: Callable[..., Any] = fn(**json.loads(args))
    return made


class GradFnCache:
    """A worker's gradient function for a run: the callable given, or the one a
    :class:`RemoteGradFn`'s data builds (once per arguments), possibly built ahead, on a
    thread of its own (:meth:`build_ahead`)."""

    def __init__(self) -> None:
        self._key: tuple[str, str] | None = None
        self._fn: Callable[..., Any] | None = None
        self._ahead: threading.Thread | None = None

    def build_ahead(self, fn: Any) -> None:
        """Start building ``fn`` (a RemoteGradFn's data) on a thread, and return: the next
        :meth:`get` waits for it. A build that fails is forgotten here: that :meth:`get`
        builds it again and raises."""
        self._wait()

        def build() -> None:
            try:
                self._get(fn)
            except Exception:  # raised again by the get that needs it
                pass

        self._ahead = threading.Thread(target=build, daemon=True,
                                       name="paramserver-build-grad-fn")
        self._ahead.start()

    def _wait(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.join()

    def get(self, fn: Any) -> Callable[..., Any]:
        self._wait()
        return self._get(fn)

    def _get(self, fn: Any) -> Callable[..., Any]:
        if isinstance(fn, RemoteGradFn):
            fn = fn.to_data()
        if isinstance(fn, tuple) and len(fn) == 2 and all(isinstance(x, str) for x in fn):
            if fn != self._key:
                self._fn, self._key = build_grad_fn(fn), fn
            assert self._fn is not None
            return self._fn
        if not callable(fn):
            raise ParamError(f"grad_fn must be callable, not {type(fn).__name__}")
        return fn  # type: ignore[no-any-return]


__all__ = ["GradFn", "GradFnCache", "OnStep", "RemoteGradFn", "build_grad_fn"]
