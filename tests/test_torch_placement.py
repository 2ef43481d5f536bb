"""Where the torch optimizer keeps values and state: on the host (numba kernels), offloaded
(an fp32 master in host memory for a model elsewhere, in any float dtype), or on the
parameters' device (SINGA's rules as torch operations, fused by torch.compile on CUDA).

Without a GPU, the device rules run eagerly on CPU tensors and are held equal to the numba
kernels step for step, and offloading runs with the CPU as the "device" (a bfloat16 module
with a float32 master). The tests marked ``cuda`` run the same on a GPU and are skipped
without one.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import paramserver.torch as pst  # noqa: E402
from paramserver import ParamError, create_updater  # noqa: E402
from paramserver.torch._device import device_update  # noqa: E402
from test_torch import Net, Tied, batch, make_net, max_diff, train  # noqa: E402

F = torch.nn.functional
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Segment sizes with empty ones, and per-segment scales that differ (the gathered
# coefficients), and one run where they are all equal (the scalar path).
SIZES = [7, 0, 300, 1, 64, 0, 129]
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)]).astype(np.int64)

METHODS = {
    "sgd": {"type": "kSGD"},
    "momentum": {"type": "kSGD", "momentum": 0.9},
    "momentum-torch": {"type": "kSGD", "momentum": 0.9, "form": "torch",
                       "sgd_conf": {"dampening": 0.25}},
    "nesterov": {"type": "kNesterov", "momentum": 0.8},
    "nesterov-torch": {"type": "kNesterov", "momentum": 0.8, "form": "torch"},
    "adagrad": {"type": "kAdaGrad", "delta": 1e-6},
    "adagrad-torch": {"type": "kAdaGrad", "delta": 1e-6, "form": "torch",
                      "adagrad_conf": {"lr_decay": 0.1, "initial_accumulator_value": 0.3}},
    "rmsprop": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6},
    "rmsprop-torch": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6, "form": "torch",
                      "momentum": 0.7},
    "adadelta": {"type": "kAdaDelta", "rho": 0.9, "delta": 1e-4},
    "adam": {"type": "kAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adam-singa": {"type": "kAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
                   "bias_correction": False},
    "adamw": {"type": "kAdamW", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adamax": {"type": "kAdamMax", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "adamax-singa": {"type": "kAdamMax", "delta": 1e-6, "bias_correction": False},
    "rmsprop-centered": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6, "centered": True},
    "rmsprop-centered-torch": {"type": "kRMSProp", "rho": 0.8, "delta": 1e-6, "form": "torch",
                               "momentum": 0.7, "centered": True},
    "amsgrad": {"type": "kAdamW", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6, "amsgrad": True},
    "sparseadam": {"type": "kSparseAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
    "nadam": {"type": "kNAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6,
              "momentum_decay": 0.05, "decoupled_weight_decay": True},
    "radam": {"type": "kRAdam", "beta1": 0.8, "beta2": 0.95, "delta": 1e-6},
}


@pytest.mark.parametrize("uniform", [False, True], ids=["per-segment", "uniform"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", list(METHODS))
def test_device_rules_equal_the_numba_kernels_step_for_step(method: str, dtype: Any,
                                                             uniform: bool) -> None:
    conf = {**METHODS[method], "weight_decay": 0.01, "clip_low": -1.5, "clip_high": 1.2,
            "learning_rate": {"type": "kStep", "base_lr": 0.05,
                              "step_conf": {"change_freq": 2, "gamma": 0.5}}}
    updater = create_updater(conf)
    n = int(OFFSETS[-1])
    nseg = len(SIZES)
    rng = np.random.default_rng(0)
    if uniform:
        lr_scale, wd_scale, gscale = 1.5, 2.0, 0.5
    else:
        lr_scale, wd_scale = rng.uniform(0, 2, nseg), rng.uniform(0, 2, nseg)
        wd_scale[2] = 0.0
        gscale = rng.uniform(0.2, 1.0, nseg)
    host_w = rng.standard_normal(n).astype(dtype)
    host_state = updater.init_state(OFFSETS, dtype)
    dev_w = torch.from_numpy(host_w.copy())
    dev_state = updater.init_state(OFFSETS, dtype)  # its counts; arrays as tensors below
    arrays = {r.name: torch.zeros(n, dtype=dev_w.dtype) for r in updater.roles[1:]
              if r.per == "element"}
    for step in range(5):
        g = (rng.standard_normal(n) * 2).astype(dtype)
        updater.apply(step, host_w, g, host_state, lr_scale, wd_scale, gscale)
        device_update(updater, step, dev_w, torch.from_numpy(g.copy()), dev_state, arrays,
                      lr_scale, wd_scale, gscale)
        rtol = 1e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(dev_w.numpy(), host_w, rtol=rtol, atol=rtol,
                                   err_msg=f"step {step}")
        for name, a in arrays.items():
            np.testing.assert_allclose(a.numpy(), host_state[name], rtol=rtol, atol=rtol)
        for r in updater.roles:  # the counts, NAdam's mu_product: on the host
            if r.per == "segment":
                np.testing.assert_array_equal(dev_state[r.name], host_state[r.name])


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("PARAMSERVER_COMPILE_TESTS")),
                    reason="torch.compile's first build takes tens of seconds on a CPU: set "
                           "PARAMSERVER_COMPILE_TESTS=1 (it runs with a GPU)")
@pytest.mark.parametrize("method", ["momentum-torch", "adam"])
def test_the_compiled_step_equals_the_eager_one(method: str) -> None:
    """What CUDA runs: the step compiled by torch.compile into one fused kernel (here by
    inductor's C++ backend, on a GPU by Triton), against the eager step."""
    updater = create_updater({**METHODS[method], "weight_decay": 0.01, "clip_low": -1.0,
                              "clip_high": 1.0})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = int(OFFSETS[-1])
    rng = np.random.default_rng(1)
    w0 = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    lr_scale = rng.uniform(0.5, 2.0, len(SIZES))
    out = []
    for compile in (False, True):
        w = w0.clone().to(device)
        state = updater.init_state(OFFSETS, np.float32)
        arrays = {r.name: torch.zeros(n, device=device) for r in updater.roles[1:]}
        for step in range(3):
            g = torch.from_numpy(np.random.default_rng(step).standard_normal(n)
                                 .astype(np.float32)).to(device)
            device_update(updater, step, w, g, state, arrays, lr_scale, compile=compile)
        out.append(w.cpu())
    torch.testing.assert_close(out[1], out[0], rtol=1e-6, atol=1e-6)


def test_a_users_updater_has_no_device_form() -> None:
    from paramserver import Updater

    class Sign(Updater):
        def rule(self, w: Any, g: Any, state: Any, lr: float) -> None:
            w -= lr * np.sign(g)

    u = Sign(create_updater("type: kSGD").conf)
    with pytest.raises(ParamError, match="no update on the device"):
        device_update(u, 0, torch.zeros(3), torch.zeros(3), u.init_state([0, 3], np.float32),
                      {})


# -- the optimizer's placements, end to end ---------------------------------------------------

UPDATERS = ["type: kSGD momentum: 0.9 weight_decay: 0.001 learning_rate { base_lr: 0.05 }",
            "type: kAdam clip_norm: 0.5 learning_rate { base_lr: 0.01 }",
            "type: kRMSProp form: torch momentum: 0.5 learning_rate { base_lr: 0.001 }"]


def groups(m: Net) -> list[dict[str, Any]]:
    return [{"params": list(m.conv1.named_parameters("conv1"))
             + list(m.conv2.named_parameters("conv2"))},
            {"params": list(m.fc.named_parameters("fc")), "lr_scale": 0.5,
             "weight_decay": 0.0}]


@pytest.mark.parametrize("updater", UPDATERS)
@pytest.mark.parametrize("placement", ["device", "offload"])
def test_a_placement_trains_as_the_host_does(placement: str, updater: str) -> None:
    """Groups, per-parameter rules, clip_norm: the same values as on the host (float64)."""
    rules = {"*.bias": {"lr_scale": 2.0}}
    host, other = make_net(), make_net()
    opt_h = pst.Optimizer(groups(host), updater, param_conf=rules)
    opt_o = pst.Optimizer(groups(other), updater, param_conf=rules, placement=placement)
    sched_h = torch.optim.lr_scheduler.StepLR(opt_h, 2, 0.5)
    sched_o = torch.optim.lr_scheduler.StepLR(opt_o, 2, 0.5)
    for s in range(6):
        train(host, opt_h, 1, s)
        train(other, opt_o, 1, s)
        sched_h.step()
        sched_o.step()
        assert max_diff(host, other) < 1e-12, s
    sd_h, sd_o = opt_h.state_dict(), opt_o.state_dict()
    for k, entry in sd_h["state"].items():
        for role, t in entry.items():
            assert torch.allclose(sd_o["state"][k][role], t, rtol=1e-12, atol=1e-12), role
    assert repr(opt_o.params).startswith({"device": "DeviceParams",
                                          "offload": "OffloadParams"}[placement])


@pytest.mark.parametrize("placement", ["device", "offload"])
def test_a_placement_resumes_from_a_checkpoint_bit_for_bit(placement: str,
                                                           tmp_path: Any) -> None:
    updater = "type: kAdamW weight_decay: 0.01 learning_rate { base_lr: 0.01 }"
    model = make_net()
    opt = pst.Optimizer(model.named_parameters(), updater, placement=placement)
    train(model, opt, 3)
    path = opt.save_checkpoint(tmp_path / "ckpt")
    sd = io.BytesIO()
    torch.save(opt.state_dict(), sd)
    train(model, opt, 3, 3)

    again = make_net(9)
    opt2 = pst.Optimizer(again.named_parameters(), updater, placement=placement)
    opt2.load_checkpoint(path)
    train(again, opt2, 3, 3)
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)


