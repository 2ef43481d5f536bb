"""``paramserver export`` and ``init { type: kFromFile }``: models out of and into safetensors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from paramserver.checkpoint import (
    CheckpointError,
    checkpoint_name,
    load_checkpoint,
    save_checkpoint,
    save_tensors,
)
from paramserver.cli import main
from paramserver.config import ParamError
from paramserver.config.job import parse_job
from paramserver.export import TABLE, param_values
from paramserver.init import create_param_generator, init_params
from paramserver.params import ParamSet
from paramserver.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "examples" / "digits_shared.conf"


def shared_job(ws: Path, steps: int = 20):  # type: ignore[no-untyped-def]
    conf = parse_job(SHARED.read_text(), SHARED.name)
    conf.update({"workspace": str(ws), "train_steps": steps, "checkpoint_freq": 10,
                 "test_freq": 0})
    conf.cluster.update({"nservers_per_group": 2})
    return conf


def load_file(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file as load

    return load(str(path))


def test_export_of_a_training_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    trainer = Trainer(shared_job(tmp_path / "ws"), progress=False, tensorboard=False)
    trainer.train()
    out = tmp_path / "model.safetensors"
    # A workspace is enough: its newest checkpoint is read.
    assert main(["export", str(tmp_path / "ws"), "--to", str(out)]) == 0
    assert "wrote 6 tensors" in capsys.readouterr().out  # a result: on stdout
    model = load_file(out)
    assert sorted(model) == sorted(p.name for p in trainer.params.params)
    for p in trainer.params.params:  # the sharer w_dec too, in its own shape
        assert model[p.name].shape == p.shape and np.array_equal(model[p.name], p.data)
    assert np.array_equal(model["w_dec"].reshape(-1), model["w_enc"].reshape(-1))


def test_export_of_a_checkpoint_of_an_earlier_release_with_its_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(shared_job(tmp_path / "ws", 10), progress=False, tensorboard=False)
    trainer.train()
    arrays, meta = load_checkpoint(tmp_path / "ws" / "checkpoints" / checkpoint_name(10))
    del meta[TABLE]  # what the .npz checkpoints of the first release hold
    old = save_checkpoint(tmp_path / "step-00000010.ckpt.npz", arrays, meta)
    owners = param_values(arrays, meta)  # without the job: the owners, flat
    assert list(owners) == [p.name for p in trainer.params.owners]
    assert owners["w_enc"].shape == (2048,)
    job = tmp_path / "job.conf"
    job.write_text(SHARED.read_text())
    out = tmp_path / "m.safetensors"
    assert main(["export", str(old), "--to", str(out), "--job", str(job)]) == 0
    model = load_file(out)
    assert model["w_enc"].shape == (32, 64) and model["w_dec"].shape == (32, 64)
    assert np.array_equal(model["w_cls"], trainer.params["w_cls"].data)


def test_export_refuses_what_does_not_fit(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = save_checkpoint(tmp_path / "c.ckpt.safetensors", {"x": np.ones(3)}, {})
    assert main(["export", str(path), "--to", str(tmp_path / "m.safetensors")]) == 2
    assert "holds no Param values" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none"), "--to", str(tmp_path / "m.safetensors")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    state = {"step": np.array(1), "layout": np.array([[0, 4]]),
             "server/0/0/values": np.ones(4, np.float32)}
    with pytest.raises(CheckpointError, match="holds 4 values; its Params need 6"):
        param_values(state, {TABLE: {"params": [["w", [2, 3], None]], "aliases": {}}})
    assert not (tmp_path / "m.safetensors").exists()


# -- kFromFile ------------------------------------------------------------------------------

def test_from_file_init(tmp_path: Path) -> None:
    path = save_tensors(tmp_path / "m.safetensors", {
        "w": np.arange(6, dtype=np.float64).reshape(2, 3), "other": np.ones(4, np.float32)})
    pset = ParamSet([("w", (2, 3), {"init": {"type": "kFromFile", "path": str(path)}}),
                     ("v", (4,), {"init": {"type": "kFromFile", "path": str(path),
                                           "key": "other"}})])
    init_params(pset, seed=0)
    assert pset["w"].data.dtype == np.float32
    assert np.array_equal(pset["w"].data, np.arange(6).reshape(2, 3))
    assert np.array_equal(pset["v"].data, np.ones(4))
    gen = create_param_generator(f'type: kFromFile path: "{path}" key: "w"')
    assert gen.own.key == "w"
    bad = [({"path": str(tmp_path / "absent.safetensors")}, "does not exist"),
           ({"path": str(path), "key": "othr"}, "no tensor 'othr'; did you mean 'other'?"),
           ({"path": str(path), "key": "other"}, "has shape (4,), the Param (2, 3)")]
    for conf, message in bad:
        p = ParamSet([("w", (2, 3), {"init": {"type": "kFromFile", **conf}})])
        with pytest.raises(ParamError, match=message.replace("(", r"\(").replace(")", r"\)")):
            init_params(p, 0)


def test_train_starts_from_an_exported_model(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    Trainer(shared_job(tmp_path / "a", 10), progress=False, tensorboard=False).train()
    model = tmp_path / "m.safetensors"
    assert main(["export", str(tmp_path / "a"), "--to", str(model)]) == 0
    text = re.sub(r"init \{[^}]*\}", f'init {{ type: kFromFile path: "{model}" }}',
                  SHARED.read_text())
    job = tmp_path / "from_file.conf"
    job.write_text(text)
    assert main(["check", str(job)]) == 0
    assert "kFromFile(path=" in capsys.readouterr().out
    start = Trainer(parse_job(text, str(job)), progress=False, tensorboard=False)
    values = load_file(model)
    for p in start.params.params:
        assert np.array_equal(p.data, values[p.name]), p.name
    job.write_text(text.replace(str(model), str(tmp_path / "gone.safetensors")))
    assert main(["check", str(job)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, t in enumerate(text.splitlines(), 1) if '"w_enc"' in t)
    assert f"{job}:{line}:5: init of Param 'w_enc': file" in err and "does not exist" in err


# -- torch ------------------------------------------------------------------------------------

def example_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("torch_digits",
                                                  ROOT / "examples" / "torch_digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exported_torch_model_loads_into_the_examples_module(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as torch_load

    import paramserver.torch as pst

    ex = example_module()
    x_tr, y_tr, x_te, _ = ex.load()
    job = pst.parse_job(ex.JOB, "torch_digits.job")
    torch.manual_seed(0)
    model = ex.DigitsCNN()
    opt = pst.Optimizer(model.named_parameters(), job.conf.updater, param_conf=job.params)
    for step in range(3):
        idx = ex.batch_indices(step, len(x_tr), 1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
        opt.step()
    ckpt = opt.save_checkpoint(tmp_path / "opt.ckpt.safetensors")
    # A cluster's checkpoint, with two workers, holds the module's names as well.
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    tied[1].weight = tied[0].weight  # torch's own tying: one tensor, two state_dict names
    tc = pst.TorchCluster(tied, "train_steps: 1 cluster { nworkers_per_group: 2 } "
                                "updater { type: kSGD }")
    tc.run(lambda m, step, rank, n: m(torch.ones(2, 4)).sum(), 1)
    cluster_ckpt = tc.save_checkpoint(tmp_path / "tc.ckpt.safetensors")
    # paramserver's sharing: the sharer's values are its owner's, under its own name.
    shared = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    opt2 = pst.Optimizer(shared.named_parameters(), "type: kSGD",
                         param_conf={"1.weight": {"share_from": "0.weight"}})
    shared(torch.ones(2, 4)).sum().backward()
    opt2.step()
    shared_ckpt = opt2.save_checkpoint(tmp_path / "shared.ckpt.safetensors")

    for source, module, fresh in ((ckpt, model, ex.DigitsCNN()), (cluster_ckpt, tied, None),
                                  (shared_ckpt, shared, None)):
        out = tmp_path / f"{source.stem}.model.safetensors"
        assert main(["export", str(source), "--to", str(out)]) == 0
        if fresh is None:
            fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        fresh.load_state_dict(torch_load(str(out)))  # strict: every name is there
        probe = x_te if module is model else torch.randn(5, 4)
        with torch.no_grad():
            assert torch.equal(fresh(probe), module(probe))
    tc2 = pst.TorchCluster(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)),
                           "train_steps: 1 updater { type: kSGD }")
    with pytest.raises(CheckpointError):  # another module's parameters
        tc2.load_checkpoint(cluster_ckpt)
    capsys.readouterr()


def test_checkpoint_metadata_names_the_job(tmp_path: Path) -> None:
    Trainer(shared_job(tmp_path, 10), progress=False, tensorboard=False).train()
    _, meta = load_checkpoint(tmp_path / "checkpoints" / checkpoint_name(10))
    assert meta["job"] == "digits-shared" and meta["job_conf"]["train_steps"] == 10
    assert meta[TABLE]["params"][2] == ["w_dec", [32, 64], "w_enc"]
    json.dumps(meta)
