"""Where paramserver's compiled kernels are kept, how they are keyed, locked, checked and refused.

numba compiles a kernel on its first call and, with ``cache=True``, keeps the machine code on
disk for the next process. Its own cache has four traps this module closes:

1. **A cached function that calls a parallel one needs numba's thread pool.** numba starts its
   threading layer when it compiles or loads a *parallel* function. A serial kernel that calls
   a parallel one (the update kernels call the read-only NaN check, a parallel function) and is
   loaded from the cache, in a process that has not started the pool yet, jumps to an
   unresolved address of the parallel runtime: a segfault on every run after the first (the
   first compiled, so the pool was started). Here the pool is started before any entry is
   loaded.
2. **Several processes writing one cache** (Ray's actors on their first step) number their
   entries by what each read of the index: two can give two signatures one data file, and the
   index then names code compiled for other types. Here every write holds an exclusive lock
   on the cache folder (``fcntl.flock``), every read a shared one, and an entry whose
   signature is not the one asked for, or that cannot be read back, is ignored and compiled
   anew -- never loaded.
3. **Two builds of one function.** numba names a function's entries by its name and keys
   them by its types and the hash of its code, not by its compile options: a parallel and a
   serial build of one body (the global norm's) found each other's entries, and the
   parallel build ran the serial code (or the other way round, by which ran first). Here the
   key holds the options (``parallel``, ``fastmath``, ``error_model``, ...) too.
4. **A cache that outlives its source.** numba keys an entry by the modification time and
   size of the one file that defines the function, though the kernels are built from
   functions of several files (the codecs of :mod:`.quant` are compiled into the update
   kernels), and an installed wheel's files may keep their times across versions. Here the
   folder itself is keyed by a hash of the contents of every module of this package (all
   that numba compiles), of paramserver's, numba's, llvmlite's and Python's versions and of
   the machine's architecture; entries of another key are never looked at.

Where: ``<base>/kernels-<key>``, ``<base>`` being ``$NUMBA_CACHE_DIR/paramserver`` when the
user set ``NUMBA_CACHE_DIR``, else the user's cache folder (``$XDG_CACHE_HOME/paramserver`` or
``~/.cache/paramserver``), else a folder of this user's own under the system's temporary
folder (``paramserver-numba-<uid>``, mode 0700, used only if this user owns it and no one else
can write it: numba's index is a pickle, and a folder another user could write would let them
run code as this user; when another user holds that name, ``paramserver-numba-<uid>-1``, ``-2``
and so on, the first of this user's, found again by every later process). When none can be
had (a service account with no home and a read-only install), kernels are compiled in each
process, not cached. Deleting the folder at any time is safe: what is missing is compiled
again; and a file of it that cannot be read back (an index or a data file left empty, cut
short or garbled by a full disk or a copy that stopped) is as good as missing: compiled again
and written anew (atomically), never a failed run.

:func:`njit` is ``numba.njit`` with this cache in place of numba's for ``cache=True``;
:mod:`.compile_events` hears, from here, when a kernel is being compiled;
:func:`threading_layer` starts numba's thread pool and names its layer.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import platform
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numba
import numba.core.event
from numba.core import config as numba_config  # NUMBA_* settings, read when used
from numba.core import sigutils
from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    _CacheLocator,
)
from numba.core.caching import (
    NullCache as _NumbaNullCache,
)

from . import compile_events, forms

try:
    import fcntl
except ImportError:  # not on POSIX: numba's own atomic renames only
    fcntl = None  # type: ignore[assignment]

_HERE = Path(__file__).resolve().parent

#: The folder of compiled kernels, or None when they are not cached (set by :func:`configure`).
CACHE_DIR: str | None = None


def _key() -> str:
    """A hash of what compiled code depends on: the sources of every module of this package
    (everything numba compiles lives here, and kernels are built from functions of several
    modules), and the versions of paramserver, numba, llvmlite and Python, and the machine's
    architecture."""
    import llvmlite

    from .._version import __version__

    h = hashlib.sha256()
    for part in (__version__, numba.__version__, llvmlite.__version__, sys.version,
                 platform.machine()):
        h.update(part.encode() + b"\0")
    for path in sorted(_HERE.glob("*.py")):
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _usable(folder: str | os.PathLike[str]) -> bool:
    """Whether files can be kept in ``folder``: made if missing, and writable."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _own_private(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) of this user that no one else can
    write."""
    try:
        info = folder.lstat()
    except OSError:
        return False
    uid = os.getuid() if hasattr(os, "getuid") else None
    return (stat.S_ISDIR(info.st_mode) and (uid is None or info.st_uid == uid)
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _user_cache_base() -> Path | None:
    """The user's cache folder for paramserver, if there is a home to keep it in."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "paramserver"
    home = os.environ.get("HOME") or (os.path.expanduser("~") if "HOME" not in os.environ
                                      else "")
    if not home or home == "~" or not os.path.isdir(home):
        return None
    return Path(home) / ".cache" / "paramserver"


