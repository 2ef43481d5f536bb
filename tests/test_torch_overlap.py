"""The overlapped offload step (``overlap=True``): buckets of parameters updated on the host
during backward, as soon as their gradients have landed, with the arithmetic of the serial
offload step -- and rolled back wherever what they used changed before ``step()``.

These run offloading with the CPU as the "device" (synchronous copies, a real worker thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError  # noqa: E402
from test_torch import batch, make_net  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class Stack(nn.Module):
    """Linear layers, a parameter no forward uses (its .grad stays None) and a frozen one."""

    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.unused = nn.Parameter(torch.randn(5))
        self.frozen = nn.Parameter(torch.randn(width), requires_grad=False)

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = torch.tanh(layer(x)) + self.frozen
        return x


class Shared(nn.Module):
    """``share_from`` (decoder.weight views encoder.weight: gradients summed into the owner)
    and torch's tying (one tensor used twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 6, bias=False)
        self.decoder = nn.Linear(6, 6)
        self.mid = nn.Linear(6, 6)
        self.mid2 = nn.Linear(6, 6, bias=False)
        self.mid2.weight = self.mid.weight  # torch's tying

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.encoder(x))
        h = torch.tanh(self.mid2(torch.tanh(self.mid(h))))
        return self.decoder(h)


def _stack() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = Stack().to(torch.bfloat16)
    return model, (lambda m, **kw: pst.AdamW(m.named_parameters(), lr=1e-2,
                                             placement="offload", **kw)), None


def _shared() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(1)
    rules = {"decoder.weight": {"share_from": "encoder.weight"}, "*bias": {"lr_scale": 2}}
    return Shared(), (lambda m, **kw: pst.Optimizer(
        m.named_parameters(), "type: kAdam learning_rate { base_lr: 0.01 }", param_conf=rules,
        placement="offload", **kw)), None


def _groups() -> tuple[nn.Module, Any, Any]:
    model = make_net(0, torch.float32)

    def sched(o: Any) -> Any:
        return torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)

    return model, (lambda m, **kw: pst.SGD(
        [{"params": [m.conv1.weight, m.conv1.bias], "momentum": 0.5},
         {"params": [m.conv2.weight, m.conv2.bias, m.fc.weight, m.fc.bias]}],
        lr=0.05, momentum=0.9, weight_decay=1e-3, placement="offload", **kw)), sched


MODELS = {"bf16 stack, unused and frozen parameters": _stack,
          "shared parameters": _shared, "param groups and a scheduler": _groups}


def _inputs(model: nn.Module, step: int) -> tuple[Any, Any]:
    p = next(model.parameters())
    if isinstance(model, Stack):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 16, generator=g).to(p.dtype), None
    if isinstance(model, Shared):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 6, generator=g), None
    return batch(step, p.dtype)


def _loss(model: nn.Module, step: int) -> Any:
    x, y = _inputs(model, step)
    out = model(x)
    return F.cross_entropy(out.float(), y) if y is not None else out.float().pow(2).mean()


def _pair(kind: str, **overlap: Any) -> tuple[Any, Any, Any, Any, list[Any]]:
    model_a, make, sched = MODELS[kind]()
    model_b, _, _ = MODELS[kind]()
    serial = make(model_a)
    early = make(model_b, overlap=pst.Overlap(**(overlap or {"bucket": 64})))
    early.overlap.trace = []
    scheds = [sched(serial), sched(early)] if sched is not None else []
    return model_a, serial, model_b, early, scheds


def _same(opt_a: Any, model_a: nn.Module, opt_b: Any, model_b: nn.Module) -> None:
    """Bit for bit: masters, updater state, update counts, versions and the parameters."""
    pa, pb = opt_a.params.pset, opt_b.params.pset
    assert np.array_equal(pa.values, pb.values)
    for role in opt_a._state.names:
        assert np.array_equal(opt_a._state[role], opt_b._state[role]), role
    assert [p.version for p in pa.owners] == [p.version for p in pb.owners]
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert opt_a.step_count == opt_b.step_count


def _events(opt: Any, what: str) -> list[int]:
    return [n for w, n in opt.overlap.trace if w == what]


@pytest.mark.parametrize("kind", list(MODELS))
def test_overlapped_steps_equal_the_serial_offload_bit_for_bit(kind: str) -> None:
    """50 steps: each bucket updated during backward and committed at step() gives the
    serial offload's values, state and counts exactly (a parameter without a gradient and a
    frozen one untouched by both)."""
    model_a, serial, model_b, early, scheds = _pair(kind)
    for s in range(50):
        for m, o in ((model_a, serial), (model_b, early)):
            o.zero_grad()
            _loss(m, s).backward()
            o.step()
        for sc in scheds:
            sc.step()
        commits = _events(early, "commit")
        assert commits and not _events(early, "rollback"), early.overlap.trace
        early.overlap.trace.clear()
    _same(serial, model_a, early, model_b)
    if kind.startswith("bf16"):
        assert early.state[model_b.unused]["step"] == 0


