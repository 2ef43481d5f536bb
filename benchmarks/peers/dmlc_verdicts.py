"""dmlc-core's Parameter beside paramserver's, on the same fields and texts: real MXNet
operators' fields (MXNet 1.9.1, whose operators parse their arguments with dmlc's
``Parameter``) and paramserver declarations of the same fields.

    python benchmarks/peers/dmlc_verdicts.py [--mxnet-venv PATH] [--all]

MXNet runs in its own virtual environment (it needs numpy<1.24), found as kv_mxnet.py finds
it (``--mxnet-venv``, ``MXNET_VENV``, else ``benchmarks/peers/.mxnet-venv``: mxnet_venv.py);
without it the script says so in one line and exits 0. Each case is a text given to one
field; each side gives a verdict (taken, or refused with a message). An MXNet error that is
not dmlc's (a shape that does not fit the toy input) counts as taken: the text was parsed.
dmlc's float parser reads the C ``errno`` without clearing it first, so its verdict on
``inf`` depends on what an earlier parse left there: each case runs with ``errno`` 0, and
the cases marked "errno left at ERANGE" with the ERANGE an earlier out-of-range value
leaves (then dmlc refuses ``inf`` as out of range).

Prints one line per case where the two differ (``--all``: every case), each difference
with the SPEC.md **Decision** that makes it deliberate, then a summary: cases, same
verdicts, refusals word for word, refusals in dmlc's words with the key added, and the
differences no Decision explains. Exit status 1 if there is such a difference.
Not run in CI (MXNet is no project dependency).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from paramserver import ParamError, Parameter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mxnet_venv import find_or_make

# -- the fields, as MXNet 1.9.1 declares them: one declaration, the conformance test's -------

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_dmlc_conformance import (
    Activation,
    Convolution,
    Dropout,
    FullyConnected,
    LeakyReLU,
    MultiBoxPrior,
)

OURS: dict[str, type[Parameter]] = {c.__name__: c for c in (
    FullyConnected, LeakyReLU, Dropout, Activation, Convolution, MultiBoxPrior)}

# The Decisions of SPEC.md section 1 a difference may be due to.
WIDTH = "Decision: int fields are 64-bit, float fields hold a double"
NO_NUMBER = "Decision: a float's text holds a number (dmlc reads e5, ., -, f, a blank as 0)"
NAN_BOUND = "Decision: nan is within no bound"
NAN_LITERAL = "Decision: a bad nan(...) payload is trailing text (dmlc stops on a CHECK)"
REQUIRED_ENUM = "Decision: a missing enum names its values, not dmlc's `of int`"
ITEMS = "Decision: items of a tuple or list parse as the item type does (inf, nan)"
INF = "Decision: inf is infinity whatever was parsed before (dmlc reads a stale errno)"
BRACKETS = "Decision: a shape's brackets match"
KEY = "dmlc's words, the key and value added"


@dataclass(frozen=True)
class Case:
    op: str          # the MXNet operator (and the paramserver class of the same name)
    key: str
    text: str | None  # None: the key is not given
    why: str = ""    # the Decision that makes a difference deliberate
    stale_errno: bool = False  # run with errno left at ERANGE, as after 1e39


def cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    for t in ["1", " 1", "1 ", "\t1\n", "\v1", "\f1\f", "1\v", "+1", "007", "2147483647", "0",
              "1.5", "0x10", "1x", "", " ", "1e3", "1 0", "--1", "9223372036854775808", "\u00a01"]:
        add(Case("FullyConnected", "num_hidden", t))
    for t in ["2147483648", "3000000000", "9223372036854775807"]:
        add(Case("FullyConnected", "num_hidden", t, WIDTH))
    for t in ["0.5", " 0.5", "\t\n0.5", "0.5 ", " 0.5 ", "0.5\n", "\v0.5", "inf", "-inf",
              "Infinity", "INF", "nan", "NaN(x_1)", "1.2f", "1e-3", ".5", "5.", "+3", "1e-500",
              "1e999", "0x1p3", "0.5abc", "1.2ff", "1.2 f", "1.2e10foo", "infamous", "infinit",
              "infinity war", "nan()x", "abc", "", "1,5"]:
        add(Case("LeakyReLU", "slope", t))
    for t in ["1e39", "3.5e38", "1e39x", "1e-39", "1e-45", "3.4e39", "1e300"]:
        add(Case("LeakyReLU", "slope", t, WIDTH))
    for t in ["e5", ".", "-", " ", "f", "1e", "-infinit"]:
        add(Case("LeakyReLU", "slope", t, NO_NUMBER))
    for t in ["inf", "-Infinity", "infamous"]:
        add(Case("LeakyReLU", "slope", t, INF, stale_errno=True))
    add(Case("LeakyReLU", "slope", "0.5", stale_errno=True))
    for t in ["nan(", "nan(a b)"]:
        add(Case("LeakyReLU", "slope", t, NAN_LITERAL))
    for t in ["0.5", "1", "1.5", "-0.1", "inf", "-inf"]:
        add(Case("Dropout", "p", t))
    add(Case("Dropout", "p", "nan", NAN_BOUND))
    add(Case("Dropout", "p", "inf", INF, stale_errno=True))
    for t in ["true", "TRUE", "False", "1", "0", " false", "false ", "yes", "t", "", "2"]:
        add(Case("FullyConnected", "flatten", t))
    for t in ["relu", "tanh", " relu", "RELU", "bad", ""]:
        add(Case("Activation", "act_type", t))
    add(Case("Activation", "act_type", None, REQUIRED_ENUM))
    for t in ["fastest", "None", "off", "bad", " off", "none", "FASTEST"]:
        add(Case("Convolution", "cudnn_tune", t))
    for t in ["(1,1)", "[1,1]", "(1, 1)", " (1,1) ", "(1 1)", "1,1", "(1.5,1)", "(1,1"]:
        add(Case("Convolution", "kernel", t))
    add(Case("Convolution", "kernel", "(1,1]", BRACKETS))
    for t in ["(0.5,)", "(0.5, 0.25)", " (0.5) ", "0.5", "(0.5x)", "(abc)"]:
        add(Case("MultiBoxPrior", "sizes", t))
    for t in ["(inf,)", "(nan,)", "(1e39,)"]:
        add(Case("MultiBoxPrior", "sizes", t, ITEMS if "e39" not in t else WIDTH))
    return out


# -- MXNet's side, run in its own python ---------------------------------------------------------

_MXNET_RUNNER = r"""
import ctypes, json, re, sys, warnings
warnings.filterwarnings("ignore")
_errno = ctypes.CDLL(None).__errno_location
_errno.restype = ctypes.POINTER(ctypes.c_int)
ERANGE = 34
import mxnet as mx
nd = mx.nd
x2, w2 = nd.ones((1, 2)), nd.ones((1, 2))
x4, w4 = nd.ones((1, 1, 3, 3)), nd.ones((1, 1, 1, 1))
CALLS = {
    "FullyConnected": lambda kw: nd.FullyConnected(x2, w2, no_bias=True,
                                                   **{"num_hidden": 1, **kw}),
    "LeakyReLU": lambda kw: nd.LeakyReLU(x2, **kw),
    "Dropout": lambda kw: nd.Dropout(x2, **kw),
    "Activation": lambda kw: nd.Activation(x2, **kw),
    "Convolution": lambda kw: nd.Convolution(x4, w4, num_filter=1, no_bias=True,
                                             **{"kernel": "(1,1)", **kw}),
    "MultiBoxPrior": lambda kw: nd.contrib.MultiBoxPrior(x4, **kw),
}
DMLC = ("Invalid Parameter format", "Invalid Input", "Out of range value",
        "Some trailing characters", " for Parameter ", "Required parameter",
        "Check failed", "Cannot find argument")
