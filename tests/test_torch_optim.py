"""torch.optim's constructors on paramserver (``paramserver.torch.SGD``, ``Adam``, ...), its
schedulers on the optimizers (what OneCycleLR and CyclicLR cycle), writes to group keys that
no setting reads, and ``clip_norm``.

Every constructor is checked against the torch.optim class of the same name, step for step
on a real (convolutional) module in float64, with its defaults and with its options.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError  # noqa: E402
from test_torch import batch, make_net, max_diff, train  # noqa: E402

Sched = Callable[[Any], Any]

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # torch's defaults
    "SGD": ("SGD", {}),
    "Adam": ("Adam", {}),
    "AdamW": ("AdamW", {}),
    "Adagrad": ("Adagrad", {}),
    "RMSprop": ("RMSprop", {}),
    "Adadelta": ("Adadelta", {}),
    # and their options
    "SGD-momentum": ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    "SGD-dampening": ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3}),
    "SGD-nesterov": ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True,
                             "weight_decay": 1e-3}),
    "SGD-maximize": ("SGD", {"lr": 0.05, "momentum": 0.5, "maximize": True,
                             "weight_decay": 1e-3}),
    "Adam-options": ("Adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6,
                              "weight_decay": 1e-2}),
    "Adam-decoupled": ("Adam", {"lr": 1e-2, "weight_decay": 0.1,
                                "decoupled_weight_decay": True}),
    "AdamW-options": ("AdamW", {"lr": 1e-2, "betas": (0.85, 0.95), "weight_decay": 0.05}),
    "Adagrad-options": ("Adagrad", {"lr": 0.05, "lr_decay": 0.1, "weight_decay": 1e-3,
                                    "initial_accumulator_value": 0.5, "eps": 1e-6}),
    "RMSprop-momentum": ("RMSprop", {"lr": 1e-3, "alpha": 0.9, "eps": 1e-6, "momentum": 0.9,
                                     "weight_decay": 1e-3}),
    "Adadelta-options": ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-5,
                                      "weight_decay": 1e-3}),
}


def pair(case: str, sched: Sched | None = None) -> tuple[Any, ...]:
    cls, kwargs = CASES[case]
    ours, ref = make_net(), make_net()
    opt = getattr(pst, cls)(ours.named_parameters(), **kwargs)
    torch_opt = getattr(torch.optim, cls)(ref.parameters(), **kwargs)
    return ours, opt, ref, torch_opt


def run_both(ours: Any, opt: Any, ref: Any, torch_opt: Any, steps: int,
             scheds: tuple[Any, Any] | None = None) -> float:
    worst = 0.0
    for s in range(steps):
        train(ref, torch_opt, 1, s)
        train(ours, opt, 1, s)
        if scheds is not None:
            scheds[0].step()
            scheds[1].step()
        worst = max(worst, max_diff(ref, ours))
    return worst


@pytest.mark.parametrize("case", list(CASES))
def test_constructor_matches_torch_optim_step_for_step(case: str) -> None:
    ours, opt, ref, torch_opt = pair(case)
    assert isinstance(opt, torch.optim.Optimizer)
    worst = run_both(ours, opt, ref, torch_opt, 8)
    assert worst < 1e-12, worst
    assert max_diff(ref, make_net()) > 1e-6  # it did train
    # the groups show torch's keys and values
    for key, value in torch_opt.param_groups[0].items():
        if key not in ("params", "param_names"):
            assert opt.param_groups[0][key] == value, key


def test_sgd_momentum_under_a_scheduler_rescales_the_whole_buffer_as_torch() -> None:
    """torch's form: a new rate applies to the whole momentum buffer (SINGA's to new
    gradients only), so a schedule gives torch's values step for step."""
    ours, opt, ref, torch_opt = pair("SGD-momentum")
    scheds = (torch.optim.lr_scheduler.StepLR(torch_opt, 2, 0.5),
              torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))
    assert run_both(ours, opt, ref, torch_opt, 8, scheds) < 1e-12
    assert opt.param_groups[0]["lr"] == torch_opt.param_groups[0]["lr"] == 0.05 / 16


