"""A job file read for ``paramserver check`` and ``train``: every problem at once, at its place.

Building the net (layers, shapes, data) is a second stage after the configuration is read;
its problems name a layer (``layer 'fc2' (kInnerProduct): ...``). Here they are placed at that
layer's ``layer`` block in the file, and when the rest of the file has problems but the
``neuralnet`` block is whole, the net is built anyway so that its problems are reported in
the same run, not one fix later.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..config import Location, ParamError, Problem
from ..config.job import JobConf, NetConf, read_job_text, unbuilt_error
from ..config.textformat import parse_text, paused_gc
from ..config.tree import Block, Entry, ListValue, Scalar, Value
from ..init import init_params
from ..params import ParamSet, plan_params
from ..shipped import shipped_folder
from ..singa import checkpoints as singa_checkpoints
from .net import Net

#: Most memory ``check`` spends on making and initialising a model's Params.
CHECK_MEMORY = 256 * 1024 * 1024

_LAYER = re.compile(r"layer '([^']*)'")
_PARAM = re.compile(r"(?:.*?)\bParam '([^']*)'")
_QUOTED = re.compile(r"'([^']*)'")


@dataclass
class JobFile:
    """A job read from a file, with its text's tree (where every value was written)."""

    job: JobConf
    tree: Block
    path: Path

    @property
    def base_dir(self) -> Path:
        """The folder relative data paths start from: the job file's."""
        return self.path.parent

    def build_net(self, read_data: bool = True) -> Net:
        """The job's net (the kTrain net, and the kTest and kVal nets when the job tests or
        validates), its problems placed at their layers. What the job needs and paramserver
        does not build yet (layer types, algorithms) is refused first, all of it at once.
        Without ``read_data`` the net is built to be checked: its data is not read (see
        :class:`~paramserver.train.net.Net`)."""
        unbuilt = self.job.unbuilt()
        if unbuilt:
            raise unbuilt_error(unbuilt)
        with self.placing():
            net = Net(self.job.neuralnet, seed=self.job.seed, base_dir=self.base_dir,
                      phases=("kTrain", *self.job.eval_phases()), read_data=read_data)
            if self.job.train_steps > self.job.step:
                net.check_trainable(self.job.train_one_batch.alg)
            return net

    def check_params(self, net: Net) -> set[str]:
        """Make the net's Params and check their initialisation as training would (an init
        method that does not fit its Param, a kFromFile file that lacks a tensor; the random
        fills check their arguments and draw nothing: no numba), and read the SINGA
        checkpoints of ``checkpoint_path`` (a file that is missing or not one, a Param whose
        size differs), problems placed. Returns the names of the Params those checkpoints
        give values (their ``init`` is not used).

        A model whose buffers exceed :data:`CHECK_MEMORY` is not made (``check`` allocates
        nothing large): its names, sharing and sizes are checked without memory.
        """
        with self.placing():
            plan = plan_params(net.param_specs())
            if plan.nbytes(net.dtype) <= CHECK_MEMORY:
                init_params(ParamSet(plan, net.dtype), self.job.seed, check_only=True)
        try:
            return set(singa_checkpoints.saved_params(
                self.job.checkpoint_path, {s.name: s.shape for s in plan.owners}))
        except ParamError as e:
            where = next((x.where for x in self.tree.entries if x.key == "checkpoint_path"),
                         None)
            raise e.at(where) from None

    def check_outputs(self, allow_outside: bool = False) -> None:
        """Check where the job's output layers would write, as a run does
        (:func:`~paramserver.train.workspace.place_outputs`; the workspace is not made),
        problems placed; afterwards their paths are the files."""
        from .workspace import job_inputs, place_outputs

        with self.placing():
            place_outputs(self.job, self.job.workspace_dir, allow_outside=allow_outside,
                          inputs=[("the job file", self.path),
                                  *job_inputs(self.job, self.base_dir)])

    @contextmanager
    def placing(self) -> Iterator[None]:
        """Re-raise a ParamError of the block with its net problems placed in the file."""
        try:
            yield
        except ParamError as e:
            raise place_net_problems(e, self.tree) from None


