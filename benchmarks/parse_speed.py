"""Reading job files with long lists: MB/s of ``load_job``, and whether it stays linear.

    python benchmarks/parse_speed.py [--mb 1 5] [--rounds 5]

Writes job files whose ``fixedstep_conf`` holds lists of about ``--mb`` megabytes (ints and
floats, on one line and one value per line), then reads each with ``load_job`` (the whole
path: text reader, declarations, checks), taking turns between the sizes in every round so
that load from elsewhere hits all of them. Baseline in the same process: protobuf's own
text-format Tokenizer passing over the same text (what the reader lexed with before), which
does less (no grammar, no values). Prints min / median / max MB/s and the load average; the
target (issue 13) is a median of at least 1 MB/s at every size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from google.protobuf.text_format import Tokenizer

from paramserver.config.job import load_job


def job_text(megabytes: float, one_per_line: bool) -> str:
    """A job file whose step / step_lr lists take about ``megabytes`` MB."""
    separator = ",\n  " if one_per_line else ", "
    n = int(megabytes * 1e6 / 17)  # ~7 bytes per step and ~10 per rate, with separators
    steps = separator.join(str(i) for i in range(n))
    rates = separator.join(f"{1 / (i + 1):.6g}" for i in range(n))
    return ("train_steps: 1\nupdater { learning_rate { type: kFixedStep fixedstep_conf {\n"
            f"  step: [{steps}]\n  step_lr: [{rates}]\n}} }} }}\nneuralnet {{ }}\n")


def protobuf_tokens(text: str) -> None:
    tokenizer = Tokenizer(text.split("\n"))
    while not tokenizer.AtEnd():
        tokenizer.NextToken()


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[1.0, 5.0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for mb in args.mb:
            for one_per_line in (False, True):
                path = Path(tmp) / f"job-{mb}-{int(one_per_line)}.conf"
                text = job_text(mb, one_per_line)
                path.write_text(text)
                size = len(text.encode()) / 1e6
                name = f"{size:.2f} MB, {'one per line' if one_per_line else 'one line'}"
                cases.append((name, size, path, text))
        load_job(cases[0][2])  # imports and registries, once
        ours: dict[str, list[float]] = {c[0]: [] for c in cases}
        base: dict[str, list[float]] = {c[0]: [] for c in cases}
        for _ in range(args.rounds):
            for name, size, path, text in cases:
                ours[name].append(size / seconds(lambda p=path: load_job(p)))  # type: ignore[misc]
                base[name].append(size / seconds(lambda t=text: protobuf_tokens(t)))  # type: ignore[misc]

    print(f"load_job of job files with long lists; {args.rounds} rounds, sizes interleaved; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'file':<28}{'MB/s min':>10}{'median':>10}{'max':>10}"
          f"{'protobuf lexer MB/s':>22}{'ours/lexer':>12}")
    ok = True
    for name, *_ in cases:
        lo, med, hi = min(ours[name]), statistics.median(ours[name]), max(ours[name])
        b = statistics.median(base[name])
        ok &= med >= 1.0
        print(f"{name:<28}{lo:>10.2f}{med:>10.2f}{hi:>10.2f}{b:>22.2f}{med / b:>12.2f}")
    print(f"target (median >= 1 MB/s at every size): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
