"""One exception family: every error paramserver raises for a user is a paramserver.Error.

Two checks: every exception class the package defines descends from ``paramserver.Error``
(and the kinds keep their Python bases: ``ParamError`` a ``ValueError``, ``ClusterError`` a
``RuntimeError``); and no module raises a bare built-in error where a user could see it —
only the protocol errors Python itself expects (``AttributeError`` from ``__getattr__``,
``ImportError`` for a missing optional package, ``NotImplementedError`` from an abstract
method).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import paramserver
from paramserver import CheckpointError, ClusterError, Error, ParamError
from paramserver.numerics import kernels

SRC = Path(paramserver.__file__).parent
#: Built-in exceptions raised as part of a Python protocol, not as an error report (and
#: AssertionError: a line that cannot be reached unless paramserver has a bug;
#: KeyboardInterrupt: a run stopping where the user's Ctrl-C asked it to).
PROTOCOL = {"AttributeError", "ImportError", "NotImplementedError", "StopIteration",
            "AssertionError", "KeyboardInterrupt"}
#: (module, function): a built-in error that never leaves the package (its caller catches).
INTERNAL = {("config/components.py", "_dynamic_field"),
            ("config/parameter.py", "_dynamic_field"),
            ("checkpoint.py", "_read_safetensors"),
            ("cluster/node_link.py", "_read")}
BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}


def modules() -> list[str]:
    names = ["paramserver"]
    for info in pkgutil.walk_packages(paramserver.__path__, "paramserver."):
        if info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_the_kinds_keep_their_python_bases() -> None:
    assert issubclass(ParamError, Error) and issubclass(ParamError, ValueError)
    assert issubclass(ClusterError, Error) and issubclass(ClusterError, RuntimeError)
    assert issubclass(CheckpointError, ParamError)
    assert paramserver.Error is Error and "Error" in paramserver.__all__


def test_every_exception_class_of_the_package_is_an_error() -> None:
    found = []
    for name in modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional layer not installed (torch, ray)
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == name and issubclass(obj, BaseException):
                found.append(obj)
    assert {c.__name__ for c in found} >= {"ParamError", "ClusterError", "CheckpointError",
                                           "ServerLost"}
    assert [c for c in found if not issubclass(c, Error)] == []


class _Raises(ast.NodeVisitor):
    """Every ``raise`` of a built-in error, with the function it is in."""

    def __init__(self) -> None:
        self.where = ["<module>"]
        self.found: list[tuple[str, int, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Raise(self, node: ast.Raise) -> None:
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(target, ast.Name) and target.id in BUILTIN_ERRORS:
            self.found.append((self.where[-1], node.lineno, target.id))


def test_no_module_raises_a_bare_builtin_error() -> None:
    bare = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        visitor = _Raises()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        bare += [f"{rel}:{line} ({where}) raises {name}" for where, line, name in visitor.found
                 if name not in PROTOCOL and (rel, where) not in INTERNAL]
    assert bare == []


@pytest.mark.parametrize("call", [
    lambda: kernels.sgd(np.zeros(3, np.float32), np.zeros(3), np.zeros(0, np.float32),
                        [0, 3], 0.1),
    lambda: kernels.sgd(np.zeros(3, np.float32), np.zeros(3, np.float32),
                        np.zeros(0, np.float32), [0, 2], 0.1),
    lambda: kernels.adam(np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), [0, 3], 0.1,
                         step=0),
], ids=["dtype", "offsets", "step"])
def test_the_kernels_raise_a_param_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError):
        call()
