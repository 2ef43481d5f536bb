"""Declarative parameters (SPEC section 1): parsing, defaults, checks, messages, documentation.

Messages are compared as whole texts (golden tests): they are part of the interface, in
dmlc's wording so that MXNet users recognise them.
"""

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paramserver
from paramserver import ParamError, Parameter, field
from paramserver.config import Location, Problem
from paramserver.config.types import format_number

DERANDOMIZED = settings(derandomize=True, max_examples=150, deadline=None)


class FC(Parameter):
    num_hidden: int = field(doc="Number of hidden units.", lower=1, aliases=("nhidden",))
    learning_rate: float = field(0.01, lower=0.0, doc="Learning rate.")
    activation: str = field("relu", enum=("relu", "sigmoid"))
    kernel: tuple[int, ...] = field((3, 3), doc="Kernel shape.")
    eps: float | None = field(None, doc="Epsilon, or None.")
    momentum: float = field(0.9, lower=0.0, upper=1.0, doc="Momentum.")
    use_bias: bool = field(True, doc="Whether to add a bias.")
    name: str = field("fc", doc="Layer name.")


FC_DOC = """\
num_hidden : int, required
    Number of hidden units.
learning_rate : float, optional, default=0.01
    Learning rate.
activation : {'relu', 'sigmoid'}, optional, default='relu'
kernel : Shape(tuple), optional, default=(3,3)
    Kernel shape.
eps : float or None, optional, default=None
    Epsilon, or None.
momentum : float, optional, default=0.9
    Momentum.
use_bias : boolean, optional, default=True
    Whether to add a bias.
name : string, optional, default='fc'
    Layer name."""


class Color(enum.Enum):
    red = 1
    green = 2


class Sub(Parameter):
    x: int = field(doc="X.", lower=0)
    tag: str = field("a")


class Top(Parameter):
    sub: Sub = field(factory=lambda: Sub(x=1), doc="One nested configuration.")
    subs: list[Sub] = field(factory=list, doc="Repeated nested configurations.")
    maybe: Sub | None = field(None)
    steps: list[int] = field(factory=lambda: [1, 2], lower=0, doc="Steps.")


class Bounded(Parameter):
    lo: float = field(1.0, lower=1e-08, doc="Lower alone.")
    hi: float = field(1.0, upper=2.0, doc="Upper alone.")
    both: int = field(5, lower=1, upper=10, doc="Both.")
    pos: float = field(1.0, lower=0.0, lower_exclusive=True, doc="Positive.")
    frac: float = field(0.5, lower=0.0, upper=1.0, lower_exclusive=True, doc="In (0, 1].")
    shape: tuple[int, ...] = field((1,), lower=1, doc="Positive dims.")


class Checked(Parameter):
    low: float = field(0.0)
    high: float = field(1.0)

    def check(self) -> list[str]:
        return [] if self.low <= self.high else ["low must not be greater than high"]


def error(cls: type[Parameter], mapping: Any, **kwargs: Any) -> ParamError:
    with pytest.raises(ParamError) as info:
        cls.parse(mapping, **kwargs)
    return info.value


def message(cls: type[Parameter], mapping: Any) -> str:
    return str(error(cls, mapping))


def value(key: str, text: Any) -> Any:
    return getattr(FC.parse({"num_hidden": 1, key: text}), key)


# -- the public API ----------------------------------------------------------------------------


def test_reexported_from_package() -> None:
    assert paramserver.Parameter is Parameter
    assert paramserver.field is field
    assert paramserver.ParamError is ParamError
    assert issubclass(ParamError, ValueError)


def test_parse_makes_an_instance_and_kwargs_construct_the_same() -> None:
    fc = FC.parse({"num_hidden": "10"})
    assert isinstance(fc, FC)
    assert fc.num_hidden == 10
    assert fc == FC(num_hidden=10)
    assert fc != FC(num_hidden=11)


# -- int ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("10", 10), (" 10 ", 10), ("\t7\n", 7), ("\v7\f", 7), ("+5", 5), ("-0", 0), ("007", 7),
    ("9223372036854775807", 2**63 - 1), ("-9223372036854775808", -(2**63)),
    ("0" * 30 + "1", 1),
])
def test_int_accepts(text: str, expected: int) -> None:
    assert FC.parse({"num_hidden": "1", "kernel": f"({text},)"}).kernel == (expected,)


@pytest.mark.parametrize("text", [
    "1.5", "0x10", "", "   ", "1e3", "10.0", "1 0", "ten", "--1", "1_000",
    "9223372036854775808", "-9223372036854775809", "1" * 5000, "\u0663",
    "7\v", "\u00a07", "7\u00a0", "\x1c7",  # white space is C's (dmlc's after the number)
])
def test_int_rejects(text: str) -> None:
    assert message(FC, {"num_hidden": text}) == (
        f"Invalid Parameter format for num_hidden expect int but value='{text}'")


def test_int_typed_values() -> None:
    assert FC.parse({"num_hidden": 12}).num_hidden == 12
    np = pytest.importorskip("numpy")
    out = FC.parse({"num_hidden": np.int64(3)}).num_hidden
    assert out == 3 and type(out) is int
    assert message(FC, {"num_hidden": 10.0}) == (
        "Invalid Parameter format for num_hidden expect int but value='10.0'")
    assert message(FC, {"num_hidden": True}) == (
        "Invalid Parameter format for num_hidden expect int but value='True'")
    assert message(FC, {"num_hidden": 2**63}) == (
        f"Invalid Parameter format for num_hidden expect int but value='{2**63}'")


