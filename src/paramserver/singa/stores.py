"""SINGA's data stores, read and written byte for byte as SINGA's C++ code does.

Backends (``store_conf { backend }``, and v0.1.0's DataShard):

* ``kvfile`` (v0.2.0+): a file of records, each ``key length, key, value length, value``,
  the lengths 8-byte little-endian unsigned integers (``size_t`` on the 64-bit machines
  SINGA ran on). SINGA's reader also takes a folder holding ``shard.dat``.
* ``shard`` (v0.1.0's ``DataShard``, ``kShardData``): a folder holding ``shard.dat`` in the
  same record format.
* ``textfile``: one record per line (the key is the line number); SINGA's CSV store.

A sample is a ``RecordProto`` (v0.1.0: ``SingleLabelImageRecord``, same fields) with its
shape, label and either raw pixel bytes or float data; v0.2.0+ stores write it as the value
itself, v0.1.0's DataShard wraps it in a ``Record``. A CSV record is ``label,v1,v2,...``
(``has_label``) with SINGA's ``separator``.

Mean files (``mean_file``, ``meanfile``): a kvfile whose first record is a ``RecordProto``
with the mean in ``data`` (v0.2.0+), a bare serialized record (v0.1.0's ``image_mean.bin``;
Caffe's ``.binaryproto`` ``BlobProto`` is read too), or a textfile whose first line is the
values.

Every problem with a file is a ParamError that names it. Nothing read is executed.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ParamError
from ..paths import require_regular, shown
from .files import write_atomically
from .records import CaffeBlob, Record, RecordProto, parse

BACKENDS = ("kvfile", "shard", "textfile")
#: The length fields of a kvfile record: ``size_t`` of a 64-bit little-endian machine.
SIZE = struct.Struct("<Q")
SHARD_FILE = "shard.dat"
#: The key format of SINGA's example writers (``%08d``), as paramserver writes keys.
KEY_FORMAT = "{:08d}"


# -- key-value files -------------------------------------------------------------------------


def kvfile_path(path: str | os.PathLike[str]) -> Path:
    """The file a kvfile store reads: ``path``, or ``path/shard.dat`` for a folder (SINGA's
    KVFile looks there too)."""
    p = Path(path)
    return p / SHARD_FILE if p.is_dir() else p


def _read_bytes(path: Path, what: str, whole: bool = True) -> Any:
    """The bytes of a file; without ``whole``, a read-only memory map of it (only the bytes
    looked at are read: a store's first records). A pipe or a device (/dev/zero) is not
    read."""
    require_regular(path, what)
    try:
        if whole:
            return path.read_bytes()
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise ParamError(f"{what} '{path}' does not exist") from None
    except IsADirectoryError:
        raise ParamError(f"{what} '{path}' is a folder") from None
    except OSError as e:
        raise ParamError(f"{what} '{path}' cannot be read: {e.strerror or e}") from None


def decode_kvfile(data: Any, where: str = "kvfile", limit: int | None = None
                  ) -> list[tuple[bytes, bytes]]:
    """The ``(key, value)`` records of the bytes of a kvfile (bytes or a memory map), in
    order; the first ``limit`` only, when given."""
    out: list[tuple[bytes, bytes]] = []
    pos, n = 0, len(data)
    while pos < n and (limit is None or len(out) < limit):
        start = pos
        fields = []
        for part in ("key", "value"):
            if pos + SIZE.size > n:
                raise ParamError(f"{where}: record {len(out)} at byte {start} is cut short "
                                 f"(the file ends inside its {part} length)")
            (length,) = SIZE.unpack_from(data, pos)
            pos += SIZE.size
            if length > n - pos:
                raise ParamError(f"{where}: record {len(out)} at byte {start} is cut short "
                                 f"(its {part} of {length} bytes goes past the end of the "
                                 f"file, {n} bytes)")
            fields.append(bytes(data[pos:pos + length]))
            pos += length
        out.append((fields[0], fields[1]))
    return out


def encode_kvfile(records: Iterable[tuple[bytes | str, bytes]], where: str = "kvfile"
                  ) -> bytes:
    """The bytes of a kvfile holding ``records``; refuses what SINGA's writer refuses: a key
    given twice, an empty value."""
    parts = []
    seen: set[bytes] = set()
    for i, (key, value) in enumerate(records):
        k = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if k in seen:
            raise ParamError(f"{where}: key {k!r} of record {i} is used twice (SINGA's "
                             "kvfile keeps one record per key)")
        if not value:
            raise ParamError(f"{where}: record {i} ({k!r}) has an empty value, which SINGA's "
                             "kvfile does not store")
        seen.add(k)
        parts += [SIZE.pack(len(k)), k, SIZE.pack(len(value)), bytes(value)]
    return b"".join(parts)


def read_kvfile(path: str | os.PathLike[str], limit: int | None = None
                ) -> list[tuple[bytes, bytes]]:
    """The records of a kvfile store (a file, or a folder holding ``shard.dat``); the first
    ``limit`` only, when given (the rest of the file is not read)."""
    file = kvfile_path(path)
    return decode_kvfile(_read_bytes(file, "kvfile store", limit is None), str(file), limit)


def write_kvfile(path: str | os.PathLike[str], records: Iterable[tuple[bytes | str, bytes]]
                 ) -> Path:
    """Write a kvfile store atomically; returns its path."""
    return write_atomically(path, encode_kvfile(records, str(path)))


def read_textfile(path: str | os.PathLike[str], limit: int | None = None) -> list[str]:
    """The lines of a textfile store (SINGA reads them with ``getline``); the first
    ``limit`` only, when given (the rest of the file is not read)."""
    data = _read_bytes(Path(path), "textfile store", limit is None)
    if limit is not None:  # the bytes up to the end of line ``limit``
        end = 0
        for _ in range(limit):
            at = data.find(b"\n", end)
            end = len(data) if at < 0 else at + 1
        data = bytes(data[:end])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParamError(f"textfile store '{path}' is not UTF-8 text ({e.reason} at byte "
                         f"{e.start})") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def write_textfile(path: str | os.PathLike[str], lines: Iterable[str]) -> Path:
    """Write a textfile store atomically, one line per record."""
    return write_atomically(path, "".join(f"{line}\n" for line in lines).encode("utf-8"))


# -- samples ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Samples:
    """Samples of a store: ``x`` of shape ``(n, *shape)`` (uint8 for pixel records, float32
    for data records and CSV) and their labels ``y`` (int64, ``(n,)``)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.shape[:1] != self.y.shape:
            raise ParamError(f"{self.x.shape[0]} samples but {self.y.shape[0]} labels")

    @property
    def pixel(self) -> bool:
        """Whether the samples are raw pixel bytes (else float data)."""
        return self.x.dtype == np.uint8


def encode_sample(x: np.ndarray, label: int | None, *, wrap: bool = False) -> bytes:
    """One sample as SINGA stores it: a ``RecordProto`` with the sample's shape, its label,
    and its values as ``pixel`` bytes (uint8) or ``data`` floats; ``wrap`` puts it in a
    v0.1.0 ``Record`` (DataShard)."""
    image = RecordProto()
    image.shape.extend(int(d) for d in x.shape)
    if label is not None:
        image.label = int(label)
    if x.dtype == np.uint8:
        image.pixel = np.ascontiguousarray(x).tobytes()
    else:
        image.data.extend(np.asarray(x, np.float32).reshape(-1).tolist())
    if not wrap:
        return bytes(image.SerializeToString())
    record = Record()
    record.image.CopyFrom(image)
    return bytes(record.SerializeToString())


def decode_sample(value: bytes, *, wrapped: bool = False, where: str = "record"
                  ) -> tuple[np.ndarray, int]:
    """A sample and its label from a stored record (``wrapped``: a v0.1.0 ``Record``)."""
    if wrapped:
        record = parse(Record, value, where)
        if not record.HasField("image"):
            raise ParamError(f"{where}: the Record holds no image")
        image = record.image
    else:
        image = parse(RecordProto, value, where)
    shape = tuple(int(d) for d in image.shape)
    if any(d < 0 for d in shape):
        raise ParamError(f"{where}: negative dimension in shape {shape}")
    if len(image.data):
        x = np.array(image.data, np.float32)
    elif image.pixel:
        x = np.frombuffer(image.pixel, np.uint8).copy()
    else:
        raise ParamError(f"{where}: the record holds neither pixel nor data values")
    if shape and math.prod(shape) != x.size:
        raise ParamError(f"{where}: {x.size} values for shape {shape}")
    return x.reshape(shape or (x.size,)), int(image.label)


def write_records(path: str | os.PathLike[str], samples: Samples, backend: str = "kvfile"
                  ) -> Path:
    """Write samples as a SINGA store: ``kvfile`` (a file of RecordProtos, v0.2.0+),
    ``shard`` (v0.1.0's DataShard: a folder whose ``shard.dat`` holds Records) or
    ``textfile`` (CSV, :func:`write_csv`). Keys are the sample numbers, ``%08d``."""
    if backend == "textfile":
        return write_csv(path, samples)
    file = _store_file(path, backend)
    wrap = backend == "shard"
    return write_kvfile(file, ((KEY_FORMAT.format(i), encode_sample(x, int(y), wrap=wrap))
                               for i, (x, y) in enumerate(zip(samples.x, samples.y,
                                                              strict=True))))


def read_records(path: str | os.PathLike[str], backend: str = "kvfile", *,
                 separator: str = ",", has_label: bool = True,
                 shape: Sequence[int] | None = None, limit: int | None = None) -> Samples:
    """The samples of a SINGA store (see :func:`write_records`); every record must have the
    same shape and kind (pixel or data). ``limit``: the first records only (the rest of
    the store is not read)."""
    if backend == "textfile":
        return read_csv(path, separator=separator, has_label=has_label, shape=shape,
                        limit=limit)
    file = _store_file(path, backend)
    records = (read_kvfile(file, limit) if backend == "kvfile"
               else decode_kvfile(_read_bytes(file, "DataShard", limit is None), str(file),
                                  limit))
    if not records:
        raise ParamError(f"store '{file}' holds no records")
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for i, (key, value) in enumerate(records):
        where = f"store '{file}', record {i} (key {key.decode('utf-8', 'replace')!r})"
        x, y = decode_sample(value, wrapped=backend == "shard", where=where)
        if xs and (x.shape != xs[0].shape or x.dtype != xs[0].dtype):
            kind = "pixels" if x.dtype == np.uint8 else "data"
            raise ParamError(f"{where}: {kind} of shape {x.shape}, unlike the records before "
                             f"it ({xs[0].shape})")
        xs.append(x)
        ys.append(y)
    x_all = np.stack(xs)
    if shape is not None:
        x_all = _reshape(x_all, shape, str(file))
    return Samples(x_all, np.asarray(ys, np.int64))


def _store_file(path: str | os.PathLike[str], backend: str) -> Path:
    if backend == "kvfile":
        return Path(path)
    if backend == "shard":
        return Path(path) / SHARD_FILE
    raise ParamError(f"Invalid Input: '{backend}', valid values are: "
                     + "{" + ", ".join(repr(b) for b in BACKENDS) + "}")


def _reshape(x: np.ndarray, shape: Sequence[int], where: str) -> np.ndarray:
    size = int(np.prod(shape, dtype=np.int64))
    if x[0].size != size:
        raise ParamError(f"{where}: samples of {x[0].size} values do not fit shape "
                         f"{tuple(shape)}")
    return x.reshape((x.shape[0], *shape))


# -- CSV (textfile) --------------------------------------------------------------------------


def _number(v: Any) -> str:
    """The shortest text that reads back as the same float32."""
    return np.format_float_positional(np.float32(v), unique=True, trim="-")


def write_csv(path: str | os.PathLike[str], samples: Samples, separator: str = ",",
              has_label: bool = True) -> Path:
    """Write samples as SINGA's CSV store: per line the label (``has_label``), then the
    values, each the shortest text that reads back as the same float32."""
    if not separator or "\n" in separator:
        raise ParamError(f"a CSV separator must be one or more characters on a line, not "
                         f"{separator!r}")
    lines = []
    for x, y in zip(samples.x, samples.y, strict=True):
        values = [_number(v) for v in np.asarray(x, np.float32).reshape(-1)]
        lines.append(separator.join([str(int(y)), *values] if has_label else values))
    return write_textfile(path, lines)


def read_csv(path: str | os.PathLike[str], separator: str = ",", has_label: bool = True,
             shape: Sequence[int] | None = None, limit: int | None = None) -> Samples:
    """The samples of SINGA's CSV store: float32 values (and int labels, or zeros without
    ``has_label``); every line must have as many values. ``limit``: the first lines only."""
    lines = read_textfile(path, limit)
    if not lines:
        raise ParamError(f"CSV store '{path}' holds no records")
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for i, line in enumerate(lines):
        where = f"CSV store '{path}', line {i + 1}"
        cells = [c.strip() for c in line.split(separator)]
        try:
            label = int(cells[0]) if has_label else 0
        except ValueError:
            raise ParamError(f"{where}: the label {shown(cells[0])!r} is not an integer"
                             ) from None
        if not -(2**31) <= label < 2**31:
            raise ParamError(f"{where}: the label {label:,} does not fit SINGA's records "
                             "(labels are int32)")
        values = cells[1:] if has_label else cells
        try:
            x = np.array([float(c) for c in values], np.float32)
        except ValueError as e:
            raise ParamError(f"{where}: {e}") from None
        if xs and x.size != xs[0].size:
            raise ParamError(f"{where}: {x.size} values, but {xs[0].size} on the lines "
                             "before")
        xs.append(x)
        ys.append(label)
    x_all = np.stack(xs)
    if shape is not None:
        x_all = _reshape(x_all, shape, str(path))
    return Samples(x_all, np.asarray(ys, np.int64))


# -- mean files ------------------------------------------------------------------------------


def write_mean(path: str | os.PathLike[str], mean: np.ndarray, backend: str = "kvfile"
               ) -> Path:
    """Write a mean file: a kvfile with one record ``mean`` (v0.2.0+), a bare serialized
    record (``shard``: v0.1.0's image_mean.bin) or one CSV line (``textfile``)."""
    mean = np.asarray(mean, np.float32)
    if backend == "textfile":
        return write_textfile(path, [",".join(_number(v) for v in mean.reshape(-1))])
    value = encode_sample(mean, None)
    if backend == "kvfile":
        return write_kvfile(path, [("mean", value)])
    if backend == "shard":
        return write_atomically(path, value)
    _store_file(path, backend)
    raise AssertionError(backend)


def read_mean(path: str | os.PathLike[str], backend: str = "kvfile") -> np.ndarray:
    """The values of a mean file (see :func:`write_mean`; for ``shard``, a file whose name
    ends with ``binaryproto`` is Caffe's BlobProto, as SINGA reads it)."""
    if backend == "textfile":
        return read_csv(path, has_label=False, limit=1).x[0]
    if backend == "kvfile":
        records = read_kvfile(path, 1)
        if not records:
            raise ParamError(f"mean file '{path}' holds no records")
        x, _ = decode_sample(records[0][1], where=f"mean file '{path}'")
        return x.astype(np.float32)
    if backend == "shard":
        data = _read_bytes(Path(path), "mean file")
        if str(path).endswith("binaryproto"):
            blob = parse(CaffeBlob, data, f"mean file '{path}'")
            return np.array(blob.data, np.float32)
        x, _ = decode_sample(data, where=f"mean file '{path}'")
        return x.astype(np.float32)
    _store_file(path, backend)
    raise AssertionError(backend)


__all__ = ["BACKENDS", "KEY_FORMAT", "SHARD_FILE", "Samples", "decode_kvfile",
           "decode_sample", "encode_kvfile", "encode_sample", "kvfile_path", "read_csv",
           "read_kvfile", "read_mean", "read_records", "read_textfile", "write_csv",
           "write_kvfile", "write_mean", "write_records", "write_textfile"]