def one_cycle(o: Any, **kw: Any) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10, **kw)


def cyclic(o: Any) -> Any:
    return torch.optim.lr_scheduler.CyclicLR(o, base_lr=1e-3, max_lr=0.02, step_size_up=3,
                                             base_momentum=0.8, max_momentum=0.9)


@pytest.mark.parametrize(("case", "make"), [("Adam", one_cycle), ("AdamW", one_cycle),
                                            ("SGD-momentum", one_cycle),
                                            ("RMSprop-momentum", one_cycle),
                                            ("Adam", cyclic), ("SGD-nesterov", cyclic)])
def test_one_cycle_and_cyclic_cycle_what_the_method_uses(case: str, make: Sched) -> None:
    """betas[0] for Adam and AdamW, momentum for SGD and RMSprop: as on torch.optim."""
    ours, opt, ref, torch_opt = pair(case)
    scheds = (make(torch_opt), make(opt))
    assert run_both(ours, opt, ref, torch_opt, 9, scheds) < 1e-12
    key = "betas" if "Adam" in case else "momentum"
    assert opt.param_groups[0][key] == torch_opt.param_groups[0][key]
    assert "momentum" not in opt.param_groups[0] or "Adam" not in case


def test_one_cycle_on_the_general_optimizer_cycles_beta1_of_kadam() -> None:
    ours, ref = make_net(), make_net()
    opt = pst.Optimizer(ours.parameters(), "type: kAdam learning_rate { base_lr: 0.001 }")
    torch_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    assert "momentum" not in opt.param_groups[0]     # kAdam does not read it
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    scheds = (one_cycle(torch_opt), one_cycle(opt))
    assert run_both(ours, opt, ref, torch_opt, 9, scheds) < 1e-12
    group = opt.param_groups[0]
    assert group["beta1"] == group["betas"][0] == torch_opt.param_groups[0]["betas"][0]
    group["beta1"] = 0.7                              # either spelling may be written
    train(ours, opt, 1, 9)
    assert group["betas"] == (0.7, group["beta2"])


@pytest.mark.parametrize(("make", "key", "message"), [
    (lambda ps: pst.Optimizer(ps, "type: kAdam"), "momentum",
     "param group 0 key 'momentum' is not a setting of Adam"),
    (lambda ps: pst.Optimizer(ps, "type: kSGD"), "betas",
     "param group 0 key 'betas' is not a setting of SGD"),
    (lambda ps: pst.Adam(ps), "momentum",
     "param group 0 key 'momentum' is not a setting of torch.optim.Adam"),
    (lambda ps: pst.SGD(ps, lr=0.1), "beta1",
     "param group 0 key 'beta1' is not a setting of torch.optim.SGD"),
])
def test_a_write_to_a_key_no_setting_reads_is_refused(make: Any, key: str,
                                                      message: str) -> None:
    model = make_net()
    opt = make(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0][key] = 0.9
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(ParamError) as e:
        opt.step()
    assert str(e.value).startswith(message)
    with pytest.raises(ParamError, match=message):
        opt.state_dict()
    for p, b in zip(model.parameters(), before, strict=True):  # nothing changed
        assert torch.equal(p, b)


def test_a_group_setting_written_later_is_taken_at_the_next_step() -> None:
    ours, opt, ref, torch_opt = pair("Adam-options")
    run_both(ours, opt, ref, torch_opt, 2)
    for o in (opt, torch_opt):
        o.param_groups[0]["betas"] = (0.5, 0.9)
        o.param_groups[0]["eps"] = 1e-4
    assert run_both(ours, opt, ref, torch_opt, 3) < 1e-12


