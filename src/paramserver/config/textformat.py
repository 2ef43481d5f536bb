"""Reader for SINGA job files: the protocol-buffer text format, read without a schema.

``parse_text`` turns the text of a ``job.conf`` into the neutral tree of
:mod:`paramserver.config.tree`; the declarations check it afterwards. The reader interprets
values only where protobuf's text format reads a token otherwise than the declarations'
text parsing (SPEC section 1, the dmlc path) does, and hands those on typed:

* hexadecimal and octal integers (``0x10``, ``-0x10``, ``010`` = 8) become integers
  (:class:`WrittenInt`, which keeps its spelling for messages); a decimal integer with a
  leading zero and a digit 8 or 9 (``08``) is an error, as protobuf says;
* the booleans ``t`` and ``f`` become :class:`~paramserver.config.tree.WrittenBool`: ``True``
  and ``False`` where a boolean field reads them, the words themselves elsewhere.

Everything else (decimal numbers, enum names or numbers, ``true``/``false``) stays text
exactly as written, so that one set of conversions and messages serves files and Python
mappings. Enum values given by number (``type: 1``) are read by the enum field itself.

Lexing follows protobuf's own: the tokens are those of
:class:`google.protobuf.text_format.Tokenizer` (comments, whitespace, identifiers, numbers,
quoted strings, any other character alone), found here by one regular expression over the
whole text, because that Tokenizer costs microseconds per token and read a 1 MB list at
under 0.5 MB/s; :func:`google.protobuf.text_encoding.CUnescape` applies string escapes. The
grammar is read here rather than by ``text_format.Parse``, because that needs the message
descriptors and stops at the first mistake, while a job file should be read without a schema
and report all of its mistakes in one run.

Places of problems: an unexpected token is reported where it starts; something missing at the
end of a line (or of the file) is reported just after the last token before the gap, where it
should have been written.
"""

from __future__ import annotations

import gc
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

from google.protobuf import text_encoding

from paramserver.config.errors import Location, ParamError, Problem
from paramserver.config.tree import Block, Entry, ListValue, Scalar, Value, WrittenBool

__all__ = ["MAX_DEPTH", "MAX_PROBLEMS", "WrittenInt", "parse_text", "paused_gc"]

#: Deepest nesting of blocks and lists read (protobuf's C++ reader stops at 100 as well).
MAX_DEPTH = 100
#: Most problems reported for one file; the rest are counted.
MAX_PROBLEMS = 50

_CLOSER = {"{": "}", "<": ">"}
_BLOCK_OPENERS = frozenset(_CLOSER)
_BLOCK_CLOSERS = frozenset(_CLOSER.values())
_OPENERS = _BLOCK_OPENERS | {"["}
_CLOSERS = _BLOCK_CLOSERS | {"]"}
_SEPARATORS = frozenset(";,")
_QUOTES = frozenset("'\"")
#: Where reading can go on after a mistake inside a block, and inside a list.
_ENTRY_STOPS = _BLOCK_CLOSERS | _SEPARATORS
_LIST_STOPS = _BLOCK_CLOSERS | {"]", ","}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: An identifier or number token of the Tokenizer: enum names, true/false, 1e-3, -inf, 1.2f.
#: Whether it is a valid number is for the declaration to say; a sign alone is not a value.
_WORD = re.compile(r"[+-]?(?:[0-9A-Za-z_]|\.[0-9])[0-9A-Za-z_.+-]*\Z")
_TERMINATED = {q: re.compile(rf"{q}(?:[^{q}\\\n]|\\.)*{q}\Z") for q in _QUOTES}
_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]+)\Z")
_OCTAL = re.compile(r"([+-]?)0([0-7]+)\Z")
_LEADING_ZERO = re.compile(r"[+-]?0[0-9]+\Z")
_BOOLS = {"t": WrittenBool("t"), "f": WrittenBool("f")}
_ESCAPE = re.compile(r"\\(?:[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.?)")
_SIMPLE_ESCAPES = frozenset("abfnrtv\\'\"?")


