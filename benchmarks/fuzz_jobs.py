"""Fuzzing job files: mutants of the examples, read and checked, in process and by the CLI;
with ``--readers``, mutants of the other files paramserver reads.

    python benchmarks/fuzz_jobs.py [--mutants 10000] [--cli 300] [--seed 0] [--jobs 2]
    python benchmarks/fuzz_jobs.py --readers all [--mutants 10000] [--cli 100]

Each mutant is one of the example job files changed at random (seeded, so a run is
reproducible): bytes flipped, inserted, deleted or repeated; a line repeated, deleted or
moved; a number or name replaced by an awkward one (``1e999``, ``-1``, ``2147483648``,
``nan``, ``kSGDD``, a long list, unbalanced braces, stray quotes, NUL, invalid UTF-8); or a
job written from scratch from the job schema with random values. In process, a mutant is
given to the command's ``main(["check", FILE])``; the only acceptable outcomes are exit 0
and exit 2 (a ``ParamError``), with nothing raised. Through the CLI (``python -m
paramserver check``), the only acceptable exits are 0 and 2, with no traceback on stderr.

Prints the counts: crashes (any other exception), hangs (over 5 s), exits other than 0 and
2, tracebacks, and the first few examples of each, written to ``--out`` for replay.

``--readers data,safetensors,checkpoint,singa`` (or ``all``) fuzzes the readers of data
sources (``.npz``), model files (``kFromFile``), checkpoints (``export``) and SINGA's stores,
mean files and checkpoints instead (``benchmarks/_fuzz_readers.py`` says how): ``--mutants``
of each in process, where the only acceptable outcomes are a value or a ``ParamError``, and
``--cli`` of each through the command that reads them (``data``, ``check``, ``export``,
``train``), where the only acceptable exits are 0 and 2, with no traceback.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from paramserver import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [p.read_bytes() for p in sorted((ROOT / "examples").glob("*.conf"))]
HANG_SECONDS = 5.0

AWKWARD = [b"1e999", b"-1e999", b"1e-500", b"-1", b"0", b"2147483648", b"9223372036854775808",
           b"nan", b"-nan", b"inf", b"-inf", b"nan(x)", b"0x10", b"010", b"1.5", b"1,2,3",
           b"(1,2)", b"[]", b"[1, 2, 3]", b"kSGDD", b"kStep", b"kFixedStep", b"kAdam",
           b"kInnerProduct", b"kData", b'""', b"''", b'"', b"'", b"{", b"}", b"<", b">",
           b"[", b"]", b":", b";", b",", b"#", b"\\", b"\x00", b"\xff\xfe", b"\xc3(",
           b"\xe2\x80\xa8", b"true", b"t", b"None", b"[ext] { x: 1 }", b"{ { { {",
           b"} } } }", b"a" * 300, b" " * 50, b"\n" * 5, b"\t", b"\r\n", b"\xef\xbb\xbf",
           b"1" * 30, b"." * 3, b"-", b"+", b"e", b"kStep step_conf { change_freq: 0 }",
           b"share_from: \"w1\"", b"nservers_per_group: 4096", b"num_output: 2147483648",
           b"train_steps: 99999999999999999999", b"batchsize: 0", b"source: \"/dev/zero\""]
NAMES = [b"train_steps", b"disp_freq", b"test_freq", b"checkpoint_freq", b"seed", b"momentum",
         b"weight_decay", b"delta", b"base_lr", b"gamma", b"change_freq", b"num_output",
         b"batchsize", b"lr_scale", b"wd_scale", b"std", b"low", b"high", b"value",
         b"nworker_groups", b"nworkers_per_group", b"nserver_groups", b"nservers_per_group",
         b"staleness", b"timeout", b"clip_low", b"clip_high", b"rho", b"step", b"step_lr"]


def plausible(rng: random.Random) -> bytes:
    """A value that may well be valid: mostly small numbers, sometimes an awkward token."""
    choice = rng.randrange(4)
    if choice == 0:
        return str(rng.choice([0, 1, 2, 3, 7, 10, 64, 100, 1000, rng.randint(0, 10**6)])
                   ).encode()
    if choice == 1:
        return f"{rng.choice([0.0, 0.5, 1.0, 1e-8, 0.9, rng.uniform(0, 2)]):.6g}".encode()
    if choice == 2:
        return rng.choice([b"true", b"false", b"kSGD", b"kAdam", b"kStep", b"kGaussian"])
    return rng.choice(AWKWARD)


def _replace_value(out: bytearray, pos: int, value: bytes) -> None:
    """Replace the value of the first ``key: value`` at or after ``pos``."""
    colon = out.find(b":", pos)
    if colon < 0:
        return
    start = colon + 1
    while start < len(out) and out[start] in b" \t":
        start += 1
    end = start
    while end < len(out) and out[end] not in b"\n }":
        end += 1
    out[start:end] = value


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four random changes of ``data`` (one, most often)."""
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 4])):
        kind = rng.randrange(11)
        pos = rng.randrange(len(out) + 1)
        if kind == 0 and out:  # flip a byte
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif kind == 1:  # insert an awkward token
            out[pos:pos] = rng.choice(AWKWARD)
        elif kind == 2 and out:  # delete a run
            del out[pos:pos + rng.randint(1, 40)]
        elif kind == 3:  # repeat a run
            end = min(len(out), pos + rng.randint(1, 200))
            out[pos:pos] = out[pos:end] * rng.randint(1, 20)
        elif kind in (4, 5):  # replace a value after a colon by an awkward one
            _replace_value(out, pos, rng.choice(AWKWARD))
        elif kind == 6:  # repeat, delete or move a line
            lines = bytes(out).split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            line = lines[i]
            action = rng.randrange(3)
            if action == 0:
                lines.insert(j, line)
            elif action == 1:
                del lines[i]
            else:
                del lines[i]
                lines.insert(j, line)
            out = bytearray(b"\n".join(lines))
        elif kind == 7:  # a field with an awkward value somewhere
            out[pos:pos] = b"\n" + rng.choice(NAMES) + b": " + rng.choice(AWKWARD) + b"\n"
        elif kind in (8, 9):  # a value after a colon replaced by a plausible one
            _replace_value(out, pos, plausible(rng))
        else:  # a long list
            n = rng.choice([10, 1000, 50000])
            out[pos:pos] = (rng.choice(NAMES) + b": [" + b", ".join(
                str(rng.randint(-5, 10**6)).encode() for _ in range(n)) + b"]\n")
    return bytes(out)


