"""The paths a user gives: shown in messages, checked before a file is read or written, and
told apart from each other.

Every reader of a file (job files, data sources, model files, checkpoints, SINGA's stores)
reads only a regular file: a named pipe would wait for a writer forever, and a device such as
``/dev/zero`` never ends (:func:`require_regular`). Every writer replaces only a regular file,
or makes a new one (:func:`check_output`): a folder, a device, a pipe or a symbolic link at
the output path is refused, not replaced; and no command writes over one of its own inputs
(:func:`refuse_inputs`).

A mistake about a path is the user's (a :class:`~paramserver.config.ParamError`: exit 2 from
the command line), told with the path the user gave, never the name of a temporary file, and
cut to a readable length (:func:`shown`). A write that fails for lack of space is not a
mistake: it is a :class:`NoSpaceError` (exit 1), naming the file that could not be written.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from .config import ParamError
from .config.errors import Error, printable

#: Longest path (or other text from the user) a message shows whole; longer ones are cut in
#: the middle.
MAX_SHOWN = 200

#: ``errno`` values of a write that failed for lack of space: the disk or the quota is full,
#: or the file is larger than the process may write (``ulimit -f``).
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

#: ``errno`` values that say the path itself is wrong: the user's mistake.
_PATH_MISTAKES = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR,
                            errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EEXIST,
                            errno.ENOENT, errno.ENXIO, errno.ENODEV, errno.EXDEV,
                            errno.EINVAL})


class NoSpaceError(Error, OSError):
    """A file could not be written for lack of space (a full disk or quota, a file larger
    than the process may write). ``str()`` is the whole message; ``filename`` the file."""

    def __init__(self, code: int, message: str, filename: str | None = None):
        super().__init__(code, message)
        self.path = filename

    def __str__(self) -> str:
        return str(self.strerror)


def shown(text: str | os.PathLike[str], limit: int = MAX_SHOWN) -> str:
    """``text`` (a path) as a message shows it: cut in the middle when longer than
    ``limit`` characters (saying how much was left out), characters that do not print
    escaped."""
    s = os.fspath(text)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if len(s) > limit:
        head, tail = limit * 2 // 3, limit // 4
        s = f"{s[:head]}...[{len(s) - head - tail:,} characters]...{s[-tail:]}"
    return printable(s)


def _user(uid: int) -> str:
    """A user as messages name one: ``alice, uid 1000``, or ``uid 1000`` with no name."""
    try:
        import pwd

        return f"{printable(pwd.getpwuid(uid).pw_name)}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def no_access(path: str | os.PathLike[str], error: OSError) -> str:
    """Why this user may not use ``path``, as a message says it after the path: the system's
    reason (``Permission denied``), this user, and the path's owner and mode -- what a
    ``chmod`` or ``chown`` would change."""
    reason = error.strerror or str(error)
    if not hasattr(os, "geteuid"):
        return reason
    try:
        st = os.stat(path)
    except OSError:
        owner = ""
    else:
        owner = f"; its owner: {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"
    return f"{reason} (this user: {_user(os.geteuid())}{owner})"


def kind_of(mode: int) -> str:
    """What a file of mode ``mode`` (``st_mode``) is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def require_regular(path: str | os.PathLike[str], what: str,
                    error: type[ParamError] = ParamError) -> os.stat_result | None:
    """Refuse to read ``path`` unless it is a regular file (through links): a folder, a named
    pipe, a device or a socket is refused with ``error``, naming ``what`` and the path.
    Returns the file's ``stat``, or None when there is no such file (the caller says so in
    its own words)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise error(f"{what} {shown(path)} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        why = ("" if stat.S_ISDIR(st.st_mode) else
               " (only a regular file is read: a pipe or a device may never end)")
        raise error(f"{what} {shown(path)} is {kind_of(st.st_mode)}, not a file{why}")
    return st


def read_regular(path: str | os.PathLike[str], what: str,
                 error: type[ParamError] = ParamError) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`require_regular`); a missing or
    unreadable file is refused with ``error`` naming ``what`` and the path."""
    if require_regular(path, what, error) is None:
        raise error(f"{what} {shown(path)} does not exist")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise error(f"{what} {shown(path)} cannot be read: {e.strerror or e}") from None