def test_device_placement_binds_to_flat_buffers_and_shares() -> None:
    ours, ref = Tied().double(), Tied().double()
    rules = {"decoder.weight": {"share_from": "encoder.weight"}}
    updater = "type: kSGD momentum: 0.5 learning_rate { base_lr: 0.1 }"
    opt_h = pst.Optimizer(ref.named_parameters(), updater, param_conf=rules)
    opt_d = pst.Optimizer(ours.named_parameters(), updater, param_conf=rules,
                          placement="device")
    tp = opt_d.params
    assert ours.decoder.weight.data_ptr() == ours.encoder.weight.data_ptr()  # one memory
    assert tp.values.data_ptr() == ours.encoder.weight.data_ptr()
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for m, o in ((ref, opt_h), (ours, opt_d)):
        for _ in range(3):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert max_diff(ref, ours) < 1e-12
    assert torch.equal(ours.decoder.weight, ours.encoder.weight)


# -- offloading with the CPU as the device ----------------------------------------------------


def half_reference_step(model: Any, master: list[Any], opt: Any, x: Any, y: Any) -> None:
    """What offloading computes: half-precision forward and backward, the fp32 master
    updated from the gradients in fp32, the parameters cast from the master."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x).float(), y).backward()
    for p, m in zip(model.parameters(), master, strict=True):
        m.grad = p.grad.float()
    opt.step()
    with torch.no_grad():
        for p, m in zip(model.parameters(), master, strict=True):
            p.copy_(m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_offload_keeps_an_fp32_master_of_a_half_precision_module(dtype: Any) -> None:
    torch.manual_seed(0)
    ours = Net().to(dtype)
    ref = Net().to(dtype)
    ref.load_state_dict(ours.state_dict())
    # the reference: torch.optim.Adam on an fp32 master copy
    master = [torch.nn.Parameter(p.detach().float()) for p in ref.parameters()]
    torch_opt = torch.optim.Adam(master, lr=1e-2, weight_decay=1e-3)
    opt = pst.Adam(ours.parameters(), lr=1e-2, weight_decay=1e-3, placement="offload")
    assert opt.params.pset.dtype == np.float32
    for s in range(6):
        x, y = batch(s, dtype)
        half_reference_step(ref, master, torch_opt, x, y)
        opt.zero_grad()
        F.cross_entropy(ours(x).float(), y).backward()
        opt.step()
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            assert p.dtype == dtype
            assert torch.equal(p, q), s
    # the master holds what half precision cannot: it is not the parameters read back
    masters = [torch.from_numpy(p.data) for p in opt.params.pset.owners]
    assert len(masters) == 6
    assert any(not torch.equal(m, m.to(dtype).float()) for m in masters)
    for m, r in zip(opt.params.pset.owners, master, strict=True):
        assert np.allclose(m.data, r.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_offload_copies_each_gradient_during_backward_as_soon_as_it_is_complete() -> None:
    """The per-parameter hooks: as soon as the last layer's gradient (the first that
    backward computes) is complete, it is in the host buffer, while the first layer's is
    not computed yet -- the copies overlap the rest of the backward pass -- and step() uses
    those copies, not new ones."""
    model = make_net()
    opt = pst.SGD(model.named_parameters(), lr=0.1, placement="offload")
    pset = opt.params.pset
    seen: dict[str, bool] = {}

    def at_fc(_: Any) -> None:  # registered after the optimizer's hook: runs after it
        seen["fc.weight copied"] = torch.equal(torch.from_numpy(pset["fc.weight"].grad),
                                               model.fc.weight.grad)
        seen["conv1.weight not yet"] = model.conv1.weight.grad is None and bool(
            np.all(pset["conv1.weight"].grad == 0))

    model.fc.weight.register_post_accumulate_grad_hook(at_fc)
    x, y = batch(0)
    F.cross_entropy(model(x), y).backward()
    assert seen == {"fc.weight copied": True, "conv1.weight not yet": True}
    torch.testing.assert_close(torch.from_numpy(pset["conv1.weight"].grad),
                               model.conv1.weight.grad, rtol=0, atol=0)
    # step() reads what the hooks copied: a host gradient doubled behind its back is used
    pset["fc.weight"].grad[...] *= 2
    before = model.fc.weight.detach().clone()
    opt.step()
    torch.testing.assert_close(model.fc.weight, before - 0.2 * model.fc.weight.grad,
                               rtol=0, atol=1e-15)


def test_offload_in_pieces_equals_one_piece() -> None:
    """The update runs in pieces of about ``chunk`` values, each sent back to the
    parameters when done; any size of piece gives the same values."""
    models = [make_net() for _ in range(3)]
    opts = [pst.Adam(m.parameters(), lr=1e-2, weight_decay=1e-3, placement="offload")
            for m in models]
    opts[1].params.chunk = 1      # one parameter a piece
    opts[2].params.chunk = 200    # a few a piece
    for s in range(3):
        for m, o in zip(models, opts, strict=True):
            train(m, o, 1, s)
    for m in models[1:]:
        assert max_diff(models[0], m) == 0.0


def test_offload_copies_again_a_gradient_changed_after_backward() -> None:
    """clip_grad_norm_ between backward and step (its in-place change is seen), gradient
    accumulation over two backward passes, and a parameter without a gradient (skipped)."""
    ours, ref = make_net(), make_net()
    opt = pst.SGD(ours.parameters(), lr=0.1, momentum=0.9, placement="offload")
    torch_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(4):
        for m, o in ((ref, torch_opt), (ours, opt)):
            o.zero_grad()
            for half in range(2):
                x, y = batch(10 * s + half)
                F.cross_entropy(m(x), y).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
            m.fc.bias.grad = None
            o.step()
        assert max_diff(ref, ours) < 1e-12
    assert opt.state[ours.fc.bias]["step"] == 0


def test_offload_masters_take_what_is_written_to_the_parameters(tmp_path: Any) -> None:
    """``model.load_state_dict`` or ``torch.nn.init`` after the optimizer was made: the
    masters take the values written, as torch.optim's parameters would be those values; the
    same bfloat16 values written again keep the masters' extra precision."""
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    opt = pst.SGD(model.named_parameters(), lr=0.1, placement="offload")
    x, y = batch(0, torch.bfloat16)
    F.cross_entropy(model(x).float(), y).backward()
    opt.step()
    pset = opt.params.pset
    kept = pset.values.copy()
    assert not np.array_equal(kept, torch.from_numpy(kept).bfloat16().float().numpy())

    def zero_step() -> None:  # a step that changes nothing: what it keeps is the master
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()

    model.load_state_dict(model.state_dict())   # the same bf16 values again
    zero_step()
    np.testing.assert_array_equal(pset.values, kept)

    torch.nn.init.constant_(model.fc.bias, 0.25)
    other = Net().to(torch.bfloat16)
    model.conv1.load_state_dict(other.conv1.state_dict())
    path = opt.save_checkpoint(tmp_path / "ckpt")  # taken before it is written, too
    zero_step()
    assert np.all(pset["fc.bias"].data == 0.25)
    for name in ("conv1.weight", "conv1.bias"):
        np.testing.assert_array_equal(pset[name].data,
                                      other.state_dict()[name].float().numpy())
    np.testing.assert_array_equal(pset["fc.weight"].data, kept[pset.offsets[4]:
                                                                pset.offsets[5]].reshape(10, 54))
    from paramserver import load_checkpoint

    arrays, _ = load_checkpoint(path)
    assert np.all(arrays["param/fc.bias"] == 0.25)