@pytest.mark.parametrize(("make", "message"), [
    (lambda ps: pst.SGD(ps, differentiable=True), "differentiable=True is not supported"),
    (lambda ps: pst.SGD(ps, nesterov=True), "Nesterov momentum requires a momentum"),
    (lambda ps: pst.SGD(ps, lr=-1), "Invalid learning rate: -1"),
    (lambda ps: pst.Adam(ps, betas=(0.9, 1.5)), "beta2"),
])
def test_what_paramservers_updaters_do_not_do_is_refused(make: Any, message: str) -> None:
    with pytest.raises(ParamError, match=message):
        make(make_net().parameters())


LRS = torch.optim.lr_scheduler
RESUME: dict[str, tuple[Callable[[Any], Any], Sched]] = {
    "Adam-OneCycleLR": (lambda ps: pst.Adam(ps, weight_decay=1e-3), one_cycle),
    "SGD-nesterov-CyclicLR": (lambda ps: pst.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
                              cyclic),
    "RMSprop-CosineAnnealingLR": (lambda ps: pst.RMSprop(ps, momentum=0.5),
                                  lambda o: LRS.CosineAnnealingLR(o, 9, eta_min=1e-4)),
    "Adagrad-StepLR": (lambda ps: pst.Adagrad(ps, lr_decay=0.1), lambda o: LRS.StepLR(o, 2, 0.5)),
    "Adadelta-ExponentialLR": (lambda ps: pst.Adadelta(ps), lambda o: LRS.ExponentialLR(o, 0.8)),
    "AdamW-ReduceLROnPlateau": (lambda ps: pst.AdamW(ps, lr=1e-2),
                                lambda o: LRS.ReduceLROnPlateau(o, factor=0.5, patience=1)),
    "SINGA-kSGD-StepLR": (lambda ps: pst.Optimizer(ps, "type: kSGD momentum: 0.9 "
                                                       "learning_rate { base_lr: 0.1 }"),
                          lambda o: LRS.StepLR(o, 1, 0.7)),
    "AdamW-offload-OneCycleLR": (lambda ps: pst.AdamW(ps, placement="offload"), one_cycle),
}


@pytest.mark.parametrize("case", list(RESUME))
def test_scheduler_save_load_resume_equals_an_uninterrupted_run(case: str) -> None:
    """The usual loop -- step, ``sched.step()``, save mid-run -- loaded into fresh objects
    goes on bit for bit as the run that was not interrupted: values, rates, group keys."""
    make_opt, make_sched = RESUME[case]

    def build(seed: int) -> tuple[Any, Any, Any]:
        model = make_net(seed)
        opt = make_opt(model.parameters())
        return model, opt, make_sched(opt)

    def run(model: Any, opt: Any, sched: Any, steps: range) -> None:
        for s in steps:
            train(model, opt, 1, s)
            if isinstance(sched, LRS.ReduceLROnPlateau):
                sched.step(1.0)  # a loss that does not improve: the rate halves
            else:
                sched.step()

    model, opt, sched = build(0)
    run(model, opt, sched, range(4))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buf)
    run(model, opt, sched, range(4, 9))

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    model2, opt2, sched2 = build(7)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    run(model2, opt2, sched2, range(4, 9))
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
    for g, g2 in zip(opt.param_groups, opt2.param_groups, strict=True):
        assert {k: v for k, v in g.items() if k != "params"} == \
            {k: v for k, v in g2.items() if k != "params"}
    assert opt.param_groups[0]["lr"] != saved["opt"]["param_groups"][0]["lr"]  # it moved on


def test_clip_norm_equals_clip_grad_norm_then_the_step() -> None:
    ours, ref = make_net(), make_net()
    opt = pst.Optimizer(ours.parameters(), "type: kSGD momentum: 0.9 clip_norm: 0.5 "
                                           "learning_rate { base_lr: 0.05 }")
    torch_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    clipped = []
    for s in range(6):
        x, y = batch(s)
        torch_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        clipped.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)) > 0.5)
        torch_opt.step()
        train(ours, opt, 1, s)
    assert any(clipped)
    assert max_diff(ref, ours) < 1e-12
