"""paramserver.torch as a drop-in for torch.optim (issue 27).

- A parameter with no gradient stays put: ``zero_grad()`` leaves ``.grad`` None, and such a
  parameter is not touched at ``step()`` -- values, state, update count -- for every
  torch-style optimizer and every ``state_dtype``, while the others equal torch.optim's.
- torch.optim's state names and layout, both ways: a job started on torch.optim moves to
  paramserver and continues exactly, and back.
- The optimizers people reach for (Adamax, NAdam, RAdam, ``amsgrad``, ``centered``,
  SparseAdam on ``nn.Embedding(sparse=True)``), and torch's ``repr``.

Everything is compared in float64 with torch.optim's default dtype float64 (torch keeps
NAdam's ``mu_product`` in its default dtype).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError  # noqa: E402

nn = torch.nn
F = torch.nn.functional

#: Every torch-style optimizer, with options away from the defaults (weight decay and
#: momentum included: what would move a parameter that got no gradient).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "SGD": ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    "SGD-nesterov": ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                             "weight_decay": 0.01}),
    "Adam": ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    "Adam-amsgrad": ("Adam", {"lr": 0.01, "betas": (0.8, 0.9), "amsgrad": True}),
    "AdamW": ("AdamW", {"lr": 0.1, "weight_decay": 0.1}),
    "AdamW-amsgrad": ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    "Adagrad": ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1,
                            "weight_decay": 0.01}),
    "RMSprop": ("RMSprop", {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.01}),
    "RMSprop-centered": ("RMSprop", {"lr": 0.01, "alpha": 0.9, "centered": True}),
    "RMSprop-centered-momentum": ("RMSprop", {"lr": 0.01, "centered": True, "momentum": 0.8,
                                              "weight_decay": 0.01}),
    "Adadelta": ("Adadelta", {"lr": 1.0, "weight_decay": 0.01}),
    "Adamax": ("Adamax", {"lr": 0.02, "weight_decay": 0.01}),
    "NAdam": ("NAdam", {"lr": 0.01, "weight_decay": 0.01}),
    "NAdam-decoupled": ("NAdam", {"lr": 0.01, "weight_decay": 0.1, "momentum_decay": 0.01,
                                  "decoupled_weight_decay": True}),
    "RAdam": ("RAdam", {"lr": 0.01, "weight_decay": 0.01}),
    "RAdam-decoupled": ("RAdam", {"lr": 0.01, "weight_decay": 0.1,
                                  "decoupled_weight_decay": True}),
}

#: Which halves take part in each step: both, then only "a" (b idle, with state built up),
#: then only "b" (its update count goes on from where it stopped), then both.
SCHEDULE = [("a", "b"), ("a", "b"), ("a", "b"), ("a",), ("a",), ("a",), ("b",), ("b",),
            ("a", "b")]


@pytest.fixture(autouse=True)
def float64_default() -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


class Halves(nn.Module):
    """Two Linear layers; a step's loss uses some of them (the others get no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(6, 5)

    def forward(self, x: Any, use: tuple[str, ...]) -> Any:
        return sum(getattr(self, n)(x) for n in use)


def make(dtype: Any = torch.float64, seed: int = 0) -> Halves:
    torch.manual_seed(seed)
    return Halves().to(dtype)


def step_on(model: Halves, opt: Any, s: int, use: tuple[str, ...]) -> None:
    g = torch.Generator().manual_seed(50 + s)
    dtype = model.a.weight.dtype
    x, y = torch.randn(8, 6, generator=g, dtype=dtype), torch.randn(8, 5, generator=g,
                                                                     dtype=dtype)
    opt.zero_grad()
    F.mse_loss(model(x, use), y).backward()
    opt.step()


def pair(case: str, state_dtype: str = "float32") -> tuple[Halves, Any, Halves, Any]:
    cls, kwargs = OPTIMIZERS[case]
    dtype = torch.float64 if state_dtype == "float32" else torch.float32
    ours, ref = make(dtype), make(dtype)
    opt = getattr(pst, cls)(ours.named_parameters(), **kwargs, state_dtype=state_dtype)
    return ours, opt, ref, getattr(torch.optim, cls)(ref.parameters(), **kwargs)


def snapshot(model: Halves, opt: Any, half: str) -> list[Any]:
    """A half's values and its state arrays (copies, as kept: codes for low precision)."""
    out = []
    for p in getattr(model, half).parameters():
        out.append(p.detach().clone())
        out += [v.detach().clone() for _, v in sorted(opt.state[p].items())]
    return out


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def max_diff(a: nn.Module, b: nn.Module, half: str | None = None) -> float:
    pa = getattr(a, half).parameters() if half else a.parameters()
    pb = getattr(b, half).parameters() if half else b.parameters()
    return max(float((p - q).detach().abs().max()) for p, q in zip(pa, pb, strict=True))


