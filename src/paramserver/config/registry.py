"""Registries: name -> component class, shared by init methods, updaters, lr methods, layers.

SINGA writes names as enum constants (``kSGD``, ``kUniformSqrtFanIn``); Python users write
``"sgd"`` or ``"uniform_sqrt_fan_in"``. A lookup ignores a leading ``k`` before a capital,
underscores, dashes and letter case, so every spelling finds the same component, and two
registrations that would be found by the same spelling are refused.

A registry may also be numbered (:meth:`Registry.set_numbers`), as SINGA's enums are: a field
whose values are its names then takes a number too (``type: 1`` for ``kSGD``), as protobuf's
text format allows.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import ParamError
from .tree import Value
from .types import FieldType, Invalid, StrType

T = TypeVar("T")


@functools.lru_cache(maxsize=1 << 16)  # a job file of 20,000 layers looks names up a million times
def normalise(name: str) -> str:
    """The lookup form of a name: ``kUniformSqrtFanIn`` == ``uniform_sqrt_fan_in``."""
    if len(name) > 1 and name[0] == "k" and name[1].isupper():
        name = name[1:]
    return name.replace("_", "").replace("-", "").lower()


class Registry(Generic[T]):
    """Named components of one kind (``kind`` names it in messages, e.g. ``"updater"``)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}       # canonical name -> component
        self._keys: dict[str, str] = {}      # normalised spelling -> canonical name
        self._aliases: dict[str, tuple[str, ...]] = {}  # canonical name -> as registered
        self._numbers: dict[int, str] = {}   # number -> name (SINGA's enum numbering)

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator: register a component under ``name`` (and ``aliases``)."""

        def decorate(obj: T) -> T:
            self.add(name, obj, aliases=aliases)
            return obj

        return decorate

    def add(self, name: str, obj: T, *, aliases: tuple[str, ...] = ()) -> None:
        keys = [normalise(n) for n in (name, *aliases)]
        for spelling, key in zip((name, *aliases), keys, strict=True):
            if not key:
                raise ParamError(f"{self.kind} names must not be empty")
            taken = self._keys.get(key)
            if taken is not None:
                raise ParamError(f"{self.kind} name '{spelling}' is already registered "
                                 f"(as '{taken}' for {_describe(self._items[taken])})")
        self._items[name] = obj
        self._aliases[name] = tuple(aliases)
        for key in keys:
            self._keys[key] = name
        self._changed()

    def _changed(self) -> None:
        """Called when a name is added or removed (a subclass forgets what it derived)."""

    def aliases(self, name: str) -> tuple[str, ...]:
        """The other spellings a component was registered with (for documentation)."""
        return self._aliases.get(self.lookup(name), ())

    def remove(self, name: str) -> None:
        """Forget a component (tests and interactive sessions re-register)."""
        canonical = self.lookup(name)
        del self._items[canonical]
        self._aliases.pop(canonical, None)
        self._keys = {k: v for k, v in self._keys.items() if v != canonical}
        self._changed()

    def lookup(self, name: str) -> str:
        """The canonical name for any accepted spelling; ParamError listing names otherwise."""
        canonical = self._keys.get(normalise(name)) if isinstance(name, str) else None
        if canonical is None:
            close = difflib.get_close_matches(normalise(str(name)), list(self._keys), n=1)
            hint = f"\nDid you mean '{self._keys[close[0]]}'?" if close else ""
            raise ParamError(
                f"Invalid Input: '{name}', valid values are: {self.choices()}{hint}")
        return canonical

    def get(self, name: str) -> T:
        return self._items[self.lookup(name)]

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._items.items()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalise(name) in self._keys

    def choices(self) -> str:
        return "{" + ", ".join(repr(n) for n in sorted(self._items)) + "}"

    def field_type(self) -> FieldType:
        """A field type whose values are this registry's names (for ``field(enum=registry)``)."""
        return _RegistryName(self)

    def set_numbers(self, numbers: dict[int, str]) -> None:
        """Number the names (SINGA's enum values): a field of this registry then takes a
        number as well as a name."""
        self._numbers = dict(numbers)

    @property
    def numbered(self) -> bool:
        return bool(self._numbers)

    def by_number(self, number: int) -> str:
        """The name numbered ``number``; ParamError listing the numbers otherwise."""
        name = self._numbers.get(number)
        if name is None:
            known = ", ".join(f"{n} = {v}" for n, v in sorted(self._numbers.items()))
            raise ParamError(f"Invalid Input: '{number}', no {self.kind} has this number; "
                             f"the numbers are: {known}")
        return name

    def numbers(self) -> dict[int, str]:
        return dict(self._numbers)

    @staticmethod
    def extension_name(name: str) -> str:
        """The extension block of a user component: ``FooParam`` -> ``fooparam_conf``."""
        return f"{name.lower()}_conf"


class _RegistryName(StrType):
    def __init__(self, registry: Registry[Any]):
        super().__init__(None)
        self.registry = registry

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.registry.choices() if self.registry.names() else "string"

    def convert(self, value: Value) -> str:
        raw = self.scalar(value).raw
        try:
            number = enum_number(raw) if self.registry.numbered else None
            if number is not None:
                raw = self.registry.by_number(number)
            sentinel = getattr(self.registry, "user_sentinel", None)
            if sentinel is not None and isinstance(raw, str) and normalise(raw) == normalise(
                    sentinel):
                return str(sentinel)  # "named by user_type" (SINGA's kUserUpdater, ...)
            return self.registry.lookup(raw)
        except ParamError as e:
            raise Invalid(str(raw), str(e)) from None


def enum_number(raw: Any) -> int | None:
    """The number an enum value is given as (``1``, or ``0x1`` read by the job-file reader),
    or None for a name."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return int(raw)
    if isinstance(raw, str) and raw.strip().isdigit() and raw.strip().isascii():
        return int(raw.strip())
    return None


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