#: One lexeme of protobuf's Tokenizer: whitespace and comments (skipped), or a token: an
#: identifier, a number, a string in either quote (to the end of its line when unterminated),
#: or any other character alone.
_LEXEME = re.compile(
    r"([^\S\n]*)"  # blanks before the lexeme, on its line
    r"(?:([A-Za-z_][0-9A-Za-z_+-]*"
    r"|(?:[0-9+-]|\.[0-9])[0-9A-Za-z_.+-]*"
    r"|'[^'\n\\]*(?:(?:\\.)+[^'\n\\]*)*(?:'|\\?$)"
    r'|"[^"\n\\]*(?:(?:\\.)+[^"\n\\]*)*(?:"|\\?$)'
    r"|[^\s#])"
    r"|((?:\s|#[^\n]*)+)"  # line breaks and comments
    r"|\Z)",
    re.MULTILINE,
)


class _Token(NamedTuple):
    """A token and where it starts (1-based). The end of file has no text."""

    text: str
    line: int
    column: int

    @property
    def end(self) -> int:
        return self.column + len(self.text)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a while. Reading a job file makes an
    object or two per value and no cycles, and each collection would walk every object made
    so far again: a third of the time of a 5 MB file went to collections."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class WrittenInt(int):
    """An integer of a job file written in another base (``0x10``, ``010``): its value, and
    its spelling as ``str()`` shows it, so that a message quotes what the file says."""

    text: str

    def __new__(cls, value: int, text: str) -> WrittenInt:
        obj = super().__new__(cls, value)
        obj.text = text
        return obj

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def parse_text(text: str, filename: str = "<string>") -> Block:
    """Read a job file written in the protocol-buffer text format.

    Args:
      text: the content of the file.
      filename: the name that places in messages start with.

    Returns:
      The top-level block: its entries in file order, each placed at its key. Repeated fields
      are repeated entries; ``[name] { ... }`` blocks are entries with ``extension=True``.

    Raises:
      ParamError: with one problem per mistake found, in file order, each placed at
        ``filename:line:column``.
    """
    if text.startswith("\ufeff"):  # a byte-order mark, which editors do not show as a column
        text = text[1:]
    with paused_gc():
        tokens, problems = _tokenize(text, filename)
        reader = _Reader(tokens, filename)
        entries = reader.read_entries(None, "", None)
    problems += reader.problems
    if problems:
        problems.sort(key=_position)
        if len(problems) > MAX_PROBLEMS:  # a broken list can make one problem per value
            rest = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], Problem(
                f"... and {rest:,} more problems after this place", problems[MAX_PROBLEMS].where)]
        raise ParamError(problems)
    return Block(entries, Location(filename, 1, 1))


def _position(problem: Problem) -> tuple[int, int]:
    where = problem.where
    return (where.line, where.column) if isinstance(where, Location) else (0, 0)


def _tokenize(text: str, filename: str) -> tuple[list[_Token], list[Problem]]:
    """All tokens of ``text`` with their places, and an end-of-file token after the last one.

    Linear in the text: one pass of :data:`_LEXEME`; lines are counted in the skipped
    whitespace only (no token holds a line break).
    """
    pieces = _LEXEME.split(text)  # per lexeme: '' before it, its blanks, token, skipped text
    texts: list[str] = []
    lines: list[int] = []
    columns: list[int] = []
    line, line_start, pos = 1, 0, 0
    for blanks, token, skip in zip(pieces[1::4], pieces[2::4], pieces[3::4]):
        pos += len(blanks)
        if token is not None:
            texts.append(token)
            lines.append(line)
            columns.append(pos - line_start + 1)
            pos += len(token)
        elif skip is not None:
            if "\n" in skip:
                line += skip.count("\n")
                line_start = pos + skip.rindex("\n") + 1
            pos += len(skip)
    # tuple.__new__ through map: the tokens are made without a Python call each.
    tokens = list(map(partial(tuple.__new__, _Token), zip(texts, lines, columns)))
    last = tokens[-1] if tokens else None
    tokens.append(_Token("", last.line, last.end) if last else _Token("", 1, 1))
    return tokens, []


def _show(text: str) -> str:
    """A token as messages quote it."""
    if not text:
        return "end of file"
    if len(text) > 30:
        text = text[:27] + "..."
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return f"'{text}'"