def scratch(rng: random.Random) -> bytes:
    """A job written from scratch: the schema's fields with random values and nesting."""
    def value() -> bytes:
        return plausible(rng)
    parts = [b"train_steps: " + value()]
    for _ in range(rng.randint(0, 6)):
        parts.append(rng.choice(NAMES) + b": " + value())
    layers = []
    for i in range(rng.randint(0, 4)):
        kind = rng.choice([b"kData", b"kInnerProduct", b"kSTanh", b"kReLU", b"kSoftmaxLoss",
                           b"kDropout", b"kSGDD"])
        src = f' srclayers: "l{rng.randrange(max(i, 1))}"'.encode() if i else b""
        conf = rng.choice([b"", b" innerproduct_conf { num_output: " + value() + b" }",
                           b" data_conf { source: \"digits\" batchsize: " + value() + b" }",
                           b" param { name: \"w\" init { type: kGaussian std: " + value()
                           + b" } }"])
        layers.append(f'layer {{ name: "l{i}" type: '.encode() + kind + src + conf + b" }")
    parts.append(b"neuralnet { " + b"\n".join(layers) + b" }")
    parts.append(b"updater { type: " + rng.choice([b"kSGD", b"kAdam", b"kRMSProp", b"kSGDD"])
                 + b" " + rng.choice(NAMES) + b": " + value()
                 + b" learning_rate { type: kStep base_lr: " + value()
                 + b" step_conf { change_freq: " + value() + b" gamma: " + value() + b" } } }")
    parts.append(b"cluster { " + rng.choice(NAMES) + b": " + value() + b" }")
    rng.shuffle(parts)
    return b"\n".join(parts) + b"\n"


