"""The ``paramserver`` command: check, doc, train, --import; user mistakes exit 2."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver import __version__
from paramserver.cli import main
from paramserver.config.components import param_generators

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.conf"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_check_every_example(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, out, err = run(capsys, "check", str(path))
    assert code == 0, err
    assert "Params:" in out and "Updater: " in out and "server" in out


def test_check_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", str(ROOT / "examples" / "digits_shared.conf"))
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("w_")}
    assert rows["w_enc"][2] == "32x64"
    assert rows["w_dec"][-1] == "w_enc"          # the sharer names its owner
    assert "kNesterov(momentum=0.9)" in out
    assert "kFixed(base_lr=0.02)" in out


BAD = {
    "unknown layer type": (
        'train_steps: 1\nneuralnet {\n  layer { name: "data" type: kData }\n'
        '  layer { name: "fc" type: kInnerProdukt srclayers: "data" }\n}\n',
        "bad.conf:4:"),
    "shapes do not fit": (
        'train_steps: 1\nneuralnet {\n  layer { name: "data" type: kData }\n'
        '  layer { name: "fc" type: kInnerProduct srclayers: "data" '
        'innerproduct_conf { num_output: 7 } }\n'
        '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n}\n',
        "layer 'loss'"),
    "missing data file": (
        'train_steps: 1\nneuralnet {\n  layer { name: "data" type: kData '
        'data_conf { source: "nowhere.npz" } }\n}\n', "nowhere.npz"),
    "syntax": ('train_steps: 1\nupdater { momentum: 0.9\n', "bad.conf:2:"),
    "bound": ('train_steps: 1\nupdater { momentum: 1.5 }\nneuralnet { }\n',
              "bad.conf:2:11: value 1.5 for Parameter momentum exceed bound [0,1]"),
}


@pytest.mark.parametrize("command", ["check", "train"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_job_exits_2_without_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           command: str, case: str) -> None:
    text, expected = BAD[case]
    path = tmp_path / "bad.conf"
    path.write_text(text)
    args = [command, str(path)] + (["--workspace", str(tmp_path / "ws"), "--quiet"]
                                   if command == "train" else [])
    code, _, err = run(capsys, *args)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_missing_job_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "check", str(tmp_path / "absent.conf"))
    assert code == 2 and "cannot read the job file" in err


def test_bad_option_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "train", str(EXAMPLES[0]), "--steps", "-3",
                       "--workspace", str(tmp_path))
    assert code == 2 and "train_steps" in err


def test_train_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "train", str(ROOT / "examples" / "digits_mlp.conf"),
                         "--steps", "50", "--workspace", str(tmp_path), "--seed", "3")
    assert code == 0, err
    assert "step 50: test loss" in out  # results on stdout (`train job > log` keeps them)
    assert err == ""  # nothing to warn of
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "metrics.png").exists()
    code, out, err = run(capsys, "train", str(ROOT / "examples" / "digits_mlp.conf"),
                         "--steps", "50", "--workspace", str(tmp_path), "--resume")
    assert code == 0 and "nothing to do" in out


def test_doc_all_and_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doc")
    assert code == 0
    for name in ("kSGD", "kAdaDelta", "kStep", "kFixedStep", "kGaussian", "kInnerProduct",
                 "nworker_groups", "rmsprop_conf", "step_conf"):
        assert name in out
    code, out, _ = run(capsys, "doc", "kRMSProp")
    assert code == 0
    assert out.startswith("kRMSProp")
    assert "rho : float, optional, default=0.9" in out
    assert "momentum : float, optional, default=0" in out
    code, _, err = run(capsys, "doc", "kNothing")
    assert code == 2 and "no component named 'kNothing'" in err


def test_import_registers_user_components(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_components.py").write_text(
        "from paramserver import Parameter, field\n"
        "from paramserver.init import ParamGenerator, register_param_generator\n"
        "@register_param_generator('FooParam')\n"
        "class Foo(ParamGenerator):\n"
        "    '''Fills x.'''\n"
        "    class Config(Parameter):\n"
        "        x: int = field(1, doc='The value.')\n"
        "    def fill(self, param, rng):\n"
        "        param.data.fill(self.own.x)\n")
    job = tmp_path / "job.conf"
    job.write_text(
        'train_steps: 1\nneuralnet {\n  layer { name: "data" type: kData }\n'
        '  layer { name: "fc" type: kInnerProduct srclayers: "data" '
        'innerproduct_conf { num_output: 10 }\n'
        '    param { name: "w" init { user_type: "FooParam" [fooparam_conf] { x: 10 } } } }\n'
        '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }\n}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        code, out, err = run(capsys, "--import", "my_components", "check", str(job))
        assert code == 0, err
        assert "FooParam(x=10)" in out
        code, out, _ = run(capsys, "doc", "FooParam")
        assert "fooparam_conf" in out and "x : int, optional, default=1" in out
    finally:
        if "FooParam" in param_generators:
            param_generators.remove("FooParam")
    code, _, err = run(capsys, "check", "--import", "no_such_module_xyz", str(job))
    assert code == 2 and "no module named 'no_such_module_xyz'" in err


def test_version_help_and_module_entry() -> None:
    proc = subprocess.run([sys.executable, "-m", "paramserver", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"paramserver {__version__}"
    # A fresh process knows every built-in name before anything else imports it.
    proc = subprocess.run([sys.executable, "-m", "paramserver", "doc", "kConst"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("kConstant (also kConst)")
    for sub in ("check", "doc", "train"):
        proc = subprocess.run([sys.executable, "-m", "paramserver", sub, "--help"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "--import" in proc.stdout


# -- machine-readable output ----------------------------------------------------------------

def test_check_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "digits_shared.conf"
    code, out, err = run(capsys, "check", str(path), "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["ok"] is True and data["problems"] == [] and data["file"] == str(path)
    assert data["job"]["name"] == "digits-shared" and data["job"]["train_steps"] == 1500
    params = {p["name"]: p for p in data["params"]}
    assert params["w_dec"] == {"name": "w_dec", "layer": "decode", "shape": [32, 64],
                               "size": 2048, "init": "kUniformSqrtFanInOut()",
                               "lr_scale": 1.0, "wd_scale": 1.0, "share_from": "w_enc",
                               "row_sparse": False, "from_checkpoint": False}
    assert data["num_owners"] == 5 and data["num_values"] == sum(
        p["size"] for p in data["params"] if p["share_from"] is None)
    assert data["updater"]["description"] == "kNesterov(momentum=0.9)"
    assert data["updater"]["conf"]["type"] == "kNesterov"
    assert data["schedule"]["lr"][0] == [0, 0.02] and data["schedule"]["lr"][-1][0] == 1499
    assert data["cluster"]["consistency"] == "BSP"
    assert sum(s["values"] for s in data["servers"]) == data["num_values"]
    assert {"server", "slices", "values", "share"} <= set(data["servers"][0])


def test_check_json_of_a_broken_job(capsys: pytest.CaptureFixture[str], tmp_path: Path
                                    ) -> None:
    path = tmp_path / "bad.conf"
    fc = ('  layer { name: "fc" type: kInnerProduct srclayers: "dta" '
          'innerproduct_conf { num_output: 10 } }\n')
    path.write_text('train_steps: 1\nupdater { momentum: 1.5 }\nneuralnet {\n'
                    '  layer { name: "data" type: kData }\n' + fc + '}\n')
    code, out, err = run(capsys, "check", str(path), "--json")
    assert code == 2 and err == ""
    data = json.loads(out)
    assert data["ok"] is False
    assert [(p["file"], p["line"], p["column"]) for p in data["problems"]] == [
        (str(path), 2, 11), (str(path), 5, fc.index('"dta"') + 1)]
    assert data["problems"][0]["message"].startswith(
        "value 1.5 for Parameter momentum exceed bound [0,1]")
    assert data["problems"][1]["message"] == ("layer 'fc' reads unknown layer 'dta'; did "
                                              "you mean 'data'?")
    assert set(data["problems"][0]) == {"file", "line", "column", "path", "message"}


def test_doc_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doc", "--json")
    assert code == 0
    data = json.loads(out)
    kinds = [s["kind"] for s in data["sections"]]
    assert kinds == ["init method", "updater", "learning-rate method", "layer"]
    updaters = {c["name"]: c for c in data["sections"][1]["components"]}
    assert updaters["kRMSProp"]["conf_block"] == "rmsprop_conf"
    rho = next(f for f in updaters["kRMSProp"]["fields"] if f["name"] == "rho")
    assert rho["type"] == "float" and rho["default"] == 0.9 and rho["required"] is False
    assert rho["lower"] == 0 and rho["upper"] == 1
    assert [c["name"] for c in data["configurations"]] == [
        "cluster", "job", "train_one_batch", "cd_conf", "neuralnet", "layer_group", "layer",
        "param"]
    code, out, _ = run(capsys, "doc", "kstep", "--json")
    one = json.loads(out)
    assert one["name"] == "kStep" and one["conf_block"] == "step_conf"
    assert any(f["name"] == "base_lr" for f in one["common_fields"])
    code, out, _ = run(capsys, "doc", "Cluster", "--json")
    assert json.loads(out)["fields"][0]["name"] == "nworker_groups"
    code, out, err = run(capsys, "doc", "kadm", "--json")
    assert code == 2 and err == "" and json.loads(out)["ok"] is False
    assert "did you mean 'kAdam'" in json.loads(out)["problems"][0]["message"]


# -- rough edges ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, head", [("ksgd", "kSGD"), ("kadam", "kAdam"), ("SGD", "kSGD"),
                                        ("KSTEP", "kStep"), ("kconst", "kConstant"),
                                        ("KInnerProduct", "kInnerProduct")])
def test_doc_names_in_any_case(capsys: pytest.CaptureFixture[str], name: str, head: str
                               ) -> None:
    code, out, _ = run(capsys, "doc", name)
    assert code == 0 and out.startswith(head)


def test_doc_unknown_name_has_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "doc", "kadm")
    assert code == 2
    assert err.startswith("paramserver doc: error: no component named 'kadm'; did you mean "
                          "'kAdam' or 'kRAdam' or 'kNAdam'?")


def test_error_on_the_line_of_error(capsys: pytest.CaptureFixture[str], tmp_path: Path
                                    ) -> None:
    path = tmp_path / "bad.conf"
    path.write_text(BAD["bound"][0])
    code, _, err = run(capsys, "check", str(path))
    assert code == 2
    assert err.splitlines()[0] == (f"paramserver check: error: {path}:2:11: value 1.5 for "
                                   "Parameter momentum exceed bound [0,1]")


def test_unknown_srclayer_is_reported_at_its_token(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    text = (ROOT / "examples" / "digits_mlp.conf").read_text()
    lines = text.splitlines()
    line = next(i for i, x in enumerate(lines) if 'srclayers: "tanh1"' in x)
    lines[line] = lines[line].replace('"tanh1"', '"tnh1"')
    path = tmp_path / "job.conf"
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "check", str(path))
    column = lines[line].index('"tnh1"') + 1
    assert code == 2 and err == (f"paramserver check: error: {path}:{line + 1}:{column}: layer "
                                 "'fc2' reads unknown layer 'tnh1'; did you mean 'tanh1'?\n")


def test_net_problems_come_with_the_configurations(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text('train_steps: 1\nupdater { momentum: 1.5 }\nneuralnet {\n'
                    '  layer { name: "data" type: kData }\n'
                    '  layer { name: "fc" type: kInnerProduct srclayers: "data" '
                    'innerproduct_conf { num_output: 7 } }\n'
                    '  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" '
                    'srclayers: "data" }\n}\n')
    for command in ("check", "train"):
        code, _, err = run(capsys, command, str(path))
        assert code == 2
        problems = [x for x in err.splitlines() if x.startswith("paramserver")]
        assert problems == [
            f"paramserver {command}: error: {path}:2:11: value 1.5 for Parameter momentum "
            "exceed bound [0,1]",
            f"paramserver {command}: error: {path}:6:3: layer 'loss' (kSoftmaxLoss): the "
            "labels of 'data' go up to 9 (10 classes) but srclayer 'fc' gives 7 scores"]


def test_warnings_are_plain_lines_on_stderr_and_reports_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26: every message went to stderr, so `train job > log` kept nothing."""
    import warnings

    from paramserver.console import attach

    detach = attach()
    try:
        warnings.warn("a worker left", RuntimeWarning, stacklevel=1)
        logging.getLogger("paramserver.x").info("a message")
    finally:
        detach()
    out, err = capsys.readouterr()
    assert err == "warning: a worker left\n" and out == "a message\n"


