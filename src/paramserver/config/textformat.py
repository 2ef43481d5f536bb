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

Memory stays within a small multiple of the file's size (docs/jobs.md states the bound): the
text is lexed a chunk at a time (:data:`CHUNK` characters), the reader holds only the tokens
it has still to read, and a list's numbers, names and strings are kept as their places in the
text (four bytes each: :class:`_Words`), each made a :class:`Scalar` when asked for. A file's
problems are counted past :data:`MAX_PROBLEMS`, not kept.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import re
import sys
import warnings
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple, overload

from google.protobuf import text_encoding

from paramserver.config.errors import Error, Location, ParamError, Problem, printable
from paramserver.config.tree import Block, Entry, ListValue, Scalar, Value, WrittenBool

__all__ = ["CHUNK", "MAX_DEPTH", "MAX_PROBLEMS", "MEMORY_FACTOR", "MEMORY_FLOOR", "WrittenInt",
           "parse_text", "paused_gc"]

#: Deepest nesting of blocks and lists read (protobuf's C++ reader stops at 100 as well).
MAX_DEPTH = 100
#: Most problems reported for one file; the rest are counted.
MAX_PROBLEMS = 50
#: Characters lexed at a time (a token longer than this is lexed whole).
CHUNK = 1 << 14
#: The reader's memory: at most ``MEMORY_FACTOR`` times the text's size, beyond
#: ``MEMORY_FLOOR`` bytes (what any real job file fits in, however it is written); a text
#: whose fields, blocks and values would take more is refused. The costs are measured:
#: a field (an object and its place), a block (an object, its list of fields and its place),
#: a value (an object, its place and its text), a list's value (its offset, and the number or
#: string it becomes).
MEMORY_FACTOR = 20
MEMORY_FLOOR = 128 * 2**20
_ENTRY_COST, _BLOCK_COST, _SCALAR_COST, _ITEM_COST = 190, 260, 200, 40
#: Most parts of an extension name ``[a.b.c]`` looked ahead at to tell a field from a value.
_MAX_NAME_PARTS = 64

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
_TERMINATED = {q: re.compile(rf"{q}[^{q}\\\n]*+(?:\\.[^{q}\\\n]*+)*+{q}\Z") for q in _QUOTES}
_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]+)\Z")
_OCTAL = re.compile(r"([+-]?)0([0-7]+)\Z")
_LEADING_ZERO = re.compile(r"[+-]?0[0-9]+\Z")
_BOOLS = {"t": WrittenBool("t"), "f": WrittenBool("f")}
_ESCAPE = re.compile(r"\\(?:[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.?)")
_SIMPLE_ESCAPES = frozenset("abfnrtv\\'\"?")


#: One lexeme of protobuf's Tokenizer: whitespace and comments (skipped), or a token: an
#: identifier, a number, a string in either quote (to the end of its line when unterminated),
#: or any other character alone. Repeats are possessive (``*+``): the regular expression
#: engine keeps no state per character of a long string or run of blank lines.
_LEXEME = re.compile(
    r"([^\S\n]*+)"  # blanks before the lexeme, on its line
    r"(?:([A-Za-z_][0-9A-Za-z_+-]*+"
    r"|(?:[0-9+-]|\.[0-9])[0-9A-Za-z_.+-]*+"
    r"|'[^'\n\\]*+(?:\\.[^'\n\\]*+)*+(?:'|\\?$)"
    r'|"[^"\n\\]*+(?:\\.[^"\n\\]*+)*+(?:"|\\?$)'
    r"|[^\s#])"
    r"|((?:\s++|#[^\n]*+)++)"  # line breaks and comments
    r"|\Z)",
    re.MULTILINE,
)


