"""Checkpoints (SPEC §9): arrays and metadata in one file, written atomically, never pickled.

A checkpoint is a `safetensors <https://huggingface.co/docs/safetensors>`_ file: plain
numeric arrays under their keys, and in the file's header the JSON metadata and a CRC-32 of
every array (so that damaged bytes are refused, not loaded as wrong values). safetensors
holds no code by design; loading reads a header of JSON and copies bytes. torch, the Hugging
Face tools and ``safetensors.safe_open`` (by memory map) read these files as they are.

Writing goes to a temporary file in the same folder, created with the user's umask (a team
on a shared file system can read it), flushed to disk, then renamed over the final name: a
crash at any moment leaves the previous checkpoint whole.

Checkpoints of earlier releases (``.npz`` archives with a ``__meta__`` array of JSON) still
load, with ``allow_pickle=False``; a path ending in ``.npz`` is still written in that format.
Whatever the bytes of a file, loading either returns what was saved or raises
:class:`CheckpointError`.
"""

from __future__ import annotations

import json
import os
import re
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .config import ParamError

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
    return _write_atomically(path, write)


def save_tensors(path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                 metadata: dict[str, str] | None = None) -> Path:
    """Write ``arrays`` as a plain safetensors file (a model, for other tools) atomically,
    with the user's umask; ``metadata`` is the file's text-to-text header map."""
    payload = _payload(arrays)
    return _write_atomically(Path(path), lambda tmp: _write_safetensors(tmp, payload,
                                                                          metadata))


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint: ``(arrays, meta)``.

    Raises:
        CheckpointError: naming the file, for a missing file and for any file that is not
            a whole, undamaged checkpoint (and for nothing else).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
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
    the same step)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in folder.iterdir():
        m = _NAME.fullmatch(p.name)
        if m and (int(m.group(1)) not in found or m.group(2) == "safetensors"):
            found[int(m.group(1))] = p
    return sorted(found.items())


def load_latest_checkpoint(folder: str | os.PathLike[str]
                           ) -> tuple[Path, dict[str, np.ndarray], dict[str, Any]] | None:
    """The newest checkpoint of a folder that loads, read once: ``(path, arrays, meta)``."""
    for _, p in reversed(list_checkpoints(folder)):
        try:
            arrays, meta = load_checkpoint(p)
        except CheckpointError:
            continue
        return p, arrays, meta
    return None


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The path of the newest checkpoint of a folder that loads, or None."""
    found = load_latest_checkpoint(folder)
    return None if found is None else found[0]


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


def _write_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` a temporary file beside ``path``, flush it to disk, rename it over
    ``path``: a crash at any moment leaves the previous file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, mode = _create_temporary(path)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # a library may replace the file (losing the mode it was made with)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def _create_temporary(path: Path) -> tuple[Path, int]:
    """A new empty file beside ``path``, and the mode the system gave it: 0666 less the
    umask (and as default ACLs say), unlike ``mkstemp``'s 0600."""
    while True:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        try:
            mode = os.fstat(fd).st_mode & 0o7777
        finally:
            os.close(fd)
        return tmp, mode


def _write_safetensors(tmp: Path, payload: dict[str, np.ndarray],
                       header: dict[str, str] | None) -> None:
    from safetensors.numpy import save_file

    save_file(payload, tmp, metadata=header)


def _crc(arr: np.ndarray) -> int:
    """CRC-32 of an array's bytes as stored (C order, little-endian); no copy."""
    return zlib.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


__all__ = ["FILE_FORMAT", "CheckpointError", "checkpoint_name", "latest_checkpoint",
           "list_checkpoints", "load_checkpoint", "load_latest_checkpoint", "save_checkpoint",
           "save_tensors"]
