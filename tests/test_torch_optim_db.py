"""paramserver.torch against torch.optim on torch's own optimizer configurations.

torch's wheel ships ``torch.testing._internal.common_optimizers.optim_db``: for every
torch.optim class, the configurations torch's own tests run (``optim_inputs_func``). For every
class :mod:`paramserver.torch` exports under torch's name, every one of those configurations
is run on both, and each must either match torch.optim within float tolerance or be refused
with an error that names the argument (:data:`REFUSED`, an explicit list; a silent
difference fails).

Covered, for each configuration:

- float32 and float64 parameters;
- ``zero_grad()`` (``.grad`` set to None) and ``zero_grad(set_to_none=False)`` (zeroed);
- a model with a parameter used at every step, one used every third step and one never used
  (``.grad`` stays None, the parameter does not move and gains no state, as in torch);
- where torch takes sparse gradients (``supports_sparse``, ``only_supports_sparse_grads``:
  SGD, Adagrad, SparseAdam), a model of ``sparse=True`` embeddings, again used at every step,
  every third step and never, with repeated ids in a batch; configurations torch refuses
  with sparse gradients (weight decay in Adagrad) are not compared;
- the ``host`` and ``offload`` placements (offload on the CPU: a master in host memory and
  plain copies, the code a GPU model runs).

Compared after every one of 5 steps: every parameter's values, whether its ``.grad`` is None,
and at the end which parameters have optimizer state and their ``step``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's test helpers import it

import torch.nn.functional as F  # noqa: E402
from torch.testing._internal.common_optimizers import optim_db  # noqa: E402

import paramserver.torch as pst  # noqa: E402
from paramserver.config import ParamError  # noqa: E402

STEPS = 5
PLACEMENTS = ("host", "offload")
DTYPES = (torch.float32, torch.float64)
#: (rtol, atol) per dtype: the kernels keep float64 sums where torch rounds to float32.
TOLERANCE = {torch.float32: (2e-5, 2e-6), torch.float64: (1e-9, 1e-10)}

#: Configurations paramserver refuses, by (optimizer, optim_db's description): a part of
#: the message, which names the argument. Empty: every configuration of optim_db runs.
REFUSED: dict[tuple[str, str], str] = {}

OPTIMIZERS = {name: getattr(pst, name) for name in pst.__all__
              if hasattr(torch.optim, name) and name != "Optimizer"}
INFOS = {info.optim_cls.__name__: info for info in optim_db
         if info.optim_cls.__name__ in OPTIMIZERS}


def _configs() -> list[Any]:
    out = []
    for name, info in sorted(INFOS.items()):
        for inp in info.optim_inputs_func("cpu", torch.float32):
            out.append(pytest.param(name, inp.desc, id=f"{name}-{inp.desc}"))
    return out


def test_every_exported_optimizer_has_configurations() -> None:
    assert sorted(INFOS) == sorted(OPTIMIZERS)


# -- the models ------------------------------------------------------------------------------

Loss = Callable[[dict[str, torch.Tensor], int], torch.Tensor]


def _dense(dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], Loss]:
    """``w`` used at every step, ``b`` every third, ``u`` never."""
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(4, 3, generator=gen, dtype=dtype),
              "b": torch.randn(3, generator=gen, dtype=dtype),
              "u": torch.randn(2, generator=gen, dtype=dtype)}
    xs = [torch.randn(5, 4, generator=gen, dtype=dtype) for _ in range(STEPS)]

    def loss(p: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        out = xs[step] @ p["w"]
        if step % 3 == 0:
            out = out + p["b"]
        return (out.tanh() - 0.3).pow(2).sum()

    return params, loss


def _sparse(dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], Loss]:
    """Embedding tables with sparse gradients: ``e`` at every step (a repeated id in each
    batch), ``f`` every third step, ``g`` never."""
    gen = torch.Generator().manual_seed(1)
    params = {n: torch.randn(6, 3, generator=gen, dtype=dtype) for n in ("e", "f", "g")}
    c = torch.randn(3, generator=gen, dtype=dtype)

    def loss(p: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        ids = torch.tensor([step % 6, (step + 2) % 6, step % 6])
        out = F.embedding(ids, p["e"], sparse=True).sum(0)
        if step % 3 == 0:
            out = out + F.embedding(ids[:2], p["f"], sparse=True).sum(0)
        return ((out * c).tanh() - 0.3).pow(2).sum()

    return params, loss


# -- one run -------------------------------------------------------------------------------

def _kwargs(given: dict[str, Any]) -> dict[str, Any]:
    """A copy (a Tensor lr each run its own)."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in given.items()}


