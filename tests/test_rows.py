"""Row-sparse updates (SPEC §10): every updater's update of some rows of a table equals its
dense update of those rows alone, bit for bit, and leaves every other row — values and state —
as it was (lazy semantics); the update count is the table's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from paramserver import ParamError, Parameter, Updater, create_updater, field
from paramserver.config.components import updaters
from paramserver.numerics import rows as row_kernels
from paramserver.state import UpdaterState
from paramserver.updaters import register_updater

ROWS, DIM = 700, 37  # rows of odd width: the work items (about kernels.CHUNK values) cut runs

METHODS: dict[str, dict[str, Any]] = {
    "sgd": {"type": "kSGD"},
    "sgd_momentum": {"type": "kSGD", "momentum": 0.9},
    "nesterov": {"type": "kNesterov", "momentum": 0.8},
    "adagrad": {"type": "kAdaGrad", "delta": 1e-6},
    "rmsprop": {"type": "kRMSProp", "rmsprop_conf": {"rho": 0.8}},
    "adadelta": {"type": "kAdaDelta", "adadelta_conf": {"rho": 0.7}},
    "adam": {"type": "kAdam", "adam_conf": {"beta1": 0.8, "beta2": 0.95}},
    "adam_singa": {"type": "kAdam", "adam_conf": {"bias_correction": False}},
    "adamw": {"type": "kAdamW", "adamw_conf": {"beta1": 0.8}},
    "adamax": {"type": "kAdamMax"},
    "adamax_singa": {"type": "kAdamMax", "adammax_conf": {"bias_correction": False}},
    # torch.optim's forms of the rules (form: torch)
    "sgd_torch": {"type": "kSGD", "momentum": 0.9, "form": "torch",
                  "sgd_conf": {"dampening": 0.1}},
    "nesterov_torch": {"type": "kNesterov", "momentum": 0.8, "form": "torch"},
    "adagrad_torch": {"type": "kAdaGrad", "form": "torch",
                      "adagrad_conf": {"lr_decay": 0.1}},
    "rmsprop_torch": {"type": "kRMSProp", "momentum": 0.5, "form": "torch"},
    # beyond SINGA (AMSGrad, the centred RMSProp, NAdam and RAdam gather the rows and run
    # their dense kernel; SparseAdam has Adam's row kernel)
    "amsgrad": {"type": "kAdam", "adam_conf": {"amsgrad": True}},
    "rmsprop_centered": {"type": "kRMSProp", "momentum": 0.5, "form": "torch",
                         "rmsprop_conf": {"centered": True}},
    "nadam": {"type": "kNAdam", "nadam_conf": {"decoupled_weight_decay": True}},
    "radam": {"type": "kRAdam"},
    "sparseadam": {"type": "kSparseAdam"},
}


def make(method: str, **extra: Any) -> Updater:
    conf = {**METHODS[method], "learning_rate": {"type": "kStep", "base_lr": 0.05,
                                                 "step_conf": {"change_freq": 2, "gamma": 0.5}},
            "weight_decay": 0.01, **extra}
    return create_updater(conf)


def table(u: Updater, dtype: Any, seed: int = 0) -> tuple[np.ndarray, UpdaterState]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(ROWS * DIM).astype(dtype)
    state = u.init_state([0, w.size], dtype)
    for r in state.roles[1:]:  # a state built up by earlier updates: >= 0 where it must be
        if r.per == "element":
            state[r.name][...] = np.abs(rng.standard_normal(w.size)).astype(dtype)
        else:  # NAdam's product of its momentum schedule, after 3 updates
            state[r.name][...] = 0.6
    state.counts[...] = 3
    return w, state


def batch(step: int, dtype: Any, n: int = 90) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    ids = np.sort(rng.choice(ROWS, n, replace=False)).astype(np.int64)
    rows = (3 * rng.standard_normal((n, DIM))).astype(dtype)
    return ids, rows


def dense_of_rows(u: Updater, step: int, w: np.ndarray, state: UpdaterState, ids: np.ndarray,
                  rows: np.ndarray, **scales: float) -> tuple[np.ndarray, UpdaterState]:
    """The reference: the dense update of the gathered rows alone, as a table of their own."""
    at = (ids[:, None] * DIM + np.arange(DIM)).reshape(-1)
    wc = w[at].copy()
    sc = UpdaterState(state.roles, [0, wc.size], state.dtype,
                      {r.name: (state[r.name][at].copy() if r.per == "element"
                                else state[r.name].copy()) for r in state.roles})
    u.apply(step, wc, rows.reshape(-1), sc, scales.get("lr_scale", 1.0),
            scales.get("wd_scale", 1.0), scales.get("grad_scale", 1.0))
    return wc, sc


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("clip", [False, True])
def test_rows_update_equals_the_dense_update_of_those_rows(method: str, dtype: Any,
                                                           clip: bool) -> None:
    u = make(method, **({"clip_low": -2.0, "clip_high": 1.5} if clip else {}))
    w, state = table(u, dtype)
    scales = {"lr_scale": 1.5, "wd_scale": 2.0, "grad_scale": 0.25}
    for step in range(4):
        ids, rows = batch(step, dtype)
        before_w, before = w.copy(), state.copy()
        want_w, want = dense_of_rows(u, step, w, state, ids, rows, **scales)
        assert u.apply_rows(step, w, ids, rows, DIM, state, **scales) == 0
        touched = np.zeros(ROWS, bool)
        touched[ids] = True
        per_row = w.reshape(ROWS, DIM)
        np.testing.assert_array_equal(per_row[ids].reshape(-1), want_w)
        np.testing.assert_array_equal(per_row[~touched], before_w.reshape(ROWS, DIM)[~touched])
        for r in state.roles[1:]:
            if r.per != "element":  # per table (NAdam's mu_product): as the dense update's
                np.testing.assert_array_equal(state[r.name], want[r.name])
                continue
            got = state[r.name].reshape(ROWS, DIM)
            np.testing.assert_array_equal(got[ids].reshape(-1), want[r.name])
            np.testing.assert_array_equal(got[~touched],
                                          before[r.name].reshape(ROWS, DIM)[~touched])
        assert state.counts.tolist() == [4 + step] == want.counts.tolist()


def test_an_untouched_row_keeps_its_momentum_where_a_dense_zero_gradient_would_decay_it() -> None:
    """The lazy semantics, made visible: a zero gradient row is not the same as no row."""
    u = make("sgd_momentum")
    w, state = table(u, np.float32)
    ids, rows = batch(0, np.float32)
    lazy_w, lazy = w.copy(), state.copy()
    u.apply_rows(0, lazy_w, ids, rows, DIM, lazy)
    dense_w, dense = w.copy(), state.copy()
    g = np.zeros((ROWS, DIM), np.float32)
    g[ids] = rows
    u.apply(0, dense_w, g.reshape(-1), dense)
    other = np.setdiff1d(np.arange(ROWS), ids)
    np.testing.assert_array_equal(lazy_w.reshape(ROWS, DIM)[ids], dense_w.reshape(ROWS, DIM)[ids])
    np.testing.assert_array_equal(lazy_w.reshape(ROWS, DIM)[other], w.reshape(ROWS, DIM)[other])
    assert not np.array_equal(dense_w.reshape(ROWS, DIM)[other], w.reshape(ROWS, DIM)[other])
    np.testing.assert_array_equal(lazy["history"].reshape(ROWS, DIM)[other],
                                  state["history"].reshape(ROWS, DIM)[other])


def test_no_rows_is_an_update_that_changes_only_the_count() -> None:
    u = make("adam")
    w, state = table(u, np.float32)
    before_w, before = w.copy(), state.copy()
    u.apply_rows(0, w, np.zeros(0, np.int64), np.zeros((0, DIM), np.float32), DIM, state)
    np.testing.assert_array_equal(w, before_w)
    np.testing.assert_array_equal(state["m"], before["m"])
    assert state.counts.tolist() == [4]


@pytest.mark.parametrize("ids, message", [
    ([3, 2], "not strictly increasing"),
    ([1, 1], "not strictly increasing"),
    ([5, ROWS], f"{ROWS} is outside the table's rows"),
    ([-1, 4], "-1 is outside"),
])
def test_bad_row_ids_are_refused_before_anything_is_written(ids: list[int], message: str) -> None:
    u = make("adam")
    w, state = table(u, np.float32)
    before_w, before = w.copy(), state.copy()
    rows = np.ones((len(ids), DIM), np.float32)
    with pytest.raises(ParamError, match=message):
        u.apply_rows(0, w, np.array(ids, np.int64), rows, DIM, state)
    np.testing.assert_array_equal(w, before_w)
    np.testing.assert_array_equal(state["v"], before["v"])


def test_rows_of_the_wrong_size_are_refused() -> None:
    u = make("sgd")
    w, state = table(u, np.float32)
    with pytest.raises(ParamError, match="2 × 37 values"):
        u.apply_rows(0, w, np.array([1, 2]), np.ones((2, DIM - 1), np.float32), DIM, state)
    with pytest.raises(ParamError, match="divides len"):
        row_kernels.sgd(w, np.ones(3, np.float32), [1], 3 * DIM + 1, w[:0], 0.1)


@pytest.mark.parametrize("method", ["sgd_momentum", "adam"])
def test_a_refused_nonfinite_row_writes_nothing(method: str) -> None:
    u = make(method)
    w, state = table(u, np.float32)
    ids, rows = batch(0, np.float32)
    rows[5, 3] = np.nan
    rows[7, 0] = np.inf
    before_w, before = w.copy(), state.copy()
    assert u.apply_rows(0, w, ids, rows, DIM, state, refuse_nonfinite=True) == 2
    np.testing.assert_array_equal(w, before_w)
    for r in state.roles:
        np.testing.assert_array_equal(state[r.name], before[r.name])
    assert u.apply_rows(0, w, ids, rows, DIM, state) == 2  # counted, applied: the caller's call


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gscale", [1.0, 0.5])
def test_replacing_rows_is_numpys_assignment_and_refuses_nonfinite_first(dtype: Any,
                                                                       gscale: float) -> None:
    # no update method (a key-value store without an updater): the rows become the
    # scaled gradient, exactly as NumPy's assignment of them
    rng = np.random.default_rng(3)
    w = rng.standard_normal(ROWS * DIM).astype(dtype)
    want = w.copy().reshape(ROWS, DIM)
    ids, rows = batch(1, dtype, n=300)  # more than one work item of rows
    want[ids] = rows * dtype(gscale)
    assert row_kernels.replace(w, rows.reshape(-1), ids, DIM, gscale) == 0
    np.testing.assert_array_equal(w, want.reshape(-1))
    rows[4, 2] = np.nan
    before = w.copy()
    assert row_kernels.replace(w, rows.reshape(-1), ids, DIM, gscale, check=True) == 1
    np.testing.assert_array_equal(w, before)  # nothing written
    with pytest.raises(ParamError, match="not strictly increasing"):
        row_kernels.replace(w, rows.reshape(-1), ids[::-1].copy(), DIM)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merged_rows_are_the_sums_per_id_in_the_order_of_the_parts(dtype: Any) -> None:
    # several workers' rows (each sorted, each id once) merged: per id, the sum of the rows
    # of the parts that have it, ((a + b) + c) as written out here; NaN and Inf counted
    rng = np.random.default_rng(11)
    for trial in range(40):
        parts = []
        for _ in range(int(rng.integers(2, 5))):
            ids = np.unique(rng.integers(0, 50, int(rng.integers(0, 40)))).astype(np.int64)
            parts.append((ids, rng.standard_normal((ids.size, 3)).astype(dtype)))
        if trial % 4 == 0 and parts[1][0].size:
            parts[1][1][0, 1] = [np.nan, np.inf][trial % 8 // 4]
        want: dict[int, np.ndarray] = {}
        for ids, rows in parts:
            for i, row in zip(ids.tolist(), rows, strict=True):
                want[i] = want[i] + row if i in want else row.copy()
        ids, rows, bad = row_kernels.merge_rows(parts, 3, dtype)
        assert ids.tolist() == sorted(want)
        assert rows.dtype == dtype
        np.testing.assert_array_equal(rows, np.array([want[i] for i in sorted(want)],
                                                     dtype).reshape(-1, 3))
        assert bad == int(np.count_nonzero(~np.isfinite(rows)))
        assert bad == (1 if trial % 4 == 0 and parts[1][0].size else 0)


@pytest.mark.parametrize("ids, order", [
    ([], 0), ([0], 0), ([ROWS - 1], 0), ([1, 5, 9], 0),
    ([5, 1], 1), ([3, 3], 1), ([2, 9, 4], 1),
    ([ROWS], -1), ([-1], -1), ([4, 2, ROWS], -1), ([1, 2, -3], -1),
])
def test_one_read_of_row_ids_tells_their_bounds_and_order(ids: list[int], order: int) -> None:
    assert row_kernels.id_order(np.array(ids, np.int64), ROWS) == order


class _Halve(Updater):
    """A user's NumPy rule with state: ``w -= lr·g``; ``seen += 1`` where ``g != 0``."""

    class Config(Parameter):
        unused: int = field(0, doc="Nothing.")

    state_roles = ("seen",)

    def rule(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
             lr: float) -> None:
        state["seen"] += g != 0
        w -= w.dtype.type(lr) * g


