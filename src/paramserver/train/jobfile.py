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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Location, ParamError, Parameter, Problem
from ..config.job import JobConf, NetConf, read_job_text, unbuilt_error
from ..config.textformat import parse_text, paused_gc
from ..config.tree import Block, Entry, Scalar
from ..init import init_params
from ..params import ParamSet, plan_params
from .net import Net

#: Most memory ``check`` spends on making and initialising a model's Params.
CHECK_MEMORY = 256 * 1024 * 1024

_LAYER = re.compile(r"layer '([^']*)'")
_PARAM = re.compile(r"(?:.*?)\bParam '([^']*)'")


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

    def check_params(self, net: Net) -> None:
        """Make the net's Params and check their initialisation as training would (an init
        method that does not fit its Param, a kFromFile file that lacks a tensor), problems
        placed; the random fills check their arguments and draw nothing (no numba).

        A model whose buffers exceed :data:`CHECK_MEMORY` is not made (``check`` allocates
        nothing large): its names, sharing and sizes are checked without memory.
        """
        with self.placing():
            plan = plan_params(net.param_specs())
            if plan.nbytes(net.dtype) <= CHECK_MEMORY:
                init_params(ParamSet(plan, net.dtype), self.job.seed, check_only=True)

    @contextmanager
    def placing(self) -> Iterator[None]:
        """Re-raise a ParamError of the block with its net problems placed in the file."""
        try:
            yield
        except ParamError as e:
            raise place_net_problems(e, self.tree) from None


def read_job_file(path: str | os.PathLike[str]) -> JobFile:
    """Read and check a job file's configuration.

    Raises:
        ParamError: every problem of the file; with the configuration's problems, those of
            the net when the ``neuralnet`` block itself reads without one.
    """
    path = Path(path)
    text = read_job_text(path)
    tree = parse_text(text, str(path))  # the grammar: nothing more to check without it
    try:
        with paused_gc():
            job = JobConf._build(tree)
    except ParamError as e:
        problems: list[Problem] = [*e.problems, *_net_problems(tree, path.parent)]
        problems.sort(key=_order)
        raise ParamError(problems) from None
    return JobFile(job, tree, path)


_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\]]+)\])?$")


def apply_setting(job: JobConf, setting: str) -> None:
    """Set one field of a read job from the command line: ``PATH=VALUE`` (``--set``).

    ``PATH`` is the field's place, its parts joined by dots; a repeated block is picked by
    its index or, for ``layer`` and ``param``, by name (every layer of that name, in every
    phase): ``train_steps=20``, ``updater.momentum=0.5``,
    ``neuralnet.layer[data].store_conf.batchsize=8``, ``cluster.nworkers_per_group=2``.
    ``VALUE`` is read as the field reads text in a job file. Nothing changes on an error.

    Raises:
        ParamError: naming the setting, and the fields or names there are at the place
            that is wrong.
    """
    path, sep, value = setting.partition("=")
    where = f"--set {setting}"
    if not sep or not path.strip():
        raise ParamError(f"{where}: expected PATH=VALUE, e.g. "
                         "neuralnet.layer[data].store_conf.batchsize=8")
    parts = path.strip().split(".")
    targets: list[Any] = [job]
    for depth, part in enumerate(parts[:-1]):
        m = _PART.match(part)
        if m is None:
            raise ParamError(f"{where}: '{part}' is not a field name (or name[index])")
        name, pick = m.groups()
        found: list[Any] = []
        for target in targets:
            if name not in target.__dict__:
                known = sorted(k for k, v in target.__dict__.items()
                               if isinstance(v, (Parameter, list)))
                raise ParamError(f"{where}: {'.'.join(parts[:depth]) or 'the job'} has no "
                                 f"block '{name}'; its blocks: {', '.join(known)}")
            value_ = target.__dict__[name]
            if isinstance(value_, list):
                if pick is None:
                    raise ParamError(f"{where}: '{name}' is repeated: pick one with "
                                     f"{name}[index] or {name}[name]")
                chosen = ([value_[int(pick)]] if pick.isdigit() and int(pick) < len(value_)
                          else [v for v in value_ if getattr(v, "name", None) == pick])
                if not chosen:
                    names = [str(getattr(v, "name", i)) for i, v in enumerate(value_)]
                    raise ParamError(f"{where}: no {name} '{pick}'; there are: "
                                     f"{', '.join(names)}")
                found += chosen
            elif isinstance(value_, Parameter) and pick is None:
                found.append(value_)
            else:
                raise ParamError(f"{where}: '{part}' is not a block")
        targets = found
    key = parts[-1]
    trials = [copy.deepcopy(t) for t in targets]
    try:
        # The value as a job file writes it (a list as [a, b], a string quoted or not).
        text = value.strip()
        block = parse_text(f"{key}: {text}", "--set") if text[:1] == "[" else \
            {key: text}
        for trial in trials:
            trial.update(block, allow_unknown=False)
    except ParamError as e:
        raise ParamError([f"{where}: {p}" for p in e.problems]) from None
    for target, trial in zip(targets, trials, strict=True):
        target.__dict__.update(trial.__dict__)


def place_net_problems(error: ParamError, tree: Block) -> ParamError:
    """The problems of ``error``, those that name a layer (at the start) or a Param and have
    no place of their own placed at that layer's or Param's block in ``tree``."""
    layers, params = _places(tree)
    placed = []
    for p in error.problems:
        layer, param = _LAYER.match(p.message), _PARAM.match(p.message)
        if p.where is None and layer and layer.group(1) in layers:
            p = Problem(p.message, layers[layer.group(1)])
        elif p.where is None and param and param.group(1) in params:
            p = Problem(p.message, params[param.group(1)])
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


Places = dict[str, Location | str | None]


def _places(tree: Block) -> tuple[Places, Places]:
    """Where each layer's block and each named Param's block start, by name (the first)."""
    layers: Places = {}
    params: Places = {}
    for net in (e.value for e in tree.entries if e.key == "neuralnet"):
        for layer in _blocks(net, "layer"):
            name = _name(layer.value)
            if name is not None:
                layers.setdefault(name, layer.where)
            for param in _blocks(layer.value, "param"):
                name = _name(param.value)
                if name is not None:
                    params.setdefault(name, param.where)
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


__all__ = ["JobFile", "apply_setting", "place_net_problems", "read_job_file"]
