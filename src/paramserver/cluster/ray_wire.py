"""What the Ray backend sends to its actors, as plain data (no pickled objects of ours).

An actor of the Ray backend is built from numbers, strings, lists, dicts and numpy arrays
only: configurations travel as their declarations' JSON (``to_json`` / ``parse``), server
ranges as :func:`layout_to_data`, Params as :func:`params_to_data`, and a gradient function
that the actor should build itself as a :class:`RemoteGradFn` (a factory's import path and
its JSON arguments). Modules that registered a user's components are imported by name in
every actor (:func:`user_modules`, :func:`import_modules`), so ``user_type`` works there too.

Replies of servers travel as tuples (:func:`encode_reply`, :func:`decode_reply`); large
value arrays in them as one object-store reference shared by every reply of one state.

This module does not import Ray.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.components import layers, lr_methods, param_generators, updaters
from ..config.registry import Registry
from ..params import ParamSet
from .errors import ClusterError
from .layout import ServerLayout
from .messages import (
    Ack,
    Address,
    ErrorReply,
    GetReply,
    PutReply,
    Reply,
    SyncReply,
    UpdateReply,
)

#: Arrays at least this large travel as object-store references (Ray inlines smaller ones).
LARGE = 100 * 1024

_LAYOUT_ARRAYS = ("slice_ids", "slice_offsets", "slice_owners", "offsets", "owners",
                  "lr_scale", "wd_scale")


class ServerLost(ClusterError):
    """A server actor died while a request to it waited (Ray restarts it)."""

    def __init__(self, message: str, address: Address):
        super().__init__(message)
        self.address = address


# -- server ranges and Params -----------------------------------------------------------------

def layout_to_data(layout: ServerLayout) -> dict[str, Any]:
    """A server's range as numbers, arrays and strings."""
    out: dict[str, Any] = {k: np.asarray(getattr(layout, k)) for k in _LAYOUT_ARRAYS}
    out.update(index=layout.index, start=layout.start, stop=layout.stop,
               names=list(layout.names), dtype=np.dtype(layout.dtype).name)
    return out


def layout_from_data(data: Mapping[str, Any]) -> ServerLayout:
    arrays = {k: np.array(data[k]) for k in _LAYOUT_ARRAYS}  # own, writable copies
    return ServerLayout(index=int(data["index"]), start=int(data["start"]),
                        stop=int(data["stop"]), names=tuple(data["names"]),
                        dtype=np.dtype(data["dtype"]), **arrays)


def params_to_data(params: ParamSet) -> dict[str, Any]:
    """A ParamSet's structure (names, shapes, configurations, sharing), not its values."""
    return {"dtype": params.dtype.name,
            "params": [[p.name, list(p.shape), p.conf.to_json()] for p in params.params],
            "offsets": params.offsets.tolist(), "num_shares": params.num_shares.tolist()}


def params_from_data(data: Mapping[str, Any]) -> ParamSet:
    """A ParamSet of the same structure, its values zero; checked against the sender's."""
    from ..config.job import ParamConf

    ps = ParamSet([(name, tuple(shape), ParamConf.parse(json.loads(conf)))
                   for name, shape, conf in data["params"]], data["dtype"])
    if ps.offsets.tolist() != list(data["offsets"]) or (
            ps.num_shares.tolist() != list(data["num_shares"])):
        raise ParamError("the Params rebuilt in a Ray actor do not have the layout of the "
                         "driver's (a Param or its sharing differs)")
    return ps


# -- user code ---------------------------------------------------------------------------------

def user_modules() -> list[str]:
    """The modules, outside paramserver, that registered components in this process."""
    found: set[str] = set()
    for registry in (param_generators, updaters, lr_methods, layers):
        for _, obj in Registry.items(registry):  # what is registered now; loads nothing
            module = getattr(obj, "__module__", None) or ""
            if module and module != "__main__" and module.split(".")[0] != "paramserver":
                found.add(module)
    return sorted(found)


def main_components() -> list[str]:
    """Components registered by ``__main__``: an actor cannot import them by name."""
    return sorted(name for registry in (param_generators, updaters, lr_methods, layers)
                  for name, obj in Registry.items(registry)
                  if getattr(obj, "__module__", None) == "__main__")


def import_modules(names: Sequence[str], sys_path: Sequence[str] = ()) -> None:
    """Import the modules that register a user's components (in an actor), after adding
    the driver's module folders to the end of ``sys.path`` (on its machine, the actors then
    import what it imports; elsewhere the folders that do not exist change nothing)."""
    for entry in sys_path:
        if entry not in sys.path:
            sys.path.append(entry)
    for name in names:
        importlib.import_module(name)


@dataclass(frozen=True)
class RemoteGradFn:
    """A gradient function that each worker actor builds for itself, described as data.

    ``factory`` is ``"module:function"``; in the actor, ``function(**args)`` returns the
    ``grad_fn(worker, step)`` of that worker. ``args`` must be JSON-able. The function is
    built once per actor and arguments, and reused by later runs.
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
    """The gradient function a :class:`RemoteGradFn`'s data describes (in an actor)."""
    factory, args = data
    module, _, name = factory.partition(":")
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    made: Callable[..., Any] = fn(**json.loads(args))
    return made


# -- replies -----------------------------------------------------------------------------------

def encode_reply(reply: Reply, share: Callable[[np.ndarray], Any]) -> tuple[Any, ...]:
    """A server's reply as a tuple; ``share(values)`` gives what carries the values (a copy
    taken now, or an object-store reference shared by the replies of one state)."""
    if isinstance(reply, UpdateReply):
        return ("update", share(reply.values), reply.versions.copy(), reply.applied)
    if isinstance(reply, GetReply):
        return ("get", share(reply.values), reply.versions.copy())
    if isinstance(reply, PutReply):
        return ("put", reply.versions.copy())
    if isinstance(reply, SyncReply):
        return ("sync", reply.values)
    if isinstance(reply, Ack):
        return ("ack",)
    if isinstance(reply, ErrorReply):
        return ("error", reply.message)
    raise TypeError(f"unknown reply {type(reply).__name__}")


def decode_reply(data: tuple[Any, ...], fetch: Callable[[Any], np.ndarray]) -> Reply:
    """The reply of :func:`encode_reply`'s tuple; ``fetch`` resolves a shared reference."""
    kind = data[0]
    if kind == "update":
        return UpdateReply(fetch(data[1]), data[2], bool(data[3]))
    if kind == "get":
        return GetReply(fetch(data[1]), data[2])
    if kind == "put":
        return PutReply(data[1])
    if kind == "sync":
        return SyncReply(data[1])
    if kind == "ack":
        return Ack()
    if kind == "error":
        return ErrorReply(str(data[1]))
    raise TypeError(f"unknown reply {kind!r}")


__all__ = ["LARGE", "RemoteGradFn", "ServerLost", "build_grad_fn", "decode_reply", "encode_reply",
           "import_modules", "layout_from_data", "layout_to_data", "main_components",
           "params_from_data", "params_to_data", "user_modules"]
