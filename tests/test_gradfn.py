"""A worker's gradient function built ahead of its first run (GradFnCache.build_ahead): what
a Ray worker actor does while it starts, so that the first steps do not wait for it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from paramserver.cluster.gradfn import GradFnCache, RemoteGradFn

#: What the factories below saw, and what lets a build finish (set per test).
CALLS: list[str] = []
GO = threading.Event()


def slow_factory(tag: str) -> Any:
    GO.wait()
    CALLS.append(tag)
    return lambda worker, step: {"tag": tag}


def failing_factory() -> Any:
    CALLS.append("failed")
    raise RuntimeError("no net here")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    GO.clear()


def test_built_ahead_once_and_the_run_waits_for_it() -> None:
    fns = GradFnCache()
    data = RemoteGradFn(f"{__name__}:slow_factory", {"tag": "a"}).to_data()
    fns.build_ahead(data)  # returns while the build waits
    assert CALLS == []
    GO.set()
    fn = fns.get(data)  # waits for the build, does not build again
    assert fn(None, 0) == {"tag": "a"}
    assert fns.get(data) is fn
    assert CALLS == ["a"]


def test_a_build_that_failed_ahead_fails_in_the_run() -> None:
    fns = GradFnCache()
    data = RemoteGradFn(f"{__name__}:failing_factory").to_data()
    fns.build_ahead(data)
    with pytest.raises(RuntimeError, match="no net here"):
        fns.get(data)
    assert CALLS == ["failed", "failed"]  # built again by the run, which reports it


def test_other_arguments_are_built_anew() -> None:
    GO.set()
    fns = GradFnCache()
    fns.build_ahead(RemoteGradFn(f"{__name__}:slow_factory", {"tag": "a"}).to_data())
    fn = fns.get(RemoteGradFn(f"{__name__}:slow_factory", {"tag": "b"}))
    assert fn(None, 0) == {"tag": "b"}
    assert CALLS == ["a", "b"]