#: How many names ``paramserver-numba-<uid>[-<n>]`` are tried under the temporary folder
#: before a folder of the process's own is made.
PRIVATE_NAMES = 10


def _private_folder() -> str | None:
    """A base folder under the temporary folder that only this user can write, or None:
    ``paramserver-numba-<uid>``, or when another user holds that name (or it is a link, or
    others may write it) ``paramserver-numba-<uid>-1``, ``-2``, ...: the first one that is
    this user's, so that every later process finds the same one. When all are taken, a
    folder of this process's own, removed when it exits (kernels are then compiled in each
    process, and nothing is left behind)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    base = Path(tempfile.gettempdir())
    if uid is not None:
        for n in range(PRIVATE_NAMES):
            folder = base / (f"paramserver-numba-{uid}" + (f"-{n}" if n else ""))
            try:
                folder.mkdir(mode=0o700, exist_ok=True)
            except OSError:  # a file of that name, say
                continue
            if _own_private(folder) and _usable(folder):
                return str(folder)
    try:
        folder_name = tempfile.mkdtemp(prefix="paramserver-numba-")
    except OSError:
        return None
    atexit.register(shutil.rmtree, folder_name, ignore_errors=True)
    return folder_name


def _base() -> str | None:
    """Where the keyed folders go (see the module docstring), or None."""
    numba_dir = getattr(numba_config, "CACHE_DIR", "") or os.environ.get("NUMBA_CACHE_DIR", "")
    if numba_dir:
        return str(Path(numba_dir) / "paramserver")  # the user's choice: honoured as it is
    user = _user_cache_base()
    if user is not None and _usable(user):
        return str(user)
    return _private_folder()


def configure(base: str | os.PathLike[str] | None = None) -> str | None:
    """Decide where compiled kernels are cached: ``<base>/kernels-<key>``, ``base`` by
    default chosen as the module docstring says.

    Returns:
        The folder, or None when kernels are not cached (:func:`caching` says the same).
    """
    global CACHE_DIR
    where = str(base) if base is not None else _base()
    folder = None
    if where is not None:
        candidate = Path(where) / f"kernels-{_key()}"
        if _usable(candidate):
            folder = str(candidate)
    CACHE_DIR = folder
    return folder


def caching() -> bool:
    """Whether compiled kernels are cached on disk for this user."""
    return CACHE_DIR is not None


# -- the lock and the listeners -----------------------------------------------------------------


@contextlib.contextmanager
def _locked(folder: str, exclusive: bool) -> Iterator[None]:
    """The cache folder's lock (shared to read, exclusive to write), across processes."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


class _CompileListener(numba.core.event.Listener):
    """Passes numba's compile events (a dispatcher compiling: not found in the cache) on to
    :mod:`.compile_events`' listeners."""

    def on_start(self, event: Any) -> None:
        self._tell(event, True)

    def on_end(self, event: Any) -> None:
        self._tell(event, False)

    def _tell(self, event: Any, starting: bool) -> None:
        dispatcher = (event.data or {}).get("dispatcher")
        py_func = getattr(dispatcher, "py_func", None)
        compile_events.tell(f"{getattr(py_func, '__module__', '')}:"
                            f"{getattr(py_func, '__qualname__', 'a kernel')}", starting)


numba.core.event.register("numba:compile", _CompileListener())  # for the life of the process


# -- numba's cache with these rules ---------------------------------------------------------


_pool_started = False


def _start_thread_pool() -> None:
    """Start numba's threading layer once: loaded code may call into it (trap 1).

    Starting numba's OpenMP layer sets the process's OpenMP thread count to numba's (the
    machine's cores): a caller's ``torch.set_num_threads(1)`` would be undone by a library
    that merely ran a kernel. What torch counted before is put back; numba's own count
    (``numba.get_num_threads``) is numba's and stays as it was."""
    global _pool_started
    if not _pool_started:
        from numba.np.ufunc import parallel

        torch = sys.modules.get("torch")  # only if the caller imported it: never imported here
        before = torch.get_num_threads() if torch is not None else None
        parallel._launch_threads()
        if torch is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)
        _pool_started = True


