"""Reading a job file is linear and cheap per value (issue 13, row 13: a 1 MB list took 11 s).

Time is not asserted (tests are deterministic); the work is: the number of Python function
calls the reader makes, counted by a profiler hook, grows in proportion to the list and stays
a small constant per value. (Calls of built-in functions are not counted: the interpreter
reports them or not depending on its specialisation of the code.)
``benchmarks/parse_speed.py`` measures the speed itself.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest

from paramserver.config import ParamError
from paramserver.config.job import parse_job
from paramserver.config.textformat import MAX_PROBLEMS, parse_text


def job_with_lists(n: int, separator: str = ", ") -> str:
    steps = separator.join(str(i) for i in range(n))
    rates = separator.join(f"{1 / (i + 1):.6g}" for i in range(n))
    return ("train_steps: 1\nupdater { learning_rate { type: kFixedStep fixedstep_conf {\n"
            f"  step: [{steps}]\n  step_lr: [{rates}]\n}} }} }}\nneuralnet {{ }}\n")


def calls(fn: Any, *args: Any) -> int:
    count = 0

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(hook)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return count


def test_a_long_list_reads_in_linear_work() -> None:
    small, large = job_with_lists(1000), job_with_lists(8000)
    parse_job(small)  # imports and registries loaded before counting
    a, b = calls(parse_job, small), calls(parse_job, large)
    assert b < 8.2 * a  # linear: 8 times the values, 8 times the work
    assert (b - a) / (2 * 7000) < 8  # Python calls per value (36 before)


def test_a_list_over_many_lines_reads_in_linear_work() -> None:
    small, large = job_with_lists(1000, ",\n  "), job_with_lists(8000, ",\n  ")
    parse_text(small)
    a, b = calls(parse_text, small), calls(parse_text, large)
    assert b < 8.2 * a


def test_long_list_values_and_places() -> None:
    job = parse_job(job_with_lists(5000), "big.conf")
    own = job.updater.learning_rate.own
    assert own.step == list(range(5000)) and own.step_lr[3] == 0.25
    block = parse_text(job_with_lists(3, ",\n  "), "f.conf")
    conf = block.entries[1].value.entries[0].value.entries[1].value  # type: ignore[union-attr]
    steps = conf.entries[0].value  # type: ignore[union-attr]
    assert [str(v.where) for v in steps.items] == ["f.conf:3:10", "f.conf:4:3", "f.conf:5:3"]


def test_a_broken_long_list_reports_a_bounded_number_of_problems() -> None:
    # The list loses its '[': each of its 3000 values would be a problem of its own.
    text = "step_lr: 1, " + ", ".join(str(i) for i in range(3000)) + "\n"
    with pytest.raises(ParamError) as e:
        parse_text(text, "f.conf")
    problems = e.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].message == "... and 2,950 more problems after this place"
    assert str(problems[0]).startswith("f.conf:1:13: expected a field name, found '0'")


def test_a_long_list_of_bad_values_reports_a_bounded_number_of_problems() -> None:
    text = job_with_lists(3).replace("step: [0, 1, 2]", "step: [" + ", ".join(
        f"x{i}" for i in range(1000)) + "]")
    with pytest.raises(ParamError) as e:
        parse_job(text, "f.conf")
    messages = [p.message for p in e.value.problems]
    assert len(messages) == 21
    assert messages[0] == "Invalid Parameter format for step expect int but value='x0'"
    assert messages[-1] == "... and 980 more bad values of step"


def test_the_garbage_collector_is_paused_only_while_reading() -> None:
    import gc

    assert gc.isenabled()
    parse_job(job_with_lists(10))
    with pytest.raises(ParamError):
        parse_job("train_steps: [")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_job(job_with_lists(10))
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
