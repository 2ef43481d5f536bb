"""The NumPy forms of the uniform fill and of the float-state update give what the compiled
kernels give, bit for bit, and a small SINGA job runs without loading numba's compiler."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from paramserver.numerics import forms, quant, rng, rng_arrays, rng_kernels, small_updates
from paramserver.numerics import kernels as K

ROOT = Path(__file__).resolve().parents[1]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_numpy_uniform_fill_is_the_compiled_one(dtype: type) -> None:
    key = rng.param_key(5, "w")
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    bounds = [(-1.0, 1.0), (-0.05, 0.05), (0.0, 1e-30), (2.5, 2.5), (-3e38, 3e38), (1.0, 1.0000003)]
    sizes = [1, 3, 7, 1000, 70_001]
    offsets = [0, 1, 2, 3, 5, 65_535, (1 << 33) + 3]
    for (low, high), n, offset in zip(bounds * 6, sizes * 7, offsets * 5):
        prm = rng._uniform_prm(np.dtype(dtype), low, high)
        compiled = np.full(n, np.nan, dtype)
        rng_kernels.run(compiled, offset, k0, k1, rng_kernels.UNIFORM, prm)
        mine = np.full(n, np.nan, dtype)
        rng_arrays.uniform(mine, offset, int(k0), int(k1), prm)
        assert np.array_equal(_bits(mine), _bits(compiled)), (low, high, n, offset)


def test_philox_blocks_match_the_compiled_generator() -> None:
    words = rng_arrays.philox_blocks((1 << 32) - 2, 5, 0x12345678, 0x9ABCDEF0)
    for i, j in enumerate(range((1 << 32) - 2, (1 << 32) + 3)):
        c = np.uint64(j)
        expected = rng_kernels._philox_block(c & np.uint64(0xFFFFFFFF), c >> np.uint64(32),
                                             np.uint64(0), np.uint64(0),
                                             np.uint64(0x12345678), np.uint64(0x9ABCDEF0))
        assert tuple(int(x) for x in words[i]) == tuple(int(x) for x in expected)


def _case(rule: str, dtype: type, seed: int) -> dict:
    r = np.random.default_rng(seed)
    n = 3000
    offsets = np.array([0, 700, 700, 1500, 2999, n], np.int64)
    nseg = offsets.size - 1
    g = r.standard_normal(n).astype(dtype)
    g[[3, 900, 2999]] = (np.nan, np.inf, -np.inf)
    w = r.standard_normal(n).astype(dtype)
    states = []
    for signed in quant.SIGNED_STATE[rule]:
        s = r.standard_normal(n).astype(dtype)
        states.append(s if signed else np.abs(s))
    seg = np.zeros((3 + K._NUM_COEFS, nseg), dtype)
    seg[0] = r.uniform(0.5, 2.0, nseg)  # gscale
    seg[1] = (0.0, 1e-3, 0.0, 5e-4, 0.1)  # wd: some segments without
    seg[2:2 + K._NUM_COEFS] = r.uniform(0.01, 0.9, (K._NUM_COEFS, nseg))
    seg[K._SKIP, 2] = 1  # one segment passed over
    hyp = np.zeros(2 + K._NUM_PARAMS, dtype)
    hyp[:2] = (-0.8, 0.9)
    hyp[2:] = r.uniform(0.1, 0.99, K._NUM_PARAMS)
    return {"w": w, "g": g, "states": states, "offsets": offsets, "seg": seg, "hyp": hyp}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rule", sorted(small_updates.ARRAY_RULES))
def test_the_numpy_update_is_the_compiled_kernel(rule: str, dtype: type) -> None:
    """Every rule that runs on arrays, over segments with and without weight decay, one
    skipped and one empty, a gradient with NaN and Inf, without the clip and with it at each
    of its three places, and with the read-only check."""
    for clip_at in (K.CLIP_GRADIENT, K.CLIP_SCALED, K.CLIP_DECAYED):
        for clip, check in ((False, False), (True, False), (True, True)):
            case = _case(rule, dtype, seed=clip_at * 4 + 2 * clip + check)
            codes = ("float",) * len(case["states"])
            kernel = K.kernel_for(rule, codes, parallel=False, clip_at=clip_at)
            w0 = case["w"].copy()
            ours = {k: [a.copy() for a in v] if k == "states" else v.copy()
                    for k, v in case.items()}
            st = case["states"] + [case["w"][:0]] * (3 - len(case["states"]))
            none = np.zeros(0, np.float32)
            found = kernel(case["w"], case["w"][:0], K.read_only(case["g"]), *st, none, none,
                           none, case["offsets"], np.zeros(0, np.int64), case["seg"],
                           case["hyp"], clip, check)
            mine = small_updates.update(K._RULES[rule], ours["w"], ours["g"], ours["states"],
                                        ours["offsets"], ours["seg"], ours["hyp"], clip,
                                        check, clip_at, K._SKIP)
            assert mine == found
            for a, b in zip([ours["w"], *ours["states"]], [case["w"], *case["states"]]):
                same = (_bits(a) == _bits(b)) | (np.isnan(a) & np.isnan(b))  # NaN's payload
                assert same.all(), (rule, clip_at, clip, check, np.flatnonzero(~same)[:5])
            # the skipped segment is left alone; with the check (the gradient holds NaN)
            # nothing is written; else the others moved
            assert np.array_equal(_bits(ours["w"][700:1500]), _bits(w0[700:1500]))
            moved = ~np.equal(_bits(ours["w"]), _bits(w0))
            assert not moved.any() if check else moved[:700].any() and moved[1500:].any()


def test_the_public_kernels_take_the_numpy_form_for_small_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``kernels.adam``: a small call and the same call compiled write the same
    values; once a compiled kernel has been loaded, every call takes the compiled kernels; a
    bfloat16 state, a master copy, a rule with branches, a large call never take NumPy."""
    monkeypatch.setattr(forms, "_compiler_loaded", False)  # as in a process that loaded none
    calls = []
    real = small_updates.update
    monkeypatch.setattr(small_updates, "update", lambda *a: calls.append(1) or real(*a))
    r = np.random.default_rng(3)
    w0, g = r.standard_normal((2, 5000)).astype(np.float32)
    offsets = np.array([0, 2000, 5000])

    def run() -> tuple[np.ndarray, ...]:
        w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
        for t in (1, 2, 3):
            K.adam(w, g, m, v, offsets, lr=1e-3, wd=(0.0, 0.01), step=t)
        return w, m, v

    small = run()
    assert calls == [1, 1, 1]
    with forms.compiled_only():
        compiled = run()
    assert calls == [1, 1, 1]
    monkeypatch.setattr(forms, "_compiler_loaded", False)  # those compiled calls loaded it
    for a, b in zip(small, compiled):
        assert np.array_equal(_bits(a), _bits(b))
    assert small_updates.applies("adam", 10, 1, ("float", "float"), False)
    assert not small_updates.applies("adam", 10, 1, ("bfloat16", "bfloat16"), False)
    assert not small_updates.applies("adam", 10, 1, ("float", "float"), True)  # master
    assert not small_updates.applies("amsgrad", 10, 1, ("float",) * 3, False)
    assert not small_updates.applies("adam", small_updates.SMALL_UPDATE + 1, 1,
                                     ("float", "float"), False)
    assert not small_updates.applies("adam", 10, small_updates.MOST_SEGMENTS + 1,
                                     ("float", "float"), False)
    forms.note_compiler()  # a compiled kernel loaded: the compiled kernels from then on
    assert not small_updates.applies("adam", 10, 1, ("float", "float"), False)
    assert run()[0].tobytes() == small[0].tobytes()
    assert calls == [1, 1, 1]


