"""Checkpoints (SPEC §9): arrays and metadata in one file, written atomically, never pickled.

A checkpoint is a ``.npz`` archive of plain numeric arrays plus one ``__meta__`` array holding
UTF-8 JSON. It is loaded with ``allow_pickle=False``, so loading cannot execute code.
Writing goes to a temporary file in the same folder, is flushed to disk, then renamed over
the final name: a crash at any moment leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .config import ParamError

META = "__meta__"
_NAME = re.compile(r"step-(\d+)\.ckpt\.npz")


class CheckpointError(ParamError):
    """A checkpoint that cannot be read or does not fit the job."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.ckpt.npz"


def save_checkpoint(path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                    meta: dict[str, Any]) -> Path:
    """Write ``arrays`` and JSON-able ``meta`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # keeps 0-d arrays
    if META in payload:
        raise CheckpointError(f"'{META}' is reserved for the checkpoint's metadata")
    for key, arr in payload.items():
        if arr.dtype.hasobject:
            raise CheckpointError(f"checkpoint array '{key}' holds Python objects; only "
                                  "numbers")
    payload[META] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint: ``(arrays, meta)``. Raises CheckpointError naming the file."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({e})") from None
    raw = arrays.pop(META, None)
    if raw is None:
        raise CheckpointError(f"{path}: not a paramserver checkpoint (no metadata)")
    try:
        meta = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint metadata ({e})") from None
    return arrays, meta


def list_checkpoints(folder: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoints in a folder by step, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.fullmatch(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


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


__all__ = ["CheckpointError", "checkpoint_name", "latest_checkpoint", "list_checkpoints",
           "load_checkpoint", "load_latest_checkpoint", "save_checkpoint"]
