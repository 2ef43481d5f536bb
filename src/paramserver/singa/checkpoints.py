"""SINGA-layout checkpoints: the ``step<N>-worker<M>`` files of SINGA's workers.

SINGA's worker writes, into ``<workspace>/checkpoint/``, one file per worker of the first
group: a serialized ``BlobProtos`` message holding, for every Param it owns, its name, its
version and its values (a ``BlobProto``: shape and float32 data). A later job names such
files in ``checkpoint_path`` to start from those values (SINGA's rbm examples chain four
RBMs and an autoencoder so). paramserver writes one file per checkpoint step,
``step<N>-worker0``, with every owner Param, beside its own checkpoints; and reads any such
file, from SINGA or from paramserver.

Names: SINGA v0.1.0 stores a Param by its name (``w1``); v0.2.0 and v0.3.0 unroll every net
and store the Params of copy ``i`` of a layer as ``i#<name>``, the owners (the only ones
written) being copy 0's: ``0#w1``. A file of any release is read, ``w1`` and ``0#w1`` both
meaning the job's ``w1`` (:func:`param_name`); paramserver writes the names of the release
the job is written for (:func:`stored_name`, :mod:`paramserver.singa.releases`), which that
release's SINGA reads. A file none of whose names is a Param of the job is refused: it is
not the checkpoint of this net, and loading nothing would start from random values.

Reading parses the protocol-buffer message and nothing else: no code of the file runs.
A file that is not a well-formed ``BlobProtos`` (undecodable, other fields, as many names as
values and versions, each value as long as its shape says, versions not negative) is refused
with :class:`~paramserver.checkpoint.CheckpointError` naming it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..checkpoint import CheckpointError
from ..config import ParamError
from ..params import ParamSet
from ..paths import require_regular
from .files import write_atomically
from .records import BlobProto, BlobProtos, parse
from .releases import V010

#: SINGA's folder of checkpoints inside the workspace.
FOLDER = "checkpoint"
_FILE_NAME = re.compile(r"step\d+-worker\d+")
#: v0.2.0+'s name of a Param of an unrolled copy: ``<copy>#<name>``.
_UNROLLED = re.compile(r"(\d+)#(.+)", re.S)


def stored_name(name: str, release: str) -> str:
    """The name SINGA's ``release`` gives Param ``name`` in its checkpoints: ``w1`` (v0.1.0)
    or ``0#w1`` (v0.2.0 and v0.3.0, whose nets are unrolled: copy 0 owns the Params)."""
    return name if release == V010 else f"0#{name}"


def param_name(stored: str, names: Container[str]) -> str | None:
    """The Param of ``names`` (a job's) that a checkpoint's name denotes: the same name, or
    for v0.2.0+'s ``0#w1`` the name after ``0#``; None when it denotes none of them (a
    sharer's ``1#w1`` is not an owner, and SINGA writes none)."""
    if stored in names:
        return stored
    unrolled = _UNROLLED.fullmatch(stored)
    if unrolled is not None and unrolled.group(1) == "0" and unrolled.group(2) in names:
        return unrolled.group(2)
    return None


def checkpoint_file_name(step: int, worker: int = 0) -> str:
    """SINGA's name of worker ``worker``'s checkpoint of ``step``: ``step6000-worker0``."""
    return f"step{int(step)}-worker{int(worker)}"


def is_checkpoint_file_name(name: str) -> bool:
    """Whether ``name`` is SINGA's name of a checkpoint file (``step6000-worker0``)."""
    return _FILE_NAME.fullmatch(name) is not None


def newest_checkpoint(folder: str | os.PathLike[str]) -> tuple[int, list[Path]] | None:
    """The newest step of SINGA's checkpoints in ``folder`` and its files (one per worker of
    the first group: ``step<N>-worker<M>``), as SINGA's ``-resume`` finds them; None when
    there are none."""
    by_step: dict[int, list[Path]] = {}
    try:
        paths = sorted(Path(folder).iterdir())
    except OSError:
        return None
    for path in paths:
        if is_checkpoint_file_name(path.name) and path.is_file():
            by_step.setdefault(int(path.name[4:path.name.index("-")]), []).append(path)
    if not by_step:
        return None
    step = max(by_step)
    return step, by_step[step]


@dataclass(frozen=True)
class SavedParam:
    """One Param of a SINGA checkpoint: its name, version, shape and float32 values."""

    name: str
    version: int
    shape: tuple[int, ...]
    values: np.ndarray


def write_checkpoint(path: str | os.PathLike[str],
                     params: Iterable[tuple[str, np.ndarray, int]]) -> Path:
    """Write ``(name, values, version)`` of each Param as SINGA's ``BlobProtos``, atomically
    (a temporary file in the same folder, flushed, then renamed over ``path``).

    Values are stored as float32, SINGA's type. The bytes are those protobuf's serializer
    (SINGA's C++ one) writes, but each Param's values go from its array to the file as they
    are: protobuf's Python runtime would first hold them as Python floats, some 40 bytes each
    (a 5-million-value weight: 200 MB for a 20 MB file).
    """
    head = BlobProtos()
    blobs: list[tuple[bytes, np.ndarray]] = []
    for name, values, version in params:
        shape = [int(d) for d in np.shape(values)]
        arr = np.ascontiguousarray(values, "<f4")  # a view when the values are float32
        head.version.append(int(version))
        head.name.append(str(name))
        blobs.append((BlobProto(shape=shape).SerializeToString(), arr))

    def write(f: BinaryIO) -> None:
        # A message's fields in the order of their numbers (version 3, name 4, blob 5), as
        # protobuf writes them; each blob a length-delimited BlobProto: its shape (1), then
        # its data (2, packed: one length-delimited run of little-endian float32).
        f.write(head.SerializeToString())
        for shape, arr in blobs:
            data = (_key(2) + _varint(arr.nbytes)) if arr.size else b""
            f.write(_key(5) + _varint(len(shape) + len(data) + arr.nbytes) + shape + data)
            f.write(arr.reshape(-1).view(np.uint8).data)

    return write_atomically(path, write)