# -- float -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("0.5", 0.5), (" 0.5", 0.5), ("\t\n\r\f0.5", 0.5), ("1.2f", 1.2), ("1.2F", 1.2),
    ("1e-3", 1e-3), ("1E5", 1e5), ("2.5e+2f", 250.0), (".5", 0.5), ("5.", 5.0), ("+3", 3.0),
    ("7", 7.0), ("inf", math.inf), ("INF", math.inf), ("Inf", math.inf), ("-inf", -math.inf),
    ("-InF", -math.inf),
])
def test_float_accepts(text: str, expected: float) -> None:
    # As dmlc: white space before the number is skipped (space, tab, newline, CR, FF).
    assert value("eps", text) == expected


@pytest.mark.parametrize("text", [
    "nan", "NaN", "NAN", "-nan", "+nan", "nan(foobar)", "NAN(FooBar)", "NaN(foo_bar_12)",
    "+NaN(foo_bar_12)", "-NAN(FooBar)", "nan()", " nan(x)",
])
def test_float_nan_in_any_case_with_a_payload(text: str) -> None:
    # dmlc-core's own test accepts C99's nan(char-sequence) spellings as NaN.
    assert math.isnan(value("eps", text))


@pytest.mark.parametrize("text", ["infinity", "+INFINITY", "-Infinity", "+inf", "-INF"])
def test_float_infinity_spellings(text: str) -> None:
    assert math.isinf(value("eps", text))


@pytest.mark.parametrize("text", ["1e-500", "-1e-500", "1e-325", "1e999", "-1e400",
                                  "1.8e+308", "1e-500f", "0.0001e-321", "1e999x"])
def test_float_out_of_range_is_reported(text: str) -> None:
    # As dmlc (strtod's ERANGE): not a silent 0, inf or subnormal value; the range is told
    # before anything left after the number.
    assert message(FC, {"num_hidden": 1, "eps": text}) == (
        f"Out of range value for eps, value='{text}'")


@pytest.mark.parametrize(("text", "expected"), [
    ("0e-500", 0.0), ("0.000e-999", 0.0), ("2.3e-308", 2.3e-308), ("1.7e+308", 1.7e308),
    ("1e-100", 1e-100), ("4920000500.0", 4920000500.0),
    ("2.2e-308", 2.2e-308), ("5e-324", 5e-324),  # subnormal: kept (dmlc refuses these)
])
def test_float_range_edges(text: str, expected: float) -> None:
    assert value("eps", text) == expected


@pytest.mark.parametrize("text", [
    "e5", "", " ", "\v0.5", "f", "..5", ".", "-", "+", "\u0661.5", "infinit", "infi", "foo1.2",
])
def test_float_without_a_number_is_refused_naming_the_key(text: str) -> None:
    # dmlc reads e5, ., -, +, f and a blank as 0 (its parser finds no digit and goes on):
    # refused here (SPEC.md: a float's text holds a number).
    assert message(FC, {"num_hidden": 1, "eps": text}) == (
        f"Invalid Parameter format for eps expect float or None but value='{text}'")


@pytest.mark.parametrize(("text", "rest"), [
    ("1.5x", "x"), ("1.2ff", "f"), ("1.2 f", " f"), ("1e", "e"), ("1e+", "e+"), ("1,5", ",5"),
    ("0x1p3", "x1p3"), ("0x10", "x10"), ("1_0", "_0"), ("infamous", "amous"),
    ("infinity war", " war"), ("Nanny", "ny"), ("nan(", "("), ("nan(a b)", "(a b)"),
    ("nan()x", "x"), ("1.2e10foo", "oo"), ("1.2e-2 foo", " foo"), ("0.5 ", " "),
    (" 0.5 ", " "), ("0.5\n", "\n"),
])
def test_float_trailing_characters_in_dmlc_words(text: str, rest: str) -> None:
    # dmlc's words (it reads the number and refuses what is left, white space included:
    # 0x1p3 is the number 0 and x1p3; a float's f is part of the number, as the f of
    # 1.2e10foo), then the key and the whole value.
    assert message(FC, {"num_hidden": 1, "eps": text}) == (
        f"Some trailing characters could not be parsed: '{rest}' (eps='{text}')")


def test_float_typed_values() -> None:
    fc = FC.parse({"num_hidden": 1, "learning_rate": 1})
    assert fc.learning_rate == 1.0 and type(fc.learning_rate) is float
    assert value("eps", 0.1 + 0.2) == 0.30000000000000004  # typed: no round trip through text
    assert FC.parse({"num_hidden": 1, "eps": 1e-300}).eps == 1e-300
    assert message(FC, {"num_hidden": 1, "learning_rate": True}) == (
        "Invalid Parameter format for learning_rate expect float but value='True'")
    assert message(FC, {"num_hidden": 1, "learning_rate": 10**400}).startswith(
        "Out of range value for learning_rate, value='1000")


# -- bool --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("true", True), ("True", True), ("TRUE", True), ("tRuE", True), ("false", False),
    ("False", False), ("FALSE", False), ("1", True), ("0", False),
    (True, True), (False, False), (1, True), (0, False),
])
def test_bool_accepts(text: Any, expected: bool) -> None:
    assert value("use_bias", text) is expected


@pytest.mark.parametrize("text", ["yes", "no", "2", "-1", "", "t", "01", "truee", 2, 1.0,
                                  " true", "false ", " 1 ", "\u0130rue"])