class _Token(NamedTuple):
    """A token, where it starts (1-based line and column) and its offset in the text. The
    end of file has no text."""

    text: str
    line: int
    column: int
    pos: int

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
        reader = _Reader(_Source(text, filename))
        try:
            entries = reader.read_entries(None, "", None)
        except _TooDense as e:
            raise ParamError(Problem(
                f"the job file holds more fields, blocks and values than its "
                f"{len(text):,} characters can take (at most {MEMORY_FACTOR} times their "
                f"size in memory, beyond {MEMORY_FLOOR // 2**20} MiB): stopped reading here; "
                "is it a job file?", e.where)) from None
    problems = reader.problems
    if problems:
        problems.sort(key=_position)  # in file order (a list's own come after its end)
        if reader.more_problems:  # a broken list can make one problem per value
            rest = reader.more_problems
            problems.append(Problem(f"... and {rest:,} more problems after this place",
                                    reader.first_more))
        raise ParamError(problems)
    return Block(entries, Location(filename, 1, 1))


def _position(problem: Problem) -> tuple[int, int]:
    where = problem.where
    return (where.line, where.column) if isinstance(where, Location) else (0, 0)


def _token_chunks(text: str) -> Iterator[list[_Token]]:
    """The tokens of ``text`` with their places, a chunk of the text at a time, and an
    end-of-file token after the last one.

    Linear in the text: one pass of :data:`_LEXEME` over each chunk; lines are counted in
    the skipped whitespace only (no token holds a line break). A chunk ends before the last
    lexeme that reaches its end (a token or a comment the cut may have shortened), which the
    next chunk reads whole.
    """
    n = len(text)
    line, line_start, pos = 1, 0, 0
    last: _Token | None = None
    size = CHUNK
    while pos < n:
        end = min(pos + size, n)
        pieces = _LEXEME.split(text[pos:end])  # per lexeme: '', its blanks, token, skipped
        texts: list[str] = []
        lines: list[int] = []
        columns: list[int] = []
        starts: list[int] = []
        p, row, row_start = pos, line, line_start
        for blanks, token, skip in zip(pieces[1::4], pieces[2::4], pieces[3::4]):
            stop = p + len(blanks) + len(token if token is not None else skip or "")
            if stop >= end and end < n:
                break  # may go on past the cut: read whole with the next chunk
            p += len(blanks)
            if token is not None:
                texts.append(token)
                lines.append(row)
                columns.append(p - row_start + 1)
                starts.append(p)
                p += len(token)
            elif skip is not None:
                if "\n" in skip:
                    row += skip.count("\n")
                    row_start = p + skip.rindex("\n") + 1
                p += len(skip)
        if p == pos and end < n:  # one lexeme longer than the chunk: read a larger one
            size *= 2
            continue
        pos, line, line_start, size = p, row, row_start, CHUNK
        if texts:
            # tuple.__new__ through map: the tokens are made without a Python call each.
            chunk = list(map(partial(tuple.__new__, _Token), zip(texts, lines, columns, starts)))
            last = chunk[-1]
            yield chunk
    yield [_Token("", last.line, last.end, last.pos + len(last.text)) if last
           else _Token("", 1, 1, 0)]


class _Source:
    """A file's text and name, and where its lines start (found when a place is first
    asked for): places of values kept as offsets (:class:`_Words`) are made from them."""

    __slots__ = ("_starts", "filename", "text")

    def __init__(self, text: str, filename: str):
        self.text, self.filename = text, filename
        self._starts: array[int] | None = None

    def line_starts(self) -> array[int]:
        """The offset of every line's first character, in order."""
        if self._starts is None:
            self._starts = array("q", [0])
            self._starts.extend(m.end() for m in re.finditer("\n", self.text))
        return self._starts

    def location(self, pos: int) -> Location:
        starts = self.line_starts()
        line = bisect.bisect_right(starts, pos)
        return Location(self.filename, line, pos - starts[line - 1] + 1)


#: A list item kept as an offset: a word, or one string literal.
_ITEM = re.compile(r"'[^'\n\\]*+(?:\\.[^'\n\\]*+)*+'"
                   r'|"[^"\n\\]*+(?:\\.[^"\n\\]*+)*+"'
                   r"|[0-9A-Za-z_.+-]++")


class _Lazy(Sequence[Value]):
    """A sequence whose items are made when asked for: ``_get(i)`` for ``0 <= i < len``."""

    __slots__ = ()

    def _get(self, i: int) -> Value:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> Value: ...

    @overload
    def __getitem__(self, i: slice) -> list[Value]: ...

    def __getitem__(self, i: int | slice) -> Value | list[Value]:
        n = len(self)
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(n))]
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            return [][j]  # the IndexError of a list
        return self._get(j)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