@pytest.mark.parametrize("model_first", [True, False], ids=["model-then-opt", "opt-then-model"])
def test_offload_of_a_bfloat16_module_resumes_from_state_dicts_bit_for_bit(
        model_first: bool) -> None:
    """torch.save of the module's, the optimizer's and the scheduler's state_dicts, loaded
    (in either order) into fresh objects: the fp32 masters travel with the optimizer's
    state, and the run goes on as the one that was not interrupted."""
    def build(seed: int) -> tuple[Any, Any, Any]:
        torch.manual_seed(seed)
        model = Net().to(torch.bfloat16)
        opt = pst.AdamW(model.named_parameters(), lr=1e-2, placement="offload")
        return model, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2,
                                                               total_steps=10)

    def run(model: Any, opt: Any, sched: Any, steps: range) -> None:
        for s in steps:
            x, y = batch(s, torch.bfloat16)
            opt.zero_grad()
            F.cross_entropy(model(x).float(), y).backward()
            opt.step()
            sched.step()

    model, opt, sched = build(0)
    run(model, opt, sched, range(3))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buf)
    run(model, opt, sched, range(3, 7))

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert saved["opt"]["paramserver"]["master"]["fc.weight"].dtype == torch.float32
    model2, opt2, sched2 = build(5)
    if model_first:
        model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    if not model_first:
        model2.load_state_dict(saved["model"])
    sched2.load_state_dict(saved["sched"])
    run(model2, opt2, sched2, range(3, 7))
    np.testing.assert_array_equal(opt2.params.pset.values, opt.params.pset.values)
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_state_dict_with_a_bad_master_is_refused() -> None:
    model = Net().to(torch.bfloat16)
    opt = pst.Adam(model.named_parameters(), placement="offload")
    sd = opt.state_dict()
    sd["paramserver"]["master"]["fc.bias"] = torch.zeros(3)
    before = opt.params.pset.values.copy()
    with pytest.raises(ParamError, match=r"the saved master of 'fc\.bias' is missing or not a "
                                         "floating-point tensor of 10 values"):
        opt.load_state_dict(sd)
    np.testing.assert_array_equal(opt.params.pset.values, before)
    # a float32 module's values are its parameters: nothing extra is saved
    assert "master" not in pst.Adam(make_net(dtype=torch.float32).parameters(),
                                    placement="offload").state_dict()["paramserver"]


