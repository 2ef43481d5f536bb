"""paramserver.torch: modules' parameters in flat memory, and the torch.optim-style Optimizer.

The Optimizer is checked against torch.optim step for step on a real (convolutional) module
in float64, where the two differ only by rounding. Multi-worker training is in
``test_torch_cluster.py``.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError  # noqa: E402

nn = torch.nn
F = torch.nn.functional


class Net(nn.Module):
    """A small CNN: conv, conv, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2)
        self.fc = nn.Linear(6 * 3 * 3, 10)

    def forward(self, x: Any) -> Any:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def make_net(seed: int = 0, dtype: Any = torch.float64) -> Net:
    torch.manual_seed(seed)
    return Net().to(dtype)


def batch(step: int, dtype: Any = torch.float64) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(12, 1, 8, 8, generator=g, dtype=dtype),
            torch.randint(0, 10, (12,), generator=g))


def train(model: nn.Module, opt: Any, steps: int, start: int = 0,
          after: Callable[[int], None] | None = None) -> None:
    for s in range(start, start + steps):
        x, y = batch(s, next(model.parameters()).dtype)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if after is not None:
            after(s)


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(),
                                                          strict=True))


# -- against torch.optim --------------------------------------------------------------------

CASES = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.1),
            "type: kSGD learning_rate { base_lr: 0.1 }"),
    "sgd_momentum": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
                     "type: kSGD momentum: 0.9 weight_decay: 0.001 "
                     "learning_rate { base_lr: 0.05 }"),
    "nesterov": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True,
                                            weight_decay=1e-3),
                 "type: kNesterov momentum: 0.8 weight_decay: 0.001 "
                 "learning_rate { base_lr: 0.05 }"),
    "adadelta": (lambda ps: torch.optim.Adadelta(ps, lr=1.0, rho=0.9, eps=1e-6,
                                                 weight_decay=1e-3),
                 "type: kAdaDelta delta: 1e-6 weight_decay: 0.001 adadelta_conf { rho: 0.9 } "
                 "learning_rate { base_lr: 1.0 }"),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99)),
             "type: kAdam adam_conf { beta1: 0.8 beta2: 0.99 } learning_rate { base_lr: 0.01 }"),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
              "type: kAdamW weight_decay: 0.1 learning_rate { base_lr: 0.01 }"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_matches_torch_step_for_step(case: str) -> None:
    make_ref, updater = CASES[case]
    ours, ref = make_net(), make_net()
    torch_opt = make_ref(ref.parameters())
    opt = pst.Optimizer(ours.named_parameters(), updater)
    worst = 0.0
    for s in range(8):
        train(ref, torch_opt, 1, s)
        train(ours, opt, 1, s)
        worst = max(worst, max_diff(ref, ours))
    assert worst < 1e-12, worst
    assert max_diff(ref, make_net()) > 1e-3  # it did train


def test_param_groups_and_a_torch_lr_scheduler_as_in_torch() -> None:
    ours, ref = make_net(), make_net()

    def groups(m: Net, named: bool) -> list[dict[str, Any]]:
        def ps(prefix: str) -> Any:
            mod = getattr(m, prefix)
            return list(mod.named_parameters(prefix)) if named else list(mod.parameters())
        return [{"params": ps("conv1") + ps("conv2")},
                {"params": ps("fc"), "lr": 0.02, "weight_decay": 0.0}]

    # Without momentum: with it, SINGA's rule (h = m·h − lr·g) applies a new rate to new
    # gradients only, while torch's (buf = m·buf + g; w −= lr·buf) rescales the history.
    torch_opt = torch.optim.SGD(groups(ref, False), lr=0.1, weight_decay=1e-3)
    opt = pst.Optimizer(groups(ours, True), "type: kSGD weight_decay: 0.001 "
                                            "learning_rate { base_lr: 0.1 }")
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.02]
    assert opt.param_groups[1]["lr_scale"] == pytest.approx(0.2)
    sched_ref = torch.optim.lr_scheduler.StepLR(torch_opt, step_size=3, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for s in range(8):
        train(ref, torch_opt, 1, s)
        train(ours, opt, 1, s)
        sched_ref.step()
        sched.step()
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [g["lr"] for g in torch_opt.param_groups])
    assert max_diff(ref, ours) < 1e-12