class _Words(_Lazy):
    """The items of a list of numbers, names and one-literal strings, kept as their offsets
    in the text (4 bytes each; a job file is at most a few MB), made :class:`Scalar` s with
    their places when asked for: what the reader makes of each item's text, without
    reporting its problems again (they were reported as it was read)."""

    __slots__ = ("offsets", "source")

    def __init__(self, source: _Source, offsets: array[int]):
        self.source, self.offsets = source, offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def _get(self, i: int) -> Scalar:
        return self._item(self.offsets[i])

    def __iter__(self) -> Iterator[Scalar]:
        # What _item makes, in one loop (a long list is read through here): the line found
        # by walking on (the offsets increase), values made without a Python call each.
        text, name, match = self.source.text, self.source.filename, _ITEM.match
        starts = self.source.line_starts()
        line, lines = 0, len(starts)
        new, location = object.__new__, tuple.__new__
        for pos in self.offsets:
            while line + 1 < lines and starts[line + 1] <= pos:
                line += 1
            if line and starts[line] > pos:  # not in order (never made so): look it up
                line = bisect.bisect_right(starts, pos) - 1
            m = match(text, pos)
            assert m is not None
            token = m.group()
            item = new(Scalar)
            item.where = location(Location, (name, line + 1, pos - starts[line] + 1))
            if token[0] in _QUOTES:
                item.raw, item.quoted = _unescape(token) or "", True
            else:
                value = token
                if token in _BOOLS or "0" in token[:2]:
                    value = _typed(token)  # type: ignore[assignment]
                item.raw, item.quoted = value, False
            yield item

    def __repr__(self) -> str:
        return f"_Words({len(self)} items)"

    def _item(self, pos: int) -> Scalar:
        m = _ITEM.match(self.source.text, pos)
        assert m is not None  # the reader kept only offsets of such tokens
        text = m.group()
        where = self.source.location(pos)
        if text[0] in _QUOTES:
            return Scalar(_unescape(text) or "", where, quoted=True)
        return Scalar(_typed(text), where)


class _ListItems:
    """A list's items as the reader finds them: runs of values kept as offsets
    (:class:`_Words`) between runs of values made whole, in order."""

    def __init__(self, source: _Source):
        self.source = source
        self.parts: list[Sequence[Value]] = []
        self.offsets: array[int] = self._array()
        self.made: list[Value] = []

    def _array(self) -> array[int]:
        return array("I" if len(self.source.text) < 2**32 else "q")

    def words(self) -> array[int]:
        """Where to add offsets (a run of values made whole ends here)."""
        if self.made:
            self.parts.append(self.made)
            self.made = []
        return self.offsets

    def values(self) -> list[Value]:
        """Where to add values made whole (a run of offsets ends here)."""
        if self.offsets:
            self.parts.append(_Words(self.source, self.offsets))
            self.offsets = self._array()
        return self.made

    def done(self) -> Sequence[Value]:
        self.words()
        self.values()
        if len(self.parts) == 1:
            return self.parts[0]
        return _Chain(self.parts) if self.parts else []


class _Chain(_Lazy):
    """Sequences one after another, as one."""

    __slots__ = ("_ends", "parts")

    def __init__(self, parts: list[Sequence[Value]]):
        self.parts = parts
        self._ends = list(itertools.accumulate(len(p) for p in parts))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _get(self, i: int) -> Value:
        part = bisect.bisect_right(self._ends, i)
        return self.parts[part][i - (self._ends[part - 1] if part else 0)]

    def __iter__(self) -> Iterator[Value]:
        return itertools.chain.from_iterable(self.parts)


def _typed(text: str) -> object:
    """A bare token's value where protobuf reads it otherwise than the declarations' text
    parsing: hex and octal integers, ``t`` and ``f``; else its text."""
    if text in _BOOLS:
        return _BOOLS[text]
    if "0" not in text[:2]:  # neither 0... nor a signed 0...: the common case, at once
        return text
    m = _HEX.match(text) or _OCTAL.match(text)
    if m is not None:
        value = int(m.group(2), 16 if m.re is _HEX else 8)
        return WrittenInt(-value if m.group(1) == "-" else value, text)
    return text