def test_bool_rejects(text: Any) -> None:
    # As dmlc: the word exactly, in any letter case, without white space around it.
    assert message(FC, {"num_hidden": 1, "use_bias": text}) == (
        f"Invalid Parameter format for use_bias expect boolean but value='{text}'")


def test_arrays_are_refused_with_param_error() -> None:
    np = pytest.importorskip("numpy")
    array = np.array([1, 2])
    for key, type_name in [("num_hidden", "int"), ("use_bias", "boolean"),
                           ("eps", "float or None"), ("kernel", "Shape(tuple)")]:
        assert message(FC, {"num_hidden": 1, key: array}) == (
            f"Invalid Parameter format for {key} expect {type_name} but value='[1 2]'")
    assert value("use_bias", np.bool_(False)) is False
    assert value("use_bias", np.int8(1)) is True


# -- str ---------------------------------------------------------------------------------------


def test_str_is_taken_as_written() -> None:
    assert value("name", " fc 1 ") == " fc 1 "
    assert value("name", "") == ""
    assert value("name", "None") == "None"  # only optional fields read None
    assert message(FC, {"num_hidden": 1, "name": 3}) == (
        "Invalid Parameter format for name expect string but value='3'")


# -- list (dmlc's std::vector text) ------------------------------------------------------------


class Lists(Parameter):
    ints: list[int] = field(factory=list, lower=0, doc="Ints.")
    floats: list[float] = field(factory=list, doc="Floats.")
    names: list[str] = field(factory=list, doc="Names.")


@pytest.mark.parametrize(("text", "expected"), [
    ("(1,2,3)", [1, 2, 3]), ("[1,2,3]", [1, 2, 3]), ("1,2,3", [1, 2, 3]), ("(10,)", [10]),
    ("(10)", [10]), ("10", [10]), (" ( 3, 2,1 ) ", [3, 2, 1]), (" (3,2,1,)", [3, 2, 1]),
    ("()", []), ("1, 2", [1, 2]),
])
def test_int_list_reads_the_text_forms_of_dmlc(text: str, expected: list[int]) -> None:
    assert Lists.parse({"ints": text}).ints == expected


@pytest.mark.parametrize("text", ["(3.0,2,1)", "1a", "abcde", "(3,2,1", "(1 2)", "1,,2", ""])
def test_int_list_refuses_other_text(text: str) -> None:
    assert str(error(Lists, {"ints": text})).startswith(
        "ints: Invalid Parameter format for ints expect int but value=")


def test_list_text_forms_items_are_checked() -> None:
    assert Lists.parse({"floats": "(0.5, 1e-3, inf)"}).floats == [0.5, 1e-3, math.inf]
    assert message(Lists, {"ints": "(1,-2)"}) == (
        "value -2 for Parameter ints should be greater equal to 0\nints: Ints.")
    assert message(Lists, {"floats": "1,1e-500"}) == (
        "floats: Out of range value for floats, value='1e-500'")
    # Strings are taken whole: a name may hold a comma.
    assert Lists.parse({"names": "a,b"}).names == ["a,b"]


def test_list_text_forms_in_a_job_file() -> None:
    from paramserver.config.textformat import parse_text

    block = parse_text('ints: "(1, 2)"\nints: 3\nfloats: "1,2"\nfloats: [0.5]\n', "x.conf")
    assert Lists._build(block).ints == [1, 2, 3]
    assert Lists._build(block).floats == [1.0, 2.0, 0.5]


# -- tuple / shape -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("(1, 2)", (1, 2)), ("[1,2]", (1, 2)), ("(3,)", (3,)), ("()", ()), ("[]", ()),
    ("5", (5,)), (" 5 ", (5,)), ("  (1, 2)  ", (1, 2)), ("( 1 , 2 , )", (1, 2)),
    ("(1,\n 2)", (1, 2)), ("(-1, 0)", (-1, 0)),
    ((4, 5), (4, 5)), ([6], (6,)), (7, (7,)), ((), ()),
])
def test_tuple_accepts(text: Any, expected: tuple[int, ...]) -> None:
    assert value("kernel", text) == expected


@pytest.mark.parametrize("text", [
    "1,2", "(2 3)", "(1,2]", "[1,2)", "(,)", "(1,,2)", "(", "(1", "1 2", "(1.5, 2)", "(a)",
    "((1,2))", "",
])
def test_tuple_rejects(text: str) -> None:
    assert message(FC, {"num_hidden": 1, "kernel": text}) == (
        f"Invalid Parameter format for kernel expect Shape(tuple) but value='{text}'")


def test_tuple_typed_with_a_bad_item_shows_the_whole_value() -> None:
    assert message(FC, {"num_hidden": 1, "kernel": (1, 2.5)}) == (
        "Invalid Parameter format for kernel expect Shape(tuple) but value='(1, 2.5)'")
    assert message(FC, {"num_hidden": 1, "kernel": [1, "x"]}) == (
        "Invalid Parameter format for kernel expect Shape(tuple) but value='[1, x]'")
    assert message(FC, {"num_hidden": 1, "kernel": (True,)}) == (
        "Invalid Parameter format for kernel expect Shape(tuple) but value='(True,)'")


class Floats(Parameter):
    scales: tuple[float, ...] = field((0.5, 1.0))
    names: tuple[str, ...] = field(())