def test_group_lr_follows_the_learning_rate_method() -> None:
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kSGD learning_rate { type: kStep base_lr: "
                                            "0.1 step_conf { change_freq: 2 gamma: 0.5 } }")
    seen = []
    train(model, opt, 5, after=lambda s: seen.append(opt.param_groups[0]["lr"]))
    assert seen == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.025])  # lr at the next step
    assert opt.step_count == 5 and opt.lr == pytest.approx(0.025)


def test_groups_with_other_updater_settings_get_their_own_call() -> None:
    ours, ref = make_net(), make_net()
    torch_opt = torch.optim.SGD([{"params": ref.conv1.parameters(), "momentum": 0.5},
                                 {"params": [*ref.conv2.parameters(), *ref.fc.parameters()]}],
                                lr=0.05, momentum=0.9)
    opt = pst.Optimizer([{"params": ours.conv1.parameters(), "momentum": 0.5},
                         {"params": [*ours.conv2.parameters(), *ours.fc.parameters()]}],
                        "type: kSGD momentum: 0.9 learning_rate { base_lr: 0.05 }")
    train(ref, torch_opt, 6)
    train(ours, opt, 6)
    assert max_diff(ref, ours) < 1e-12
    assert len(opt._runs) == 2


# -- flat memory ----------------------------------------------------------------------------

def test_parameters_and_gradients_view_the_flat_buffers() -> None:
    model = make_net(dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = [id(p) for p in model.parameters()]
    tp = pst.bind(model)
    assert [id(p) for p in model.parameters()] == ids  # same Parameter objects
    pset = tp.pset
    assert pset.values.size == sum(p.numel() for p in model.parameters())
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n])  # values kept
        assert np.shares_memory(p.detach().numpy(), pset.values)
        assert p.grad is None  # as in torch: None until autograd writes it
    opt = pst.Optimizer(model.named_parameters(), "type: kSGD")
    x, y = batch(0, torch.float32)
    F.cross_entropy(model(x), y).backward()
    opt.step()  # the first gradients are copied in, and .grad becomes the view
    assert all(np.shares_memory(p.grad.numpy(), pset.grads) for p in model.parameters())
    opt.zero_grad(set_to_none=False)
    F.cross_entropy(model(x), y).backward()
    assert np.abs(pset.grads).sum() > 0  # autograd wrote into paramserver's buffer
    assert all(np.shares_memory(p.grad.numpy(), pset.grads) for p in model.parameters())
    pset.values[:] = 0.5  # and the module sees paramserver's values at once
    assert all(bool((p == 0.5).all()) for p in model.parameters())


def test_grads_set_to_none_are_copied_in_and_untouched_params_skipped() -> None:
    model = make_net()
    opt = pst.Optimizer(model.named_parameters(), "type: kSGD momentum: 0.9 "
                                                  "learning_rate { base_lr: 0.1 }")
    train(model, opt, 2)
    model.zero_grad()  # set_to_none=True: the views are dropped
    assert model.fc.weight.grad is None
    fc_before = model.fc.weight.detach().clone()
    conv_before = model.conv1.weight.detach().clone()
    x, _y = batch(5)
    out = model.conv2(F.relu(model.conv1(x))).sum()  # fc gets no gradient
    out.backward()
    opt.step()
    assert torch.equal(model.fc.weight, fc_before)  # skipped, as torch.optim skips it
    assert not torch.equal(model.conv1.weight, conv_before)
    assert np.shares_memory(model.conv1.weight.grad.numpy(), opt.params.pset.grads)


def test_frozen_parameters_stay_as_they_are() -> None:
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kSGD momentum: 0.9 weight_decay: 0.1 "
                                            "learning_rate { base_lr: 0.1 }")
    train(model, opt, 2)
    model.conv1.weight.requires_grad_(False)
    frozen = model.conv1.weight.detach().clone()
    train(model, opt, 2, 2)
    assert torch.equal(model.conv1.weight, frozen)
    model.conv1.weight.requires_grad_(True)
    train(model, opt, 1, 4)
    assert not torch.equal(model.conv1.weight, frozen)


