"""The ``paramserver`` command: check, doc, train, --import; user mistakes exit 2."""

from __future__ import annotations

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
    code, _, err = run(capsys, "train", str(ROOT / "examples" / "digits_mlp.conf"),
                       "--steps", "50", "--workspace", str(tmp_path), "--seed", "3")
    assert code == 0, err
    assert "step 50: test loss" in err
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "metrics.png").exists()
    code, _, err = run(capsys, "train", str(ROOT / "examples" / "digits_mlp.conf"),
                       "--steps", "50", "--workspace", str(tmp_path), "--resume")
    assert code == 0 and "nothing to do" in err


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
    assert code == 2 and "no component, block or field named 'kNothing'" in err


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
