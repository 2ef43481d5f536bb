"""Datasets for the training job: loading, a deterministic train/test split, and batches.

Sources:

* ``"digits"``: the 8×8 digits scikit-learn bundles (1,797 samples, 64 features 0..16, 10
  classes: the test set of the UCI "Optical Recognition of Handwritten Digits" data, E.
  Alpaydin and C. Kaynak, CC BY 4.0), shipped with paramserver as ``digits.npz`` beside
  this module (:data:`DIGITS_FILE`; ``DIGITS.md`` says where it comes from), so that the
  main job needs no download and no scikit-learn.
* a path to an ``.npz`` archive with a feature array (``x``) and a label array (``y``), read
  with ``allow_pickle=False`` so that loading cannot run code. When the archive also holds
  ``x_test`` and ``y_test`` these are the test split and ``test_fraction`` is not used; so
  for ``x_val`` and ``y_val``, the validation split, and ``val_fraction``.

:func:`describe_dataset` tells a dataset's layout (sample shape, type, training samples)
without reading its values: what ``paramserver check`` builds a net from.

Everything random is a pure function of a seed and a few tags (:func:`derive_rng`): the
split of a dataset, the order of each epoch, so a run is the same every time, and a worker
can compute its share of any step's batch without talking to the others.

Batching: step ``s`` of a training run reads batch ``s mod steps_per_epoch`` of epoch
``s // steps_per_epoch``; an epoch is a permutation of the training split (or its stored
order without ``shuffle``) cut into ``len(train) // batchsize`` full batches (the remainder
of each epoch is left out). That global batch is split among ``num_workers`` workers into
contiguous, disjoint shards (``numpy.array_split``: sizes differ by at most one).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ParamError
from ..paths import require_regular

DIGITS = "digits"


def derive_rng(seed: int, *tags: int | str) -> np.random.Generator:
    """A NumPy generator that depends on ``seed`` and ``tags`` only.

    The key is BLAKE2b of the seed and tags, so any int seed (negative or beyond 64 bits)
    works and different tags give independent streams.

    Args:
        seed: the job seed.
        tags: what the stream is for, e.g. ``("data", "epoch", 3)``.

    Returns:
        A Philox-based generator.
    """
    text = "/".join(str(t) for t in (int(seed), *tags))
    key = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest(),
                         "little")
    return np.random.Generator(np.random.Philox(key=key))


@dataclass(frozen=True)
class Batch:
    """One worker's share of one step's batch.

    Attributes:
        x: the features, shape ``(size,) + sample_shape`` (float, or int64 ids).
        y: the labels, int64, shape ``(size,)``.
        step: the training step (for test batches, the batch's index in the test split).
        epoch: the epoch the batch belongs to (0 for test batches).
        rank: the worker this shard is for.
        num_workers: the number of workers the global batch is split among.
        global_size: the size of the whole batch, all shards together.
    """

    x: np.ndarray
    y: np.ndarray
    step: int
    epoch: int = 0
    rank: int = 0
    num_workers: int = 1
    global_size: int = 0

    @property
    def size(self) -> int:
        return int(self.y.shape[0])


class Dataset:
    """Features and labels, split into a training, a test and a validation part (which may
    be empty). Arrays are read-only.

    Attributes:
        source: where the data came from (``"digits"`` or the file's path).
        x_train, y_train, x_test, y_test, x_val, y_val: the splits, in stored order.
        num_classes: one more than the largest label.
        sample_shape: the shape of one sample's features.
        integer_input: whether the features are integers (ids for kEmbedding).
    """

    def __init__(self, source: str, x_train: np.ndarray, y_train: np.ndarray,
                 x_test: np.ndarray, y_test: np.ndarray, x_val: np.ndarray | None = None,
                 y_val: np.ndarray | None = None):
        self.source = source
        self.x_train, self.y_train = x_train, y_train
        self.x_test, self.y_test = x_test, y_test
        if x_val is None or y_val is None:
            x_val, y_val = x_test[:0], y_test[:0]
        self.x_val, self.y_val = x_val, y_val
        for a in (x_train, y_train, x_test, y_test, x_val, y_val):
            a.setflags(write=False)
        labels = [int(y.max()) for y in (y_train, y_test, y_val) if y.size]
        self.num_classes = max(labels) + 1 if labels else 0
        self.sample_shape: tuple[int, ...] = tuple(x_train.shape[1:])
        self.integer_input = bool(np.issubdtype(x_train.dtype, np.integer))
        self._orders: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    @property
    def num_val(self) -> int:
        return int(self.y_val.shape[0])

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of the split ``"train"``, ``"test"`` or ``"val"``."""
        if name not in ("train", "test", "val"):
            raise ParamError(f"no split '{name}'; the splits are 'train', 'test' and 'val'")
        return getattr(self, f"x_{name}"), getattr(self, f"y_{name}")

    def id_range(self) -> tuple[int, int] | None:
        """``(min, max)`` of integer features over both splits (None for float features)."""
        if not self.integer_input:
            return None
        parts = [x for x in (self.x_train, self.x_test, self.x_val) if x.size]
        return (min(int(x.min()) for x in parts), max(int(x.max()) for x in parts))

    def steps_per_epoch(self, batchsize: int) -> int:
        """Full batches in one pass over the training split."""
        if batchsize < 1:
            raise ParamError(f"batchsize must be at least 1, got {batchsize}")
        return self.num_train // batchsize

    def epoch_order(self, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
        """The order of the training samples in ``epoch``: a permutation keyed by the seed."""
        if not shuffle:
            return np.arange(self.num_train)
        key = (int(seed), int(epoch))
        with self._lock:
            order = self._orders.get(key)
            if order is not None:
                self._orders.move_to_end(key)
                return order
        order = derive_rng(seed, "data", "epoch", epoch).permutation(self.num_train)
        order.setflags(write=False)
        with self._lock:
            self._orders[key] = order
            while len(self._orders) > 4:  # workers are at most a few epochs apart
                self._orders.popitem(last=False)
        return order

    def train_batch(self, step: int, batchsize: int, *, seed: int, shuffle: bool = True,
                    rank: int = 0, num_workers: int = 1) -> Batch:
        """Worker ``rank``'s shard of the global batch of ``step``.

        Args:
            step: the training step, from 0.
            batchsize: the size of the global batch (all workers together).
            seed: the job seed; it fixes the order of every epoch.
            shuffle: a new permutation each epoch; otherwise the stored order.
            rank: the worker, ``0 <= rank < num_workers``.
            num_workers: the number of workers sharing the batch.

        Returns:
            The shard; shards of the same step are disjoint and together the global batch.
        """
        if step < 0:
            raise ParamError(f"step must not be negative, got {step}")
        if num_workers < 1 or not 0 <= rank < num_workers:
            raise ParamError(f"worker rank {rank} is not in [0, {num_workers})")
        if batchsize < num_workers:
            raise ParamError(f"batchsize {batchsize} is smaller than the number of workers "
                             f"({num_workers}): some workers would get no samples")
        per_epoch = self.steps_per_epoch(batchsize)
        if per_epoch == 0:
            raise ParamError(f"batchsize {batchsize} is larger than the training split of "
                             f"{self.source} ({self.num_train} samples)")
        epoch, j = divmod(int(step), per_epoch)
        idx = self.epoch_order(epoch, seed, shuffle)[j * batchsize:(j + 1) * batchsize]
        shard = np.array_split(idx, num_workers)[rank]
        return Batch(self.x_train[shard], self.y_train[shard], int(step), epoch, rank,
                     num_workers, batchsize)

    def test_batches(self, batchsize: int, steps: int = 0) -> Iterator[Batch]:
        """The test split in stored order, ``batchsize`` at a time (the last may be smaller).

        Args:
            batchsize: samples per batch.
            steps: at most this many batches (0: the whole split).
        """
        return self.eval_batches("test", batchsize, steps)

    def eval_batches(self, split: str, batchsize: int, steps: int = 0) -> Iterator[Batch]:
        """A split (``"test"`` or ``"val"``) in stored order, ``batchsize`` at a time (the
        last batch may be smaller); at most ``steps`` batches (0: the whole split)."""
        if batchsize < 1:
            raise ParamError(f"batchsize must be at least 1, got {batchsize}")
        x, y = self.split(split)
        n = int(y.shape[0])
        count = -(-n // batchsize)
        if steps > 0:
            count = min(count, steps)
        for i in range(count):
            sl = slice(i * batchsize, min((i + 1) * batchsize, n))
            yield Batch(x[sl], y[sl], i, 0, 0, 1, sl.stop - sl.start)

    def __repr__(self) -> str:
        val = f", val={self.num_val}" if self.num_val else ""
        return (f"Dataset({self.source!r}, train={self.num_train}, test={self.num_test}{val}, "
                f"sample_shape={self.sample_shape}, classes={self.num_classes})")


# -- loading --------------------------------------------------------------------------------

_cache: OrderedDict[tuple[Any, ...], Dataset] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 4


def load_dataset(source: str, *, test_fraction: float = 0.2, split_seed: int = 0,
                 normalize: bool = True, x_key: str = "x", y_key: str = "y",
                 x_test_key: str = "x_test", y_test_key: str = "y_test",
                 dtype: Any = np.float32, base_dir: str | os.PathLike[str] | None = None,
                 val_fraction: float = 0.0, x_val_key: str = "x_val",
                 y_val_key: str = "y_val") -> Dataset:
    """Load a dataset and split it; the same arguments give the same (shared) Dataset.

    Args:
        source: ``"digits"`` or the path of an ``.npz`` file (relative to ``base_dir`` when
            given, else to the working directory).
        test_fraction: the share of samples put in the test split, in ``[0, 1)``; not used
            when the file holds its own test arrays.
        split_seed: the seed of the split.
        normalize: digits only: scale the pixel values 0..16 into [0, 1]. A file's features
            are read as stored.
        x_key, y_key: the names of the feature and label arrays in the file.
        x_test_key, y_test_key: the names of an optional test split in the file.
        val_fraction: the share of samples put in the validation split, in ``[0, 1)``
            (taken after the test split; not used when the file holds its own).
        x_val_key, y_val_key: the names of an optional validation split in the file.
        dtype: the dtype of float features (integer features stay int64, for kEmbedding).
        base_dir: the folder relative paths start from (e.g. the job file's).

    Raises:
        ParamError: naming the file and what is wrong with it.
    """
    _check_fractions(test_fraction, val_fraction)
    dt = np.dtype(dtype)
    options = (float(test_fraction), int(split_seed), bool(normalize), x_key, y_key,
               x_test_key, y_test_key, dt.str, float(val_fraction), x_val_key, y_val_key)
    path, ident = _source_file(source, base_dir)
    key = (*ident, *options)
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None:
            _cache.move_to_end(key)
            return cached
    if path is None:
        x, y = _load_digits(normalize)
        x_test = y_test = x_val = y_val = None
        name = DIGITS
    else:
        x, y, (x_test, y_test), (x_val, y_val) = _load_npz(
            path, x_key, y_key, (x_test_key, y_test_key), (x_val_key, y_val_key))
        name = str(path)

    def typed(a: np.ndarray) -> np.ndarray:
        return a if np.issubdtype(a.dtype, np.integer) else a.astype(dt)

    x = typed(x)
    given_test = x_test is not None and y_test is not None
    given_val = x_val is not None and y_val is not None
    train, test, val = _split3(len(y), 0.0 if given_test else test_fraction, split_seed,
                               0.0 if given_val else val_fraction)
    if train.size == 0:
        raise ParamError(f"{name}: test_fraction {test_fraction:g} and val_fraction "
                         f"{val_fraction:g} leave no training samples of {len(y)}")
    tx, ty = ((typed(x_test), y_test) if x_test is not None and y_test is not None
              else (x[test], y[test]))
    vx, vy = ((typed(x_val), y_val) if x_val is not None and y_val is not None
              else (x[val], y[val]))
    dataset = Dataset(name, x[train], y[train], tx, ty, vx, vy)
    with _cache_lock:
        _cache[key] = dataset
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return dataset


@dataclass(frozen=True)
class DataLayout:
    """What a dataset holds, told without reading its values (``paramserver check``).

    Attributes:
        source: ``"digits"`` or the file's path.
        sample_shape: the shape of one sample's features.
        integer_input: whether the features are integers (ids for kEmbedding).
        num_train: the samples of the training split.
        num_classes: one more than the largest label, where known without the labels
            (the digits' 10), else None.
    """

    source: str
    sample_shape: tuple[int, ...]
    integer_input: bool
    num_train: int
    num_classes: int | None


def describe_dataset(source: str, *, test_fraction: float = 0.2, x_key: str = "x",
                     y_key: str = "y", x_test_key: str = "x_test", y_test_key: str = "y_test",
                     base_dir: str | os.PathLike[str] | None = None,
                     val_fraction: float = 0.0, x_val_key: str = "x_val",
                     y_val_key: str = "y_val") -> DataLayout:
    """The layout of the dataset :func:`load_dataset` would load with these arguments, read
    without its values: the digits' are known, an ``.npz`` file's come from the headers of
    its arrays (names, shapes, types: the checks of :func:`load_dataset` that need no values).

    Raises:
        ParamError: naming the file and what is wrong with it.
    """
    _check_fractions(test_fraction, val_fraction)
    path, _ = _source_file(source, base_dir)
    if path is None:
        n = DIGITS_SAMPLES
        shape: tuple[int, ...] = (DIGITS_FEATURES,)
        integer, classes, given = False, DIGITS_CLASSES, (False, False)
    else:
        x, _, (x_test, _), (x_val, _) = _load_npz(
            path, x_key, y_key, (x_test_key, y_test_key), (x_val_key, y_val_key), read=False)
        n, shape = x.shape[0], tuple(x.shape[1:])
        integer, classes = bool(np.issubdtype(x.dtype, np.integer)), None
        given = (x_test is not None, x_val is not None)
    n_test, n_val = (0 if given[0] else _split_size(n, test_fraction),
                     0 if given[1] else _split_size(n, val_fraction))
    if n - n_test - n_val <= 0:
        raise ParamError(f"{path or DIGITS}: test_fraction {test_fraction:g} and val_fraction "
                         f"{val_fraction:g} leave no training samples of {n}")
    return DataLayout(str(path or DIGITS), shape, integer, n - n_test - n_val, classes)


def _check_fractions(test_fraction: float, val_fraction: float) -> None:
    if not 0.0 <= test_fraction < 1.0:
        raise ParamError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if not 0.0 <= val_fraction < 1.0 or test_fraction + val_fraction >= 1.0:
        raise ParamError(f"val_fraction must be in [0, 1) and leave training samples with "
                         f"test_fraction {test_fraction:g}, got {val_fraction}")


def _source_file(source: str, base_dir: str | os.PathLike[str] | None
                 ) -> tuple[Path | None, tuple[Any, ...]]:
    """The file of ``source`` (None for the digits), checked to be there, and what
    identifies its contents (for the cache of loaded datasets)."""
    if source == DIGITS:
        return None, (DIGITS,)
    path = Path(source)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    try:
        st = require_regular(path, "data file")  # a pipe or a device is not read
    except ParamError:
        if os.path.isdir(path):  # False, not an error, for a name too long to look up
            raise ParamError(f"data file '{path}' is a folder, not an .npz file") from None
        raise
    if st is None:
        raise ParamError(f"data file '{path}' does not exist")
    return path, (str(path.resolve()), st.st_mtime_ns, st.st_size)


def split_indices(n: int, test_fraction: float, seed: int, val_fraction: float = 0.0
                  ) -> Any:
    """Indices of the training and the test split (and, with ``val_fraction``, of the
    validation split), each sorted; chosen at random by ``seed``.

    The test split has ``round(n * test_fraction)`` samples (at least one when the fraction
    is above 0 and there are at least two samples); the validation split, taken next, as
    many for ``val_fraction``. Returns ``(train, test)``, or ``(train, test, val)`` when
    ``val_fraction`` is given (the test split is the same with or without it).
    """
    train, test, val = _split3(n, test_fraction, seed, val_fraction)
    return (train, test) if not val_fraction else (train, test, val)


def _split_size(n: int, fraction: float) -> int:
    """The samples of ``n`` that a split of ``fraction`` takes (at least one of two)."""
    k = round(n * fraction)
    return 1 if fraction > 0 and k == 0 and n > 1 else k


def _split3(n: int, test_fraction: float, seed: int, val_fraction: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_test, n_val = _split_size(n, test_fraction), _split_size(n, val_fraction)
    perm = derive_rng(seed, "data", "split").permutation(n)
    test, val = np.sort(perm[:n_test]), np.sort(perm[n_test:n_test + n_val])
    return np.sort(perm[n_test + n_val:]), test, val


#: The digits: samples, features and classes (a fixed dataset, shipped with paramserver).
DIGITS_SAMPLES, DIGITS_FEATURES, DIGITS_CLASSES = 1797, 64, 10
#: The digits, as scikit-learn's ``load_digits`` gives them (uint8 ``x`` and ``y``).
DIGITS_FILE = Path(__file__).with_name("digits.npz")


def _load_digits(normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(DIGITS_FILE, allow_pickle=False) as f:
            x, y = f["x"], f["y"]
    except (OSError, KeyError, ValueError) as e:
        raise ParamError(f"the data source 'digits' cannot be read from {DIGITS_FILE} "
                         f"(reinstall paramserver): {e}") from None
    x = np.asarray(x, np.float64)
    if normalize:
        x = x / 16.0
    return x, np.asarray(y, np.int64)


Pair = tuple[np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True)
class _Header:
    """An array of an ``.npz`` file as its header tells it: shape and type, no values."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _read_header(archive: Any, key: str) -> _Header:
    """The header of array ``key`` of an open ``.npz`` archive (its values not read)."""
    from numpy.lib import format as npy

    with archive.zip.open(f"{key}.npy") as f:
        version = npy.read_magic(f)
        read = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(
            version)
        if read is None:  # a later version: numpy's own reader of any version
            shape, _, dtype = npy._read_array_header(f, version)  # type: ignore[attr-defined]
        else:
            shape, _, dtype = read(f)
    return _Header(tuple(int(d) for d in shape), np.dtype(dtype))


def _load_npz(path: Path, x_key: str, y_key: str, *splits: tuple[str, str],
              read: bool = True) -> tuple[Any, ...]:
    """``x, y`` and, for each ``(x_key, y_key)`` of ``splits``, that pair of arrays (or
    ``(None, None)`` when the file does not hold it), checked; without ``read``, their
    headers (:class:`_Header`), checked as far as shapes and types go."""
    where = f"data file '{path}'"
    try:
        archive = np.load(path, allow_pickle=False)
    # zipfile and numpy raise many types for damaged bytes (BadZipFile, OSError, ValueError,
    # NotImplementedError for an unknown zip version, ...): all mean unreadable.
    except Exception as e:
        raise ParamError(f"{where} cannot be read as an .npz file: {type(e).__name__}: {e}"
                         ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ParamError(f"{where} holds a single array (.npy); expected an .npz archive "
                         f"with arrays '{x_key}' and '{y_key}' (numpy.savez)")
    with archive:
        names = list(archive.files)

        def get(key: str) -> Any:
            _check_member(archive, key, where)  # its size, before numpy allocates it
            try:
                if not read:
                    return _read_header(archive, key)
                return np.asarray(archive[key])
            except ValueError as e:
                if "allow_pickle" in str(e):
                    raise ParamError(f"{where}: array '{key}' holds Python objects, which "
                                     "are not read (allow_pickle=False)") from None
                raise ParamError(f"{where}: array '{key}' cannot be read: {e}") from None
            # zipfile, zlib and numpy's header parser raise many types for damaged bytes
            # (BadZipFile, zlib.error, EOFError, OSError, ...): all mean unreadable.
            except Exception as e:
                raise ParamError(f"{where}: array '{key}' cannot be read: "
                                 f"{type(e).__name__}: {e}") from None

        missing = [k for k in (x_key, y_key) if k not in names]
        if missing:
            raise ParamError(f"{where} has no array {' or '.join(repr(k) for k in missing)}; "
                             f"it holds: {', '.join(repr(k) for k in names) or 'nothing'}")
        x, y = _check_xy(where, get(x_key), get(y_key), x_key, y_key)
        out: list[Pair] = []
        for x_test_key, y_test_key in splits:
            has = [k in names for k in (x_test_key, y_test_key)]
            if any(has) and not all(has):
                given, absent = ((x_test_key, y_test_key) if has[0]
                                 else (y_test_key, x_test_key))
                raise ParamError(f"{where} has '{given}' but no '{absent}'")
            if not all(has):
                out.append((None, None))
                continue
            x_test, y_test = _check_xy(where, get(x_test_key), get(y_test_key), x_test_key,
                                       y_test_key)
            if x_test.shape[1:] != x.shape[1:]:
                raise ParamError(f"{where}: samples of '{x_test_key}' have shape "
                                 f"{x_test.shape[1:]} but those of '{x_key}' {x.shape[1:]}")
            if np.issubdtype(x.dtype, np.integer) != np.issubdtype(x_test.dtype, np.integer):
                raise ParamError(f"{where}: '{x_key}' and '{x_test_key}' must both be "
                                 "integers or both be numbers with a fraction")
            out.append((x_test, y_test))
        return (x, y, *out)


#: The largest ratio of a member's size to its compressed size (deflate's limit, 1032:1).
_DEFLATE_RATIO = 1032


def _check_member(archive: Any, key: str, where: str) -> None:
    """Refuse an array of an .npz whose header declares more data than the archive holds
    (numpy allocates what the header says before it reads a byte), or more than this
    machine's memory."""
    from ..params import physical_memory

    name = f"{key}.npy"
    try:
        info = archive.zip.getinfo(name)
        with archive.zip.open(name) as f:
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(f))
            header = f.tell()
    except Exception as e:  # damaged bytes, as in get()
        raise ParamError(f"{where}: array '{key}' cannot be read: {type(e).__name__}: "
                         f"{e}") from None
    if dtype.hasobject:
        return  # refused by numpy itself (allow_pickle=False)
    need = math.prod(shape) * dtype.itemsize
    have = info.file_size - header
    most = info.compress_size * _DEFLATE_RATIO if info.compress_type else info.compress_size
    memory = physical_memory()
    if need != have or info.file_size > most + header:
        raise ParamError(f"{where}: array '{key}' is damaged (its header says {need:,} bytes "
                         f"of {dtype} {shape}, the archive holds {have:,})")
    if memory is not None and need > memory:
        raise ParamError(f"{where}: array '{key}' holds {need:,} bytes, more than this "
                         f"machine's memory ({memory:,} bytes)")


def _check_xy(where: str, x: Any, y: Any, x_key: str, y_key: str) -> tuple[Any, Any]:
    """Features and labels, checked: samples along axis 0, labels non-negative integers.
    Headers (:class:`_Header`) are checked as far as shapes and types go."""
    values = isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
    if x.dtype == np.bool_:
        x = x.astype(np.float64) if values else _Header(x.shape, np.dtype(np.float64))
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise ParamError(f"{where}: '{x_key}' must hold numbers, not {x.dtype}")
    if x.ndim < 1 or x.shape[0] == 0:
        raise ParamError(f"{where}: '{x_key}' has no samples (shape {x.shape})")
    if values and np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ParamError(f"{where}: '{x_key}' holds NaN or infinite values")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0] if values else _Header(y.shape[:1], y.dtype)
    if y.ndim != 1:
        raise ParamError(f"{where}: '{y_key}' must be 1-D (one class label per sample), "
                         f"not of shape {y.shape}")
    if y.shape[0] != x.shape[0]:
        raise ParamError(f"{where}: '{x_key}' has {x.shape[0]} samples but '{y_key}' "
                         f"{y.shape[0]} labels")
    if np.issubdtype(y.dtype, np.floating):
        if values and not (np.isfinite(y).all() and (y == np.round(y)).all()):
            raise ParamError(f"{where}: '{y_key}' must hold whole class labels 0, 1, 2, ...")
    elif not np.issubdtype(y.dtype, np.integer):
        raise ParamError(f"{where}: '{y_key}' must hold integer class labels, not {y.dtype}")
    if not values:
        return x, y
    if y.size and y.min() < 0:
        raise ParamError(f"{where}: '{y_key}' holds a negative label ({y.min():g}); labels "
                         "are 0, 1, 2, ...")
    x = x.astype(np.int64) if np.issubdtype(x.dtype, np.integer) else x
    return x, y.astype(np.int64)


def clear_cache() -> None:
    """Forget the datasets loaded so far (they are kept for workers that load the same)."""
    with _cache_lock:
        _cache.clear()


__all__ = ["DIGITS", "Batch", "DataLayout", "Dataset", "clear_cache", "derive_rng",
           "describe_dataset", "load_dataset", "split_indices"]
