"""PyTorch is needed to train, not to read, check or document a job: without it, train says
which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: `import torch` then fails as it does where torch is not installed.
BLOCK = """import sys, importlib.abc
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
"""


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True,
                          text=True, cwd=cwd, timeout=300,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def test_check_and_doc_run_without_torch(tmp_path: Path) -> None:
    """In a folder of its own, after the README's `paramserver data` (issue 26: run in the
    checkout, the test failed once a user had made the data there)."""
    conv, mlp = ROOT / "examples" / "singa" / "mnist" / "conv.conf", ROOT / "examples" / \
        "digits_mlp.conf"
    proc = run("from paramserver.cli import main\n"
               "assert main(['data', 'digits', 'examples/mnist/train_data.bin', '--shape', "
               "'28,28']) == 0\n"
               "assert main(['data', 'digits', 'examples/mnist/test_data.bin', '--shape', "
               "'28,28', '--split', 'test']) == 0\n"
               f"assert main(['check', {str(conv)!r}]) == 0  # the data made as the README\n"
               f"assert main(['check', {str(mlp)!r}]) == 0\n"
               "assert main(['doc', 'kCConvolution']) == 0\n"
               "import paramserver.train.layers\n"
               "print('loaded', [m for m, v in sys.modules.items() if m.startswith('torch') "
               "and v is not None])", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "loaded []" in proc.stdout


def test_train_names_the_extra_to_install(tmp_path: Path) -> None:
    proc = run("from paramserver.cli import main\n"
               f"sys.exit(main(['train', 'examples/digits_mlp.conf', '--workspace', "
               f"'{tmp_path / 'ws'}', '--quiet']))", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "paramserver train: error: training computes the layers with PyTorch, which is not "
        "installed: pip install 'paramserver[torch]'")
