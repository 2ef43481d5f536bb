"""Fuzzing job files (issue 13): whatever the text, reading and checking it raises nothing but
ParamError, and does a bounded amount of work.

Two sources of texts, derandomized so that every run sees the same ones: job files written
by a grammar of the text format over the job schema's names and awkward values, and byte
mutations of the example job files, each given to ``paramserver check`` (its ``main``, in
this process): it must exit 0 or 2 (a ParamError, printed without a traceback) and raise
nothing. Work is bounded by counting Python calls (``sys.settrace``), a deterministic
stand-in for time; a watchdog turns a hang into a failure rather than a stuck run.
``benchmarks/fuzz_jobs.py`` runs ten thousand mutants, and a few hundred through the CLI.
"""

from __future__ import annotations

import io
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramserver.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [p.read_bytes() for p in sorted((ROOT / "examples").glob("*.conf"))]
FUZZ = settings(derandomize=True, max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NAMES = ["train_steps", "disp_freq", "test_freq", "checkpoint_freq", "seed", "name",
         "neuralnet", "layer", "type", "srclayers", "param", "init", "share_from", "lr_scale",
         "innerproduct_conf", "num_output", "data_conf", "source", "batchsize", "updater",
         "momentum", "weight_decay", "delta", "learning_rate", "base_lr", "step_conf",
         "change_freq", "gamma", "fixedstep_conf", "step", "step_lr", "cluster",
         "nworker_groups", "nservers_per_group", "staleness", "std", "value", "clip_low",
         "user_type", "exclude", "rho", "rmsprop_conf", "momentun"]
WORDS = ["kSGD", "kSGDD", "kAdam", "kRMSProp", "kStep", "kFixedStep", "kInnerProduct", "kData",
         "kSoftmaxLoss", "kSTanh", "kReLU", "kDropout", "kGaussian", "kConstant", "kTrain",
         "true", "false", "t", "nan", "-inf", "inf", "1e999", "1e-500", "0x10", "010", "None",
         "2147483648", "9223372036854775808", "-1", "0", "1", "0.5", "1.5", "1,2", "(3)"]

scalars = st.one_of(
    st.sampled_from(WORDS),
    st.integers(-10, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=8).map(lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'),
    st.sampled_from(['"digits"', '"data"', '"fc1"', '"w1"', "'x'", '"', "'"]),
)


def _entries(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    key = st.sampled_from(NAMES)
    field = st.one_of(
        st.tuples(key, scalars).map(lambda kv: f"{kv[0]}: {kv[1]}"),
        st.tuples(key, st.lists(scalars, max_size=5)).map(
            lambda kv: f"{kv[0]}: [{', '.join(kv[1])}]"),
        st.tuples(key, children).map(lambda kv: f"{kv[0]} {{ {kv[1]} }}"),
        st.sampled_from(["#", "}", "{", "]", ";", ",", ":", "[ext] { x: 1 }", "<", ">"]),
    )
    return st.lists(field, max_size=6).map(lambda fs: "\n".join(fs))


job_texts = st.recursive(st.just(""), _entries, max_leaves=40).map(
    lambda body: "train_steps: 3\nneuralnet { layer { name: \"data\" type: kData } }\n" + body)


@st.composite
def mutants(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from(EXAMPLES)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        kind = draw(st.integers(0, 3))
        if kind == 0 and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == 1:
            data[pos:pos] = draw(st.one_of(st.binary(max_size=8),
                                           st.sampled_from(WORDS).map(str.encode)))
        elif kind == 2:
            del data[pos:pos + draw(st.integers(1, 30))]
        else:
            data[pos:pos] = data[pos:pos + draw(st.integers(1, 80))] * draw(st.integers(1, 5))
    return bytes(data)


class WorkLimit(Exception):
    pass


@contextmanager
def bounded(calls: int, seconds: float = 60.0) -> Iterator[None]:
    """Fail past ``calls`` Python calls, or (a hang) past ``seconds``."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        count += 1
        if count > calls:
            raise WorkLimit(f"more than {calls} Python calls")

    def alarm(signum: int, frame: Any) -> None:
        raise WorkLimit(f"still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz")
    (path / "warm.conf").write_bytes(EXAMPLES[0])
    with redirect_stdout(io.StringIO()):  # modules, registries and the data set, once
        assert main(["check", str(path / "warm.conf")]) == 0
    return path


def check(data: bytes, folder: Path) -> None:
    """``paramserver check`` of a file holding ``data``: it exits 0 or 2 (a ParamError,
    printed without a traceback) and raises nothing."""
    path = folder / "fuzz.conf"
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with bounded(calls=100 * len(data) + 100_000), redirect_stdout(out), redirect_stderr(err):
        code = main(["check", str(path)])
    assert code in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    assert code == 0 or err.getvalue().startswith("paramserver check: error: ")


@FUZZ
@given(text=job_texts)
def test_grammar_generated_jobs(folder: Path, text: str) -> None:
    check(text.encode(), folder)


@FUZZ
@given(data=mutants())
def test_mutated_examples(folder: Path, data: bytes) -> None:
    check(data, folder)


def test_the_examples_check_within_the_bound(folder: Path) -> None:
    for data in EXAMPLES:
        check(data, folder)
