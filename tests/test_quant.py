"""Low-precision updater state (``state_dtype``): the kernels' codecs against the NumPy
reference of :mod:`paramserver.numerics.quant`, bit for bit; every method's update with bfloat16 and
8-bit state against a float64 reference of the same quantisation; exact round trips through
checkpoints and bit-exact resumes; the configuration around it."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError, ParamSet, create_updater
from paramserver.config.components import updaters
from paramserver.numerics import kernels, quant
from paramserver.state import UpdaterState
from test_kernels import METHODS, reference_step

# Segments of odd lengths (partial blocks, an empty segment), all within one chunk (the
# serial kernels); TestParallel runs the parallel ones.
SIZES = [1, 7, 300, 0, 1000, 256, 513, 40]
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)
NSEG = len(SIZES)
N = int(OFFSETS[-1])

#: The kernel rule of each method of test_kernels.METHODS (which of its state may be < 0).
RULES = {"sgd_momentum": "momentum", "nesterov": "nesterov", "adagrad": "adagrad",
         "rmsprop": "rmsprop", "adadelta": "adadelta", "adam": "adam", "adamw": "adam",
         "adam_singa": "adam_inner_delta", "adamax": "adamax", "adamax_singa": "adamax"}


def spread(rng: np.random.Generator, n: int, signed: bool = True) -> np.ndarray:
    """float32 values over many binades, with zeros, exact halves and powers of two."""
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-40, 8, n)
    x[rng.random(n) < 0.05] = 0.0
    halves = rng.random(n) < 0.05  # exactly between two 3-bit grid points
    x[halves] = (1 + (2 * rng.integers(0, 8, halves.sum()) + 1) / 16) * 2.0 ** rng.integers(
        -20, 4, halves.sum())
    pow2 = rng.random(n) < 0.03
    x[pow2] = 2.0 ** rng.integers(-30, 4, pow2.sum())
    x = x.astype(np.float32)
    return x if signed else np.abs(x)


def state_of(kind: str, signs: tuple[bool, ...], n: int = N,
             offsets: np.ndarray = OFFSETS) -> list[Any]:
    if kind == "bfloat16":
        return [np.zeros(n, np.uint16) for _ in signs]
    nb = quant.num_blocks(offsets)
    return [(np.zeros(n, np.int8 if s else np.uint8), np.zeros(nb, np.float32)) for s in signs]


def decoded(kind: str, arr: Any, offsets: np.ndarray = OFFSETS) -> np.ndarray:
    if kind == "bfloat16":
        return quant.bf16_decode(arr)
    codes, scales = arr
    return quant.block_decode(codes, scales, offsets, quant.code_of(codes.dtype))


# ---------------------------------------------------------------------------------------------
# The codecs, bit for bit: AdaMax with beta1 = beta2 = 0 makes the new m exactly g and the
# new u exactly |g|, so the kernel encodes values chosen here.


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_encoding_is_the_reference_bit_for_bit(kind: str, stochastic: bool) -> None:
    rng = np.random.default_rng(zlib.crc32(f"encode {kind} {stochastic}".encode()))
    g = spread(rng, N)
    w = np.zeros(N, np.float32)
    m, u = state_of(kind, (True, False))
    counts = rng.integers(1, 1000, NSEG)
    with np.errstate(invalid="ignore", divide="ignore"):
        kernels.adamax(w, g, m, u, OFFSETS, 0.0, step=counts, beta1=0.0, beta2=0.0,
                       delta=1e-30, bias_correction=False, stochastic=stochastic)
    bits = [quant.random_bits(OFFSETS, counts, role) if stochastic else None for role in (0, 1)]
    if kind == "bfloat16":
        np.testing.assert_array_equal(m, quant.bf16_encode(g, bits[0]))
        # u = max(0 * u, |g|) + delta: |g| + 1e-30 in float32, which is |g| unless tiny.
        np.testing.assert_array_equal(u, quant.bf16_encode(np.abs(g) + np.float32(1e-30),
                                                           bits[1]))
        return
    codes, scales = quant.block_encode(g, OFFSETS, quant.SIGNED, bits[0])
    np.testing.assert_array_equal(m[1], scales)
    np.testing.assert_array_equal(m[0], codes)
    codes, scales = quant.block_encode(np.abs(g) + np.float32(1e-30), OFFSETS, quant.UNSIGNED,
                                       bits[1])
    np.testing.assert_array_equal(u[1], scales)
    np.testing.assert_array_equal(u[0], codes)


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_decoding_is_the_reference_bit_for_bit(kind: str) -> None:
    # Momentum with momentum 1 and lr 0 from w = 0: the new w is the decoded history; the
    # history is stored again unchanged (its blocks' largest codes kept their scale).
    rng = np.random.default_rng(zlib.crc32(f"decode {kind}".encode()))
    if kind == "bfloat16":
        h: Any = quant.bf16_encode(spread(rng, N))
    else:
        mags = rng.integers(0, quant.SIGNED.top + 1, N)  # the codes encoding writes
        codes = np.where(rng.random(N) < 0.5, mags, mags | 0x80).astype(np.uint8).view(np.int8)
        codes[quant.blocks_of(OFFSETS) != np.roll(quant.blocks_of(OFFSETS), 1)] = 120  # top
        scales = 2.0 ** rng.integers(-60, 60, quant.num_blocks(OFFSETS))
        h = (codes, scales.astype(np.float32))
    before = decoded(kind, h)
    w = np.zeros(N, np.float32)
    kernels.sgd(w, np.ones(N, np.float32), h, OFFSETS, 0.0, momentum=1.0)
    np.testing.assert_array_equal(w, before)  # 0 + -0.0 is 0.0: values, not bits
    np.testing.assert_array_equal(decoded(kind, h).view(np.uint32), before.view(np.uint32))


def test_the_codes() -> None:
    s, u = quant.SIGNED.magnitudes(), quant.UNSIGNED.magnitudes()
    assert s[0] == 0 and s[-1] == 1.0 and np.all(np.diff(s) > 0) and len(s) == 121
    assert s[1] == 1.125 * 2.0 ** -15  # the lowest binade starts at 2^-15 (its first point: 0)
    assert u[0] == 2.0 ** -31 and u[-1] == 1.0 and np.all(np.diff(u) > 0) and len(u) == 249
    # A value is its code's, times the scale: the smallest scale keeps every one normal.
    assert np.float32(u[0] * quant.SCALE_MIN) > 0
    assert quant.state_bytes("float32", 2) == 8 and quant.state_bytes("bfloat16", 2) == 4
    assert quant.state_bytes("int8", 2) == pytest.approx(2 + 8 / quant.BLOCK)


# ---------------------------------------------------------------------------------------------
# Every method's update against a float64 reference of the same quantisation: from the
# kernel's state (decoded exactly), the SPEC rule in float64, then the reference's rounding.
# The kernel computes in float32, so a value within a float32 rounding of a code boundary may
# take the neighbouring code: nearly all codes agree exactly, and the rest by one step.


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("name", list(RULES))
def test_update_matches_float64_reference(name: str, kind: str, stochastic: bool) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{name} {kind} {stochastic}".encode()))
    method = METHODS[name]
    signs = quant.SIGNED_STATE[RULES[name]]
    lr = rng.uniform(0.01, 0.2, NSEG) * (2.0 if name == "adadelta" else 1.0)
    wd = np.where(rng.random(NSEG) < 0.5, 0.0, rng.uniform(1e-3, 5e-2, NSEG))
    gscale = rng.choice([1.0, 0.5], NSEG)
    counts = rng.integers(0, 5, NSEG)
    w = rng.standard_normal(N).astype(np.float32)
    state = state_of(kind, signs)
    agree = total = 0
    for t in range(1, 5):
        g = (rng.standard_normal(N) * rng.choice([1e-3, 1.0], N)).astype(np.float32)
        counts = counts + 1
        s64 = {s: decoded(kind, a).astype(np.float64) for s, a in zip(method.states, state)}
        # What float32 arithmetic may be off by where the rule cancels (m = b1*m + (1-b1)*g
        # near 0): a few roundings of its inputs.
        noise = {s: 2.0 ** -20 * (np.abs(s64[s]) + np.abs(g) + np.square(g, dtype=np.float64))
                 for s in method.states}
        w64 = reference_step(name, w.astype(np.float64), g, s64, lr, wd, gscale, counts,
                             method.hp, (0.0, 0.0), OFFSETS)
        method.kernel(w, g, *state, OFFSETS, lr, wd, gscale, **method.hp,
                      **({"step": counts}), stochastic=stochastic)
        np.testing.assert_allclose(w, w64, rtol=2e-5, atol=2e-6, err_msg=f"{name} w, step {t}")
        for i, (s, a) in enumerate(zip(method.states, state)):
            bits = quant.random_bits(OFFSETS, counts, i) if stochastic else None
            got = decoded(kind, a).astype(np.float64)
            if kind == "bfloat16":
                want_codes = quant.bf16_encode(s64[s], bits)
                want = quant.bf16_decode(want_codes).astype(np.float64)
                step = np.abs(want) * 2.0 ** -7 + noise[s]
                agree += np.count_nonzero(a == want_codes)
            else:
                want_codes, want_scales = quant.block_encode(s64[s], OFFSETS,
                                                             quant.code_of(a[0].dtype), bits)
                want = quant.block_decode(want_codes, want_scales, OFFSETS,
                                          quant.code_of(a[0].dtype)).astype(np.float64)
                # One step of the grid; two where the block's scale itself differs (its
                # largest value within a float32 rounding of a power of two).
                scale = np.maximum(a[1], want_scales).astype(np.float64)[quant.blocks_of(OFFSETS)]
                step = 2 * (np.abs(want) * 2.0 ** -3 + scale * 2.0 ** -14) + noise[s]
                agree += np.count_nonzero(a[0] == want_codes)
            total += N
            bad = np.abs(got - want) > step
            assert not np.any(bad), (f"{name} {s}, step {t}", got[bad][:5], want[bad][:5],
                                     s64[s][bad][:5])
    assert agree >= 0.995 * total, f"{agree} of {total} codes as the reference's"


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_parallel_kernel_is_the_serial_one(kind: str) -> None:
    """Above one chunk the parallel kernel runs (work items moved to block boundaries): it
    gives the serial kernel's bits, segment for segment."""
    sizes = [kernels.CHUNK + 1000, 3, kernels.CHUNK - 100, 5000]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(offsets[-1])
    rng = np.random.default_rng(5)
    w = rng.standard_normal(n).astype(np.float32)
    par = state_of(kind, (True, False), n, offsets)
    w_par = w.copy()
    for t in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        kernels.adam(w_par, g, *par, offsets, 1e-2, step=t, stochastic=True)
        for i, (a, b) in enumerate(itertools.pairwise(offsets)):
            if t == 1:
                one = state_of(kind, (True, False), b - a, np.array([0, b - a]))
                if i == 0:
                    serial = []
                serial.append((w[a:b].copy(), one))
            ws, one = serial[i]
            # Each segment alone: one chunk or more, but the same rule and random bits.
            kernels.adam(ws, g[a:b], *one, np.array([0, b - a]), 1e-2, step=t, stochastic=True)
    for i, (a, b) in enumerate(itertools.pairwise(offsets)):
        ws, one = serial[i]
        np.testing.assert_array_equal(w_par[a:b], ws)
        for role in range(2):
            mine = par[role] if kind == "bfloat16" else par[role][0]
            theirs = one[role] if kind == "bfloat16" else one[role][0]
            np.testing.assert_array_equal(mine[a:b], theirs)
        if kind == "int8":
            first = quant.blocks_of(offsets)[a] if b > a else 0
            nb = -(-(b - a) // quant.BLOCK)
            for role in range(2):
                np.testing.assert_array_equal(par[role][1][first:first + nb], one[role][1])


# ---------------------------------------------------------------------------------------------
# Through the updaters: roles, checkpoints, resume.

CONFS: dict[str, dict[str, Any]] = {
    "momentum": {"type": "kSGD", "momentum": 0.9},
    "nesterov": {"type": "kNesterov", "momentum": 0.9},
    "adagrad": {"type": "kAdaGrad"},
    "rmsprop": {"type": "kRMSProp", "rho": 0.9},
    "adadelta": {"type": "kAdaDelta", "rho": 0.9, "delta": 1e-6},
    "adam": {"type": "kAdam"},
    "adamw": {"type": "kAdamW", "weight_decay": 0.01},
    "adamax": {"type": "kAdamMax"},
}
STATE_KINDS = [("bfloat16", False), ("bfloat16", True), ("int8", False), ("int8", True)]


def updater(method: str, kind: str, stochastic: bool = False) -> Any:
    return create_updater({**CONFS[method], "state_dtype": kind,
                           "stochastic_rounding": stochastic,
                           "learning_rate": {"base_lr": 0.01}})


def run(up: Any, state: UpdaterState, w: np.ndarray, steps: range, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for step in steps:
        g = rng.standard_normal(w.size).astype(np.float32)
        up.apply(step, w, g, state, rng.uniform(0.5, 2, state.num_segments), 1.0, 1.0)


@pytest.mark.parametrize("kind,stochastic", STATE_KINDS,
                         ids=[f"{k}-{'sr' if s else 'rne'}" for k, s in STATE_KINDS])
@pytest.mark.parametrize("method", list(CONFS))
def test_checkpoint_round_trip_is_exact_and_resume_bit_exact(method: str, kind: str,
                                                             stochastic: bool) -> None:
    names = [f"p{i}" for i in range(NSEG)]
    up = updater(method, kind, stochastic)
    state = up.init_state(OFFSETS, np.float32)
    for r in up.roles[1:]:
        if r.per == "element":
            assert state[r.name].dtype == {"bfloat16": np.uint16, "int8": (
                np.int8 if quant.SIGNED_STATE[up.kernel_rule][up.state_roles.index(r.name)]
                else np.uint8)}[kind]
    w = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    run(up, state, w, range(3), seed=1)
    saved, saved_w = state.export(names), w.copy()
    run(up, state, w, range(3, 7), seed=2)
    # A fresh updater and state, loaded from the export: the same bits from there on.
    up2 = updater(method, kind, stochastic)
    state2 = up2.init_state(OFFSETS, np.float32)
    state2.load(saved, names)
    assert all(np.array_equal(state2.segment(i)[k], saved[f"{n}/{k}"])
               for i, n in enumerate(names) for k in state2.names)
    w2 = saved_w.copy()
    run(up2, state2, w2, range(3, 7), seed=2)
    np.testing.assert_array_equal(w2, w)
    for k in state.names:
        np.testing.assert_array_equal(state2[k], state[k])


def test_update_of_a_param_alone_is_its_update_in_a_paramset() -> None:
    """Blocks and random bits are counted from each Param's start: updated alone or with
    others in one call, a Param gets the same bits."""
    specs = [("a", (3, 100)), ("b", (7,)), ("c", (600,))]
    together, alone = ParamSet(specs), ParamSet(specs)
    rng = np.random.default_rng(3)
    together.values[:] = alone.values[:] = rng.standard_normal(together.values.size)
    up = updater("adam", "int8", stochastic=True)
    for step in range(3):
        together.grads[:] = alone.grads[:] = rng.standard_normal(together.values.size)
        up.update_params(step, together)
        for p in alone.owners:
            up.update(step, p)
    np.testing.assert_array_equal(together.values, alone.values)
    for p, q in zip(together.owners, alone.owners):
        for k in ("m", "m_scale", "v", "v_scale", "count"):
            np.testing.assert_array_equal(p.updater_state[k], q.updater_state[k])


def test_state_is_smaller() -> None:
    up = {k: create_updater({"type": "kAdam", "state_dtype": k})
          for k in ("float32", "bfloat16", "int8")}
    nbytes = {k: sum(a.nbytes for n, a in u.init_state([0, 1 << 16], np.float32).arrays.items()
                     if n != "count") for k, u in up.items()}
    assert nbytes["float32"] == 8 << 16 and nbytes["bfloat16"] == 4 << 16
    assert nbytes["int8"] == (2 << 16) + 2 * 4 * (1 << 16) // quant.BLOCK


def test_decode_reads_any_state() -> None:
    up = updater("adam", "int8")
    state = up.init_state(OFFSETS, np.float32)
    w = np.zeros(N, np.float32)
    run(up, state, w, range(2), seed=4)
    m = quant.decode(state.arrays, "m", state.offsets)
    assert m.dtype == np.float32 and m.shape == (N,) and np.any(m < 0) and np.any(m > 0)
    f32 = create_updater({"type": "kAdam"}).init_state(OFFSETS, np.float32)
    assert quant.decode(f32.arrays, "m", f32.offsets) is f32["m"]


def test_configuration() -> None:
    with pytest.raises(ParamError, match=r"1:13: Invalid Input: 'float16', valid values are: "
                                         r"\{'bfloat16', 'float32', 'int8'\}"):
        create_updater("type: kAdam state_dtype: float16")
    up = create_updater("type: kAdam state_dtype: int8 stochastic_rounding: true")
    assert up.conf.state_dtype == "int8" and up.conf.stochastic_rounding
    with pytest.raises(ParamError, match="state_dtype int8 is for float32 Params"):
        up.init_state([0, 4], np.float64)
    # SGD without momentum keeps no state: any state_dtype does.
    sgd = create_updater({"type": "kSGD", "state_dtype": "bfloat16"})
    w = np.ones(4, np.float32)
    sgd.apply(0, w, np.ones(4, np.float32), sgd.init_state([0, 4], np.float32))
    np.testing.assert_allclose(w, 0.99)


def test_a_user_method_keeps_its_state_as_declared() -> None:
    from paramserver import Updater, register_updater

    @register_updater("kTestQuantUser")
    class Mine(Updater):
        state_roles = ("h",)

        def rule(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
                 lr: float) -> None:
            w -= lr * g

    try:
        with pytest.raises(ParamError, match="bfloat16 and int8 state are for the built-in"):
            create_updater({"type": "kTestQuantUser", "state_dtype": "bfloat16"})
    finally:
        updaters.remove("kTestQuantUser")


def test_wrong_state_arrays_are_refused() -> None:
    w = np.zeros(300, np.float32)
    off = [0, 300]
    with pytest.raises(ParamError, match="m may be negative: its 8-bit codes must be int8"):
        kernels.adam(w, w.copy(), (np.zeros(300, np.uint8), np.zeros(2, np.float32)),
                     (np.zeros(300, np.uint8), np.zeros(2, np.float32)), off, 0.1, step=1)
    with pytest.raises(ParamError, match="one entry per block of 256"):
        kernels.adam(w, w.copy(), (np.zeros(300, np.int8), np.zeros(1, np.float32)),
                     (np.zeros(300, np.uint8), np.zeros(2, np.float32)), off, 0.1, step=1)
    with pytest.raises(ParamError, match="one call takes one kind"):
        kernels.adam(w, w.copy(), np.zeros(300, np.uint16), w.copy(), off, 0.1, step=1)
    with pytest.raises(ParamError, match="are for float32 values"):
        kernels.sgd(w.astype(np.float64), w.astype(np.float64), np.zeros(300, np.uint16), off,
                    0.1, momentum=0.9)
    with pytest.raises(ParamError, match="stochastic rounding needs step"):
        kernels.sgd(w, w.copy(), np.zeros(300, np.uint16), off, 0.1, momentum=0.9,
                    stochastic=True)


# ---------------------------------------------------------------------------------------------
# Training: servers hold the quantised state of their slices; a resumed run is the same run.

JOB = """
name: "tiny-quant"
train_steps: {steps}
test_freq: 10
test_steps: 2
checkpoint_freq: 20
workspace: "{ws}"
seed: 5
updater {{
  type: kAdam weight_decay: 0.001 {state}
  learning_rate {{ type: kStep base_lr: 0.01 step_conf {{ change_freq: 15 gamma: 0.5 }} }}
}}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "digits" batchsize: 16 }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data"
          innerproduct_conf {{ num_output: 16 }} }}
  layer {{ name: "act" type: kTanh srclayers: "fc1" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act"
          innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: 2 nservers_per_group: 2 timeout: 30 }}
"""


@pytest.mark.parametrize("state", ["state_dtype: bfloat16",
                                   "state_dtype: int8 stochastic_rounding: true"])
def test_training_resumes_exactly(tmp_path: Any, state: str) -> None:
    from paramserver.checkpoint import checkpoint_name, load_checkpoint
    from paramserver.config.job import parse_job
    from paramserver.train.trainer import Trainer

    def job(ws: Any, steps: int) -> Any:
        return parse_job(JOB.format(steps=steps, ws=ws, state=state))

    straight = Trainer(job(tmp_path / "a", 40), progress=False)
    straight.train()
    Trainer(job(tmp_path / "b", 20), progress=False).train()
    second = Trainer(job(tmp_path / "b", 40), progress=False)
    second.train(resume=True)
    assert np.array_equal(straight.params.values, second.params.values)
    a, _ = load_checkpoint(tmp_path / "a" / "checkpoints" / checkpoint_name(40))
    b, _ = load_checkpoint(tmp_path / "b" / "checkpoints" / checkpoint_name(40))
    assert a.keys() == b.keys()
    kinds = {a[k].dtype for k in a if "/state/" in k and not k.endswith("/count")}
    assert kinds == ({np.dtype(np.uint16)} if "bfloat16" in state else
                     {np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.float32)})
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def test_torch_optimizer_keeps_quantised_state() -> None:
    torch = pytest.importorskip("torch")
    import paramserver.torch as pst

    def make() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 300), torch.nn.Linear(300, 3))
        opt = pst.Optimizer(model.named_parameters(), "type: kAdam state_dtype: int8 "
                            "stochastic_rounding: true learning_rate { base_lr: 0.01 }")
        return model, opt

    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(1))

    def step(model: Any, opt: Any) -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    model, opt = make()
    for _ in range(3):
        step(model, opt)
    saved = opt.state_dict()
    assert saved["state"][0]["m"].dtype == torch.int8 and saved["state"][0]["m"].shape == (300, 20)
    assert saved["state"][0]["v"].dtype == torch.uint8
    assert saved["state"][0]["m_scale"].shape == (-(-6000 // quant.BLOCK),)
    model2, opt2 = make()
    with torch.no_grad():
        for p, q in zip(model2.parameters(), model.parameters()):
            p.copy_(q)
    opt2.load_state_dict(saved)
    step(model, opt)
    step(model2, opt2)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
