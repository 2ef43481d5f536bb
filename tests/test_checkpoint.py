"""Checkpoint files (SPEC §9): safetensors, atomic, umask, damaged bytes refused, .npz kept."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from paramserver.checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
    save_tensors,
)

ARRAYS = {
    "step": np.array(7, np.int64),                      # 0-d
    "server/0/0/values": np.linspace(-1, 1, 12, dtype=np.float32),
    "server/0/0/state/history": np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian
    "empty": np.zeros((0, 3), np.float32),
    "flags": np.array([True, False]),
    "half": np.ones(3, np.float16),
    "strided": np.arange(10)[::2],
}
META = {"format": "x", "step": 7, "params": [["w", 12]], "nested": {"a": [1, 2.5]}}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("suffix", [".ckpt.safetensors", ".npz"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    path = save_checkpoint(tmp_path / f"c{suffix}", ARRAYS, META)
    arrays, meta = load_checkpoint(path)
    assert meta == META and same(arrays, ARRAYS)
    assert arrays["step"].shape == () and arrays["half"].dtype == np.float16
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_safetensors_is_readable_by_safetensors_itself(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = save_checkpoint(tmp_path / checkpoint_name(3), ARRAYS, META)
    assert path.name == "step-00000003.ckpt.safetensors"
    with safe_open(str(path), framework="np") as f:  # by memory map
        assert set(f.keys()) == set(ARRAYS)
        assert json.loads(f.metadata()["paramserver_meta"]) == META
        assert np.array_equal(f.get_tensor("server/0/0/values"), ARRAYS["server/0/0/values"])


@pytest.mark.parametrize("suffix", [".ckpt.safetensors", ".npz"])
def test_files_take_the_users_umask(tmp_path: Path, suffix: str) -> None:
    old = os.umask(0o027)
    try:
        path = save_checkpoint(tmp_path / f"c{suffix}", ARRAYS, META)
        model = save_tensors(tmp_path / "m.safetensors", {"w": np.ones(2, np.float32)})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640  # not mkstemp's 0600
    assert model.stat().st_mode & 0o777 == 0o640


def test_only_numbers_are_saved(tmp_path: Path) -> None:
    for bad in ({"x": np.array(["a"])}, {"x": np.array([{}], dtype=object)},
                {"__metadata__": np.ones(1)}, {"__meta__": np.ones(1)}):
        with pytest.raises(ValueError):
            save_checkpoint(tmp_path / "c.ckpt.safetensors", bad, {})
    assert list(tmp_path.iterdir()) == []


def damaged_versions(good: bytes) -> list[bytes]:
    """The file with one bit flipped: the lowest of every byte, the highest of every 5th;
    then cut short."""
    out = []
    for i in range(len(good)):
        for mask in (0x01, 0x80) if i % 5 == 0 else (0x01,):
            b = bytearray(good)
            b[i] ^= mask
            out.append(bytes(b))
    return out + [good[:n] for n in (0, 1, 7, 8, 9, 40, len(good) // 2, len(good) - 1)]


@pytest.mark.parametrize("suffix", [".ckpt.safetensors", ".npz"])
def test_every_damaged_byte_is_refused_or_harmless(tmp_path: Path, suffix: str) -> None:
    arrays = {"step": np.array(7, np.int64), "values": np.linspace(-1, 1, 12, np.float32)}
    meta = {"step": 7, "params": [["w", 12]]}
    good = save_checkpoint(tmp_path / f"good{suffix}", arrays, meta).read_bytes()
    path = tmp_path / f"bad{suffix}"
    refused = 0
    for data in damaged_versions(good):
        path.write_bytes(data)
        try:
            got, got_meta = load_checkpoint(path)
        except CheckpointError:  # and no other exception
            refused += 1
            continue
        # A byte that carries no information (a zip timestamp) may change: never the content.
        assert got_meta == meta and same(got, arrays)
    assert refused > len(good) // 2
    if suffix != ".npz":  # every byte of a safetensors checkpoint is checked
        assert refused == len(damaged_versions(good))


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "absent.ckpt.safetensors")
    (tmp_path / "empty.ckpt.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.ckpt\.safetensors: not a readable"):
        load_checkpoint(tmp_path / "empty.ckpt.safetensors")
    plain = save_tensors(tmp_path / "model.safetensors", {"w": np.ones(2, np.float32)})
    with pytest.raises(CheckpointError, match="without paramserver's metadata"):
        load_checkpoint(plain)
    with pytest.raises(CheckpointError, match="is a folder, not a file"):
        load_checkpoint(tmp_path)  # a folder


def test_npz_with_objects_is_refused_without_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object),
             __meta__=np.frombuffer(b"{}", np.uint8))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    with zipfile.ZipFile(tmp_path / "nometa.npz", "w") as z:
        z.writestr("x.npy", b"")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "nometa.npz")


def test_listing_prefers_safetensors_and_skips_what_does_not_load(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "step-00000010.ckpt.npz", ARRAYS, {"step": 10})
    save_checkpoint(tmp_path / checkpoint_name(10), ARRAYS, {"step": 10, "new": True})
    save_checkpoint(tmp_path / "step-00000005.ckpt.npz", ARRAYS, {"step": 5})
    (tmp_path / checkpoint_name(20)).write_bytes(b"\x00" * 100)  # damaged newest
    (tmp_path / "notes.txt").write_text("x")
    steps = list_checkpoints(tmp_path)
    assert [s for s, _ in steps] == [5, 10, 20]
    assert steps[1][1].name.endswith(".safetensors")
    found = load_latest_checkpoint(tmp_path)
    assert found is not None and found[2] == {"step": 10, "new": True}


# -- the checkpoint suite: every byte of a real training checkpoint ------------------------------

TINY = """
train_steps: 3
checkpoint_freq: 3
seed: 1
workspace: "{ws}"
updater {{ type: kAdam learning_rate {{ base_lr: 0.01 }} }}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "{data}" batchsize: 4 }} }}
  layer {{ name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 2 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }}
}}
"""


@pytest.fixture(scope="module")
def training_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint the trainer wrote: values, Adam's two states, versions, step, window,
    the job's configuration and Param table."""
    from paramserver.config.job import parse_job
    from paramserver.train.trainer import Trainer

    ws = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)  # 2 classes of 3 features: a checkpoint of a few KB
    np.savez(ws / "data.npz", x=rng.normal(size=(20, 3)), y=np.arange(20) % 2)
    Trainer(parse_job(TINY.format(ws=ws, data=ws / "data.npz")), progress=False,
            tensorboard=False).train()
    return ws / "checkpoints" / checkpoint_name(3)