def test_moving_the_module_after_binding_is_an_error() -> None:
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kSGD")
    model.float()
    with pytest.raises(ParamError, match="no longer views paramserver's memory"):
        opt.step()


def test_tensors_that_cannot_be_params_are_refused() -> None:
    with pytest.raises(ParamError, match=r"float16: paramserver's Params are float32"):
        pst.bind(nn.Linear(2, 2).half())
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ParamError, match="several dtypes"):
        pst.bind(mixed)


# -- per-parameter configuration ------------------------------------------------------------

def test_lr_and_wd_scales_by_name_pattern() -> None:
    model = make_net()
    biases = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("bias")}
    opt = pst.Optimizer(model.named_parameters(), "type: kSGD weight_decay: 0.5 "
                                                  "learning_rate { base_lr: 0.1 }",
                        param_conf={"*.bias": {"lr_scale": 0}, "fc.weight": {"wd_scale": 0}})
    pset = opt.params.pset
    assert pset["conv1.bias"].lr_scale == 0 and pset["fc.weight"].wd_scale == 0
    assert pset["conv1.weight"].lr_scale == 1 and pset["conv1.weight"].wd_scale == 1
    train(model, opt, 3)
    for n, b in biases.items():
        assert torch.equal(dict(model.named_parameters())[n], b)


def test_a_weight_decay_only_step_shows_the_wd_scale() -> None:
    model = nn.Linear(3, 2).double()
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    opt = pst.Optimizer(model.named_parameters(), "type: kSGD weight_decay: 0.5 "
                                                  "learning_rate { base_lr: 0.1 }",
                        param_conf="param { name: 'bias' wd_scale: 0 }")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # zero gradients (None would skip them, as torch): only weight decay acts
    assert torch.allclose(model.weight, w0 * (1 - 0.1 * 0.5))
    assert torch.equal(model.bias, b0)


def test_rules_from_a_job_file_later_rules_win(tmp_path: Any) -> None:
    path = tmp_path / "job.conf"
    path.write_text("""
        # a torch job: param blocks at the top level
        param { name: "*" lr_scale: 3 }
        param { name: "*.bias" lr_scale: 2 wd_scale: 0 }
        param { name: "fc.weight" init { type: kConstant value: 0.25 } }
    """)
    model = make_net()
    conv = model.conv1.weight.detach().clone()
    tp = pst.bind(model, path)
    pset = tp.pset
    assert pset["conv1.weight"].lr_scale == 3 and pset["conv1.weight"].wd_scale == 1
    assert pset["fc.bias"].lr_scale == 2 and pset["fc.bias"].wd_scale == 0
    assert pset["fc.weight"].lr_scale == 3
    assert bool((model.fc.weight == 0.25).all())  # init by the rule; the others kept
    assert torch.equal(model.conv1.weight, conv)


def test_init_rules_are_seeded() -> None:
    conf = {"fc.weight": {"init": {"type": "kGaussian", "std": 0.1}}}
    a = pst.bind(make_net(1), conf, seed=7)
    b = pst.bind(make_net(2), conf, seed=7)
    assert np.array_equal(a.pset["fc.weight"].data, b.pset["fc.weight"].data)
    c = pst.bind(make_net(1), conf, seed=8)
    assert not np.array_equal(a.pset["fc.weight"].data, c.pset["fc.weight"].data)


def test_a_pattern_that_matches_nothing_is_an_error() -> None:
    with pytest.raises(ParamError) as e:
        pst.bind(make_net(), {"fc.wieght": {"lr_scale": 2}, "*.bais": {"wd_scale": 0}})
    msg = str(e.value)
    assert "pattern 'fc.wieght' matches no parameter; did you mean 'fc.weight'?" in msg
    assert "pattern '*.bais' matches no parameter" in msg