def test_tuple_of_float_and_of_str() -> None:
    f = Floats.parse({"scales": "(1.5, inf, 2f)", "names": "(a, b)"})
    assert f.scales == (1.5, math.inf, 2.0)
    assert f.names == ("a", "b")
    assert Floats.doc() == (
        "scales : tuple of <float>, optional, default=(0.5,1)\n"
        "names : tuple of <string>, optional, default=()")


# -- enumerations ------------------------------------------------------------------------------


def test_enum_takes_the_name_exactly_as_declared() -> None:
    assert value("activation", "sigmoid") == "sigmoid"
    for bad in ("ReLU", "relu ", "tanh", ""):
        assert message(FC, {"num_hidden": 1, "activation": bad}) == (
            f"Invalid Input: '{bad}', valid values are: {{'relu', 'sigmoid'}}")
    assert message(FC, {"num_hidden": 1, "activation": 3}) == (
        "Invalid Input: '3', valid values are: {'relu', 'sigmoid'}")


class Painted(Parameter):
    color: Color = field(Color.green, doc="A Python enum.")
    other: Color | None = field(None)


def test_python_enum_fields() -> None:
    p = Painted.parse({"color": "red", "other": Color.green})
    assert p.color is Color.red and p.other is Color.green
    assert Painted.parse({"other": "None"}).other is None
    assert message(Painted, {"color": "RED"}) == (
        "Invalid Input: 'RED', valid values are: {'green', 'red'}")
    assert p.to_dict() == {"color": "red", "other": "green"}
    assert Painted.from_dict(p.to_dict()) == p
    assert Painted.doc() == (
        "color : {'green', 'red'}, optional, default='green'\n    A Python enum.\n"
        "other : {None, 'green', 'red'}, optional, default=None")
    # As dmlc's optional enums: None is among the valid values.
    assert message(Painted, {"other": "RED"}) == (
        "Invalid Input: 'RED', valid values are: {None, 'green', 'red'}")


# -- optional ----------------------------------------------------------------------------------


def test_optional_text_none_means_no_value() -> None:
    assert value("eps", "None") is None
    assert value("eps", None) is None
    assert value("eps", "0.5") == 0.5
    assert message(FC, {"num_hidden": 1, "eps": "none"}) == (
        "Invalid Parameter format for eps expect float or None but value='none'")


class Optionals(Parameter):
    count: int | None = field(None, lower=0, doc="A count.")
    label: str | None = field("x")
    shape: tuple[int, ...] | None = field(None)


def test_optional_of_other_types() -> None:
    o = Optionals.parse({"count": "3", "label": "None", "shape": "(2, 2)"})
    assert (o.count, o.label, o.shape) == (3, None, (2, 2))
    assert Optionals.parse({"label": "none"}).label == "none"
    assert message(Optionals, {"count": "-1"}) == (
        "value -1 for Parameter count should be greater equal to 0\ncount: A count.")
    assert Optionals.doc() == (
        "count : int or None, optional, default=None\n    A count.\n"
        "label : string or None, optional, default='x'\n"
        "shape : Shape(tuple) or None, optional, default=None")


# -- initialisation from a mapping -------------------------------------------------------------


def test_fields_not_given_take_their_defaults() -> None:
    fc = FC.parse({"num_hidden": 4})
    assert fc.to_dict() == {"num_hidden": 4, "learning_rate": 0.01, "activation": "relu",
                            "kernel": [3, 3], "eps": None, "momentum": 0.9, "use_bias": True,
                            "name": "fc"}


def test_mutable_defaults_are_not_shared() -> None:
    a, b = Top.parse({}), Top.parse({})
    a.steps.append(3)
    a.sub.update({"x": 7})
    assert b.steps == [1, 2] and b.sub.x == 1


def test_missing_required_field() -> None:
    assert message(FC, {}) == "Required parameter num_hidden of int is not presented"
    assert message(FC, {"learning_rate": "0.1"}) == (
        "Required parameter num_hidden of int is not presented")


def test_unknown_key_message_lists_the_documentation() -> None:
    assert message(FC, {"num_hidden": 1, "zzz": 1}) == (
        "Cannot find argument 'zzz', Possible Arguments:\n"
        "----------------\n" + FC_DOC)


def test_unknown_key_with_did_you_mean() -> None:
    assert message(FC, {"num_hidden": 1, "learning_rat": 1}) == (
        "Cannot find argument 'learning_rat', Possible Arguments:\n"
        "----------------\n" + FC_DOC + "\nDid you mean 'learning_rate'?")
    # aliases are suggested too
    assert str(error(FC, {"num_hidden": 1, "nhiden": 1})).endswith("\nDid you mean 'nhidden'?")


def test_unknown_keys_returned_when_asked() -> None:
    fc, unknown = FC.parse({"num_hidden": 2, "zzz": "1", "extra": [1, {"a": 2}]},
                           allow_unknown=True)
    assert fc == FC(num_hidden=2)
    assert unknown == {"zzz": "1", "extra": [1, {"a": 2}]}
    fc, unknown = FC.parse({"num_hidden": 2}, allow_unknown=True)
    assert unknown == {}


def test_hidden_keys_are_passed_over() -> None:
    assert FC.parse({"num_hidden": 1, "__lr_mult__": "x", "__x__": 1}) == FC(num_hidden=1)
    _, unknown = FC.parse({"num_hidden": 1, "__x__": 1}, allow_unknown=True)
    assert unknown == {}
    # "__" alone or "____" name nothing: not hidden keys
    for key in ("__", "____", "__x", "x__"):
        assert message(FC, {"num_hidden": 1, key: 1}).startswith(
            f"Cannot find argument '{key}', Possible Arguments:")


