"""The one exception family of paramserver, and the places its problems point at."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

#: Most problems one error keeps (a file with a million bad fields would make a million
#: messages, some of them dmlc's whole list of arguments); the rest are counted.
MAX_KEPT = 50


def printable(text: str, keep: str = "") -> str:
    """``text`` (a path, a value, a message) with every character that does not print
    escaped as Python writes it (``\\x1b``, ``\\x00``, ``\\u202e``, ``\\udcff`` for a byte of
    a file name that is not UTF-8), but those of ``keep`` (a message's ``"\\n"``): a
    terminal's escape sequence or a character that reorders a line, in a file name, is shown,
    not obeyed. Other characters (``é``, ``日本``) are kept as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else
                   c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


class Location(NamedTuple):
    """A place in a text file: 1-based line and column, as editors count them.

    (A named tuple: the reader makes one per value, and a job file may hold a list of a
    million values; a tuple is made several times faster than a frozen dataclass.)
    """

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration.

    ``where`` is a :class:`Location` in a file, a dotted key path (``"updater.learning_rate"``)
    for configurations given as Python mappings, or ``None`` at the top level.
    """

    message: str
    where: Location | str | None = None

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


@dataclass(frozen=True)
class MoreProblems(Problem):
    """The problems left out of an error, counted: ``... and N more problems``."""

    count: int = 0


def more_problems(count: int, where: Location | str | None) -> MoreProblems:
    return MoreProblems(f"... and {count:,} more problems after this place", where, count)


class Problems:
    """Problems gathered in order: the first :data:`MAX_KEPT` kept, the others counted (a
    :class:`MoreProblems` among those added counts as many), so that gathering them takes
    memory in proportion to what is reported, not to what is wrong."""

    def __init__(self) -> None:
        self.kept: list[Problem] = []
        self.more = 0
        self.first_more: Location | str | None = None

    def __len__(self) -> int:
        return len(self.kept) + self.more

    def __bool__(self) -> bool:
        return bool(self.kept) or self.more > 0

    @property
    def full(self) -> bool:
        """Whether a problem added now would only be counted."""
        return len(self.kept) >= MAX_KEPT

    def add(self, problem: Problem | str | Callable[[], Problem],
            where: Location | str | None = None) -> None:
        """Add a problem (a callable making it, called only if it is kept; ``where`` is its
        place for the count)."""
        if isinstance(problem, MoreProblems):
            self._count(problem.count, problem.where)
        elif self.full:
            self._count(1, problem.where if isinstance(problem, Problem) else where)
        else:
            made = problem() if callable(problem) else problem
            self.kept.append(made if isinstance(made, Problem) else Problem(made, where))

    def extend(self, problems: Iterable[Problem | str]) -> None:
        for p in problems:
            self.add(p)

    def _count(self, n: int, where: Location | str | None) -> None:
        if self.more == 0:
            self.first_more = where
        self.more += n

    def result(self) -> list[Problem]:
        """The problems kept, and one that counts the others."""
        if not self.more:
            return list(self.kept)
        return [*self.kept, more_problems(self.more, self.first_more)]


class Error(Exception):
    """The base of every error paramserver raises: ``except paramserver.Error`` catches them.

    Its kinds: :class:`ParamError` (a configuration or an argument is wrong; also a
    ``ValueError``), ``paramserver.ClusterError`` (training on the cluster failed; also a
    ``RuntimeError``) and ``paramserver.checkpoint.CheckpointError`` (a checkpoint cannot be
    read or does not fit; a ``ParamError``).
    """


class ParamError(Error, ValueError):
    """Every configuration problem paramserver reports; carries all problems found at once.

    ``str(error)`` is the problems, one after another, each starting on a new line with
    its place when it has one.
    """

    def __init__(self, problems: Iterable[Problem | str] | str | Problem):
        if isinstance(problems, (str, Problem)):
            problems = [problems]
        self.problems: list[Problem] = [
            p if isinstance(p, Problem) else Problem(p) for p in problems
        ]
        super().__init__("\n".join(str(p) for p in self.problems))

    def at(self, where: Location | str | None) -> ParamError:
        """The same problems, placed at ``where`` when they have no place of their own."""
        return ParamError(
            Problem(p.message, p.where if p.where is not None else where) for p in self.problems
        )