# -- no gradient, no update ---------------------------------------------------------------

@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("case", list(OPTIMIZERS))
def test_a_half_without_gradient_stays_put_and_the_other_half_is_torchs(case: str,
                                                                        state_dtype: str
                                                                        ) -> None:
    ours, opt, ref, torch_opt = pair(case, state_dtype)
    start = make(ours.a.weight.dtype)
    for s, use in enumerate(SCHEDULE):
        idle = [h for h in ("a", "b") if h not in use]
        before = {h: snapshot(ours, opt, h) for h in idle}
        step_on(ref, torch_opt, s, use)
        step_on(ours, opt, s, use)
        for h in idle:
            assert same(snapshot(ours, opt, h), before[h]), (s, h)  # bit for bit
            assert all(p.grad is None for p in getattr(ours, h).parameters())
        if state_dtype == "float32":  # float64 values: torch.optim's, step for step
            assert max_diff(ref, ours) < 1e-12, s
        else:  # the state kept small: close to torch's, far from where it started
            for h in use:
                moved = max_diff(ref, start, h)
                assert moved > 1e-3 and max_diff(ref, ours, h) < 0.1 * moved, (s, h)
    counts = {h: int(opt.state[getattr(ours, h).weight]["step"]) for h in ("a", "b")}
    assert counts == {"a": 7, "b": 6}  # the update counts skipped the idle steps too
    if state_dtype == "float32":  # and torch.optim's state, by torch's names
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            mine, theirs = opt.state[p], torch_opt.state[q]
            assert set(theirs) <= set(mine) and set(mine) - set(theirs) <= {"step"}
            for key, v in theirs.items():
                torch.testing.assert_close(mine[key].to(torch.float64).reshape(v.shape),
                                           v.to(torch.float64), rtol=1e-10, atol=1e-12)


def test_zero_grad_follows_set_to_none_as_torch() -> None:
    model = make()
    opt = pst.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    w0 = model.b.weight.detach().clone()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    opt.step()  # no gradient at all: nothing moves
    assert torch.equal(model.b.weight, w0)
    opt.zero_grad(set_to_none=False)  # as torch: a .grad that is None stays None
    assert all(p.grad is None for p in model.parameters())
    model(torch.ones(1, 6), ("a", "b")).sum().backward()
    opt.zero_grad(set_to_none=False)  # zero gradients are gradients: weight decay acts
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.step()
    torch.testing.assert_close(model.b.weight, w0 * (1 - 0.1 * 0.5), rtol=1e-15, atol=0)
    # the gradients are views of the flat buffer again: the next backward adds into it
    assert np.shares_memory(model.b.weight.grad.numpy(), opt.params.pset.grads)


def test_a_parameter_that_sits_out_keeps_its_version() -> None:
    model = make()
    opt = pst.Adam(model.named_parameters(), lr=0.01)
    step_on(model, opt, 0, ("a",))
    pset = opt.params.pset
    assert (pset["a.weight"].version, pset["b.weight"].version) == (1, 0)


# -- torch's state, both ways ---------------------------------------------------------------