def test_buckets_start_in_reverse_layer_order_as_their_gradients_land() -> None:
    """With a bucket of one layer's values, bucket i (the i-th layer from the end) starts
    right after that layer's gradients landed, before any gradient of the layer below."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(16, 16) for _ in range(4)))
    opt = pst.Adam(model.parameters(), lr=1e-3, placement="offload",
                   overlap=pst.Overlap(bucket=16 * 16 + 16))
    opt.overlap.trace = []
    model(torch.randn(3, 16)).pow(2).sum().backward()
    trace = [e for e in opt.overlap.trace if e[0] in ("pass", "land", "start")]
    layer_of = [i // 2 for i in range(8)]  # tensors: 0.weight, 0.bias, 1.weight, ...
    starts = [trace.index(("start", b)) for b in range(4)]
    assert starts == sorted(starts)
    for b in range(4):
        layer = 3 - b
        landed = [k for k, e in enumerate(trace) if e[0] == "land" and layer_of[e[1]] == layer]
        below = [k for k, e in enumerate(trace)
                 if e[0] == "land" and layer_of[e[1]] == layer - 1]
        assert max(landed) < starts[b], trace
        assert all(k > starts[b] for k in below), trace
    opt.step()
    assert sorted(_events(opt, "commit")) == [0, 1, 2, 3]


def _run_both(kind: str, between: Any, steps: int = 4, **overlap: Any) -> Any:
    model_a, serial, model_b, early, _ = _pair(kind, **overlap)
    for s in range(steps):
        for m, o in ((model_a, serial), (model_b, early)):
            o.zero_grad()
            _loss(m, s).backward()
            between(m, o, s)
            o.step()
    _same(serial, model_a, early, model_b)
    return early


def test_a_gradient_changed_after_backward_rolls_its_bucket_back() -> None:
    """clip_grad_norm_ (as GradScaler.unscale_ would) changes gradients that buckets already
    used: those buckets are rolled back and updated by step(), as the serial step does."""
    def clip(m: nn.Module, o: Any, s: int) -> None:
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)

    early = _run_both("shared parameters", clip)
    assert _events(early, "rollback") and not _events(early, "commit")


def test_a_gradient_set_to_none_rolls_its_bucket_back() -> None:
    def drop(m: nn.Module, o: Any, s: int) -> None:
        if s % 2:
            m.layers[3].bias.grad = None

    early = _run_both("bf16 stack, unused and frozen parameters", drop)
    assert _events(early, "rollback") and _events(early, "commit")


def test_a_parameter_written_after_its_early_update_is_refused_at_step() -> None:
    """The write may have read the published early update (mul_): step() raises, with the
    step rolled back and the write undone; a step() again is the serial step."""
    model_a, serial, model_b, early, _ = _pair("bf16 stack, unused and frozen parameters")
    for m, o in ((model_a, serial), (model_b, early)):
        o.zero_grad()
        _loss(m, 0).backward()
    with torch.no_grad():
        model_b.layers[3].weight.mul_(0.5)
    with pytest.raises(ParamError, match=r"'layers.3.weight'.*written between backward"):
        early.step()
    _same(serial, model_a, early, model_b)
    for o in (serial, early):
        o.step()
    _same(serial, model_a, early, model_b)
    # a write before the forward pass is taken, as without overlap
    for m, o in ((model_a, serial), (model_b, early)):
        with torch.no_grad():
            m.layers[3].weight.mul_(0.5)
        o.zero_grad()
        _loss(m, 1).backward()
        o.step()
    _same(serial, model_a, early, model_b)


def test_an_lr_written_between_backward_and_step_is_the_one_used() -> None:
    def warm(m: nn.Module, o: Any, s: int) -> None:
        for g in o.param_groups:
            g["lr"] = 0.01 * (s + 1)

    early = _run_both("param groups and a scheduler", warm)
    assert _events(early, "rollback")


def test_with_clip_norm_only_the_copies_overlap() -> None:
    """The global norm needs every gradient: no bucket starts during backward."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    conf = "type: kSGD clip_norm: 0.05 learning_rate { base_lr: 0.1 }"
    serial = pst.Optimizer(models[0].parameters(), conf, placement="offload")
    early = pst.Optimizer(models[1].parameters(), conf, placement="offload", overlap=True)
    early.overlap.trace = []
    for s in range(3):
        for m, o in zip(models, (serial, early), strict=True):
            o.zero_grad()
            m(torch.full((2, 4), float(s + 1))).pow(2).sum().backward()
            o.step()
    assert not _events(early, "start")
    _same(serial, models[0], early, models[1])


def test_a_second_backward_after_early_updates_is_refused_and_rolled_back() -> None:
    """Gradient accumulation without saying so: the second forward computed with early
    updated values, so its backward raises, and nothing of the early updates remains."""
    model_a, serial, model_b, early, _ = _pair("bf16 stack, unused and frozen parameters",
                                               bucket=64)
    early.zero_grad()
    _loss(model_b, 0).backward()
    assert _events(early, "start")
    with pytest.raises(ParamError, match=r"Overlap\(accumulate=1\)"):
        _loss(model_b, 1).backward()
    assert _events(early, "rollback")
    _same(serial, model_a, early, model_b)  # as the serial optimizer before any step


