"""Find or make the side venv that MXNet 1.9.1 runs in (never a dependency of paramserver).

``python benchmarks/peers/mxnet_venv.py [PATH]`` makes it (default: ``MXNET_VENV``, else
``benchmarks/peers/.mxnet-venv``, which git ignores) with ``pip install mxnet==1.9.1
'numpy<1.24'`` and prints its python; ``kv_mxnet.py`` calls :func:`find_or_make`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE / ".mxnet-venv"
PACKAGES = ["mxnet==1.9.1", "numpy<1.24"]


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def works(python: Path) -> bool:
    """Whether ``python`` imports mxnet."""
    try:
        subprocess.run([str(python), "-c", "import mxnet"], check=True, timeout=120,
                       capture_output=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def find_or_make(venv: str | Path | None = None, make: bool = True) -> tuple[Path | None, str]:
    """The python of a venv with MXNet, and ``""``; or None and why there is none.

    ``venv``: its folder (default: ``MXNET_VENV``, else :data:`DEFAULT`). One that does not
    import mxnet is made (or completed) with pip when ``make``."""
    folder = Path(venv or os.environ.get("MXNET_VENV") or DEFAULT)
    python = python_of(folder)
    if python.exists() and works(python):
        return python, ""
    if not make:
        return None, f"no MXNet in {folder} (make it: python {Path(__file__).name} {folder})"
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True,
                           capture_output=True, timeout=600)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PACKAGES],
                       check=True, capture_output=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as e:
        tail = getattr(e, "stderr", b"") or b""
        last = tail.decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
        return None, f"cannot install {' '.join(PACKAGES)} into {folder}: {last[0]}"
    if not works(python):
        return None, f"{folder}: mxnet installed but does not import"
    return python, ""


def main() -> int:
    python, why = find_or_make(sys.argv[1] if len(sys.argv) > 1 else None)
    if python is None:
        print(f"mxnet_venv: {why}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