def check_output(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Refuse an output path that a write could only fail on or would destroy, before
    anything is made: an empty path, a folder, a symbolic link, a device, a pipe or a socket
    at the path (only a regular file is replaced), a path under a file, a name too long.
    Returns the path.

    Raises:
        ParamError: naming ``what`` and the path.
    """
    text = os.fspath(path)
    if not text:
        raise ParamError(f"the {what} path is empty: give a file name")
    p = Path(text)
    if text.endswith(os.sep) or p.name in ("", ".", ".."):
        raise ParamError(f"{what} {shown(text)} names a folder, not a file")
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):  # the latter: a file on the way
        st = None
    except OSError as e:
        raise path_error(e, p, what) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(p)
            raise ParamError(f"{what} {shown(text)} is a symbolic link (to {shown(target)}): "
                             "it is not replaced; give the path of the file itself")
        raise ParamError(f"{what} {shown(text)} is {kind_of(st.st_mode)}: only a regular file "
                         "is replaced by a write")
    if st is None:
        existing = p.parent
        while not os.path.lexists(existing) and existing != existing.parent:
            existing = existing.parent
        if not os.path.isdir(existing):
            raise ParamError(f"{what} {shown(text)} cannot be made: {shown(existing)} is "
                             f"{_kind_at(existing)}, not a folder")
    return p


def _kind_at(path: Path) -> str:
    try:
        return kind_of(os.stat(path).st_mode)
    except OSError:
        return "a broken symbolic link"


def open_output(path: str | os.PathLike[str], what: str, append: bool = False) -> int:
    """A descriptor to write the regular file ``path`` (made if missing; emptied first
    unless ``append``), never through a symbolic link (:func:`check_output`, and
    ``O_NOFOLLOW`` for a link made meanwhile): for files written as a run goes on, which
    cannot be written atomically.

    Raises:
        ParamError, NoSpaceError: as :func:`path_error` says.
    """
    check_output(path, what)
    flags = (os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
             | getattr(os, "O_NOFOLLOW", 0))
    try:
        return os.open(path, flags, 0o666)
    except OSError as e:
        raise path_error(e, path, what) from None


def path_error(e: OSError, path: str | os.PathLike[str], what: str = "output"
               ) -> Exception:
    """The error to raise for an ``OSError`` met writing ``path`` (the user's path, whatever
    file the system named): :class:`NoSpaceError` for lack of space; a ParamError for a
    mistake about the path (no permission, a read-only file system, a file where a folder
    should be, a name too long, a loop of links); else the ``OSError`` with the user's
    path."""
    reason = e.strerror or str(e)
    if e.errno in NO_SPACE:
        return NoSpaceError(e.errno, f"{shown(path)}: cannot be written: {reason} (no space "
                            "left on the device, or the file is larger than this process "
                            "may write)", os.fspath(path))
    if e.errno in _PATH_MISTAKES:
        return ParamError(f"{what} {shown(path)}: cannot be written: {reason}")
    return OSError(e.errno, reason, os.fspath(path))


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name the same file: resolved through links, or hard links of one
    file (a path that does not exist is the same only as itself, resolved)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_inputs(outputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
                  inputs: Sequence[tuple[str, str | os.PathLike[str] | None]]) -> None:
    """Refuse to run a command that would write over one of its own inputs, or write two of
    its outputs to one file: ``outputs`` and ``inputs`` are ``(what, path)`` pairs (a None
    path is passed over).

    Raises:
        ParamError: one problem per clash, naming both.
    """
    problems = []
    given = [(w, p) for w, p in outputs if p is not None and os.fspath(p)]
    for i, (what, path) in enumerate(given):
        for source, read in inputs:
            if read is not None and os.fspath(read) and same_file(path, read):
                problems.append(f"{what} {shown(path)} is {source} {shown(read)}: a command "
                                "does not write over its own input; give another path")
        for other, path2 in given[:i]:
            if same_file(path, path2):
                problems.append(f"{what} {shown(path)} is also {other} {shown(path2)}: give "
                                "each output its own path")
    if problems:
        raise ParamError(problems)


__all__ = ["MAX_SHOWN", "NO_SPACE", "NoSpaceError", "check_output", "kind_of", "no_access",
           "open_output", "path_error", "read_regular", "refuse_inputs", "require_regular",
           "same_file", "shown"]