def examples_folder() -> Path | None:
    """paramserver's example job files and their documents: shipped in the wheel as
    ``paramserver/examples`` (setup.py copies them), or the checkout's ``examples/``."""
    return shipped_folder("examples", "digits_mlp.conf")


def example_names(folder: Path) -> list[str]:
    """The short names of the example jobs: ``digits_mlp``, ``singa/mnist/conv``, and a
    folder's ``job.conf`` by the folder (``rnnlm``)."""
    names = []
    for path in sorted(folder.rglob("*.conf")):
        rel = path.relative_to(folder).with_suffix("").as_posix()
        names.append(rel[:-len("/job")] if rel.endswith("/job") else rel)
    return names


def find_example(name: str | os.PathLike[str]) -> Path | None:
    """The example job file that ``name`` names, for a job file that does not exist: its
    short name (``digits_mlp``, ``singa/mnist/conv``, ``rnnlm``), or its path in the
    repository (``examples/digits_mlp.conf``, as the README writes it); None if none.

    Raises:
        ParamError: a short name (no ``.conf``) of no example, naming the examples.
    """
    folder = examples_folder()
    text = Path(name).as_posix()
    if folder is not None and not Path(name).is_absolute():
        rel = text[len("examples/"):] if text.startswith("examples/") else text
        for candidate in (rel, f"{rel}.conf", f"{rel}/job.conf"):
            path = folder / candidate
            if rel and ".." not in Path(rel).parts and path.suffix == ".conf" and \
                    os.path.isfile(path):  # (False for a name too long to look up)
                return path
    if Path(name).suffix == ".conf" or Path(name).is_absolute():
        return None  # a file's path: reading it says what is wrong
    known = ", ".join(example_names(folder)) if folder is not None else "none installed"
    raise ParamError(f"{name}: no such job file, nor an example of that name (the examples: "
                     f"{known})")


def read_job_file(path: str | os.PathLike[str], settings: Sequence[str] = ()) -> JobFile:
    """Read and check a job file's configuration, changed by ``settings`` (``--set``).

    Each setting changes the file's text as read (:func:`apply_setting`), so that the job is
    then checked as a whole, as if the file said it: a setting's mistake is found here,
    before anything runs, and named by the setting (``--set updater.type=kAdam: ...``).

    Raises:
        ParamError: every problem of the file and the settings; with the configuration's
            problems, those of the net when the ``neuralnet`` block itself reads without one.
    """
    path = Path(path)
    text = read_job_text(path)
    tree = parse_text(text, str(path))  # the grammar: nothing more to check without it
    problems: list[Problem] = []
    for setting in settings:
        try:
            apply_setting(tree, setting)
        except ParamError as e:
            problems += e.problems
    if problems:
        raise ParamError(problems)
    try:
        with paused_gc():
            job = JobConf._build(tree)
    except ParamError as e:
        problems = [*e.problems, *_net_problems(tree, path.parent)]
        problems.sort(key=_order)
        raise ParamError(problems) from None
    return JobFile(job, tree, path)


_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]+)\])?")
#: How the place of a value given by ``--set`` starts (the rest is the setting itself).
SETTING = "--set "


def setting_parts(path: str) -> list[tuple[str, str | None]] | None:
    """``neuralnet.layer[conv1.a].store_conf`` as ``[(name, pick)]``; None if malformed. A
    pick in brackets may hold dots (a layer named ``conv1.a``)."""
    parts: list[tuple[str, str | None]] = []
    pos = 0
    while True:
        m = _PART.match(path, pos)
        if m is None:
            return None
        parts.append((m.group(1), m.group(2)))
        pos = m.end()
        if pos == len(path):
            return parts
        if path[pos] != ".":
            return None
        pos += 1