@pytest.mark.parametrize("suffix", [".ckpt.safetensors", ".npz"])
def test_every_flipped_byte_of_a_training_checkpoint(tmp_path: Path, training_checkpoint: Path,
                                                     suffix: str) -> None:
    """Each byte in turn inverted: the file loads as it was saved, or is refused with
    CheckpointError and nothing else. (Single bits: test_every_damaged_byte_is_refused_or_
    harmless; ``--resume`` then goes back to the checkpoint before: test_resume.py.)"""
    arrays, meta = load_checkpoint(training_checkpoint)
    assert {"layout", "step"} <= set(arrays) and len(arrays) > 5
    good = save_checkpoint(tmp_path / f"good{suffix}", arrays, meta).read_bytes()
    path = tmp_path / f"bad{suffix}"
    outcomes = {"refused": 0, "same": 0}
    for i in range(len(good)):
        damaged = bytearray(good)
        damaged[i] ^= 0xFF
        path.write_bytes(damaged)
        try:
            got, got_meta = load_checkpoint(path)
        except CheckpointError:
            outcomes["refused"] += 1
            continue
        assert got_meta == meta and same(got, arrays), i
        outcomes["same"] += 1
    if suffix != ".npz":
        assert outcomes["same"] == 0  # every byte of a safetensors checkpoint is checked
    else:  # a zip's timestamps, flags and extra fields are not; its content is (CRC-32)
        assert outcomes["refused"] > outcomes["same"]
