"""Field types: how a value is parsed from text or taken as typed, and how it is named.

Each type is a small object with ``convert(value) -> python value`` (raising ``_Invalid``
when the value does not fit), ``name`` (the type as messages and documentation print it) and
``plain(value)`` (the JSON-able form). The declaration in :mod:`.parameter` picks one per
field from its annotation.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from .errors import Error, ParamError, printable
from .tree import Block, ListValue, Scalar, Value, WrittenBool

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: The white space C's isspace() knows: C++ streams skip it before an int. (Python's
#: str.strip() would take more: U+00A0, U+001C, ...)
C_SPACE = " \t\n\v\f\r"
#: The white space of dmlc's own isspace() (no \v): what it allows after an int, and what
#: its float parser skips before a number.
DMLC_SPACE = " \t\n\r\f"
# ASCII digits only: Python's \d and int() also take other scripts' digits, dmlc does not.
_INT_RE = re.compile(r"([+-]?)0*([0-9]+)")
#: The number at the start of a float's text, as dmlc's parser reads it: decimal digits with
#: an optional fraction and exponent and a trailing ``f``; ``inf`` or ``infinity`` (not
#: ``infi``); ``nan`` with an optional C99 payload, ``nan(foo_bar_12)``; any letter case.
#: No hex (``0x1p3`` is the number ``0`` followed by ``x1p3``).
_FLOAT_PREFIX_RE = re.compile(
    r"([+-]?)(?:(?P<inf>infinity|inf(?!i))|(?P<nan>nan(?:\([0-9A-Za-z_]*\))?)"
    r"|(?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fF]?)",
    re.IGNORECASE)
#: A float written plainly (most of a job file's): read without the prefix search.
_PLAIN_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Whether a number's significand has a digit other than 0 (its value is not zero).
_NONZERO_RE = re.compile(r"[1-9]")


class Invalid(Error):
    """A value that does not fit its type; the caller turns it into the dmlc message."""

    def __init__(self, shown: str, message: str | None = None, *, out_of_range: bool = False,
                 trailing: str | None = None, choices: tuple[str, ...] | None = None,
                 reason: str | None = None):
        super().__init__(shown)
        self.shown = shown          # the value as the message shows it
        self.message = message      # a whole message, replacing the format message
        self.out_of_range = out_of_range  # a number the type cannot hold (dmlc's ERANGE)
        self.trailing = trailing    # what is left after a number that was read
        self.choices = choices      # the names of an enumeration the value is not one of
        self.reason = reason        # why a value of the right type is invalid, after dmlc's

    def text(self, key: str, type_name: str) -> str:
        """The whole message for field ``key`` of type ``type_name``, in dmlc's wording."""
        if self.message is not None:
            return self.message
        if self.out_of_range:
            return f"Out of range value for {key}, value='{self.shown}'"
        if self.trailing is not None:
            # dmlc's words, then the key and the whole value (dmlc names neither; MXNet
            # adds the operator and its arguments).
            return (f"Some trailing characters could not be parsed: '{self.trailing}' "
                    f"({key}='{self.shown}')")
        why = f": {self.reason}" if self.reason else ""
        return (f"Invalid Parameter format for {key} expect {type_name} but "
                f"value='{self.shown}'{why}")


def format_number(x: Any) -> str:
    """Numbers in their shortest form, as dmlc prints them: ``1``, ``0.5``, ``1e-08``."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x.is_integer() and abs(x) < 1e16:
            return str(int(x))
        return repr(x)
    return str(x)


def shown(value: Any) -> str:
    """A value as an error message shows it after ``value=``: as given, so a typed ``10.0``
    shows as ``10.0`` (``expect int but value='10'`` would puzzle)."""
    if isinstance(value, Scalar):
        value = value.raw
    if isinstance(value, ListValue):  # the first items of a long list
        items = value.items
        more = f", ... ({len(items):,} values)" if len(items) > 20 else ""
        return "[" + ", ".join(shown(v) for v in items[:20]) + more + "]"
    if isinstance(value, Block):
        return "{...}"
    return str(value)


def _typed_int(raw: Any) -> int | None:
    """The integer a typed value stands for (a Python or numpy integer), else None."""
    if isinstance(raw, bool) or not isinstance(raw, typing.SupportsIndex):
        return None
    try:
        return int(raw.__index__())
    except (TypeError, ValueError):  # an array of several elements has __index__ too
        return None


def choices_text(choices: Sequence[str], *, none: bool = False) -> str:
    """An enumeration as dmlc prints it: ``{'a', 'b'}``, sorted; ``{None, 'a', 'b'}`` for an
    optional one, whose text ``None`` is valid too."""
    names = ", ".join(repr(c) for c in sorted(choices))
    if none:
        return "{None, " + names + "}" if names else "{None}"
    return "{" + names + "}"


def not_a_choice(raw: Any, choices: tuple[str, ...]) -> Invalid:
    """dmlc's refusal of a name that is not in an enumeration."""
    text = shown(raw)
    return Invalid(text, f"Invalid Input: '{text}', valid values are: {choices_text(choices)}",
                   choices=choices)


