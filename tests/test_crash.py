"""The crash suite (issue 13): ``train`` killed with SIGKILL at chosen moments, then run with
``--resume``, ends with the files of an uninterrupted run, byte for byte: every checkpoint
(values, updater state, versions, step), every SINGA checkpoint, ``metrics.csv``; and no
temporary file of the killed writes is left (row 14).

Kills are aimed by :mod:`paramserver.faults`' markers (the phases of every file write, every
step), not by timers: each trial kills a real process at a known moment. The harness is
``benchmarks/crash_resume.py``, which runs many more trials at random moments.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import crash_resume as cr  # noqa: E402


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> cr.Harness:
    h = cr.Harness(tmp_path_factory.mktemp("crash"), steps=30)
    h.make_reference()
    return h


def moment(h: cr.Harness, event: str, name: str, nth: int = 1) -> cr.Moment:
    """The ``nth`` marker ``event`` about a file named ``name`` (or step ``name``)."""
    found = [m for m in h.moments if m.event == event and Path(m.what).name == name]
    return found[nth - 1]


def check(t: cr.Trial) -> None:
    assert not t.differences, "\n".join(t.differences)


def test_the_moments_of_a_run(harness: cr.Harness) -> None:
    events = [m.event for m in harness.moments]
    assert events.count("step") == 30
    # metrics.csv after every chunk; checkpoints at 10, 20 and 30, each ours then SINGA's
    names = [Path(m.what).name for m in harness.moments if m.event == "write.done"]
    checkpoints = [n for n in names if "-worker" in n or ".ckpt." in n]
    assert checkpoints == ["step-00000010.ckpt.safetensors", "step10-worker0",
                           "step-00000020.ckpt.safetensors", "step20-worker0",
                           "step-00000030.ckpt.safetensors", "step30-worker0"]
    assert names[-1] == "metrics.png"


def test_a_killed_checkpoint_write_leaves_a_temporary_that_the_next_start_removes(
        harness: cr.Harness) -> None:
    left: list[str] = []

    def killed(ws: Path) -> None:
        left.extend(p.name for p in (ws / "checkpoints").iterdir())

    t = harness.trial(1, moment(harness, "write.sync", "step-00000020.ckpt.safetensors"),
                      killed=killed)
    check(t)
    temporaries = [n for n in left if n.endswith(".tmp")]
    assert len(temporaries) == 1 and temporaries[0].startswith(
        ".step-00000020.ckpt.safetensors."), left
    assert "step-00000020.ckpt.safetensors" not in left  # the previous one stays the newest


@pytest.mark.parametrize(("event", "name", "again"), [
    # between our checkpoint and SINGA's: the resume goes on from ours, writes SINGA's
    ("write.done", "step-00000020.ckpt.safetensors", None),
    # just after a checkpoint, with its TensorBoard events (issue 26: a histogram was lost)
    ("write.done", "step10-worker0", None),
    # in the middle of a chunk; the resume is killed too, after its 7th step (step 17)
    ("step", "14", "step:7"),
    # at the very end, the plot being written: the resume has nothing to do but the plot
    ("write.data", "metrics.png", None),
])
def test_killed_runs_resume_to_the_files_of_an_uninterrupted_run(
        harness: cr.Harness, event: str, name: str, again: str | None) -> None:
    t = harness.trial(2, moment(harness, event, name), [again] if again else [])
    check(t)
    assert len(t.kills) == 1 + (again is not None)


def test_a_seeded_random_kill(harness: cr.Harness) -> None:
    rng = random.Random(13)
    t = harness.trial(3, cr.choose(harness.moments, rng, aimed=False))
    check(t)