def test_completion_scripts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, bash, _ = run(capsys, "completion", "bash")
    assert code == 0
    for word in ("check", "doc", "train", "export", "--no-tensorboard", "--json", "--to"):
        assert word in bash
    script = tmp_path / "paramserver.bash"
    script.write_text(bash)
    assert subprocess.run(["bash", "-n", str(script)], timeout=60).returncode == 0
    code, zsh, _ = run(capsys, "completion", "zsh")
    assert code == 0 and zsh.startswith("#compdef paramserver")
    assert "--no-tensorboard" in zsh and "_files" in zsh


def test_public_namespace_is_clean() -> None:
    import paramserver

    names = dir(paramserver)
    assert len(names) == len(set(names))
    assert not {"Any", "TYPE_CHECKING", "importlib", "annotations"} & set(names)
    assert set(paramserver.__all__) <= set(names)
    paramserver.ParamSet  # noqa: B018  (loaded now: still listed once)
    assert dir(paramserver).count("ParamSet") == 1


def test_benchmark_options_are_listed() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "torch_optimizer.py"),
                           "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if "No module named 'torch'" in proc.stderr:
        pytest.skip("torch is not installed")
    assert proc.returncode == 0
    assert "sgd, nesterov, adam, adamw, adadelta" in " ".join(proc.stdout.split())