@pytest.fixture
def halve() -> Iterator[None]:
    register_updater("HalveTest")(_Halve)
    try:
        yield
    finally:
        updaters.remove("HalveTest")


def test_a_users_rule_gets_the_rows_with_the_same_lazy_semantics(halve: None) -> None:
    u = create_updater({"user_type": "HalveTest", "learning_rate": {"base_lr": 0.5}})
    w, state = table(u, np.float32)
    ids, rows = batch(0, np.float32)
    rows[0] = 0
    before_w, before = w.copy(), state.copy()
    want_w, want = dense_of_rows(u, 0, w, state, ids, rows)
    u.apply_rows(0, w, ids, rows, DIM, state)
    np.testing.assert_array_equal(w.reshape(ROWS, DIM)[ids].reshape(-1), want_w)
    np.testing.assert_array_equal(state["seen"].reshape(ROWS, DIM)[ids].reshape(-1), want["seen"])
    other = np.setdiff1d(np.arange(ROWS), ids)
    np.testing.assert_array_equal(w.reshape(ROWS, DIM)[other], before_w.reshape(ROWS, DIM)[other])
    assert state.counts.tolist() == [4] and before.counts.tolist() == [3]


def test_sparse_adam_agrees_with_torch_sparse_adam() -> None:
    torch = pytest.importorskip("torch")
    u = create_updater({"type": "kAdam", "learning_rate": {"base_lr": 0.01}, "delta": 1e-8})
    w0 = np.random.default_rng(1).standard_normal(ROWS * DIM).astype(np.float32)
    w, state = w0.copy(), u.init_state([0, w0.size], np.float32)
    weight = torch.nn.Parameter(torch.tensor(w0.reshape(ROWS, DIM)))
    opt = torch.optim.SparseAdam([weight], lr=0.01, eps=1e-8)
    for step in range(5):
        ids, rows = batch(step, np.float32)
        u.apply_rows(step, w, ids, rows, DIM, state)
        weight.grad = torch.sparse_coo_tensor(torch.tensor(ids)[None], torch.tensor(rows),
                                              (ROWS, DIM), check_invariants=True)
        opt.step()
    np.testing.assert_allclose(w, weight.detach().numpy().reshape(-1), rtol=1e-4, atol=1e-5)
