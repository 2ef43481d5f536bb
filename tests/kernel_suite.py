"""Every kernel paramserver compiles, run on fixed inputs: one process of the cross-process
suite (``tests/test_kernel_processes.py``).

    python tests/kernel_suite.py [--set ci|all|concurrent] [--reverse] [--rotate N]
    python tests/kernel_suite.py --keys

Runs the cases of the set in order (or reversed) and prints one JSON line: ``results`` (per
case, the SHA-256 of everything it computed: the values, the state, the bfloat16 copies, the
counts of NaN and Inf), ``compiled`` (the functions numba compiled in this process),
``hits`` and ``misses`` (entries numba's cache gave, and the ones it did not have).

The kernels (``all``): every dense update rule (``kernels._RULES``, so a rule added there is
covered) × its state kept as float32/float64, bfloat16 or 8-bit × rounding to nearest or
stochastic (low-precision state) × serial (one chunk) or parallel × with or without a float32
master copy; every row kernel × float32/float64; the read-only check; the random fills'
chunk and parallel fillers, plain and truncated, float32 and float64; the global norm's
serial and parallel builds; the cluster's sum; the rows' ordered sum. Compiling them all takes
minutes on two cores: ``ci`` is a subset that still has every driver, codec, build and
callee (every rule in one build, each codec and build on a few rules), and ``concurrent`` a
few whose callees are cached functions of their own, for four processes at once. ``all`` is
run by hand (see docs/low_precision.md). ``--keys`` makes every kernel of ``all`` without
compiling it and prints what numba keys its cache entries by: the same in every process, or
the kernel would never be found in the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

Case = Callable[[], list[Any]]


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


# -- the dense update kernels ---------------------------------------------------------------

FAMILIES = ("float", "bfloat16", "8bit")


def _dense(name: str, rule: str, family: str, dtype: str, stochastic: bool, parallel: bool,
           master: bool) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics import kernels as K
        from paramserver.numerics import quant

        rng = _rng(name)
        n = 2 * K.CHUNK + 1000 if parallel else 3000
        offsets = np.array([0, 1000, 1001, n // 2 + 7, n], np.int64)
        nseg = offsets.size - 1
        w = rng.standard_normal(n).astype(dtype)
        states: dict[str, Any] = {}
        for i, signed in enumerate(quant.SIGNED_STATE[rule]):
            if family == "float":
                states[f"s{i}"] = np.zeros(n, dtype)
            elif family == "bfloat16":
                states[f"s{i}"] = np.zeros(n, np.uint16)
            else:
                states[f"s{i}"] = (np.zeros(n, np.int8 if signed else np.uint8),
                                   np.zeros(quant.num_blocks(offsets), np.float32))
        values = np.zeros(n, np.float32) if master else None
        lr = rng.uniform(0.01, 0.1, nseg)
        wd = np.array([0.0, 1e-3, 0.0, 1e-2])
        p = (0.9, 0.1, 0.99, 0.01, 0.5 if rule == "rmsprop_momentum" else 1e-6)
        out: list[Any] = []
        for step in (1, 2, 3):
            g = rng.standard_normal(n).astype(dtype)
            if step == 3:
                g[[5, n - 3]] = (np.nan, np.inf)  # checked: refused, nothing written
            found = K._launch(rule, w, g, states, offsets, 1.0 / step, wd,
                              (lr, 1.0 - lr * wd, 0.5), p, -1.5, 1.5, step != 2, stochastic,
                              np.full(nseg, step), values)
            out.append(found)
        out += [w, *(a for s in states.values() for a in (s if isinstance(s, tuple) else (s,)))]
        return [*out, values] if master else out

    return run


def _dense_cases() -> Iterator[tuple[str, Case]]:
    from paramserver.numerics import kernels as K
    from paramserver.numerics import quant

    for rule in K._RULES:
        stateful = bool(quant.SIGNED_STATE[rule])
        for family, dtype, stochastic, parallel, master in itertools.product(
                FAMILIES, ("float32", "float64"), (False, True), (False, True),
                (False, True)):
            if (family != "float" and (dtype == "float64" or not stateful)) or (
                    family == "float" and stochastic) or (master and dtype != "float32"):
                continue
            name = (f"dense/{rule}/{family}/{dtype}/{'stochastic' if stochastic else 'nearest'}"
                    f"/{'parallel' if parallel else 'serial'}{'/master' if master else ''}")
            yield name, _dense(name, rule, family, dtype, stochastic, parallel, master)


# -- the other kernels ----------------------------------------------------------------------


def _rows(name: str, rule: str, dtype: str) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics import quant, rows

        rng = _rng(name)
        dim, num_rows = 24, 3000
        w = rng.standard_normal(dim * num_rows).astype(dtype)
        states = {f"s{i}": np.zeros_like(w) for i in range(len(quant.SIGNED_STATE[rule]))}
        ids = np.sort(rng.choice(num_rows, 2000, replace=False))
        out: list[Any] = []
        for step in (1, 2):
            g = rng.standard_normal(ids.size * dim).astype(dtype)
            out.append(rows._launch(getattr(rows, f"_{rule}_rows"), w, g, ids, dim, states,
                                    0.5, 1e-3, (0.05, 1.0, 0.9), (0.9, 0.1, 0.99, 0.01, 1e-6),
                                    -1.0, 1.0, step == 1))
        return [*out, w, *states.values()]

    return run


def _check(name: str, dtype: str) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics.kernels import CHUNK, count_nonfinite

        g = _rng(name).standard_normal(9 * CHUNK + 5).astype(dtype)
        g[[0, 4 * CHUNK + 1, g.size - 1]] = (np.nan, np.inf, -np.inf)
        return [count_nonfinite(g), count_nonfinite(g[:3 * CHUNK])]

    return run


def _fill(name: str, dtype: str, truncated: bool, parallel: bool) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics import rng as fills

        n = (1 << 16) + 4099 if parallel else 5001
        out = []
        for offset in (0, 3):
            a, b = np.empty(n, dtype), np.empty(n, dtype)
            if truncated:
                fills.fill_truncated_normal(a, 11, 0.5, 2.0, -1.0, 1.5, offset=offset)
                fills.fill_truncated_normal(b, 12, 0.0, 1.0, 2.5, 3.0, offset=offset)
            else:
                fills.fill_uniform(a, 11, -0.5, 2.0, offset=offset)
                fills.fill_normal(b, 12, 1.0, 3.0, offset=offset)
            out += [a, b]
        return out

    return run


def _norm(name: str, dtype: str, parallel: bool) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics import norm

        n = (1 << 20) + 77 if parallel else 5000
        g = _rng(name).standard_normal(n).astype(dtype)
        offsets = [0, 10, n // 3, n]
        return [norm.sum_squares(g, offsets, [1.0, 0.5, 2.0]),
                norm.sum_squares(g, offsets, 1.0, -0.5, 0.5)]

    return run


def _sum(name: str, dtype: str) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics import sums

        rng = _rng(name)
        a, b = (rng.standard_normal(3 * sums.CHUNK + 11).astype(dtype) for _ in "ab")
        b[7] = np.inf
        out = np.empty_like(a)
        return [sums.add(out, a, b), out]

    return run


def _ordered_sum(name: str, dtype: str) -> Case:
    def run() -> list[Any]:
        from paramserver.numerics.rows import sum_rows_in_order

        rng = _rng(name)
        parts = rng.standard_normal((500, 7)).astype(dtype)
        ids = rng.integers(0, 60, 500)
        order = np.argsort(ids, kind="stable")
        bounds = np.searchsorted(ids[order], np.arange(61)).astype(np.int64)
        out = np.zeros((60, 7), dtype)
        sum_rows_in_order(parts, order.astype(np.int64), bounds, out)
        return [out]

    return run


def _other_cases() -> Iterator[tuple[str, Case]]:
    from paramserver.numerics import kernels as K
    from paramserver.numerics import quant, rows

    for rule in K._RULES:
        if hasattr(rows, f"_{rule}_rows"):
            for dtype in ("float32", "float64"):
                yield f"rows/{rule}/{dtype}", _rows(f"rows/{rule}/{dtype}", rule, dtype)
    assert all(r in quant.SIGNED_STATE for r in K._RULES)
    for dtype in ("float32", "float64"):
        yield f"check/{dtype}", _check(f"check/{dtype}", dtype)
        for truncated, parallel in itertools.product((False, True), (False, True)):
            name = (f"fill/{dtype}/{'truncated' if truncated else 'plain'}/"
                    f"{'parallel' if parallel else 'chunk'}")
            yield name, _fill(name, dtype, truncated, parallel)
        for parallel in (False, True):
            name = f"norm/{dtype}/{'parallel' if parallel else 'serial'}"
            yield name, _norm(name, dtype, parallel)
        yield f"sum/{dtype}", _sum(f"sum/{dtype}", dtype)
        yield f"ordered_sum/{dtype}", _ordered_sum(f"ordered_sum/{dtype}", dtype)


def every_case() -> dict[str, Case]:
    """Every kernel the package can make, by case name."""
    return dict(itertools.chain(_dense_cases(), _other_cases()))


# -- the sets -------------------------------------------------------------------------------

#: Every rule in one build; each codec, rounding, build and master copy on a few rules; a
#: second signature (float64) of a dispatcher that has one; every other kind of kernel.
CI = [
    *(f"dense/{rule}/float/float32/nearest/serial" for rule in (
        "sgd", "momentum", "singa_momentum", "nesterov", "adagrad", "rmsprop",
        "rmsprop_momentum", "adadelta", "adam", "adam_inner_delta", "adamax")),
    "dense/adam/float/float64/nearest/serial",
    "dense/singa_momentum/float/float32/nearest/parallel",
    "dense/adam/bfloat16/float32/nearest/serial",
    "dense/adam/bfloat16/float32/stochastic/parallel/master",
    "dense/adam/8bit/float32/nearest/serial",
    "dense/momentum/8bit/float32/stochastic/parallel/master",
    "rows/adam/float64",
    "check/float32",
    "fill/float32/plain/chunk", "fill/float32/plain/parallel",
    "norm/float32/serial", "norm/float32/parallel",
    "sum/float32", "ordered_sum/float32",
]

#: For four processes at once on an empty cache: kernels whose callees are cached functions
#: of their own (the parallel check in a parallel update kernel; the Philox and ziggurat
#: functions in the chunk filler), compiled and saved into one cache by all four at once.
CONCURRENT = [
    "check/float32",
    "dense/singa_momentum/float/float32/nearest/parallel",
    "fill/float32/plain/chunk",
]

SETS = {"ci": CI, "concurrent": CONCURRENT}


def _digest(values: list[Any]) -> str:
    h = hashlib.sha256()
    for v in values:
        if v is None:
            h.update(b"none")
        elif isinstance(v, np.ndarray):
            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        else:
            h.update(repr(v).encode())  # an int, or a float's shortest repr: its exact bits
    return h.hexdigest()


def _dispatchers() -> list[Any]:
    """Every numba dispatcher of paramserver's numerics made so far."""
    from numba.core.dispatcher import Dispatcher

    from paramserver.numerics import kernels, rng_kernels

    found = {id(d): d for d in (*kernels._made.values(), *rng_kernels._fills.values())}
    for name, module in list(sys.modules.items()):
        if name.startswith("paramserver.numerics."):
            for value in vars(module).values():
                if isinstance(value, Dispatcher):
                    found[id(value)] = value
    return list(found.values())


