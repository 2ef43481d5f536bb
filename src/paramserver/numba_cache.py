"""Where numba keeps compiled kernels, so that every user can run paramserver.

numba caches a compiled function (``cache=True``) next to its source (``__pycache__``) or,
where that is not writable, in the user's cache folder (``~/.cache/numba``). A read-only
install (root's site-packages) used by someone without a writable home (a service account,
``setpriv --reuid=nobody``, HOME unset) has neither, and numba then refuses the function at
import: ``cannot cache function '_philox_block': no locator available``.

This module is imported before any kernel is declared. When numba would find no place (and
``NUMBA_CACHE_DIR`` is not set), the cache goes to a folder of this user's own under the
system's temporary folder, made with mode 0700 and used only if this user owns it and no one
else can write it (numba's cache index is a pickle: a folder another user could write would
let them run code as this user). If no such folder can be had, the kernels are compiled
without a cache (on each start). :func:`njit` is ``numba.njit`` with that decision applied.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
from numba.core import config as numba_config  # NUMBA_* settings, read when used

#: Where compiled kernels are cached: a folder, or None when they are not cached.
CACHE_DIR: str | None = None


def _usable(folder: str | os.PathLike[str]) -> bool:
    """Whether numba can keep files in ``folder``: made if missing, and writable (numba's
    own test: a temporary file can be made there)."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _numba_has_a_place(source_dir: Path) -> bool:
    """Whether numba finds a cache place for sources in ``source_dir`` by itself."""
    if getattr(numba_config, "CACHE_DIR", ""):
        return True  # the user's choice (NUMBA_CACHE_DIR), numba's to honour
    if _usable(source_dir / "__pycache__"):
        return True
    from numba.misc.appdirs import AppDirs

    return _usable(AppDirs(appname="numba", appauthor=False).user_cache_dir)


def _private_folder() -> str | None:
    """A cache folder under the temporary folder that only this user can write, or None."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    base = Path(tempfile.gettempdir())
    if uid is not None:
        folder = base / f"paramserver-numba-{uid}"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            info = folder.lstat()  # not a link someone else planted
            if (stat.S_ISDIR(info.st_mode) and info.st_uid == uid
                    and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and _usable(folder)):
                return str(folder)
        except OSError:
            pass
    try:  # a fresh folder of this run's own: nothing reused, but the kernels work
        return tempfile.mkdtemp(prefix="paramserver-numba-")
    except OSError:
        return None


def configure(source_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Decide where compiled kernels of ``source_dir`` (this package) are cached.

    Returns:
        The folder numba will use when it is one chosen here, else None (numba's own
        choice, or no cache). :data:`CACHE_DIR` and :func:`caching` tell the outcome.
    """
    global CACHE_DIR, _CACHING
    here = Path(source_dir) if source_dir is not None else Path(__file__).parent
    if _numba_has_a_place(here):
        CACHE_DIR, _CACHING = getattr(numba_config, "CACHE_DIR", "") or None, True
        return None
    folder = _private_folder()
    if folder is None:
        CACHE_DIR, _CACHING = None, False
        return None
    setattr(numba_config, "CACHE_DIR", folder)  # noqa: B010 (numba sets its settings so)
    os.environ["NUMBA_CACHE_DIR"] = folder  # worker processes (Ray actors) use it too
    CACHE_DIR, _CACHING = folder, True
    return folder


_CACHING = True


def caching() -> bool:
    """Whether compiled kernels are cached on disk for this user."""
    return _CACHING


def njit(*args: Any, **options: Any) -> Callable[..., Any]:
    """``numba.njit``; ``cache=True`` is kept only where a cache place exists."""
    if options.get("cache") and not _CACHING:
        options["cache"] = False
    return numba.njit(*args, **options)  # type: ignore[no-any-return]


configure()

__all__ = ["CACHE_DIR", "caching", "configure", "njit"]
