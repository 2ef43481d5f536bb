"""Registries: name -> component, with SINGA (``kSGD``) and plain (``"sgd"``) spellings."""

import pytest

from paramserver import ParamError, Parameter, Registry, field
from paramserver.config import normalise


class SGD:
    pass


class Nesterov:
    pass


class Constant:
    pass


class UniformFanInOut:
    pass


@pytest.fixture
def registry() -> Registry[type]:
    r: Registry[type] = Registry("updater")
    r.add("kSGD", SGD)
    r.add("kNesterov", Nesterov)
    r.add("kConstant", Constant, aliases=("kConst",))
    r.add("kUniformSqrtFanInOut", UniformFanInOut, aliases=("kUniformFanInOut",))
    return r


@pytest.mark.parametrize(("spelling", "canonical"), [
    ("kSGD", "kSGD"), ("sgd", "kSGD"), ("SGD", "kSGD"), ("Sgd", "kSGD"),
    ("kConstant", "kConstant"), ("constant", "kConstant"), ("kConst", "kConstant"),
    ("const", "kConstant"),
    ("kUniformSqrtFanInOut", "kUniformSqrtFanInOut"),
    ("uniform_sqrt_fan_in_out", "kUniformSqrtFanInOut"),
    ("uniform-sqrt-fan-in-out", "kUniformSqrtFanInOut"),
    ("kUniformFanInOut", "kUniformSqrtFanInOut"), ("uniform_fan_in_out", "kUniformSqrtFanInOut"),
])
def test_every_spelling_finds_the_component(registry: Registry[type], spelling: str,
                                            canonical: str) -> None:
    assert spelling in registry
    assert registry.lookup(spelling) == canonical
    assert registry.get(spelling) is registry.get(canonical)


def test_normalise() -> None:
    assert normalise("kUniformSqrtFanIn") == normalise("uniform_sqrt_fan_in") == "uniformsqrtfanin"
    assert normalise("kSGD") == normalise("sgd") == "sgd"
    # a leading k is SINGA's prefix only before a capital
    assert normalise("kernel") == "kernel"
    assert normalise("k") == "k"


def test_names_in_registration_order_and_choices_sorted(registry: Registry[type]) -> None:
    assert registry.names() == ["kSGD", "kNesterov", "kConstant", "kUniformSqrtFanInOut"]
    assert next(name for name, _ in registry.items()) == "kSGD"
    assert registry.choices() == (
        "{'kConstant', 'kNesterov', 'kSGD', 'kUniformSqrtFanInOut'}")


def test_unknown_name_lists_the_registered_names(registry: Registry[type]) -> None:
    with pytest.raises(ParamError) as info:
        registry.lookup("kAdam")
    assert str(info.value) == (
        "Invalid Input: 'kAdam', valid values are: "
        "{'kConstant', 'kNesterov', 'kSGD', 'kUniformSqrtFanInOut'}")
    with pytest.raises(ParamError, match=r"^Invalid Input: 'nesterow', valid values are: "):
        registry.get("nesterow")
    assert "kAdam" not in registry and 3 not in registry


def test_unknown_name_of_an_empty_registry() -> None:
    with pytest.raises(ParamError, match=r"^Invalid Input: 'x', valid values are: \{\}$"):
        Registry("layer").lookup("x")


@pytest.mark.parametrize("spelling", ["kSGD", "sgd", "SGD", "s_g_d", "kConst", "const"])
def test_a_colliding_name_is_refused(registry: Registry[type], spelling: str) -> None:
    class Other:
        pass

    with pytest.raises(ParamError) as info:
        registry.add(spelling, Other)
    taken = registry.lookup(spelling)
    assert str(info.value) == (
        f"updater name '{spelling}' is already registered "
        f"(as '{taken}' for {registry.get(taken).__module__}.{registry.get(taken).__qualname__})")
    assert registry.get(spelling) is not Other


def test_a_colliding_alias_is_refused_and_nothing_is_registered(
        registry: Registry[type]) -> None:
    class Other:
        pass

    with pytest.raises(ParamError, match=r"^updater name 'sgd' is already registered"):
        registry.add("kOther", Other, aliases=("sgd",))
    assert "kOther" not in registry and "other" not in registry


def test_an_empty_name_is_refused(registry: Registry[type]) -> None:
    with pytest.raises(ParamError, match=r"^updater names must not be empty$"):
        registry.add("_", object)


def test_register_decorator_and_remove(registry: Registry[type]) -> None:
    @registry.register("FooParam", aliases=("foo",))
    class Foo:
        pass

    assert registry.get("FooParam") is Foo and registry.get("foo") is Foo
    assert registry.get("foo_param") is Foo
    registry.remove("foo")
    assert "FooParam" not in registry and "foo" not in registry
    registry.add("foo", Foo)  # the names are free again
    assert registry.lookup("FOO") == "foo"


def test_extension_name() -> None:
    assert Registry.extension_name("FooParam") == "fooparam_conf"


methods: Registry[type] = Registry("updater")
methods.add("kSGD", SGD)
methods.add("kNesterov", Nesterov)


class UpdaterConf(Parameter):
    type: str = field("kSGD", enum=methods, doc="Update method.")
    user_type: str | None = field(None, enum=methods)


def test_field_taking_registered_names_stores_the_canonical_name() -> None:
    assert UpdaterConf.parse({"type": "nesterov"}).type == "kNesterov"
    assert UpdaterConf.parse({"user_type": "sgd"}).user_type == "kSGD"
    assert UpdaterConf.parse({"user_type": "None"}).user_type is None
    conf = UpdaterConf.parse({"type": "SGD"})
    assert conf.to_dict() == {"type": "kSGD", "user_type": None}
    assert UpdaterConf.from_dict(conf.to_dict()) == conf


def test_field_taking_registered_names_reports_them() -> None:
    with pytest.raises(ParamError) as info:
        UpdaterConf.parse({"type": "kAdam", "user_type": 3})
    assert [p.message for p in info.value.problems] == [
        "Invalid Input: 'kAdam', valid values are: {'kNesterov', 'kSGD'}",
        "Invalid Input: '3', valid values are: {'kNesterov', 'kSGD'}",
    ]
    assert UpdaterConf.doc() == (
        "type : {'kNesterov', 'kSGD'}, optional, default='kSGD'\n    Update method.\n"
        "user_type : {'kNesterov', 'kSGD'} or None, optional, default=None")


def test_a_component_registry_looks_names_up_again_after_a_change() -> None:
    """What a component registry derives from its names (canonical names, own blocks,
    membership) is remembered, and forgotten whenever a name is added or removed."""
    from paramserver.config.components import ComponentRegistry

    class Own(Parameter):
        x: int = field(1)

    class Foo:
        Config = Own

    r = ComponentRegistry("thing")
    r.add("kBar", SGD)
    assert r.lookup("bar") == "kBar" and "foo" not in r and r.by_conf_name("foo_conf") is None
    with pytest.raises(ParamError, match="Invalid Input: 'foo'"):
        r.lookup("foo")
    r.add("kFoo", Foo)
    assert r.lookup("foo") == "kFoo" and "foo" in r and r.conf_name("foo") == "foo_conf"
    assert r.by_conf_name("foo_conf") == "kFoo"
    r.remove("foo")
    assert "foo" not in r and r.by_conf_name("foo_conf") is None
    with pytest.raises(ParamError, match="Invalid Input: 'kFoo'"):
        r.lookup("kFoo")
