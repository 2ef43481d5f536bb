"""Hostile files, full disks and odd paths (issue 30): nothing is overwritten that was not
asked for, every mistake is exit 2 with one message and no traceback, no reader hangs or
runs out of memory on what a file declares, and a full disk stops a run with one message
that says what it keeps.

The full disk is real, not simulated: the run is a child process whose file-size limit
(``RLIMIT_FSIZE``, what ``ulimit -f`` sets) is below a checkpoint's size, so the kernel
refuses the write (``EFBIG``, as ``ENOSPC`` on a full disk; Python ignores ``SIGXFSZ``);
``/dev/full`` gives a real ``ENOSPC`` to one write.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import paramserver.kv as kv
from paramserver.atomic import write_atomically
from paramserver.checkpoint import load_checkpoint, save_checkpoint
from paramserver.cli import main
from paramserver.config import ParamError
from paramserver.export import TABLE
from paramserver.paths import NoSpaceError, path_error
from resume_rows import assert_rows_of_a_resume

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the fuzzers' time limit (watchdog)
MLP = ROOT / "examples" / "digits_mlp.conf"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def refused(code: int, err: str, *names: str) -> None:
    """Exit 2, one message naming each of ``names``, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("paramserver ") and ": error: " in err, err
    for name in names:
        assert name in err, (name, err)


@contextmanager
def watchdog(seconds: float = 60) -> Iterator[None]:
    """Fail instead of hanging (a pipe opened for reading waits for a writer)."""
    from _fuzz_readers import Hang, time_limit

    try:
        with time_limit(seconds):
            yield
    except Hang:
        raise AssertionError(f"still running after {seconds} s: it hangs") from None


def a_checkpoint(path: Path, layout: Any = ((0, 10),), aliases: Any = None) -> Path:
    """A cluster's checkpoint as training writes one (valid checksums), of two Params."""
    values = np.arange(10, dtype=np.float32)
    arrays = {"step": np.array(3, np.int64), "layout": np.array(layout, np.int64),
              "server/0/0/values": values, "server/0/0/versions": np.zeros(1, np.int64)}
    meta = {"format": "paramserver-checkpoint/1", "step": 3,
            TABLE: {"params": [["w", [2, 3], None], ["b", [4], None]],
                    "aliases": {"fc.weight": "w"} if aliases is None else aliases}}
    return save_checkpoint(path, arrays, meta)


# -- never overwrite an input or a non-file -------------------------------------------------------