def apply_setting(tree: Block, setting: str) -> None:
    """Change a job file's text as read (its tree) by one ``--set PATH=VALUE``.

    ``PATH`` is the field's place, its parts joined by dots; a repeated block is picked by
    its index or, for ``layer`` and ``param``, by name (every layer of that name, in every
    phase): ``train_steps=20``, ``updater.momentum=0.5``,
    ``neuralnet.layer[data].store_conf.batchsize=8``, ``cluster.nworkers_per_group=2``. A
    block the file does not write is added (``cluster.nworkers_per_group=2`` in a file with
    no ``cluster { }``). ``VALUE`` is what the file would write after ``KEY:`` — a number, a
    name, a quoted or bare string, a list ``[a, b]``, a block ``{ ... }``. The field's entries
    are replaced by the value, placed at the setting, so that the job's checks (run on the
    whole tree afterwards) name the setting in their messages. Nothing changes on an error.

    Raises:
        ParamError: naming the setting: a malformed one, or a place in the file that is not
            a block or has no block of that name (with the names there are).
    """
    where = SETTING + setting
    path, sep, text = setting.partition("=")
    parts = setting_parts(path.strip()) if sep else None
    if not parts:
        raise ParamError(f"{where}: expected PATH=VALUE, e.g. "
                         "neuralnet.layer[data].store_conf.batchsize=8" if not sep else
                         f"{where}: '{path.strip()}' is not a place: field names (or "
                         "name[index], name[name]) joined by dots")
    blocks = [tree]
    added: list[tuple[Block, Entry]] = []  # blocks the setting adds, once it holds
    for depth, (name, pick) in enumerate(parts[:-1]):
        here = ".".join(n + (f"[{p}]" if p else "") for n, p in parts[:depth]) or "the job"
        found: list[Block] = []
        for block in blocks:
            entries = [e for e in block.entries if e.key == name and not e.extension]
            values: list[object] = []
            for e in entries:
                values += e.value.items if isinstance(e.value, ListValue) else [e.value]
            if any(not isinstance(v, Block) for v in values):
                raise ParamError(f"{where}: '{name}' in {here} is a value, not a block")
            subs = [v for v in values if isinstance(v, Block)]
            if pick is None:
                if len(subs) > 1:
                    raise ParamError(f"{where}: {here} has {len(subs)} '{name}' blocks: pick "
                                     f"one with {name}[index] or {name}[name]")
                if not subs:  # not written: the setting writes it
                    sub = Block([], where)
                    added.append((block, Entry(name, sub, where)))
                    subs = [sub]
                found += subs
                continue
            chosen = ([subs[int(pick)]] if pick.isdigit() and int(pick) < len(subs)
                      else [b for b in subs if _name(b) == pick])
            if not chosen:
                names = [_name(b) or str(i) for i, b in enumerate(subs)]
                raise ParamError(f"{where}: no {name} '{pick}' in {here}; there are: "
                                 + (", ".join(names) if names else "none"))
            found += chosen
        blocks = found
    key = parts[-1][0]
    if parts[-1][1] is not None:
        raise ParamError(f"{where}: the last part names the field to set: '{key}', without "
                         "[...]")
    value = _setting_value(key, text.strip(), where)
    for block, entry in added:
        block.entries.append(entry)
    for block in blocks:
        block.entries[:] = [e for e in block.entries if e.key != key or e.extension]
        block.entries.append(Entry(key, copy.deepcopy(value), where))


def _setting_value(key: str, text: str, where: str) -> Value:
    """The value of a setting as a job file reads it after ``KEY:``, placed at the setting;
    text that does not read so (``my job``, with a space) is a string."""
    try:
        entries = parse_text(f"{key}: {text}", "--set").entries
    except ParamError:
        entries = []
    value: Value = (entries[0].value if len(entries) == 1 and entries[0].key == key
                    else Scalar(text, where, quoted=True))
    _place(value, where)
    return value


