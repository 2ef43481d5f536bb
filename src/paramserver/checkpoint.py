"""Checkpoints (SPEC §9): arrays and metadata in one file, written atomically, never pickled.

A checkpoint is a `safetensors <https://huggingface.co/docs/safetensors>`_ file: plain
numeric arrays under their keys, and in the file's header the JSON metadata and a CRC-32 of
every array (so that damaged bytes are refused, not loaded as wrong values). safetensors
holds no code by design; loading reads a header of JSON and copies bytes. torch, the Hugging
Face tools and ``safetensors.safe_open`` (by memory map) read these files as they are.

Writing goes to a temporary file in the same folder, created with the user's umask (a team
on a shared file system can read it), flushed to disk, then renamed over the final name: a
crash at any moment leaves the previous checkpoint whole (:mod:`paramserver.atomic`).

Checkpoints of earlier releases (``.npz`` archives with a ``__meta__`` array of JSON) still
load, with ``allow_pickle=False``; a path ending in ``.npz`` is still written in that format.
Whatever the bytes of a file, loading either returns what was saved or raises
:class:`CheckpointError`.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import write_atomically
from .config import ParamError
from .paths import no_access, require_regular, shown

META = "__meta__"
#: The version of the file layout (header keys), written into every file.
FILE_FORMAT = "paramserver-safetensors/1"
SUFFIX = ".ckpt.safetensors"
_NAME = re.compile(r"step-(\d+)\.ckpt\.(safetensors|npz)")
_RESERVED = (META, "__metadata__")
# safetensors' header keys of ours (its own "__metadata__" map, text to text).
_FORMAT_KEY = "paramserver_format"
_META_KEY = "paramserver_meta"
_CRC_KEY = "paramserver_crc32"
_ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(ParamError):
    """A checkpoint that cannot be read or does not fit the job."""


class CheckpointAccessError(CheckpointError):
    """A checkpoint, or the folder of checkpoints, that this user may not read (another
    user's, a mode that forbids it): not a damaged one. It is never set aside as damaged,
    nor passed over for an older checkpoint: whoever reads checkpoints stops on it."""


def _no_access(path: Path, error: OSError, what: str = "checkpoint") -> CheckpointAccessError:
    return CheckpointAccessError(
        f"{what} {shown(path)} cannot be read: {no_access(path, error)}. It is not damaged "
        "and is left as it is: let this user read it (chmod, chown), or move it out of the "
        "way" + (" to go on from an older checkpoint" if what == "checkpoint" else ""))


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: ``step-00000100.ckpt.safetensors``."""
    return f"step-{step:08d}{SUFFIX}"


def save_checkpoint(path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                    meta: dict[str, Any]) -> Path:
    """Write ``arrays`` and JSON-able ``meta`` to ``path`` atomically; returns the path.

    The file is safetensors, unless ``path`` ends in ``.npz`` (the format of earlier
    releases). Arrays must hold numbers or booleans (no Python objects).
    """
    path = Path(path)
    payload = _payload(arrays)
    text = json.dumps(meta, sort_keys=True, allow_nan=False)
    if path.suffix == ".npz":
        payload[META] = np.frombuffer(text.encode(), np.uint8)

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **payload)  # type: ignore[arg-type]
    else:
        crcs = {key: _crc(arr) for key, arr in payload.items()}
        crcs[META] = zlib.crc32(text.encode())
        header = {_FORMAT_KEY: FILE_FORMAT, _META_KEY: text,
                  _CRC_KEY: json.dumps(crcs, sort_keys=True)}

        def write(tmp: Path) -> None:
            _write_safetensors(tmp, payload, header)
    return write_atomically(path, write, "checkpoint")