def test_offload_keeps_the_masters_across_add_param_group() -> None:
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    opt = pst.Optimizer([{"params": list(model.conv1.parameters())}],
                        "type: kSGD learning_rate { base_lr: 0.1 }", placement="offload")
    x, y = batch(0, torch.bfloat16)
    F.cross_entropy(model(x).float(), y).backward()
    opt.step()
    kept = opt.params.pset.values.copy()
    opt.add_param_group({"params": list(model.conv2.parameters()) + list(model.fc.parameters())})
    assert np.array_equal(opt.params.pset.values[:kept.size], kept)  # not the bf16 copies
    torch.nn.init.constant_(model.conv1.bias, 0.5)  # written, then rebound: it is taken
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]})
    assert np.all(opt.params.pset.values[kept.size - 4:kept.size] == 0.5)
    np.testing.assert_array_equal(opt.params.pset.values[:kept.size - 4], kept[:-4])
    F.cross_entropy(model(x).float(), y).backward()
    opt.step()  # the old binding's hooks are gone: nothing is copied twice


def test_bfloat16_parameters_need_offloading() -> None:
    model = Net().to(torch.bfloat16)
    with pytest.raises(ParamError, match="bfloat16"):
        pst.Optimizer(model.parameters())
    with pytest.raises(ParamError, match="placement must be one of"):
        pst.Optimizer(model.parameters(), placement="gpu")  # type: ignore[arg-type]


