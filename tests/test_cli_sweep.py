"""Every command line a user can get wrong by leaving something out (issue 38): each command
with no arguments, with ``--help``, and with each of its options missing its value. A
mistake is a usage error — one ``error:`` line on stderr after the usage, exit status 2, no
traceback; ``--help`` exits 0. The commands' options are read from the parser itself, so an
option added later is swept too."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _valued_options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if a.option_strings and a.nargs != 0
            for o in a.option_strings]


#: Commands that do something useful with no arguments at all (``doc``: every component;
#: ``ray-token``: the token, made where Ray reads it -- here a folder of the test's own).
RUN_BARE = {"doc", "ray-token"}


def _cases() -> list[tuple[list[str], int]]:
    cases: list[tuple[list[str], int]] = []
    for name, parser in _commands().items():
        command = [name] if name else []
        cases.append((command, 0 if name in RUN_BARE else 2))
        cases.append(([*command, "--help"], 0))
        cases += [([*command, option], 2) for option in _valued_options(parser)]
        # the value missing between other arguments: the next option is not taken for it
        cases += [([*command, option, "--help"], 2) for option in _valued_options(parser)
                  if option not in ("-h", "--help")]
    return cases


def test_the_sweep_covers_every_command_and_option() -> None:
    commands = {argv[0] if argv and not argv[0].startswith("-") else "" for argv, _ in _cases()}
    assert commands == {"", "check", "doc", "train", "data", "export", "completion",
                        "ray-token"}
    argvs = [argv for argv, _ in _cases()]
    for option in ("--set", "-conf", "--steps", "--workspace", "--log-format", "--to",
                   "--shape", "--import"):
        assert any(option in argv for argv in argvs), option


@pytest.mark.parametrize(("argv", "expected"), _cases(), ids=lambda x: " ".join(x)
                         if isinstance(x, list) else str(x))
def test_a_command_line_left_short(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                   expected: int) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path.parent / f"{tmp_path.name}-home"  # what a command writes there is its job
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / ".ray" / "auth_token"))
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors and --help exit from main
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    assert code == expected, (out, err)
    assert "Traceback" not in err
    if expected == 2:
        lines = err.splitlines()
        assert out == "" and lines[0].startswith("usage: paramserver"), err
        assert lines[-1].startswith("paramserver") and ": error: " in lines[-1], err
    elif argv == ["ray-token"]:  # the token's path on stdout, what was made on stderr
        assert out.strip().endswith("auth_token") and "0600" in err, (out, err)
    else:
        assert out and err == ""
    assert os.listdir(tmp_path) == []  # nothing written by a mistake or by --help


@pytest.mark.parametrize("argv", [["train"], ["check"], ["check", "--json"],
                                  ["train", "--resume"], ["-resume"]])
def test_the_first_command_without_a_job_is_a_usage_error(tmp_path: Path,
                                                          argv: list[str]) -> None:
    """The first thing a new user types, in a fresh process as they type it: it was a
    ``TypeError`` traceback and exit status 1."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "paramserver", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("usage: paramserver train" if "check" not in argv
                                  else "usage: paramserver check")
    assert proc.stderr.splitlines()[-1].endswith(
        "error: the following arguments are required: JOB (or, as SINGA's command line "
        "gave it, -conf JOB)")
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == []
