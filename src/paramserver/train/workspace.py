"""The workspace of a run: checked before anything is built or trained, held while it runs,
and never emptied without being asked.

A run writes ``metrics.csv``, ``metrics.png``, ``checkpoints/``, SINGA's ``checkpoint/`` and
``tensorboard/`` into its workspace. A workspace that cannot take them (a file where a
folder belongs, a folder where a file belongs, no write permission) is found here, with the
path named, before training starts, not at the first checkpoint an hour in. Nothing in the
workspace is created or changed by the check (for a workspace still to be made, a folder is
made and removed at once in the folder that will hold it).

While it trains, a run holds its workspace (:func:`workspace_lock`): a second run started in
the same workspace is refused, instead of mixing its files with the first's. Holding it, the
run removes the temporaries of writes a killed run left (:func:`remove_temporaries`).

What an earlier run left (:func:`earlier_run`) is never deleted unless the user asks: a new
run in such a workspace is refused, unless it resumes the earlier one or is told to
overwrite it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import atomic
from ..checkpoint import is_checkpoint_name
from ..config import ParamError, Parameter
from ..config.job import JobConf
from ..paths import NoSpaceError, check_output, kind_of, no_access, refuse_inputs, shown
from ..singa.checkpoints import FOLDER as SINGA_FOLDER
from ..singa.checkpoints import is_checkpoint_file_name
from .tensorboard import FOLDER as TENSORBOARD

#: What a run writes in its workspace: name and whether it is a folder.
ENTRIES = (("checkpoints", True), ("checkpoints/servers", True), ("checkpoint", True),
           ("tensorboard", True), ("metrics.csv", False), ("metrics.png", False))


def check_workspace(workspace: str | os.PathLike[str]) -> Path:
    """Refuse a workspace a run could not write, naming the path; returns it as a Path.

    Raises:
        ParamError: with every problem found (all of them, in one message).
    """
    if not os.fspath(workspace):
        raise ParamError("the workspace path is empty: give a folder")
    ws = Path(workspace)
    name = f"workspace {shown(ws)}"
    try:
        os.stat(ws)  # through links: a dangling or looping one, a name too long
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(ws):
            raise ParamError(f"{name} is a broken symbolic link (to "
                             f"{shown(os.readlink(ws))})") from None
    except OSError as e:
        raise ParamError(f"{name}: {e.strerror or e}") from None
    problems: list[str] = []
    existing = ws
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder that would hold what must be created
    if existing != ws and not existing.is_dir():
        problems.append(f"{name}: cannot be made, {shown(existing)} is a file")
    elif existing == ws and not ws.is_dir():
        problems.append(f"{name} is {kind_of(os.stat(ws).st_mode)}, not a folder")
    elif (why := _long_name(ws, existing)) is not None:
        problems.append(f"{name}: {why}")
    elif not _writable(existing) or (why := _cannot_make_folders(existing)) is not None:
        problems.append(f"{name}: " + (f"{shown(existing)} is not writable" if existing != ws
                                       else "the folder is not writable") + (
            f" ({why})" if why is not None and not why.startswith("Permission") else ""))
    else:
        for entry, folder in ENTRIES:
            path = ws / entry
            if not os.path.lexists(path):  # (or in a folder this user may not read)
                continue
            kind = kind_of(os.lstat(path).st_mode)
            if folder and not path.is_dir():
                problems.append(f"{name}: {shown(path)} should be a folder, but is "
                                + ("a file" if path.is_file() else kind))
            elif folder and (why := _unreadable(path)) is not None:
                problems.append(f"{name}: {shown(path)} cannot be read: {why}")
            elif not folder and (path.is_symlink() or not path.is_file()):
                problems.append(f"{name}: {shown(path)} should be a file, but is "
                                + ("a folder" if path.is_dir() else kind)
                                + " (a run replaces only regular files)")
            elif not _writable(path if folder else path.parent) or (
                    not folder and not os.access(path, os.W_OK)):
                problems.append(f"{name}: {shown(path)} is not writable")
    if problems:
        raise ParamError(problems)
    return ws


def _unreadable(folder: Path) -> str | None:
    """Why this user may not list ``folder`` (None: it may): a run looks for its own files
    there (checkpoints to resume from, temporaries to remove)."""
    try:
        os.listdir(folder)
    except OSError as e:
        return no_access(folder, e)
    return None


def _writable(folder: Path) -> bool:
    """Whether files can be made in ``folder`` (a read-only mount counts, even for root)."""
    return os.access(folder, os.W_OK | os.X_OK)


def _cannot_make_folders(parent: Path) -> str | None:
    """Why a folder cannot be made in ``parent`` (None: it can), tried (and removed at
    once, the folder's times put back): permission bits do not tell for root, nor on file
    systems such as /proc."""
    try:
        before = os.stat(parent)
        os.rmdir(tempfile.mkdtemp(prefix=".paramserver-", dir=parent))
    except OSError as e:
        return e.strerror or str(e)
    with contextlib.suppress(OSError):
        os.utime(parent, ns=(before.st_atime_ns, before.st_mtime_ns))
    return None


def _long_name(ws: Path, existing: Path) -> str | None:
    """What is too long in the part of ``ws`` still to be made under ``existing`` (None:
    nothing): a name longer than the file system takes, or the whole path."""
    try:
        most = os.pathconf(existing, "PC_NAME_MAX")
        longest = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return None
    for part in ws.relative_to(existing).parts if existing != ws else ():
        if len(os.fsencode(part)) > most:
            return f"a name in it is longer than the {most} bytes a name may have"
    if len(os.fsencode(os.path.abspath(ws / "checkpoints" / "servers"))) >= longest:
        return f"the path is longer than the {longest} bytes a path may have"
    return None


@contextlib.contextmanager
def workspace_lock(workspace: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``workspace`` (made if need be) for one run: a second run that asks for it
    meanwhile, in this process or another, is refused. The lock is the kernel's (``flock``
    on the folder itself: no lock file to go stale; a killed run's lock goes with it).

    Raises:
        ParamError: another run holds the workspace.
    """
    ws = Path(workspace)
    ws.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not on this system: runs are not kept apart
        yield ws
        return
    try:
        fd = os.open(ws, os.O_RDONLY)
    except OSError:  # a folder that can be written but not read: not kept apart either
        yield ws
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ParamError(f"workspace {ws} is in use by another run (a paramserver train "
                             "that has not ended): wait for it to end, or give another "
                             "--workspace") from None
        except OSError:
            pass  # a file system without locks: runs are not kept apart
        yield ws
    finally:
        os.close(fd)  # releases the lock


def _own_files(ws: Path) -> list[tuple[Path, Callable[[str], bool]]]:
    """The folders a run writes, each with the test of the file names it writes there."""
    folders: list[tuple[Path, Callable[[str], bool]]] = [
        (ws, lambda name: name in ("metrics.csv", "metrics.png")),
        (ws / "checkpoints", is_checkpoint_name),
        (ws / SINGA_FOLDER, is_checkpoint_file_name)]
    servers = ws / "checkpoints" / "servers"  # the Ray servers' own, one folder each
    with contextlib.suppress(OSError):
        folders += [(p, is_checkpoint_name) for p in sorted(servers.iterdir())
                    if p.is_dir() and not p.is_symlink()]
    return folders


def remove_temporaries(workspace: str | os.PathLike[str]) -> list[Path]:
    """Remove what writes of an interrupted run left: the temporaries of this workspace's
    own files (checkpoints, SINGA's checkpoints, metrics), and nothing else. Call it while
    holding the workspace (:func:`workspace_lock`). Returns the paths removed."""
    ws = Path(workspace)
    removed: list[Path] = []
    for folder, own in _own_files(ws):
        removed += atomic.remove_temporaries(folder, own)
    for name in _LEGACY_TEMPORARIES:
        path = ws / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


#: The fixed names of the temporaries of metrics.csv and metrics.png in earlier releases.
_LEGACY_TEMPORARIES = (".metrics.csv.tmp", ".metrics.png.tmp.png")


@dataclass(frozen=True)
class EarlierRun:
    """What an earlier run left in a workspace that a new run would replace or hide."""

    checkpoints: list[Path]
    singa_checkpoints: list[Path]
    event_files: list[Path]
    metrics: list[Path]

    @property
    def files(self) -> list[Path]:
        return [*self.checkpoints, *self.singa_checkpoints, *self.event_files, *self.metrics]

    def describe(self, workspace: Path) -> str:
        parts = []
        for paths, what, folder in (
                (self.checkpoints, "checkpoint", workspace / "checkpoints"),
                (self.singa_checkpoints, "SINGA checkpoint", workspace / SINGA_FOLDER),
                (self.event_files, "TensorBoard event file", workspace / TENSORBOARD)):
            if paths:
                parts.append(f"{len(paths)} {what}{'s' if len(paths) > 1 else ''} in {folder}")
        parts += [str(p) for p in self.metrics]
        return ", ".join(parts)


_EVENTS = "events.out.tfevents."


def earlier_run(workspace: str | os.PathLike[str], training: bool) -> EarlierRun:
    """The files of an earlier run that a new run would replace or hide: with ``training``
    its checkpoints, SINGA checkpoints, TensorBoard event files and metrics; without (a run
    that only tests) its metrics."""
    ws = Path(workspace)

    def files(folder: Path, own: Callable[[str], bool]) -> list[Path]:
        try:
            return sorted(p for p in folder.iterdir() if own(p.name) and not p.is_dir())
        except OSError:
            return []

    metrics = [p for p in (ws / "metrics.csv",) if p.is_file()]
    if not training:
        return EarlierRun([], [], [], metrics)
    return EarlierRun(files(ws / "checkpoints", is_checkpoint_name),
                      files(ws / SINGA_FOLDER, is_checkpoint_file_name),
                      files(ws / TENSORBOARD, lambda name: name.startswith(_EVENTS)), metrics)


def remove_earlier_run(earlier: EarlierRun, keep: Sequence[str | os.PathLike[str]] = (),
                       workspace: str | os.PathLike[str] | None = None) -> EarlierRun:
    """Delete an earlier run's files (the user asked: ``--overwrite``), except those in
    ``keep`` (files the new run reads, such as its ``checkpoint_path``). Only regular files
    inside ``workspace`` are deleted, never through a link: a symbolic link among them, or a
    folder of them that is a link (``checkpoints`` linked elsewhere), refuses the whole
    deletion before anything is deleted. Returns what was deleted.

    Raises:
        ParamError: naming every file that would be deleted through a link or is not a
            regular file.
    """
    kept = {os.path.realpath(p) for p in keep}
    if workspace is not None:
        problems = _outside(earlier.files, Path(workspace))
        if problems:
            raise ParamError([f"--overwrite deletes only regular files inside the workspace "
                              f"{shown(workspace)}, never through a link: {p}; delete it "
                              "yourself, or give another --workspace" for p in problems])

    def delete(paths: list[Path]) -> list[Path]:
        out = [p for p in paths if os.path.realpath(p) not in kept]
        for path in out:
            path.unlink(missing_ok=True)
        return out

    return EarlierRun(delete(earlier.checkpoints), delete(earlier.singa_checkpoints),
                      delete(earlier.event_files), delete(earlier.metrics))


def _outside(paths: Sequence[Path], workspace: Path) -> list[str]:
    """What is wrong with deleting each of ``paths`` (files of ``workspace``): not a regular
    file, or reached through a symbolic link (the file, or a folder on the way to it)."""
    out = []
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            out.append(f"{shown(path)} cannot be looked at ({e.strerror or e})")
            continue
        if stat.S_ISLNK(mode):
            out.append(f"{shown(path)} is a symbolic link (to {shown(os.readlink(path))})")
        elif not stat.S_ISREG(mode):
            out.append(f"{shown(path)} is {kind_of(mode)}")
        else:
            for folder in path.relative_to(workspace).parents:
                if folder != Path(".") and (workspace / folder).is_symlink():
                    out.append(f"{shown(path)} is in {shown(workspace / folder)}, a symbolic "
                               f"link to {shown(os.path.realpath(workspace / folder))}")
                    break
    return out


def output_layers(job: JobConf) -> list[Any]:
    """The job's layers that write a file (kCSVOutput, kRecordOutput, a user's subclass of
    :class:`~paramserver.train.layers.loss.OutputLayer`), every phase's."""
    from ..config.components import layers
    from .layers.loss import OutputLayer

    out = []
    for conf in job.neuralnet.layer:
        try:
            cls = layers.get(conf.component)
        except (ParamError, KeyError):
            continue  # refused where the net is built
        if isinstance(cls, type) and issubclass(cls, OutputLayer):
            out.append(conf)
    return out


def written_files(job: JobConf, workspace: str | os.PathLike[str] | None = None
                  ) -> list[tuple[str, Path]]:
    """Every file and folder a run of ``job`` writes, ``(what, path)``: the workspace's
    (:data:`ENTRIES`; SINGA's ``checkpoint/`` only in a SINGA job, the only one that writes
    it) and each output layer's file (:func:`output_path`)."""
    ws = Path(workspace if workspace is not None else job.workspace_dir)
    out = [(what, ws / name) for name, what in _WRITTEN
           if name != SINGA_FOLDER or job.singa_job]
    for conf in output_layers(job):
        if conf.own is not None and conf.own.path:
            out.append((f"layer '{conf.name}' ({conf.component})",
                        output_path(ws, conf.own.path)))
    return out


#: The workspace's entries a run writes, and what they hold.
_WRITTEN = (("checkpoints", "checkpoints (--resume, export)"),
            ("checkpoint", "SINGA's checkpoints (checkpoint_path)"),
            ("tensorboard", "TensorBoard event files"), ("metrics.csv", "metrics"),
            ("metrics.png", "the plot of the metrics"))


def output_path(workspace: Path, path: str) -> Path:
    """Where an output layer's ``path`` is: inside the workspace when relative (SINGA's
    started at the working folder), as given when absolute."""
    return Path(os.path.normpath(workspace / path))


def place_outputs(job: JobConf, workspace: str | os.PathLike[str], *,
                  allow_outside: bool = False,
                  inputs: Sequence[tuple[str, str | os.PathLike[str]]] = ()) -> list[Path]:
    """Check where the job's output layers write, and set each one's ``path`` to the file
    (absolute: every worker writes there, whatever its working folder). A layer writes only
    inside the workspace, through no link, unless its path is absolute and ``allow_outside``
    (``--allow-outside``); never into a folder, a device, a pipe or a link, nor over one of
    the job's inputs (``inputs``: ``(what, path)``, the data and checkpoint files it reads).
    Returns the files.

    Raises:
        ParamError: every output refused, naming its layer and path.
    """
    ws = Path(workspace)
    inside = os.path.realpath(ws)
    problems: list[str] = []
    placed: list[tuple[Any, Path, str]] = []
    for conf in output_layers(job):
        own = conf.own
        if own is None or not own.path:
            continue  # the layer says so itself when it is built
        name = f"layer '{conf.name}' ({conf.component}): store_conf path {shown(own.path)}"
        path = output_path(ws, own.path)
        real = os.path.realpath(path)
        if os.path.commonpath([inside, real]) != inside:
            if not os.path.isabs(own.path):
                problems.append(f"{name} leads out of the workspace {shown(ws)} (to "
                                f"{shown(real)}): a relative path stays inside it")
                continue
            if not allow_outside:
                problems.append(f"{name} is outside the workspace {shown(ws)}: an output "
                                "layer writes there only with --allow-outside")
                continue
        try:
            check_output(path, name)
        except ParamError as e:
            problems += [p.message for p in e.problems]
            continue
        placed.append((own, path, f"the file of layer '{conf.name}' ({conf.component}),"))
    try:
        refuse_inputs([(what, path) for _, path, what in placed], inputs)
    except ParamError as e:
        problems += [p.message for p in e.problems]
    if problems:
        raise ParamError(problems)
    for own, path, _ in placed:
        own.update({"path": os.path.abspath(path)})
    return [path for _, path, _ in placed]


#: The fields of a layer's configuration that name a file it reads.
_READ_FIELDS = ("path", "source", "vocab_path", "mean_file", "meanfile")


def job_inputs(job: JobConf, base_dir: str | os.PathLike[str] | None = None
               ) -> list[tuple[str, Path]]:
    """The files a job reads that exist: its ``checkpoint_path``, every input layer's data,
    vocabulary and mean files, and its ``kFromFile`` model files (a relative path taken
    from the working folder and from ``base_dir``, the job file's folder)."""
    found: list[tuple[str, Path]] = []

    def add(what: str, value: Any) -> None:
        if isinstance(value, str) and value:
            for p in {Path(value), Path(base_dir or ".") / value}:
                if os.path.isfile(p):  # False where pathlib raises (no search permission)
                    found.append((what, p))

    for p in job.checkpoint_path:
        add("checkpoint_path", p)
    writers = {id(c) for c in output_layers(job)}

    def walk(what: str, value: Any) -> None:
        # the configuration objects themselves, not their to_dict() (a job of 20,000 layers
        # spent most of this function making dicts)
        items = (value.__dict__ if isinstance(value, Parameter) else
                 value if isinstance(value, dict) else None)
        if items is not None:
            for k, v in items.items():
                if k in _READ_FIELDS or (k == "path" and what.endswith("init")):
                    add(f"{what} {k}", v)
                elif isinstance(v, (Parameter, dict, list, tuple)):
                    walk(what, v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(what, v)

    for conf in job.neuralnet.layer:
        if id(conf) not in writers:
            walk(f"layer '{conf.name}'", conf)
    return found


def no_space(error: NoSpaceError, workspace: str | os.PathLike[str]) -> NoSpaceError:
    """The error that stops a run whose write failed for lack of space: the file, and what
    the workspace keeps to go on from (its newest checkpoint that can be read)."""
    from ..checkpoint import CheckpointError, load_latest_checkpoint

    ws = Path(workspace)
    try:
        found = load_latest_checkpoint(ws / "checkpoints")
    except CheckpointError as e:  # one this user may not read: said as it is
        found, kept = None, f"and {e}"
    else:
        # --resume goes on from a checkpoint only; with none, it refuses (the workspace holds
        # this run's metrics): --resume-or-start is the command that starts again.
        kept = (f"no checkpoint was written before it: free some space, and --resume-or-start "
                f"in {shown(ws)} starts from the beginning")
    if found is not None:
        path, _, meta = found
        kept = (f"the workspace keeps the checkpoint {shown(path)} (step "
                f"{meta.get('step', '?')}): free some space, and --resume goes on from it")
    return NoSpaceError(error.errno or errno.ENOSPC, f"{error} — the run stopped; {kept}",
                        error.path)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to ``<name>.damaged`` (``.damaged-2``, ... if taken), out
    of the way of the checkpoint that will be written under its name, and kept for the user
    to look at. Returns the new path (``path`` itself if it cannot be renamed)."""
    for n in range(1, 1000):
        target = path.with_name(f"{path.name}.damaged" + (f"-{n}" if n > 1 else ""))
        if target.exists() or target.is_symlink():
            continue
        try:
            path.rename(target)
        except OSError:
            return path
        return target
    return path


__all__ = ["ENTRIES", "EarlierRun", "check_workspace", "earlier_run", "job_inputs", "no_space",
           "output_layers", "output_path", "place_outputs", "remove_earlier_run",
           "remove_temporaries", "set_aside", "workspace_lock", "written_files"]