def _saved(sd: dict[str, Any]) -> dict[str, Any]:
    """Through torch.save and torch.load(weights_only=True), as a job saves it."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return dict(torch.load(buf, weights_only=True))


@pytest.mark.parametrize("case", list(OPTIMIZERS))
def test_a_torch_optim_job_moves_to_paramserver_and_back_continuing_exactly(case: str
                                                                           ) -> None:
    cls, kwargs = OPTIMIZERS[case]
    first, later = SCHEDULE[:4], SCHEDULE[4:]  # b has sat out a step when the job moves

    def torch_job() -> tuple[Halves, Any]:
        m = make()
        return m, getattr(torch.optim, cls)(m.parameters(), **kwargs)

    def our_job() -> tuple[Halves, Any]:
        m = make()
        return m, getattr(pst, cls)(m.named_parameters(), **kwargs)

    for start, go_on in ((torch_job, our_job), (our_job, torch_job)):
        whole, whole_opt = start()  # uninterrupted
        for s, use in enumerate(SCHEDULE):
            step_on(whole, whole_opt, s, use)
        model, opt = start()  # started, saved ...
        for s, use in enumerate(first):
            step_on(model, opt, s, use)
        saved = _saved({"model": model.state_dict(), "opt": opt.state_dict()})
        moved, moved_opt = go_on()  # ... loaded by the other, and continued
        moved.load_state_dict(saved["model"])
        moved_opt.load_state_dict(saved["opt"])
        for s, use in enumerate(later, start=len(first)):
            step_on(moved, moved_opt, s, use)
        assert max_diff(whole, moved) < 1e-12, start.__name__


def test_our_own_state_dict_resumes_bit_for_bit_with_low_precision_state() -> None:
    model, again = make(torch.float32), make(torch.float32, seed=3)
    opt = pst.AdamW(model.parameters(), lr=0.01, amsgrad=True, state_dtype="int8",
                    stochastic_rounding=True)
    for s, use in enumerate(SCHEDULE[:4]):
        step_on(model, opt, s, use)
    saved = _saved({"model": model.state_dict(), "opt": opt.state_dict()})
    assert saved["opt"]["state"][0]["exp_avg"].dtype == torch.int8  # kept as it is kept
    assert "exp_avg_scale" in saved["opt"]["state"][0]
    opt2 = pst.AdamW(again.parameters(), lr=0.01, amsgrad=True, state_dtype="int8",
                     stochastic_rounding=True)
    again.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    for s, use in enumerate(SCHEDULE[4:], start=4):
        step_on(model, opt, s, use)
        step_on(again, opt2, s, use)
    assert max_diff(model, again) == 0.0


def test_a_torch_state_is_encoded_into_low_precision_state() -> None:
    ref = make(torch.float32)
    torch_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for s, use in enumerate(SCHEDULE[:3]):
        step_on(ref, torch_opt, s, use)
    model = make(torch.float32, seed=7)
    model.load_state_dict(ref.state_dict())
    opt = pst.Adam(model.parameters(), lr=0.01, state_dtype="bfloat16")
    opt.load_state_dict(torch_opt.state_dict())
    state = opt.state[model.a.weight]
    assert state["exp_avg"].dtype == torch.uint16 and int(state["step"]) == 3
    for s, use in enumerate(SCHEDULE[3:6], start=3):
        step_on(ref, torch_opt, s, use)
        step_on(model, opt, s, use)
    assert max_diff(ref, model) < 1e-4


def test_a_foreign_state_is_refused_whole() -> None:
    model = make()
    opt = pst.Adam(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    sgd_model = make()
    sgd = torch.optim.SGD(sgd_model.parameters(), lr=0.1, momentum=0.9)
    step_on(sgd_model, sgd, 0, ("a", "b"))
    foreign = re.escape("'momentum_buffer' is not state of torch.optim's")
    with pytest.raises(ParamError, match=foreign):
        opt.load_state_dict(sgd.state_dict())
    bad = torch.optim.Adam(make().parameters())
    step_on(make(), bad, 0, ("a",))  # no state: nothing to take, but the groups are Adam's
    sd = bad.state_dict()
    sd["state"] = {0: {"step": torch.tensor(1.5), "exp_avg": torch.zeros(5, 6)}}
    with pytest.raises(ParamError, match=re.escape("'step' is tensor(1.5")):
        opt.load_state_dict(sd)
    ours = pst.AdamW(make().parameters())
    with pytest.raises(ParamError, match=re.escape("the state is of torch.optim.AdamW")):
        opt.load_state_dict(ours.state_dict())
    general = pst.Optimizer(make().parameters(), "type: kAdam")
    with pytest.raises(ParamError, match="torch-style optimizer of its class"):
        general.load_state_dict(torch_opt_state(make()))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert int(opt.state[model.a.weight]["step"]) == 0


def torch_opt_state(model: Halves) -> dict[str, Any]:
    o = torch.optim.Adam(model.parameters())
    step_on(model, o, 0, ("a", "b"))
    return dict(o.state_dict())


# -- the optimizers people use --------------------------------------------------------------

class Bag(nn.Module):
    """A sparse embedding and a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, ids: Any) -> Any:
        return self.head(self.emb(ids)).sum()


def test_sparse_adam_on_a_sparse_embedding_is_torchs_and_lazy() -> None:
    torch.manual_seed(0)
    ours, ref = Bag(), Bag()
    ref.load_state_dict(ours.state_dict())
    opt = pst.SparseAdam(ours.emb.parameters(), lr=0.05, betas=(0.8, 0.9))
    torch_opt = torch.optim.SparseAdam(ref.emb.parameters(), lr=0.05, betas=(0.8, 0.9))
    for s, ids in enumerate(([1, 2, 2, 5], [5, 7], [1, 1, 3], [7, 19])):
        untouched = sorted(set(range(20)) - set(ids))
        before = ours.emb.weight[untouched].detach().clone()
        for m, o in ((ref, torch_opt), (ours, opt)):
            o.zero_grad()
            m(torch.tensor(ids)).backward()
            o.step()
        assert ours.emb.weight.grad.is_sparse  # the sparse gradient is left as it was
        assert torch.equal(ours.emb.weight[untouched], before), s  # rows touched only
        assert max_diff(ref.emb, ours.emb) < 1e-12, s
    m = opt.state[ours.emb.weight]["exp_avg"]
    assert not m[[0, 4, 6]].any() and m[[1, 2, 3, 5, 7, 19]].all()  # lazy moments


