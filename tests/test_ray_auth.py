"""Ray's token as paramserver handles it (no Ray needed): ``paramserver ray-token`` makes it
where Ray reads it, readable by its owner only, and makes an existing one private; a
refused join says what is true here, in one line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from paramserver.cli import main
from paramserver.cluster.ray_auth import join_error, make_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ray_token_makes_a_private_token_once(home: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ray-token"]) == 0
    out = capsys.readouterr()
    token = home / ".ray" / "auth_token"
    assert out.out == f"{token}\n"
    assert "a new token, readable by you only (0600)" in out.err
    assert mode(token) == 0o600 and mode(token.parent) == 0o700
    text = token.read_text()
    assert len(text) == 64 and int(text, 16) >= 0
    assert main(["ray-token"]) == 0  # kept as it is
    assert token.read_text() == text
    token.chmod(0o644)  # as Ray writes it under the usual umask
    assert main(["ray-token"]) == 0
    assert "was readable by others; it is now 0600" in capsys.readouterr().err
    assert mode(token) == 0o600 and token.read_text() == text


def test_the_token_goes_where_ray_reads_it(home: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / "cluster-a" / "token"))
    path, _ = make_token()
    assert path == home / "cluster-a" / "token" and mode(path) == 0o600
    monkeypatch.setenv("RAY_AUTH_TOKEN", "f" * 64)
    assert make_token()[0] is None  # the environment gives it: no file


def test_a_directory_where_the_token_goes_is_refused(home: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    (home / ".ray" / "auth_token").mkdir(parents=True)
    assert main(["ray-token"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith("not a file; Ray reads its token there (move it "
                                             "away, or set RAY_AUTH_TOKEN_PATH to another "
                                             "file)"), err


def test_a_refused_join_says_what_is_true_here(home: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    refused.__cause__ = RuntimeError("Unauthenticated: RPC error: InvalidAuthToken: "
                                     "Authentication token is missing or incorrect")
    assert str(join_error("h:6379", refused)) == (
        "cannot join the Ray cluster at h:6379: the cluster asks for a token and this process "
        f"sends none: set RAY_AUTH_MODE=token, with the cluster's token in {home}/.ray/"
        "auth_token (or RAY_AUTH_TOKEN)")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert str(join_error("h:6379", refused)) == (
        "cannot join the Ray cluster at h:6379: the cluster refused this process's token "
        f"(from {home}/.ray/auth_token): it is not the token the cluster was started with")
    missing = RuntimeError("Token authentication is enabled but no authentication token was "
                           "found")
    assert str(join_error("h:6379", missing)) == (
        "cannot join the Ray cluster at h:6379: RAY_AUTH_MODE=token here, and no token: "
        f"{home}/.ray/auth_token is missing (copy the cluster's token there, or set "
        "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)")
    nobody = ConnectionError("Could not find any running Ray instance. Please specify the one "
                             "to connect to.\nmore")
    assert str(join_error("h:6379", nobody)) == (
        "cannot join the Ray cluster at h:6379: Could not find any running Ray instance. "
        "Please specify the one to connect to")
