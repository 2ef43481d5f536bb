"""paramserver's test-accuracy curve beside SINGA v0.2.0's on SINGA's mnist MLP job.

Runs SINGA's ``examples/mnist/job.conf`` as released (its ``random_skip``, its updater and
learning-rate schedule), with ``--steps`` training steps and a test of ``--test-steps``
batches every ``--test-freq`` steps, on the digits resampled to 28x28: SINGA v0.2.0
``--singa-runs`` times (its initialisation and random skip change from run to run: their
spread is the run-to-run spread) and paramserver once per ``--seeds`` value. At every test
step it prints each run's test accuracy and loss and whether paramserver's lies within
SINGA's spread: between the lowest and the highest of SINGA's runs, widened by half that
range on each side (with two SINGA runs the range alone understates the spread).

SINGA v0.2.0 is built by ``/work/shared/peers/singa/build.sh`` and needs the ZooKeeper of
``zk.sh`` (``--singa``, default ``$SINGA_HOME``); without them the script says so in one
line and stops.

    python benchmarks/singa_curves.py [--steps 300] [--test-freq 30] [--singa-runs 3]
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import singa_peer

TEST = re.compile(r"Test @ step (\d+)")
RESULT = re.compile(r"Loss = ([-+0-9.eE]+|nan), accuracy = ([-+0-9.eE]+|nan)")


def job_text(steps: int, test_freq: int, test_steps: int, workspace: str) -> str:
    text = singa_peer.JOBS["mlp"].read_text()
    for key, value in (("train_steps", steps), ("test_freq", test_freq),
                       ("test_steps", test_steps), ("disp_freq", test_freq)):
        text = re.sub(rf"{key}:\s*\d+", f"{key}: {value}", text)
    return text.replace('workspace: "examples/mnist"', f'workspace: "{workspace}"')


def singa_tests(log: str) -> dict[int, tuple[float, float]]:
    """SINGA v0.2.0's test results by step, from its log (``Test @ step N``, then
    ``Loss = ..., accuracy = ...``): step -> (loss, accuracy)."""
    out: dict[int, tuple[float, float]] = {}
    step = None
    for line in log.splitlines():
        m = TEST.search(line)
        if m:
            step = int(m.group(1))
            continue
        r = RESULT.search(line)
        if r and step is not None and "Train @" not in line:
            out[step] = (float(r.group(1)), float(r.group(2)))
            step = None
    return out


def paramserver_tests(metrics: Path) -> dict[int, tuple[float, float]]:
    with open(metrics, newline="") as f:
        return {int(r["step"]): (float(r["loss"]), float(r["accuracy"]))
                for r in csv.DictReader(f) if r["phase"] == "test"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--test-freq", type=int, default=30)
    p.add_argument("--test-steps", type=int, default=10)
    p.add_argument("--singa-runs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--singa", type=Path, default=Path(os.environ.get("SINGA_HOME") or Path(
        os.environ.get("TMPDIR") or "/tmp") / "singa-peer" / "singa-v0.2.0"))
    args = p.parse_args()
    if not (args.singa / ".libs" / "singa").is_file():
        print(f"SINGA v0.2.0 not built at {args.singa} (see /work/shared/peers/singa/"
              "build.sh): nothing to compare with")
        return 0
    if not singa_peer.zookeeper_up():
        print(f"no ZooKeeper on 127.0.0.1:{singa_peer.ZK_PORT} (SINGA v0.2.0 needs one: "
              "/work/shared/peers/singa/zk.sh): nothing to compare with")
        return 0
    src = str(singa_peer.ROOT / "src")
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    singa_env = dict(env, SINGA_HOST_IP="127.0.0.1",
                     LD_LIBRARY_PATH=str(args.singa / ".libs"))
    curves: dict[str, dict[int, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="singa-curves-") as tmp:
        folder = Path(tmp)
        for split in ("train", "test"):
            subprocess.run([sys.executable, "-m", "paramserver", "data", "digits",
                            f"examples/mnist/{split}_data.bin", "--shape", "28,28",
                            "--split", split], cwd=folder, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        for i in range(args.singa_runs):
            ws = f"examples/singa{i}"
            (folder / ws).mkdir(parents=True)
            conf = folder / f"singa{i}.conf"
            conf.write_text(job_text(args.steps, args.test_freq, args.test_steps, ws))
            done = subprocess.run(
                [str(args.singa / ".libs" / "singa"), "-conf", conf.name, "-singa_conf",
                 str(args.singa / "conf" / "singa.conf"), "-singa_job",
                 str(os.getpid() % 10000 * 1000 + 500 + i)],
                cwd=folder, env=singa_env, capture_output=True, text=True, check=True)
            curves[f"SINGA run {i + 1}"] = singa_tests(done.stderr + done.stdout)
            print(f"SINGA run {i + 1}: {len(curves[f'SINGA run {i + 1}'])} tests", flush=True)
        for seed in args.seeds:
            ws = f"examples/ps{seed}"
            conf = folder / f"ps{seed}.conf"
            conf.write_text(job_text(args.steps, args.test_freq, args.test_steps, ws))
            subprocess.run([sys.executable, "-m", "paramserver", "train", conf.name,
                            "--quiet", "--no-tensorboard", "--set", f"seed={seed}"],
                           cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL)
            curves[f"paramserver seed {seed}"] = paramserver_tests(folder / ws / "metrics.csv")
            print(f"paramserver seed {seed}: {len(curves[f'paramserver seed {seed}'])} tests",
                  flush=True)
    singa_names = [n for n in curves if n.startswith("SINGA")]
    ps_names = [n for n in curves if n.startswith("paramserver")]
    steps = sorted(set().union(*(set(c) for c in curves.values())))
    print(f"\ntest accuracy (loss) at each test step; {args.test_steps} batches of 100 "
          "test images per test\n")
    print("| step | " + " | ".join(curves) + " | SINGA's spread | within |")
    print("|---" * (len(curves) + 3) + "|")
    inside = total = 0
    for step in steps:
        accs = [curves[n][step][1] for n in singa_names if step in curves[n]]
        lo, hi = (min(accs), max(accs)) if accs else (float("nan"), float("nan"))
        margin = (hi - lo) / 2
        cells = [f"{curves[n][step][1]:.3f} ({curves[n][step][0]:.3f})" if step in curves[n]
                 else "—" for n in curves]
        verdicts = []
        for n in ps_names:
            if step in curves[n] and accs:
                ok = lo - margin <= curves[n][step][1] <= hi + margin
                inside += ok
                total += 1
                verdicts.append("yes" if ok else "NO")
        print(f"| {step} | " + " | ".join(cells) + f" | {lo:.3f}–{hi:.3f} | "
              f"{' '.join(verdicts)} |")
    missing = [s for s in steps if any(s not in curves[n] for n in curves)]
    print(f"\n{inside} of {total} of paramserver's test accuracies within SINGA's spread"
          + (f"; test steps not in every run: {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