def get_num_threads() -> int:
    """``numba.get_num_threads``, with the pool started as :func:`_start_thread_pool` does
    (numba's own would start it and change torch's thread count)."""
    _start_thread_pool()
    return int(numba.get_num_threads())


def threading_layer() -> str:
    """The name of numba's threading layer (``omp``, ``tbb`` or ``workqueue``), its thread
    pool started if it was not: found without compiling anything (a parallel function
    would take a second or two, on a job's first run, to answer the question)."""
    _start_thread_pool()
    return str(numba.threading_layer())


class _Locator(_CacheLocator):
    """Entries of every kernel in the keyed folder; the key stands for the source stamp."""

    def __init__(self, py_func: Any, folder: str) -> None:
        self._lineno = py_func.__code__.co_firstlineno
        self._folder = folder

    def ensure_cache_path(self) -> None:
        os.makedirs(self._folder, exist_ok=True)

    def get_cache_path(self) -> str:
        return self._folder

    def get_source_stamp(self) -> Any:
        return os.path.basename(self._folder)  # the key: every source and version

    def get_disambiguator(self) -> str:
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> _Locator | None:
        return cls(py_func, CACHE_DIR) if CACHE_DIR is not None else None


class _Impl(CompileResultCacheImpl):
    _locator_classes = [_Locator]  # noqa: RUF012 (numba reads it from the class)


class _IndexFile(IndexDataCacheFile):
    """numba's index and data files of one function, where an index that cannot be read
    (empty, cut short, garbage: a disk that filled up, a copy that stopped) counts as no
    index, as a damaged data file counts as no entry: its kernels are compiled anew and the
    index is written again whole (numba writes a temporary file and renames it over the
    old), instead of every later run failing on ``EOFError`` or ``UnpicklingError``."""

    def _load_index(self) -> dict[Any, str]:
        try:
            overloads = super()._load_index()
        except OSError:
            raise  # not the file's bytes: a save stops, uncached, as for a full disk
        except Exception:  # pickle's errors for bytes that are not an index are many
            return {}
        if not isinstance(overloads, dict) or not all(
                isinstance(name, str) for name in overloads.values()):
            return {}
        return overloads


class _KernelCache(FunctionCache):
    """numba's function cache in the keyed folder, locked, with its entries checked (a
    damaged index or data file compiled anew), and keyed by the dispatcher's compile options
    too (trap 3 of the module docstring)."""

    _impl_class = _Impl

    def __init__(self, py_func: Any, options: dict[str, Any]) -> None:
        super().__init__(py_func)
        self._options = repr(sorted(options.items()))
        self._cache_file = _IndexFile(self._cache_path, self._impl.filename_base,
                                      self._impl.locator.get_source_stamp())

    def _index_key(self, sig: Any, codegen: Any) -> Any:
        return (*super()._index_key(sig, codegen), self._options)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        forms.note_compiler()
        _start_thread_pool()
        args = tuple(sigutils.normalize_signature(sig)[0])
        try:
            with _locked(self._cache_path, exclusive=False):
                cres = super().load_overload(sig, target_context)
        except Exception:  # unreadable, cut short, of another format: compile anew
            cres = None
        if cres is not None and tuple(cres.signature.args) != args:
            cres = None  # an entry for other types under this key: never loaded
        return cres

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            with _locked(self._cache_path, exclusive=True):
                super().save_overload(sig, data)
        except OSError:
            pass  # a full or read-only disk: the kernel runs, uncached


def njit(*args: Any, **options: Any) -> Callable[..., Any]:
    """``numba.njit``; ``cache=True`` keeps the compiled code in this module's cache (where
    one can be had)."""
    cache = bool(options.pop("cache", False))
    if args and callable(args[0]) and len(args) == 1:
        return _with_cache(numba.njit(**options)(args[0]), cache)
    decorate = numba.njit(*args, **options)
    return lambda fn: _with_cache(decorate(fn), cache)


def _with_cache(dispatcher: Any, cache: bool) -> Any:
    if cache and CACHE_DIR is not None:
        dispatcher._cache = _KernelCache(dispatcher.py_func, dispatcher.targetoptions)
    else:
        dispatcher._cache = NullCache()
    return dispatcher


class NullCache(_NumbaNullCache):
    """No cache; the thread pool started before a compile all the same (a parallel
    compile would start it, as numba's, changing torch's thread count)."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        forms.note_compiler()
        _start_thread_pool()
        return None


configure()

__all__ = ["CACHE_DIR", "caching", "configure", "get_num_threads", "njit",
           "threading_layer"]