def _unescape(literal: str) -> str | None:
    """The text of one terminated string literal, escapes applied; None where an escape is
    not one of protobuf's or the result is not UTF-8 (see :meth:`_Reader.read_string`)."""
    body = literal[1:-1]
    if "\\" not in body:
        return body
    pieces = []
    done = 0
    for escape in _ESCAPE.finditer(body):
        sequence = escape.group()
        if not _valid_escape(sequence):
            return None
        if sequence == "\\?":  # C's escape for '?', which CUnescape does not know
            pieces += [body[done : escape.start()], "?"]
            done = escape.end()
    pieces.append(body[done:])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return text_encoding.CUnescape("".join(pieces)).decode("utf-8")
    except ValueError:  # UnicodeDecodeError included
        return None


def _show(text: str) -> str:
    """A token as messages quote it."""
    if not text:
        return "end of file"
    if len(text) > 30:
        text = text[:27] + "..."
    return f"'{printable(text)}'"


class _TooDense(Error):
    """The text holds more than its size allows (:data:`MEMORY_FACTOR`)."""

    def __init__(self, where: Location):
        super().__init__()
        self.where = where


class _Reader:
    """Recursive descent over the tokens, collecting problems and going on after each.

    The tokens come a chunk at a time (:func:`_token_chunks`); ``tokens`` holds those from
    the one before the current token (``index``, counted from the start of the file) on:
    ``base`` is the number of the first one held.
    """

    def __init__(self, source: _Source):
        self.source = source
        self.filename = source.filename
        self.chunks = _token_chunks(source.text)
        self.tokens: list[_Token] = next(self.chunks)
        self.base = 0
        self.index = 0
        self.depth = 0
        self.problems: list[Problem] = []
        self.more_problems = 0  # problems after the first MAX_PROBLEMS in file order
        self.first_more: Location | None = None
        # What the tree may still take (see MEMORY_FACTOR; the text itself, and the bytes it
        # was read from, take two times its size of it), less what each node costs.
        self.budget = (MEMORY_FACTOR - 2) * len(source.text) + MEMORY_FLOOR

    def spend(self, cost: int, token: _Token) -> None:
        """Take ``cost`` bytes of the budget for a node made at ``token``."""
        self.budget -= cost
        if self.budget < 0:
            raise _TooDense(self.at(token))

    # -- tokens and problems -------------------------------------------------------------

    def load(self) -> bool:
        """Take the next chunk of tokens, dropping those before the previous token; False
        at the end of the file."""
        chunk = next(self.chunks, None)
        if chunk is None:
            return False
        drop = max(self.index - 1 - self.base, 0)
        self.tokens = self.tokens[drop:] + chunk
        self.base += drop
        return True

    def token(self, number: int) -> _Token:
        """Token ``number`` of the file (the end-of-file token past the end)."""
        i = number - self.base
        while i >= len(self.tokens):
            if not self.load():
                return self.tokens[-1]
            i = number - self.base
        return self.tokens[i]

    def peek(self, ahead: int = 0) -> _Token:
        return self.token(self.index + ahead)

    def advance(self) -> _Token:
        token = self.peek()
        if token.text:
            self.index += 1
        return token

    def at(self, token: _Token, offset: int = 0) -> Location:
        # tuple.__new__: one per value of the file, without the named tuple's Python call
        return tuple.__new__(Location, (self.filename, token.line, token.column + offset))

    def error(self, message: str, where: Location) -> None:
        """Keep a problem: the first :data:`MAX_PROBLEMS` in file order, the rest counted."""
        problems = self.problems
        if len(problems) < MAX_PROBLEMS:
            problems.append(Problem(message, where))
            return
        if (where.line, where.column) < _position(problems[-1]):  # rare: out of file order
            problems.sort(key=_position)
            if (where.line, where.column) < _position(problems[-1]):  # keep it instead
                dropped = problems.pop()
                problems.append(Problem(message, where))
                problems.sort(key=_position)
                where = dropped.where  # type: ignore[assignment]
        self.more_problems += 1
        if self.first_more is None or (where.line, where.column) < (
                self.first_more.line, self.first_more.column):
            self.first_more = where

    def expected(self, what: str, continues: bool = True) -> None:
        """Report ``expected WHAT, found TOKEN``: at the token, or, when WHAT ``continues`` the
        text before it and the token is on a later line, just after the previous token, where
        the missing text belongs."""
        token = self.peek()
        previous = self.token(self.index - 1) if self.index else None
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
        while _NAME.match(self.peek(ahead).text) and ahead < 2 * _MAX_NAME_PARTS:
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
            key = sys.intern(self.advance().text)  # one string for every field of a name
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
        self.spend(_ENTRY_COST, start)
        return Entry(key, value, self.at(start), extension=extension)

    def read_extension_name(self) -> str | None:
        """``[name.with.dots]``; the bracket is the current token."""
        self.advance()
        parts: list[str] = []
        while True:
            if len(parts) > 2 * _MAX_NAME_PARTS:
                self.error(f"an extension name has more than {_MAX_NAME_PARTS} parts",
                           self.at(self.peek()))
                self.skip(_ENTRY_STOPS)
                return None
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
            self.spend(_SCALAR_COST, token)
            return Scalar("".join(parts), self.at(token), quoted=True)
        if _WORD.match(token.text) and not self.key_starts_here():
            return self.word(self.advance())
        return None

    def word(self, token: _Token) -> Scalar:
        """The value of a number or name token (read past already)."""
        self.spend(_SCALAR_COST, token)
        return Scalar(self.typed(token), self.at(token))

    def typed(self, token: _Token) -> object:
        """A bare token's value where protobuf reads it otherwise than the declarations'
        text parsing: hex and octal integers, ``t`` and ``f``; else its text."""
        text = token.text
        value = _typed(text)
        if value is text and "0" in text[:2] and _LEADING_ZERO.match(text):
            self.error(f"invalid number {_show(text)}: a leading 0 makes an integer octal "
                       "(digits 0-7), as protobuf reads it", self.at(token))
        return value

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
        for escape in _ESCAPE.finditer(token.text, 1, len(token.text) - 1):
            if not _valid_escape(escape.group()):
                self.error(f"invalid escape sequence {_show(escape.group())} in string",
                           self.at(token, escape.start()))
                valid = False
        if not valid:
            return ""
        text = _unescape(token.text)
        if text is None:
            self.error("string is not valid UTF-8 once its escapes are applied", self.at(token))
            return ""
        return text

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
        self.spend(_BLOCK_COST, opener)
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
        parts = _ListItems(self.source)
        while True:
            if need_item:
                if self.read_words(parts.words()):
                    break
                if not self.read_list_item(label, parts.values(), close):
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
        self.spend(_BLOCK_COST, opener)
        return ListValue(parts.done(), self.at(opener))

    def read_words(self, offsets: array[int]) -> bool:
        """The bulk of a long list: numbers, names or one-literal strings each followed by
        ',' or ']', read as :meth:`read_scalar` reads them (their problems reported) but
        without the general dispatch per item, and kept as their offsets (:class:`_Words`).
        Stops at anything else, for the general loop; True when it read the list's closing
        ']'."""
        keep = offsets.append
        while True:
            tokens, base = self.tokens, self.base
            i, last = self.index - base, len(tokens) - 3  # tokens[i], [i + 1], [i + 2] held
            while i <= last:
                token = tokens[i]
                text, separator = token.text, tokens[i + 1].text
                if separator != "," and separator != "]":
                    break
                if _WORD.match(text):
                    if "0" in text[:2]:
                        self.typed(token)  # reports a leading 0 that is not octal
                elif text[:1] in _QUOTES and _TERMINATED[text[0]].match(text):
                    self.read_string(token)  # reports its bad escapes
                else:
                    break
                keep(token.pos)
                self.budget -= _ITEM_COST
                i += 2
                if separator == "]":
                    self.index = base + i
                    return True
                if tokens[i].text == "]":  # a trailing comma
                    self.index = base + i + 1
                    return True
            self.index = base + i
            if self.budget < 0:
                raise _TooDense(self.at(tokens[i]))
            if i <= last or not self.load():
                return False  # something else, or the last tokens: the general loop

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
        previous = self.token(self.index - 1)
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