class FieldType:
    name = "value"

    def convert(self, value: Value) -> Any:
        raise NotImplementedError

    def plain(self, value: Any) -> Any:
        return value

    def show(self, value: Any) -> str:
        """A default as documentation prints it."""
        return format_number(value)

    @staticmethod
    def scalar(value: Value) -> Scalar:
        if not isinstance(value, Scalar):
            raise Invalid(shown(value))
        return value


class IntType(FieldType):
    name = "int"

    def convert(self, value: Value) -> int:
        raw = self.scalar(value).raw
        if isinstance(raw, str):
            if len(raw) < 19 and raw.isdigit() and raw.isascii():
                return int(raw)  # the common case (a long list of steps), without the regex
            m = _INT_RE.fullmatch(raw.lstrip(C_SPACE).rstrip(DMLC_SPACE))
            if m is None or len(m.group(2)) > 19:  # more digits can only overflow int64
                raise Invalid(raw)
            out = int(m.group(1) + m.group(2))
        else:
            typed = _typed_int(raw)
            if typed is None:
                raise Invalid(shown(raw))
            out = typed
        if not INT64_MIN <= out <= INT64_MAX:
            raise Invalid(str(raw))
        return out


def parse_float(raw: str) -> float:
    """A float field's text, read as dmlc reads it: white space (not ``\\v``) before the
    number is skipped; the number is refused if nothing is left for it (dmlc reads ``e5``,
    ``.``, ``-``, ``f`` and a blank as 0: a **Decision** to refuse them); anything after it,
    white space included, is refused with dmlc's ``Some trailing characters`` words. A number
    beyond the range of a double (``1e999``), or one that would round to a silent 0
    (``1e-500``), is out of range (dmlc's strtod ERANGE; its own range is float32's)."""
    if _PLAIN_FLOAT_RE.fullmatch(raw):
        return _in_range(float(raw), raw, raw)
    text = raw.lstrip(DMLC_SPACE)
    m = _FLOAT_PREFIX_RE.match(text)
    if m is None:
        raise Invalid(raw)
    if m.group("inf") is not None:
        out = math.inf
    elif m.group("nan") is not None:
        out = math.nan
    else:
        digits = m.group("num")
        out = _in_range(float(digits), digits, raw)  # before any trailing text, as dmlc
    if m.end() < len(text):
        raise Invalid(raw, trailing=text[m.end():])
    return -out if m.group(1) == "-" else out


def _in_range(out: float, digits: str, raw: str) -> float:
    """``out`` read from ``digits``, unless a double cannot hold it. As dmlc (strtod's
    ERANGE): 1e999 is a mistake, not infinity, and 1e-500 not a silent 0. (dmlc refuses
    subnormals such as 2e-308 too; they are kept here, as the repr of every float reads
    back to itself.)"""
    if math.isinf(out) or (out == 0.0 and _NONZERO_RE.search(
            digits.partition("e")[0].partition("E")[0])):
        raise Invalid(raw, out_of_range=True)
    return out


class FloatType(FieldType):
    name = "float"

    def convert(self, value: Value) -> float:
        raw = self.scalar(value).raw
        if isinstance(raw, str):
            return parse_float(raw)
        if isinstance(raw, bool) or not hasattr(raw, "__float__"):
            raise Invalid(shown(raw))
        try:
            return float(raw)
        except OverflowError:  # an int beyond the range of float
            raise Invalid(shown(raw), out_of_range=True) from None
        except (TypeError, ValueError):
            raise Invalid(shown(raw)) from None


class BoolType(FieldType):
    name = "boolean"
    _TEXT: typing.ClassVar[dict[str, bool]] = {"true": True, "false": False, "1": True, "0": False}

    def convert(self, value: Value) -> bool:
        raw = self.scalar(value).raw
        if isinstance(raw, WrittenBool):
            return raw.value
        if isinstance(raw, str):
            # As dmlc: no white space around the word (it reads ' false' as no boolean).
            out = self._TEXT.get(raw.lower()) if raw.isascii() else None
            if out is None:
                raise Invalid(raw)
            return out
        if type(raw).__name__ in ("bool", "bool_"):
            return bool(raw)
        if _typed_int(raw) in (0, 1):
            return bool(raw)  # the typed form of the text "1" / "0"
        raise Invalid(shown(raw))

    def show(self, value: Any) -> str:
        return str(value)