def _run(make: Callable[..., Any], kwargs: dict[str, Any], model: Any,
         set_to_none: bool) -> tuple[list[dict[str, torch.Tensor | None]], Any]:
    """Each step's values (and whether .grad is None); the optimizer at the end."""
    init, loss_fn = model
    params = {n: torch.nn.Parameter(t.clone()) for n, t in init.items()}
    opt = make(list(params.values()), **kwargs)
    seen = []
    for step in range(STEPS):
        loss_fn(params, step).backward()
        opt.step()
        seen.append({**{n: p.detach().clone() for n, p in params.items()},
                     **{f"{n}.grad is None": p.grad is None for n, p in params.items()}})
        opt.zero_grad(set_to_none=set_to_none)
    return seen, opt


def _state(opt: Any) -> dict[int, float]:
    """Which parameters have state, and their step."""
    out = {}
    for k, entry in opt.state_dict()["state"].items():
        step = entry.get("step")
        out[int(k)] = float(step) if step is not None else math.nan
    return out


def _compare(name: str, desc: str, kwargs: dict[str, Any], model: Any, dtype: torch.dtype,
             set_to_none: bool, placement: str) -> str | None:
    """None when paramserver's run matches torch's (or paramserver refuses it as
    :data:`REFUSED` lists); "torch refuses" when torch does; else what differs."""
    where = f"{name} '{desc}' {dtype} set_to_none={set_to_none} {placement}"
    try:
        want, ref = _run(getattr(torch.optim, name), _kwargs(kwargs), model, set_to_none)
    except (RuntimeError, ValueError):
        return "torch refuses"  # (sparse gradients with weight decay): nothing to match
    refusal = REFUSED.get((name, desc))
    try:
        got, opt = _run(OPTIMIZERS[name], {**_kwargs(kwargs), "placement": placement}, model,
                        set_to_none)
    except ParamError as e:
        if refusal is not None and refusal in str(e):
            return None
        return f"{where}: refused ({e}); not listed in REFUSED"
    if refusal is not None:
        return f"{where}: listed in REFUSED but ran"
    rtol, atol = TOLERANCE[dtype]
    for step, (w, g) in enumerate(zip(want, got, strict=True)):
        for key in w:
            a, b = w[key], g[key]
            if isinstance(a, bool):
                if a != b:
                    return f"{where}, step {step}: {key} is {b}, torch's {a}"
            elif not torch.allclose(a, b, rtol=rtol, atol=atol):
                return (f"{where}, step {step}: '{key}' differs by "
                        f"{(a - b).abs().max().item():.3g}")
    if _state(ref) != _state(opt):
        return f"{where}: state (index: step) {_state(opt)}, torch's {_state(ref)}"
    return None


@pytest.mark.parametrize(("name", "desc"), _configs())
def test_matches_torch_optim(name: str, desc: str) -> None:
    info = INFOS[name]
    problems = []
    compared = 0
    for dtype in DTYPES:
        inputs = {i.desc: i for i in info.optim_inputs_func("cpu", dtype)}
        kwargs = inputs[desc].kwargs
        models = []
        if not info.only_supports_sparse_grads:
            models.append(_dense(dtype))
        if info.supports_sparse or info.only_supports_sparse_grads:
            models.append(_sparse(dtype))
        for model in models:
            for set_to_none in (True, False):
                for placement in PLACEMENTS:
                    found = _compare(name, desc, kwargs, model, dtype, set_to_none,
                                     placement)
                    if found is None:
                        compared += 1
                    elif found != "torch refuses":
                        problems.append(found)
    assert not problems, "\n".join(problems)
    assert compared >= 8  # the dense model (or SparseAdam's sparse one) in every variant