# -- on a GPU ----------------------------------------------------------------------------------


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_offload_equals_a_synchronous_offload_by_hand(dtype: Any) -> None:
    """Offloading from a GPU -- pinned buffers, gradients copied on a side stream during the
    backward pass, values sent back on another while the next piece is updated -- computes
    bit for bit what a plain synchronous offload computes from the same GPU gradients: an
    fp32 copy of the parameters in host memory, updated by the host optimizer with each
    gradient converted and copied after ``backward()``, its values cast and copied back.
    (The same module on the CPU is no reference: its bfloat16 products round differently, and
    Adam magnifies that to whole steps where a gradient is near zero.)"""
    torch.manual_seed(0)
    gpu = Net().to(dtype).cuda()
    by_hand = Net().to(dtype).cuda()
    by_hand.load_state_dict(gpu.state_dict())
    master = [torch.nn.Parameter(p.detach().float().cpu()) for p in by_hand.parameters()]
    opt = pst.Adam(gpu.parameters(), lr=1e-2, placement="offload")
    ref = pst.Adam(master, lr=1e-2, placement="host")
    for s in range(4):
        x, y = batch(s, torch.float32)
        x, y = x.cuda().to(dtype), y.cuda()
        opt.zero_grad()
        F.cross_entropy(gpu(x).float(), y).backward()
        opt.step()
        by_hand.zero_grad()
        F.cross_entropy(by_hand(x).float(), y).backward()
        with torch.no_grad():
            for p, q in zip(master, by_hand.parameters(), strict=True):
                g = q.grad.float().cpu()
                if p.grad is None:  # before the first step: ``.grad`` is None until written
                    p.grad = g
                else:
                    p.grad.copy_(g)  # a view of the host optimizer's buffer
            ref.step()
            for p, q in zip(master, by_hand.parameters(), strict=True):
                q.copy_(p.to(q.dtype))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(opt.params.pset.values, ref.params.pset.values)
    for p, q in zip(gpu.parameters(), by_hand.parameters(), strict=True):
        assert torch.equal(p, q)
    assert opts_pinned(opt)
    assert opt.params.cuda


