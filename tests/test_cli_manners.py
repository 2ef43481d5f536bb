"""The command as a user meets it on a second day (issue 26): every configuration mistake
found before anything runs or is written, ``check`` as strict as ``train``, modules and
examples found from any folder, results on stdout and warnings on stderr, hints where they
help, and SINGA's own spellings of the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli import main

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_mlp.conf"
COMMAND = Path(sys.executable).parent / "paramserver"  # the installed console script


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- --set: checked as the file is, before anything runs or is written --------------------------


def test_a_set_mistake_is_refused_before_anything_is_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    setting = "updater.adam_conf.beta1=0.5"  # kSGD's updater does not read adam_conf
    code, out, err = run(capsys, "train", str(MLP), "--workspace", str(ws), "--set", setting)
    assert code == 2 and out == ""
    assert err == (f"paramserver train: error: --set {setting}: adam_conf is given but the "
                   "updater is 'kSGD', which reads sgd_conf\n")
    assert not ws.exists()  # nothing made: the corrected run is not "an earlier run"
    # The case: the updater changed by --set ran, then failed at step 0 (exit 1),
    # blaming an sgd_conf the user never wrote, and left a TensorBoard file behind.
    code, out, err = run(capsys, "train", str(MLP), "--workspace", str(ws), "--steps", "3",
                         "--set", "updater.type=kAdam", "--quiet")
    assert code == 0, err
    checkpoint = next((ws / "checkpoints").glob("*.safetensors"))
    from paramserver.checkpoint import load_checkpoint

    assert load_checkpoint(checkpoint)[1]["job_conf"]["updater"]["type"] == "kAdam"


def test_set_names_its_setting_in_the_nets_problems(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    setting = "neuralnet.layer[fc2].innerproduct_conf.num_output=7"
    code, _, err = run(capsys, "check", str(MLP), "--set", setting, "--set",
                       "cluster.nworkers_per_group=0", "--set", "updater.type=kAdm")
    assert code == 2
    lines = [x for x in err.splitlines() if x.startswith("paramserver")]
    assert lines == [
        f"paramserver check: error: {MLP}:46:3: layer 'loss' (kSoftmaxLoss): the labels of "
        f"'data' go up to 9 (10 classes) but srclayer 'fc2' gives 7 scores (after --set "
        f"{setting})",
        "paramserver check: error: --set updater.type=kAdm: Invalid Input: 'kAdm', valid "
        "values are: {'kAdaDelta', 'kAdaGrad', 'kAdam', 'kAdamMax', 'kAdamW', 'kFtrl', "
        "'kLAMB', 'kNAdam', 'kNesterov', 'kRAdam', 'kRMSProp', 'kSGD', 'kSignum', "
        "'kSparseAdam'}",
        "paramserver check: error: --set cluster.nworkers_per_group=0: value 0 for Parameter "
        "nworkers_per_group exceed bound [1,4096]"]
    code, _, err = run(capsys, "check", str(MLP), "--set", "neuralnet.layer[fc9].x=1")
    assert code == 2 and err == ("paramserver check: error: --set neuralnet.layer[fc9].x=1: no "
                                 "layer 'fc9' in neuralnet; there are: data, fc1, tanh1, fc2, "
                                 "loss\n")


def test_a_run_that_fails_at_its_first_step_leaves_no_event_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import paramserver.train.trainer as trainer

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in a layer")

    monkeypatch.setattr(trainer, "_train_step", broken)
    ws = tmp_path / "ws"
    code, _, err = run(capsys, "train", str(MLP), "--workspace", str(ws), "--steps", "3")
    assert code == 1 and "a bug in a layer" in err
    assert [p for p in ws.rglob("*") if p.is_file()] == []
    monkeypatch.undo()
    code, _, err = run(capsys, "train", str(MLP), "--workspace", str(ws), "--steps", "3",
                       "--quiet")
    assert code == 0, err  # not refused as "an earlier run"


# -- check: as strict as train ------------------------------------------------------------------


def test_check_reads_checkpoint_path_and_takes_set(capsys: pytest.CaptureFixture[str],
                                                   cwd: Path) -> None:
    """SINGA's rbm2.conf names rbm1's checkpoint: check said nothing of it missing, and
    warned that w1 (loaded from it) has a constant init."""
    from paramserver.singa.datasets import write_dataset

    for split in ("train", "test"):
        write_dataset("digits", f"examples/mnist/{split}_data.bin", split=split, shape=(28, 28))
    rbm = ROOT / "examples" / "singa" / "rbm"
    code, _, err = run(capsys, "check", str(rbm / "rbm2.conf"))
    assert code == 2
    assert err == (f"paramserver check: error: {rbm / 'rbm2.conf'}:9:1: checkpoint_path: "
                   "examples/rbm/rbm1/checkpoint/step6000-worker0: no such checkpoint\n")
    assert main(["train", str(rbm / "rbm1.conf"), "--steps", "2", "--quiet",
                 "--no-tensorboard", "--set", "test_steps=1"]) == 0
    capsys.readouterr()
    path = "examples/rbm/rbm1/checkpoint/step2-worker0"
    code, out, err = run(capsys, "check", str(rbm / "rbm2.conf"), "--set",
                         f'checkpoint_path=["{path}"]')
    assert code == 0, err
    assert err == ""  # no warning of w1's constant init: the checkpoint gives its values
    assert re.search(r"\nw1 +Inner1 +1000x784 +checkpoint_path ", out), out


# -- modules and examples from any folder ---------------------------------------------------


def test_import_finds_a_module_in_the_current_folder(tmp_path: Path) -> None:
    """The docs' own `--import my_init`, run by the installed command from the folder that
    holds my_init.py (the console script's path is not the current folder)."""
    (tmp_path / "my_init.py").write_text(
        "from paramserver import ParamGenerator, register_param_generator\n\n\n"
        "@register_param_generator('kMine')\n"
        "class Mine(ParamGenerator):\n"
        "    \"\"\"Every value 3.\"\"\"\n\n"
        "    def fill(self, param, rng):\n"
        "        param.data[...] = 3.0\n")
    proc = subprocess.run([str(COMMAND), "--import", "my_init", "doc", "kMine"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kMine") and "Every value 3." in proc.stdout


def test_a_user_type_that_is_not_registered_says_to_import_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "job.conf"
    job.write_text(MLP.read_text().replace("init { type: kGaussian std: 0.01 }",
                                           'init { user_type: "FooInit" }'))
    code, _, err = run(capsys, "check", str(job))
    assert code == 2
    assert err.splitlines()[1] == ("'FooInit' is not a registered init method: load the "
                                   "module that registers it with --import (paramserver "
                                   "--import my_module ...)")


def test_examples_by_their_short_names(capsys: pytest.CaptureFixture[str], cwd: Path) -> None:
    """From another folder, the README's `train examples/digits_mlp.conf` and the short
    `train digits_mlp` find the example (shipped in the wheel too)."""
    code, out, err = run(capsys, "check", "digits_mlp")
    assert code == 0, err
    assert out.startswith(f"digits_mlp: paramserver's example {MLP}\n")
    code, out, err = run(capsys, "check", "examples/digits_mlp.conf")
    assert code == 0 and "digits-mlp" in out, err
    code, out, err = run(capsys, "check", "digits_mlp", "--json")
    assert code == 0 and json.loads(out)["job"]["name"] == "digits-mlp" and err == ""
    code, _, err = run(capsys, "check", "digits_mpl")
    assert code == 2 and err.startswith("paramserver check: error: digits_mpl: no such job "
                                        "file, nor an example of that name (the examples: ")
    assert "digits_mlp, digits_shared, rnnlm, singa/alexnet/cudnn" in err


# -- the command's manners ------------------------------------------------------------------


def test_the_suggestion_comes_before_the_list_of_arguments(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = tmp_path / "job.conf"
    job.write_text(MLP.read_text().replace("momentum: 0.9", "momentm: 0.9"))
    code, _, err = run(capsys, "check", str(job))
    assert code == 2
    lines = err.splitlines()
    assert lines[0].endswith("Cannot find argument 'momentm', Possible Arguments:")
    assert lines[1:3] == ["Did you mean 'momentum'?", "-" * 16]
    assert "Did you mean" not in "\n".join(lines[3:])


def test_doc_owner_dot_field(capsys: pytest.CaptureFixture[str]) -> None:
    for name, where, head in (
            ("kSGD.momentum", "kSGD: common fields of updater blocks", "momentum : float"),
            ("job.train_steps", "job file, top level", "train_steps : int"),
            ("kStep.gamma", "kStep: step_conf { ... }", "gamma : float"),
            ("kStep.freq", "kStep: step_conf { ... }", "change_freq : int"),  # an alias
            ("cluster.nworkers_per_group", "cluster { ... }", "nworkers_per_group : int")):
        code, out, err = run(capsys, "doc", name)
        assert code == 0, err
        assert out.startswith(f"{where}:\n    {head}")
    code, _, err = run(capsys, "doc", "cluster.nworkers")
    assert code == 2 and err.startswith("paramserver doc: error: cluster has no field "
                                        "'nworkers'; did you mean 'nworker_groups' or ")


def test_the_readmes_completion_lines_work_on_a_fresh_home(tmp_path: Path) -> None:
    """Issue 38: the README put the bash script where only the bash-completion package
    looks, and a stock Debian image has none: completion did nothing. Its lines now make
    plain bash complete: an interactive shell (reading ~/.bashrc, nothing else of the
    system's) completes a command, an option and a choice."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("### Shell completion", 1)[1].split("\n\n")[1]
    lines = [x.strip() for x in block.splitlines() if not x.strip().startswith("#")]
    bash_line = " ".join(lines[:2])  # the bash line and its continuation
    assert "completion bash" in bash_line and "~/.bashrc" in bash_line
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{COMMAND.parent}:/usr/bin:/bin", "TERM": "dumb"}
    if "PYTHONPATH" in os.environ:  # the sources under test
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(["bash", "-c", bash_line], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    script = (home / ".paramserver-completion.bash").read_text()
    for helper in ("_init_completion", "_get_comp_words_by_ref", "_filedir"):
        assert helper not in script  # bash-completion's functions: plain bash has none

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        probe = (f"COMP_LINE='{line}'; COMP_POINT={len(line)}; COMP_WORDS=({line}); "
                 f"COMP_CWORD={len(words) - 1}; complete -p paramserver >&2; "
                 f"_shtab_paramserver paramserver '{words[-1]}' '{words[-2]}'; "
                 "printf '%s\\n' \"${COMPREPLY[@]}\"")
        run = subprocess.run(["bash", "--noprofile", "-i", "-c", probe], env=env, cwd=home,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert "complete -o bashdefault -F _shtab_paramserver paramserver" in run.stderr
        return run.stdout.split()

    assert complete("paramserver tr") == ["train"]
    assert complete("paramserver train --no-") == ["--no-tensorboard"]
    assert complete("paramserver train --backend ") == ["local", "ray"]
    zsh_line = next(x for x in lines if "completion zsh" in x).split("#")[0]
    proc = subprocess.run(["bash", "-c", zsh_line], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and (home / ".zfunc" / "_paramserver").read_text().startswith(
        "#compdef paramserver"), proc.stderr


# -- SINGA's command line -------------------------------------------------------------------


def test_singas_conf_resume_and_test_options(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    ws = str(tmp_path / "ws")
    code, out, err = run(capsys, "-conf", str(MLP), "--steps", "4", "--workspace", ws,
                         "--quiet")  # singa-run.sh's line: paramserver -conf JOB
    assert code == 0, err
    code, out, err = run(capsys, "train", "-conf", str(MLP), "-resume", "--steps", "8",
                         "--workspace", ws)
    assert code == 0 and "(step 4)" in out, err
    code, out, err = run(capsys, "train", "-conf", str(MLP), "-test", "--workspace",
                         str(tmp_path / "test"))
    assert code == 0, err
    rows = (tmp_path / "test" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[:2] for r in rows[1:]] == [["0", "test"]]  # tested, nothing trained
    code, _, err = run(capsys, "train", str(MLP), "-conf", str(MLP))
    assert code == 2 and "give the job file once" in err


def test_singas_log_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "train", str(MLP), "--steps", "20", "--workspace",
                         str(tmp_path / "ws"), "--set", "disp_freq=10", "--set",
                         "test_freq=20", "--log-format", "singa")
    assert code == 0, err
    glog = re.compile(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] (.*)")
    lines = [glog.fullmatch(x) for x in out.splitlines()]
    assert all(lines), out
    messages = [m.group(1) for m in lines if m]
    # SINGA v0.2.0's: windows labelled by the step just trained, from 0 (tests: docs/singa.md)
    metric = r"Loss = \d\.\d{6}, accuracy = \d\.\d{6}"
    assert re.fullmatch(rf"Train @ step 0  {metric}", messages[0]), messages
    assert re.fullmatch(rf"Train @ step 10  {metric}", messages[1]), messages
    assert messages[2] == "Test @ step 20" and re.fullmatch(rf"   {metric}", messages[3])
    assert "━" not in out and "steps/s" not in out  # no progress display