def test_rule_values_are_checked_with_their_place() -> None:
    with pytest.raises(ParamError, match=r"param_conf\['\*.bias'\].*lr_scale"):
        pst.bind(make_net(), {"*.bias": {"lr_scale": -1}})
    with pytest.raises(ParamError, match=r"<param_conf>:1:\d+"):
        pst.bind(make_net(), "param { name: 'fc.bias' lr_scal: 2 }")


def test_group_keys_of_torch_optimizers_are_explained() -> None:
    with pytest.raises(ParamError, match=r"'nesterov'.*type: kNesterov"):
        pst.Optimizer([{"params": make_net().parameters(), "nesterov": True}], "type: kSGD")


# -- tied weights ---------------------------------------------------------------------------

class Tied(nn.Module):
    def __init__(self, tie: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.encoder = nn.Linear(5, 5, bias=False)
        self.decoder = nn.Linear(5, 5)
        if tie:  # torch's own tying: one tensor used twice
            self.decoder.weight = self.encoder.weight

    def forward(self, x: Any) -> Any:
        return self.decoder(torch.tanh(self.encoder(x)))


def test_tied_weights_through_share_from() -> None:
    ours = Tied().double()
    ref = Tied(tie=True).double()
    opt = pst.Optimizer(ours.named_parameters(), "type: kSGD learning_rate { base_lr: 0.2 }",
                        param_conf={"decoder.weight": {"share_from": "encoder.weight"}})
    # torch's tying sums the two gradients; share_from averages them (SPEC §3): lr / 2.
    torch_opt = torch.optim.SGD([{"params": [ref.encoder.weight], "lr": 0.1},
                                 {"params": [ref.decoder.bias]}], lr=0.2)
    pset = opt.params.pset
    assert pset["decoder.weight"].owner is pset["encoder.weight"]
    assert ours.decoder.weight.data_ptr() == ours.encoder.weight.data_ptr()
    assert torch.equal(ours.decoder.weight, ours.encoder.weight)  # the owner's values
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for _ in range(5):
        for m, o in ((ours, opt), (ref, torch_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
        enc_grad = ours.encoder.weight.grad.clone()
        opt.step()
        torch_opt.step()
        assert torch.equal(ours.encoder.weight.grad, enc_grad)  # .grad keeps its own part
    assert torch.allclose(ours.encoder.weight, ref.encoder.weight, atol=1e-14, rtol=0)
    assert torch.equal(ours.decoder.weight, ours.encoder.weight)
    assert torch.allclose(ours.decoder.bias, ref.decoder.bias, atol=1e-14, rtol=0)


def test_share_from_needs_equal_element_counts() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    with pytest.raises(ParamError, match="the counts must be equal"):
        pst.bind(model, {"1.weight": {"share_from": "0.weight"}})


# -- state ----------------------------------------------------------------------------------

@pytest.mark.parametrize("updater", [
    "type: kSGD momentum: 0.9 learning_rate { type: kStep base_lr: 0.1 "
    "step_conf { change_freq: 2 gamma: 0.5 } }",
    "type: kAdam weight_decay: 0.01 learning_rate { base_lr: 0.01 }",
    "type: kAdaDelta adadelta_conf { rho: 0.9 } learning_rate { base_lr: 1 }",
])
def test_state_dict_round_trip_continues_bit_for_bit(updater: str) -> None:
    model = make_net(dtype=torch.float32)
    opt = pst.Optimizer([{"params": model.conv1.parameters()},
                         {"params": [*model.conv2.parameters(), *model.fc.parameters()],
                          "lr_scale": 0.5}], updater)
    train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    train(model, opt, 2, 3)  # the run that goes on

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)  # plain tensors and numbers: no pickle needed
    fresh = make_net(5, torch.float32)
    opt2 = pst.Optimizer([{"params": fresh.conv1.parameters()},
                          {"params": [*fresh.conv2.parameters(), *fresh.fc.parameters()]}],
                         updater)
    fresh.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert opt2.step_count == 3 and opt2.param_groups[1]["lr_scale"] == 0.5
    train(fresh, opt2, 2, 3)
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)
    sd1, sd2 = opt.state_dict(), opt2.state_dict()
    for k, entry in sd1["state"].items():
        for role, v in entry.items():
            assert torch.equal(v, sd2["state"][k][role])


def test_state_dict_holds_copies_in_torch_layout() -> None:
    model = make_net()
    opt = pst.Optimizer(model.named_parameters(), "type: kAdam")
    train(model, opt, 2)
    sd = opt.state_dict()
    assert sorted(sd["state"][0]) == ["count", "m", "v"]
    assert sd["state"][0]["m"].shape == model.conv1.weight.shape
    assert int(sd["state"][0]["count"]) == 2
    assert sd["param_groups"][0]["params"] == list(range(6))
    assert sd["paramserver"]["names"][:2] == ["conv1.weight", "conv1.bias"]
    m = sd["state"][0]["m"].clone()
    train(model, opt, 1, 2)
    assert torch.equal(sd["state"][0]["m"], m)  # a copy, not a view
    assert torch.equal(opt.state[model.conv1.weight]["m"],  # torch's per-tensor state: views
                       opt.state_dict()["state"][0]["m"])


def test_loading_a_foreign_or_mismatched_state_is_refused() -> None:
    model = make_net()
    ref_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = pst.Optimizer(model.parameters(), "type: kSGD momentum: 0.9")
    with pytest.raises(ParamError, match="not a state_dict of paramserver"):
        opt.load_state_dict(ref_opt.state_dict())
    adam = pst.Optimizer(make_net().parameters(), "type: kAdam")
    with pytest.raises(ParamError, match="updater kAdam"):
        opt.load_state_dict(adam.state_dict())


def test_add_param_group_keeps_values_and_state() -> None:
    model = make_net()
    opt = pst.Optimizer([{"params": model.conv1.parameters()}], "type: kSGD momentum: 0.9 "
                                                                "learning_rate { base_lr: 0.1 }")
    for p in [*model.conv2.parameters(), *model.fc.parameters()]:
        p.requires_grad_(False)
    train(model, opt, 2)
    history = opt.state[model.conv1.weight]["history"].clone()
    values = model.conv1.weight.detach().clone()
    for p in [*model.conv2.parameters(), *model.fc.parameters()]:
        p.requires_grad_(True)
    opt.add_param_group({"params": [*model.conv2.parameters(), *model.fc.parameters()]})
    assert torch.equal(opt.state[model.conv1.weight]["history"], history)
    assert torch.equal(model.conv1.weight, values)
    assert opt.params.pset.values.size == sum(p.numel() for p in model.parameters())
    train(model, opt, 2, 2)


def test_closure_is_called_with_grad_enabled() -> None:
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kSGD learning_rate { base_lr: 0.1 }")
    x, y = batch(0)

    def closure() -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    with torch.no_grad():
        loss1 = opt.step(closure)
    loss2 = opt.step(closure)
    assert float(loss2.detach()) < float(loss1.detach())


def test_deepcopy_of_a_model_is_independent() -> None:
    model = make_net()
    pst.Optimizer(model.parameters(), "type: kSGD")
    twin = copy.deepcopy(model)
    twin.fc.weight.data.fill_(1.0)
    assert not bool((model.fc.weight == 1.0).all())


def test_paramserver_checkpoint_round_trip(tmp_path: Any) -> None:
    updater = "type: kAdam weight_decay: 0.01 learning_rate { base_lr: 0.01 }"
    model = make_net(dtype=torch.float32)
    opt = pst.Optimizer(model.named_parameters(), updater)
    train(model, opt, 2)
    path = opt.save_checkpoint(tmp_path / "step-2.ckpt.npz")
    train(model, opt, 2, 2)

    fresh = make_net(9, torch.float32)
    opt2 = pst.Optimizer(fresh.named_parameters(), updater)
    opt2.load_checkpoint(path)  # values too: no module state_dict needed
    assert opt2.step_count == 2 and opt2.params.pset["fc.weight"].version == 2
    train(fresh, opt2, 2, 2)
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)
    other = pst.Optimizer(nn.Linear(3, 2).named_parameters(), updater)
    with pytest.raises(ParamError, match="saved for parameters"):
        other.load_checkpoint(path)


