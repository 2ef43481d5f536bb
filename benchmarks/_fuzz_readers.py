"""Mutants of the files paramserver reads besides job files, for ``fuzz_jobs.py --readers``
and ``tests/test_fuzz_readers.py``.

Four readers, each with valid seed files made here (seeded, so a run is reproducible) and
mutants of two kinds: bytes changed at random (flipped, inserted, deleted, repeated, cut,
lengthened), and files rebuilt with a field of their own format changed (a header that
declares 2^40 values, another dtype, a negative size, a forged layout or alias under valid
checksums, a record whose shape does not fit its values):

* ``data``: ``.npz`` data sources, read as ``paramserver data`` reads them
  (:func:`paramserver.singa.datasets.write_dataset`);
* ``safetensors``: model files read by ``init { type: kFromFile }``
  (:func:`paramserver.init.read_tensor`);
* ``checkpoint``: training checkpoints (safetensors and the ``.npz`` of earlier releases),
  read as ``paramserver export`` reads them (:func:`paramserver.export.export_model`);
* ``singa``: SINGA's stores (kvfile, DataShard, CSV), mean files and checkpoints
  (:mod:`paramserver.singa.stores`, :mod:`paramserver.singa.checkpoints`).

A mutant read in this process may end in nothing but a value or a ``ParamError`` (its
subclass ``CheckpointError`` included) within :data:`HANG_SECONDS`; through the command line
(``paramserver data``, ``check``, ``export``) in exit 0 or 2, with no traceback.
"""

from __future__ import annotations

import io
import json
import random
import signal
import struct
import subprocess
import sys
import traceback
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paramserver.config import ParamError

HANG_SECONDS = 5.0
READERS = ("data", "safetensors", "checkpoint", "singa")

#: Numbers that break assumptions about sizes.
HUGE = [2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1, 2**64, -1, -(2**31), 0, 1, 3, 10**30]
#: dtypes a file may declare.
SAFETENSORS_DTYPES = ["F8_E4M3", "F8_E5M2", "BF16", "F16", "F32", "F64", "I8", "I64", "U64",
                      "BOOL", "C64", "XYZ", "", 7, None]
NUMPY_DTYPES = ["int8", "uint64", "float16", "float64", "complex64", "bool", "<U3", "S2",
                "datetime64[s]", "V4", "int64", ">f4", ">i8"]


# -- byte mutations ---------------------------------------------------------------------------

def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One to four random changes of ``data``."""
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 4])):
        pos = rng.randrange(len(out) + 1)
        kind = rng.randrange(7)
        if kind == 0 and out:  # flip a byte
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif kind == 1:  # insert bytes
            out[pos:pos] = rng.choice([b"\x00", b"\xff" * 8, struct.pack("<Q", 2**40),
                                       struct.pack("<q", -1), bytes(rng.randrange(256)
                                                                    for _ in range(8))])
        elif kind == 2 and out:  # delete a run
            del out[pos:pos + rng.randint(1, 64)]
        elif kind == 3:  # repeat a run
            out[pos:pos] = out[pos:pos + rng.randint(1, 64)] * rng.randint(1, 8)
        elif kind == 4:  # cut the end
            del out[pos:]
        elif kind == 5:  # a little-endian length field somewhere set to a huge number
            if len(out) >= 8:
                at = rng.randrange(len(out) - 7)
                out[at:at + 8] = struct.pack("<Q", rng.choice(HUGE) % 2**64)
        else:  # lengthen
            out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return bytes(out)


# -- the readers --------------------------------------------------------------------------------

@dataclass
class Reader:
    """A reader under test: valid seeds, a structure-aware mutation, the read itself, and
    the command that reads a file so."""

    name: str
    make_seeds: Callable[[Path], list[Path]]
    restructure: Callable[[random.Random, Path, Path], None]
    read: Callable[[Path, Path], Any]
    command: Callable[[Path, Path], list[str]]


def _kind(path: Path) -> str:
    """The seed's kind, in its name: ``<kind>.<n>.<suffix>``."""
    return path.name.split(".")[0]


# data sources (.npz)

