"""The neutral form of a configuration before it is checked against a declaration.

Both paths into a :class:`~paramserver.config.Parameter` arrive here first: a Python mapping
(``Block.from_mapping``) and a job file read by :mod:`paramserver.config.textformat`. Keeping
one form means one set of checks and one set of messages for both.

The nodes keep no ``__dict__`` (slots): a job file may hold hundreds of thousands of them, and
its reader's memory stays within a small multiple of the file's size (docs/jobs.md). A list's
``items`` is any sequence of values: the reader keeps a long list of numbers or strings as
their places in the file's text and makes each :class:`Scalar` when it is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import Location

#: A value as written: raw text from a file, or any Python object from a mapping.
Value = Union["Scalar", "Block", "ListValue"]


class WrittenBool(str):
    """protobuf's short booleans ``t`` and ``f`` as a job file writes them bare: a boolean
    where a boolean field reads it, the word itself anywhere else (an enum or name ``f``)."""

    value: bool

    def __new__(cls, text: str) -> WrittenBool:
        obj = super().__new__(cls, text)
        obj.value = text == "t"
        return obj


@dataclass(slots=True)
class Scalar:
    """One value. ``raw`` is text from a file (strings already unquoted) or a Python object.

    ``quoted`` says the file wrote it as a string literal, so that ``"None"`` in quotes is
    the text None, not the absence of a value.
    """

    raw: Any
    where: Location | str | None = None
    quoted: bool = False


@dataclass(slots=True)
class ListValue:
    """The list syntax ``[a, b]`` of the text format, or a Python list or tuple."""

    items: Sequence[Value]
    where: Location | str | None = None


@dataclass(slots=True)
class Entry:
    """``key: value`` inside a block; ``extension`` for ``[name] { ... }`` blocks."""

    key: str
    value: Value
    where: Location | str | None = None
    extension: bool = False


@dataclass(slots=True)
class Block:
    """A configuration block ``{ ... }``: its entries in the order written."""

    entries: list[Entry] = field(default_factory=list)
    where: Location | str | None = None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], path: str | None = None) -> Block:
        """Wrap a Python mapping; nested mappings become blocks placed at their key path."""
        entries = []
        for key, value in mapping.items():
            key = str(key)
            sub = f"{path}.{key}" if path else key
            entries.append(Entry(key, wrap(value, sub), path))
        return cls(entries, path)


def wrap(value: Any, path: str | None) -> Value:
    """Wrap one Python value into the tree form; a value already wrapped is kept."""
    if isinstance(value, (Scalar, Block, ListValue)):
        return value
    if isinstance(value, Mapping):
        return Block.from_mapping(value, path)
    if isinstance(value, list):
        return ListValue([wrap(v, f"{path}[{i}]") for i, v in enumerate(value)], path)
    return Scalar(value, path)


def unwrap(value: Value) -> Any:
    """The plain Python form of a tree value (text stays text), for unknown keys handed back."""
    if isinstance(value, Scalar):
        return value.raw
    if isinstance(value, ListValue):
        return [unwrap(v) for v in value.items]
    out: dict[str, Any] = {}
    for e in value.entries:
        key = f"[{e.key}]" if e.extension else e.key
        v = unwrap(e.value)
        if key in out:
            prev = out[key]
            out[key] = (prev if isinstance(prev, list) else [prev]) + [v]
        else:
            out[key] = v
    return out