def test_all_problems_are_reported_at_once() -> None:
    e = error(FC, {"learning_rat": 1, "momentum": "2", "kernel": "1,2", "activation": "tanh",
                   "eps": "x"})
    messages = [p.message.split("\n")[0] for p in e.problems]
    assert messages == [
        "Cannot find argument 'learning_rat', Possible Arguments:",
        "value 2 for Parameter momentum exceed bound [0,1]",
        "Invalid Parameter format for kernel expect Shape(tuple) but value='1,2'",
        "Invalid Input: 'tanh', valid values are: {'relu', 'sigmoid'}",
        "Invalid Parameter format for eps expect float or None but value='x'",
        "Required parameter num_hidden of int is not presented",
    ]
    assert str(e) == "\n".join(p.message for p in e.problems)
    assert all(isinstance(p, Problem) for p in e.problems)


def test_an_invalid_required_field_is_not_also_missing() -> None:
    e = error(FC, {"num_hidden": "x"})
    assert [p.message for p in e.problems] == [
        "Invalid Parameter format for num_hidden expect int but value='x'"]


def test_cross_field_check_runs_after_fields() -> None:
    assert Checked.parse({"low": "1", "high": "2"}).high == 2.0
    assert message(Checked, {"low": "3"}) == "low must not be greater than high"


def test_parse_refuses_what_is_not_a_mapping() -> None:
    for bad in ("num_hidden=1", [("num_hidden", 1)], None, 3):
        assert message(FC, bad) == (
            f"FC is configured by a mapping of keys to values, not {type(bad).__name__}")


# -- bounds ------------------------------------------------------------------------------------


def test_bound_messages() -> None:
    assert message(FC, {"num_hidden": 0}) == (
        "value 0 for Parameter num_hidden should be greater equal to 1\n"
        "num_hidden: Number of hidden units.")
    assert message(FC, {"num_hidden": 1, "momentum": "1.5"}) == (
        "value 1.5 for Parameter momentum exceed bound [0,1]\nmomentum: Momentum.")
    assert message(Bounded, {"lo": 0}) == (
        "value 0 for Parameter lo should be greater equal to 1e-08\nlo: Lower alone.")
    assert message(Bounded, {"hi": 2.5}) == (
        "value 2.5 for Parameter hi should be smaller equal to 2\nhi: Upper alone.")
    assert message(Bounded, {"both": 11}) == (
        "value 11 for Parameter both exceed bound [1,10]\nboth: Both.")
    assert message(Bounded, {"pos": 0}) == (
        "value 0 for Parameter pos should be greater than 0\npos: Positive.")
    assert message(Bounded, {"frac": 0}) == (
        "value 0 for Parameter frac exceed bound (0,1]\nfrac: In (0, 1].")
    assert message(Bounded, {"shape": "(2, 0)"}) == (
        "value 0 for Parameter shape should be greater equal to 1\nshape: Positive dims.")


def test_bounds_are_inclusive() -> None:
    b = Bounded.parse({"lo": 1e-08, "hi": 2, "both": "10", "frac": 1})
    assert (b.lo, b.hi, b.both, b.frac) == (1e-08, 2.0, 10, 1.0)
    assert Bounded.parse({"both": 1}).both == 1
    assert FC.parse({"num_hidden": 1, "momentum": 0}).momentum == 0.0


def test_nan_and_inf_are_outside_bounds() -> None:
    assert message(FC, {"num_hidden": 1, "momentum": "nan"}) == (
        "value nan for Parameter momentum exceed bound [0,1]\nmomentum: Momentum.")
    assert message(FC, {"num_hidden": 1, "learning_rate": "-inf"}) == (
        "value -inf for Parameter learning_rate should be greater equal to 0\n"
        "learning_rate: Learning rate.")
    assert FC.parse({"num_hidden": 1, "learning_rate": "inf"}).learning_rate == math.inf


def test_finite_fields_refuse_inf_and_nan() -> None:
    class Rate(Parameter):
        lr: float = field(0.1, lower=0.0, finite=True, doc="Rate.")
        shift: float = field(0.0, finite=True, doc="Shift.")

    for text in ("inf", "+inf", "nan", "Infinity"):
        assert message(Rate, {"lr": text}) == (
            f"value {format_number(float(text))} for Parameter lr should be a finite number\n"
            "lr: Rate.")
    assert message(Rate, {"shift": float("-inf")}) == (
        "value -inf for Parameter shift should be a finite number\nshift: Shift.")
    assert Rate.parse({"lr": "1e300", "shift": "-5"}).shift == -5.0


def test_bound_with_no_description_keeps_the_line() -> None:
    class NoDoc(Parameter):
        n: int = field(1, lower=1)

    assert message(NoDoc, {"n": 0}) == (
        "value 0 for Parameter n should be greater equal to 1\nn: ")


def test_list_elements_are_checked_against_bounds() -> None:
    assert message(Top, {"steps": [3, -1]}) == (
        "value -1 for Parameter steps should be greater equal to 0\nsteps: Steps.")


# -- defaults checked when the class is declared -----------------------------------------------


def test_default_outside_bounds_is_refused_at_declaration() -> None:
    with pytest.raises(ParamError) as info:
        class Bad(Parameter):
            momentum: float = field(1.5, lower=0.0, upper=1.0, doc="Momentum.")
            n: int = field(0, lower=1)

    assert str(info.value) == (
        "Bad.momentum default: value 1.5 for Parameter momentum exceed bound [0,1]\n"
        "momentum: Momentum.\n"
        "Bad.n default: value 0 for Parameter n should be greater equal to 1\nn: ")


