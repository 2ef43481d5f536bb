"""Workspaces, outputs and model files at the edges (issue 31, items 1 to 3): a mistake about a
path is exit 2 with the user's path (never a temporary's) in a message of a sensible length;
output layers write inside the workspace unless allowed, through no link; ``check`` lists
what a run writes; ``--overwrite`` deletes only regular files inside the workspace; kFromFile
reads bfloat16 and float16 and refuses NaN; ``checkpoint_path`` refuses what is not a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli import main
from paramserver.console import MAX_LINE
from paramserver.init import read_tensor

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and ".tmp" not in err, err
    for name in names:
        assert name in err, (name, err)


# -- path mistakes: exit 2, the user's path --------------------------------------------------


def test_data_into_a_folder_under_a_file_or_unwritable(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    code, _, err = run(capsys, "data", "digits", str(folder))
    refused(code, err, f"output {folder} is a folder")
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "data", "digits", str(tmp_path / "file" / "out.bin"))
    refused(code, err, f"{tmp_path / 'file'} is a file, not a folder")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        code, _, err = run(capsys, "data", "digits", str(locked / "out.bin"))
        refused(code, err, str(locked / "out.bin"), "Permission denied")
    assert sorted(p.name for p in tmp_path.iterdir()) in (["file", "out"],
                                                         ["file", "locked", "out"])


def test_export_to_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from test_hostile_files import a_checkpoint

    ckpt = a_checkpoint(tmp_path / "a.ckpt.safetensors")
    (tmp_path / "to").mkdir()
    code, _, err = run(capsys, "export", str(ckpt), "--to", str(tmp_path / "to"))
    refused(code, err, f"--to {tmp_path / 'to'} is a folder")


@pytest.mark.parametrize("case", ["/proc", "/sys/kernel", "dangling", "loop", "long"])
def test_workspaces_that_cannot_be(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   case: str) -> None:
    if case.startswith("/"):
        if not os.path.isdir(case):
            pytest.skip(f"no {case} on this system")
        ws, expected = case, f"workspace {case}"
    elif case == "dangling":
        (tmp_path / "ws").symlink_to(tmp_path / "nowhere")
        ws, expected = str(tmp_path / "ws"), "is a broken symbolic link"
    elif case == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        ws, expected = str(tmp_path / "a" / "ws"), "symbolic links"
    else:
        ws, expected = str(tmp_path / ("w" * 300)), "characters]"  # shown cut
    code, _, err = run(capsys, "train", str(MLP), "--workspace", ws, "--quiet")
    refused(code, err, expected)
    assert len(err) < 1000


def test_a_megabyte_job_name_is_cut_in_messages(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    job = tmp_path / "job.conf"
    job.write_text(MLP.read_text().replace('name: "digits-mlp"', f'name: "{"n" * 2**20}"'))
    code, _, err = run(capsys, "train", str(job), "--steps", "1", "--quiet")
    refused(code, err, "characters]")
    assert all(len(line) <= MAX_LINE + 100 for line in err.splitlines())
    value = tmp_path / "value.conf"
    value.write_text(MLP.read_text().replace("train_steps: 1500",
                                             f'train_steps: "{"9" * 2**20}"'))
    code, _, err = run(capsys, "check", str(value))
    refused(code, err, "characters]")
    assert len(err) < 3 * MAX_LINE


# -- outputs: inside the workspace, through no link, listed by check -----------------------------


def _job_with_output(tmp_path: Path, path: str, ws: Path) -> Path:
    text = MLP.read_text()
    at = text.rindex("layer", 0, text.index("kSoftmaxLoss"))
    job = tmp_path / "out.conf"
    job.write_text(text[:at] + f'layer {{ name: "dump" type: kCSVOutput srclayers: "fc2" '
                   f'store_conf {{ path: "{path}" }} include: kTest }}\n  ' + text[at:]
                   + f'workspace: "{ws}"\n')
    return job


def test_an_output_layer_writes_inside_the_workspace(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ws = tmp_path / "ws"
    job = _job_with_output(tmp_path, "out/fc2.csv", ws)
    code, out, _ = run(capsys, "check", str(job))
    assert code == 0
    writes = out[out.index("Writes"):]
    for name in ("checkpoints", "checkpoint", "tensorboard", "metrics.csv", "metrics.png",
                 "out/fc2.csv"):
        assert str(ws / name) in writes, (name, writes)
    code, out, _ = run(capsys, "check", str(job), "--json")
    assert {w["path"] for w in json.loads(out)["writes"]} >= {str(ws / "out" / "fc2.csv")}
    code, _, err = run(capsys, "train", str(job), "--steps", "2", "--set", "test_freq=2",
                       "--set", "test_steps=1", "--quiet", "--no-tensorboard")
    assert code == 0, err
    assert (ws / "out" / "fc2.csv").read_text().count("\n") > 0
    assert not (tmp_path / "out").exists()  # not at the working folder, as SINGA's


@pytest.mark.parametrize("case", ["up", "absolute", "symlink", "input"])
def test_an_output_layer_writes_nowhere_else(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path, case: str) -> None:
    ws = tmp_path / "ws"
    victim = tmp_path / "victim.csv"
    victim.write_text("kept\n")
    path = {"up": "../victim.csv", "absolute": str(victim), "symlink": "out.csv",
            "input": str(tmp_path / "out.conf")}[case]
    if case == "symlink":
        ws.mkdir()
        (ws / "out.csv").symlink_to(victim)
    job = _job_with_output(tmp_path, path, ws)
    expected = {"up": "leads out of the workspace", "absolute": "--allow-outside",
                "symlink": "leads out of the workspace", "input": "is the job file"}[case]
    allow = ["--allow-outside"] if case == "input" else []
    for argv in (["check", str(job), *allow], ["train", str(job), "--steps", "2", "--quiet",
                                               *allow]):
        code, _, err = run(capsys, *argv)
        refused(code, err, expected, "layer 'dump'")
    assert victim.read_text() == "kept\n"
    assert not (ws / "checkpoints").exists()


def test_allow_outside_lets_an_absolute_path_be(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "fc2.csv"
    job = _job_with_output(tmp_path, str(target), tmp_path / "ws")
    code, out, err = run(capsys, "check", str(job), "--allow-outside")
    assert code == 0 and str(target) in out, err
    (target.parent).mkdir()
    target.symlink_to(tmp_path / "victim")  # but never through a link, even so
    code, _, err = run(capsys, "check", str(job), "--allow-outside")
    refused(code, err, "a symbolic link")


def test_overwrite_deletes_nothing_through_a_link(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    ws, target = tmp_path / "ws", tmp_path / "elsewhere"
    args = ["train", str(MLP), "--steps", "2", "--set", "checkpoint_freq=2", "--set",
            "test_freq=0", "--workspace", str(ws), "--quiet", "--no-tensorboard"]
    assert run(capsys, *args)[0] == 0
    (ws / "checkpoints").rename(target)
    (ws / "checkpoints").symlink_to(target)
    before = sorted(p.name for p in target.iterdir())
    code, _, err = run(capsys, *args, "--overwrite")
    refused(code, err, "never through a link", "a symbolic link to")
    assert sorted(p.name for p in target.iterdir()) == before
    assert (ws / "metrics.csv").exists()  # refused whole: nothing deleted


# -- model files and checkpoint_path -----------------------------------------------------------


def test_kfromfile_reads_bfloat16_and_float16(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    w = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    save_file({"bf": w.to(torch.bfloat16), "h": w.half()}, str(tmp_path / "m.safetensors"))
    bf = read_tensor(str(tmp_path / "m.safetensors"), "bf", (4, 5), "p", np.float32)
    h = read_tensor(str(tmp_path / "m.safetensors"), "h", (4, 5), "p", np.float32)
    assert np.array_equal(bf, w.to(torch.bfloat16).float().numpy())
    assert np.array_equal(h, w.half().float().numpy())


def test_kfromfile_refuses_nan_and_inf_at_check(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    from paramserver.checkpoint import save_tensors
    from test_hostile_files import fromfile_job

    w = np.zeros((10, 64), np.float32)
    w[3, 7] = np.nan
    model = save_tensors(tmp_path / "m.safetensors", {"w": w})
    code, _, err = run(capsys, "check", str(fromfile_job(tmp_path, model)))
    refused(code, err, "tensor 'w' holds 1 value(s) NaN or infinite", "(3, 7)")
    big = save_tensors(tmp_path / "m.safetensors", {"w": np.full((10, 64), 1e300)})
    code, _, err = run(capsys, "check", str(fromfile_job(tmp_path, big)))
    refused(code, err, "beyond the range of the Param's float32")


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "folder"])
def test_checkpoint_path_that_is_not_a_file(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, kind: str) -> None:
    from test_hostile_files import special_file

    path = special_file(tmp_path / "ckpt", kind)
    code, _, err = run(capsys, "train", str(MLP), "--steps", "1", "--set",
                       f"checkpoint_path={path}", "--workspace", str(tmp_path / "ws"),
                       "--quiet")
    refused(code, err, f"checkpoint {path} is a", "not a file")
    assert "memory" not in err


def test_an_output_layer_never_writes_over_the_jobs_data(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    """The inputs are found in the layers' configurations (a data source here; model,
    vocabulary and mean files alike), even with --allow-outside."""
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.random((50, 64), np.float32), y=np.arange(50) % 10)
    before = data.read_bytes()
    job = _job_with_output(tmp_path, str(data), tmp_path / "ws")
    job.write_text(job.read_text().replace('source: "digits"', f'source: "{data}"', 1))
    code, _, err = run(capsys, "check", str(job), "--allow-outside")
    refused(code, err, "layer 'dump'", "layer 'data' source")
    assert data.read_bytes() == before