def _data_seeds(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    out = []
    x, y = rng.random((30, 8), np.float32), rng.integers(0, 4, 30)
    np.savez(out_path := folder / "plain.0.npz", x=x, y=y)
    out.append(out_path)
    np.savez_compressed(out_path := folder / "split.1.npz", x=x, y=y, x_test=x[:5],
                        y_test=y[:5])
    out.append(out_path)
    np.savez(out_path := folder / "ids.2.npz", x=rng.integers(0, 50, (30, 4)),
             y=y.astype(np.float64))
    out.append(out_path)
    return out


def _data_restructure(rng: random.Random, seed: Path, out: Path) -> None:
    with np.load(seed) as z:
        arrays = {k: z[k] for k in z.files}
    key = rng.choice(sorted(arrays))
    kind = rng.randrange(6)
    if kind == 0:  # another dtype
        try:
            arrays[key] = arrays[key].astype(rng.choice(NUMPY_DTYPES))
        except (TypeError, ValueError):
            arrays[key] = np.array([object()] * len(arrays[key]), dtype=object)
    elif kind == 1:  # another shape
        arrays[key] = np.zeros(rng.choice([(), (0,), (30, 0), (2, 2, 2, 2), (31,), (30, 1)]))
    elif kind == 2:  # NaN, inf, huge or negative values
        a = arrays[key].astype(np.float64)
        a.reshape(-1)[rng.randrange(a.size)] = rng.choice([np.nan, np.inf, -1, 2.0**62, 0.5])
        arrays[key] = a
    elif kind == 3:  # a key dropped, or an unexpected one
        if rng.random() < 0.5:
            del arrays[key]
        else:
            arrays[rng.choice(["x_val", "y_val", "x_test", "z"])] = arrays[key]
    elif kind == 4:  # an object array (pickled by numpy; never unpickled when read)
        arrays[key] = np.array([{"a": 1}] * 3, dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    if kind == 5:  # a header declaring another shape than the data holds
        data = _forge_npy_shape(data, rng)
    out.write_bytes(data)


def _forge_npy_shape(data: bytes, rng: random.Random) -> bytes:
    """The archive with one member's ``.npy`` header declaring a huge shape."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as dst:
        names = src.namelist()
        target = rng.choice(names)
        for name in names:
            member = src.read(name)
            if name == target:
                start = member.index(b"'shape': (") + len(b"'shape': (")
                end = member.index(b")", start)
                forged = str(rng.choice([2**40, 2**31, 10**12])).encode() + b","
                member = member[:start] + forged.ljust(end - start) + member[end:]
            dst.writestr(name, member)
    return buffer.getvalue()


def _data_read(path: Path, scratch: Path) -> Any:
    from paramserver.singa.datasets import write_dataset
    from paramserver.train.data import clear_cache

    clear_cache()
    return write_dataset(str(path), scratch / "out.bin", split="all", encoding="float")


def _data_command(path: Path, scratch: Path) -> list[str]:
    return ["data", str(path), str(scratch / "out.bin"), "--split", "all", "--encoding",
            "float"]


# safetensors model files (kFromFile)

#: The shapes of the Params of the command's job (:func:`_safetensors_command`).
TENSOR_SHAPE, BIAS_SHAPE = (10, 64), (10,)


def _safetensors_seeds(folder: Path) -> list[Path]:
    from paramserver.checkpoint import save_tensors

    rng = np.random.default_rng(1)
    w = rng.standard_normal(TENSOR_SHAPE).astype(np.float32)
    out = [save_tensors(folder / "float.0.safetensors",
                        {"w": w, "b": np.zeros(BIAS_SHAPE, np.float32),
                         "h": w.astype(np.float16)})]
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 patterns
    path = folder / "bf16.1.safetensors"
    _write_raw_safetensors(path, {"w": ("BF16", list(TENSOR_SHAPE), bf16.tobytes()),
                                  "b": ("I64", list(BIAS_SHAPE), np.arange(10).tobytes())})
    out.append(path)
    return out


def _write_raw_safetensors(path: Path, tensors: dict[str, tuple[Any, Any, bytes]],
                           header_extra: dict[str, Any] | None = None,
                           offsets: dict[str, Any] | None = None) -> None:
    header: dict[str, Any] = dict(header_extra or {})
    data, pos = b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": (offsets or {}).get(name, [pos, pos + len(raw)])}
        data += raw
        pos += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _read_raw_safetensors(path: Path) -> dict[str, tuple[Any, Any, bytes]]:
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    body = data[8 + size:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def _safetensors_restructure(rng: random.Random, seed: Path, out: Path) -> None:
    tensors = _read_raw_safetensors(seed)
    key = rng.choice(sorted(tensors))
    dtype, shape, raw = tensors[key]
    kind = rng.randrange(5)
    offsets = None
    if kind == 0:
        dtype = rng.choice(SAFETENSORS_DTYPES)
    elif kind == 1:
        shape = rng.choice([[2**31], [2**40, 2**40], [-1, 3], [], [4, 3, 0], ["a"], 5,
                            [rng.choice(HUGE)]])
    elif kind == 2:  # offsets that leave the data, overlap, or go backwards
        offsets = {key: rng.choice([[0, 2**40], [-1, 5], [5, 2], [0, len(raw) + 1],
                                    [0, "x"], None])}
    elif kind == 3:  # NaN and infinities in float values
        if dtype == "F32" and raw:
            values = np.frombuffer(raw, np.float32).copy()
            values[rng.randrange(values.size)] = rng.choice([np.nan, np.inf, -np.inf])
            raw = values.tobytes()
    tensors[key] = (dtype, shape, raw)
    extra = ({"__metadata__": rng.choice([{"a": 1}, "x", [1], {"a": "b"}])}
             if kind == 4 else None)
    _write_raw_safetensors(out, tensors, extra, offsets)


def _safetensors_read(path: Path, scratch: Path) -> Any:
    from paramserver.init import read_tensor

    out, refused = [], None
    for key, shape in (("w", TENSOR_SHAPE), ("b", BIAS_SHAPE), ("h", TENSOR_SHAPE)):
        try:
            out.append(read_tensor(str(path), key, shape, key, np.float32))
        except ParamError as e:  # each key on its own: a refusal of one does not end it
            refused = e
    if refused is not None and not out:
        raise refused
    return out


def _safetensors_command(path: Path, scratch: Path) -> list[str]:
    job = scratch / "fromfile.conf"
    job.write_text(
        'train_steps: 1\nneuralnet {\n'
        '  layer { name: "data" type: kData data_conf { source: "digits" batchsize: 8 } }\n'
        '  layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf { '
        'num_output: 10 }\n'
        f'    param {{ name: "w" init {{ type: kFromFile path: "{path}" }} }}\n'
        f'    param {{ name: "b" init {{ type: kFromFile path: "{path}" }} }} }}\n'
        '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n}\n')
    return ["check", str(job)]


# training checkpoints (paramserver export)

def _checkpoint_seeds(folder: Path) -> list[Path]:
    from paramserver.checkpoint import save_checkpoint
    from paramserver.export import TABLE

    values = np.arange(10, dtype=np.float32)
    arrays = {"step": np.array(3, np.int64), "layout": np.array([[0, 6], [6, 10]], np.int64),
              "server/0/0/values": values[:6], "server/0/1/values": values[6:],
              "server/0/0/versions": np.zeros(1, np.int64),
              "server/0/1/versions": np.zeros(1, np.int64),
              "server/0/0/state/w/history": values[:6] * 0}
    meta = {"format": "paramserver-checkpoint/1", "step": 3, "job": "fuzz",
            "params": [["w", 6], ["b", 4]],
            TABLE: {"params": [["w", [2, 3], None], ["b", [4], None], ["t", [3, 2], "w"]],
                    "aliases": {"fc.weight": "w"}}}
    optimizer = {"param/w": values[:6].reshape(2, 3), "param/b": values[6:]}
    return [save_checkpoint(folder / "cluster.0.ckpt.safetensors", arrays, meta),
            save_checkpoint(folder / "old.1.ckpt.npz", arrays,
                            {k: v for k, v in meta.items() if k != TABLE}),
            save_checkpoint(folder / "optimizer.2.ckpt.safetensors", optimizer,
                            {"format": "paramserver-optimizer/1"})]


def _checkpoint_restructure(rng: random.Random, seed: Path, out: Path) -> None:
    """A checkpoint with a forged field under valid checksums."""
    from paramserver.checkpoint import load_checkpoint, save_checkpoint
    from paramserver.export import TABLE

    arrays, meta = load_checkpoint(seed)
    kind = rng.randrange(6)
    if kind == 0 and "layout" in arrays:
        arrays["layout"] = np.array(rng.choice([[[0, 2**40]], [[2**40, 2**40]], [[-5, 3]],
                                                [[0, 6], [3, 10]], [[0, 6]], [[6, 0]]]),
                                    np.int64).reshape(-1, 2)
    elif kind == 1 and TABLE in meta:
        meta[TABLE]["aliases"] = rng.choice([[1, 2], "x", {"a": "nope"}, {"a": 3},
                                             {"a": ["w"]}, None, {"": "w"}])
    elif kind == 2 and TABLE in meta:
        meta[TABLE]["params"] = rng.choice([
            [["w", [2**40, 2**40], None]], [["w", [-1, 5], None]], [["w", "ab", None]],
            [[1, [2, 3], None]], [["w", [2, 3], 7]], [["w"]], "params", [["t", [6], "zz"]],
            [["w", [2, 3], None], ["b", [4], None], ["t", [7], "w"]]])
    elif kind == 3:
        meta["params"] = rng.choice([[["w", 2**62], ["b", -2**62 + 10]], [["w", -1]], "x",
                                     [["w", 6]], [[None, None]]])
    elif kind == 4 and arrays:
        key = rng.choice(sorted(arrays))
        arrays[key] = rng.choice([np.zeros((2, 2, 2), np.float32), np.zeros(0, np.int8),
                                  np.array(2**40, np.int64), np.zeros(3, np.float16),
                                  np.array([True, False])])
    else:
        meta[rng.choice(["format", TABLE, "step"])] = rng.choice([None, 3, "x", [1], {}])
    save_checkpoint(out, arrays, meta)


def _checkpoint_read(path: Path, scratch: Path) -> Any:
    from paramserver.export import export_model

    return export_model(path, scratch / "model.safetensors")


def _checkpoint_command(path: Path, scratch: Path) -> list[str]:
    return ["export", str(path), "--to", str(scratch / "model.safetensors")]


# SINGA's stores, mean files and checkpoints

def _singa_seeds(folder: Path) -> list[Path]:
    from paramserver.singa import checkpoints, stores

    rng = np.random.default_rng(2)
    pixels = stores.Samples(rng.integers(0, 256, (6, 2, 3), np.uint8), np.arange(6) % 3)
    floats = stores.Samples(rng.random((6, 4)).astype(np.float32), np.arange(6) % 2)
    (folder / "shard.2.store").mkdir()
    return [stores.write_records(folder / "kvfile.0.bin", pixels, "kvfile"),
            stores.write_records(folder / "kvfile.1.bin", floats, "kvfile"),
            stores.write_records(folder / "shard.2.store", pixels, "shard").parent,
            stores.write_csv(folder / "csv.3.csv", floats),
            stores.write_mean(folder / "mean.4.bin", floats.x.mean(0), "kvfile"),
            stores.write_mean(folder / "meanshard.5.bin", floats.x.mean(0), "shard"),
            checkpoints.write_checkpoint(folder / "ckpt.6.bin",
                                         [("w", np.ones(TENSOR_SHAPE), 5),
                                          ("b", np.zeros(BIAS_SHAPE), 1)])]


def _file_of(path: Path) -> Path:
    """The file of a seed or mutant: a shard's ``shard.dat``, else itself."""
    return path / "shard.dat" if path.is_dir() else path


def _singa_restructure(rng: random.Random, seed: Path, out: Path) -> None:
    from paramserver.singa import stores
    from paramserver.singa.records import BlobProtos, RecordProto

    kind = _kind(seed)
    data = _file_of(seed).read_bytes()
    if kind == "csv":
        lines = data.decode().split("\n")
        i = rng.randrange(len(lines))
        lines[i] = rng.choice(["", "1", "x,1,2", "9" * 30 + ",1,2,3,4", "1,nan,inf,-inf,1",
                               "1,1,1", ",,,,", "1;2;3", "-1,0,0,0,0", "\x00"])
        new = "\n".join(lines).encode()
    elif kind == "ckpt":
        msg = BlobProtos()
        msg.ParseFromString(data)
        blob = msg.blob[rng.randrange(len(msg.blob))]
        del blob.shape[:]
        blob.shape.extend(rng.choice([[2**31 - 1, 2**31 - 1, 4], [-1], [7], [], [2, 3, 0]]))
        if rng.random() < 0.3:
            msg.version[0] = rng.choice([-5, 2**31 - 1])
        if rng.random() < 0.3:
            msg.name.append("extra")
        new = msg.SerializeToString()
    else:  # a kvfile: a record's sample, or its length fields
        records = stores.decode_kvfile(data) if kind != "meanshard" else [(b"", data)]
        i = rng.randrange(len(records))
        key, value = records[i]
        if kind in ("kvfile", "mean", "meanshard"):
            sample = RecordProto()
            sample.ParseFromString(value)
            del sample.shape[:]
            sample.shape.extend(rng.choice([[2**31 - 1] * 3, [-4], [0], [1, 2, 3, 4, 5],
                                            [2, 3], [4]]))
            if rng.random() < 0.3:
                sample.pixel = bytes(rng.randrange(256) for _ in range(rng.choice([0, 5])))
            value = sample.SerializeToString()
        records[i] = (key, value)
        new = b"".join(stores.SIZE.pack(len(k)) + k + stores.SIZE.pack(len(v)) + v
                       for k, v in records)
        if kind == "meanshard":
            new = value
        if rng.random() < 0.3:  # a length field declaring 2^40 bytes
            at = rng.choice([0, 8 + len(records[0][0])])
            new = new[:at] + stores.SIZE.pack(2**40) + new[at + 8:]
    _write_like(seed, out, new)


def _write_like(seed: Path, out: Path, data: bytes) -> None:
    """Write ``data`` as ``seed`` is laid out (a shard: a folder holding shard.dat)."""
    if seed.is_dir():
        out.mkdir(exist_ok=True)
        (out / "shard.dat").write_bytes(data)
    else:
        out.write_bytes(data)


def _singa_read(path: Path, scratch: Path) -> Any:
    from paramserver.singa import checkpoints, stores

    kind = _kind(path)
    if kind in ("kvfile", "shard"):
        return stores.read_records(path, "shard" if kind == "shard" else "kvfile")
    if kind == "csv":
        return stores.read_records(path, "textfile")
    if kind in ("mean", "meanshard"):
        return stores.read_mean(path, "kvfile" if kind == "mean" else "shard")
    return checkpoints.read_checkpoint(path)


def _singa_command(path: Path, scratch: Path) -> list[str]:
    kind = _kind(path)
    if kind == "ckpt":  # checkpoint_path is read where the Params are made: train, 0 steps
        job = scratch / "ckpt.conf"
        job.write_text(
            f'train_steps: 0\ncheckpoint_path: "{path}"\nworkspace: "{scratch / "ws"}"\n'
            'neuralnet {\n  layer { name: "data" type: kData data_conf { source: "digits" '
            'batchsize: 8 } }\n  layer { name: "fc" type: kInnerProduct srclayers: "data" '
            'innerproduct_conf { num_output: 10 }\n    param { name: "w" } param { name: "b" } }'
            '\n  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n'
            '}\n')
        return ["train", str(job), "--quiet", "--no-tensorboard", "--overwrite"]
    backend = {"kvfile": "kvfile", "shard": "shard", "csv": "textfile",
               "meanshard": "shard"}.get(kind, "kvfile")
    mean = f' mean_file: "{path}"' if kind in ("mean", "meanshard") else ""
    store = scratch / "store"
    if mean:  # a store to go with the mean file, of its backend
        from paramserver.singa import stores

        if backend == "shard":
            store.mkdir(exist_ok=True)
        stores.write_records(store, stores.Samples(np.zeros((4, 4), np.float32),
                                                   np.zeros(4, np.int64)), backend)
    source = store if mean else path
    job = scratch / "store.conf"
    job.write_text(
        'train_steps: 1\nneuralnet {\n'
        f'  layer {{ name: "data" type: kRecordInput store_conf {{ backend: "{backend}" '
        f'path: "{source}" batchsize: 2{mean} }} }}\n'
        '  layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf { '
        'num_output: 3 } }\n'
        '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n}\n')
    return ["check", str(job)]


def readers() -> dict[str, Reader]:
    return {"data": Reader("data", _data_seeds, _data_restructure, _data_read,
                           _data_command),
            "safetensors": Reader("safetensors", _safetensors_seeds,
                                  _safetensors_restructure, _safetensors_read,
                                  _safetensors_command),
            "checkpoint": Reader("checkpoint", _checkpoint_seeds, _checkpoint_restructure,
                                 _checkpoint_read, _checkpoint_command),
            "singa": Reader("singa", _singa_seeds, _singa_restructure, _singa_read,
                            _singa_command)}


# -- running ------------------------------------------------------------------------------------

def make_mutant(rng: random.Random, reader: Reader, seeds: list[Path], out_dir: Path,
                number: int) -> Path:
    """Mutant ``number`` of one of ``seeds``, written into ``out_dir`` (named as its seed's
    kind, for the reader)."""
    seed = rng.choice(seeds)
    name = seed.name.split(".")
    out = out_dir / ".".join([name[0], f"m{number}", *name[2:]])
    if rng.random() < 0.5:
        reader.restructure(rng, seed, out)
        if rng.random() < 0.3:  # and bytes changed too
            _write_like(seed, out, mutate_bytes(rng, _file_of(out).read_bytes()))
    else:
        _write_like(seed, out, mutate_bytes(rng, _file_of(seed).read_bytes()))
    return out


class Hang(Exception):
    """A call ran past its time (:func:`time_limit`)."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the block when it runs longer than ``seconds`` (the main
    thread's SIGALRM; the previous handler back after). Shared with ``fuzz_jobs.py``."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def read_in_process(reader: Reader, path: Path, scratch: Path) -> str:
    """``ok``, ``refused`` (a ParamError), ``hang`` or ``crash: ...``."""
    try:
        with time_limit(HANG_SECONDS):
            reader.read(path, scratch)
        return "ok"
    except ParamError:
        return "refused"
    except Hang:
        return "hang"
    except Exception as e:  # what the fuzzer is for
        return crash_text(e)


def crash_text(e: BaseException) -> str:
    """``crash: Type: message (file:line)`` of an exception, the place where it was raised."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"crash: {type(e).__name__}: {e} ({frame.filename}:{frame.lineno})"[:300]


def read_by_cli(reader: Reader, path: Path, scratch: Path) -> str:
    """``ok``, ``refused`` (exit 2), ``hang``, ``exit N`` or ``traceback``."""
    return cli_outcome(reader.command(path, scratch), HANG_SECONDS + 55)


def cli_outcome(argv: list[str], timeout: float) -> str:
    """How ``paramserver ARGV`` ends: ``ok``, ``refused`` (exit 2), ``hang`` (past
    ``timeout`` seconds), ``exit N`` or ``traceback``."""
    try:
        proc = subprocess.run([sys.executable, "-m", "paramserver", *argv],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang"
    if "Traceback" in proc.stderr:
        return "traceback"
    if proc.returncode not in (0, 2):
        return f"exit {proc.returncode}"
    return "ok" if proc.returncode == 0 else "refused"


__all__ = ["HANG_SECONDS", "READERS", "Reader", "cli_outcome", "crash_text", "make_mutant",
           "mutate_bytes", "read_by_cli", "read_in_process", "readers"]
