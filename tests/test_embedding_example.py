"""examples/embedding/train.py: the click-through model with large embedding tables learns
(its held-out log loss falls well below the base rate's) on the key-value API, with 2-bit
compression and error feedback too, and runs the same on Ray."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).parents[1] / "examples" / "embedding" / "train.py"
SMALL = ["--users", "5000", "--items", "2000", "--examples", "40000", "--batch", "512",
         "--disp", "40"]


def example() -> ModuleType:
    if "embedding_example" in sys.modules:
        return sys.modules["embedding_example"]
    spec = importlib.util.spec_from_file_location("embedding_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("compression", ["none", "2bit"])
def test_the_example_learns(compression: str, capsys: pytest.CaptureFixture[str]) -> None:
    got = example().main([*SMALL, "--steps", "120", "--compression", compression,
                          "--threshold", "0.002"])
    assert got["finite"] and got["last_loss"] < got["first_loss"] - 0.05
    assert got["test_loss"] < got["baseline_loss"] - (0.08 if compression == "none" else 0.05)
    assert "held-out log loss" in capsys.readouterr().out


def test_the_example_runs_on_ray(ray_session: Any) -> None:
    module = example()
    ray_session.cloudpickle.register_pickle_by_value(module)  # the actors cannot import it
    got = module.main([*SMALL, "--steps", "20", "--backend", "ray"])
    assert got["finite"] and got["last_loss"] < got["first_loss"]
