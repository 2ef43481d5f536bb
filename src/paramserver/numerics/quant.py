"""Low-precision updater state (``state_dtype``): the formats, once, and their NumPy reference.

An update step is memory-bound: its time is the bytes it moves. float32 Adam moves 28 bytes
per parameter per step (read ``w``, ``g``, ``m``, ``v``; write ``w``, ``m``, ``v``); with its
state in bfloat16 it moves 20, in 8-bit codes 16 (and 1/32 for the block scales). Small
state is also what lets a server hold a larger model. The values stay float32; only the
updater's per-element state (histories, moments) is kept small.

``state_dtype`` (a field of every updater):

- ``float32``: the state in the values' type (the default).
- ``bfloat16``: each state element is a bfloat16 (float32's sign and exponent, 7 fraction
  bits), stored as its 16-bit pattern (``uint16``): rounded to nearest, ties to even, or
  stochastically (``stochastic_rounding: true``).
- ``int8``: block-wise dynamic quantisation, after the 8-bit optimizers literature
  (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022): the state is
  cut into blocks of :data:`BLOCK` values counted from each segment's (Param's) start; each
  block keeps a float32 *scale*, the power of two at or above the largest magnitude in it
  after the update (a shared exponent, as in the OCP microscaling formats), and each element
  one byte: its value divided by the scale, in an 8-bit floating-point code — a *dynamic*
  exponent, so that values far below the block's largest keep their relative precision
  (3 fraction bits everywhere). A power-of-two scale makes the division exact and lets the
  kernels decode and encode with integer operations alone. Two codes
  (:class:`Code8`): state that may be negative (momentum histories, first moments) is
  ``int8``, a sign and 4 exponent bits (magnitudes down to 2^-15 of the scale, below that
  0); state that may not (squared-gradient means, AdaDelta's updates, AdaMax's norm) is
  ``uint8``, 5 exponent bits (down to 2^-31 of the scale, and never below: a denominator
  must not fall to 0 where its numerator does not). The stored type alone says which
  (:func:`decode`). Each block's new values are held in L1 while the scale is found: the
  step is still one pass over memory.

Rounding. A value is rounded on the grid of its binade: to nearest (bfloat16: ties to even;
8-bit codes: halves up, one integer operation fewer, and exact halves are rare), or
stochastically: up exactly when the fraction of the way to the next grid point, in units of
2^-k, is at least ``2^k - (r mod 2^k)``, ``r`` being 32 random bits, ``k`` 20 for 8-bit
codes and 16 for bfloat16 (the bits float32 drops). A magnitude that rounds below the
lowest binade of an 8-bit code is 0 (signed) or that binade's first value (non-negative).
The random bits are a hash (:func:`mix32`) of the segment's update count, the role and the
element's index in its segment, so a step is a pure function of the state and the gradient,
and a resumed run draws them again exactly.

The kernels (:mod:`paramserver.kernels`) encode and decode with integer operations on float32
bit patterns, in numba; the functions here are the NumPy reference of the same scheme
(float64 arithmetic, the grid found by ``frexp``), used by the tests and by :func:`decode`,
which turns any role's stored array back into its values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import ParamError
from ..config.job import STATE_DTYPES
from ..state import Role

#: Values per block of an 8-bit state (one float32 scale each: 4/256 bytes per value).
BLOCK = 256
#: The suffix of the role holding an 8-bit role's block scales (``m`` -> ``m_scale``).
SCALE = "_scale"
#: The least block scale (2^-95): every code's value times it is a normal float32. A scale
#: of 0 (a new state) counts as this.
SCALE_MIN = 2.0 ** -95
#: The largest block scale (2^127).
SCALE_MAX = 2.0 ** 127

#: Per update rule (:mod:`paramserver.kernels`), for each of its state arrays, whether it
#: may be negative: its 8-bit copy then needs the signed code (int8); the others are uint8.
SIGNED_STATE: dict[str, tuple[bool, ...]] = {
    "sgd": (),
    "momentum": (True,),
    "singa_momentum": (True,),  # the momentum rule with k1 = 1 (kernels: one multiply fewer)
    "nesterov": (True,),
    "nag_mxnet": (True,),
    "adagrad": (False,),
    "rmsprop": (False,),
    "rmsprop_momentum": (False, True),
    "rmsprop_centered": (False, True),  # the square average, the gradient's mean
    "rmsprop_centered_momentum": (False, True, True),  # ... the momentum buffer, the mean
    "adadelta": (False, False),
    "signum": (True,),
    "signsgd": (),
    "ftrl": (True, False),  # z, n
    "adam": (True, False),
    "amsgrad": (True, False, False),  # m, v, the running maximum of v
    "adam_inner_delta": (True, False),
    "adamax": (True, False),
    "nadam": (True, False),
    "radam": (True, False),
}


@dataclass(frozen=True)
class Code8:
    """An 8-bit floating-point code of magnitudes in [0, 1] (and a sign bit, bit 7, when
    ``signed``).

    A magnitude code ``m`` from 0 to :attr:`top` is the float32 whose bit pattern is
    ``(m + bias) << (23 - mbits)``: ``mbits`` fraction bits, ``ebits`` binades from
    ``2^emin``, :attr:`top` exactly 1; except that a signed code's 0 is 0 (a history that is
    0 stays 0), where a non-negative code's 0 is ``2^emin``, its least value (values below
    round up to it: a denominator's state never becomes 0, and decoding needs no test).
    """

    signed: bool
    ebits: int
    mbits: int

    @property
    def top(self) -> int:
        """The magnitude code of 1.0 (larger magnitude codes are never written)."""
        return (2 ** self.ebits - 1) << self.mbits

    @property
    def bias(self) -> int:
        """What to add to a magnitude code to get the top bits of its float32 pattern."""
        return (127 << self.mbits) - self.top

    @property
    def emin(self) -> int:
        """The exponent of the lowest binade."""
        return 1 - 2 ** self.ebits

    def magnitudes(self) -> np.ndarray:
        """The value of every magnitude code ``0 .. top`` (float64, ascending)."""
        m = np.arange(self.top + 1, dtype=np.int64)
        bits = ((m + self.bias) << (23 - self.mbits)).astype(np.uint32)
        return np.where((m == 0) & self.signed, 0.0, bits.view(np.float32).astype(np.float64))


#: The code of state that may be negative (sign, 4 exponent bits, 3 fraction bits).
SIGNED = Code8(signed=True, ebits=4, mbits=3)
#: The code of non-negative state (5 exponent bits, 3 fraction bits).
UNSIGNED = Code8(signed=False, ebits=5, mbits=3)


def check_state_dtype(state_dtype: str) -> None:
    if state_dtype not in STATE_DTYPES:
        raise ParamError(f"state_dtype {state_dtype!r}: valid are {', '.join(STATE_DTYPES)}")


def roles(names: Sequence[str], state_dtype: str,
          signed: Sequence[bool] | None = None) -> tuple[Role, ...]:
    """The :class:`~paramserver.state.Role` s of per-element state ``names`` kept as
    ``state_dtype``: float32 (the values' type), bfloat16 (``uint16`` patterns), or 8-bit
    codes with a float32 scale per block (``<name>_scale``): ``int8`` for a role that may be
    negative (``signed[i]``, :data:`SIGNED`), ``uint8`` for one that may not
    (:data:`UNSIGNED`)."""
    check_state_dtype(state_dtype)
    if state_dtype == "float32":
        return tuple(Role(n) for n in names)
    if state_dtype == "bfloat16":
        return tuple(Role(n, "uint16") for n in names)
    if signed is None or len(signed) != len(names):
        raise ParamError(f"8-bit state needs to know which of {list(names)} may be negative")
    out: list[Role] = []
    for n, neg in zip(names, signed):
        out += [Role(n, "int8" if neg else "uint8"),
                Role(n + SCALE, "float32", "block", BLOCK)]
    return tuple(out)


def code_of(dtype: np.dtype | type) -> Code8:
    """The 8-bit code of a stored type: int8 :data:`SIGNED`, uint8 :data:`UNSIGNED`."""
    dt = np.dtype(dtype)
    if dt == np.int8:
        return SIGNED
    if dt == np.uint8:
        return UNSIGNED
    raise ParamError(f"{dt} is not an 8-bit state code (int8: signed, uint8: non-negative)")


def state_bytes(state_dtype: str, num_roles: int, values_itemsize: int = 4) -> float:
    """Bytes of state per value for ``num_roles`` per-element roles (block scales included)."""
    check_state_dtype(state_dtype)
    per = {"float32": float(values_itemsize), "bfloat16": 2.0,
           "int8": 1.0 + 4.0 / BLOCK}[state_dtype]
    return per * num_roles


# ---------------------------------------------------------------------------------------------
# Random bits for stochastic rounding: written once, for NumPy (uint64 arrays) and numba
# (uint64 scalars) alike — :mod:`paramserver.kernels` compiles these very functions.


def mix32(x):  # type: ignore[no-untyped-def]
    """A 32-bit integer hash (C. Wellons' "lowbias32"); ``x`` and the result are uint64
    holding 32-bit values."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(0xFFFFFFFF)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & np.uint64(0xFFFFFFFF)
    return x ^ (x >> np.uint64(16))


def round_key(count, role):  # type: ignore[no-untyped-def]
    """The key of a segment's random bits for one update: its update count (this update
    included) and the role's position (0, 1)."""
    x = (np.uint64(count) * np.uint64(0x9E3779B9)
         + np.uint64(role) * np.uint64(0x85EBCA77) + np.uint64(0x27D4EB2F))
    return mix32(x & np.uint64(0xFFFFFFFF))


def round_bits(key, index):  # type: ignore[no-untyped-def]
    """The random bits of the element at ``index`` (in its segment) under ``key``."""
    return mix32((key + np.uint64(index)) & np.uint64(0xFFFFFFFF))


def random_bits(offsets: np.ndarray, counts: np.ndarray, role: int) -> np.ndarray:
    """Every element's random bits (uint64 holding 32 bits) for one update, per segment."""
    offsets = np.asarray(offsets, np.int64)
    sizes = np.diff(offsets)
    keys = np.repeat(round_key(np.asarray(counts).astype(np.uint64), role), sizes)
    index = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    return np.asarray(round_bits(keys, index.astype(np.uint64)), np.uint64)


# ---------------------------------------------------------------------------------------------
# The NumPy reference, in float64.


def _on_grid(a: np.ndarray, frac_bits: int, rbits: np.ndarray | None,
             k: int, ties_even: bool) -> tuple[np.ndarray, np.ndarray]:
    """``a > 0`` rounded on the grid of ``frac_bits`` fraction bits of its binade: the
    binade's exponent and the rounded fraction numerator ``q`` (0 to 2^frac_bits; 2^frac_bits
    is the next binade's first point), to nearest (ties to even, or up) or stochastically
    with ``k``-bit resolution."""
    f, e = np.frexp(a)  # a = f * 2^e, f in [0.5, 1)
    exp = e - 1
    t = (2 * f - 1) * 2.0 ** frac_bits  # position on the binade's grid, exact
    whole = np.floor(t)
    rest = t - whole
    if rbits is None:
        up = (rest > 0.5) | ((rest == 0.5) & ((whole % 2 == 1) | (not ties_even)))
    else:
        r = (np.asarray(rbits, np.uint64) & np.uint64((1 << k) - 1)).astype(np.float64)
        up = rest * 2.0 ** k >= 2.0 ** k - r
    return exp, whole + up


def bf16_decode(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 patterns (uint16)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_encode(x: np.ndarray, rbits: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 patterns of ``x`` (nearest, ties to even, or stochastic with ``rbits``).
    NaN is the quiet NaN 0x7FC0; a magnitude rounding past the largest finite bfloat16 is
    Inf. float64 values are rounded as they are (once), float32 ones by their bits."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        out = np.zeros(x.shape, np.float64)
        pos = np.isfinite(x) & (x != 0)
        if np.any(pos):
            r = None if rbits is None else np.broadcast_to(np.asarray(rbits, np.uint64),
                                                           x.shape)[pos]
            exp, q = _on_grid(np.abs(x[pos]), 7, r, 16, True)
            out[pos] = np.copysign(np.ldexp(1 + q / 2.0 ** 7, exp.astype(np.int64)), x[pos])
        out = np.where(pos, out, x)
        with np.errstate(over="ignore"):
            return bf16_encode(out.astype(np.float32))  # exact: on bfloat16's grid already
    x = np.asarray(x, np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    low, high = b & np.uint64(0xFFFF), b >> np.uint64(16)
    if rbits is None:
        up = (low > 0x8000) | ((low == 0x8000) & (high % 2 == 1))
    else:
        up = low + (np.asarray(rbits, np.uint64) & np.uint64(0xFFFF)) >= 0x10000
    out = (high + up).astype(np.uint16)  # carries through exponent bits: the float order
    return np.where(np.isnan(x), np.uint16(0x7FC0), out)


def code8_decode(codes: np.ndarray, code: Code8) -> np.ndarray:
    """The values in [-1, 1] (float64) of 8-bit codes."""
    c = np.asarray(codes).view(np.uint8).astype(np.int64)
    mag = code.magnitudes()
    if not code.signed:
        return mag[np.minimum(c, code.top)]
    return np.where(c & 0x80, -1.0, 1.0) * mag[np.minimum(c & 0x7F, code.top)]


def code8_encode(y: np.ndarray, code: Code8, rbits: np.ndarray | None = None) -> np.ndarray:
    """8-bit codes of ``y`` (float64, ``|y| <= 1``; larger magnitudes take the top code);
    nearest, or stochastic with ``rbits``. A signed code keeps the sign of a negative
    ``y`` (also when its magnitude rounds to 0: ``-0``)."""
    y = np.asarray(y, np.float64)
    a = np.abs(y)
    m = np.zeros(a.shape, np.int64)
    pos = a > 0
    if np.any(pos):
        r = None if rbits is None else np.broadcast_to(np.asarray(rbits, np.uint64),
                                                       a.shape)[pos]
        exp, q = _on_grid(a[pos], code.mbits, r, 23 - code.mbits, False)
        # The code whose float32 pattern's top bits are (exp + 127) << mbits | q, less bias.
        m[pos] = ((exp + 127).astype(np.int64) << code.mbits) + q.astype(np.int64) - code.bias
    m = np.clip(m, 0, code.top)
    if not code.signed:
        return m.astype(np.uint8)
    m = np.where(np.signbit(y), m | 0x80, m)
    return m.astype(np.uint8).view(np.int8)


def blocks_of(offsets: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """Per element, its block's index (blocks counted from each segment's start)."""
    offsets = np.asarray(offsets, np.int64)
    sizes = np.diff(offsets)
    first = np.concatenate([[0], np.cumsum(-(-sizes // block))])[:-1].astype(np.int64)
    index = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    return np.repeat(first, sizes) + index // block


def num_blocks(offsets: np.ndarray, block: int = BLOCK) -> int:
    """The number of blocks of a state with these segment boundaries."""
    sizes = np.diff(np.asarray(offsets, np.int64))
    return int((-(-sizes // block)).sum())


def block_scales(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per block, the power of two at or above the largest magnitude of ``x`` (rounded to
    float32 first), from :data:`SCALE_MIN` to :data:`SCALE_MAX`, as float32."""
    amax = np.zeros(num_blocks(offsets), np.float64)
    np.maximum.at(amax, blocks_of(offsets), np.abs(np.asarray(x, np.float64)))
    amax = amax.astype(np.float32).astype(np.float64)
    f, e = np.frexp(amax)  # amax = f * 2^e, f in [0.5, 1): 2^e, or 2^(e-1) for f = 0.5
    exp = np.where(f == 0.5, e - 1, e)
    return np.clip(np.ldexp(1.0, exp), SCALE_MIN, SCALE_MAX).astype(np.float32)


def block_encode(x: np.ndarray, offsets: np.ndarray, code: Code8,
                 rbits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, scales)`` of values ``x``: the codes of ``x / scale`` per block."""
    scales = block_scales(x, offsets)
    y = np.asarray(x, np.float64) / scales.astype(np.float64)[blocks_of(offsets)]
    return code8_encode(y, code, rbits), scales


def block_decode(codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray,
                 code: Code8) -> np.ndarray:
    """The values (float32, exact): each code's value times its block's scale (at least
    :data:`SCALE_MIN`)."""
    s = np.maximum(np.asarray(scales, np.float64), SCALE_MIN)[blocks_of(offsets)]
    return (code8_decode(codes, code) * s).astype(np.float32)


def decode(arrays: Mapping[str, np.ndarray], name: str, offsets: np.ndarray) -> np.ndarray:
    """The values of per-element role ``name`` of a state's ``arrays``
    (``UpdaterState.arrays``), whatever it is kept as; ``offsets`` are the state's segment
    boundaries (8-bit blocks are counted from each segment's start)."""
    a = np.asarray(arrays[name])
    if a.dtype == np.uint16:
        return bf16_decode(a)
    if a.dtype in (np.int8, np.uint8):
        return block_decode(a, arrays[name + SCALE], offsets, code_of(a.dtype))
    return a


__all__ = [
    "BLOCK",
    "SCALE",
    "SCALE_MAX",
    "SCALE_MIN",
    "SIGNED",
    "SIGNED_STATE",
    "STATE_DTYPES",
    "UNSIGNED",
    "Code8",
    "bf16_decode",
    "bf16_encode",
    "block_decode",
    "block_encode",
    "block_scales",
    "blocks_of",
    "check_state_dtype",
    "code8_decode",
    "code8_encode",
    "code_of",
    "decode",
    "mix32",
    "num_blocks",
    "random_bits",
    "roles",
    "round_bits",
    "round_key",
    "state_bytes",
]
