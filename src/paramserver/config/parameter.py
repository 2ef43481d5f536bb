"""Declarative configuration after dmlc-core's ``Parameter``.

One declaration gives parsing from text, defaults, checks, documentation and serialisation::

    class FC(Parameter):
        num_hidden: int = field(doc="Number of hidden units.", lower=1)
        learning_rate: float = field(0.01, lower=0.0, doc="Learning rate.")
        activation: str = field("relu", enum=("relu", "sigmoid"))

    FC.parse({"num_hidden": "10"})   # FC(num_hidden=10, learning_rate=0.01, activation='relu')
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar, TypeVar

from .errors import Location, MoreProblems, ParamError, Problem, Problems
from .tree import Block, Entry, ListValue, Value, unwrap, wrap
from .types import (
    FieldType,
    Invalid,
    ListType,
    Nested,
    NestedType,
    OptionalType,
    format_number,
    path_type,
    shown,
    type_for,
)

_MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "MISSING"})()
_BAD: Any = type("BAD", (), {})()
_MADE: Any = type("MADE", (), {})()  # a default made anew for each configuration
_REQUIRED: Any = type("REQUIRED", (), {})()
P = TypeVar("P", bound="Parameter")
_MAX_ITEM_PROBLEMS = 20  # bad values of one list reported one by one; the rest are counted
Where = Location | str | None


class Field:
    """One declared field; made by :func:`field`, completed when its class is declared."""

    def __init__(self, default: Any, factory: Callable[[], Any] | None, doc: str,
                 lower: float | None, upper: float | None, lower_exclusive: bool,
                 enum: Any, aliases: tuple[str, ...], finite: bool = False,
                 not_nan: bool = False, path: bool = False):
        self.default = default
        self.path = path
        self.factory = factory
        self.doc = doc
        self.lower = lower
        self.upper = upper
        self.lower_exclusive = lower_exclusive
        self.finite = finite
        self.not_nan = not_nan or finite
        self.enum = enum
        self.aliases = aliases
        self.name = ""
        self.type: FieldType = FieldType()

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.factory is None

    def make_default(self) -> Any:
        if self.factory is not None:
            return self.factory()
        return _copied(self.default, {})

    def convert(self, value: Value) -> Any:
        """Parse and check one value; raises :class:`ParamError` with the dmlc message."""
        try:
            out = self.type.convert(value)
        except Invalid as e:
            raise ParamError(e.text(self.name, self.type.name)) from None
        self.check_bounds(out)
        return out

    def check_bounds(self, value: Any) -> None:
        if self.lower is None and self.upper is None and not self.not_nan:
            return
        values = value if isinstance(value, (list, tuple)) else [value]  # each element
        for v in values:
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if self.finite and not math.isfinite(v):
                raise ParamError(f"value {format_number(v)} for Parameter {self.name} "
                                 f"should be a finite number\n{self.name}: {self.doc}")
            if self.not_nan and v != v:
                raise ParamError(f"value nan for Parameter {self.name} should be a number "
                                 f"(inf and -inf are), not nan\n{self.name}: {self.doc}")
            lo, hi = self.lower, self.upper
            below = lo is not None and not (v > lo if self.lower_exclusive else v >= lo)
            above = hi is not None and not v <= hi  # nan is within no bound
            if not (below or above):
                continue
            if lo is not None and hi is not None:
                bound = (f"exceed bound {'(' if self.lower_exclusive else '['}"
                         f"{format_number(lo)},{format_number(hi)}]")
            elif lo is not None:
                bound = ("should be greater than " if self.lower_exclusive
                         else "should be greater equal to ") + format_number(lo)
            else:
                bound = f"should be smaller equal to {format_number(hi)}"
            raise ParamError(f"value {format_number(v)} for Parameter {self.name} {bound}\n"
                             f"{self.name}: {self.doc}")

    def describe(self) -> str:
        """This field's entry in the documentation, in dmlc's numpy-docstring layout."""
        head = f"{self.name} : {self.type.name}, "
        if self.required:
            head += "required"
        else:
            value = self.make_default()
            head += f"optional, default={self.type.show(value)}"
        if self.doc:
            head += "\n    " + self.doc.replace("\n", "\n    ")
        return head


def field(default: Any = _MISSING, *, doc: str = "", lower: float | None = None,
          upper: float | None = None, lower_exclusive: bool = False,
          enum: Any = None, aliases: Iterable[str] = (),
          factory: Callable[[], Any] | None = None, finite: bool = False,
          not_nan: bool = False, path: bool = False) -> Any:
    """Declare a field of a :class:`Parameter`.

    Args:
        default: the value when the key is not given; leave it out for a required field.
        doc: one line (or a few) describing the field; printed by ``doc()`` and in errors.
        lower: inclusive lower bound (exclusive with ``lower_exclusive=True``).
        upper: inclusive upper bound.
        enum: the allowed names of a string field, or a :class:`Registry` whose names it takes.
        aliases: other keys accepted for this field (e.g. SINGA's ``freq``).
        factory: a callable giving the default, for nested configurations and lists.
        finite: refuse ``inf``, ``-inf`` and ``nan`` (rates, scales, decays: a value that
            would make every parameter non-finite).
        not_nan: refuse ``nan`` only (a bound that may be infinite: a gradient clipped on
            one side, ``clip_low: -inf``).
        path: the value names a file or a folder (a ``str``, ``str | None`` or ``list[str]``
            field): a NUL byte in it is refused where it is given, as an invalid value.

    Returns:
        The field declaration, assigned to an annotated class attribute.
    """
    if isinstance(enum, str):
        raise ParamError("enum= takes a tuple of names, not one string")
    return Field(default, factory, doc, lower, upper, lower_exclusive,
                 tuple(enum) if isinstance(enum, (list, tuple)) else enum, tuple(aliases),
                 finite, not_nan, path)


def _unknown_key(cls: Any, key: str, where: Location | str | None) -> Problem:
    """dmlc's message for a key ``cls`` does not have."""
    return Problem(f"Cannot find argument '{key}', Possible Arguments:\n{'-' * 16}\n"
                   f"{cls.doc()}{_suggest(key, cls.__keys__)}", where)


def _suggest(key: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return f"\nDid you mean '{close[0]}'?" if close else ""


class Parameter(Nested):
    """Base class of every declared configuration; see the module docstring."""

    __fields__: ClassVar[dict[str, Field]] = {}
    __keys__: ClassVar[dict[str, str]] = {}   # name or alias -> field name

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, Field] = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "__fields__", {}))
        localns = {cls.__name__: cls, **dict(vars(cls))}
        try:
            hints = typing.get_type_hints(cls, None, localns)
        except NameError as e:
            raise ParamError(f"{cls.__name__}: cannot resolve a field type: {e}") from None
        own = inspect.get_annotations(cls)
        for name, value in vars(cls).items():
            if isinstance(value, Field) and name not in own:
                raise ParamError(f"{cls.__name__}.{name}: a field needs a type annotation "
                                f"({name}: int = field(...))")
        problems = []
        for name in own:
            if hints[name] is ClassVar or typing.get_origin(hints[name]) is ClassVar:
                continue
            hidden = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
            if hidden is not None:  # a field named update or check would break the class
                raise ParamError(f"{cls.__name__}.{name}: a field may not hide "
                                f"{hidden.__name__}.{name}")
            value = cls.__dict__.get(name, _MISSING)
            f = value if isinstance(value, Field) else field(value)
            f.name = name
            f.type = _field_type(hints[name], f.enum)
            if f.path:
                f.type = path_type(f.type, hints[name])
            fields[name] = f
            if not f.required and f.factory is None and not hasattr(f.enum, "field_type"):
                # The default goes through the field's own parsing and checks (type, enum,
                # bounds), and is kept in its typed form (0 -> 0.0 for a float field).
                # Registry names are left: registries fill after their classes are declared.
                try:
                    f.default = f.convert(wrap(f.default, None))
                except ParamError as e:
                    problems.append(f"{cls.__name__}.{name} default: {e}")
            if name in cls.__dict__:
                delattr(cls, name)
        if problems:
            raise ParamError(problems)
        cls.__fields__ = fields
        keys: dict[str, str] = {}
        for f in fields.values():
            for k in (f.name, *f.aliases):
                if keys.get(k, f.name) != f.name:
                    raise ParamError(f"{cls.__name__}: key {k!r} names two fields")
                keys[k] = f.name
        cls.__keys__ = keys

    # -- construction -----------------------------------------------------------------------

    def __init__(self, **kwargs: Any):
        """Make a configuration from keyword arguments (typed or text), defaults elsewhere."""
        built = type(self)._build(Block.from_mapping(kwargs))
        object.__setattr__(self, "__dict__", built.__dict__)

    @classmethod
    def parse(cls: type[P], mapping: Mapping[str, Any] | Block, *,
              allow_unknown: bool = False) -> Any:
        """Make a configuration from a mapping of keys to values (text or already typed).

        Explicit keys are parsed and checked, every other field takes its default. All
        problems (unknown, missing, invalid keys) are reported together in one ParamError.

        Returns:
            The instance; with ``allow_unknown=True`` a pair ``(instance, unknown_dict)``.
        """
        block = _block(cls, mapping)
        unknown: dict[str, Any] = {}
        obj = cls._build(block, unknown if allow_unknown else None)
        return (obj, unknown) if allow_unknown else obj

    @classmethod
    def _build(cls: type[P], block: Block, unknown: dict[str, Any] | None = None) -> P:
        obj = cls.__new__(cls)
        given, problems = cls._collect(block, unknown)
        values: dict[str, Any] = {}
        for name, default, f in cls._defaults():
            if name in given:
                values[name] = given[name]
            elif default is _MADE:
                values[name] = f.make_default()
            elif default is _REQUIRED:
                problems.add(Problem(
                    f"Required parameter {name} of {f.type.name} is not presented", block.where))
            else:
                values[name] = default
        values.update(given)  # dynamic fields, after the declared ones
        if problems:  # a value given but invalid is not kept
            values = {k: v for k, v in values.items() if v is not _BAD}
        object.__setattr__(obj, "__dict__", values)
        if not problems:
            problems.extend(_placed(m, block) for m in obj.check())
        if problems:
            raise ParamError(problems.result())
        return obj

    @classmethod
    def _defaults(cls) -> list[tuple[str, Any, Field]]:
        """Per field, in order: its name, its default when that cannot change (kept, not
        copied), else ``_MADE`` (made anew each time) or ``_REQUIRED``; and the field. Worked
        out once per class: a job of 20,000 layers builds a hundred thousand configurations."""
        found: list[tuple[str, Any, Field]] | None = cls.__dict__.get("_default_plan")
        if found is None:
            found = [(name, _REQUIRED if f.required else f.default
                      if f.factory is None and type(f.default) in _UNCHANGING else _MADE, f)
                     for name, f in cls.__fields__.items()]
            cls._default_plan = found  # type: ignore[attr-defined]
        return found

    @classmethod
    def _collect(cls, block: Block, unknown: dict[str, Any] | None
                 ) -> tuple[dict[str, Any], Problems]:
        """Parse a block's entries into field values; problems are gathered, not raised."""
        grouped: dict[str, list[Entry]] = {}
        problems = Problems()
        for entry in block.entries:
            key = entry.key
            if (not entry.extension and len(key) > 4 and key.startswith("__")
                    and key.endswith("__")):
                continue  # hidden keys, as dmlc passes them over
            name = cls.__keys__.get(key) if not entry.extension else None
            if name is None:
                name = cls._dynamic_key(entry)
            if name is None:
                if unknown is not None:
                    unknown[f"[{key}]" if entry.extension else key] = unwrap(entry.value)
                else:
                    problems.add(partial(_unknown_key, cls, key, entry.where), entry.where)
                continue
            grouped.setdefault(name, []).append(entry)
        values: dict[str, Any] = {}
        for name, entries in grouped.items():
            f = cls._field(name)
            try:
                values[name] = cls._convert_entries(f, entries)
            except ParamError as e:
                values[name] = _BAD  # given, though invalid: not also reported as missing
                problems.extend(e.at(entries[-1].where).problems)
        return values, problems

    @classmethod
    def _convert_entries(cls, f: Field, entries: list[Entry]) -> Any:
        list_type = f.type if isinstance(f.type, ListType) else None
        if list_type is None and isinstance(f.type, OptionalType) and isinstance(
                f.type.inner, ListType):
            list_type = f.type.inner
        if list_type is None:
            if len(entries) > 1:
                where = entries[0].where
                raise ParamError(f"{f.name} is given more than once"
                                 + (f" (first at {where})" if where else ""))
            return f.convert(entries[0].value)
        out: list[Any] = []
        problems: list[Problem] = []
        bad, first_bad = 0, None  # bad values past the first _MAX_ITEM_PROBLEMS, counted
        convert = list_type.item.convert
        for e in entries:  # each item made when its turn comes: a list may be millions long
            for item in list_type.items(e.value):
                try:
                    out.append(convert(item))
                except (Invalid, ParamError) as err:
                    where = getattr(item, "where", None)
                    if len(problems) >= _MAX_ITEM_PROBLEMS:
                        bad += 1
                        first_bad = first_bad if first_bad is not None else where
                    elif isinstance(err, Invalid):
                        problems.append(Problem(err.text(f.name, list_type.item.name), where))
                    else:  # a nested configuration's (capped already)
                        problems.extend(err.problems)
        if bad:  # a long list of bad values: the first ones
            problems.append(MoreProblems(f"... and {bad:,} more bad values of {f.name}",
                                         first_bad, bad))
        if problems:
            raise ParamError(problems)
        f.check_bounds(out)
        return out

    @classmethod
    def _field(cls, name: str) -> Field:
        f = cls.__fields__.get(name)
        return f if f is not None else cls._dynamic_field(name)

    @classmethod
    def _dynamic_key(cls, entry: Entry) -> str | None:
        """The field name for a key this class did not declare (None: unknown).

        Subclasses whose keys depend on registered components (a layer's ``*_conf``) return
        a name here and give its :class:`Field` from :meth:`_dynamic_field`.
        """
        return None

    @classmethod
    def _dynamic_field(cls, name: str) -> Field:
        raise KeyError(name)

    def check(self) -> Sequence[str | Problem]:
        """Checks across fields, run after every field is parsed; returns problem messages.

        A message placed at a value of this configuration is a :class:`Problem` whose
        ``where`` is the value's key path relative to it (``"layer[2].srclayers[0]"``,
        counting repeated keys and list items alike); it is reported at that value's place in
        the file (or at that key path for a mapping). A plain string is reported at the
        configuration's own place.
        """
        return []

    # -- update, copy, comparison -----------------------------------------------------------

    def update(self, mapping: Mapping[str, Any], *, allow_unknown: bool = True
               ) -> dict[str, Any]:
        """Set only the keys given, checked; atomic. Returns the keys this class does not know."""
        block = _block(type(self), mapping)
        unknown: dict[str, Any] | None = {} if allow_unknown else None
        values, problems = type(self)._collect(block, unknown)
        if not problems:
            trial = copy.copy(self)
            trial.__dict__.update(values)
            problems.extend(m if isinstance(m, Problem) else Problem(m) for m in trial.check())
        if problems:
            raise ParamError(problems.result())
        self.__dict__.update(values)
        global _changes
        _changes += 1
        return unknown or {}

    def __setattr__(self, name: str, value: Any) -> None:
        f = self.__fields__.get(name)
        if f is None and name not in self.__dict__:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}"
                                 + _suggest(name, self.__keys__).replace("\n", " "))
        self.update({name: value}, allow_unknown=False)

    def copy(self: P) -> P:
        return copy.deepcopy(self)

    def __deepcopy__(self: P, memo: dict[int, Any]) -> P:
        # copy.deepcopy's own way costs some 50 µs for a Param's configuration, and a job
        # of 40,000 Params copies each: values that cannot change are kept, not copied.
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        object.__setattr__(new, "__dict__", {k: _copied(v, memo)
                                             for k, v in self.__dict__.items()})
        return new

    def non_defaults(self) -> dict[str, Any]:
        """The values of required fields and of fields not at their defaults, in declaration
        order, then those of fields the class does not declare (a component's own block)."""
        values = self.__dict__
        out: dict[str, Any] = {}
        for name, default, f in type(self)._defaults():
            if name in values:
                value = values[name]
                if default is _MADE:
                    default = f.make_default()
                if default is _REQUIRED or value != default:
                    out[name] = value
        out.update((k, v) for k, v in values.items() if k not in self.__fields__)
        return out

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({inner})"

    # -- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-able): nested configurations as dicts, tuples as lists."""
        return {k: self._field(k).type.plain(v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls: type[P], d: Mapping[str, Any]) -> P:
        return cls.parse(d)  # type: ignore[no-any-return]

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls: type[P], text: str) -> P:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParamError(f"invalid JSON for {cls.__name__}: {e}") from None
        if not isinstance(data, dict):
            raise ParamError(f"JSON for {cls.__name__} must be an object, "
                             f"not {type(data).__name__}")
        return cls.parse(data)  # type: ignore[no-any-return]

    # -- documentation ----------------------------------------------------------------------

    @classmethod
    def doc(cls) -> str:
        """The documentation of every field, in declaration order, in dmlc's layout."""
        return "\n".join(f.describe() for f in cls.__fields__.values())

    @classmethod
    def fields(cls) -> dict[str, Field]:
        """The declared fields by name, in declaration order."""
        return dict(cls.__fields__)