class StrType(FieldType):
    """A string, optionally one of an enumeration of names (``enum=``)."""

    def __init__(self, choices: tuple[str, ...] | None = None):
        self.choices = choices

    @property
    def name(self) -> str:  # type: ignore[override]
        return "string" if self.choices is None else choices_text(self.choices)

    def convert(self, value: Value) -> str:
        raw = self.scalar(value).raw
        if self.choices is not None and (not isinstance(raw, str) or raw not in self.choices):
            raise not_a_choice(raw, self.choices)
        if not isinstance(raw, str):
            raise Invalid(shown(raw))
        return raw

    def show(self, value: Any) -> str:
        return repr(value)


class PathType(StrType):
    """A path to a file or a folder (``field(path=True)``): a string without a NUL byte.

    No system's file names hold a NUL, and the job files' text writes one only as an escape
    (``\\000``, ``\\x00``): refused where the value is given, as any other invalid value, not
    met as Python's ``embedded null byte`` when the file is opened.
    """

    def __init__(self) -> None:
        super().__init__(None)

    def convert(self, value: Value) -> str:
        text = super().convert(value)
        if "\x00" in text:
            where = text.index("\x00") + 1
            raise Invalid(printable(text), reason=(
                f"a path cannot hold a NUL byte (\\000 or \\x00, here character {where}); "
                "no file name holds one"))
        return text


class EnumType(FieldType):
    """A Python :class:`enum.Enum`; written as the member's name exactly as declared."""

    def __init__(self, cls: type[enum.Enum]):
        self.cls = cls
        self.choices = tuple(cls.__members__)

    @property
    def name(self) -> str:  # type: ignore[override]
        return choices_text(self.choices)

    def convert(self, value: Value) -> enum.Enum:
        raw = self.scalar(value).raw
        if isinstance(raw, self.cls):
            return raw
        if isinstance(raw, str) and raw in self.cls.__members__:
            return self.cls[raw]
        raise not_a_choice(raw, self.choices)

    def plain(self, value: Any) -> Any:
        return value.name

    def show(self, value: Any) -> str:
        return repr(value.name)


class OptionalType(FieldType):
    """``X | None``; the text ``None`` means no value. An optional enumeration is named as
    dmlc names its ``optional<int>`` enums, with ``None`` among the names: ``{None, 'a'}``."""

    def __init__(self, inner: FieldType):
        self.inner = inner
        self.choices: tuple[str, ...] | None = getattr(inner, "choices", None)

    @property
    def name(self) -> str:  # type: ignore[override]
        if self.choices is not None:
            return choices_text(self.choices, none=True)
        return f"{self.inner.name} or None"

    def convert(self, value: Value) -> Any:
        if isinstance(value, Scalar) and (
            value.raw is None or (isinstance(value.raw, str) and value.raw == "None"
                                  and not value.quoted)
        ):
            return None
        try:
            return self.inner.convert(value)
        except Invalid as e:
            if e.choices is None:
                raise
            raise Invalid(e.shown, f"Invalid Input: '{e.shown}', valid values are: "
                                   f"{choices_text(e.choices, none=True)}") from None

    def plain(self, value: Any) -> Any:
        return None if value is None else self.inner.plain(value)

    def show(self, value: Any) -> str:
        return "None" if value is None else self.inner.show(value)


_BRACKETED = re.compile(r"\s*[(\[]\s*(.*?)\s*[)\]]\s*", re.DOTALL)
_SPACE = re.compile(r"\s")


def split_sequence(raw: str, *, bare: bool) -> list[str]:
    """The item texts of a tuple or list written as text: ``(1, 2)``, ``[1,2]``, ``(3,)``,
    ``(3)``, ``()``, a bare ``5``; with ``bare`` also ``1,2,3`` without brackets (dmlc's
    ``std::vector`` text). Raises :class:`Invalid` for anything else (``(2 3)``, ``(1,2]``,
    ``(1,,2)``)."""
    m = _BRACKETED.fullmatch(raw)
    if m is None:
        body = raw.strip()
        if not bare and ("," in body or _SPACE.search(body)):
            raise Invalid(raw)
    else:
        if (raw.strip()[0] == "(") != (raw.strip()[-1] == ")"):
            raise Invalid(raw)
        body = m.group(1)
        if not body:
            return []
    parts = [p.strip() for p in body.split(",")]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # (3,) and 1,2,
    if any(p == "" or _SPACE.search(p) for p in parts):
        raise Invalid(raw)
    return parts


