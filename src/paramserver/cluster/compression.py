"""Fewer bytes on the wire: gradients pushed in bfloat16, or in 2 bits with error feedback.

Optional, off by default (SPEC §10). A pushing worker encodes its gradients (the dense part
and the rows of a row-sparse one) and the server decodes them before it sums them:

- ``bf16``: each value rounded to bfloat16 (round to nearest even; 8 bits of mantissa): half
  the bytes of float32. The relative error of a value is at most 2^-9; nothing is kept.
- ``2bit`` (MXNet's two-bit compression): the worker adds the residual it kept to the
  gradient, sends for each value one of ``+threshold``, ``-threshold`` or ``0`` (the first
  when the sum is at least ``threshold``, the second at most ``-threshold``) in 2 bits, and
  keeps what was not sent as the next residual (error feedback: nothing is lost, only
  delayed). One sixteenth of float32's bytes. A value moves by at most ``threshold`` per
  push, so the threshold is of the size of the gradients' large values (MXNet's default,
  0.5, suits gradients of order 1).

With either, the row ids of a row-sparse gradient travel as the differences of the sorted ids,
in LEB128 varints (about 2 bytes a row for a table of 10^7 rows touched 10^4 at a time,
instead of 8).

Every function here is plain NumPy over whole arrays (a few passes, each vectorised).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ParamError

#: The codecs by name, and "" for none (what an :class:`~.messages.Update` says).
CODECS = ("none", "bf16", "2bit")


@dataclass(frozen=True)
class Compression:
    """How a worker compresses its pushes.

    Attributes:
        type: ``"none"``, ``"bf16"`` or ``"2bit"``.
        threshold: the value a 2-bit code stands for (``> 0``).
    """

    type: str = "none"
    threshold: float = 0.5

    @classmethod
    def parse(cls, x: Compression | Mapping[str, Any] | str | None) -> Compression:
        """From a dict (MXNet's ``{"type": "2bit", "threshold": 0.5}``), a name or None."""
        if x is None:
            return cls()
        if isinstance(x, Compression):
            return x
        if isinstance(x, str):
            x = {"type": x}
        if not isinstance(x, Mapping):
            raise ParamError(f"gradient compression must be a dict such as {{'type': '2bit', "
                             f"'threshold': 0.5}}, a name or None, not {type(x).__name__}")
        unknown = sorted(set(x) - {"type", "threshold"})
        if unknown:
            raise ParamError(f"gradient compression: unknown keys {unknown}; the keys are "
                             "'type' and 'threshold'")
        kind = str(x.get("type", "none"))
        if kind not in CODECS:
            raise ParamError(f"Invalid Input: '{kind}', valid values are: "
                             f"{{{', '.join(repr(c) for c in CODECS)}}} (gradient compression "
                             "type)")
        threshold = x.get("threshold", 0.5)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
                np.isfinite(threshold) and threshold > 0):
            raise ParamError(f"gradient compression threshold must be a finite number > 0, "
                             f"not {threshold!r}")
        if kind != "2bit" and "threshold" in x:
            raise ParamError(f"gradient compression '{kind}' has no threshold (only '2bit')")
        return cls(kind, float(threshold))

    @property
    def codec(self) -> str:
        """The name an update carries ("" for none)."""
        return "" if self.type == "none" else self.type

    @property
    def error_feedback(self) -> bool:
        return self.type == "2bit"


# -- values ------------------------------------------------------------------------------------

def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 (or float64) values as bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():  # a NaN stays a NaN (rounding could carry it into Inf)
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


_LUT = np.array([0.0, 1.0, -1.0, 0.0])


def encode(x: np.ndarray, codec: str, threshold: float = 0.5,
           residual: np.ndarray | None = None) -> np.ndarray:
    """Gradient values (1-D) as they travel under ``codec``.

    Args:
        x: the values (float32 or float64); only read.
        codec: ``""`` (the values themselves), ``"bf16"`` or ``"2bit"``.
        threshold: the 2-bit codes' value.
        residual: (``2bit``) what earlier pushes did not send, ``x``'s shape and dtype;
            added before coding and left holding what this push does not send.
    """
    if codec == "":
        return x
    if codec == "bf16":
        return _bf16(x)
    if codec != "2bit":
        raise ParamError(f"unknown gradient codec {codec!r}")
    q = x + residual if residual is not None else x.copy()
    t = x.dtype.type(threshold)
    codes = np.zeros(q.size + (-q.size) % 4, np.uint8)
    codes[:q.size][q >= t] = 1
    codes[:q.size][q <= -t] = 2
    if residual is not None:
        np.subtract(q, _LUT[codes[:q.size]].astype(x.dtype) * t, out=residual)
    c = codes.reshape(-1, 4)
    return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).astype(np.uint8)


