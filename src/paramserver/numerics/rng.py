"""Counter-based random fills for parameter initialisation: fast, and the same on every run.

Seeding scheme
--------------
Every Param draws from its own stream, named by a 64-bit *key*: :func:`param_key` hashes the
job seed and the Param's name with BLAKE2b (the seed, 8 bytes little-endian, is the hash key;
the UTF-8 name is the message; the 8-byte digest is read little-endian). The bits come from
Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
generator of cuRAND, JAX and PyTorch's CUDA backend): a keyed bijection of a 128-bit counter
``(c0, c1, c2, c3)`` to a *block* of four 32-bit words. Element ``i`` of a fill takes its bits
from the bulk blocks, whose counter is ``(j mod 2³², j div 2³², 0, 0)`` for block ``j``:

- float32 element ``i``: word ``i % 4`` of block ``i // 4``;
- float64 element ``i``: words ``2·(i % 2)`` (low half) and ``2·(i % 2) + 1`` of block ``i // 2``.

The rare draws that need more bits (a ziggurat candidate that missed the fast path, a
truncated normal outside its bounds) use per-element blocks with counter
``(i mod 2³², i div 2³², attempt, round·2¹⁶ + stage)``, stage ≥ 1, which never meet the bulk
blocks: stage 1 holds a new candidate, stage 2 the uniform of the wedge test, stages 2 + t
the two uniforms of the tail's t-th try, stage 0xFFFF the uniform of an inverse-CDF draw.
So every value is a pure function of ``(key, i)`` and the dtype: it does not depend on the
array's length, on how the fill is cut into chunks or threads, on the number of workers or
servers, or on the order the Params are made in. ``offset`` lets a server fill only its slice
``[offset, offset + out.size)`` of a Param and get exactly what a whole fill puts there.

Distributions
-------------
- uniform: ``low + (high - low)·u`` in float64, ``u`` the top 24 (float32) or 53 (float64) bits
  as a fraction in [0, 1), rounded to the dtype and kept below ``high``;
- normal: a 256-layer ziggurat (Marsaglia & Tsang 2000) with separate bits for the layer
  (8 bits), the sign (1) and the abscissa (23 for float32, 52 for float64), NumPy's layout.
  About 1.5 % of the elements miss the fast path and take the exact wedge or tail test,
  with further per-element draws;
- truncated normal: if ``[a, b]`` holds at least a quarter of the mass, the element's normal
  draw (the one :func:`fill_normal` makes), redrawn from per-element rounds 1 to 15 while
  outside ``[a, b]``, then an inverse-CDF draw; narrower intervals take the inverse CDF of
  one per-element uniform, in the lower tail (mirrored when the interval lies above 0).

The arithmetic is IEEE without fast-math, so the values are bit-identical wherever the same
kernels run on the same C math library; only the rare slow-path values, which call
``log``/``exp``/``erfc``, could differ in the last bit under another libm.

Here are the keys and the checks of a fill's arguments; the compiled fillers are in
:mod:`.rng_kernels`, loaded (and numba with them) on the first fill that writes values, so a
fill with ``check_only`` (``paramserver check``) loads neither. A small uniform fill (at most
:data:`.rng_arrays.SMALL_FILL` values in one call) is written by NumPy instead, the same
values bit for bit, so that a small job need not load numba's compiler (:mod:`.rng_arrays`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import ParamError
from . import forms, rng_arrays

__all__ = [
    "fill_constant_segments",
    "fill_normal",
    "fill_normal_segments",
    "fill_truncated_normal",
    "fill_truncated_normal_segments",
    "fill_uniform",
    "fill_uniform_segments",
    "param_key",
    "param_keys",
    "standard_normal_matrix",
]


def param_key(seed: int, name: str) -> int:
    """The 64-bit stream key of Param ``name`` in a job seeded with ``seed``.

    BLAKE2b with the seed (8 bytes, little-endian) as the hash key and the UTF-8 name as the
    message; the 8-byte digest read little-endian. Stable across runs, processes, machines
    and Python versions (unlike ``hash()``).

    Args:
        seed: the job seed, an int in [0, 2**64).
        name: the Param's name.

    Returns:
        An int in [0, 2**64).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ParamError(f"seed must be an int in [0, 2**64), got {type(seed).__name__}")
    if not 0 <= int(seed) < 1 << 64:
        raise ParamError(f"seed must be an int in [0, 2**64), got {seed}")
    if not isinstance(name, str):
        raise ParamError(f"name must be a str, got {type(name).__name__}")
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8,
                             key=int(seed).to_bytes(8, "little")).digest()
    return int.from_bytes(digest, "little")