def opts_pinned(opt: Any) -> bool:
    """The master's buffers are pinned (true asynchronous copies)."""
    pset = opt.params.pset
    return bool(torch.from_numpy(pset.values).is_pinned()
                and torch.from_numpy(pset.grads).is_pinned())


@cuda
@pytest.mark.parametrize("updater", UPDATERS)
def test_cuda_device_updates_equal_the_host(updater: str) -> None:
    host, gpu = make_net(dtype=torch.float32), make_net(dtype=torch.float32)
    gpu.cuda()
    opt_h = pst.Optimizer(host.parameters(), updater)
    opt_d = pst.Optimizer(gpu.parameters(), updater)  # auto: on the device
    assert type(opt_d.params).__name__ == "DeviceParams"
    for s in range(5):
        x, y = batch(s, torch.float32)
        for m, o in ((host, opt_h), (gpu, opt_d)):
            dev = next(m.parameters()).device
            o.zero_grad()
            F.cross_entropy(m(x.to(dev)), y.to(dev)).backward()
            o.step()
    for p, q in zip(host.parameters(), gpu.parameters(), strict=True):
        assert torch.allclose(p, q.cpu(), rtol=1e-4, atol=1e-5)


@cuda
def test_a_device_step_does_not_wait_for_the_gpu() -> None:
    """A step on the device is queued behind the work already on the stream, without the
    host waiting for it (the coefficients travel through pinned memory, asynchronously):
    the host can queue the next forward pass while the GPU still computes."""
    model = make_net(dtype=torch.float32).cuda()
    opt = pst.Adam(model.parameters(), lr=1e-3)
    x, y = batch(0, torch.float32)
    for _ in range(2):  # compiled and warm
        opt.zero_grad()
        F.cross_entropy(model(x.cuda()), y.cuda()).backward()
        opt.step()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time, queued
    busy = torch.cuda.Event()
    busy.record()
    opt.step()
    assert not busy.query(), "step() waited for the GPU's queue"
    torch.cuda.synchronize()

