"""Compiled kernels across fresh processes sharing one cache, as users run them (issue 25).

Everything a test in one process can see loads kernels inside that process; the crashes of
issue 25 needed a second process loading what a first one compiled. Here, with a fresh
``NUMBA_CACHE_DIR`` (``tests/kernel_suite.py`` lists the kernels and runs them):

- one process compiles the suite's kernels into an empty cache (loading none: its results
  are those of an uncached run), then two fresh processes load all of them, in opposite
  orders, compiling nothing: every result bit-identical, every process exits 0;
- four processes start at once on another empty cache, each compiling and saving kernels
  whose callees are cached functions of their own, in its own order; a fifth loads them;
- the two scripts of the issue (a PyTorch script with every torch-style optimizer and every
  ``state_dtype``; the README's Python example with every ``state_dtype``) run three times in
  a row in fresh processes.

The suite's ``ci`` set has every rule, codec, build and kind of kernel; every kernel of the
package (``--set all``) takes minutes to compile and is run by hand (docs/low_precision.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kernel_suite  # tests/kernel_suite.py

SUITE = Path(kernel_suite.__file__).resolve()


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_NUM_THREADS": "2",
            "PYTHONFAULTHANDLER": "1", **extra}


def _start(cache: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SUITE), *args], env=_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_text(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, f"exit {process.returncode}:\n{err[-3000:]}"
    return out.splitlines()[-1]


def _finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_finish_text(process))
    return result


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The suite compiled into an empty cache by one process: the cache, and the results."""
    cache = tmp_path_factory.mktemp("kernels")
    first = _finish(_start(cache, "--set", "ci"))
    assert first["hits"] == 0  # nothing loaded: the results of an uncached run
    assert first["misses"] > 0 and first["compiled"]
    return cache, first["results"]


def test_every_kernel_loads_in_fresh_processes_in_two_orders(
        compiled: tuple[Path, dict[str, str]]) -> None:
    cache, reference = compiled
    runs = [_start(cache, "--set", "ci"), _start(cache, "--set", "ci", "--reverse")]
    for loaded in map(_finish, runs):
        assert loaded["compiled"] == [] and loaded["misses"] == 0  # all from the cache
        assert loaded["hits"] > 0
        assert loaded["results"] == reference


def test_four_processes_compile_into_an_empty_cache_at_once(
        compiled: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    reference = {k: v for k, v in compiled[1].items() if k in kernel_suite.CONCURRENT}
    assert len(reference) == len(kernel_suite.CONCURRENT)
    runs = [_start(tmp_path, "--set", "concurrent", "--rotate", str(i)) for i in range(4)]
    for run in map(_finish, runs):
        assert run["results"] == reference
    again = _finish(_start(tmp_path, "--set", "concurrent", "--reverse"))
    assert again["compiled"] == [] and again["results"] == reference


def test_every_kernel_is_keyed_alike_in_every_process(tmp_path: Path) -> None:
    """Every kernel of the package (``--set all``), made but not compiled in two processes:
    numba keys their cache entries alike in both (a key that differs is never found: an
    intrinsic in an 8-bit kernel's closure made every 8-bit kernel of unsigned state compile
    in every process)."""
    from paramserver.numerics.kernels import _RULES

    runs = [_start(tmp_path, "--keys") for _ in range(2)]
    first, second = (json.loads(_finish_text(run)) for run in runs)
    assert first == second
    stateless = {"sgd", "signsgd"}  # MXNet's signSGD keeps no state either
    for rule in _RULES:  # each rule's 20 kernels (a rule without state: 4)
        made = [k for k in first if f"fused:_{rule}_kernel" in k]
        assert len(made) == (4 if rule in stateless else 20), rule


TORCH_SCRIPT = """
import hashlib, inspect, json, torch
import paramserver.torch as pst
from paramserver.numerics.quant import STATE_DTYPES

def run(make):
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 10)
    opt = make(m.parameters())
    for _ in range(3):
        opt.zero_grad(); m(torch.randn(8, 64)).sum().backward(); opt.step()
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())
                          ).hexdigest()

styles = [c for c in vars(pst).values() if inspect.isclass(c) and issubclass(c, pst.Optimizer)
          and c is not pst.Optimizer]
out = {c.__name__: run(lambda ps, c=c: c(ps, lr=1e-3)) for c in styles}
out["SGD momentum"] = run(lambda ps: pst.SGD(ps, lr=1e-3, momentum=0.9))
out["SGD nesterov"] = run(lambda ps: pst.SGD(ps, lr=1e-3, momentum=0.9, nesterov=True))
out["RMSprop momentum"] = run(lambda ps: pst.RMSprop(ps, lr=1e-3, momentum=0.9))
for dtype in STATE_DTYPES:
    text = f"type: kAdam state_dtype: {dtype} learning_rate {{ base_lr: 0.001 }}"
    out[dtype] = run(lambda ps: pst.Optimizer(ps, updater=text))
print(json.dumps(sorted(out.items())))
"""

README_SCRIPT = """
import hashlib, json
import paramserver as ps
from paramserver.numerics.quant import STATE_DTYPES

out = {}
for dtype in STATE_DTYPES:
    updater = ps.create_updater(
        f"type: kAdam state_dtype: {dtype} learning_rate {{ base_lr: 0.001 }}")
    params = ps.ParamSet([("w", (128, 64), {"init": {"type": "kGaussian", "std": 0.01}}),
                          ("b", (128,), {"lr_scale": 2.0})])
    ps.init_params(params, seed=0)
    for step in range(3):
        params.grads[:] = params.values * 0.5 + 0.01 * step
        updater.update_params(step=step, params=params)
    out[dtype] = hashlib.sha256(params.values.tobytes()).hexdigest()
print(json.dumps(sorted(out.items())))
"""


def test_the_issues_scripts_run_three_times_in_a_row(
        compiled: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """The scripts of issue 25, each three times in fresh processes, after another process
    filled the cache: each exits 0 with the same values every time."""
    seen: dict[str, list[Any]] = {"torch": [], "readme": []}
    for _ in range(3):
        for name, script in (("torch", TORCH_SCRIPT), ("readme", README_SCRIPT)):
            run = subprocess.run([sys.executable, "-c", script], env=_env(compiled[0]),
                                 capture_output=True, text=True, cwd=tmp_path, timeout=600)
            assert run.returncode == 0, f"{name}: exit {run.returncode}:\n{run.stderr[-3000:]}"
            seen[name].append(json.loads(run.stdout.splitlines()[-1]))
    for name, runs in seen.items():
        assert runs[0] == runs[1] == runs[2], name
    names = [k for k, _ in seen["torch"][0]]
    assert {"SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta", "bfloat16",
            "int8"} <= set(names)


def test_the_kernel_guard_knows_the_threading_layer_without_compiling(tmp_path: Path) -> None:
    """Under numba's workqueue layer (which aborts when two threads launch parallel kernels
    at once) the cluster serialises its launches; it learns the layer without compiling."""
    code = ("import sys\nfrom paramserver.cluster import passes\n"
            # before numba is loaded: the lock, and numba not loaded to ask the layer
            "assert passes.kernel_guard() is passes._launch_lock\n"
            "assert 'numba' not in sys.modules and passes._guarded is None\n"
            "from paramserver.numerics import cache, compile_events  # numba: the layer\n"
            "compiled = []\n"
            "with compile_events.reporting(lambda n, s: compiled.append(n)):\n"
            "    assert passes.kernel_guard() is passes._launch_lock\n"
            "assert compiled == [] and passes._guarded is True, compiled\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(tmp_path, NUMBA_THREADING_LAYER="workqueue"), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