def test_an_optimizer_over_bound_parameters_keeps_their_memory_and_rules() -> None:
    model = make_net()
    tp = pst.bind(model, {"*.bias": {"lr_scale": 0}})
    opt = pst.Optimizer(model.parameters(), "type: kSGD learning_rate { base_lr: 0.1 }")
    assert opt.params is tp  # the same layout: nothing moved
    bias = model.fc.bias.detach().clone()
    train(model, opt, 2)
    assert torch.equal(model.fc.bias, bias)
    # in another order (groups), the layout is made anew; names and rules go along
    opt2 = pst.Optimizer([{"params": model.fc.parameters()},
                          {"params": [*model.conv1.parameters(), *model.conv2.parameters()]}],
                         "type: kSGD learning_rate { base_lr: 0.1 }")
    assert opt2.params is not tp and opt2.params.names[:2] == ["fc.weight", "fc.bias"]
    assert opt2.params.pset["fc.bias"].lr_scale == 0
    train(model, opt2, 1, 2)
    assert torch.equal(model.fc.bias, bias)


def test_state_dict_after_a_scheduler_step_resumes_at_the_scheduled_rate() -> None:
    """``sched.step()`` then save: the saved state trains at the rate the scheduler set."""
    updater = "type: kSGD momentum: 0.9 learning_rate { base_lr: 0.1 }"
    model = make_net()
    opt = pst.Optimizer(model.parameters(), updater)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    train(model, opt, 1)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["lr_scale"] == pytest.approx(0.1)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": sd, "sched": sched.state_dict()}, buf)
    train(model, opt, 2, 1, after=lambda s: sched.step())  # the run that goes on

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fresh = make_net(5)
    opt2 = pst.Optimizer(fresh.parameters(), updater)
    fresh.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.1)
    sched2.load_state_dict(saved["sched"])
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.01)
    train(fresh, opt2, 2, 1, after=lambda s: sched2.step())
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_state_with_a_stale_lr_scale_loads_at_the_saved_lr() -> None:
    """States written before the fix (lr 0.01 beside a stale lr_scale 1) load at lr 0.01."""
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kSGD learning_rate { base_lr: 0.1 }")
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 0.01
    sd["param_groups"][0]["lr_scale"] = 1.0
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr_scale"] == pytest.approx(0.1)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.allclose(p, b - 0.01)