def make_mutants(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    return [scratch(rng) if rng.random() < 0.2 else mutate(rng, rng.choice(EXAMPLES))
            for _ in range(count)]


def check_in_process(path: Path) -> str:
    """``paramserver check PATH`` in this process: ``ok`` (exit 0), ``param_error`` (exit 2),
    ``hang``, ``exit N`` or ``crash: Type: message`` (an exception out of the command)."""
    from _fuzz_readers import Hang, crash_text, time_limit

    try:
        with time_limit(HANG_SECONDS), redirect_stdout(io.StringIO()), \
                redirect_stderr(io.StringIO()) as err:
            code = cli.main(["check", str(path)])
        if code not in (0, 2) or "Traceback" in err.getvalue():
            return f"exit {code}: {err.getvalue()[-200:]}"
        return "ok" if code == 0 else "param_error"
    except Hang:
        return "hang"
    except Exception as e:  # what the fuzzer is for
        return crash_text(e)


def check_by_cli(path: Path) -> str:
    """``ok``, ``param_error``, ``hang``, ``exit N`` or ``traceback``."""
    from _fuzz_readers import cli_outcome

    outcome = cli_outcome(["check", str(path)], HANG_SECONDS + 25)
    return "param_error" if outcome == "refused" else outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=10_000)
    parser.add_argument("--cli", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="CLI runs at once")
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"),
                        help="folder for the mutants that failed")
    parser.add_argument("--readers", help="fuzz these readers instead of job files: "
                        "comma-separated names of data, safetensors, checkpoint, singa, or all")
    args = parser.parse_args()
    if args.readers:
        sys.exit(fuzz_readers(args))

    bad: list[tuple[str, bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.conf"  # imports and the data set, before any clock runs
        warm.write_bytes(EXAMPLES[0])
        assert check_in_process(warm) == "ok"
        start = time.perf_counter()
        results: Counter[str] = Counter()
        slowest = 0.0
        for i, data in enumerate(make_mutants(args.seed, args.mutants)):
            path = Path(tmp) / f"mutant-{i}.conf"
            path.write_bytes(data)
            t0 = time.perf_counter()
            outcome = check_in_process(path)
            slowest = max(slowest, time.perf_counter() - t0)
            results[outcome.split(":")[0].split(" ")[0]] += 1
            if outcome.startswith(("crash", "hang", "exit")):
                bad.append((outcome, data))
        in_process = time.perf_counter() - start

        start = time.perf_counter()
        cli_mutants = make_mutants(args.seed + 1, args.cli)
        paths = []
        for i, data in enumerate(cli_mutants):
            paths.append(Path(tmp) / f"cli-{i}.conf")
            paths[-1].write_bytes(data)
        with ThreadPoolExecutor(args.jobs) as pool:
            cli_results = list(pool.map(check_by_cli, paths))
        cli_counts = Counter(r.split(" ")[0] if r.startswith("exit") else r
                             for r in cli_results)
        for outcome, data in zip(cli_results, cli_mutants):
            if outcome not in ("ok", "param_error"):
                bad.append((f"cli {outcome}", data))
        cli_seconds = time.perf_counter() - start

    crashes = sum(n for k, n in results.items() if k == "crash")
    print(f"in process: {args.mutants} mutants in {in_process:.0f} s (slowest "
          f"{slowest:.2f} s): {results['ok']} checked, {results['param_error']} ParamError, "
          f"{crashes} crashes, {results['exit']} other exits or tracebacks, {results['hang']} "
          f"hangs over {HANG_SECONDS:g} s")
    print(f"CLI: {args.cli} mutants in {cli_seconds:.0f} s: {cli_counts['ok']} exit 0, "
          f"{cli_counts['param_error']} exit 2, {cli_counts['exit']} other exits, "
          f"{cli_counts['traceback']} tracebacks, {cli_counts['hang']} hangs")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if bad:
        args.out.mkdir(exist_ok=True)
        for i, (outcome, data) in enumerate(bad[:50]):
            (args.out / f"failure-{i}.conf").write_bytes(data)
            print(f"  {outcome}  -> {args.out / f'failure-{i}.conf'}")
        sys.exit(1)


def fuzz_readers(args: argparse.Namespace) -> int:
    """The ``--readers`` mode: counts per reader; 1 if any mutant failed (kept in
    ``--out``)."""
    import _fuzz_readers as fr

    names = fr.READERS if args.readers == "all" else tuple(args.readers.split(","))
    unknown = [n for n in names if n not in fr.READERS]
    if unknown:
        raise SystemExit(f"--readers: unknown {unknown}; the readers are {fr.READERS}")
    failed = 0
    for name in names:
        reader = fr.readers()[name]
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            seeds_dir, mutants_dir, scratch = root / "seeds", root / "m", root / "scratch"
            for d in (seeds_dir, mutants_dir, scratch):
                d.mkdir()
            seeds = reader.make_seeds(seeds_dir)
            for seed in seeds:  # imports and caches before any clock runs; seeds read whole
                assert fr.read_in_process(reader, seed, scratch) == "ok", seed
            rng = random.Random(f"{args.seed}/{name}")
            results: Counter[str] = Counter()
            bad: list[tuple[str, Path]] = []
            slowest, start = 0.0, time.perf_counter()
            for i in range(args.mutants):
                path = fr.make_mutant(rng, reader, seeds, mutants_dir, i)
                t0 = time.perf_counter()
                outcome = fr.read_in_process(reader, path, scratch)
                slowest = max(slowest, time.perf_counter() - t0)
                results[outcome.split(":")[0]] += 1
                if outcome not in ("ok", "refused"):
                    bad.append((outcome, _keep(path, args.out, f"{name}-{i}")))
                else:
                    _remove(path)
            seconds = time.perf_counter() - start
            cli_paths = [fr.make_mutant(rng, reader, seeds, mutants_dir, args.mutants + i)
                         for i in range(args.cli)]
            with ThreadPoolExecutor(args.jobs) as pool:
                cli = list(pool.map(fr.read_by_cli, [reader] * len(cli_paths), cli_paths,
                                    [_own(scratch, p) for p in cli_paths]))
            for outcome, path in zip(cli, cli_paths):
                if outcome not in ("ok", "refused"):
                    bad.append((f"cli {outcome}", _keep(path, args.out, f"{name}-cli")))
        counts = Counter(r.split(" ")[0] for r in cli)
        print(f"{name}: {args.mutants} mutants in process in {seconds:.0f} s (slowest "
              f"{slowest:.2f} s): {results['ok']} read, {results['refused']} refused "
              f"(ParamError), {results['crash']} crashes, {results['hang']} hangs over "
              f"{fr.HANG_SECONDS:g} s; CLI: {args.cli} mutants: {counts['ok']} exit 0, "
              f"{counts['refused']} exit 2, {counts['exit']} other exits, "
              f"{counts['traceback']} tracebacks, {counts['hang']} hangs", flush=True)
        for outcome, path in bad[:20]:
            print(f"  {outcome}  -> {path}")
        failed += len(bad)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


def _own(scratch: Path, path: Path) -> Path:
    """A scratch folder of one mutant's command (commands run side by side)."""
    folder = scratch / path.name.replace(".", "-")
    folder.mkdir(exist_ok=True)
    return folder


def _keep(path: Path, out: Path, name: str) -> Path:
    """Move a failed mutant into ``out`` for replay."""
    import shutil

    out.mkdir(exist_ok=True)
    target = out / f"{name}-{path.name}"
    shutil.move(str(path), target)
    return target


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
