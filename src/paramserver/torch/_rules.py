"""Per-parameter configuration by name pattern: which ``param { }`` settings a tensor gets.

A *rule* is a glob pattern over the names of ``module.named_parameters()`` (``"*.bias"``,
``"encoder.*"``, ``"fc1.weight"``) and the fields of SPEC §3 it sets: ``lr_scale``,
``wd_scale``, ``init``, ``share_from``. Rules come from Python (a dict of pattern to fields,
or a list of ``ParamConf``) or from a job file (``param { name: "*.bias" lr_scale: 2 }``).

Every rule whose pattern matches a name applies, in the order given; a later rule overrides
only the fields it gives. A pattern that matches no parameter is an error (usually a typo),
with a did-you-mean. This module does not import torch.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ParamError
from ..config.errors import Problem
from ..config.job import JobConf, ParamConf, ParamGenConf
from ..config.tree import Block, Entry

#: The fields a rule may set; ``name`` is the pattern itself.
RULE_FIELDS = ("init", "share_from", "lr_scale", "wd_scale")


@dataclass(frozen=True)
class ParamRule:
    """Fields of ``param { }`` given for every parameter whose name matches ``pattern``."""

    pattern: str
    fields: Mapping[str, Any]
    place: str = ""

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)


@dataclass
class Resolved:
    """Each parameter's configuration, and which parameters a rule gave an ``init``."""

    confs: dict[str, ParamConf]
    places: dict[str, str]
    initialised: set[str] = field(default_factory=set)


RulesLike = Any
"""``None``; a mapping of pattern to fields (a dict or a ``ParamConf``); a sequence of
``ParamConf``, dicts with a ``name`` or :class:`ParamRule`; the text of ``param { }`` blocks
(or of a whole job file); a path to such a file; or a ``JobConf`` (the params of its layers)."""


def parse_rules(x: RulesLike) -> list[ParamRule]:
    """Rules from any of the forms of :data:`RulesLike`, checked; all problems at once."""
    if x is None:
        return []
    if isinstance(x, ParamRule):
        return [x]
    if isinstance(x, os.PathLike):
        path = Path(x)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ParamError(f"{path}: cannot read the file: {e.strerror or e}") from None
        return rules_from_text(text, str(path))
    if isinstance(x, str):
        return rules_from_text(x, "<param_conf>")
    if isinstance(x, JobConf):
        return [_from_conf(p, f"layer '{layer.name}', param {i}")
                for layer in x.neuralnet.layer for i, p in enumerate(layer.param)]
    if isinstance(x, Mapping):
        problems: list[Problem] = []
        rules = []
        for pattern, fields in x.items():
            try:
                rules.append(_from_item(str(pattern), fields, f"param_conf[{pattern!r}]"))
            except ParamError as e:
                problems += e.at(f"param_conf[{pattern!r}]").problems
        if problems:
            raise ParamError(problems)
        return rules
    if isinstance(x, Sequence):
        out: list[ParamRule] = []
        problems = []
        for i, item in enumerate(x):
            place = f"param_conf[{i}]"
            try:
                if isinstance(item, ParamRule):
                    out.append(item)
                elif isinstance(item, ParamConf):
                    out.append(_from_conf(item, place))
                elif isinstance(item, Mapping):
                    item = dict(item)
                    pattern = item.pop("name", None)
                    if not pattern:
                        raise ParamError("a rule needs a 'name' (the pattern)")
                    out.append(_from_item(str(pattern), item, place))
                else:
                    raise ParamError(f"expected a ParamConf or a dict, not {type(item).__name__}")
            except ParamError as e:
                problems += e.at(place).problems
        if problems:
            raise ParamError(problems)
        return out
    raise ParamError(f"param_conf: expected a dict of pattern to fields, a list of ParamConf, "
                     f"the text of param {{ }} blocks or a path, not {type(x).__name__}")