out = []
for op, key, text, stale in json.load(sys.stdin):
    _errno()[0] = ERANGE if stale else 0
    try:
        CALLS[op]({} if text is None else {key: text})
        out.append([True, ""])
    except Exception as e:
        words = str(e).rsplit("MXNetError: ", 1)[-1].rsplit(", in operator ", 1)[0].strip()
        words = words.split("\x00")[0]  # a CHECK's message may hold the NUL it stopped on
        words = re.sub(r"^\[[0-9:]+\] [^ ]+:[0-9]+: ", "", words)  # a log line's time, place
        refused = any(w in words for w in DMLC)
        out.append([not refused, words if refused else ""])
print(json.dumps(out))
"""


def mxnet_verdicts(python: str, all_cases: list[Case]) -> list[tuple[bool, str]]:
    done = subprocess.run([python, "-c", _MXNET_RUNNER], check=True, capture_output=True,
                          text=True, timeout=600,
                          input=json.dumps([[c.op, c.key, c.text, c.stale_errno]
                                            for c in all_cases]))
    return [(ok, words) for ok, words in json.loads(done.stdout.strip().splitlines()[-1])]


def our_verdict(case: Case) -> tuple[bool, str]:
    given = {} if case.text is None else {case.key: case.text}
    try:
        OURS[case.op].parse(given)
        return True, ""
    except ParamError as e:
        return False, str(e)


def compare(dmlc: tuple[bool, str], ours: tuple[bool, str]) -> str:
    if dmlc[0] != ours[0]:
        return "verdict"
    if dmlc[0]:
        return "same"
    if dmlc[1] == ours[1]:
        return "same"
    if ours[1].startswith(dmlc[1] + " ("):
        return KEY
    return "words"


def show(verdict: tuple[bool, str]) -> str:
    return "taken" if verdict[0] else "refused: " + verdict[1].replace("\n", " | ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mxnet-venv", default=None,
                    help="MXNet's side venv (default: MXNET_VENV, else "
                         "benchmarks/peers/.mxnet-venv; see mxnet_venv.py)")
    ap.add_argument("--all", action="store_true", help="print every case, not only differences")
    args = ap.parse_args(argv)
    python, why = find_or_make(args.mxnet_venv, make=False)
    if python is None:
        print(f"skipped: {why}")
        return 0
    all_cases = cases()
    theirs = mxnet_verdicts(str(python), all_cases)
    counts = {"same": 0, KEY: 0, "verdict": 0, "words": 0}
    both_refuse = unexplained = 0
    for case, dmlc in zip(all_cases, theirs):
        ours = our_verdict(case)
        how = compare(dmlc, ours)
        counts[how] += 1
        both_refuse += not dmlc[0] and not ours[0]
        differs = how in ("verdict", "words")
        if differs and not case.why:
            unexplained += 1
        if differs or args.all:
            text = "(not given)" if case.text is None else repr(case.text)
            if case.stale_errno:
                text += " (errno left at ERANGE)"
            mark = "" if not differs else f"  [{case.why or 'NOT EXPLAINED'}]"
            print(f"{case.op}.{case.key} = {text}: {how}{mark}\n"
                  f"    dmlc: {show(dmlc)}\n    ours: {show(ours)}")
    n = len(all_cases)
    print(f"{n} cases: {n - counts['verdict']} same verdict, {counts['verdict']} different; "
          f"of {both_refuse} refused by both, {both_refuse - counts['words'] - counts[KEY]} "
          f"word for word, {counts[KEY]} in dmlc's words with the key and value added, "
          f"{counts['words']} in other words; {unexplained} differences no Decision explains")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