PROBE = """
import sys
from paramserver.cli import main
code = main(sys.argv[1:])
print("LOADED", sorted(m for m in ("numba", "llvmlite") if m in sys.modules))
sys.exit(code)
"""


def test_a_small_singa_job_never_imports_numba(tmp_path: Path) -> None:
    """SINGA's LeNet job (uniform and constant fills, SINGA's momentum) trains and tests
    without importing numba: nothing is compiled or loaded, and numba's import (55 MB) and
    compiler (85 MB more) are never paid (docs/singa.md)."""
    pytest.importorskip("torch")
    from paramserver.singa.datasets import write_dataset

    for split in ("train", "test"):
        write_dataset("digits", str(tmp_path / f"examples/mnist/{split}_data.bin"), fmt="kvfile",
                      split=split, shape=(28, 28))
    job = tmp_path / "conv.conf"
    job.write_text((ROOT / "examples" / "singa" / "mnist" / "conv.conf").read_text())
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), "train", str(job), "--steps", "4",
         "--quiet", "--no-tensorboard", "--set", "test_freq=2", "--set", "test_steps=1",
         "--set", "checkpoint_freq=0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout[-2000:]


def test_the_first_compiled_kernel_ends_the_numpy_forms() -> None:
    """In a fresh process: small calls take the NumPy forms until a compiled kernel (here a
    normal fill's) is loaded; from then on, the compiled kernels."""
    code = ("import numpy as np\nfrom paramserver.numerics import forms, rng\n"
            "a = np.empty(100, np.float32)\n"
            "rng.fill_uniform(a, 1)\nprint(forms.numpy_allowed())\n"
            "rng.fill_normal(a, 2)\nprint(forms.numpy_allowed())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False"]
