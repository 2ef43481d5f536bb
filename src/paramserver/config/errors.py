"""The one exception family of paramserver, and the places its problems point at."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


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
