"""Fuzzing the other readers (issue 30): mutants of data sources, model files, checkpoints and
SINGA's stores, checkpoints and mean files, read in this process, end in a value or a
ParamError (never another exception, never a hang); a few through the command line exit 0
or 2, without a traceback. ``benchmarks/fuzz_jobs.py --readers all`` runs ten thousand of
each (docs/cli.md quotes its figures); the mutations are its own
(``benchmarks/_fuzz_readers.py``), seeded, so that every run sees the same files.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _fuzz_readers as fr  # noqa: E402

MUTANTS = 150


@pytest.mark.parametrize("name", fr.READERS)
def test_mutants_are_read_or_refused(tmp_path: Path, name: str) -> None:
    reader = fr.readers()[name]
    for sub in ("seeds", "mutants", "scratch"):
        (tmp_path / sub).mkdir()
    seeds = reader.make_seeds(tmp_path / "seeds")
    for seed in seeds:
        assert fr.read_in_process(reader, seed, tmp_path / "scratch") == "ok", seed
    rng = random.Random(f"ci/{name}")
    outcomes = {"ok": 0, "refused": 0}
    for i in range(MUTANTS):
        path = fr.make_mutant(rng, reader, seeds, tmp_path / "mutants", i)
        outcome = fr.read_in_process(reader, path, tmp_path / "scratch")
        assert outcome in outcomes, (path, outcome)
        outcomes[outcome] += 1
    assert outcomes["refused"] > MUTANTS // 3  # the mutants reach the checks


@pytest.mark.parametrize("name", fr.READERS)
def test_a_mutant_through_the_command_line(tmp_path: Path, name: str) -> None:
    reader = fr.readers()[name]
    for sub in ("seeds", "mutants", "scratch"):
        (tmp_path / sub).mkdir()
    seeds = reader.make_seeds(tmp_path / "seeds")
    rng = random.Random(f"ci-cli/{name}")
    path = fr.make_mutant(rng, reader, seeds, tmp_path / "mutants", 0)
    assert fr.read_by_cli(reader, path, tmp_path / "scratch") in ("ok", "refused")
