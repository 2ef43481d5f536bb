"""The reader of SINGA job files (protocol-buffer text format) and the tree it builds."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_encoding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramserver.config.errors import Location, ParamError
from paramserver.config.textformat import MAX_DEPTH, parse_text
from paramserver.config.tree import Block, Entry, ListValue, Scalar, Value, unwrap

SPEC_SAMPLE = """\
updater {
  type: kSGD
  momentum: 0.9
  weight_decay: 0.0005
  learning_rate { type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 } }
}
neuralnet {
  layer {
    name: "fc1"
    type: kInnerProduct
    innerproduct_conf { num_output: 100 }
    param { name: "w1" init { type: kUniformSqrtFanIn } }
    param { name: "b1" lr_scale: 2.0 init { type: kConstant value: 0 } }
  }
}
"""

#: A job file using every feature of the grammar, the seed of the mutation fuzzing.
FULL_JOB = (
    SPEC_SAMPLE
    + """\
# cluster settings
cluster: {
  nworker_groups: 1; nserver_groups: 1
  nworkers_per_group 2,
  workspace: 'examples/'  "mlp"  # adjacent literals concatenate
}
train_steps: 1000
disp_freq: -1e-3
shape: [1, 2, 3]
steps: []
user_type: "FooParam"
[fooparam_conf] { x: 10 ratio: inf low: -INF bad: nan scale: 1.2f }
layers [ { name: "a" }, < name: 'b\\n\\x41\\101' > ]
debug: true
"""
)


def tree(value: Value) -> Any:
    """What a value holds, places left out: scalars as (raw, quoted), blocks as entries."""
    if isinstance(value, Scalar):
        return (value.raw, value.quoted)
    if isinstance(value, ListValue):
        return [tree(v) for v in value.items]
    return [(f"[{e.key}]" if e.extension else e.key, tree(e.value)) for e in value.entries]


def problems(text: str, filename: str = "job.conf") -> list[tuple[int, int, str]]:
    """The problems of a text that does not read, as (line, column, message)."""
    with pytest.raises(ParamError) as info:
        parse_text(text, filename)
    found = []
    for p in info.value.problems:
        assert isinstance(p.where, Location) and p.where.file == filename
        found.append((p.where.line, p.where.column, p.message))
    return found


def only_problem(text: str) -> tuple[int, int, str]:
    (found,) = problems(text)
    return found


# -- the tree -------------------------------------------------------------------------


def test_spec_sample_reads_as_written() -> None:
    job = parse_text(SPEC_SAMPLE, "job.conf")
    assert unwrap(job) == {
        "updater": {
            "type": "kSGD",
            "momentum": "0.9",
            "weight_decay": "0.0005",
            "learning_rate": {
                "type": "kInverse",
                "base_lr": "0.01",
                "inverse_conf": {"gamma": "0.0001", "pow": "0.75"},
            },
        },
        "neuralnet": {
            "layer": {
                "name": "fc1",
                "type": "kInnerProduct",
                "innerproduct_conf": {"num_output": "100"},
                "param": [
                    {"name": "w1", "init": {"type": "kUniformSqrtFanIn"}},
                    {"name": "b1", "lr_scale": "2.0", "init": {"type": "kConstant", "value": "0"}},
                ],
            }
        },
    }
    assert job.where == Location("job.conf", 1, 1)
    updater = job.entries[0]
    assert updater.where == Location("job.conf", 1, 1)
    assert isinstance(updater.value, Block)
    assert updater.value.where == Location("job.conf", 1, 9)  # its opening brace
    momentum = updater.value.entries[1]
    assert momentum == Entry(
        "momentum", Scalar("0.9", Location("job.conf", 3, 13)), Location("job.conf", 3, 3)
    )
    layer = job.entries[1].value.entries[0]  # type: ignore[union-attr]
    name = layer.value.entries[0]  # type: ignore[union-attr]
    assert name.value == Scalar("fc1", Location("job.conf", 9, 11), quoted=True)


def test_places_count_from_one_and_tabs_as_one_column() -> None:
    job = parse_text("\n\t  lr:\t0.5\n", "f")
    (entry,) = job.entries
    assert entry.where == Location("f", 2, 4)
    assert entry.value == Scalar("0.5", Location("f", 2, 8))


def test_empty_file_and_comments_only() -> None:
    assert parse_text("").entries == []
    assert parse_text("# nothing\n\n   # here\n").entries == []


def test_comments() -> None:
    job = parse_text('# head\na: 1 # trailing\n# b: 2\nc: "# kept"  #x\n')
    assert tree(job) == [("a", ("1", False)), ("c", ("# kept", True))]


def test_colon_and_bare_value() -> None:
    job = parse_text("a: 1\nb 2\nc kSGD d: 'x' e 'y'")
    assert unwrap(job) == {"a": "1", "b": "2", "c": "kSGD", "d": "x", "e": "y"}


def test_blocks_with_or_without_colon_and_angle_brackets() -> None:
    job = parse_text("a { x: 1 } b: { x: 2 } c < x: 3 > d: < > e {}")
    assert unwrap(job) == {"a": {"x": "1"}, "b": {"x": "2"}, "c": {"x": "3"}, "d": {}, "e": {}}
    assert job.entries[2].value.where == Location("<string>", 1, 26)  # type: ignore[union-attr]


def test_repeated_fields_stay_repeated_entries() -> None:
    job = parse_text("step: 10 step: 20 param { } param { }")
    assert [e.key for e in job.entries] == ["step", "step", "param", "param"]


def test_list_syntax() -> None:
    job = parse_text("a: [1, -2.5, kX, 'q']\nb: []\nc: [1, 2,]")
    assert tree(job) == [
        ("a", [("1", False), ("-2.5", False), ("kX", False), ("q", True)]),
        ("b", []),
        ("c", [("1", False), ("2", False)]),
    ]
    assert job.entries[0].value.where == Location("<string>", 1, 4)  # type: ignore[union-attr]
    assert job.entries[0].value.items[2].where == Location(  # type: ignore[union-attr]
        "<string>", 1, 14
    )


def test_list_of_blocks_with_or_without_colon() -> None:
    job = parse_text("layer [ { name: 'a' }, < name: 'b' > ]\nparam: [{}]")
    assert unwrap(job) == {"layer": [{"name": "a"}, {"name": "b"}], "param": [{}]}


def test_strings_in_either_quotes_with_escapes() -> None:
    text = r"""a: "x\"y\n\t\\"  b: 'it\'s'  c: "\101\x41\x4\u00e9\U0001F600\?"  d: "é" e: ''"""
    assert unwrap(parse_text(text)) == {
        "a": 'x"y\n\t\\',
        "b": "it's",
        "c": "AA\x04é\U0001f600?",
        "d": "é",
        "e": "",
    }


def test_adjacent_string_literals_concatenate() -> None:
    job = parse_text("a: 'x' \"y\"\n   'z'\nb: 1")
    assert job.entries[0].value == Scalar("xyz", Location("<string>", 1, 4), quoted=True)
    assert len(job.entries) == 2


def test_quoted_tells_strings_from_names() -> None:
    job = parse_text('a: None b: "None"')
    assert [e.value.quoted for e in job.entries] == [False, True]  # type: ignore[union-attr]


def test_enum_names_and_booleans_stay_text() -> None:
    job = parse_text("type: kUniformSqrtFanIn on: true off: False")
    assert unwrap(job) == {"type": "kUniformSqrtFanIn", "on": "true", "off": "False"}


def test_numbers_stay_text_as_written() -> None:
    written = ["1", "-1", "+3", "1e-3", "-2.5E+10", ".5", "-.5e-3", "1.2f", "1.2F", "0",
               "inf", "-inf", "-INF", "Infinity", "nan", "NaN", "-nan"]
    text = "\n".join(f"v{i}: {w}" for i, w in enumerate(written))
    job = parse_text(text)
    assert [e.value.raw for e in job.entries] == written  # type: ignore[union-attr]
    assert not any(e.value.quoted for e in job.entries)  # type: ignore[union-attr]


def test_semicolons_and_commas_after_fields() -> None:
    job = parse_text("a: 1; b: 2, c { d: 3; }, e: 4")
    assert unwrap(job) == {"a": "1", "b": "2", "c": {"d": "3"}, "e": "4"}


def test_extension_blocks() -> None:
    job = parse_text('user_type: "FooParam"\n[fooparam_conf] { x: 10 }\n[a.b.c]: { }\n[s]: 5')
    ext = job.entries[1]
    assert (ext.key, ext.extension) == ("fooparam_conf", True)
    assert ext.where == Location("<string>", 2, 1)
    assert unwrap(ext.value) == {"x": "10"}
    assert [(e.key, e.extension) for e in job.entries[2:]] == [("a.b.c", True), ("s", True)]


def test_bare_enum_value_before_an_extension_block() -> None:
    job = parse_text("user_type: kFoo\n[foo_conf] { x: 1 }")
    assert tree(job) == [("user_type", ("kFoo", False)), ("[foo_conf]", [("x", ("1", False))])]


def test_windows_line_ends() -> None:
    job = parse_text("a: 1\r\nb {\r\n  c: 'x'\r\n}\r\n")
    assert unwrap(job) == {"a": "1", "b": {"c": "x"}}
    assert job.entries[1].value.entries[0].where == Location(  # type: ignore[union-attr]
        "<string>", 3, 3
    )


def test_byte_order_mark_is_passed_over() -> None:
    assert parse_text("\ufeffa: 1").entries[0].where == Location("<string>", 1, 1)


def test_full_job_reads() -> None:
    job = parse_text(FULL_JOB)
    plain = unwrap(job)
    assert plain["cluster"]["workspace"] == "examples/mlp"
    assert plain["cluster"]["nworkers_per_group"] == "2"
    assert plain["[fooparam_conf]"]["low"] == "-INF"
    assert plain["layers"] == [{"name": "a"}, {"name": "b\nAA"}]
    assert plain["steps"] == [] and plain["shape"] == ["1", "2", "3"]


# -- problems -------------------------------------------------------------------------


def test_problem_reads_file_line_column_message() -> None:
    with pytest.raises(ParamError) as info:
        parse_text("a {\n  b: }\n", "job.conf")
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "job.conf:2:6: expected a value after 'b:', found '}'"


def test_unterminated_string() -> None:
    assert only_problem('a: 1\nname: "fc1\nb: 2') == (
        2, 7, 'unterminated string: missing the closing "'
    )
    assert only_problem(r"name: 'ends with \'") == (
        1, 7, "unterminated string: missing the closing '"
    )


def test_invalid_escape_points_at_the_backslash() -> None:
    assert problems(r'a: "ok\q" b: "\777" c: "\ud800\N{X}" d: "\x"') == [
        (1, 7, r"invalid escape sequence '\q' in string"),
        (1, 15, r"invalid escape sequence '\777' in string"),
        (1, 25, r"invalid escape sequence '\ud800' in string"),
        (1, 31, r"invalid escape sequence '\N' in string"),
        (1, 42, r"invalid escape sequence '\x' in string"),
    ]


def test_string_that_is_not_utf8() -> None:
    assert only_problem(r'a: "\377"') == (
        1, 4, "string is not valid UTF-8 once its escapes are applied"
    )


def test_missing_value_before_the_next_field() -> None:
    # Reported where the value belongs: just after the colon.
    assert only_problem("momentum:\n  weight_decay: 0.1") == (
        1, 10, "expected a value after 'momentum:', found 'weight_decay'"
    )
    assert only_problem("a { momentum: weight_decay: 0.1 }") == (
        1, 15, "expected a value after 'momentum:', found 'weight_decay'"
    )
    assert only_problem("a: 1\n[ext] { }\nb:\n[ext] { }") == (
        3, 3, "expected a value after 'b:', found '['"
    )


def test_missing_value_at_a_closer_or_the_end() -> None:
    assert only_problem("a {\n  b: }") == (2, 6, "expected a value after 'b:', found '}'")
    assert only_problem("a: 1\nb:\n\n# end\n") == (
        2, 3, "expected a value after 'b:', found end of file"
    )


def test_something_that_is_no_value() -> None:
    assert only_problem("a: = 5 { x: 1 }\nb: 2") == (1, 4, "expected a value after 'a:', found '='")
    assert only_problem("a: - 5") == (1, 4, "expected a value after 'a:', found '-'")


def test_missing_colon_and_value() -> None:
    assert only_problem("a = 5") == (1, 3, "expected ':' or a value after 'a', found '='")
    assert only_problem("a\nb: 1") == (1, 2, "expected ':' or a value after 'a', found 'b'")


def test_expected_a_field_name() -> None:
    assert only_problem("a: 1\n3: 4") == (2, 1, "expected a field name, found '3'")
    assert only_problem('"a": 1') == (1, 1, "expected a field name, found '\"a\"'")
    assert only_problem("a: 1;; b: 2") == (1, 6, "expected a field name, found ';'")
    assert only_problem("a: 1\n{ b: 1 } c: 2") == (2, 1, "expected a field name, found '{'")
    assert only_problem("a: 1 @") == (1, 6, "expected a field name, found '@'")


def test_invalid_field_name() -> None:
    assert only_problem("a: 1\n  foo-bar: 2") == (2, 3, "invalid field name 'foo-bar'")


def test_unclosed_block() -> None:
    text = "neuralnet {\n  layer {\n    name: 'x'\n\n"
    assert only_problem(text + "}\n") == (
        5, 2, "expected '}' to close 'neuralnet' opened at 1:11, found end of file"
    )
    assert problems(text) == [
        (3, 14, "expected '}' to close 'layer' opened at 2:9, found end of file"),
        (3, 14, "expected '}' to close 'neuralnet' opened at 1:11, found end of file"),
    ]


def test_mismatched_closer() -> None:
    assert only_problem("a < b: 1 }\nc: 2") == (
        1, 10, "expected '>' to close 'a' opened at 1:3, found '}'"
    )
    assert only_problem("a {\n b: 1\n>") == (
        3, 1, "expected '}' to close 'a' opened at 1:3, found '>'"
    )


def test_closer_with_no_open_block() -> None:
    assert only_problem("a: 1\n}\nb: 2") == (2, 1, "unexpected '}': no block is open")


def test_list_missing_comma() -> None:
    assert only_problem("a: [1 2, 3]\nb: 1") == (
        1, 7, "expected ',' or ']' to close the list opened at 1:4, found '2'"
    )


def test_list_left_open() -> None:
    assert only_problem("a: [1, 2\nb: 3") == (
        1, 9, "expected ']' to close the list opened at 1:4, found 'b'"
    )
    assert only_problem("x { a: [1, }") == (
        1, 12, "expected ']' to close the list opened at 1:8, found '}'"
    )


def test_list_missing_item() -> None:
    assert only_problem("a: [1, , 2]") == (1, 8, "expected a value in the list, found ','")


def test_nested_list() -> None:
    assert only_problem("a: [[1], 2]") == (1, 5, "lists cannot be nested")


def test_bad_extension_names() -> None:
    assert problems("[] { }\n[a.] { }\n[a b] { }\nc: 1") == [
        (1, 2, "expected an extension name, found ']'"),
        (2, 4, "expected a name after '.', found ']'"),
        (3, 4, "expected ']' after the extension name 'a', found 'b'"),
    ]


def test_nesting_too_deep() -> None:
    deep = "a { " * (MAX_DEPTH + 1) + "}" * (MAX_DEPTH + 1)
    assert only_problem(deep) == (
        1, 4 * MAX_DEPTH + 3, f"blocks and lists are nested more than {MAX_DEPTH} deep"
    )
    fine = "a { " * MAX_DEPTH + "}" * MAX_DEPTH
    assert parse_text(fine).entries[0].key == "a"


def test_three_mistakes_three_problems_in_order() -> None:
    text = (
        "updater {\n"
        "  type: kSGD\n"
        "  momentum:\n"  # 3: missing value
        "  weight_decay: 0.0005\n"
        "}\n"
        "neuralnet {\n"
        '  layer { name: "fc1 }\n'  # 7: unterminated string
        "  }\n"
        "  layer { name: 'fc2' type = kInnerProduct }\n"  # 9: '=' for ':'
        "}\n"
        "train_steps: 10\n"
    )
    assert problems(text) == [
        (3, 12, "expected a value after 'momentum:', found 'weight_decay'"),
        (7, 17, 'unterminated string: missing the closing "'),
        (9, 28, "expected ':' or a value after 'type', found '='"),
    ]


def test_reading_goes_on_after_a_mistake() -> None:
    # After each mistake the next fields are read: their own mistakes are found too.
    assert problems("a: =\nb: [1 2]\nc { d: }\ne: 'x\nf: 1 g: @") == [
        (1, 4, "expected a value after 'a:', found '='"),
        (2, 7, "expected ',' or ']' to close the list opened at 2:4, found '2'"),
        (3, 8, "expected a value after 'd:', found '}'"),
        (4, 4, "unterminated string: missing the closing '"),
        (5, 9, "expected a value after 'g:', found '@'"),
    ]


# -- fuzzing: any text gives a tree or a ParamError --------------------------------------

#: Pieces that make grammar happen more often than arbitrary characters would.
GRAMMAR_PIECES = [*"{}<>[]:;,\"'\\#\n\t .-+e0123456789kSGDabx_@", "inf", "nan", "\\n"]
pieces = st.sampled_from(GRAMMAR_PIECES) | st.characters()


def read_or_problems(text: str) -> None:
    """Reading gives a Block, or a ParamError whose problems are placed inside the text."""
    try:
        result = parse_text(text, "fuzz.conf")
    except ParamError as error:
        assert error.problems
        lines = text.split("\n")
        places = []
        for p in error.problems:
            assert isinstance(p.where, Location) and p.where.file == "fuzz.conf"
            assert 1 <= p.where.line <= len(lines)
            assert 1 <= p.where.column <= len(lines[p.where.line - 1]) + 1
            places.append((p.where.line, p.where.column))
        assert places == sorted(places)
    else:
        assert isinstance(result, Block)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pieces, max_size=80).map("".join))
def test_fuzz_any_text(text: str) -> None:
    read_or_problems(text)


edits = st.lists(
    st.tuples(
        st.sampled_from(["delete", "insert", "replace"]),
        st.integers(0, len(FULL_JOB)),
        pieces,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits)
def test_fuzz_mutated_job_file(changes: list[tuple[str, int, str]]) -> None:
    text = FULL_JOB
    for kind, at, char in changes:
        at = min(at, len(text))
        if kind == "delete":
            text = text[:at] + text[at + 1 :]
        elif kind == "insert":
            text = text[:at] + char + text[at:]
        else:
            text = text[:at] + char + text[at + 1 :]
    read_or_problems(text)


# -- round trip: what protobuf's own escaper writes reads back the same ----------------------

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
numbers = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
scalars = st.one_of(
    names.map(lambda s: Scalar(s)),
    numbers.map(lambda s: Scalar(s)),
    st.text(max_size=12).map(lambda s: Scalar(s, quoted=True)),
)
values = st.recursive(
    scalars | st.lists(scalars, max_size=3).map(lambda items: ListValue(list(items))),
    lambda inner: st.lists(st.tuples(names, st.booleans(), inner), max_size=4).map(
        lambda items: Block(
            [Entry(k, v, extension=x and isinstance(v, Block)) for k, x, v in items]
        )
    ),
    max_leaves=12,
)


def write(value: Value, quote: str) -> str:
    """The text form of a value, strings escaped by protobuf's CEscape."""
    if isinstance(value, Scalar):
        if not value.quoted:
            return str(value.raw)
        return quote + text_encoding.CEscape(value.raw.encode("utf-8"), as_utf8=True) + quote
    if isinstance(value, ListValue):
        return "[" + ", ".join(write(v, quote) for v in value.items) + "]"
    fields = []
    for e in value.entries:
        key = f"[{e.key}]" if e.extension else e.key
        colon = "" if isinstance(e.value, Block) else ":"
        fields.append(f"{key}{colon} {write(e.value, quote)}")
    return "{\n" + "\n".join(fields) + "\n}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, values), max_size=4), st.sampled_from(["'", '"']))
def test_written_tree_reads_back(fields: list[tuple[str, Value]], quote: str) -> None:
    original = Block([Entry(k, v) for k, v in fields])
    text = write(original, quote)[1:-1]  # the top level has no braces
    assert tree(parse_text(text)) == tree(original)


def test_short_booleans_are_words_where_no_boolean_is_read() -> None:
    """protobuf's bare ``t``/``f`` read as booleans by boolean fields only: a tree written
    with the word ``f`` reads back as that word (the round trip above found it)."""
    block = parse_text("a: f\nb: t\n")
    assert [e.value.raw for e in block.entries] == ["f", "t"]
    from paramserver.config.job import ClusterConf

    assert ClusterConf.parse(parse_text("share_memory: f")).share_memory is False
    assert ClusterConf.parse(parse_text("share_memory: t")).share_memory is True
