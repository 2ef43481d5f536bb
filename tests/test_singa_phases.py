"""Phases (include/exclude, one net per phase sharing Params), validation rows, SINGA's
schedules, and SINGA-layout checkpoints written by one job and loaded by the next."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from paramserver.checkpoint import CheckpointError
from paramserver.config import ParamError
from paramserver.config.job import parse_job
from paramserver.init import init_params
from paramserver.params import ParamSet
from paramserver.singa import checkpoints as sc
from paramserver.singa.records import BlobProtos
from paramserver.train.net import Net
from paramserver.train.trainer import Trainer, due, singa_due

# SINGA's pattern: two data layers named "data", one per phase.
LAYERS = """
  layer {{ name: "data" type: kData data_conf {{ batchsize: 16 {data} }} include: kTrain }}
  layer {{ name: "data" type: kData data_conf {{ batchsize: 50 {data} }} include: kTest
          include: kVal }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 12 }}
          param {{ name: "w1" init {{ type: kUniformSqrtFanIn }} }} param {{ name: "b1" }} }}
  layer {{ name: "drop" type: kDropout srclayers: "fc1" exclude: kTest exclude: kVal }}
  layer {{ name: "act" type: kSTanh srclayers: "drop" include: kTrain }}
  layer {{ name: "act" type: kSTanh srclayers: "fc1" include: kTest include: kVal }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act" innerproduct_conf {{ num_output: 10 }}
          param {{ name: "w2" init {{ type: kGaussian std: 0.1 }} }} param {{ name: "b2" }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
"""


def net_conf(data: str = "", layers: str = LAYERS):  # type: ignore[no-untyped-def]
    return parse_job(f"neuralnet {{ {layers.format(data=data)} }}").neuralnet


def test_same_name_in_train_and_test_and_params_shared() -> None:
    net = Net(net_conf(), seed=1, phases=("kTrain", "kTest", "kVal"))
    assert net.phases == ["kTrain", "kTest", "kVal"]
    train = {x.name: x for x in net.phase_layers("kTrain")}
    test = {x.name: x for x in net.phase_layers("test")}
    assert list(train) == ["data", "fc1", "drop", "act", "fc2", "loss"]
    assert list(test) == ["data", "fc1", "act", "fc2", "loss"]
    assert train["data"].batchsize == 16 and test["data"].batchsize == 50
    assert train["data"] is not test["data"] and test["act"].srcs[0] is test["fc1"]
    assert [s.name for s in net.param_specs()] == ["w1", "b1", "w2", "b2"]  # once each
    pset = net.make_params()
    for name in ("fc1", "fc2"):
        for p_train, p_test in zip(train[name].params, test[name].params, strict=True):
            assert p_train is p_test and p_train is pset[p_train.name]
    before = net.evaluate(phase="kTest")
    net.train_step(0)
    pset.values -= 0.5 * pset.grads  # a step changes what both phases see
    assert net.evaluate(phase="kTest") != before
    with pytest.raises(ParamError, match="there is no validation split"):
        net.evaluate(phase="kVal")


def test_each_phase_is_checked_on_its_own() -> None:
    two = LAYERS.replace("include: kTest\n          include: kVal", "include: kTrain")
    with pytest.raises(ParamError, match="layer name 'data' is used twice in phase kTrain"):
        Net(net_conf(layers=two))
    # the same file builds when the broken phase is not asked for
    broken_val = LAYERS.replace("include: kTest\n          include: kVal", "include: kTest")
    Net(net_conf(layers=broken_val), phases=("kTrain", "kTest"))
    with pytest.raises(ParamError, match="layer 'fc1' reads 'data', which is excluded from "
                                         "kVal; exclude 'fc1' too"):
        Net(net_conf(layers=broken_val), phases=("kVal",))
    reads_out = LAYERS.replace('name: "act" type: kSTanh srclayers: "fc1"',
                              'name: "act" type: kSTanh srclayers: "drop"')
    with pytest.raises(ParamError, match="layer 'act' reads 'drop', which is excluded from "
                                         "kTest; exclude 'act' too"):
        Net(net_conf(layers=reads_out))


def test_singas_schedule() -> None:
    assert [s for s in range(0, 40) if due(s, 10, 0)] == [10, 20, 30]
    assert [s for s in range(0, 40) if singa_due(s, 10, 0)] == [0, 10, 20, 30]  # TestNow
    assert [s for s in range(0, 40) if due(s, 10, 15)] == [15, 25, 35]
    assert not any(due(s, 0, 0) or singa_due(s, 0, 0) for s in range(20))


JOB = """
name: "phases"
train_steps: {steps}
disp_freq: 5
test_freq: 10
test_steps: 2
validate_freq: 6
validate_after: 4
validate_steps: {vsteps}
checkpoint_freq: {ckpt}
workspace: "{ws}"
seed: 3
updater {{ type: kSGD momentum: 0.5 learning_rate {{ base_lr: 0.1 }} }}
neuralnet {{ {layers} }}
cluster {{ nworkers_per_group: 2 timeout: 30 }}
"""


def job(ws: Path, steps: int, ckpt: int = 0, vsteps: int = 0, **extra: str):  # type: ignore
    text = JOB.format(steps=steps, ws=ws, ckpt=ckpt, vsteps=vsteps,
                      layers=LAYERS.format(data="val_fraction: 0.1"))
    text += "".join(f"\n{k}: {v}" for k, v in extra.items())
    return parse_job(text, "phases.conf")


def rows(ws: Path) -> list[dict[str, str]]:
    with (ws / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_validation_rows_in_metrics_csv(tmp_path: Path) -> None:
    trainer = Trainer(job(tmp_path, 22, vsteps=1), progress=False)
    assert trainer.eval_phases == ["kTest", "kVal"]
    trainer.train()
    got = rows(tmp_path)
    val = [r for r in got if r["phase"] == "val"]
    assert [int(r["step"]) for r in val] == [4, 10, 16, 22]  # every 6 steps from step 4
    test = [int(r["step"]) for r in got if r["phase"] == "test"]
    assert test == [10, 20, 22]  # every 10, and at the end
    # one batch of the validation split (50 of its 180 samples), on the net's Params
    again = trainer.eval_net.evaluate(steps=1, phase="kVal")  # type: ignore[union-attr]
    assert float(val[-1]["loss"]) == again["loss"]
    assert 0 <= float(val[-1]["accuracy"]) <= 1
    assert [r["phase"] for r in got if r["step"] == "10"] == ["train", "val", "test"]


def test_a_singa_job_tests_at_step_0_and_not_after_its_last_step(tmp_path: Path) -> None:
    """A SINGA job (its workspace in cluster { workspace }, as SINGA required) keeps
    SINGA's schedule: Worker::Run tests and validates before each step that is due, step
    0 included, and not after the last one; paramserver's own jobs test at the end."""
    singa = job(tmp_path / "unused", 22, vsteps=1)
    singa.update({"workspace": None, "cluster": {"workspace": str(tmp_path / "singa")}})
    assert singa.singa_job and not job(tmp_path, 22).singa_job
    Trainer(singa, progress=False).train()
    got = rows(tmp_path / "singa")
    assert [int(r["step"]) for r in got if r["phase"] == "test"] == [0, 10, 20]
    # nor validates after it: Worker::Run's loop ends before step 22's validation
    assert [int(r["step"]) for r in got if r["phase"] == "val"] == [4, 10, 16]
    assert sorted(p.name for p in (tmp_path / "singa" / "checkpoint").iterdir()) == [
        "step22-worker0"]  # SINGA's, at the end, beside ours
    Trainer(job(tmp_path / "ours", 22, vsteps=1), progress=False).train()
    got = rows(tmp_path / "ours")
    assert [int(r["step"]) for r in got if r["phase"] == "test"] == [10, 20, 22]
    assert not (tmp_path / "ours" / "checkpoint").exists()


def test_validation_rows_survive_a_resume(tmp_path: Path) -> None:
    Trainer(job(tmp_path / "a", 24, ckpt=8), progress=False).train()
    Trainer(job(tmp_path / "b", 16, ckpt=8), progress=False).train()
    resumed = Trainer(job(tmp_path / "b", 24, ckpt=8), progress=False)
    resumed.train(resume=True)
    straight, again = rows(tmp_path / "a"), rows(tmp_path / "b")
    # the same rows, and the first run's own last ones (its last train window and its final
    # test at step 16), kept as TensorBoard keeps them (issue 38)
    extra = [r for r in again if r not in straight]
    assert [(r["step"], r["phase"]) for r in extra] == [("16", "train"), ("16", "test")]
    assert [r for r in again if r not in extra] == straight


def test_a_test_only_param_is_refused(tmp_path: Path) -> None:
    layers = LAYERS.replace('name: "act" type: kSTanh srclayers: "fc1" include: kTest',
                            'name: "act" type: kInnerProduct srclayers: "fc1" include: kTest '
                            'innerproduct_conf {{ num_output: 12 }} param {{ name: "extra" }}')
    text = JOB.format(steps=2, ws=tmp_path, ckpt=0, vsteps=0,
                      layers=layers.format(data="val_fraction: 0.1"))
    with pytest.raises(ParamError, match=r"Param 'extra' .* is used in kTest, kVal but no "
                                         r"layer of the kTrain net has it"):
        Trainer(parse_job(text), progress=False)


def test_unbuilt_algorithms_and_layers_are_refused_by_train(tmp_path: Path) -> None:
    conf = job(tmp_path, 2)
    conf.train_one_batch.update({"alg": "kUserAlg", "user_alg": "MyAlg"})
    with pytest.raises(ParamError, match="user training algorithm 'MyAlg' \\(kUserAlg\\): "
                                         "train_one_batch"):
        Trainer(conf, progress=False)
    text = 'neuralnet { layer { name: "c" type: kLMDBData lmdbdata_conf { path: "x" ' \
           'batchsize: 1 } } }'
    with pytest.raises(ParamError, match="layer type kLMDBData: layer 'c'"):
        Trainer(parse_job(text), progress=False)


# -- SINGA checkpoints -----------------------------------------------------------------------


def test_checkpoint_file_round_trip(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
    path = sc.write_checkpoint(tmp_path / "step5-worker0", [("w", w, 4), ("b", np.ones(3), 4)])
    assert path.name == sc.checkpoint_file_name(5)
    msg = BlobProtos.FromString(path.read_bytes())
    assert list(msg.name) == ["w", "b"] and list(msg.version) == [4, 4]
    assert list(msg.blob[0].shape) == [2, 3]
    saved = sc.read_checkpoint(path)
    assert [(s.name, s.version, s.shape) for s in saved] == [("w", 4, (2, 3)), ("b", 4, (3,))]
    np.testing.assert_array_equal(saved[0].values, w.astype(np.float32))



def test_checkpoint_file_is_protobufs_serialization(tmp_path: Path) -> None:
    """The file is byte for byte what protobuf (SINGA's C++ serializer too) writes for the
    message: large (multi-byte lengths), scalar, empty, float64 and non-contiguous values."""
    rng = np.random.default_rng(3)
    params = [("0#w1", rng.standard_normal((70, 30)).astype(np.float32), 300),
              ("0#s", np.float32(2.5), 0), ("0#e", np.zeros((0, 4), np.float32), 1),
              ("0#d", rng.standard_normal(5), 2 ** 20),
              ("0#t", rng.standard_normal((6, 4)).astype(np.float32).T, 7)]
    path = sc.write_checkpoint(tmp_path / "step1-worker0", params)
    msg = BlobProtos()
    for name, values, version in params:
        arr = np.asarray(values, np.float32)
        blob = msg.blob.add()
        blob.shape.extend(arr.shape)
        blob.data.extend(arr.reshape(-1).tolist())
        msg.name.append(name)
        msg.version.append(version)
    assert path.read_bytes() == msg.SerializeToString()

def blob_protos(**fields: object) -> bytes:
    msg = BlobProtos()
    blob = msg.blob.add()
    blob.shape.extend([2])
    blob.data.extend([1.0, 2.0])
    msg.name.append("w")
    msg.version.append(1)
    for key, value in fields.items():
        field = getattr(msg, key)
        del field[:]
        field.extend(value)  # type: ignore[call-overload]
    return bytes(msg.SerializeToString())


@pytest.mark.parametrize(("content", "message"), [
    (b"\x00\x01\x02garbage", "not a SINGA checkpoint: not a BlobProtos"),
    (b"PK\x03\x04" + bytes(40), "not a SINGA checkpoint: not a BlobProtos"),
    (b"", "it holds no Params"),
    (blob_protos(version=[]), "it has 1 names, 0 versions and 1 values"),
    (blob_protos(name=["w", "v"]), "it has 2 names, 1 versions and 1 values"),
    (blob_protos(version=[-1]), "Param 'w' has the negative version -1"),
    (blob_protos(name=[""]), "a Param has no name"),
    (blob_protos()[:-3], "not a BlobProtos"),
])
def test_malformed_checkpoints_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "step1-worker0"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        sc.read_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        sc.read_checkpoint(tmp_path / "none")


def test_a_wrong_size_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    pset = ParamSet([("w", (2, 3)), ("b", (3,)), ("wt", (3, 2), {"share_from": "w"})])
    init_params(pset, 0)
    before = pset.values.copy()
    good = sc.write_checkpoint(tmp_path / "a", [("b", np.full(3, 9.0), 2),
                                                ("other", np.ones(4), 1)])
    bad = sc.write_checkpoint(tmp_path / "b", [("w", np.ones(5), 1)])
    with pytest.raises(CheckpointError, match=r"Param 'w' has 5 values \(5,\) but the job's "
                                              r"has 6 \(2, 3\)"):
        sc.load_checkpoints(pset, [good, bad])
    np.testing.assert_array_equal(pset.values, before)
    # shapes may differ when the sizes agree (values in order); a later file wins;
    # a sharer's name is not loaded (its owner's values are)
    later = sc.write_checkpoint(tmp_path / "c", [("w", np.arange(6.0).reshape(3, 2), 7),
                                                 ("wt", np.zeros(6), 1),
                                                 ("b", np.full(3, 5.0), 3)])
    versions = sc.load_checkpoints(pset, [good, later])
    assert versions == {"b": 3, "w": 7}
    np.testing.assert_array_equal(pset["w"].data, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(pset["b"].data, np.full(3, 5.0))


def test_a_chain_of_jobs_through_checkpoint_path(tmp_path: Path, monkeypatch) -> None:  # type: ignore
    """Job 1 trains and leaves <workspace>/checkpoint/step<N>-worker0 (at its checkpoint
    steps and at the end); job 2 names it in checkpoint_path, relative to the working
    folder as in SINGA's rbm examples, and starts from its values."""
    monkeypatch.chdir(tmp_path)
    conf = job(Path("unused"), 12, ckpt=5)
    conf.update({"workspace": None, "cluster": {"workspace": "examples/one"}})  # SINGA's
    first = Trainer(conf, progress=False)
    first.train()
    folder = tmp_path / "examples" / "one" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == ["step10-worker0", "step12-worker0",
                                                        "step5-worker0"]
    final = sc.read_checkpoint(folder / "step12-worker0")
    # named as SINGA v0.2.0+ names the Params of its (unrolled) nets, which it reads
    assert [s.name for s in final] == ["0#w1", "0#b1", "0#w2", "0#b2"]
    assert all(s.version == 12 for s in final)  # 12 updates from step 0
    for s in final:
        np.testing.assert_array_equal(s.values,
                                      first.params[s.name[2:]].data.astype(np.float32))

    # the second job renames w2 (so it is initialised anew) and keeps the versions
    text = (JOB.format(steps=3, ws="examples/two", ckpt=0, vsteps=0,
                       layers=LAYERS.format(data="val_fraction: 0.1").replace('"w2"', '"w2b"'))
            .replace('workspace: "examples/two"', "").replace(
                "timeout: 30", 'timeout: 30 workspace: "examples/two"')
            + '\ncheckpoint_path: "examples/one/checkpoint/step12-worker0"'
            + "\nreset_param_version: false")
    second = Trainer(parse_job(text), progress=False)
    for s in final:
        if s.name != "0#w2":
            np.testing.assert_array_equal(second.params[s.name[2:]].data, s.values)
    fresh = Trainer(parse_job(text.replace("checkpoint_path", "#")), progress=False)
    np.testing.assert_array_equal(second.params["w2b"].data, fresh.params["w2b"].data)
    second.train()
    out = {s.name: s.version for s in sc.read_checkpoint(
        tmp_path / "examples" / "two" / "checkpoint" / "step3-worker0")}
    assert out == {"0#w1": 15, "0#b1": 15, "0#w2b": 3, "0#b2": 15}  # 12 loaded + 3, 0 + 3


def test_a_bad_checkpoint_path_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\xff" * 10)
    conf = job(tmp_path / "w", 2)
    conf.update({"checkpoint_path": [str(tmp_path / "junk")]})
    with pytest.raises(CheckpointError, match="junk: not a SINGA checkpoint"):
        Trainer(conf, progress=False)


def test_no_validation_data_is_refused_before_training(tmp_path: Path) -> None:
    text = JOB.format(steps=4, ws=tmp_path, ckpt=0, vsteps=0, layers=LAYERS.format(data=""))
    with pytest.raises(ParamError, match=r"layer 'data' \(kData\): there is no validation "
                                         r"split \(val_fraction is 0"):
        Trainer(parse_job(text), progress=False)


def test_step_disp_after_and_resume_in_the_file(tmp_path: Path) -> None:
    conf = job(tmp_path, 20, disp_after=3, step=6)
    conf.update({"validate_freq": 0, "test_freq": 0, "test_steps": 0})
    result = Trainer(conf, progress=False).train()
    assert result.step == 20
    train = [int(r["step"]) for r in rows(tmp_path) if r["phase"] == "train"]
    assert train == [8, 13, 18, 20]  # from step 6 on; every 5 from 3; and the last
    conf.update({"train_steps": 30, "checkpoint_freq": 10, "resume": False})
    Trainer(conf, progress=False).train(overwrite=True)
    conf.update({"train_steps": 35, "resume": True})  # as --resume
    assert Trainer(conf, progress=False).train().step == 35
    assert [int(r["step"]) for r in rows(tmp_path) if r["phase"] == "train"][-2:] == [33, 35]