def decode(data: np.ndarray, codec: str, n: int, dtype: Any, threshold: float = 0.5
           ) -> np.ndarray:
    """The ``n`` values of ``dtype`` that :func:`encode` made ``data`` of."""
    dtype = np.dtype(dtype)
    data = np.asarray(data)
    if codec == "":
        if data.dtype != dtype or data.size != n:
            raise ParamError(f"{data.size} {data.dtype} gradient values, expected {n} {dtype}")
        return data.reshape(-1)
    if codec == "bf16":
        if data.dtype != np.uint16 or data.size != n:
            raise ParamError(f"bf16 gradients: {data.size} {data.dtype} values, expected {n} "
                             "uint16")
        return (data.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(dtype,
                                                                                 copy=False)
    if codec == "2bit":
        if data.dtype != np.uint8 or data.size != -(-n // 4):
            raise ParamError(f"2-bit gradients: {data.size} {data.dtype} bytes, expected "
                             f"{-(-n // 4)} uint8 for {n} values")
        shifts = np.array([0, 2, 4, 6], np.uint8)
        codes = ((data[:, None] >> shifts) & np.uint8(3)).reshape(-1)[:n]
        return (_LUT.astype(dtype) * dtype.type(threshold))[codes]
    raise ParamError(f"unknown gradient codec {codec!r}")


def nbytes_encoded(n: int, codec: str, itemsize: int) -> int:
    """The bytes of ``n`` values under ``codec``."""
    return {"": n * itemsize, "bf16": 2 * n, "2bit": -(-n // 4)}[codec]


# -- row ids -----------------------------------------------------------------------------------

def _varint(d: np.ndarray) -> np.ndarray:
    """Non-negative integers as LEB128 varints (7 bits a byte, low first)."""
    d = d.astype(np.uint64)
    nb = np.ones(d.size, np.int64)
    for k in range(1, 10):
        nb += d >= np.uint64(1 << (7 * k))
    starts = np.cumsum(nb) - nb
    out = np.empty(int(nb.sum()), np.uint8)
    for k in range(int(nb.max()) if d.size else 0):
        sel = nb > k
        byte = (d[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (nb[sel] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + k] = (byte | more).astype(np.uint8)
    return out


def _unvarint(b: np.ndarray) -> np.ndarray:
    if b.size == 0:
        return np.zeros(0, np.int64)
    if b[-1] >= 128:
        raise ParamError("varint row ids end in the middle of a number")
    last = b < 128
    starts = np.flatnonzero(np.concatenate([[True], last[:-1]]))
    pos = np.arange(b.size) - np.repeat(starts, np.diff(np.append(starts, b.size)))
    if pos.max() > 9:
        raise ParamError("varint row ids hold a number of more than 64 bits")
    contrib = (b & np.uint8(0x7F)).astype(np.uint64) << (np.uint64(7) * pos.astype(np.uint64))
    return np.add.reduceat(contrib, starts).astype(np.int64)


def encode_ids(ids: np.ndarray, splits: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Row ids, each part (``splits``: its bounds in ``ids``) strictly increasing, as varints
    of their differences."""
    ids = np.asarray(ids, np.int64)
    d = np.empty_like(ids)
    if ids.size:
        d[0] = ids[0]
        d[1:] = np.diff(ids)
        for s in (np.asarray(splits)[1:-1] if splits is not None else ()):
            if 0 < s < ids.size:
                d[s] = ids[s]
    return _varint(d)


def decode_ids(data: np.ndarray, n: int, splits: Sequence[int] | np.ndarray | None = None
               ) -> np.ndarray:
    """The ``n`` row ids :func:`encode_ids` made ``data`` of."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ParamError(f"compressed row ids are uint8 varints, not {data.dtype}")
    d = _unvarint(data)
    if d.size != n:
        raise ParamError(f"compressed row ids hold {d.size} ids, expected {n}")
    total = np.cumsum(d)
    if splits is not None and len(splits) > 2:
        cut = np.asarray(splits, np.int64)
        before = np.where(cut[:-1] > 0, total[np.maximum(cut[:-1] - 1, 0)], 0)
        total -= np.repeat(before, np.diff(cut))
    return total


__all__ = ["CODECS", "Compression", "decode", "decode_ids", "encode", "encode_ids",
           "nbytes_encoded"]