def test_default_outside_enum_or_type_is_refused_at_declaration() -> None:
    with pytest.raises(ParamError) as info:
        class Bad(Parameter):
            act: str = field("tanh", enum=("relu", "sigmoid"))
            n: int = field("ten")

    assert str(info.value) == (
        "Bad.act default: Invalid Input: 'tanh', valid values are: {'relu', 'sigmoid'}\n"
        "Bad.n default: Invalid Parameter format for n expect int but value='ten'")


def test_defaults_are_kept_typed() -> None:
    class Typed(Parameter):
        x: float = field(0)
        shape: tuple[int, ...] = field([2, 3])

    t = Typed.parse({})
    assert type(t.x) is float and t.shape == (2, 3)


def test_a_field_without_annotation_is_refused() -> None:
    with pytest.raises(ParamError, match="needs a type annotation"):
        class Bad(Parameter):
            x = field(1)


def test_a_field_hiding_a_method_is_refused() -> None:
    with pytest.raises(ParamError, match=r"^Bad.update: a field may not hide Parameter.update$"):
        class Bad(Parameter):
            update: int = field(1)  # type: ignore[assignment]


def test_plain_class_attribute_default() -> None:
    class Plain(Parameter):
        n: int = 3
        r: float

    assert Plain.parse({"r": "1"}).to_dict() == {"n": 3, "r": 1.0}
    assert Plain.doc() == "n : int, optional, default=3\nr : float, required"


# -- aliases -----------------------------------------------------------------------------------


def test_alias_sets_the_field() -> None:
    fc = FC.parse({"nhidden": "8"})
    assert fc.num_hidden == 8
    assert fc.to_dict()["num_hidden"] == 8 and "nhidden" not in fc.to_dict()
    assert fc.update({"nhidden": 9}) == {} and fc.num_hidden == 9


def test_alias_and_name_together_are_refused() -> None:
    assert message(FC, {"num_hidden": 1, "nhidden": 2}) == "num_hidden is given more than once"


def test_alias_colliding_with_another_field_is_refused() -> None:
    with pytest.raises(ParamError, match="key 'a' names two fields"):
        class Bad(Parameter):
            a: int = field(1)
            b: int = field(2, aliases=("a",))


# -- update ------------------------------------------------------------------------------------


def test_update_sets_only_the_keys_given() -> None:
    fc = FC.parse({"num_hidden": 4, "learning_rate": 0.5})
    unknown = fc.update({"momentum": "0.5", "kernel": "(1,)"})
    assert unknown == {}
    assert fc.to_dict() == {"num_hidden": 4, "learning_rate": 0.5, "activation": "relu",
                            "kernel": [1], "eps": None, "momentum": 0.5, "use_bias": True,
                            "name": "fc"}


def test_update_returns_unknown_keys() -> None:
    fc = FC(num_hidden=1)
    assert fc.update({"momentum": 0.1, "other": "x", "__h__": 1}) == {"other": "x"}
    assert fc.momentum == 0.1
    with pytest.raises(ParamError, match=r"^Cannot find argument 'other'"):
        fc.update({"other": "x"}, allow_unknown=False)


def test_failed_update_leaves_the_object_unchanged() -> None:
    fc = FC.parse({"num_hidden": 4})
    before = fc.to_dict()
    with pytest.raises(ParamError) as info:
        fc.update({"learning_rate": "0.5", "momentum": "2", "kernel": "(1 2)"})
    assert [p.message.split("\n")[0] for p in info.value.problems] == [
        "value 2 for Parameter momentum exceed bound [0,1]",
        "Invalid Parameter format for kernel expect Shape(tuple) but value='(1 2)'"]
    assert fc.to_dict() == before


def test_failed_cross_field_check_leaves_the_object_unchanged() -> None:
    c = Checked.parse({})
    with pytest.raises(ParamError, match=r"^low must not be greater than high$"):
        c.update({"low": 5})
    assert c.low == 0.0
    c.update({"low": 5, "high": 6})
    assert (c.low, c.high) == (5.0, 6.0)


def test_attribute_assignment_is_checked_and_atomic() -> None:
    fc = FC(num_hidden=1)
    fc.momentum = "0.25"  # type: ignore[assignment]
    assert fc.momentum == 0.25
    with pytest.raises(ParamError, match="exceed bound"):
        fc.momentum = 3.0
    assert fc.momentum == 0.25
    with pytest.raises(AttributeError, match="FC has no field 'momentun' Did you mean"):
        fc.momentun = 1  # type: ignore[attr-defined]


def test_update_refuses_what_is_not_a_mapping() -> None:
    with pytest.raises(ParamError, match=r"^FC is configured by a mapping"):
        FC(num_hidden=1).update("momentum=1")  # type: ignore[arg-type]


# -- nested configurations and lists of them ---------------------------------------------------


def test_nested_from_dicts() -> None:
    t = Top.parse({"sub": {"x": "3"}, "subs": [{"x": 1}, {"x": "2", "tag": "b"}],
                   "maybe": {"x": 0}})
    assert t.sub == Sub(x=3)
    assert t.subs == [Sub(x=1), Sub(x=2, tag="b")]
    assert t.maybe == Sub(x=0)
    assert Top.parse({"maybe": "None"}).maybe is None


