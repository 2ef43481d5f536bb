"""Crash and resume: ``train`` killed with SIGKILL at seeded random moments, then resumed,
ends with the files of an uninterrupted run, byte for byte, and with the same TensorBoard
curves and histograms.

    python benchmarks/crash_resume.py [--trials 40] [--seed 0] [--aimed 0.4] [--again 0.3]

A reference run of a small job (2 workers, 2 servers, checkpoints every 10 steps, tests,
SINGA checkpoints, TensorBoard) records its moments (:mod:`paramserver.faults`): every phase
of every file write (temporary made, bytes written, flushed, renamed) and every step. Each
trial kills ``paramserver train`` at one of them with SIGKILL (``PARAMSERVER_KILL_AT``): a
moment drawn at random from all of them, or (a share ``--aimed``) from the writes of
checkpoints; then runs ``train --resume`` until it ends, a share ``--again`` of those
resumes being killed too. The workspace must then hold what the reference's holds: every
checkpoint and SINGA checkpoint, byte for byte (values, updater state, versions, step),
``metrics.csv`` byte for byte, a ``metrics.png``, no temporary file, and TensorBoard's
view of the event files (read by TensorBoard's own loader, which applies the resumed runs'
purges) the reference's: every scalar and every histogram at every step (``steps_per_second``
by its steps only, a timing, and a resumed run may lack the one it shows before it has timed
a step).

Runs are ``paramserver.cli.main`` in processes forked from a server that has imported
paramserver and its libraries (``multiprocessing``'s forkserver), so that a trial costs its
training, not Python's start-up; each is a process of its own, killed for real.

Prints the counts: trials, kills that landed (by kind of moment), resumes, mismatches (with
what differed). Exit status 1 if any trial ended with other files than the reference's.
(At the end Python's resource tracker may warn of "leaked semaphore objects": those the
processes that were killed held; it removes them.)
``tests/test_crash.py`` runs a few trials of this in CI.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB = """
name: "crash"
train_steps: {steps}
disp_freq: 7
test_freq: 10
test_steps: 2
checkpoint_freq: 10
seed: 5
updater {{
  type: kSGD momentum: 0.9 weight_decay: 0.001
  learning_rate {{ type: kStep base_lr: 0.05 step_conf {{ change_freq: 15 gamma: 0.5 }} }}
}}
neuralnet {{
  layer {{ name: "data" type: kData data_conf {{ source: "digits" batchsize: 16 }} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "data"
          innerproduct_conf {{ num_output: 16 }} }}
  layer {{ name: "drop" type: kDropout srclayers: "fc1" dropout_conf {{ dropout_ratio: 0.2 }} }}
  layer {{ name: "act" type: kTanh srclayers: "drop" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "act"
          innerproduct_conf {{ num_output: 10 }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "data" }}
}}
cluster {{ nworkers_per_group: 2 nservers_per_group: 2 timeout: 60 workspace: "ws" }}
"""
# (cluster { workspace }: a SINGA job, so that SINGA's checkpoints are written and checked)
PRELOAD = ["paramserver.cli", "paramserver.train.trainer", "paramserver.cluster",
           "paramserver.numerics.fused", "PIL.PngImagePlugin", "tensorboardX.summary"]
KILLED = -9
RUN_TIMEOUT = 300.0


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    """One ``paramserver`` command in a forked process; its output goes to ``log``."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from paramserver.cli import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass(frozen=True)
class Moment:
    """One marker of the reference run: its number (from 1), event and file or step."""

    number: int
    event: str
    what: str

    @property
    def checkpoint_write(self) -> bool:
        name = Path(self.what).name
        return self.event.startswith("write.") and (".ckpt." in name or "-worker" in name)

    @property
    def kind(self) -> str:
        if self.event == "step":
            return "step"
        name = Path(self.what).name
        target = ("checkpoint" if ".ckpt." in name else "SINGA checkpoint" if "-worker" in name
                  else name)
        return f"{self.event} {target}"


@dataclass
class Trial:
    """What one trial did and found."""

    number: int
    kills: list[Moment] = field(default_factory=list)
    resumes: int = 0
    differences: list[str] = field(default_factory=list)


class Harness:
    """Runs of one job file in one workspace path, forked from a preloaded server.

    Every run uses the same workspace path (the job's configuration, saved in every
    checkpoint, names it): the reference is moved aside once made.
    """

    def __init__(self, root: Path, steps: int = 40):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.job = self.root / "crash.conf"
        self.job.write_text(JOB.format(steps=steps))
        self.ws = self.root / "ws"
        self.reference = self.root / "reference"
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(PRELOAD)
        self._runs = 0
        self.moments: list[Moment] = []

    def run(self, *extra: str, kill_at: int | str | None = None,
            markers: Path | None = None) -> tuple[int, str]:
        """``paramserver train JOB --workspace WS --quiet *extra``, killed at the marker
        ``kill_at`` (``PARAMSERVER_KILL_AT``: a number, or ``EVENT:N``); returns the exit
        code (``KILLED`` when SIGKILLed) and its output."""
        self._runs += 1
        log = self.logs / f"run{self._runs}.log"
        env = {}
        if kill_at is not None:
            env["PARAMSERVER_KILL_AT"] = str(kill_at)
        if markers is not None:
            env["PARAMSERVER_MARKERS"] = str(markers)
        argv = ["train", str(self.job), "--workspace", str(self.ws), "--quiet", *extra]
        proc = self._ctx.Process(target=_child, args=(argv, env, str(log)))
        proc.start()
        proc.join(RUN_TIMEOUT)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise RuntimeError(f"run {argv} did not end in {RUN_TIMEOUT:g} s; see {log}")
        return int(proc.exitcode), log.read_text() if log.exists() else ""

    def make_reference(self) -> None:
        """The uninterrupted run, and the list of its moments."""
        shutil.rmtree(self.ws, ignore_errors=True)
        shutil.rmtree(self.reference, ignore_errors=True)
        markers = self.root / "markers.txt"
        markers.unlink(missing_ok=True)
        code, out = self.run(markers=markers)
        if code != 0:
            raise RuntimeError(f"the reference run failed ({code}):\n{out}")
        lines = markers.read_text().splitlines()
        self.moments = [Moment(i, *line.split(" ", 1)) for i, line in enumerate(lines, 1)]
        self.ws.rename(self.reference)

    def trial(self, number: int, first: Moment, again: Sequence[int | str] = (),
              killed: Callable[[Path], None] | None = None) -> Trial:
        """Kill a run at ``first``, then resume (killing the resumes at the markers of
        ``again``, one per resume) until a run ends; compare with the reference.
        ``killed(workspace)`` is called after the first kill, to look at what it left."""
        shutil.rmtree(self.ws, ignore_errors=True)
        t = Trial(number)
        code, out = self.run(kill_at=first.number)
        if code != KILLED:
            t.differences.append(f"the run was not killed at moment {first} (exit {code}):"
                                 f"\n{out}")
            return t
        t.kills.append(first)
        if killed is not None:
            killed(self.ws)
        pending = list(again)
        while True:
            kill_at = pending.pop(0) if pending else None
            code, out = self.run("--resume", kill_at=kill_at)
            t.resumes += 1
            if code == KILLED and kill_at is not None:
                t.kills.append(Moment(0, "resume", str(kill_at)))
                continue
            if code != 0:
                t.differences.append(f"a resume exited {code}:\n{out}")
                return t
            break
        t.differences += compare(self.reference, self.ws, t.resumes)
        return t

    def close(self) -> None:
        shutil.rmtree(self.ws, ignore_errors=True)


def _files(ws: Path) -> dict[str, bytes | None]:
    """What must match: the bytes of every checkpoint, SINGA checkpoint and metrics.csv;
    metrics.png present (its bytes are Pillow's); temporaries and set-aside files (which
    the reference has none of) by name."""
    out: dict[str, bytes | None] = {}
    for path in sorted(ws.rglob("*")):
        rel = path.relative_to(ws).as_posix()
        if rel.startswith("tensorboard") or path.is_dir():
            continue
        keep = (rel.startswith(("checkpoints/", "checkpoint/")) or rel == "metrics.csv")
        out[rel] = path.read_bytes() if keep else None
    return out


def compare(reference: Path, ws: Path, resumes: int = 0) -> list[str]:
    """The differences between two workspaces, as sentences (none: the same). ``resumes``:
    how many runs resumed; each may lack one ``steps_per_second`` point, at a display that
    came before that process had timed a step (its first is its warm-up: see
    ``paramserver.train.progress.Rate``): no figure is better than a wrong one."""
    a, b = _files(reference), _files(ws)
    problems = [f"{name} is missing" for name in a if name not in b]
    problems += [f"{name} is extra" for name in b if name not in a]
    problems += [f"{name} differs" for name in a if name in b and a[name] != b[name]]
    seen, want = tensorboard_view(ws / "tensorboard"), tensorboard_view(reference / "tensorboard")
    problems += [f"TensorBoard: {tag} is missing" for tag in want if tag not in seen]
    problems += [f"TensorBoard: {tag} is extra" for tag in seen if tag not in want]
    for tag in want:
        if tag not in seen or seen[tag] == want[tag]:
            continue
        steps, expected = [s for s, _ in seen[tag]], [s for s, _ in want[tag]]
        if tag.endswith("steps_per_second") and set(steps) <= set(expected) and \
                len(steps) == len(set(steps)) and len(expected) - len(steps) <= resumes:
            continue
        problems.append(f"TensorBoard: {tag} differs: steps {steps}, expected {expected}")
    return problems


def tensorboard_view(folder: Path) -> dict[str, list[tuple[int, Any]]]:
    """What TensorBoard shows of a folder of event files, by tag: each scalar's and each
    histogram's (step, value), read by TensorBoard's own loader (which drops what a later
    run's purge event says to); the values of ``steps_per_second`` left out (timings)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    view: dict[str, list[tuple[int, Any]]] = {}
    for tag in acc.Tags()["scalars"]:
        timing = tag.endswith("steps_per_second")
        view[tag] = [(e.step, None if timing else e.value) for e in acc.Scalars(tag)]
    for tag in acc.Tags()["histograms"]:
        view[tag] = [(e.step, e.histogram_value) for e in acc.Histograms(tag)]
    return view


def choose(moments: list[Moment], rng: random.Random, aimed: bool) -> Moment:
    """A moment to kill at: any, or one of a checkpoint's writes."""
    pool = [m for m in moments if m.checkpoint_write] if aimed else moments
    return rng.choice(pool)


def run_trials(harness: Harness, trials: int, seed: int, aimed: float, again: float,
               report: Any = None) -> list[Trial]:
    """``trials`` trials of ``harness`` (its reference made first), seeded."""
    rng = random.Random(seed)
    harness.make_reference()
    out = []
    for number in range(1, trials + 1):
        first = choose(harness.moments, rng, rng.random() < aimed)
        later = ([rng.randint(1, len(harness.moments))] if rng.random() < again else [])
        t = harness.trial(number, first, later)
        out.append(t)
        if report is not None:
            report(t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aimed", type=float, default=0.4,
                    help="share of the trials killed during a checkpoint's write")
    ap.add_argument("--again", type=float, default=0.3,
                    help="share of the trials whose first resume is killed too")
    ap.add_argument("--steps", type=int, default=40, help="train_steps of the job")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    import tempfile

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="crash-resume-"))
    t0 = time.perf_counter()
    harness = Harness(root, args.steps)

    def report(t: Trial) -> None:
        status = "ok" if not t.differences else "MISMATCH: " + "; ".join(t.differences)
        kills = ", ".join(f"{m.number} ({m.kind})" if m.event != "resume" else
                          f"its resume at marker {m.what}" for m in t.kills)
        print(f"trial {t.number:3d}: killed at {kills}; {t.resumes} resume(s): {status}",
              flush=True)

    try:
        results = run_trials(harness, args.trials, args.seed, args.aimed, args.again, report)
    finally:
        harness.close()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    kinds = Counter(m.kind for t in results for m in t.kills[:1])
    landed = sum(len(t.kills) for t in results)
    failed = [t for t in results if t.differences]
    twice = sum(len(t.kills) > 1 for t in results)
    print(f"\n{len(results)} trials, {landed} kills landed ({twice} trials killed twice), "
          f"{sum(t.resumes for t in results)} resumes, "
          f"{len(harness.moments)} moments in a run; {time.perf_counter() - t0:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("first kills by moment: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print(f"mismatches: {len(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