class TupleType(FieldType):
    """A shape: ``(1, 2)``, ``[1,2]``, ``(3,)``, ``()``, or a bare ``5`` meaning ``(5,)``."""

    def __init__(self, item: FieldType):
        self.item = item

    @property
    def name(self) -> str:  # type: ignore[override]
        # dmlc's names: TShape's, and Tuple<T>'s "tuple of <float>"
        return "Shape(tuple)" if isinstance(self.item, IntType) else f"tuple of <{self.item.name}>"

    def convert(self, value: Value) -> tuple[Any, ...]:
        if isinstance(value, ListValue):
            return tuple(self._item(v, value) for v in value.items)
        raw = self.scalar(value).raw
        if isinstance(raw, (tuple, list)):
            return tuple(self._item(Scalar(v), value) for v in raw)
        if not isinstance(raw, str):
            return (self._item(value, value),)
        return tuple(self._item(Scalar(p), value) for p in split_sequence(raw, bare=False))

    def _item(self, v: Value, whole: Value) -> Any:
        try:
            return self.item.convert(v)
        except Invalid:
            raise Invalid(shown(whole)) from None

    def plain(self, value: Any) -> Any:
        return [self.item.plain(v) for v in value]

    def show(self, value: Any) -> str:
        inner = ",".join(self.item.show(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"


class ListType(FieldType):
    """A repeated field: repetition in a file, list syntax, or a Python list."""

    def __init__(self, item: FieldType):
        self.item = item

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"list of {self.item.name}"

    def items(self, value: Value) -> Sequence[Value]:
        """The separate values of a repeated field (one written value may hold several).

        A list of numbers or booleans also reads dmlc's text forms of a ``std::vector``:
        ``(1,2,3)``, ``[1,2,3]``, ``1,2,3``, ``(10,)``, ``(10)``, ``10``. (Strings are taken
        whole: a layer name may hold a comma.)
        """
        if isinstance(value, ListValue):
            return value.items
        if isinstance(value, Scalar) and isinstance(value.raw, tuple):
            return [Scalar(v, value.where) for v in value.raw]
        if (isinstance(value, Scalar) and isinstance(value.raw, str)
                and isinstance(self.item, (IntType, FloatType, BoolType))):
            try:
                parts = split_sequence(value.raw, bare=True)
            except Invalid:
                return [value]  # the item's own conversion says what is wrong with it
            return [Scalar(p, value.where, value.quoted) for p in parts]
        return [value]

    def convert(self, value: Value) -> list[Any]:
        return [self.item.convert(v) for v in self.items(value)]

    def plain(self, value: Any) -> Any:
        return [self.item.plain(v) for v in value]

    def show(self, value: Any) -> str:
        return "[" + ", ".join(self.item.show(v) for v in value) + "]"


class NestedType(FieldType):
    """A nested configuration (a :class:`~paramserver.config.Parameter` subclass)."""

    def __init__(self, cls: Any):
        self.cls = cls  # a Parameter subclass (not imported here: parameter imports types)

    @property
    def name(self) -> str:  # type: ignore[override]
        return str(self.cls.__name__)

    def convert(self, value: Value) -> Any:
        if isinstance(value, Scalar) and isinstance(value.raw, self.cls):
            return value.raw.copy()
        if not isinstance(value, Block):
            raise Invalid(shown(value))
        return self.cls._build(value)

    def plain(self, value: Any) -> Any:
        return value.to_dict()

    def show(self, value: Any) -> str:
        return "{...}"


class Nested:
    """The base of configurations a field may nest (``Parameter``): known here by this mark,
    so that this module need not import the one that imports it."""


def type_for(annotation: Any, choices: tuple[str, ...] | None) -> FieldType:
    """The field type for an annotation such as ``int``, ``tuple[int, ...]`` or ``X | None``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return OptionalType(type_for(rest[0], choices))
        raise ParamError(f"unsupported union type {annotation!r}: only X | None")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return TupleType(type_for(args[0], None))
        if args and all(a == args[0] for a in args):
            return TupleType(type_for(args[0], None))
        raise ParamError(f"unsupported tuple type {annotation!r}: use tuple[T, ...]")
    if origin is list:
        return ListType(type_for(args[0], choices))
    if annotation is bool:
        return BoolType()
    if annotation is int:
        return IntType()
    if annotation is float:
        return FloatType()
    if annotation is str:
        return StrType(choices)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return EnumType(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Nested):
        return NestedType(annotation)
    raise ParamError(f"unsupported field type {annotation!r}")


def path_type(inner: FieldType, annotation: Any) -> FieldType:
    """``inner`` (the type of a ``str``, ``str | None`` or ``list[str]`` field) as the type
    of a path field (``field(path=True)``: :class:`PathType`)."""
    if isinstance(inner, StrType) and inner.choices is None:
        return PathType()
    if isinstance(inner, OptionalType):
        return OptionalType(path_type(inner.inner, annotation))
    if isinstance(inner, ListType):
        return ListType(path_type(inner.item, annotation))
    raise ParamError(f"path=True needs a field of type str, str | None or list[str], not "
                     f"{annotation!r}")
