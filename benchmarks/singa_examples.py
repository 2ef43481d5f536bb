"""Every one of SINGA's released job files, with its data made as docs/singa.md says: does
``paramserver check`` pass, and does ``paramserver train`` run a few steps?

    python benchmarks/singa_examples.py [--steps 4] [--imagenet /data/dataset/imagenet]
                                         [--dir DIR]

The files are v0.1.0's, v0.2.0's and v0.3.0's (``tests/data/singa``; the pre-release
``rbm_job.conf``, which SINGA refused too, left out) and the runnable copies in
``examples/singa`` and ``examples/rnnlm``. Each release's data goes in a folder of its own
(v0.1.0 and v0.2.0 name one mean file in two formats), made by the commands of
docs/singa.md; alexnet's, at the absolute path its files name (``--imagenet``: made there if
missing, about 350 MB, and removed after unless it was there). Each job is checked as
written, then trained ``--steps`` steps with a small batch where SINGA's is large; the jobs
that load another's checkpoint (the rbm chain, char-rnn's sampling) run after it and name
that run's checkpoint with ``--set checkpoint_path`` (the files name SINGA's step6000 and
step2000 ones), as the docs say. rnnlm's jobs load their layers with ``--import rnnlm``.

Prints one line per job (check, train, seconds) and the counts; exit status 1 if any failed.
Not run in CI (minutes of work); ``tests/test_singa_examples.py`` runs a share of it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "singa"
RNNLM = ROOT / "examples" / "rnnlm"

V02_DATA = [
    "digits examples/mnist/train_data.bin --shape 28,28",
    "digits examples/mnist/test_data.bin --shape 28,28 --split test",
    "digits examples/cifar10/train_data.bin --shape 3,32,32 "
    "--mean examples/cifar10/image_mean.bin",
    "digits examples/cifar10/test_data.bin --shape 3,32,32 --split test",
    "pydoc examples/char-rnn/linux_input.txt --format text --test-fraction 0 "
    "--vocab examples/char-rnn/vocab.txt --vocab-size 101",
    "pydoc examples/rnnlm/train_data.bin --format words --vocab-size 3720 "
    "--test-fraction 0 --val-fraction 0.1",
    "pydoc examples/rnnlm/valid_data.bin --format words --vocab-size 3720 "
    "--test-fraction 0 --val-fraction 0.1 --split val",
]
V01_DATA = [
    "digits examples/mnist/mnist_train_shard --format shard --shape 28,28",
    "digits examples/mnist/mnist_test_shard --format shard --shape 28,28 --split test",
    "digits examples/cifar10/cifar10_train_shard --format shard --shape 3,32,32 "
    "--mean examples/cifar10/image_mean.bin",
    "digits examples/cifar10/cifar10_test_shard --format shard --shape 3,32,32 --split test",
    "pydoc examples/rnnlm/train_shard --format wordshard --vocab-size 3720 "
    "--test-fraction 0 --val-fraction 0.1",
    "pydoc examples/rnnlm/valid_shard --format wordshard --vocab-size 3720 "
    "--test-fraction 0 --val-fraction 0.1 --split val",
]
IMAGENET_DATA = [
    "digits {d}/train_record.bin --shape 3,256,256 --mean {d}/image_mean.bin",
    "digits {d}/val_record.bin --shape 3,256,256 --split test",
]
#: Smaller batches for a few steps on a CPU (the layer named "data" in every such file).
SMALL = {"alexnet": 4, "cifar10": 16, "mnist": 64}


def command(*args: str, cwd: Path) -> tuple[int, str, float]:
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(RNNLM), str(ROOT / "src")])}
    proc = subprocess.run([sys.executable, "-m", "paramserver", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t


def jobs() -> list[tuple[Path, str]]:
    """(file, release folder) in an order where a job runs after those whose checkpoints it
    loads."""
    found = [(p, p.relative_to(DATA).parts[0]) for p in sorted(DATA.glob("v*/examples/*/*.conf"))
             if p.name != "rbm_job.conf"]
    found += [(p, "v0.2.0") for p in sorted((ROOT / "examples" / "singa").glob("*/*.conf"))]
    found.append((RNNLM / "job.conf", "v0.2.0"))
    order = {"rbm1.conf": 0, "rbm2.conf": 1, "rbm3.conf": 2, "rbm4.conf": 3,
             "autoencoder.conf": 4, "job.conf": 0, "sample.conf": 5}
    return sorted(found, key=lambda x: (str(x[0].parent), order.get(x[0].name, 0)))


def trains(job: Path) -> bool:
    """Whether the job file trains (``train_steps`` above 0)."""
    from paramserver.config.job import load_job

    return load_job(job).train_steps > 0


def settings(job: Path, steps: int) -> list[str]:
    """The --set options of a short run of ``job``, and the checkpoints it loads."""
    folder = job.parent.name
    out = ["disp_freq=2", "checkpoint_freq=0"]
    if folder != "rnnlm":  # (rnnlm tests nothing: its kTest net is not whole, as in SINGA)
        out.append("test_steps=1")
    if folder in SMALL and "rnnlm" not in str(job):
        layer = "sharddata_conf" if "v0.1.0" in str(job) else "store_conf"
        out.append(f"neuralnet.layer[data].{layer}.batchsize={SMALL[folder]}")
    if folder == "rbm" and job.name != "rbm1.conf":
        before = (["rbm4", "rbm3", "rbm2", "rbm1"] if job.name == "autoencoder.conf"
                  else [f"rbm{int(job.stem[-1]) - 1}"])
        paths = ", ".join(f'"examples/rbm/{b}/checkpoint/step{steps}-worker0"' for b in before)
        out.append(f"checkpoint_path=[{paths}]")
    if job.name == "sample.conf":
        out.append(f'checkpoint_path=["examples/char-rnn/checkpoint/step{steps}-worker0"]')
    if folder == "rnnlm":
        out += ["validate_steps=2", "validate_freq=2"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--imagenet", default="/data/dataset/imagenet",
                    help="where alexnet's files read their data (made if missing)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="singa-examples-"))
    imagenet = Path(args.imagenet)
    made_imagenet = not (imagenet / "train_record.bin").exists()
    t0 = time.perf_counter()
    roots = {"v0.1.0": work / "v0.1.0", "v0.2.0": work / "v0.2.0", "v0.3.0": work / "v0.2.0"}
    failed = []
    try:
        for root, lines in ((roots["v0.1.0"], V01_DATA), (roots["v0.2.0"], V02_DATA)):
            root.mkdir(parents=True, exist_ok=True)
            for line in lines:
                code, out, _ = command("data", *line.split(), cwd=root)
                assert code == 0, out
        if made_imagenet:
            for line in IMAGENET_DATA:
                code, out, _ = command("data", *line.format(d=imagenet).split(), cwd=work)
                assert code == 0, out
        for job, release in jobs():
            root = roots[release]
            extra = ["--import", "rnnlm"] if "rnnlm" in str(job) else []
            sets = [x for s in settings(job, args.steps) for x in ("--set", s)]
            loads = [s for s in sets if s.startswith("checkpoint_path")]
            check, out, _ = command(*extra, "check", str(job), *(
                ["--set", loads[0]] if loads else []), cwd=root)
            if check != 0:
                failed.append(f"check {job}: {out.strip().splitlines()[-1]}")
            # A job that trains nothing (char-rnn's sampling) runs as it is.
            steps = ["--steps", str(args.steps)] if trains(job) else []
            code, out, seconds = command(*extra, "train", str(job), *steps, "--quiet",
                                         "--no-tensorboard", "--overwrite", *sets, cwd=root)
            if code != 0:
                failed.append(f"train {job}: {out.strip().splitlines()[-1]}")
            print(f"{job.relative_to(ROOT)}: check {'ok' if check == 0 else 'FAILED'}, "
                  f"train {'ok' if code == 0 else 'FAILED'} ({seconds:.1f} s)", flush=True)
    finally:
        if made_imagenet:
            for name in ("train_record.bin", "val_record.bin", "image_mean.bin"):
                (imagenet / name).unlink(missing_ok=True)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(jobs())} job files, {len(failed)} failed; {time.perf_counter() - t0:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f}")
    for f in failed:
        print(f"  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
