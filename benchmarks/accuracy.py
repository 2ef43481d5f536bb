"""Test accuracy with the updater's state in bfloat16 and 8 bits, and with bfloat16 values.

    python benchmarks/accuracy.py [--seeds 1 2 3] [--torch-steps N] [--no-torch]

Target (issue "Faster than the memory wall"): the main job (examples/digits_mlp.conf) and the
torch digits example (examples/torch_digits.py) reach the same test accuracy, within 0.5
points, with ``state_dtype: bfloat16`` and ``state_dtype: int8`` as with float32 state. The
main job is also run with ``value_dtype: bfloat16`` (workers read bfloat16 values; the
servers keep a float32 master copy). Runs are deterministic for a seed; the table gives, per
variant, the test accuracy of each seed, their mean, and the mean's difference from float32.
Accuracy is not speed: no rounds, and the machine's load does not change the figures.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from paramserver.config.job import parse_job  # noqa: E402
from paramserver.train.trainer import Trainer  # noqa: E402

MAIN_JOB = ROOT / "examples" / "digits_mlp.conf"
VARIANTS = {
    "float32": {},
    "state bfloat16": {"state_dtype": "bfloat16"},
    "state int8": {"state_dtype": "int8"},
    "state int8, stochastic rounding": {"state_dtype": "int8", "stochastic_rounding": True},
    "values bfloat16 (float32 master)": {"value_dtype": "bfloat16"},
}
TARGET = 0.5  # points


def main_job(variant: dict[str, object], seed: int, workspace: Path) -> float:
    job = parse_job(MAIN_JOB.read_text(), str(MAIN_JOB))
    job.seed = seed
    job.workspace = str(workspace)
    for key, value in variant.items():
        setattr(job.updater, key, value)
    result = Trainer(job, progress=False, base_dir=MAIN_JOB.parent,
                     tensorboard=False).train(overwrite=True)
    assert result.test_accuracy is not None
    return 100 * result.test_accuracy


def torch_digits(state_dtype: str, steps: int | None) -> float:
    cmd = [sys.executable, str(ROOT / "examples" / "torch_digits.py"), "--state-dtype",
           state_dtype, *(["--steps", str(steps)] if steps else [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout
    found = re.search(r"test accuracy: ([0-9.]+)", out)
    if found is None:
        raise RuntimeError(f"no test accuracy in the output of {' '.join(cmd)}:\n{out}")
    return 100 * float(found.group(1))


def table(title: str, results: dict[str, list[float]]) -> None:
    base = statistics.mean(results["float32"])
    print(f"\n{title}")
    print(f"{'variant':<34}{'test accuracy % per seed':<30}{'mean':>7}{'vs float32':>12}   "
          "target")
    for name, accs in results.items():
        mean = statistics.mean(accs)
        diff = mean - base
        verdict = "" if name == "float32" else (
            f"within {TARGET}: {'met' if abs(diff) <= TARGET else 'MISSED'}")
        print(f"{name:<34}{' '.join(f'{a:.2f}' for a in accs):<30}{mean:7.2f}{diff:+12.2f}   "
              f"{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                    help="seeds of the main job's runs (default 1 2 3)")
    ap.add_argument("--torch-steps", type=int, help="steps of the torch example (default: "
                    "its job's)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch example")
    args = ap.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant in VARIANTS.items():
            results[name] = [main_job(variant, s, Path(tmp) / "ws") for s in args.seeds]
            print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    table(f"main job {MAIN_JOB.relative_to(ROOT)}, seeds {args.seeds}", results)
    if not args.no_torch:
        torch_results = {sd if sd == "float32" else f"state {sd}":
                         [torch_digits(sd, args.torch_steps)]
                         for sd in ("float32", "bfloat16", "int8")}
        table("examples/torch_digits.py (its job's seed)", torch_results)


if __name__ == "__main__":
    main()
