"""The choice of numba's cache place (paramserver.numba_cache), in this process: where
numba finds none, a private folder, else a fresh one, else no cache. (tests/test_install.py
runs the real case: another user, no HOME, a read-only install.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from numba.core import config as numba_config

import paramserver.numba_cache as nc


@pytest.fixture
def no_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """numba would find no place: no NUMBA_CACHE_DIR, nothing writable but tmp_path."""
    monkeypatch.setattr(numba_config, "CACHE_DIR", "")
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    monkeypatch.setattr(nc, "_numba_has_a_place", lambda source_dir: False)
    monkeypatch.setattr(nc.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(nc, "CACHE_DIR", nc.CACHE_DIR)
    monkeypatch.setattr(nc, "_CACHING", nc._CACHING)
    return tmp_path


def test_a_private_folder_when_numba_has_no_place(no_place: Path) -> None:
    folder = nc.configure()
    assert folder == str(no_place / f"paramserver-numba-{os.getuid()}")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert numba_config.CACHE_DIR == folder and os.environ["NUMBA_CACHE_DIR"] == folder
    assert nc.caching() and nc.CACHE_DIR == folder
    assert nc.configure() == folder  # used again on the next start


def test_a_folder_others_can_write_is_not_used(no_place: Path) -> None:
    planted = no_place / f"paramserver-numba-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # anyone could put a pickled index there
    folder = nc.configure()
    assert folder is not None and folder != str(planted)
    assert Path(folder).parent == no_place and stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_link_is_not_followed(no_place: Path, tmp_path_factory: pytest.TempPathFactory
                                ) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (no_place / f"paramserver-numba-{os.getuid()}").symlink_to(elsewhere)
    folder = nc.configure()
    assert folder is not None and Path(folder).parent == no_place
    assert not Path(folder).is_symlink()


def test_no_cache_when_no_folder_can_be_had(no_place: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nc, "_private_folder", lambda: None)
    assert nc.configure() is None
    assert not nc.caching() and nc.CACHE_DIR is None

    @nc.njit(cache=True)
    def twice(x: float) -> float:
        return 2 * x

    assert twice(2.0) == 4.0  # compiled, not cached: numba was not asked to
    assert type(twice._cache).__name__ == "NullCache"


def test_numbas_own_place_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numba_config, "CACHE_DIR", "")
    monkeypatch.setattr(nc, "CACHE_DIR", nc.CACHE_DIR)
    monkeypatch.setattr(nc, "_CACHING", nc._CACHING)
    monkeypatch.setattr(nc, "_numba_has_a_place", lambda source_dir: True)
    assert nc.configure() is None and nc.caching() and nc.CACHE_DIR is None
    assert numba_config.CACHE_DIR == ""


def test_usable_is_numbas_test(tmp_path: Path) -> None:
    assert nc._usable(tmp_path / "made" / "here")
    (tmp_path / "file").write_text("")
    assert not nc._usable(tmp_path / "file" / "below")