def _key(field: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(field << 3 | 2)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_checkpoint(path: str | os.PathLike[str]) -> list[SavedParam]:
    """The Params of a SINGA checkpoint file, in file order; CheckpointError when it cannot
    be read or is not a well-formed one."""
    path = Path(path)
    try:
        require_regular(path, "checkpoint", CheckpointError)  # not /dev/zero, nor a pipe
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except OSError as e:
        raise CheckpointError(f"{path}: the checkpoint cannot be read: {e.strerror or e}"
                              ) from None
    try:
        msg = parse(BlobProtos, data, f"{path}: not a SINGA checkpoint")
    except ParamError as e:
        raise CheckpointError(str(e)) from None
    problems = []
    n = len(msg.name)
    if n == 0:
        problems.append("it holds no Params")
    if len(msg.blob) != n or len(msg.version) != n:
        problems.append(f"it has {n} names, {len(msg.version)} versions and {len(msg.blob)} "
                        "values; SINGA writes one of each per Param")
    if len(msg.id) not in (0, n):
        problems.append(f"it has {len(msg.id)} ids for {n} Params")
    out: list[SavedParam] = []
    if not problems:
        for name, version, blob in zip(msg.name, msg.version, msg.blob, strict=True):
            shape = tuple(int(d) for d in blob.shape)
            values = np.array(blob.data, np.float32)
            if not name:
                problems.append("a Param has no name")
            elif any(d < 0 for d in shape):
                problems.append(f"Param '{name}' has a negative dimension in {shape}")
            elif version < 0:
                problems.append(f"Param '{name}' has the negative version {version}")
            elif values.size != math.prod(shape):
                problems.append(f"Param '{name}' has {values.size} values for shape {shape}")
            else:
                out.append(SavedParam(name, int(version), shape, values.reshape(shape)))
    if problems:
        raise CheckpointError([f"{path}: not a well-formed SINGA checkpoint: {p}"
                               for p in problems])
    return out


def saved_params(paths: Sequence[str | os.PathLike[str]],
                 shapes: dict[str, tuple[int, ...]], what: str = "checkpoint_path"
                 ) -> dict[str, SavedParam]:
    """The Params of ``checkpoint_path``'s files that a job with owner Params of ``shapes``
    (by name) loads, by the job's names: files in order (a later one wins), a stored name
    meaning the job's Param by :func:`param_name` (``w1`` or ``0#w1``), names the job does
    not own passed over. Every file is read and checked; nothing is changed.

    Raises:
        CheckpointError: a file that cannot be read or is malformed, a file none of whose
            names is one of the job's Params (both lists named), or a Param whose number of
            values differs from the job's (its shape may differ: values are copied in order,
            as SINGA does).
    """
    loaded: dict[str, tuple[SavedParam, str]] = {}
    problems: list[str] = []
    for path in paths:
        try:
            saved = read_checkpoint(path)
        except CheckpointError as e:
            problems += [f"{what}: {p.message}" for p in e.problems]
            continue
        mine = [(name, s) for s in saved if (name := param_name(s.name, shapes)) is not None]
        if not mine:
            problems.append(
                f"{what}: {path}: none of its Params is one of this job's, so nothing would "
                f"be loaded: it holds {_names(s.name for s in saved)}; the job's are "
                f"{_names(shapes)} (is it the checkpoint of another net?)")
        for name, s in mine:
            loaded[name] = (s, str(path))
    problems += [f"{what}: {path}: Param '{s.name}' has {s.values.size} values "
                 f"{s.shape} but the job's has {math.prod(shapes[name])} {shapes[name]}"
                 for name, (s, path) in loaded.items()
                 if s.values.size != math.prod(shapes[name])]
    if problems:
        raise CheckpointError(problems)
    return {name: saved for name, (saved, _) in loaded.items()}


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def load_checkpoints(params: ParamSet, paths: Sequence[str | os.PathLike[str]],
                     what: str = "checkpoint_path") -> dict[str, int]:
    """Set the values of ``params``' owner Params from SINGA checkpoints, by name, as SINGA's
    ``checkpoint_path`` does (:func:`saved_params`). Every file is read and checked before
    any value changes.

    Returns:
        The version each loaded Param has in its (last) file.

    Raises:
        CheckpointError: as :func:`saved_params`.
    """
    owners = {p.name: p for p in params.owners}
    saved = saved_params(paths, {name: p.shape for name, p in owners.items()}, what)
    for name, s in saved.items():
        p = owners[name]
        p.data[...] = s.values.reshape(p.shape).astype(p.dtype)
    return {name: s.version for name, s in saved.items()}


__all__ = ["FOLDER", "SavedParam", "checkpoint_file_name", "is_checkpoint_file_name",
           "load_checkpoints", "newest_checkpoint", "param_name", "read_checkpoint",
           "saved_params", "stored_name", "write_checkpoint"]