@pytest.mark.parametrize("step", [-5, 2.7, True, "3"])
def test_a_state_with_a_bad_step_is_refused_at_load(step: Any) -> None:
    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kAdam")
    train(model, opt, 2)
    sd = opt.state_dict()
    sd["paramserver"]["step"] = step
    fresh = pst.Optimizer(make_net().parameters(), "type: kAdam")
    with pytest.raises(ParamError, match=r"the saved step is .*: it must be an integer >= 0"):
        fresh.load_state_dict(sd)
    assert fresh.step_count == 0


def test_a_state_with_a_negative_count_or_version_is_refused_at_load(tmp_path: Any) -> None:
    from paramserver import CheckpointError, load_checkpoint, save_checkpoint

    model = make_net()
    opt = pst.Optimizer(model.parameters(), "type: kAdam")
    train(model, opt, 2)
    sd = opt.state_dict()
    sd["state"][0]["count"] = torch.tensor(-1)
    with pytest.raises(ParamError, match=r"'param0/count' is -1: an update count is "
                                         ">= 0"):
        pst.Optimizer(make_net().parameters(), "type: kAdam").load_state_dict(sd)
    path = opt.save_checkpoint(tmp_path / "opt.ckpt.npz")
    arrays, meta = load_checkpoint(path)
    meta["versions"]["param5"] = -4
    save_checkpoint(path, arrays, meta)
    fresh = pst.Optimizer(make_net().parameters(), "type: kAdam")
    with pytest.raises(CheckpointError, match=r"the version of 'param5' is -4: it must be an "
                                              "integer >= 0"):
        fresh.load_checkpoint(path)
    assert fresh.step_count == 0