def _place(value: Value, where: str) -> None:
    """Place ``value`` and everything in it at ``where``."""
    value.where = where
    if isinstance(value, ListValue):
        for item in value.items:
            _place(item, where)
    elif isinstance(value, Block):
        for e in value.entries:
            e.where = where
            _place(e.value, where)


def _settings_in(value: object) -> list[str]:
    """The settings that changed something inside a block (in order, each once)."""
    found: list[str] = []

    def walk(v: object) -> None:
        if isinstance(v, Block):
            for e in v.entries:
                if isinstance(e.where, str) and e.where.startswith(SETTING):
                    found.append(e.where)
                walk(e.value)
        elif isinstance(v, ListValue):
            for item in v.items:
                walk(item)

    walk(value)
    return list(dict.fromkeys(found))


def place_net_problems(error: ParamError, tree: Block) -> ParamError:
    """The problems of ``error``, those that name a layer (at the start) or a Param and have
    no place of their own placed at that layer's or Param's block in ``tree``; a problem of
    a layer or Param that a ``--set`` changed names the setting too."""
    layers, params = _places(tree)
    placed = []
    for p in error.problems:
        layer, param = _LAYER.match(p.message), _PARAM.match(p.message)
        found = (layers.get(layer.group(1)) if layer else None) or (
            params.get(param.group(1)) if param else None)
        if p.where is None and found is not None:
            # The settings that changed a layer or Param the problem names (the layer it is
            # about, or a source it names: 'fc2' gives 7 scores).
            named = [layers.get(n) or params.get(n) for n in _QUOTED.findall(p.message)]
            settings = list(dict.fromkeys(s for x in named if x for s in x[1]))
            p = Problem(p.message + (f" (after {', '.join(settings)})" if settings else ""),
                        found[0])
        placed.append(p)
    return ParamError(placed)


def _net_problems(tree: Block, base_dir: Path) -> list[Problem]:
    """The net's problems, if the ``neuralnet`` block reads whole on its own."""
    blocks = [e.value for e in tree.entries if e.key == "neuralnet"]
    if len(blocks) != 1 or not isinstance(blocks[0], Block):
        return []
    try:
        netconf = NetConf._build(blocks[0])
    except ParamError:
        return []  # already among the configuration's problems
    if netconf.unbuilt():
        return []  # reported whole once the file reads
    try:
        Net(netconf, seed=0, base_dir=base_dir, phases=("kTrain",), read_data=False)
    except ParamError as e:
        return place_net_problems(e, tree).problems
    return []


Places = dict[str, tuple[Location | str | None, list[str]]]


def _places(tree: Block) -> tuple[Places, Places]:
    """Where each layer's block and each named Param's block start, by name (the first),
    with the settings that changed something in it."""
    layers: Places = {}
    params: Places = {}
    for net in (e.value for e in tree.entries if e.key == "neuralnet"):
        for layer in _blocks(net, "layer"):
            name = _name(layer.value)
            if name is not None:
                layers.setdefault(name, (layer.where, _settings_in(layer.value)))
            for param in _blocks(layer.value, "param"):
                name = _name(param.value)
                if name is not None:
                    params.setdefault(name, (param.where, _settings_in(param.value)))
    return layers, params


def _blocks(block: object, key: str) -> list[Entry]:
    if not isinstance(block, Block):
        return []
    return [e for e in block.entries if e.key == key and isinstance(e.value, Block)]


def _name(block: object) -> str | None:
    for e in block.entries if isinstance(block, Block) else []:
        if e.key == "name" and isinstance(e.value, Scalar):
            return str(e.value.raw)
    return None


def _order(problem: Problem) -> tuple[int, int, int]:
    where = problem.where
    if isinstance(where, Location):
        return (0, where.line, where.column)
    return (1, 0, 0)


__all__ = ["JobFile", "apply_setting", "example_names", "examples_folder", "find_example",
           "place_net_problems", "read_job_file"]
