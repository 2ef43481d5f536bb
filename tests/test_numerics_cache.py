"""Where compiled kernels are kept (paramserver.numerics.cache), in this process: the folder
chosen and keyed, a private folder where there is no home, no cache where there is no place,
an entry that cannot be read back or is of other types compiled anew. tests/test_install.py
runs the real case of another user with no home and a read-only install;
tests/test_kernel_processes.py runs fresh processes on one cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numba.core import config as numba_config

import paramserver.numerics.cache as nc
from paramserver.numerics import compile_events


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No NUMBA_CACHE_DIR, no home, no XDG folder; the temporary folder is tmp_path. The
    module's choice is put back afterwards."""
    monkeypatch.setattr(numba_config, "CACHE_DIR", "")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    monkeypatch.setattr(nc.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(nc, "CACHE_DIR", nc.CACHE_DIR)
    return tmp_path


def test_numba_cache_dir_is_the_users_choice(nowhere: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setattr(numba_config, "CACHE_DIR", str(nowhere / "chosen"))
    folder = nc.configure()
    assert folder == str(nowhere / "chosen" / "paramserver" / f"kernels-{nc._key()}")
    assert nc.caching() and nc.CACHE_DIR == folder and Path(folder).is_dir()


def test_the_users_cache_folder(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (nowhere / "home").mkdir()
    monkeypatch.setenv("HOME", str(nowhere / "home"))
    assert nc.configure() == str(nowhere / "home" / ".cache" / "paramserver"
                                 / f"kernels-{nc._key()}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(nowhere / "xdg"))
    assert nc.configure() == str(nowhere / "xdg" / "paramserver" / f"kernels-{nc._key()}")


def test_a_private_folder_when_there_is_no_home(nowhere: Path) -> None:
    folder = nc.configure()
    base = nowhere / f"paramserver-numba-{os.getuid()}"
    assert folder == str(base / f"kernels-{nc._key()}")
    assert stat.S_IMODE(os.stat(base).st_mode) == 0o700
    assert nc.configure() == folder  # used again on the next start


def test_a_folder_others_can_write_is_not_used(nowhere: Path) -> None:
    planted = nowhere / f"paramserver-numba-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # anyone could put a pickled index there
    folder = nc.configure()
    assert folder is not None and not folder.startswith(str(planted) + os.sep)
    assert stat.S_IMODE(os.stat(Path(folder).parent).st_mode) == 0o700


def test_a_link_is_not_followed(nowhere: Path, tmp_path_factory: pytest.TempPathFactory
                                ) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (nowhere / f"paramserver-numba-{os.getuid()}").symlink_to(elsewhere)
    folder = nc.configure()
    assert folder is not None and Path(folder).parent.parent == nowhere
    assert not any(elsewhere.iterdir())


def test_no_cache_when_no_folder_can_be_had(nowhere: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nc, "_private_folder", lambda: None)
    assert nc.configure() is None
    assert not nc.caching() and nc.CACHE_DIR is None

    @nc.njit(cache=True)
    def twice(x: float) -> float:
        return 2 * x

    assert twice(2.0) == 4.0  # compiled, not cached
    assert type(twice._cache).__name__ == "NullCache"


def test_the_key_changes_with_any_numerics_source(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    for path in nc._HERE.glob("*.py"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(nc, "_HERE", tmp_path)
    before = nc._key()
    with open(tmp_path / "quant.py", "a") as f:  # not the file that defines the kernels
        f.write("\n# a change\n")
    assert nc._key() != before


def _fresh(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A function cached in ``folder``, made anew (as a new process would)."""
    monkeypatch.setattr(nc, "CACHE_DIR", str(folder))

    @nc.njit(cache=True)
    def scaled(x, k):  # type: ignore[no-untyped-def]
        return x * k

    return scaled


def test_an_entry_is_loaded_by_the_next_process_and_reported_only_when_compiled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    with compile_events.reporting(lambda name, starting: seen.append((name, starting))):
        first = _fresh(tmp_path, monkeypatch)
        assert first(np.arange(3.0), 2.0).tolist() == [0.0, 2.0, 4.0]
        assert any(name.endswith("scaled") for name, starting in seen if starting)
        assert sum(s for _, s in seen) == len(seen) - sum(s for _, s in seen)  # each ends
        seen.clear()
        again = _fresh(tmp_path, monkeypatch)
        assert again(np.arange(3.0), 2.0).tolist() == [0.0, 2.0, 4.0]
    assert seen == []  # loaded from the cache: nothing compiled
    assert sum(again.stats.cache_hits.values()) == 1
    assert (tmp_path / ".lock").exists()


def test_an_entry_that_cannot_be_read_is_compiled_anew(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(tmp_path, monkeypatch)(np.arange(3.0), 2.0)
    for data in tmp_path.glob("*.nbc"):
        data.write_bytes(data.read_bytes()[:40])  # cut short
    again = _fresh(tmp_path, monkeypatch)
    assert again(np.arange(3.0), 3.0).tolist() == [0.0, 3.0, 6.0]
    assert sum(again.stats.cache_misses.values()) == 1


def test_an_entry_of_other_types_is_never_loaded(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two signatures whose data files were swapped (what two processes numbering entries
    at once could leave): each call compiles anew instead of running the other's code."""
    first = _fresh(tmp_path, monkeypatch)
    first(np.arange(3.0), 2.0)
    first(np.arange(3, dtype=np.int32), np.int32(2))
    files = sorted(tmp_path.glob("*.nbc"))
    assert len(files) == 2
    a, b = (f.read_bytes() for f in files)
    files[0].write_bytes(b)
    files[1].write_bytes(a)
    again = _fresh(tmp_path, monkeypatch)
    assert again(np.arange(3.0), 2.0).tolist() == [0.0, 2.0, 4.0]
    assert again(np.arange(3, dtype=np.int32), np.int32(2)).tolist() == [0, 2, 4]
    assert sum(again.stats.cache_misses.values()) == 2


def _body(x, k):  # type: ignore[no-untyped-def]
    return x * k


def test_two_builds_of_one_function_keep_their_own_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One body compiled with two sets of options (the global norm's parallel and serial
    builds): each compiles, and each loads its own entry, whichever ran first."""
    monkeypatch.setattr(nc, "CACHE_DIR", str(tmp_path))
    compiled: list[str] = []

    def builds() -> tuple[Any, Any]:
        return (nc.njit(cache=True, fastmath=True)(_body),
                nc.njit(cache=True, error_model="numpy")(_body))

    with compile_events.reporting(lambda name, starting: compiled.append(name) if starting
                                  else None):
        first = builds()
        for build in first:
            assert build(np.arange(3.0), 2.0).tolist() == [0.0, 2.0, 4.0]
        assert compiled.count(f"{__name__}:_body") == 2  # not the other's entry
        compiled.clear()
        again = builds()
        for build in reversed(again):
            assert build(np.arange(3.0), 2.0).tolist() == [0.0, 2.0, 4.0]
    assert compiled == []
    assert [sum(b.stats.cache_hits.values()) for b in again] == [1, 1]