def split_job_text(text: str, filename: str) -> tuple[list[ParamRule], Block]:
    """The ``param { }`` rules of a job file's text, and the rest of it as a block.

    ``param`` blocks are read at the top level (the torch form) and inside
    ``neuralnet { layer { } }`` (SINGA's form, where the layers stay in the rest).
    """
    from ..config.textformat import parse_text

    block = parse_text(text, filename)
    rules: list[ParamRule] = []
    problems: list[Problem] = []
    rest: list[Entry] = []
    for entry in block.entries:
        if entry.key == "param" and not entry.extension:
            _collect_block_rule(entry, rules, problems)
        else:
            rest.append(entry)
            if entry.key == "neuralnet" and isinstance(entry.value, Block):
                for layer in entry.value.entries:
                    if layer.key == "layer" and isinstance(layer.value, Block):
                        for p in layer.value.entries:
                            if p.key == "param":
                                _collect_block_rule(p, rules, problems)
    if problems:
        raise ParamError(problems)
    return rules, Block(rest, block.where)


def rules_from_text(text: str, filename: str = "<param_conf>") -> list[ParamRule]:
    """The rules of ``param { }`` blocks in text (a job file or just the blocks)."""
    return split_job_text(text, filename)[0]


def _collect_block_rule(entry: Entry, rules: list[ParamRule], problems: list[Problem]) -> None:
    where = entry.where
    if not isinstance(entry.value, Block):
        problems.append(Problem("param must be a block { ... }", where))
        return
    try:
        conf = ParamConf._build(entry.value)
    except ParamError as e:
        problems += e.at(where).problems
        return
    if not conf.name:
        problems.append(Problem("a param block needs a name (a parameter name or pattern)",
                                where))
        return
    given = {ParamConf.__keys__.get(e.key, e.key) for e in entry.value.entries}
    fields = {k: getattr(conf, k) for k in RULE_FIELDS if k in given}
    rules.append(ParamRule(conf.name, fields, str(where) if where else "param"))


def _from_item(pattern: str, fields: Any, place: str) -> ParamRule:
    if isinstance(fields, ParamConf):
        return _from_conf(fields, place, pattern)
    if not isinstance(fields, Mapping):
        raise ParamError(f"the fields of a rule are a dict or a ParamConf, "
                         f"not {type(fields).__name__}")
    fields = dict(fields)
    if "name" in fields:
        raise ParamError("'name' is the pattern (the key); do not give it again")
    conf = ParamConf.parse(fields)
    given = {ParamConf.__keys__.get(k, k) for k in fields}
    return ParamRule(pattern, {k: getattr(conf, k) for k in RULE_FIELDS if k in given}, place)


def _from_conf(conf: ParamConf, place: str, pattern: str | None = None) -> ParamRule:
    """A rule from a ParamConf object: the fields that differ from their defaults."""
    pattern = pattern or conf.name
    if not pattern:
        raise ParamError(f"{place}: a ParamConf needs a name (a parameter name or pattern)")
    default = ParamConf()
    fields = {k: getattr(conf, k) for k in RULE_FIELDS if getattr(conf, k) != getattr(default, k)}
    return ParamRule(pattern, fields, place)


def resolve(names: Sequence[str], rules: Iterable[ParamRule]) -> Resolved:
    """Each name's ParamConf after every matching rule, in order; unmatched rules are errors."""
    rules = list(rules)
    merged: dict[str, dict[str, Any]] = {n: {} for n in names}
    places: dict[str, str] = {n: f"parameter '{n}'" for n in names}
    problems: list[str] = []
    for rule in rules:
        hits = [n for n in names if rule.matches(n)]
        if not hits:
            close = difflib.get_close_matches(rule.pattern, list(names), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            at = f"{rule.place}: " if rule.place else ""
            problems.append(f"{at}pattern '{rule.pattern}' matches no parameter{hint} "
                            f"(names are those of named_parameters(), e.g. "
                            f"{', '.join(repr(n) for n in list(names)[:3])})")
        for n in hits:
            merged[n].update(rule.fields)
    if problems:
        raise ParamError(problems)
    confs: dict[str, ParamConf] = {}
    initialised: set[str] = set()
    for n, fields in merged.items():
        conf = ParamConf()
        for k, v in fields.items():
            conf.__dict__[k] = v.copy() if isinstance(v, ParamGenConf) else v
        conf.__dict__["name"] = n
        confs[n] = conf
        if "init" in fields:
            initialised.add(n)
    return Resolved(confs, places, initialised)


__all__ = ["ParamRule", "Resolved", "parse_rules", "resolve", "rules_from_text",
           "split_job_text"]
