"""Configurations that select a registered component by name (``type`` / ``user_type``).

SINGA writes such a block as ``updater { type: kRMSProp rmsprop_conf { rho: 0.9 } }``: the
common fields, plus one ``*_conf`` block read by the selected component. A user's component is
chosen with ``user_type: "Foo"`` and configured in an extension block ``[foo_conf] { ... }``.
:class:`ComponentConf` gives every such configuration that behaviour once.

Components are registered in the four registries below by the modules that define them,
imported on first look-up (so this layer imports nothing of the layers above it).
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Iterator
from functools import partial
from typing import Any, ClassVar, TypeVar

from .errors import ParamError, Problem, Problems
from .parameter import Field, Parameter, _suggest, field
from .registry import Registry, normalise
from .singa_enums import CHANGE_METHOD, INIT_METHOD, LAYER_TYPE, LAYER_TYPE_V010, UPDATER_TYPE
from .tree import Block, Entry, Scalar
from .types import NestedType

P = TypeVar("P", bound="ComponentConf")
_NONE: Any = object()


class ComponentRegistry(Registry[Any]):
    """A registry whose built-in components are defined in ``builtins`` (module names).

    ``numbers`` is SINGA's numbering of the enum that selects the component
    (:mod:`.singa_enums`); ``user_sentinel`` the value of that enum that means "the
    component is named by ``user_type``" (``kUserUpdater``), which SINGA writes as the
    default of ``type``.
    """

    def __init__(self, kind: str, builtins: tuple[str, ...] = (),
                 numbers: dict[str, int] | None = None, user_sentinel: str | None = None,
                 user_namespace: bool = False):
        super().__init__(kind)
        self._builtins = builtins
        self._loading = False
        # What the look-ups below derived from the names, until a name is added or removed:
        # a job of 20,000 layers looks its layers' names up a million times.
        self._memo: dict[tuple[str, str], Any] = {}
        self.user_sentinel = user_sentinel
        self.user_namespace = user_namespace
        if numbers:
            self.set_numbers({n: name for name, n in numbers.items()})

    # -- users' components in their own namespace -------------------------------------------
    #
    # With ``user_namespace`` (the layers), a class registered from outside paramserver's own
    # modules is kept under ``user:<name>``: SINGA's user layers live apart from its built-in
    # ones (rnnlm's ``kData`` is not the built-in kData), so a user may register any name.
    # ``user_type`` finds only these; ``type`` finds a built-in first, then a user's.

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Any:
        def decorate(obj: Any) -> Any:
            if self.user_namespace and is_users(obj):
                self.add(USER + name, obj, aliases=tuple(USER + a for a in aliases))
            else:
                self.add(name, obj, aliases=aliases)
            return obj

        return decorate

    def _changed(self) -> None:
        self._memo.clear()

    def _remembered(self, what: str, name: Any, work: Any) -> Any:
        """``work(name)``, remembered (names only; errors are raised again each time)."""
        if type(name) is not str:
            return work(name)
        key = (what, name)
        found = self._memo.get(key, _NONE)
        if found is _NONE:
            found = self._memo[key] = work(name)
        return found

    def remove(self, name: str) -> None:
        if self.user_namespace and not name.startswith(USER) and self.user_lookup(name):
            name = USER + name
        super().remove(name)

    def is_sentinel(self, name: object) -> bool:
        """Whether ``name`` is the enum value meaning "see user_type" (``kUserLayer``)."""
        return (isinstance(name, str) and self.user_sentinel is not None
                and normalise(name) == normalise(self.user_sentinel))

    def user_lookup(self, name: str) -> str | None:
        """The canonical name of a component registered by a user (outside paramserver's own
        modules) under ``name``; None if there is none. SINGA's ``user_type`` names these:
        its built-in and user components live apart (in a registry with ``user_namespace``
        they are registered as ``user:<name>``)."""
        if not isinstance(name, str):
            return None
        self.load()
        return self._remembered("user", name, self._user_lookup)  # type: ignore[no-any-return]

    def _user_lookup(self, name: str) -> str | None:
        if self.user_namespace:
            key = name if name.startswith(USER) else USER + name
            return Registry.lookup(self, key) if Registry.__contains__(self, key) else None
        if name not in self:
            return None
        canonical = self.lookup(name)
        return canonical if is_users(self.get(canonical)) else None

    def load(self) -> None:
        if self._builtins and not self._loading:
            self._loading = True
            for module in self._builtins:
                try:
                    importlib.import_module(module)
                except ModuleNotFoundError as e:  # a layer not installed: none registered
                    if e.name is None or not module.startswith(e.name):
                        raise

    def lookup(self, name: str) -> str:
        self.load()
        return self._remembered("lookup", name, self._lookup)  # type: ignore[no-any-return]

    def _lookup(self, name: str) -> str:
        if self.user_namespace and isinstance(name, str) and not super().__contains__(name):
            user = self.user_lookup(name)
            if user is not None:
                return user
        return super().lookup(name)

    def names(self) -> list[str]:
        self.load()
        return super().names()

    def __contains__(self, name: object) -> bool:
        self.load()
        return self._remembered("in", name, self._contains)  # type: ignore[no-any-return]

    def _contains(self, name: object) -> bool:
        return super().__contains__(name) or (
            self.user_namespace and isinstance(name, str)
            and super().__contains__(USER + name))

    def items(self) -> Iterator[tuple[str, Any]]:
        self.load()
        return super().items()

    def choices(self) -> str:
        self.load()
        return super().choices()

    def conf_name(self, name: str) -> str | None:
        """The key of the component's own configuration block (``step_conf``), if it has one."""
        self.load()
        return self._remembered("conf", name, self._conf_name)  # type: ignore[no-any-return]

    def _conf_name(self, name: str) -> str | None:
        component = self.get(name)
        if getattr(component, "Config", None) is None:
            return None
        explicit: str | None = getattr(component, "conf_name", None)
        canonical = self.lookup(name).removeprefix(USER)
        if len(canonical) > 1 and canonical[0] == "k" and canonical[1].isupper():
            canonical = canonical[1:]
        return explicit or self.extension_name(canonical)

    def by_conf_name(self, key: str) -> str | None:
        """The component whose own configuration block is ``key`` (the first registered)."""
        self.load()
        found = self._memo.get(("by conf", ""))
        if found is None:
            found = {}
            for name, _ in self.items():
                found.setdefault(self.conf_name(name), name)
            self._memo[("by conf", "")] = found
        return found.get(key)  # type: ignore[no-any-return]


