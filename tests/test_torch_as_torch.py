"""paramserver.torch where it once differed from torch.optim (issue 35) or changed the
caller's settings (issue 38): gradients that stay None, sparse gradients, crashes that are
now results or refusals, and torch's and numba's thread counts left as the caller set them.
The whole of torch's own configurations is in ``test_torch_optim_db.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import paramserver.torch as pst  # noqa: E402
from paramserver.config import ParamError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _linear_and_unused(seed: int = 0) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.nn.Parameter(torch.randn(3, generator=gen)),
            torch.nn.Parameter(torch.ones(4)))


# -- a parameter that gets no gradient -------------------------------------------------------

@pytest.mark.parametrize("placement", ["host", "offload"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_an_unused_parameter_keeps_grad_none_and_does_not_move(placement: str,
                                                               set_to_none: bool) -> None:
    used, unused = _linear_and_unused()
    opt = pst.Adam([used, unused], lr=0.1, weight_decay=0.1, placement=placement)
    assert used.grad is None and unused.grad is None  # as torch: None until autograd writes
    for _ in range(5):
        (used * used).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    assert unused.grad is None
    assert torch.equal(unused.detach(), torch.ones(4))
    assert set(opt.state_dict()["state"]) == {0}  # no state for it either


def test_sparse_adam_under_set_to_none_false_moves_only_the_batch_rows() -> None:
    emb = torch.nn.Embedding(6, 2, sparse=True)
    opt = pst.SparseAdam(emb.parameters(), lr=0.1)
    emb(torch.tensor([0, 1])).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    before = emb.weight.detach().clone()
    emb(torch.tensor([4])).sum().backward()
    assert emb.weight.grad.is_sparse  # torch's sparse gradient, not a dense view
    opt.step()
    moved = (emb.weight.detach() != before).any(dim=1)
    assert moved.tolist() == [False, False, False, False, True, False]


# -- SGD with momentum on sparse gradients ---------------------------------------------------

def _sgd_on_rows(make: type, **kwargs: object) -> torch.Tensor:
    table = torch.nn.Parameter(torch.ones(4, 2))
    opt = make([table], lr=0.1, momentum=0.9, **kwargs)
    for ids in ([0, 1], [2], [2]):
        F.embedding(torch.tensor(ids), table, sparse=True).sum().backward()
        opt.step()
        opt.zero_grad()
    return table.detach()


def test_sgd_momentum_on_sparse_gradients_is_torchs_unless_lazy_is_asked() -> None:
    want = _sgd_on_rows(torch.optim.SGD)
    assert torch.allclose(_sgd_on_rows(pst.SGD), want)  # rows 0, 1 go on through momentum
    lazy = _sgd_on_rows(pst.SGD, lazy_sparse=True)
    assert torch.equal(lazy[:2], torch.full((2, 2), 0.9))  # moved once, at their own step
    assert not torch.allclose(lazy, want)
    assert torch.equal(lazy[3], want[3])  # a row never in a batch never moves


# -- crashes that are now results or refusals -------------------------------------------------

def test_add_param_group_while_a_sparse_grad_is_present() -> None:
    results = []
    for make in (torch.optim.SGD, pst.SGD):
        torch.manual_seed(0)
        emb, lin = torch.nn.Embedding(5, 2, sparse=True), torch.nn.Linear(2, 1)
        opt = make(emb.parameters(), lr=0.1)
        lin(emb(torch.tensor([1, 2]))).sum().backward()
        opt.add_param_group({"params": list(lin.parameters())})
        assert emb.weight.grad.is_sparse
        opt.step()
        results.append([p.detach().clone() for p in (emb.weight, lin.weight, lin.bias)])
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b)


def test_offload_takes_sparse_embeddings() -> None:
    results = []
    for make, kwargs in ((torch.optim.SparseAdam, {}), (pst.SparseAdam,
                                                        {"placement": "offload"})):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(5, 2, sparse=True)
        opt = make(emb.parameters(), lr=0.1, **kwargs)
        for ids in ([1, 2], [2, 3]):
            emb(torch.tensor(ids)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        results.append(emb.weight.detach().clone())
    assert torch.allclose(*results)


def test_a_compiled_step_runs_as_the_eager_one() -> None:
    results = []
    for make, compiled in ((torch.optim.Adam, False), (pst.Adam, True)):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = make(model.parameters(), lr=0.1)
        step = torch.compile(opt.step, backend="eager") if compiled else opt.step
        for i in range(3):
            model(torch.full((2, 4), float(i))).pow(2).sum().backward()
            step()
            opt.zero_grad()
        results.append(model.weight.detach().clone())
    assert torch.allclose(*results, atol=1e-6)


def test_refusals_as_torch() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ParamError, match=r"Sparse params at indices \[\[0, 0\]\]"):
        pst.SparseAdam([torch.zeros(3, 3).to_sparse().requires_grad_()])
    with pytest.raises(ParamError, match=r"Tensor lr must be 1-element"):
        pst.Adam([p], lr=torch.tensor([0.1, 0.2]))
    with pytest.raises(ParamError, match=r"Invalid beta parameter at index 1: 1\.0"):
        pst.Adamax([p], betas=(0, 1.0))
    with pytest.raises(ParamError, match=r"Invalid beta parameter at index 0: -0\.1"):
        pst.Adam([p], betas=(-0.1, 0.9))


# -- smaller differences ---------------------------------------------------------------------

def test_one_cycle_lr_keeps_a_bounded_number_of_updaters() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = pst.Adam([p], lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    for _ in range(60):
        p.sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    assert len(opt._updaters) <= 16


def test_sparse_adam_saves_step_as_torch_keeps_it() -> None:
    saved = []
    for make in (torch.optim.SparseAdam, pst.SparseAdam):
        emb = torch.nn.Embedding(3, 2, sparse=True)
        opt = make(emb.parameters())
        emb(torch.tensor([1])).sum().backward()
        opt.step()
        saved.append(opt.state_dict()["state"][0]["step"])
    assert saved[0] == saved[1] == 1 and type(saved[0]) is type(saved[1]) is int


def test_adagrad_fills_every_sum_with_the_constructors_initial_value() -> None:
    results = []
    for make in (torch.optim.Adagrad, pst.Adagrad):
        a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        opt = make([{"params": [a]}, {"params": [b], "initial_accumulator_value": 5.0}],
                   lr=0.1, initial_accumulator_value=1.0)
        (a.sum() + b.sum()).backward()
        opt.step()
        results.append(torch.cat([a.detach(), b.detach()]))
    assert torch.allclose(*results)


# -- the caller's thread counts (issue 38) -------------------------------------------------------

THREADS = """
import numba, torch
numba.set_num_threads(1)   # numba's pool started here, by the caller
torch.set_num_threads(1)
import paramserver.torch as pst
from paramserver.config import ParamError
names = [n for n in pst.__all__ if hasattr(torch.optim, n) and n != "Optimizer"]
ran = 0
for name in names:
    for placement in ("host", "offload"):
        for state_dtype in ("float32", "bfloat16", "int8"):
            model = torch.nn.Linear(200, 200)  # more values than a kernel's chunk
            emb = torch.nn.Embedding(10, 4, sparse=name == "SparseAdam")
            params = list(emb.parameters()) if name == "SparseAdam" else list(model.parameters())
            try:
                opt = getattr(pst, name)(params, lr=0.01, placement=placement,
                                         state_dtype=state_dtype)
            except ParamError:
                continue  # a refusal (a dtype this method does not keep) changes nothing
            assert torch.get_num_threads() == 1, (name, placement, state_dtype, "made")
            try:
                for _ in range(2):
                    if name == "SparseAdam":
                        emb(torch.tensor([1, 2])).sum().backward()
                    else:
                        model(torch.ones(2, 200)).sum().backward()
                    opt.step()
                    opt.zero_grad()
                ran += 1
            except ParamError:
                pass  # low-precision state with sparse rows is refused at the step
            assert torch.get_num_threads() == 1, (name, placement, state_dtype, "stepped")
            assert numba.get_num_threads() == 1, (name, placement, state_dtype)
assert ran >= 2 * len(names), ran
print("ran", ran)
"""


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=600)


def test_thread_counts_are_left_as_the_caller_set_them() -> None:
    """Every optimizer, placement and state dtype, in a fresh process: numba's pool started
    by the caller (numba.set_num_threads), torch's count set after it."""
    proc = _fresh(THREADS)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_torch_thread_count_is_kept_when_paramserver_starts_numbas_pool() -> None:
    """numba's pool not started before: the first kernel starts it, and torch's count (1)
    stays; numba's is its default."""
    proc = _fresh("""
        import torch
        torch.set_num_threads(1)
        import paramserver.torch as pst
        model = torch.nn.Linear(200, 200)
        opt = pst.AdamW(model.parameters(), lr=0.01)
        model(torch.ones(2, 200)).sum().backward()
        opt.step()
        assert torch.get_num_threads() == 1, torch.get_num_threads()
        import numba
        assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
