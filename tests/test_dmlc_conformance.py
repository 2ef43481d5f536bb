"""paramserver's Parameter held to dmlc-core's on real MXNet operators' fields (SPEC section 1).

Each case is a text given to a field declared as MXNet 1.9.1 declares it; the expected
result is dmlc's verdict and words, as MXNet 1.9.1 printed them (its ", in operator ..."
tail left off), except where SPEC.md's Decisions differ on purpose: then ``dmlc`` records
what dmlc said. benchmarks/peers/dmlc_verdicts.py runs the same kind of table through MXNet
itself.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from paramserver import ParamError, Parameter, field
from paramserver.config.textformat import parse_text


class FullyConnected(Parameter):
    num_hidden: int = field(1, lower=1, doc="Number of hidden nodes of the output.")
    flatten: bool = field(True, doc="Whether to collapse all but the first axis.")


class LeakyReLU(Parameter):
    slope: float = field(0.25, doc="Init slope for the activation.")


class Dropout(Parameter):
    p: float = field(0.5, lower=0.0, upper=1.0,
                     doc="Fraction of the input that gets dropped out during training time.")


class Activation(Parameter):
    act_type: str = field(enum=("relu", "sigmoid", "softrelu", "softsign", "tanh"),
                          doc="Activation function to be applied.")


class Convolution(Parameter):
    kernel: tuple[int, ...] = field((1, 1), doc="Convolution kernel size.")
    cudnn_tune: str | None = field(None, enum=("fastest", "limited_workspace", "off"),
                                   doc="Whether to pick convolution algo by running test.")


class MultiBoxPrior(Parameter):
    sizes: tuple[float, ...] = field((1.0,), doc="List of sizes of generated MultiBoxPriores.")


def verdict(cls: type[Parameter], key: str, text: str) -> Any:
    """The value parsed, or the message of the refusal."""
    try:
        return getattr(cls.parse({key: text}), key)
    except ParamError as e:
        return str(e)


def fmt(key: str, text: str, type_name: str) -> str:
    return f"Invalid Parameter format for {key} expect {type_name} but value='{text}'"


def trailing(rest: str, key: str, text: str) -> str:
    return f"Some trailing characters could not be parsed: '{rest}' ({key}='{text}')"


# -- int: C++ stream reading (white space before; dmlc's white space, no \v, after) ----------


@pytest.mark.parametrize(("text", "expected"), [
    ("1", 1), (" 1", 1), ("1 ", 1), ("\t1\n", 1), ("\v1", 1), ("\f1\f", 1), ("1\r\n", 1),
    ("+1", 1), ("007", 7), ("2147483647", 2147483647),
])
def test_int_taken_as_dmlc_takes_it(text: str, expected: int) -> None:
    assert verdict(FullyConnected, "num_hidden", text) == expected


@pytest.mark.parametrize("text", [
    "1\v", "1.5", "0x10", "1x", "", " ", "1e3", "1 0", "--1", "\u00a01", "1\u00a0",
    "9223372036854775808",
])
def test_int_refused_in_dmlc_words(text: str) -> None:
    assert verdict(FullyConnected, "num_hidden", text) == fmt("num_hidden", text, "int")


def test_int_bound_in_dmlc_words() -> None:
    assert verdict(FullyConnected, "num_hidden", "0") == (
        "value 0 for Parameter num_hidden should be greater equal to 1\n"
        "num_hidden: Number of hidden nodes of the output.")


class Seeded(Parameter):
    seed: int = field(0, doc="A seed, unbounded.")


@pytest.mark.parametrize("text", ["2147483648", "3000000000", "-2147483649",
                                  "9223372036854775807", "-9223372036854775808"])
def test_int_is_64_bit(text: str) -> None:
    # Decision (SPEC.md section 1): int fields are 64-bit. dmlc's int is 32-bit:
    # "Invalid Parameter format for num_hidden expect int but value='3000000000'".
    assert verdict(Seeded, "seed", text) == int(text)


@pytest.mark.parametrize("text", ["9223372036854775808", "-9223372036854775809"])
def test_int_beyond_64_bit_refused_in_dmlc_words(text: str) -> None:
    assert verdict(Seeded, "seed", text) == fmt("seed", text, "int")


# -- float: dmlc's own parser ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("0.5", 0.5), (" 0.5", 0.5), ("\t\n0.5", 0.5), ("\r\f0.5", 0.5), ("inf", math.inf),
    ("-inf", -math.inf), ("Infinity", math.inf), ("INF", math.inf), ("1.2f", 1.2),
    ("1e-3", 1e-3), (".5", 0.5), ("5.", 5.0), ("+3", 3.0),
])
def test_float_taken_as_dmlc_takes_it(text: str, expected: float) -> None:
    assert verdict(LeakyReLU, "slope", text) == expected


@pytest.mark.parametrize("text", ["nan", "NaN(x_1)", "-nan"])
def test_float_nan_taken(text: str) -> None:
    assert math.isnan(verdict(LeakyReLU, "slope", text))


@pytest.mark.parametrize(("text", "rest"), [
    ("0.5 ", " "), (" 0.5 ", " "), ("0.5\n", "\n"), ("0x1p3", "x1p3"), ("0.5abc", "abc"),
    ("1.2ff", "f"), ("1.2 f", " f"), ("1.2e10foo", "oo"), ("infamous", "amous"),
    ("infinity war", " war"), ("nan()x", "x"), ("1,5", ",5"),
])
def test_float_trailing_characters_in_dmlc_words(text: str, rest: str) -> None:
    # dmlc: "Some trailing characters could not be parsed: 'REST'" (MXNet adds the
    # operator and its arguments; here the key and the value follow).
    assert verdict(LeakyReLU, "slope", text) == trailing(rest, "slope", text)


@pytest.mark.parametrize("text", ["\v0.5", "abc", "", "infinit"])
def test_float_refused_in_dmlc_words(text: str) -> None:
    assert verdict(LeakyReLU, "slope", text) == fmt("slope", text, "float")


@pytest.mark.parametrize("text", ["1e-500", "1e999", "-1e400", "1e999x"])
def test_float_out_of_range_in_dmlc_words(text: str) -> None:
    # Out of range before any trailing text, as dmlc.
    assert verdict(LeakyReLU, "slope", text) == f"Out of range value for slope, value='{text}'"


@pytest.mark.parametrize(("text", "expected"), [
    ("1e39", 1e39), ("3.5e38", 3.5e38), ("1e-39", 1e-39), ("1e-45", 1e-45), ("1e300", 1e300),
])
def test_float_holds_a_double(text: str, expected: float) -> None:
    # Decision: float fields hold a double. dmlc's float is float32:
    # "Out of range value for slope, value='1e39'".
    assert verdict(LeakyReLU, "slope", text) == expected


def test_float_beyond_float32_with_trailing_text() -> None:
    # dmlc tells the range first ("Out of range value for slope, value='1e39x'"); 1e39 is
    # in range here, so what is told is the text after it.
    assert verdict(LeakyReLU, "slope", "1e39x") == trailing("x", "slope", "1e39x")


@pytest.mark.parametrize(("text", "expected"), [
    ("e5", fmt("slope", "e5", "float")), (".", fmt("slope", ".", "float")),
    ("-", fmt("slope", "-", "float")), (" ", fmt("slope", " ", "float")),
    ("f", fmt("slope", "f", "float")), ("-infinit", fmt("slope", "-infinit", "float")),
    ("1e", trailing("e", "slope", "1e")),
])
def test_float_text_holds_a_number(text: str, expected: str) -> None:
    # Decision: dmlc's parser goes on where it finds no digit, and takes e5, ., -, a blank,
    # f and 1e as numbers (0, or 1 for 1e); -infinit is its sign and trailing 'infinit'.
    assert verdict(LeakyReLU, "slope", text) == expected


@pytest.mark.parametrize(("text", "rest"), [("nan(", "("), ("nan(a b)", "(a b)")])
def test_float_bad_nan_payload(text: str, rest: str) -> None:
    # Decision: dmlc stops on "Check failed: *p == ')' ... Invalid NAN literal".
    assert verdict(LeakyReLU, "slope", text) == trailing(rest, "slope", text)


def test_float_inf_does_not_depend_on_what_was_parsed_before() -> None:
    # Decision: dmlc's parser reads errno without clearing it, so after an out-of-range
    # value it refuses inf ("Out of range value for slope, value='inf'"). Here inf is
    # infinity whatever came before.
    assert verdict(LeakyReLU, "slope", "1e999").startswith("Out of range value")
    assert verdict(LeakyReLU, "slope", "inf") == math.inf


# -- float with bounds --------------------------------------------------------------------------

P_DOC = "p: Fraction of the input that gets dropped out during training time."


@pytest.mark.parametrize(("text", "shown"), [("1.5", "1.5"), ("-0.1", "-0.1"), ("inf", "inf"),
                                             ("-inf", "-inf"), ("nan", "nan")])
def test_float_bounds_in_dmlc_words(text: str, shown: str) -> None:
    # nan: Decision, nan is within no bound (dmlc compares and takes it).
    assert verdict(Dropout, "p", text) == (
        f"value {shown} for Parameter p exceed bound [0,1]\n{P_DOC}")


# -- bool: the word exactly --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("true", True), ("TRUE", True), ("False", False), ("1", True), ("0", False)])
def test_bool_taken(text: str, expected: bool) -> None:
    assert verdict(FullyConnected, "flatten", text) is expected


@pytest.mark.parametrize("text", [" false", "false ", " true ", "yes", "t", "", "2"])
def test_bool_refused_in_dmlc_words(text: str) -> None:
    assert verdict(FullyConnected, "flatten", text) == fmt("flatten", text, "boolean")


# -- enumerations ------------------------------------------------------------------------------

ACT = "{'relu', 'sigmoid', 'softrelu', 'softsign', 'tanh'}"
TUNE = "{None, 'fastest', 'limited_workspace', 'off'}"


@pytest.mark.parametrize("text", [" relu", "RELU", "bad", ""])
def test_enum_refused_in_dmlc_words(text: str) -> None:
    assert verdict(Activation, "act_type", text) == (
        f"Invalid Input: '{text}', valid values are: {ACT}")


def test_missing_required_enum_names_its_values() -> None:
    # Decision: dmlc says "Required parameter act_type of int is not presented" (its enum
    # is an int inside); the valid values say more.
    with pytest.raises(ParamError) as e:
        Activation.parse({})
    assert str(e.value) == f"Required parameter act_type of {ACT} is not presented"


@pytest.mark.parametrize(("text", "expected"), [("fastest", "fastest"), ("None", None),
                                                ("off", "off")])
def test_optional_enum_taken(text: str, expected: str | None) -> None:
    assert verdict(Convolution, "cudnn_tune", text) == expected


@pytest.mark.parametrize("text", ["bad", " off", "none", "FASTEST"])
def test_optional_enum_lists_none_among_valid_values(text: str) -> None:
    assert verdict(Convolution, "cudnn_tune", text) == (
        f"Invalid Input: '{text}', valid values are: {TUNE}")


def test_optional_enum_documented_with_none() -> None:
    assert Convolution.__fields__["cudnn_tune"].describe() == (
        f"cudnn_tune : {TUNE}, optional, default=None\n"
        "    Whether to pick convolution algo by running test.")


# -- shapes and tuples -----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["(1,1)", "[1,1]", "(1, 1)", " (1,1) "])
def test_shape_taken(text: str) -> None:
    assert verdict(Convolution, "kernel", text) == (1, 1)


@pytest.mark.parametrize("text", ["(1 1)", "1,1", "(1.5,1)", "(1,1", "(1,1]"])
def test_shape_refused_in_dmlc_words(text: str) -> None:
    # (1,1]: Decision, a shape's brackets match (dmlc's reader takes it as (1,1)).
    assert verdict(Convolution, "kernel", text) == fmt("kernel", text, "Shape(tuple)")


@pytest.mark.parametrize(("text", "expected"), [
    ("(0.5,)", (0.5,)), ("(0.5, 0.25)", (0.5, 0.25)), (" (0.5) ", (0.5,)), ("0.5", (0.5,)),
    ("(1e39,)", (1e39,)),  # Decision: a double (dmlc: float32, refused)
])
def test_float_tuple_taken(text: str, expected: tuple[float, ...]) -> None:
    assert verdict(MultiBoxPrior, "sizes", text) == expected


@pytest.mark.parametrize("text", ["(0.5x)", "(abc)", "(0.5 )x"])
def test_float_tuple_refused_in_dmlc_words(text: str) -> None:
    assert verdict(MultiBoxPrior, "sizes", text) == fmt("sizes", text, "tuple of <float>")


def test_float_tuple_items_parse_as_floats() -> None:
    # Decision: items of a tuple or list parse as their type does; dmlc reads Tuple<float>
    # items with C++ streams, which refuse inf and nan.
    assert verdict(MultiBoxPrior, "sizes", "(inf,)") == (math.inf,)
    assert math.isnan(verdict(MultiBoxPrior, "sizes", "(nan,)")[0])


# -- in a job file: the place first -----------------------------------------------------------


def test_job_file_messages_keep_their_place() -> None:
    block = parse_text('slope: "0.5abc"\n', "leaky.conf")
    with pytest.raises(ParamError) as e:
        LeakyReLU._build(block)
    assert str(e.value) == "leaky.conf:1:1: " + trailing("abc", "slope", "0.5abc")
    block = parse_text('cudnn_tune: "quick"\n', "conv.conf")
    with pytest.raises(ParamError) as e:
        Convolution._build(block)
    assert str(e.value) == (
        f"conv.conf:1:1: Invalid Input: 'quick', valid values are: {TUNE}")