@pytest.mark.parametrize("kind", ["bf16 stack, unused and frozen parameters",
                                  "shared parameters"])
def test_declared_accumulation_updates_early_in_the_last_pass(kind: str) -> None:
    model_a, serial, model_b, early, _ = _pair(kind, bucket=64, accumulate=3)
    for s in range(5):
        for m, o in ((model_a, serial), (model_b, early)):
            o.zero_grad()
            for k in range(3):
                _loss(m, 3 * s + k).backward()
            o.step()
        assert _events(early, "commit") and not _events(early, "rollback")
        passes = [n for w, n in early.overlap.trace if w == "pass"]
        first_start = next(k for k, e in enumerate(early.overlap.trace) if e[0] == "start")
        assert passes == [1, 2, 3]
        assert early.overlap.trace.index(("pass", 3)) < first_start
        early.overlap.trace.clear()
    _same(serial, model_a, early, model_b)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_keeps_one_backward_pass(reentrant: bool) -> None:
    """A checkpointed segment recomputed during backward (a reentrant one runs a backward
    pass of its own inside) is still one pass: buckets start and commit, values exact."""
    from torch.utils.checkpoint import checkpoint

    class Ck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x: Any) -> Any:
            h = torch.tanh(self.a(x))
            return checkpoint(lambda z: self.c(torch.tanh(self.b(z))), h,
                              use_reentrant=reentrant)

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(Ck())
    serial = pst.Adam(models[0].parameters(), lr=1e-2, placement="offload")
    early = pst.Adam(models[1].parameters(), lr=1e-2, placement="offload",
                     overlap=pst.Overlap(bucket=8))
    early.overlap.trace = []
    for s in range(5):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(s))
        for m, o in zip(models, (serial, early), strict=True):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
        assert len(_events(early, "commit")) == 5 and not _events(early, "rollback")
        early.overlap.trace.clear()
    _same(serial, models[0], early, models[1])


def test_a_skipped_step_rolls_back_and_saving_sees_no_half_step(tmp_path: Any) -> None:
    """zero_grad() without step() (a step skipped, as GradScaler skips one) rolls back;
    state_dict() between backward and step() saves the state before the step."""
    kind = "bf16 stack, unused and frozen parameters"
    model_a, serial, model_b, early, _ = _pair(kind)
    for m, o in ((model_a, serial), (model_b, early)):
        o.zero_grad()
        _loss(m, 0).backward()
    early.zero_grad()  # skipped
    serial.zero_grad()
    assert _events(early, "rollback")
    _same(serial, model_a, early, model_b)
    for m in (model_a, model_b):
        _loss(m, 1).backward()
    saved = early.state_dict()
    assert saved["paramserver"]["step"] == 0
    assert np.array_equal(np.concatenate([saved["paramserver"]["master"][p.name].reshape(-1)
                                          .numpy() for p in early.params.pset.owners]),
                          serial.params.pset.values)
    for o in (serial, early):
        o.step()
    _same(serial, model_a, early, model_b)


def test_overlap_is_for_offload_and_checked() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ParamError, match="placement='offload'"):
        pst.SGD(model.parameters(), lr=0.1, overlap=True)
    with pytest.raises(ParamError, match=r"Overlap.bucket is 0"):
        pst.Overlap(bucket=0)
    with pytest.raises(ParamError, match="overlap must be"):
        pst.SGD(model.parameters(), lr=0.1, placement="offload", overlap="yes")
    opt = pst.SGD(model.parameters(), lr=0.1, placement="offload")
    assert opt.overlap is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_overlapped_steps_equal_the_serial_offload_bit_for_bit(dtype: Any) -> None:
    """On a GPU: gradients copied on a side stream, buckets updated on the worker while
    backward goes on, values sent back on another stream; 50 steps equal the serial
    offload's bit for bit, and every step committed buckets started during backward."""
    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Linear(64, 64) for _ in range(6))).cuda().to(dtype)

    models = [make(), make()]
    serial = pst.AdamW(models[0].parameters(), lr=1e-3, placement="offload")
    early = pst.AdamW(models[1].parameters(), lr=1e-3, placement="offload",
                      overlap=pst.Overlap(bucket=64 * 64 + 64))
    early.overlap.trace = []
    for s in range(50):
        g = torch.Generator(device="cuda").manual_seed(s)
        x = torch.randn(32, 64, device="cuda", generator=g, dtype=dtype)
        for m, o in zip(models, (serial, early), strict=True):
            o.zero_grad()
            m(x).float().pow(2).mean().backward()
            o.step()
        assert sorted(_events(early, "commit")) == list(range(6)), early.overlap.trace
        assert not _events(early, "rollback")
        early.overlap.trace.clear()
    _same(serial, models[0], early, models[1])