def test_nested_typed_instances_are_copied() -> None:
    s = Sub(x=5)
    t = Top.parse({"sub": s, "subs": [s]})
    assert t.sub == s and t.sub is not s and t.subs[0] is not s


def test_nested_problems_are_placed_at_their_key_path() -> None:
    e = error(Top, {"sub": {"x": "-1"}, "subs": [{"x": 1}, {"x": "q", "zz": 2}, {}]})
    got = [(p.where, p.message.split("\n")[0]) for p in e.problems]
    assert got == [
        ("sub", "value -1 for Parameter x should be greater equal to 0"),
        ("subs[1]", "Cannot find argument 'zz', Possible Arguments:"),
        ("subs[1]", "Invalid Parameter format for x expect int but value='q'"),
        ("subs[2]", "Required parameter x of int is not presented"),
    ]
    assert str(e).startswith("sub: value -1 for Parameter x should be greater equal to 0\n"
                             "x: X.\nsubs[1]: Cannot find argument 'zz'")


def test_nested_unknown_keys_are_errors_even_when_top_level_allows_them() -> None:
    e = error(Top, {"sub": {"x": 1, "zz": 2}, "yy": 3}, allow_unknown=True)
    assert [p.where for p in e.problems] == ["sub"]


def test_nested_wrong_kind_of_value() -> None:
    assert message(Top, {"sub": 3}) == (
        "Invalid Parameter format for sub expect Sub but value='3'")
    assert message(Top, {"subs": [{"x": 1}, "x"]}) == (
        "subs[1]: Invalid Parameter format for subs expect Sub but value='x'")


def test_repeated_field_forms() -> None:
    assert Top.parse({"steps": "5"}).steps == [5]
    assert Top.parse({"steps": ("1", 2)}).steps == [1, 2]
    assert Top.parse({"steps": []}).steps == []
    assert message(Top, {"steps": ["1", "x", "2.5"]}) == (
        "steps[1]: Invalid Parameter format for steps expect int but value='x'\n"
        "steps[2]: Invalid Parameter format for steps expect int but value='2.5'")


def test_update_replaces_a_nested_value_given_whole() -> None:
    t = Top.parse({"sub": {"x": 3, "tag": "b"}})
    t.update({"sub": {"x": 4}})
    assert t.sub == Sub(x=4, tag="a")
    t.sub.update({"tag": "c"})  # one nested key: update the nested configuration
    assert t.sub == Sub(x=4, tag="c")


def test_nested_documentation() -> None:
    assert Top.doc() == (
        "sub : Sub, optional, default={...}\n    One nested configuration.\n"
        "subs : list of Sub, optional, default=[]\n    Repeated nested configurations.\n"
        "maybe : Sub or None, optional, default=None\n"
        "steps : list of int, optional, default=[1, 2]\n    Steps.")


# -- serialisation -----------------------------------------------------------------------------


def test_to_dict_is_plain_and_round_trips() -> None:
    t = Top.parse({"sub": {"x": 3}, "subs": [{"x": 1}], "steps": [4]})
    d = t.to_dict()
    assert d == {"sub": {"x": 3, "tag": "a"}, "subs": [{"x": 1, "tag": "a"}], "maybe": None,
                 "steps": [4]}
    assert Top.from_dict(d) == t
    assert Top.from_json(t.to_json()) == t
    assert json.loads(t.to_json()) == d


def test_json_round_trip_of_every_type() -> None:
    fc = FC.parse({"num_hidden": 3, "kernel": "(1, 2, 3)", "eps": "1e-08", "use_bias": "0",
                   "activation": "sigmoid"})
    back = FC.from_json(fc.to_json())
    assert back == fc and back.kernel == (1, 2, 3) and back.use_bias is False


def test_from_json_errors_are_param_errors() -> None:
    with pytest.raises(ParamError, match=r"^invalid JSON for FC: "):
        FC.from_json("{num_hidden: 1}")
    with pytest.raises(ParamError, match=r"^JSON for FC must be an object, not list$"):
        FC.from_json("[1]")
    with pytest.raises(ParamError, match=r"^Required parameter num_hidden"):
        FC.from_json("{}")


def test_from_dict_checks_like_parse() -> None:
    with pytest.raises(ParamError, match=r"^Cannot find argument 'zzz'"):
        FC.from_dict({"num_hidden": 1, "zzz": 0})


def test_copy_is_deep() -> None:
    t = Top.parse({"subs": [{"x": 1}]})
    c = t.copy()
    assert c == t
    c.subs[0].update({"x": 2})
    assert t.subs[0].x == 1


# -- repr and documentation --------------------------------------------------------------------


def test_repr_is_readable() -> None:
    assert repr(FC(num_hidden=10)) == (
        "FC(num_hidden=10, learning_rate=0.01, activation='relu', kernel=(3, 3), eps=None, "
        "momentum=0.9, use_bias=True, name='fc')")
    assert repr(Top.parse({"subs": [{"x": 2}]})) == (
        "Top(sub=Sub(x=1, tag='a'), subs=[Sub(x=2, tag='a')], maybe=None, steps=[1, 2])")


def test_documentation_layout() -> None:
    assert FC.doc() == FC_DOC