def _check(out: np.ndarray, key: int, offset: int) -> tuple[np.ndarray, np.uint64, np.uint64]:
    """Validate a fill's target, key and offset; the flat view and the two key words."""
    if not isinstance(out, np.ndarray):
        raise ParamError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype not in (np.float32, np.float64):
        raise ParamError(f"out must have dtype float32 or float64, got {out.dtype}")
    if not out.flags.c_contiguous:
        raise ParamError("out must be C-contiguous (element i of the stream is element i of "
                         "out in C order); fill a contiguous array and copy it in")
    if not out.flags.writeable:
        raise ParamError("out must be writeable")
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise ParamError(f"key must be an int in [0, 2**64), got {type(key).__name__}")
    if not 0 <= int(key) < 1 << 64:
        raise ParamError(f"key must be an int in [0, 2**64), got {key}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ParamError(f"offset must be an int, got {type(offset).__name__}")
    if not 0 <= int(offset) <= (1 << 62) - out.size:
        raise ParamError(f"offset must be in [0, 2**62 - out.size], got {offset}")
    key = int(key)
    return out.reshape(-1), np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)


def _finite(dtype: np.dtype, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ParamError(f"{name} must be a real number, got {type(value).__name__}")
        if not math.isfinite(value) or abs(value) > float(np.finfo(dtype).max):
            raise ParamError(f"{name} must be finite in {dtype}, got {value}")


def fill_uniform(out: np.ndarray, key: int, low: float = -1.0, high: float = 1.0, *,
                 offset: int = 0, check_only: bool = False) -> None:
    """Fill ``out`` in place with U[low, high).

    Element ``i`` of ``out`` (C order) is a function of ``(key, offset + i)`` and the dtype
    only. For float32 arrays ``low`` and ``high`` are first rounded to float32.

    Args:
        out: a C-contiguous float32 or float64 array, any shape.
        key: the stream key (see :func:`param_key`).
        low: the smallest value; finite.
        high: the bound the values stay below; finite, ``>= low`` (all ``low`` if equal).
        offset: the stream position of ``out``'s first element (a server's slice start).
        check_only: check the arguments and write nothing (numba is not loaded).

    Raises:
        ValueError: for a bad array, key, offset or bounds.
    """
    flat, k0, k1 = _check(out, key, offset)
    _draw(flat, int(offset), k0, k1, "UNIFORM", _uniform_prm(out.dtype, low, high), check_only)


def _uniform_prm(dtype: np.dtype, low: float, high: float) -> np.ndarray:
    """The uniform fill's parameters (``low``, ``high`` checked): ``low``, ``high - low``,
    the largest value below ``high`` (twice)."""
    _finite(dtype, low=low, high=high)
    lo, hi = float(dtype.type(low)), float(dtype.type(high))
    if not lo <= hi:
        raise ParamError(f"low must be <= high, got low={low}, high={high}")
    if not math.isfinite(hi - lo):
        raise ParamError(f"high - low must be finite in float64, got low={low}, high={high}")
    top = float(np.nextafter(dtype.type(hi), dtype.type(-np.inf))) if lo < hi else hi
    return np.array([lo, hi - lo, top, top, 0.0, 0.0, 0.0, 0.0])


def fill_normal(out: np.ndarray, key: int, mean: float = 0.0, std: float = 1.0, *,
                offset: int = 0, check_only: bool = False) -> None:
    """Fill ``out`` in place with N(mean, std²).

    Element ``i`` of ``out`` (C order) is a function of ``(key, offset + i)`` and the dtype
    only: ``mean + std·z``, the standard normal ``z`` drawn as the module notes say.

    Args:
        out: a C-contiguous float32 or float64 array, any shape.
        key: the stream key (see :func:`param_key`).
        mean: the mean; finite.
        std: the standard deviation; finite, ``>= 0``.
        offset: the stream position of ``out``'s first element (a server's slice start).
        check_only: check the arguments and write nothing (numba is not loaded).

    Raises:
        ValueError: for a bad array, key, offset, mean or std.
    """
    flat, k0, k1 = _check(out, key, offset)
    _draw(flat, int(offset), k0, k1, "NORMAL", _normal_prm(out.dtype, mean, std), check_only)


def _normal_prm(dtype: np.dtype, mean: float, std: float) -> np.ndarray:
    """The normal fill's parameters (checked): ``mean``, ``std``."""
    _finite(dtype, mean=mean, std=std)
    if std < 0:
        raise ParamError(f"std must be >= 0, got {std}")
    return np.array([float(mean), float(std), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def fill_truncated_normal(out: np.ndarray, key: int, mean: float = 0.0, std: float = 1.0,
                          a: float = -2.0, b: float = 2.0, *, offset: int = 0,
                          check_only: bool = False) -> None:
    """Fill ``out`` in place with N(mean, std²) truncated to [mean + a·std, mean + b·std].

    Element ``i`` of ``out`` (C order) is a function of ``(key, offset + i)`` and the dtype
    only. Intervals holding at least a quarter of the mass redraw the element's normal
    until it falls inside (its first draw is the one :func:`fill_normal` would make);
    narrower ones use the inverse CDF.

    Args:
        out: a C-contiguous float32 or float64 array, any shape.
        key: the stream key (see :func:`param_key`).
        mean: the mean of the untruncated normal; finite.
        std: its standard deviation; finite, ``>= 0``.
        a: the lower bound in units of ``std`` from ``mean``; may be ``-inf``.
        b: the upper bound in units of ``std``; ``> a``; may be ``inf``.
        offset: the stream position of ``out``'s first element (a server's slice start).
        check_only: check the arguments and write nothing (numba is not loaded).

    Raises:
        ValueError: for a bad array, key, offset, mean, std or bounds, or an interval so far
            in a tail that it holds no representable probability.
    """
    flat, k0, k1 = _check(out, key, offset)
    _draw(flat, int(offset), k0, k1, "TRUNCATED", _truncated_prm(out.dtype, mean, std, a, b),
          check_only)


def _truncated_prm(dtype: np.dtype, mean: float, std: float, a: float = -2.0,
                   b: float = 2.0) -> np.ndarray:
    """The truncated normal fill's parameters (checked): ``mean``, ``std``, ``a``, ``b``,
    whether it draws by the inverse CDF, the interval's lower CDF and mass, mirrored?"""
    _finite(dtype, mean=mean, std=std)
    if std < 0:
        raise ParamError(f"std must be >= 0, got {std}")
    for label, bound in (("a", a), ("b", b)):
        if isinstance(bound, bool) or not isinstance(
                bound, (int, float, np.integer, np.floating)) or math.isnan(bound):
            raise ParamError(f"{label} must be a real number (or ±inf), got {bound!r}")
    a, b = float(a), float(b)
    if not a < b:
        raise ParamError(f"a must be < b (bounds in units of std), got a={a}, b={b}")
    mirror = a + b > 0  # work in the lower tail, where Φ keeps its relative accuracy
    lo, hi = (-b, -a) if mirror else (a, b)
    plo = 0.5 * math.erfc(-lo / math.sqrt(2.0))
    pspan = 0.5 * math.erfc(-hi / math.sqrt(2.0)) - plo
    if not pspan > 0.0:
        raise ParamError(f"the interval [a, b] = [{a}, {b}] lies too far in a tail: it holds "
                         "no probability representable in float64 (keep it within ~37 std)")
    inverse = pspan < 0.25
    return np.array([float(mean), float(std), a, b, float(inverse), plo, pspan, float(mirror)])


def _draw(flat: np.ndarray, offset: int, k0: np.uint64, k1: np.uint64, method: str,
          prm: np.ndarray, check_only: bool) -> None:
    """Run a checked fill with the compiled fillers (:mod:`.rng_kernels`, and numba with
    them, loaded on the first fill that writes values)."""
    if check_only or flat.size == 0:
        return
    if method == "UNIFORM" and flat.size <= rng_arrays.SMALL_FILL and forms.numpy_allowed():
        rng_arrays.uniform(flat, offset, int(k0), int(k1), prm)
        return
    from . import rng_kernels

    rng_kernels.run(flat, offset, k0, k1, getattr(rng_kernels, method), prm)


def _run_segments(out: np.ndarray, starts: Any, sizes: Any, keys: Any, method: str,
                  prms: np.ndarray) -> None:
    """Check segments of the flat array ``out`` and their keys, and fill them
    (:func:`.rng_kernels.run_segments`): segment ``s`` gets what one fill of it with key
    ``keys[s]`` and parameters ``prms[s]`` puts there."""
    starts, sizes = _segments(out, starts, sizes)
    keys = np.asarray(keys, np.uint64).reshape(-1)
    if not starts.size == keys.size == len(prms):
        raise ParamError(f"{starts.size} segments, {keys.size} keys and {len(prms)} "
                         "parameters: one of each per segment")
    if not starts.size:
        return
    if method == "UNIFORM" and starts.size <= rng_arrays.FEW_SEGMENTS \
            and int(sizes.sum()) <= rng_arrays.SMALL_FILL and forms.numpy_allowed():
        for lo, n, key, prm in zip(starts.tolist(), sizes.tolist(), keys.tolist(), prms):
            rng_arrays.uniform(out[lo:lo + n], 0, key & 0xFFFFFFFF, key >> 32, prm)
        return
    from . import rng_kernels

    rng_kernels.run_segments(out, starts, sizes, keys & np.uint64(0xFFFFFFFF),
                             keys >> np.uint64(32), getattr(rng_kernels, method), prms)


def _segments(out: np.ndarray, starts: Any, sizes: Any) -> tuple[np.ndarray, np.ndarray]:
    """Segments of ``out`` checked: ``starts`` and ``sizes`` as int64 arrays."""
    if not (isinstance(out, np.ndarray) and out.ndim == 1 and out.flags.c_contiguous
            and out.flags.writeable and out.dtype in (np.float32, np.float64)):
        raise ParamError("out must be a writeable, C-contiguous 1-D float32 or float64 array")
    starts = np.asarray(starts, np.int64).reshape(-1)
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    if starts.size != sizes.size:
        raise ParamError(f"{starts.size} starts and {sizes.size} sizes: one of each per "
                         "segment")
    if starts.size and (starts.min() < 0 or sizes.min() < 0
                        or (starts + sizes).max() > out.size):
        raise ParamError(f"segments must lie within out ({out.size} values)")
    return starts, sizes


def _segment_prms(make: Any, dtype: np.dtype, columns: tuple[Any, ...], n: int) -> np.ndarray:
    """Per segment, the fill's parameters from ``make(dtype, *row)`` (the one home of their
    formula and checks, shared with the fills of one array), made once per distinct row
    (by bits: -0.0 is not 0.0), in the order the rows first come."""
    table = np.empty((n, len(columns)))
    for j, column in enumerate(columns):
        table[:, j] = column
    _, first, inverse = np.unique(table.view(np.int64), axis=0, return_index=True,
                                  return_inverse=True)
    rows = np.empty((first.size, 8))
    for u in np.argsort(first):
        rows[u] = make(dtype, *(float(x) for x in table[first[u]]))
    return rows[inverse.reshape(-1)]


def fill_uniform_segments(out: np.ndarray, starts: Any, sizes: Any, keys: Any, low: Any,
                          high: Any) -> None:
    """Fill segments of a flat array with U[low, high), each with its own stream: segment
    ``s`` gets exactly what ``fill_uniform(out[starts[s]:starts[s] + sizes[s]], keys[s],
    low[s], high[s])`` puts there, for many segments in one call.

    Args:
        out: a writeable, C-contiguous 1-D float32 or float64 array.
        starts, sizes: per segment, where it starts in ``out`` and its number of values.
        keys: per segment, the stream key (see :func:`param_key`).
        low, high: per segment (or one for all), as :func:`fill_uniform` takes them.

    Raises:
        ValueError: as :func:`fill_uniform`, for the first segment that is wrong; or for
            segments outside ``out``.
    """
    n = np.size(starts)
    _run_segments(out, starts, sizes, keys, "UNIFORM",
                  _segment_prms(_uniform_prm, out.dtype, (low, high), n))


def fill_normal_segments(out: np.ndarray, starts: Any, sizes: Any, keys: Any, mean: Any,
                         std: Any) -> None:
    """:func:`fill_uniform_segments` for N(mean, std²): segment ``s`` gets what
    ``fill_normal(segment, keys[s], mean[s], std[s])`` puts there."""
    n = np.size(starts)
    _run_segments(out, starts, sizes, keys, "NORMAL",
                  _segment_prms(_normal_prm, out.dtype, (mean, std), n))


def fill_truncated_normal_segments(out: np.ndarray, starts: Any, sizes: Any, keys: Any,
                                   mean: Any, std: Any, a: Any = -2.0, b: Any = 2.0) -> None:
    """:func:`fill_uniform_segments` for the truncated normal: segment ``s`` gets what
    ``fill_truncated_normal(segment, keys[s], mean[s], std[s], a[s], b[s])`` puts there."""
    n = np.size(starts)
    _run_segments(out, starts, sizes, keys, "TRUNCATED",
                  _segment_prms(_truncated_prm, out.dtype, (mean, std, a, b), n))


def fill_constant_segments(out: np.ndarray, starts: Any, sizes: Any, values: Any) -> None:
    """Set segment ``s`` of a flat array (``starts[s]``, ``sizes[s]`` values) to
    ``values[s]``, rounded to ``out``'s type as ``ndarray.fill`` rounds it; many segments in
    one call."""
    starts, sizes = _segments(out, starts, sizes)
    values = np.ascontiguousarray(np.broadcast_to(np.asarray(values, np.float64), starts.shape))
    if starts.size <= rng_arrays.FEW_SEGMENTS:  # from Python: no numba, nothing compiled
        for lo, n, value in zip(starts.tolist(), sizes.tolist(), values.tolist()):
            out[lo:lo + n] = value
        return
    from . import rng_kernels

    rng_kernels.constant_segments(out, starts, sizes, values)


def param_keys(seed: int, names: Sequence[str]) -> np.ndarray:
    """:func:`param_key` of every name (uint64), the seed checked once."""
    param_key(seed, "")  # the seed's checks
    key = int(seed).to_bytes(8, "little")
    blake2b = hashlib.blake2b
    digests = []
    for name in names:
        if type(name) is not str:
            param_key(seed, name)  # its message
        digests.append(blake2b(name.encode("utf-8"), digest_size=8, key=key).digest())
    return np.frombuffer(b"".join(digests), "<u8").astype(np.uint64)


def standard_normal_matrix(shape: int | tuple[int, ...], key: int) -> np.ndarray:
    """A new float64 array of standard normals (e.g. for orthogonal init by QR).

    The values are those :func:`fill_normal` writes into a float64 array of ``shape``.

    Args:
        shape: the array's shape.
        key: the stream key (see :func:`param_key`).

    Returns:
        A C-contiguous float64 array.
    """
    out = np.empty(shape, dtype=np.float64)
    fill_normal(out, key)
    return out