_UNCHANGING = frozenset({str, int, float, bool, type(None)})


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    """A deep copy of a field's value: the value itself where it cannot change."""
    kind = type(value)
    if kind in _UNCHANGING:
        return value
    if kind is list and all(type(x) in _UNCHANGING for x in value):
        return list(value)
    if isinstance(value, Parameter) and id(value) not in memo:
        return value.__deepcopy__(memo)
    return copy.deepcopy(value, memo)


#: Configurations changed in place so far (see :func:`changes`).
_changes = 0


def changes() -> int:
    """How many times a configuration has been changed in place in this process (by
    :meth:`Parameter.update` or an assignment to a field). Values read from configurations
    may be kept while it stays the same (a ParamSet keeps its Params' ``lr_scale`` so)."""
    return _changes


def _placed(message: str | Problem, block: Block) -> Problem:
    """A problem of :meth:`Parameter.check`, at the place its relative key path names in
    ``block`` (the block's own place when it names none, or nothing found)."""
    if not isinstance(message, Problem):
        return Problem(message, block.where)
    if not isinstance(message.where, str):
        return message if message.where is not None else Problem(message.message, block.where)
    value: Value = block
    for part in message.where.split("."):
        key, _, rest = part.partition("[")
        index = int(rest.rstrip("]")) if rest.rstrip("]").isdigit() else 0
        if not isinstance(value, Block):
            break
        found = [e.value for e in value.entries if e.key == key and not e.extension]
        at = index
        for v in found:  # the index-th value, a list's items counted without being made
            n = len(v.items) if isinstance(v, ListValue) else 1
            if at < n:
                value = v.items[at] if isinstance(v, ListValue) else v
                break
            at -= n
        else:
            break
    else:
        return Problem(message.message, value.where or block.where)
    return Problem(message.message, block.where)


def _block(cls: type, mapping: Any) -> Block:
    if isinstance(mapping, Block):
        return mapping
    if not isinstance(mapping, Mapping):
        raise ParamError(f"{cls.__name__} is configured by a mapping of keys to values, "
                         f"not {type(mapping).__name__}")
    return Block.from_mapping(mapping)


def _field_type(annotation: Any, enum: Any) -> FieldType:
    hook = getattr(enum, "field_type", None)
    if hook is not None:  # a Registry: its names are the allowed values
        inner = hook()
        if annotation is str:
            return inner  # type: ignore[no-any-return]
        if typing.get_args(annotation) and type(None) in typing.get_args(annotation):
            return OptionalType(inner)
        if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
            return ListType(inner)  # a repeated enum field (SINGA's include: kTrain)
    return type_for(annotation, enum)


__all__ = ["Field", "NestedType", "Parameter", "changes", "field", "shown"]