def test_documentation_of_the_spec_example() -> None:
    class Example(Parameter):
        num_hidden: int = field(doc="Number of hidden units.")
        learning_rate: float = field(0.01, doc="Learning rate.")
        activation: str = field("relu", enum=("sigmoid", "relu"))

    assert Example.doc() == (
        "num_hidden : int, required\n"
        "    Number of hidden units.\n"
        "learning_rate : float, optional, default=0.01\n"
        "    Learning rate.\n"
        "activation : {'relu', 'sigmoid'}, optional, default='relu'")


def test_documentation_of_multi_line_descriptions_and_numbers() -> None:
    class Numbers(Parameter):
        a: float = field(1.0, doc="First line.\nSecond line.")
        b: float = field(1e-08)
        c: float = field(0.5)
        d: float = field(-2.0)
        e: float = field(1e20)

    assert Numbers.doc() == (
        "a : float, optional, default=1\n    First line.\n    Second line.\n"
        "b : float, optional, default=1e-08\n"
        "c : float, optional, default=0.5\n"
        "d : float, optional, default=-2\n"
        "e : float, optional, default=1e+20")


def test_fields_in_declaration_order_including_inherited() -> None:
    class Base(Parameter):
        a: int = field(1)
        b: int = field(2)

    class Child(Base):
        c: int = field(3)

    assert list(Child.fields()) == ["a", "b", "c"]
    assert Child.parse({"a": "5"}).to_dict() == {"a": 5, "b": 2, "c": 3}


# -- numbers print in their shortest form ------------------------------------------------------


@pytest.mark.parametrize(("number", "text"), [
    (1.0, "1"), (0.5, "0.5"), (1e-08, "1e-08"), (0.01, "0.01"), (-3.0, "-3"), (100.0, "100"),
    (2.5e-05, "2.5e-05"), (7, "7"), (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"),
    (0.1 + 0.2, "0.30000000000000004"),
])
def test_format_number(number: float, text: str) -> None:
    assert format_number(number) == text


# -- ParamError --------------------------------------------------------------------------------


def test_param_error_problems_and_places() -> None:
    e = ParamError([Problem("a"), "b", Problem("c", Location("job.conf", 3, 7))])
    assert str(e) == "a\nb\njob.conf:3:7: c"
    assert [p.message for p in e.problems] == ["a", "b", "c"]
    placed = e.at("updater")
    assert [str(p) for p in placed.problems] == ["updater: a", "updater: b", "job.conf:3:7: c"]
    assert str(ParamError("one")) == "one"


# -- properties --------------------------------------------------------------------------------


class Everything(Parameter):
    i: int = field(0)
    f: float = field(0.0)
    b: bool = field(False)
    s: str = field("")
    e: str = field("a", enum=("a", "b", "c"))
    c: Color = field(Color.red)
    t: tuple[int, ...] = field(())
    tf: tuple[float, ...] = field(())
    oi: int | None = field(None)
    of: float | None = field(None)
    os: str | None = field(None)
    li: list[int] = field(factory=list)
    sub: Sub = field(factory=lambda: Sub(x=0))
    subs: list[Sub] = field(factory=list)
    maybe: Sub | None = field(None)


ints = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False)
subs = st.builds(lambda x, tag: Sub(x=x, tag=tag), st.integers(0, 2**63 - 1), st.text())

EVERYTHING_VALUES = st.fixed_dictionaries({}, optional={
    "i": ints, "f": floats, "b": st.booleans(), "s": st.text(),
    "e": st.sampled_from(["a", "b", "c"]), "c": st.sampled_from(list(Color)),
    "t": st.lists(ints, max_size=4).map(tuple), "tf": st.lists(floats, max_size=4).map(tuple),
    "oi": st.none() | ints, "of": st.none() | floats,
    # the text None means no value, so a str | None never holds the string "None"
    "os": st.none() | st.text().filter(lambda s: s != "None"), "li": st.lists(ints, max_size=4),
    "sub": subs, "subs": st.lists(subs, max_size=3), "maybe": st.none() | subs,
})


@DERANDOMIZED
@given(EVERYTHING_VALUES)
def test_parse_of_to_dict_round_trips(values: dict[str, Any]) -> None:
    obj = Everything.parse(values)
    assert Everything.parse(obj.to_dict()) == obj
    assert Everything.from_json(obj.to_json()) == obj


@DERANDOMIZED
@given(ints, floats.filter(math.isfinite), st.booleans())
def test_text_forms_of_numbers_parse_back(i: int, f: float, b: bool) -> None:
    obj = Everything.parse({"i": str(i), "f": repr(f), "b": str(b).lower(),
                            "t": f"({i}, {i})", "tf": f"[{f!r}]"})
    assert (obj.i, obj.f, obj.b, obj.t, obj.tf) == (i, f, b, (i, i), (f,))


FIELD_NAMES = sorted(Everything.fields())


@DERANDOMIZED
@given(st.sampled_from(FIELD_NAMES), st.text())
def test_arbitrary_text_raises_nothing_but_param_error(key: str, text: str) -> None:
    try:
        Everything.parse({key: text})
    except ParamError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@DERANDOMIZED
@given(st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(), json_values, max_size=4))
def test_arbitrary_values_raise_nothing_but_param_error(mapping: dict[str, Any]) -> None:
    obj = Everything.parse({})
    before = obj.to_dict()
    try:
        Everything.parse(mapping)
    except ParamError:
        pass
    try:
        obj.update(mapping)
    except ParamError:
        assert obj.to_dict() == before


@DERANDOMIZED
@given(st.text())
def test_arbitrary_json_text_raises_nothing_but_param_error(text: str) -> None:
    try:
        Everything.from_json(text)
    except ParamError:
        pass