def save_tensors(path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                 metadata: dict[str, str] | None = None, what: str = "model file") -> Path:
    """Write ``arrays`` as a plain safetensors file (a model, for other tools) atomically,
    with the user's umask; ``metadata`` is the file's text-to-text header map; ``what``
    names the file in messages."""
    payload = _payload(arrays)
    return write_atomically(path, lambda tmp: _write_safetensors(tmp, payload, metadata),
                            what)


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint: ``(arrays, meta)``.

    Raises:
        CheckpointAccessError: naming the file, for one this user may not read.
        CheckpointError: naming the file, for a missing file and for any file that is not
            a whole, undamaged checkpoint (and for nothing else).
    """
    path = Path(path)
    try:
        os.stat(path)  # a folder on the way this user may not look into
        require_regular(path, "checkpoint", CheckpointError)  # a pipe or device: not opened
        with open(path, "rb") as f:
            magic = f.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except PermissionError as e:
        raise _no_access(path, e) from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({e.strerror or e})"
                              ) from None
    if magic == _ZIP_MAGIC:
        arrays, text = _read_npz(path)
    else:
        arrays, text = _read_safetensors(path)
    try:
        meta = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint metadata ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: damaged checkpoint metadata (not a JSON object)")
    return arrays, meta


def list_checkpoints(folder: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoints in a folder by step, oldest first (safetensors over an ``.npz`` of
    the same step); none if there is no such folder.

    Raises:
        CheckpointAccessError: naming the folder, when this user may not read it.
    """
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except PermissionError as e:
        raise _no_access(folder, e, "the checkpoints' folder") from None
    except OSError:  # none, a file, a broken link
        return []
    found: dict[int, Path] = {}
    for name in names:
        m = _NAME.fullmatch(name)
        if m and (int(m.group(1)) not in found or m.group(2) == "safetensors"):
            found[int(m.group(1))] = folder / name
    return sorted(found.items())


def read_checkpoints(folder: str | os.PathLike[str]
                     ) -> Iterator[tuple[Path, tuple[dict[str, np.ndarray], dict[str, Any]]
                                         | CheckpointError]]:
    """The checkpoints of a folder, newest first, each read when the iteration reaches it:
    ``(path, (arrays, meta))``, or ``(path, error)`` for one that cannot be read.

    Raises:
        CheckpointAccessError: for a checkpoint (or the folder) this user may not read: it is
            not damaged, and an older one is not the newest of the folder.
    """
    for _, path in reversed(list_checkpoints(folder)):
        try:
            yield path, load_checkpoint(path)
        except CheckpointAccessError:
            raise
        except CheckpointError as e:
            yield path, e


def load_latest_checkpoint(folder: str | os.PathLike[str]
                           ) -> tuple[Path, dict[str, np.ndarray], dict[str, Any]] | None:
    """The newest checkpoint of a folder that loads, read once: ``(path, arrays, meta)``."""
    for path, read in read_checkpoints(folder):
        if not isinstance(read, CheckpointError):
            return path, *read
    return None


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The path of the newest checkpoint of a folder that loads, or None."""
    found = load_latest_checkpoint(folder)
    return None if found is None else found[0]


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is the name of a checkpoint file (``step-00000100.ckpt.safetensors``,
    or ``.npz`` of an earlier release)."""
    return _NAME.fullmatch(name) is not None


# -- writing ------------------------------------------------------------------------------