def cache_keys() -> dict[str, str]:
    """Every kernel the package can make (made, not compiled): by the name numba files it
    under, a hash of what numba keys its entries by besides the types (its code and the
    pickle of its closure) and its options. A key that differs between processes is never
    found again: the kernel compiles in every process."""
    import importlib
    import pkgutil

    from numba.core.serialize import dumps

    import paramserver.numerics
    from paramserver.numerics import kernels as K
    from paramserver.numerics import quant, rng_kernels

    for module in pkgutil.iter_modules(paramserver.numerics.__path__):
        importlib.import_module(f"paramserver.numerics.{module.name}")
    for rule, family, stochastic, parallel, master in itertools.product(
            K._RULES, FAMILIES, (False, True), (False, True), (False, True)):
        signs = quant.SIGNED_STATE[rule]
        codes = tuple({"float": "float", "bfloat16": "bfloat16"}.get(
            family, "int8" if signed else "uint8") for signed in signs)
        K.kernel_for(rule, codes, stochastic, parallel, master)
    for is32, truncated in itertools.product((False, True), (False, True)):
        rng_kernels._fill(is32, truncated)
    keys = {}
    for d in _dispatchers():
        cells = tuple(c.cell_contents for c in d.py_func.__closure__ or ())
        h = hashlib.sha256(d.py_func.__code__.co_code + dumps(cells))
        h.update(repr(sorted(d.targetoptions.items())).encode())
        keys[f"{d.py_func.__module__}:{d.py_func.__qualname__}:{h.hexdigest()[:8]}"] = (
            h.hexdigest())
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="ci", choices=("ci", "all", "concurrent"))
    ap.add_argument("--reverse", action="store_true", help="run the cases in reverse order")
    ap.add_argument("--rotate", type=int, default=0, help="start at the N-th case")
    ap.add_argument("--keys", action="store_true", help="print every kernel's cache key "
                    "(compiling nothing) instead")
    args = ap.parse_args()
    from paramserver.numerics import compile_events

    if args.keys:
        print(json.dumps(cache_keys()))
        return

    cases = every_case()
    names = list(cases) if args.set == "all" else SETS[args.set]
    if args.reverse:
        names = names[::-1]
    names = names[args.rotate % len(names):] + names[:args.rotate % len(names)]
    compiled: list[str] = []
    results = {}
    from paramserver.numerics import forms

    # compiled_only: the compiled kernels even where a small call would take a NumPy form
    with compile_events.reporting(lambda name, starting: compiled.append(name) if starting
                                  else None), forms.compiled_only():
        for name in names:
            results[name] = _digest(cases[name]())
    stats = [d.stats for d in _dispatchers()]
    print(json.dumps({"results": results, "compiled": compiled,
                      "hits": sum(sum(s.cache_hits.values()) for s in stats),
                      "misses": sum(sum(s.cache_misses.values()) for s in stats)}))


if __name__ == "__main__":
    main()