class _Reader:
    """Recursive descent over the token list, collecting problems and going on after each."""

    def __init__(self, tokens: list[_Token], filename: str):
        self.tokens = tokens
        self.filename = filename
        self.index = 0
        self.depth = 0
        self.problems: list[Problem] = []

    # -- tokens and problems -------------------------------------------------------------

    def peek(self, ahead: int = 0) -> _Token:
        if not ahead:  # the index never passes the end-of-file token
            return self.tokens[self.index]
        try:
            return self.tokens[self.index + ahead]
        except IndexError:  # past the end: the end-of-file token
            return self.tokens[-1]

    def advance(self) -> _Token:
        token = self.peek()
        if token.text:
            self.index += 1
        return token

    def at(self, token: _Token, offset: int = 0) -> Location:
        # tuple.__new__: one per value of the file, without the named tuple's Python call
        return tuple.__new__(Location, (self.filename, token.line, token.column + offset))

    def error(self, message: str, where: Location) -> None:
        self.problems.append(Problem(message, where))

    def expected(self, what: str, continues: bool = True) -> None:
        """Report ``expected WHAT, found TOKEN``: at the token, or, when WHAT ``continues`` the
        text before it and the token is on a later line, just after the previous token, where
        the missing text belongs."""
        token = self.peek()
        previous = self.tokens[self.index - 1] if self.index else None
        if previous is not None and (not token.text or (continues and token.line > previous.line)):
            where = Location(self.filename, previous.line, previous.end)
        else:
            where = self.at(token)
        self.error(f"expected {what}, found {_show(token.text)}", where)

    def skip(self, stops: frozenset[str], line_end: bool = True) -> None:
        """Pass over the token in error and what follows, nested brackets whole, up to a token
        in ``stops``, the end of a bracketed region or (with ``line_end``) the next line: where
        reading can go on."""
        first = self.index
        line = self.peek().line
        depth = 0
        while token := self.peek().text:
            if self.index > first and depth == 0:
                if token in stops or (line_end and self.peek().line > line):
                    return
            self.advance()
            if token in _OPENERS:
                depth += 1
            elif token in _CLOSERS and depth:
                depth -= 1
                if depth == 0:
                    return

    def skip_nested(self) -> None:
        """Pass over the bracketed region that starts at the current token."""
        depth = 0
        while token := self.advance().text:
            if token in _OPENERS:
                depth += 1
            elif token in _CLOSERS:
                depth -= 1
                if depth <= 0:
                    return

    def key_starts_here(self) -> bool:
        """Whether the current token begins a field (``name:``, ``name {``, ``[ext] {``) rather
        than a value; tells a missing value from a bare value such as an enum name."""
        token = self.peek()
        if token.text[:1].isalpha() or token.text[:1] == "_":
            return self.peek(1).text in (":", "{", "<")
        if token.text != "[":
            return False
        ahead = 1
        while _NAME.match(self.peek(ahead).text):
            if self.peek(ahead + 1).text not in (".", "/"):
                return self.peek(ahead + 1).text == "]" and self.peek(ahead + 2).text in (
                    ":",
                    "{",
                    "<",
                )
            ahead += 2
        return False

    # -- grammar ---------------------------------------------------------------------

    def read_entries(self, closer: str | None, owner: str, opener: _Token | None) -> list[Entry]:
        """Fields up to ``closer`` (consumed), or to the end of the file at the top level."""
        entries: list[Entry] = []
        while True:
            token = self.peek()
            if not token.text:
                if closer is not None and opener is not None:
                    self.expected(
                        f"'{closer}' to close {owner} opened at {opener.line}:{opener.column}"
                    )
                return entries
            if token.text in _BLOCK_CLOSERS:
                if closer is None:
                    self.error(f"unexpected '{token.text}': no block is open", self.at(token))
                    self.advance()
                    continue
                if token.text != closer and opener is not None:
                    # '{ ... >' or '< ... }': most likely a typo for the right closer.
                    self.expected(
                        f"'{closer}' to close {owner} opened at {opener.line}:{opener.column}",
                        continues=False,
                    )
                self.advance()
                return entries
            if token.text in _SEPARATORS:
                self.expected("a field name", continues=False)
                self.advance()
                continue
            entry = self.read_entry()
            if entry is not None:
                entries.append(entry)
            if self.peek().text in _SEPARATORS:
                self.advance()

    def read_entry(self) -> Entry | None:
        start = self.peek()
        extension = start.text == "["
        if extension:
            key = self.read_extension_name()
            if key is None:
                return None
        elif start.text.isidentifier() and start.text.isascii():  # _NAME, without a regex
            key = self.advance().text
        else:
            if start.text[:1].isalpha() or start.text[:1] == "_":
                self.error(f"invalid field name {_show(start.text)}", self.at(start))
            else:
                self.expected("a field name", continues=False)
            self.skip(_ENTRY_STOPS)
            return None
        value = self.read_field_value(f"[{key}]" if extension else key)
        if value is None:
            return None
        return Entry(key, value, self.at(start), extension=extension)

    def read_extension_name(self) -> str | None:
        """``[name.with.dots]``; the bracket is the current token."""
        self.advance()
        parts: list[str] = []
        while True:
            if not _NAME.match(self.peek().text):
                self.expected("an extension name" if not parts else f"a name after '{parts[-1]}'")
                self.skip(_ENTRY_STOPS)
                return None
            parts.append(self.advance().text)
            separator = self.peek().text
            if separator in (".", "/"):
                parts.append(self.advance().text)
            elif separator == "]":
                self.advance()
                return "".join(parts)
            else:
                self.expected(f"']' after the extension name '{''.join(parts)}'")
                self.skip(_ENTRY_STOPS)
                return None

    def read_field_value(self, label: str) -> Value | None:
        """What follows a field name: ``: value``, a block, a list, or (loosely) a bare value."""
        colon = self.peek().text == ":"
        if colon:
            self.advance()
        token = self.peek()
        if token.text in _BLOCK_OPENERS:
            return self.read_block(label)
        if token.text == "[" and not self.key_starts_here():
            return self.read_list(label)
        value = self.read_scalar()
        if value is not None:
            return value
        self.expected(f"a value after '{label}:'" if colon else f"':' or a value after '{label}'")
        if token.text and token.text not in _ENTRY_STOPS and not self.key_starts_here():
            self.skip(_ENTRY_STOPS)
        return None

    def read_scalar(self) -> Scalar | None:
        """A number, a name or string literals at the current token; None (nothing read) if the
        token is none of these."""
        token = self.peek()
        if token.text[:1] in _QUOTES:
            parts = []
            while self.peek().text[:1] in _QUOTES:
                parts.append(self.read_string(self.advance()))
            return Scalar("".join(parts), self.at(token), quoted=True)
        if _WORD.match(token.text) and not self.key_starts_here():
            return self.word(self.advance())
        return None

    def word(self, token: _Token) -> Scalar:
        """The value of a number or name token (read past already)."""
        return Scalar(self.typed(token), self.at(token))

    def typed(self, token: _Token) -> object:
        """A bare token's value where protobuf reads it otherwise than the declarations'
        text parsing: hex and octal integers, ``t`` and ``f``; else its text."""
        text = token.text
        if text in _BOOLS:
            return _BOOLS[text]
        if "0" not in text[:2]:  # neither 0... nor a signed 0...: the common case, at once
            return text
        m = _HEX.match(text) or _OCTAL.match(text)
        if m is not None:
            value = int(m.group(2), 16 if m.re is _HEX else 8)
            return WrittenInt(-value if m.group(1) == "-" else value, text)
        if _LEADING_ZERO.match(text):
            self.error(f"invalid number {_show(text)}: a leading 0 makes an integer octal "
                       "(digits 0-7), as protobuf reads it", self.at(token))
        return text

    def read_string(self, token: _Token) -> str:
        """The text of one string literal, escapes applied; problems reported, '' after one."""
        quote = token.text[0]
        if not _TERMINATED[quote].match(token.text):
            self.error(f"unterminated string: missing the closing {quote}", self.at(token))
            return ""
        body = token.text[1:-1]
        if "\\" not in body and body.isascii():  # no escapes: the text itself, at once
            return body
        valid = True
        pieces = []
        done = 0
        for escape in _ESCAPE.finditer(body):
            sequence = escape.group()
            if not _valid_escape(sequence):
                where = self.at(token, 1 + escape.start())
                self.error(f"invalid escape sequence {_show(sequence)} in string", where)
                valid = False
            elif sequence == "\\?":  # C's escape for '?', which CUnescape does not know
                pieces += [body[done : escape.start()], "?"]
                done = escape.end()
        if not valid:
            return ""
        pieces.append(body[done:])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return text_encoding.CUnescape("".join(pieces)).decode("utf-8")
        except ValueError:  # UnicodeDecodeError included
            self.error("string is not valid UTF-8 once its escapes are applied", self.at(token))
            return ""

    def read_block(self, label: str) -> Block:
        opener = self.peek()
        if self.depth >= MAX_DEPTH:
            self.error(f"blocks and lists are nested more than {MAX_DEPTH} deep", self.at(opener))
            self.skip_nested()
            return Block([], self.at(opener))
        self.advance()
        self.depth += 1
        entries = self.read_entries(_CLOSER[opener.text], f"'{label}'", opener)
        self.depth -= 1
        return Block(entries, self.at(opener))

    def read_list(self, label: str) -> ListValue:
        """``[a, b]`` or ``[{...}, {...}]``; a trailing comma is allowed."""
        opener = self.peek()
        items: list[Value] = []
        if self.depth >= MAX_DEPTH:
            self.error(f"blocks and lists are nested more than {MAX_DEPTH} deep", self.at(opener))
            self.skip_nested()
            return ListValue(items, self.at(opener))
        self.advance()
        if self.peek().text == "]":
            self.advance()
            return ListValue(items, self.at(opener))
        self.depth += 1
        close = f"']' to close the list opened at {opener.line}:{opener.column}"
        need_item = True
        while True:
            if need_item:
                if self.read_words(items):
                    break
                if not self.read_list_item(label, items, close):
                    break
            need_item = True
            token = self.peek().text
            if token == ",":
                self.advance()
                if self.peek().text == "]":
                    self.advance()
                    break
            elif token == "]":
                self.advance()
                break
            elif self.list_left_open():
                self.expected(close)
                break
            else:
                self.expected(f"',' or {close}")
                self.skip(_LIST_STOPS, line_end=False)
                need_item = False
        self.depth -= 1
        return ListValue(items, self.at(opener))

    def read_words(self, items: list[Value]) -> bool:
        """The bulk of a long list: numbers or names each followed by ',' or ']', read as
        :meth:`read_scalar` reads them but without the general dispatch per item (a 1 MB list
        reads in well under a second). Stops at anything else, for the general loop; True
        when it read the list's closing ']'."""
        tokens, word = self.tokens, self.word
        i = self.index
        try:
            while _WORD.match(tokens[i].text):
                separator = tokens[i + 1].text
                if separator == ",":
                    items.append(word(tokens[i]))
                    i += 2
                    if tokens[i].text == "]":  # a trailing comma
                        i += 1
                        return True
                elif separator == "]":
                    items.append(word(tokens[i]))
                    i += 2
                    return True
                else:
                    return False
            return False
        finally:
            self.index = i

    def read_list_item(self, label: str, items: list[Value], close: str) -> bool:
        """Append the item at the current token; False where the list ends unclosed."""
        token = self.peek()
        if token.text in _BLOCK_OPENERS:
            items.append(self.read_block(label))
            return True
        if token.text == "[":
            self.error("lists cannot be nested", self.at(token))
            self.skip_nested()
            return True
        value = self.read_scalar()
        if value is not None:
            items.append(value)
            return True
        if self.list_left_open():
            self.expected(close)
            return False
        self.expected("a value in the list")
        self.skip(_LIST_STOPS, line_end=False)
        return True

    def list_left_open(self) -> bool:
        """Whether the current token shows that the ']' of a list was forgotten: the end of the
        file, a block's closer, or a new field on a line of its own."""
        token = self.peek()
        if not token.text or token.text in _BLOCK_CLOSERS:
            return True
        previous = self.tokens[self.index - 1]
        return token.line > previous.line and self.key_starts_here()


def _valid_escape(sequence: str) -> bool:
    """Whether a backslash sequence is one of protobuf's: C escapes, octal up to \\377, \\x with
    one or two hex digits, \\u and \\U naming a Unicode scalar value."""
    kind = sequence[1:2]
    if len(sequence) == 2 and kind in _SIMPLE_ESCAPES:
        return True
    if kind and kind in "01234567":
        return int(sequence[1:], 8) <= 0o377
    if kind == "x" and len(sequence) > 2:
        return True
    if kind in ("u", "U") and len(sequence) in (6, 10):
        code = int(sequence[2:], 16)
        return code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF
    return False