def test_export_to_its_own_checkpoint_is_refused(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    ckpt = a_checkpoint(tmp_path / "step-00000003.ckpt.safetensors")
    before = ckpt.read_bytes()
    link = tmp_path / "link.safetensors"
    link.symlink_to(ckpt)
    refused(*run(capsys, "export", str(ckpt), "--to", str(ckpt)),
            "is the checkpoint", "does not write over its own input")
    refused(*run(capsys, "export", str(link), "--to", str(ckpt)), "is the checkpoint")
    refused(*run(capsys, "export", str(ckpt), "--to", str(link)), "a symbolic link")
    refused(*run(capsys, "export", str(tmp_path), "--to", str(ckpt)), "is the checkpoint")
    assert ckpt.read_bytes() == before and link.is_symlink()


def test_export_to_a_checkpoint_name_is_refused(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    ckpt = a_checkpoint(tmp_path / "a.ckpt.safetensors")
    other = tmp_path / "step-00000001.ckpt.safetensors"
    refused(*run(capsys, "export", str(ckpt), "--to", str(other)), "checkpoint's name")
    assert not other.exists()


def test_data_over_its_own_source_is_refused(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    source = tmp_path / "src.npz"
    np.savez(source, x=np.ones((4, 4)), y=np.arange(4))
    before = source.read_bytes()
    refused(*run(capsys, "data", str(source), str(source)), "is the source")
    refused(*run(capsys, "data", "digits", str(tmp_path / "a.bin"), "--mean",
                 str(tmp_path / "a.bin")), "give each output its own path")
    assert source.read_bytes() == before and not (tmp_path / "a.bin").exists()


def special_file(path: Path, kind: str) -> Path:
    """A file that is not a regular one at ``path``: a named pipe, a folder, a symbolic
    link (to a file beside it), or the device ``kind`` names (``/dev/full``: its path)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink":
        (path.parent / "target").write_text("kept")
        path.symlink_to(path.parent / "target")
    else:
        if not os.path.exists(kind):
            pytest.skip(f"no {kind} on this system")
        return Path(kind)
    return path


@pytest.mark.parametrize("kind", ["fifo", "/dev/full", "folder", "symlink"])
def test_the_writer_replaces_only_a_regular_file(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path, kind: str) -> None:
    out = special_file(tmp_path / "out", kind)
    mode = os.lstat(out).st_mode
    refused(*run(capsys, "data", "digits", str(out)), str(out))
    assert os.lstat(out).st_mode == mode  # still the node it was, not a regular file
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ParamError, match=r"only a regular file is replaced|symbolic link"):
        write_atomically(out, lambda tmp: tmp.write_bytes(b"x"))


# -- what is saved can be loaded ---------------------------------------------------------------


def test_kv_save_and_load_round_trip_keys_that_look_like_array_names(tmp_path: Path) -> None:
    keys = ["w", "w/state/m", "w/values", "w/state/history/values", "a b", "ключ"]

    def grads(step: int) -> list[np.ndarray]:  # new arrays: a local store keeps init's
        return [np.full(i + 2, i + step, np.float32) for i in range(len(keys))]

    with kv.create("local", updater={"type": "kAdam", "learning_rate": {"base_lr": 0.1}}) as s:
        s.init(keys, grads(0))
        s.push(keys, grads(1))
        s.save(str(tmp_path / "kv.safetensors"))
        expected = s.pull(keys)
        s.push(keys, grads(2))  # one more step: the updater's state must have been saved
        after = s.pull(keys)
    with kv.create("local") as t:
        t.load(str(tmp_path / "kv.safetensors"))
        assert all(np.array_equal(a, b) for a, b in zip(t.pull(keys), expected))
        t.push(keys, grads(2))
        assert all(np.array_equal(a, b) for a, b in zip(t.pull(keys), after))


@pytest.mark.parametrize("key", ["\ud800", "a\nb", "\x00", "x" * 1025, -1, 2**63, ""])
def test_kv_refuses_at_init_a_key_a_file_cannot_hold(key: Any) -> None:
    with kv.create("local") as s:
        with pytest.raises(ParamError):
            s.init(key, np.zeros(2, np.float32))
        s.init("ok", np.zeros(2, np.float32))  # nothing was made of the refused one


def test_kv_refuses_use_after_close() -> None:
    s = kv.create("local")
    s.init("w", np.zeros(2, np.float32))
    s.close()
    s.close()  # idempotent
    for call in (lambda: s.push("w", np.ones(2, np.float32)), lambda: s.pull("w"),
                 lambda: s.init("v", np.zeros(2, np.float32)), s.wait):
        with pytest.raises(ParamError, match="closed"):
            call()


# -- tracebacks that were exit 2 ------------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    (["--shape", "99999999999999999999"], "a dimension is at most"),
    (["--shape", "100000,100000"], "holds less than 2 GiB"),
    (["--shape", "20000,20000", "--encoding", "float"], "GiB"),
])
def test_data_shapes_beyond_a_record(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     args: list[str], expected: str) -> None:
    refused(*run(capsys, "data", "digits", str(tmp_path / "out.bin"), *args), expected)
    assert not (tmp_path / "out.bin").exists()


def test_data_empty_output_and_huge_labels(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    refused(*run(capsys, "data", "digits", ""), "the output path is empty")
    source = tmp_path / "big.npz"
    np.savez(source, x=np.zeros((3, 4)), y=np.array([0, 1, 2**62]))
    refused(*run(capsys, "data", str(source), str(tmp_path / "o.bin"), "--split", "all"),
            "does not fit SINGA's records")


def _raw_safetensors(path: Path, header: dict[str, Any], size: int) -> None:
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + size)  # sparse: the size is declared, not stored


def net_job(path: Path, data: str, fc: str = "") -> Path:
    """A job of a data layer (``data``: its type and configuration), a fully connected one
    of 10 outputs (``fc``: more of its fields) and a loss, written to ``path``."""
    path.write_text(
        f'train_steps: 1\nneuralnet {{\n  layer {{ name: "data" {data} }}\n'
        '  layer { name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf { '
        f'num_output: 10 }} {fc} }}\n'
        '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n}\n')
    return path


def fromfile_job(tmp_path: Path, model: Path) -> Path:
    """A job whose Param ``w`` (10x64) is read from ``model``."""
    return net_job(tmp_path / "job.conf",
                   'type: kData data_conf { source: "digits" batchsize: 8 }',
                   f'param {{ name: "w" init {{ type: kFromFile path: "{model}" }} }} '
                   'param { name: "b" }')


def test_kfromfile_names_a_dtype_it_does_not_read(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    model = tmp_path / "f8.safetensors"
    _raw_safetensors(model, {"w": {"dtype": "F8_E4M3", "shape": [10, 64],
                                   "data_offsets": [0, 640]}}, 640)
    refused(*run(capsys, "check", str(fromfile_job(tmp_path, model))),
            "holds F8_E4M3, which kFromFile does not read", "BF16")


def test_kfromfile_compares_the_shape_before_reading(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    model = tmp_path / "big.safetensors"  # 2^31 float32 values: 8 GiB, declared
    _raw_safetensors(model, {"w": {"dtype": "F32", "shape": [2**31],
                                   "data_offsets": [0, 2**33]}}, 2**33)
    refused(*run(capsys, "check", str(fromfile_job(tmp_path, model))),
            "has shape (2147483648,), the Param (10, 64)")


def _store_job(tmp_path: Path, store: str) -> Path:
    return net_job(tmp_path / "store.conf",
                   f'type: kRecordInput store_conf {{ path: "{store}" batchsize: 2 }}')


def test_a_store_that_is_a_device_or_a_pipe(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    stores = [str(fifo)] + (["/dev/zero"] if os.path.exists("/dev/zero") else [])
    for store in stores:
        with watchdog():
            refused(*run(capsys, "check", str(_store_job(tmp_path, store))), store,
                    "not a file")


def test_a_pipe_as_data_source_or_checkpoint_does_not_hang(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    with watchdog():
        refused(*run(capsys, "data", str(fifo), str(tmp_path / "o.bin")), "a named pipe")
        refused(*run(capsys, "export", str(fifo), "--to", str(tmp_path / "m.safetensors")),
                "a named pipe")


@pytest.mark.parametrize(("layout", "aliases", "expected"), [
    ([(2**40, 2**40)], None, "gap or overlap"),
    ([(0, 2**40)], None, "does not hold"),
    ([(-5, 10)], None, "gap or overlap"),
    ([(0, 10)], [1, 2], "its aliases are not a map"),
    ([(0, 10)], "w", "its aliases are not a map"),
    ([(0, 10)], {"a": 3}, "its aliases are not a map"),
    ([(0, 10)], {"a": "nope"}, "alias 'a' of unknown 'nope'"),
])
def test_export_of_a_forged_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       layout: Any, aliases: Any, expected: str) -> None:
    ckpt = a_checkpoint(tmp_path / "forged.ckpt.safetensors", layout, aliases)
    refused(*run(capsys, "export", str(ckpt), "--to", str(tmp_path / "m.safetensors")),
            expected)
    assert not (tmp_path / "m.safetensors").exists()


# -- bounded parsing ------------------------------------------------------------------------------


def test_a_long_list_is_read_in_memory_linear_in_the_file(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The case of the issue (a 16 MiB file of a long list took 4 GB), scaled down: the
    reader's peak stays within 20 times the file (tests/test_parse_memory.py covers the
    other shapes)."""
    import tracemalloc

    from paramserver.train.jobfile import read_job_file

    n = 20_000
    job = tmp_path / "list.conf"
    job.write_text("train_steps: 1\nneuralnet { layer { name: \"d\" type: kData } }\n"
                   "updater { learning_rate { type: kFixedStep fixedstep_conf {\n"
                   f"  step: [{', '.join(map(str, range(n)))}]\n"
                   f"  step_lr: [{', '.join(['0.5'] * n)}]\n}} }} }}\n")
    read_job_file(job)  # imports and registries, before counting
    tracemalloc.start()
    try:
        read_job_file(job)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 20 * job.stat().st_size


# -- a full disk -------------------------------------------------------------------------------


def test_a_write_without_space_is_a_no_space_error(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OSError) as caught, open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x")
    error = path_error(caught.value, tmp_path / "model.safetensors")
    assert isinstance(error, NoSpaceError)
    assert str(tmp_path / "model.safetensors") in str(error)


def _train_argv(steps: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "paramserver", "train", str(MLP), "--steps", str(steps),
            "--set", "checkpoint_freq=2", "--set", "test_freq=0", "--set", "disp_freq=1",
            "--workspace", "ws", "--quiet", *args]


def _train(cwd: Path, steps: int, *args: str, limit: int | None = None
           ) -> subprocess.CompletedProcess[str]:
    def small_files() -> None:
        assert limit is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(_train_argv(steps, *args), cwd=cwd, capture_output=True, text=True,
                          timeout=600, preexec_fn=small_files if limit is not None else None)


def test_a_full_disk_stops_the_run_and_resume_goes_on(tmp_path: Path) -> None:
    broken, straight = tmp_path / "broken", tmp_path / "straight"
    broken.mkdir()
    straight.mkdir()
    reference = subprocess.Popen(_train_argv(8), cwd=straight, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # meanwhile: a run that never stops
    try:
        assert _train(broken, 4).returncode == 0  # checkpoints of steps 2 and 4
        size = (broken / "ws" / "checkpoints" / "step-00000004.ckpt.safetensors").stat().st_size
        full = _train(broken, 8, "--resume", limit=size // 2)  # no checkpoint fits any more
        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr and "Exception" not in full.stderr
        lines = full.stderr.strip().splitlines()
        assert len(lines) == 1, full.stderr
        assert "File too large" in lines[0] and "the run stopped" in lines[0]
        assert "step-00000004.ckpt.safetensors (step 4)" in lines[0] and "--resume" in lines[0]
        ws = broken / "ws"
        assert not [p for p in ws.rglob("*") if p.name.endswith(".tmp")]  # no temporary left
        assert sorted(p.name for p in (ws / "checkpoints").iterdir()) == [
            "step-00000002.ckpt.safetensors", "step-00000004.ckpt.safetensors"]
        again = _train(broken, 8, "--resume")  # space again: goes on from step 4
        assert again.returncode == 0, again.stderr
        assert reference.wait(timeout=600) == 0
    finally:
        if reference.poll() is None:  # a check above failed: the reference is not needed
            reference.kill()
            reference.wait()
    a, meta_a = load_checkpoint(ws / "checkpoints" / "step-00000008.ckpt.safetensors")
    b, meta_b = load_checkpoint(straight / "ws" / "checkpoints" /
                                "step-00000008.ckpt.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert meta_a == meta_b
    assert_rows_of_a_resume(straight / "ws", ws, 4)