#: The prefix of users' components in a registry with a user namespace.
USER = "user:"


def is_users(obj: Any) -> bool:
    """Whether ``obj`` was defined outside paramserver's own modules (a user's component)."""
    module = getattr(obj, "__module__", "") or ""
    return module.split(".")[0] != "paramserver"


param_generators = ComponentRegistry("init method", ("paramserver.init",),
                                     INIT_METHOD, "kUserInit")
updaters = ComponentRegistry("updater", ("paramserver.updaters",), UPDATER_TYPE,
                             "kUserUpdater")
lr_methods = ComponentRegistry("learning-rate method", ("paramserver.schedules",),
                               CHANGE_METHOD, "kUserChange")
#: Layers: paramserver's own, then every other SINGA layer type, registered as not built yet
#: (see :mod:`paramserver.singa.layers`; the layers issue replaces them one by one).
layers = ComponentRegistry("layer", ("paramserver.train.layers", "paramserver.singa.layers"),
                           user_sentinel="kUserLayer", user_namespace=True)
layers.set_numbers({**{n: name for name, n in LAYER_TYPE_V010.items()},
                    **{n: name for name, n in LAYER_TYPE.items()}})


class ComponentConf(Parameter):
    """Common fields of a component's configuration, plus the selected component's own block.

    Subclasses set ``registry`` and declare ``type`` (with a default) and ``user_type``.
    After parsing, :attr:`component` is the canonical name of the selected component and
    :attr:`own` its own configuration (an instance of the component's ``Config``) or None.
    """

    registry: ClassVar[ComponentRegistry]
    type: str | None  # a subclass may leave it out when user_type is given (a layer)
    user_type: str | None

    @property
    def component(self) -> str:
        name = self.user_type or self.type
        if name is None:
            raise ParamError(f"no {self.registry.kind} given: set type or user_type")
        if self.registry.is_sentinel(name):
            raise ParamError(f"type {self.registry.user_sentinel} selects a user's "
                             f"{self.registry.kind}: name it with user_type")
        return self.registry.lookup(name)

    @property
    def own(self) -> Any:
        key = self.registry.conf_name(self.component)
        return None if key is None else self.__dict__.get(key)

    @classmethod
    def _dynamic_key(cls, entry: Entry) -> str | None:
        if not entry.key.endswith("_conf"):
            return None
        if entry.extension:
            return entry.key
        return entry.key if cls.registry.by_conf_name(entry.key) is not None else None

    @classmethod
    def _dynamic_field(cls, name: str) -> Field:
        component = cls.registry.by_conf_name(name)
        if component is None:
            raise KeyError(name)
        f = field(doc=f"configuration of {component}")
        f.name = name
        f.type = NestedType(cls.registry.get(component).Config)
        return f

    @classmethod
    def _build(cls: builtins.type[P], block: Block, unknown: dict[str, Any] | None = None
               ) -> P:
        extensions = [e for e in block.entries if e.extension]
        known = [e for e in block.entries if not e.extension]
        # A user's component may read a block named like a built-in one's (rnnlm's kData
        # reads data_conf): written without brackets (a dict in Python), it is the selected
        # component's, as its bracketed extension block would be.
        selected = cls._selected_component(known)
        key = cls.registry.conf_name(selected) if selected is not None else None
        if key is not None and cls.registry.by_conf_name(key) != selected:
            extensions += [Entry(e.key, e.value, e.where, True) for e in known if e.key == key]
            known = [e for e in known if e.key != key]
        loose: dict[str, Any] = {}
        try:
            obj = super()._build(Block(known, block.where), loose)
        except ParamError as err:
            # A common field is wrong (a misspelt type, say): the loose keys that no
            # component could read are mistakes as well, reported in the same run.
            component = cls._named_component(known)
            own = cls._own_keys(component) if component else cls._all_own_keys()
            raise ParamError(cls._user_type_hint(err.problems, known) + cls._unknown_keys(
                {k: v for k, v in loose.items() if k not in own}, known, block,
                own)) from None
        problems: list[Problem] = []
        try:
            component = obj.component
        except ParamError as err:
            key = "user_type" if obj.user_type else "type"
            where = next((x.where for x in known if x.key == key), block.where)
            raise err.at(where) from None
        conf_key = cls.registry.conf_name(component)
        own_keys = cls._own_keys(component)
        # Loose keys of neither the common fields nor the component's own: unknown here,
        # with a suggestion from both sets of keys (momentun: did you mean momentum?).
        stray = {k: v for k, v in loose.items() if k not in own_keys}
        loose = {k: v for k, v in loose.items() if k in own_keys}
        # Every *_conf block must belong to the component selected.
        for name in [k for k in obj.__dict__ if k not in cls.__fields__]:
            if name != conf_key:
                entry = next(e for e in known if e.key == name)
                problems.append(Problem(
                    f"{name} is given but the {cls.registry.kind} is '{component}'"
                    + (f", which reads {conf_key}" if conf_key else ", which has no *_conf"),
                    entry.where))
        for ext in extensions:
            if ext.key != conf_key:
                problems.append(Problem(
                    f"extension block [{ext.key}] does not belong to {cls.registry.kind} "
                    f"'{component}'" + (f" (expected [{conf_key}])" if conf_key else ""),
                    ext.where))
        own_entries = [e for e in extensions if e.key == conf_key]
        if conf_key is not None and loose and (own_entries or conf_key in obj.__dict__):
            # The own configuration given as a block, and some of its keys loose as well.
            problems.append(Problem(f"give {conf_key} either as a block or as keys, "
                                    f"not both: {sorted(loose)}", block.where))
            loose = {}
        if conf_key is not None and conf_key not in obj.__dict__:
            # Loose keys (Python keyword arguments) go to the component's own configuration.
            config = cls.registry.get(component).Config
            here = block.where if not isinstance(block.where, (str, type(None))) else ".".join(
                x for x in (block.where, conf_key) if x)
            own_block = own_entries[0].value if own_entries else Block([], here)
            if loose and not own_entries:  # each at its own place (a file's, a --set's)
                own_block = Block([e for e in known if e.key in loose], block.where)
                loose = {}
            if not isinstance(own_block, Block):
                problems.append(Problem(f"[{conf_key}] must be a block {{ ... }}", block.where))
            else:
                try:
                    obj.__dict__[conf_key] = config._build(own_block)
                except ParamError as e:
                    problems.extend(e.at(block.where).problems)
        if stray:
            if unknown is not None:
                unknown.update(stray)
            else:
                problems += cls._unknown_keys(stray, known, block, own_keys, component)
        if problems:
            raise ParamError(problems)
        return obj

    @classmethod
    def _user_type_hint(cls, problems: list[Problem], entries: list[Entry]) -> list[Problem]:
        """The problems, a ``user_type`` that names nothing registered (nor anything close:
        that is a misspelling, its suggestion given) told how to register it: a user's
        component is registered by their module, loaded with ``--import``."""
        places = [w for e in entries if e.key == "user_type" for w in (e.where, e.value.where)]
        names = [e.value.raw for e in entries if e.key == "user_type"
                 and isinstance(e.value, Scalar)]
        return [Problem(p.message + f"\n'{names[0]}' is not a registered {cls.registry.kind}: "
                        "load the module that registers it with --import (paramserver "
                        "--import my_module ...)", p.where)
                if names and p.where is not None and p.where in places
                and p.message.startswith("Invalid Input:") and "Did you mean" not in p.message
                else p for p in problems]

    @classmethod
    def _selected_component(cls, entries: list[Entry]) -> str | None:
        """The component ``user_type`` (a user's) or ``type`` selects, if registered."""
        for key in ("user_type", "type"):
            entry = next((e for e in entries if e.key == key), None)
            if entry is None or not isinstance(entry.value, Scalar) or not isinstance(
                    entry.value.raw, str):
                continue
            raw = entry.value.raw
            if key == "user_type" and cls.registry.user_namespace:
                return cls.registry.user_lookup(raw)
            return cls.registry.lookup(raw) if raw in cls.registry else None
        return None

    @classmethod
    def _named_component(cls, entries: list[Entry]) -> str | None:
        """The registered component that ``user_type`` or ``type`` names, if either does."""
        for key in ("user_type", "type"):
            entry = next((e for e in entries if e.key == key), None)
            if entry is not None and isinstance(entry.value, Scalar):
                raw = entry.value.raw
                return cls.registry.lookup(raw) if isinstance(raw, str) and (
                    raw in cls.registry) else None
        return None

    @classmethod
    def _own_keys(cls, component: str) -> dict[str, str]:
        config = getattr(cls.registry.get(component), "Config", None)
        return dict(config.__keys__) if config is not None else {}

    @classmethod
    def _all_own_keys(cls) -> dict[str, str]:
        keys: dict[str, str] = {}
        for name in cls.registry.names():
            keys.update(cls._own_keys(name))
        return keys

    @classmethod
    def _unknown_keys(cls, keys: dict[str, Any], known: list[Entry], block: Block,
                      own_keys: dict[str, str], component: str | None = None
                      ) -> list[Problem]:
        """The dmlc message for each key that neither the common fields nor the selected
        component's own configuration (any component's, when none is selected) knows."""
        if not keys:
            return []
        doc = cls.doc()
        if component is not None and own_keys:
            doc += f"\n{cls.registry.get(component).Config.doc()}"
        places: dict[str, Any] = {}
        for x in known:
            places.setdefault(x.key, x.where)
        out = Problems()

        def message(key: str, where: Any) -> Problem:
            return Problem(f"Cannot find argument '{key}', Possible Arguments:\n{'-' * 16}\n"
                           f"{doc}" + _suggest(key, [*cls.__keys__, *own_keys]), where)

        for key in keys:
            where = places.get(key, block.where)
            out.add(partial(message, key, where), where)
        return out.result()


__all__ = ["USER", "ComponentConf", "ComponentRegistry", "is_users", "layers", "lr_methods",
           "param_generators", "updaters"]