def test_any_method_updates_a_sparse_gradient_lazily_on_its_rows() -> None:
    torch.manual_seed(1)
    model = Bag()
    opt = pst.Adam(model.parameters(), lr=0.05, weight_decay=0.1)
    for ids in ([1, 2], [2, 3]):
        before = model.emb.weight.detach().clone()
        opt.zero_grad()
        model(torch.tensor(ids)).backward()
        opt.step()
        changed = (model.emb.weight != before).any(dim=1).nonzero().reshape(-1).tolist()
        assert changed == ids  # weight decay and momentum act on the rows of the gradient


def test_repr_is_torchs_table_and_describe_gives_everything() -> None:
    model = make()
    groups = [{"params": model.a.parameters()},
              {"params": model.b.parameters(), "weight_decay": 0.0}]
    opt = pst.AdamW(groups, lr=3e-4, amsgrad=True)
    ref = torch.optim.AdamW([{"params": make().a.parameters()},
                             {"params": make().b.parameters(), "weight_decay": 0.0}],
                            lr=3e-4, amsgrad=True)
    text = repr(opt)
    assert text.startswith("AdamW (\nParameter Group 0\n") and text.endswith(")")
    for line in repr(ref).splitlines()[1:-1]:  # every line of torch's, ours besides
        assert line in text.splitlines(), line
    assert "kAdamW" not in text
    full = opt.describe()
    assert '"type": "kAdamW"' in full and '"amsgrad": true' in full
    assert "group1.param0 (5, 6) lr_scale 1 wd_scale 1" in full


@pytest.mark.parametrize("placement", ["offload", "device"])
def test_every_placement_leaves_a_parameter_without_gradient_alone(placement: str) -> None:
    """Offloaded (an fp32 master on the host) and on the device (the device rules, run
    eagerly on CPU tensors here) as on the host: the idle half bit for bit, the rest
    torch.optim's."""
    ours, ref = make(), make()
    opt = pst.NAdam(ours.parameters(), lr=0.01, weight_decay=0.1, placement=placement)
    torch_opt = torch.optim.NAdam(ref.parameters(), lr=0.01, weight_decay=0.1)
    for s, use in enumerate(SCHEDULE):
        idle = [h for h in ("a", "b") if h not in use]
        before = {h: [p.detach().clone() for p in getattr(ours, h).parameters()] for h in idle}
        step_on(ref, torch_opt, s, use)
        step_on(ours, opt, s, use)
        for h in idle:
            assert all(torch.equal(p, q) for p, q in
                       zip(getattr(ours, h).parameters(), before[h], strict=True)), (s, h)
        assert max_diff(ref, ours) < 1e-12, s
    assert int(opt.state[ours.b.weight]["step"]) == 6


def test_clip_norm_counts_the_rows_of_a_sparse_gradient() -> None:
    """Plain SGD updates a sparse gradient's rows as a dense update would: with clip_norm
    the two embeddings train alike only if the global norm counts the rows."""
    torch.manual_seed(2)
    sparse, dense = Bag(), Bag()
    dense.emb = nn.Embedding(20, 4, sparse=False)
    dense.load_state_dict(sparse.state_dict())
    start = [p.detach().clone() for p in sparse.parameters()]
    updater = "type: kSGD clip_norm: 0.05 learning_rate { base_lr: 0.5 }"
    opts = [pst.Optimizer(m.parameters(), updater) for m in (sparse, dense)]
    for ids in ([1, 2, 2], [4, 19]):
        for m, o in zip((sparse, dense), opts, strict=True):
            o.zero_grad()
            m(torch.tensor(ids)).backward()
            o.step()
    assert sparse.emb.weight.grad.is_sparse and not dense.emb.weight.grad.is_sparse
    assert max_diff(sparse, dense) < 1e-15
    moved = [float((p.detach() - q).norm()) for p, q in zip(sparse.parameters(), start,
                                                            strict=True)]
    assert all(x > 0 for x in moved) and sum(x * x for x in moved) ** 0.5 <= 2 * 0.5 * 0.05
