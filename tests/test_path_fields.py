"""Paths as a user writes them, in fresh processes of the command (issue 38, item 8):

- a NUL byte, written as the text format's ``\\000`` or ``\\x00`` escape, in any path field of
  a job file or of a ``--set`` value is a user error at its place (``file:line:column`` or the
  ``--set``), exit 2, from ``check``, ``check --data`` and ``train`` alike, and nothing is
  written -- not Python's ``ValueError: embedded null byte`` from deep inside;
- a file name holding a terminal's escape sequence (or any character that does not print) is
  shown escaped in every message, as a name that is not UTF-8 already was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"
CIFAR = ROOT / "examples" / "singa" / "cifar10" / "job.conf"
NUL = r"a\000b"  # as the job file's text writes it
NUL_HEX = r"a\x00b"
COMMANDS = (["check"], ["check", "--data"], ["train", "--steps", "1"])
MESSAGE = "a path cannot hold a NUL byte"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _start(cwd: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "paramserver", *argv], cwd=cwd,
                            env=_env(cwd.parent / "home"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = process.communicate(timeout=600)
    return process.returncode, err


def _mlp(old: str, new: str) -> Callable[[str], str]:
    """The example job with ``old`` replaced by ``new``, ``{}`` in it by the path given."""
    def make(value: str) -> str:
        text = MLP.read_text()
        assert text.count(old) == 1, old
        return text.replace(old, new.format(value))
    return make


def _cifar(old: str, new: str) -> Callable[[str], str]:
    """SINGA's cifar10 job (store_conf { path mean_file }), changed so."""
    def make(value: str) -> str:
        text = CIFAR.read_text()
        assert old in text, old
        return text.replace(old, new.format(value), 1)
    return make


_LOSS_LAYER = "layer {\n    name: \"loss\""

#: Every path field a job file has: the job with a path written in it, and the --set that
#: gives the field (of that job) a value.
FIELDS: dict[str, tuple[Callable[[str], str], str]] = {
    "data_conf source": (_mlp('source: "digits"', 'source: "{}"'),
                         "neuralnet.layer[data].data_conf.source"),
    "kFromFile path": (_mlp("init { type: kGaussian std: 0.01 }",
                            'init {{ type: kFromFile path: "{}" }}'),
                       "neuralnet.layer[fc2].param[w2].init.path"),
    "store_conf path": (_cifar('path: "examples/cifar10/train_data.bin"', 'path: "{}"'),
                        "neuralnet.layer[data].store_conf.path"),
    "store_conf mean_file": (_cifar('mean_file: "examples/cifar10/image_mean.bin"',
                                    'mean_file: "{}"'),
                             "neuralnet.layer[data].store_conf.mean_file"),
    "kCSVOutput path": (_mlp(_LOSS_LAYER, 'layer {{ name: "dump" type: kCSVOutput srclayers: '
                             '"fc2" store_conf {{ path: "{}" }} include: kTest }}\n  '
                             + _LOSS_LAYER.replace("{", "{{")),
                        "neuralnet.layer[dump].store_conf.path"),
    "checkpoint_path": (lambda v: MLP.read_text() + f'checkpoint_path: "{v}"\n',
                        "checkpoint_path"),
    "cluster workspace": (_mlp("nserver_groups: 1\n", 'nserver_groups: 1\n  workspace: "{}"\n'),
                          "cluster.workspace"),
    "workspace": (lambda v: MLP.read_text() + f'workspace: "{v}"\n', "workspace"),
}


def _refused(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and "embedded null byte" not in err, err
    # one line (two alike for a --set that changes a layer of each phase)
    assert len(set(err.strip().splitlines())) == 1, err
    for text in (MESSAGE, *expected):
        assert text in err, (text, err)
    assert "\x00" not in err  # shown escaped


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_nul_in_a_path_field_is_refused_at_its_place(tmp_path: Path, field: str) -> None:
    make, key = FIELDS[field]
    (tmp_path / "home").mkdir()
    cwd = tmp_path / "run"
    cwd.mkdir()
    text = make(NUL)
    (cwd / "job.conf").write_text(text)
    (cwd / "base.conf").write_text(make("ok"))
    before = text[:text.index(NUL)]
    line = before.count("\n") + 1
    row = before.rpartition("\n")[2]
    places = {f"job.conf:{line}:{row.rindex(key.rpartition('.')[2]) + 1}:",  # the key's
              f"job.conf:{line}:{len(row)}:"}  # the value's (an item of a list)
    setting = f'{key}="{NUL_HEX}"'
    runs = [(_start(cwd, *command[:1], "job.conf", *command[1:]), places)
            for command in COMMANDS]
    runs += [(_start(cwd, *command[:1], "base.conf", *command[1:], "--set", setting),
              {f"--set {setting}:"}) for command in COMMANDS]
    for process, place in runs:
        code, err = _finish(process)
        _refused(code, err)
        assert any(f"error: {p}" in err for p in place), (place, err)
    assert sorted(p.name for p in cwd.iterdir()) == ["base.conf", "job.conf"]  # no output


def test_a_nul_from_python_is_the_same_error() -> None:
    from paramserver.config import ParamError
    from paramserver.singa.confs import StoreConf

    with pytest.raises(ParamError, match=MESSAGE):
        StoreConf(path="out\x00.csv")


# -- names that do not print -----------------------------------------------------------------


ESCAPE = "\x1b]0;owned\x07\x1b[31m"  # sets the terminal's title, then turns it red


def test_a_file_name_with_escape_sequences_is_shown_escaped(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    cwd = tmp_path / "run"
    cwd.mkdir()
    shown = r"\x1b]0;owned\x07\x1b[31m"
    job = cwd / f"job{ESCAPE}.conf"
    job.write_text(MLP.read_text() + "bogus: 1\n")
    source = cwd / "job.conf"
    source.write_text(MLP.read_text().replace('source: "digits"',
                                              f'source: "data{ESCAPE}.npz"'))
    runs = [
        # an error placed in the job file: its name
        (_start(cwd, "check", job.name), 2, f"job{shown}.conf:61:1"),
        (_start(cwd, "check", f"missing{ESCAPE}.conf"), 2, f"missing{shown}.conf"),
        (_start(cwd, "check", "--data", "job.conf"), 2, f"data{shown}.npz"),
        # a run's own lines name its workspace
        (_start(cwd, "train", str(MLP), "--steps", "1", "--workspace", f"ws{ESCAPE}"), 0,
         f"ws{shown}/metrics.csv"),
    ]
    for process, code, expected in runs:
        out, err = process.communicate(timeout=600)
        assert process.returncode == code, err
        assert "\x1b" not in out + err and "\x07" not in out + err, (out + err)[-2000:]
        assert expected in out + err, (expected, out + err)
