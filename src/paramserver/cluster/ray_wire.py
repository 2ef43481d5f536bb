"""What the Ray backend sends to its actors and between them, as plain data (no pickled
objects of ours).

An actor of the Ray backend is built from numbers, strings, lists, dicts and numpy arrays
only: configurations travel as their declarations' JSON (``to_json`` / ``parse``), server
ranges as :func:`layout_to_data`, Params as :func:`params_to_data`, and a gradient function
that the actor should build itself as a
:class:`~paramserver.cluster.gradfn.RemoteGradFn`'s data. Modules that registered a user's
components are imported by name in every actor (:func:`user_modules`,
:func:`import_modules`), so ``user_type`` works there too.

Every message of :mod:`paramserver.cluster.messages` travels, by one generic rule for the
whole vocabulary, either as one ``bytes`` object (:func:`pack`, :func:`unpack`: a JSON
header of its kind and plain fields, then its arrays' raw memory) when it is small and holds
no dict, or as the tuple ``(kind, field, ...)`` (:func:`encode`, :func:`decode`), its large
arrays in a server's reply as one object-store reference shared by every reply of one state.
One ``bytes`` argument is the cheapest thing Ray moves: a message of a step (an update and
its reply) costs one serialisation, not one per field.

This module does not import Ray.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..config import ParamError
from ..config.components import layers, lr_methods, param_generators, updaters
from ..config.registry import Registry
from ..numerics import quant
from ..params import ParamSet
from .layout import ServerLayout
from .messages import KINDS, NESTED, Reply, Request, Values

#: Arrays at least this large travel as object-store references (Ray inlines smaller ones).
LARGE = 100 * 1024

_LAYOUT_ARRAYS = ("slice_ids", "slice_offsets", "slice_owners", "offsets", "owners",
                  "lr_scale", "wd_scale", "row_dims", "first_rows")


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
            "params": [[p.name, list(p.shape), p.conf.to_json(), p.row_sparse]
                       for p in params.params],
            "tables": params.with_tables,
            "offsets": params.offsets.tolist(), "num_shares": params.num_shares.tolist()}


def params_from_data(data: Mapping[str, Any], hold_tables: bool = False) -> ParamSet:
    """A ParamSet of the same structure, its values zero (a worker's: without the tables'
    values, unless ``hold_tables``); checked against the sender's."""
    from ..config.job import ParamConf
    from ..params import ParamSpec

    ps = ParamSet([ParamSpec(name, tuple(shape), ParamConf.parse(json.loads(conf)),
                             f"param {i}", bool(sparse))
                   for i, (name, shape, conf, sparse) in enumerate(data["params"])],
                  data["dtype"], tables=bool(data.get("tables")), hold_tables=hold_tables)
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


# -- messages ----------------------------------------------------------------------------------

def _narrow(message: Request | Reply) -> Request | Reply:
    """A :class:`Values` of bfloat16 numbers with its values as their bfloat16 patterns
    (uint16): the high halves of the float32 values, exact for bfloat16 numbers, taken in one
    strided copy (little-endian memory). Any other message as it is."""
    if not isinstance(message, Values) or not message.bfloat16 or \
            message.values.dtype != np.float32:
        return message
    v = np.ascontiguousarray(message.values).reshape(-1)
    high = np.ascontiguousarray(v.view(np.uint16)[1::2] if sys.byteorder == "little"
                                else v.view(np.uint16)[0::2])
    return dataclasses.replace(message, values=high.reshape(message.values.shape))


def _widen(message: Any) -> Any:
    """The inverse of :func:`_narrow`: the float32 values of the patterns."""
    if isinstance(message, Values) and message.bfloat16 and message.values.dtype == np.uint16:
        return dataclasses.replace(message, values=quant.bf16_decode(message.values))
    return message


def encode(message: Request | Reply, share: Callable[[np.ndarray], Any] | None = None
           ) -> tuple[Any, ...]:
    """A message as ``(kind, field, ...)``; with ``share``, its arrays as what ``share``
    makes of them (a copy taken now, or an object-store reference shared by the replies of
    one state)."""
    message = _narrow(message)
    kind = type(message).__name__
    nested = NESTED.get(kind, ())
    fields = [encode(getattr(message, f.name), share) if f.name in nested
              else getattr(message, f.name)
              for f in dataclasses.fields(message)]  # type: ignore[arg-type]
    if share is not None:
        fields = [share(v) if isinstance(v, np.ndarray) else v for v in fields]
    return (kind, *fields)


_HEAD = struct.Struct("<I")