def _payload(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    payload: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if not isinstance(key, str) or key in _RESERVED:
            raise CheckpointError(f"checkpoint array key {key!r} is reserved or not a string")
        arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.kind not in "biuf":
            raise CheckpointError(f"checkpoint array '{key}' holds {arr.dtype}; only "
                                  "numbers and booleans are saved")
        if arr.dtype.byteorder == ">":  # stored little-endian: checksums over those bytes
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        payload[key] = np.asarray(arr, order="C")  # keeps 0-d arrays
    return payload


# safetensors' names of the numpy types a checkpoint may hold.
_DTYPES = {"b": {1: "BOOL"}, "u": {1: "U8", 2: "U16", 4: "U32", 8: "U64"},
           "i": {1: "I8", 2: "I16", 4: "I32", 8: "I64"}, "f": {2: "F16", 4: "F32", 8: "F64"}}


def _write_safetensors(tmp: Path, payload: dict[str, np.ndarray],
                       metadata: dict[str, str] | None) -> None:
    """Write a safetensors file: the length of the header (8 bytes, little-endian), the
    header (JSON, padded with spaces to a multiple of 8 bytes), then each array's bytes.

    Hand-written rather than ``safetensors.numpy.save_file``, which (0.4 to 0.8) writes the
    ``__metadata__`` map in a random order per process: the same checkpoint would differ in
    its bytes from run to run, and a resumed run's files from an uninterrupted run's. Here
    the bytes are a function of the content, and arrays go to the file from their own
    memory, without the copy ``save_file`` makes of each. Arrays are laid out as safetensors
    does (larger elements first, then by name), so that each is aligned to its element size.
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    order = sorted(payload, key=lambda k: (-payload[k].dtype.itemsize, k))
    offset = 0
    for key in order:
        arr = payload[key]
        dtype = _DTYPES.get(arr.dtype.kind, {}).get(arr.dtype.itemsize)
        if dtype is None:
            raise CheckpointError(f"checkpoint array '{key}' holds {arr.dtype}, which "
                                  "safetensors cannot store")
        header[key] = {"dtype": dtype, "shape": list(arr.shape),
                       "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for key in order:
            arr = payload[key]
            if arr.size:
                f.write(arr.reshape(-1).view(np.uint8).data)


def _crc(arr: np.ndarray) -> int:
    """CRC-32 of an array's bytes as stored (C order, little-endian); no copy."""
    return zlib.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)


# -- reading ------------------------------------------------------------------------------

def _read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            header = f.metadata() or {}
            arrays = {key: np.asarray(f.get_tensor(key)) for key in f.keys()}  # copies
    # The reader parses untrusted bytes: whatever it raises (SafetensorError for a bad
    # header or size, OSError, an unsupported dtype, ...) means this file is not readable.
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({_reason(e)})") from None
    if header.get(_FORMAT_KEY) != FILE_FORMAT or _META_KEY not in header:
        found = header.get(_FORMAT_KEY)
        raise CheckpointError(f"{path}: not a paramserver checkpoint" + (
            f" (format '{found}', expected '{FILE_FORMAT}')" if found else
            " (a safetensors file without paramserver's metadata; a model file is read "
            "by init { type: kFromFile })"))
    text = header[_META_KEY]
    try:
        crcs = json.loads(header.get(_CRC_KEY, ""))
        if not isinstance(crcs, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint header ({e})") from None
    expected = set(arrays) | {META}
    if set(crcs) != expected:
        raise CheckpointError(f"{path}: damaged checkpoint header (the checksums name "
                              "other arrays than the file holds)")
    damaged = sorted(k for k, arr in arrays.items() if crcs[k] != _crc(arr))
    if crcs[META] != zlib.crc32(text.encode()):
        damaged.insert(0, "the metadata")
    if damaged:
        raise CheckpointError(f"{path}: damaged checkpoint (checksum mismatch in "
                              f"{', '.join(damaged[:5])}{', ...' if len(damaged) > 5 else ''})")
    return arrays, text


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], str]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    # zipfile and numpy's header parser raise many types for damaged bytes (BadZipFile,
    # struct.error, ValueError, EOFError, NotImplementedError, ...): all mean unreadable.
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({_reason(e)})") from None
    raw = arrays.pop(META, None)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise CheckpointError(f"{path}: not a paramserver checkpoint (no metadata)")
    for key, arr in arrays.items():
        if arr.dtype.kind not in "biuf":
            raise CheckpointError(f"{path}: array '{key}' holds {arr.dtype}, not numbers")
    try:
        return arrays, raw.tobytes().decode()
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: damaged checkpoint metadata ({e})") from None


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200] if text else type(e).__name__


__all__ = ["FILE_FORMAT", "CheckpointAccessError", "CheckpointError", "checkpoint_name",
           "is_checkpoint_name", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "load_latest_checkpoint", "read_checkpoints", "save_checkpoint", "save_tensors"]
