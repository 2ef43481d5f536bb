"""Reading a job file takes memory in proportion to the file (issue 30, item 4: a 16 MiB file
holding a long list took about 4 GB): for every shape of text an attacker could repeat, the
reader's peak stays within :data:`~paramserver.config.textformat.MEMORY_FACTOR` (20) times
the file's size, or the file is refused as denser than a job file can be.

The bound holds beyond :data:`~paramserver.config.textformat.MEMORY_FLOOR` (128 MiB, what any
real job fits in); here the floor is 0 and the lexer's chunk small, so that files of 32 KiB
show what 16 MiB files would (``benchmarks/parse_speed.py`` and the figures in docs/jobs.md
were taken at several MiB).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

import paramserver.config.textformat as textformat
from paramserver.config import ParamError
from paramserver.train.jobfile import read_job_file

HEAD = 'train_steps: 1\nneuralnet { layer { name: "data" type: kData } }\n'
SIZE = 32 * 1024
FIXED = "updater { learning_rate { type: kFixedStep fixedstep_conf { "

#: name -> (text before, unit repeated, text after)
SHAPES = {
    "a list of 1": (FIXED + "step: [", "1,", "1] } } }\n"),
    "a list of strings": ("zz: [", "'ab',", "'a']\n"),
    "a field repeated": (FIXED, "step: 1\n", "} } }\n"),
    "unknown fields": ("", "a:1\n", ""),
    "empty blocks": ("", "a{}", ""),
    "layers": ("neuralnet {", "layer{name:'a'type:kReLU}\n", "}\n"),
    "closing braces": ("", "}", ""),
    "a string of escapes": ("zz: '", "\\n", "'\n"),
}


def read(path: Path) -> None:
    try:
        read_job_file(path)
    except ParamError:
        pass


def peak_reading(path: Path) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        read(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("shape", list(SHAPES))
def test_reading_stays_within_twenty_times_the_file(tmp_path: Path, shape: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textformat, "MEMORY_FLOOR", 0)
    monkeypatch.setattr(textformat, "CHUNK", 1024)
    before, unit, after = SHAPES[shape]
    small, large = tmp_path / "small.conf", tmp_path / "large.conf"
    for path, size in ((small, 1024), (large, SIZE)):
        path.write_text(HEAD + before + unit * (size // len(unit)) + after)
    read(small)  # imports and registries of this shape
    base = peak_reading(small)
    peak = peak_reading(large)
    grown = large.stat().st_size - small.stat().st_size
    assert peak - base <= textformat.MEMORY_FACTOR * grown, (peak - base) / grown
