"""Writing SINGA's files atomically: the whole file appears at its name, or nothing changes.

paramserver's own checkpoints are written so by :mod:`paramserver.checkpoint`; SINGA's files
(checkpoints, data stores, mean files) are plain bytes, written here the same way: into a
temporary file in the same folder, flushed to disk, then renamed over the final name (a crash
at any moment leaves the previous file whole).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # as SINGA's files (mkstemp makes them private)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path


__all__ = ["write_atomically"]