class Packed:
    """A message laid out for :func:`pack`'s format, before it is written: its JSON header
    and its arrays (contiguous), and the bytes it takes (``size``)."""

    __slots__ = ("arrays", "head", "size")

    def __init__(self, head: bytes, arrays: list[np.ndarray]):
        self.head = head
        self.arrays = arrays
        at = _HEAD.size + len(head)
        for a in arrays:
            at += -at % 8 + a.nbytes
        self.size = at

    def parts(self) -> list[Any]:
        """The message's bytes, in order: ``b"".join`` of them is :func:`pack`'s."""
        parts: list[Any] = [_HEAD.pack(len(self.head)), self.head]
        at = _HEAD.size + len(self.head)
        for a in self.arrays:
            pad = -at % 8
            parts += [b"\0" * pad, a.data.cast("B")]
            at += pad + a.nbytes
        return parts

    def write(self, buffer: memoryview) -> None:
        """Write the message at the start of ``buffer`` (at least ``size`` bytes): one copy
        of each array."""
        n = len(self.head)
        _HEAD.pack_into(buffer, 0, n)
        at = _HEAD.size + n
        buffer[_HEAD.size:at] = self.head
        for a in self.arrays:
            at += -at % 8
            buffer[at:at + a.nbytes] = a.data.cast("B")
            at += a.nbytes


def _flatten(message: Any, arrays: list[tuple[list[int], np.ndarray]], path: list[int]
             ) -> list[Any] | None:
    """``[kind, fields]`` of a message, its arrays taken out into ``arrays`` (with the path
    of their field); None when a field is neither plain nor an array."""
    message = _narrow(message)
    nested = NESTED.get(type(message).__name__, ())
    fields: list[Any] = []
    for i, f in enumerate(dataclasses.fields(message)):  # type: ignore[arg-type]
        v = getattr(message, f.name)
        if f.name in nested:
            v = _flatten(v, arrays, [*path, i])
            if v is None:
                return None
        elif isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                return None
            arrays.append(([*path, i], np.ascontiguousarray(v)))
            v = None
        elif isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = float(v)
        elif v is not None and not isinstance(v, str):
            return None
        fields.append(v)
    return [type(message).__name__, fields]


def packed(message: Request | Reply, limit: int | None = LARGE) -> Packed | None:
    """A message laid out for :func:`pack` (the same cases: None when it does not fit)."""
    arrays: list[tuple[list[int], np.ndarray]] = []
    flat = _flatten(message, arrays, [])
    if flat is None:
        return None
    if limit is not None and sum(a.nbytes for _, a in arrays) >= limit:
        return None
    head = json.dumps([flat[0], flat[1], [[p[0] if len(p) == 1 else p, a.dtype.str,
                                            list(a.shape)] for p, a in arrays]]).encode()
    return Packed(head, [a for _, a in arrays])


def pack(message: Request | Reply, limit: int | None = LARGE) -> bytes | None:
    """A message as one ``bytes`` object: the length of a JSON header (its kind, its plain
    fields -- a message it holds (a :class:`~.messages.KeyBatch`'s request) as its own
    ``[kind, fields]`` --, each array's field, dtype and shape), the header, then each
    array's memory at an offset aligned to 8 bytes. ``None`` when it does not fit: a dict
    field, an array of objects, or arrays of ``limit`` bytes or more (by default
    :data:`LARGE`: those go through the object store; ``None``: no limit, for a compiled
    graph's channels)."""
    p = packed(message, limit)
    return None if p is None else b"".join(p.parts())


def _build(flat: Sequence[Any]) -> Any:
    kind, fields = flat
    cls = KINDS.get(str(kind))
    if cls is None:
        raise ParamError(f"unknown message {kind!r}")
    nested = NESTED.get(cls.__name__, ())
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name in nested:
            fields[i] = _build(fields[i])
    return _widen(cls(*fields))


def unpack(data: bytes | memoryview, copy: bool = False) -> Any:
    """The message of :func:`pack`'s bytes; its arrays are read-only views of them (with
    ``copy``, arrays of their own: for a buffer that is written again)."""
    (n,) = _HEAD.unpack_from(data)
    kind, fields, arrays = json.loads(bytes(data[_HEAD.size:_HEAD.size + n]))
    at = _HEAD.size + n
    for where, dtype, shape in arrays:
        dt = np.dtype(dtype)
        at += -at % 8
        count = math.prod(shape)
        a = np.frombuffer(data, dt, count, at).reshape(shape)
        if copy:
            a = a.copy()
        if isinstance(where, int):
            fields[where] = a
        else:
            inner = fields
            for i in where[:-1]:
                inner = inner[i][1]
            inner[where[-1]] = a
        at += count * dt.itemsize
    return _build([kind, fields])


def decode(data: Sequence[Any], resolve: Callable[[Any], Any] | None = None) -> Any:
    """The message of :func:`encode`'s tuple; ``resolve`` fetches a shared reference."""
    cls = KINDS.get(str(data[0]))
    if cls is None:
        raise ParamError(f"unknown message {data[0]!r}")
    nested = {i for i, f in enumerate(dataclasses.fields(cls))
              if f.name in NESTED.get(cls.__name__, ())}
    fields = [decode(v, resolve) if i in nested else v if resolve is None else resolve(v)
              for i, v in enumerate(data[1:])]
    return _widen(cls(*fields))


__all__ = ["LARGE", "Packed", "decode", "encode", "import_modules", "layout_from_data",
           "layout_to_data", "main_components", "pack", "packed", "params_from_data",
           "params_to_data", "unpack", "user_modules"]
