"""Files written atomically, and the temporaries a crash leaves behind.

Every file paramserver writes into a workspace (checkpoints, SINGA's checkpoints and stores,
``metrics.csv``, ``metrics.png``, exported models) is written by :func:`write_atomically`:
into a temporary file beside it, created with the user's umask, flushed to disk, then renamed
over the final name. A crash at any moment leaves the previous file whole.

Only a regular file is replaced: a folder, a device, a pipe or a symbolic link at the path is
refused before anything is made (:func:`paramserver.paths.check_output`), and a failed write
is told with the path asked for, never the temporary's: a mistake about the path is a
``ParamError``, a lack of space a :class:`~paramserver.paths.NoSpaceError`.

A process killed during a write (``SIGKILL``, a power cut) leaves its temporary behind:
``.<final name>.<12 hex digits>.tmp`` (``.<final name>.<8 characters>.tmp``, made by
``tempfile.mkstemp``, in the releases that wrote ``.npz`` checkpoints).
:func:`remove_temporaries` removes those of the file names a caller says are its own, at the
next start; nothing else (another program's files, a name that merely looks alike, a
folder, a link) is touched.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path

from .faults import marker
from .paths import check_output, path_error

#: The name of a temporary: the final name, and 12 hex digits that no two writes share (or
#: the 8 characters of ``tempfile.mkstemp``, which earlier releases used).
TEMPORARY = re.compile(r"\.(?P<final>.+)\.(?:[0-9a-f]{12}|[0-9a-z_]{8})\.tmp")


def write_atomically(path: str | os.PathLike[str], write: Callable[[Path], object],
                     what: str = "output") -> Path:
    """``write(tmp)`` a temporary file beside ``path``, flush it to disk, rename it over
    ``path`` (making its folder first); returns ``path``. A crash at any moment leaves the
    previous file whole; an exception removes the temporary and is raised again.

    Raises:
        ParamError: ``path`` is not a regular file or a new one, or cannot be written there
            (no permission, a file where a folder should be, ...), naming ``what`` and it.
        NoSpaceError: no space was left to write it.
    """
    path = check_output(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, mode = _create_temporary(path)
    except OSError as e:
        raise path_error(e, path, what) from None
    try:
        marker("write.open", path)
        write(tmp)
        marker("write.data", path)
        os.chmod(tmp, mode)  # a library may replace the file (losing the mode it was made with)
        _fsync(tmp)
        marker("write.sync", path)
        check_output(path, what)  # still a regular file or none: replaced, nothing else
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise path_error(e, path, what) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    marker("write.done", path)
    _fsync_dir(path.parent)
    return path


def remove_temporaries(folder: str | os.PathLike[str], own: Callable[[str], bool]
                       ) -> list[Path]:
    """Remove the temporaries that writes of ``folder``'s files left (a crashed process's):
    the regular files named as :data:`TEMPORARY` says with ``own(final)`` true.

    Call it only where no other process writes those files at the same time (a run holds
    its workspace's lock). Returns the paths removed.
    """
    folder = Path(folder)
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for entry in entries:
        m = TEMPORARY.fullmatch(entry.name)
        if m is None or not own(m.group("final")):
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        removed.append(Path(entry.path))
    return removed


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


__all__ = ["TEMPORARY", "remove_temporaries", "write_atomically"]
