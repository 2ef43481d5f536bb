"""Writing SINGA's files atomically: the whole file appears at its name, or nothing changes.

SINGA's files (checkpoints, data stores, mean files) are plain bytes, written the way
paramserver's own checkpoints are (one mechanism for both, :mod:`paramserver.atomic`): into
a temporary file in the same folder, created with the user's umask, flushed to disk, then
renamed over the final name — a crash at any moment leaves the previous file whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..atomic import write_atomically as _write_atomically


def write_atomically(path: str | os.PathLike[str],
                     data: bytes | Callable[[BinaryIO], object]) -> Path:
    """Write ``data`` to ``path`` atomically, creating its folder; returns the path.
    ``data`` may be a function that writes the bytes into the open file (a large file
    written piece by piece, never whole in memory)."""

    def write(tmp: Path) -> None:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            with open(tmp, "wb") as f:
                data(f)

    return _write_atomically(Path(path), write)


__all__ = ["write_atomically"]
