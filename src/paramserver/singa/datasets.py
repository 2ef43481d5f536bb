"""``paramserver data``: datasets written in SINGA's store formats.

SINGA's examples read their data from files that SINGA's own tools made (``create_data``,
``create_shard``) from MNIST or CIFAR-10 downloads. This command makes such files from data
at hand — the 8×8 digits shipped with paramserver or an ``.npz`` archive — at the path and in the
format a job file names, so that the job can run as written:

    paramserver data digits examples/mnist/train_data.bin --shape 28,28
    paramserver data digits examples/mnist/test_data.bin --shape 28,28 --split test
    paramserver data digits examples/cifar10/train_data.bin --shape 3,32,32 \\
        --mean examples/cifar10/image_mean.bin
    paramserver data digits examples/mnist/mnist_train_shard --format shard --shape 28,28

The splits are the ones the ``kData`` layer makes of the same source with the same seed and
fractions (:func:`paramserver.train.data.load_dataset`). Images are resampled to ``--shape``
(bilinear; a grey image becomes every channel of a colour one). ``pixel`` records hold bytes
0..255, as SINGA's MNIST and CIFAR-10 records do (the digits' values 0..16 are scaled by
255/16 unless ``--scale`` says otherwise); ``float`` records hold float32 data.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ParamError
from ..paths import refuse_inputs, shown
from . import stores

FORMATS = {"kvfile": "kvfile", "shard": "shard", "csv": "textfile", "textfile": "textfile",
           "text": "text", "words": "words", "wordshard": "wordshard"}
#: The formats of texts (the others hold samples).
TEXT_FORMATS = ("text", "words", "wordshard")
SPLITS = ("train", "test", "val", "all")
#: The digits' pixel values are 0..16; pixel records hold 0..255.
DIGITS_SCALE = 255.0 / 16.0
#: The largest label and dimension a SINGA record holds (``int32`` fields of RecordProto).
INT32_MAX = 2**31 - 1
#: The largest record: protocol buffers refuse messages of 2 GiB or more (a margin kept for
#: the record's other fields).
MAX_RECORD_BYTES = 2**31 - 2**20


@dataclass(frozen=True)
class Written:
    """What :func:`write_dataset` wrote."""

    path: Path
    count: int
    shape: tuple[int, ...]
    encoding: str
    backend: str
    mean_path: Path | None


def write_dataset(source: str, output: str | Path, *, fmt: str = "kvfile",
                  split: str = "train", test_fraction: float = 0.2, val_fraction: float = 0.0,
                  seed: int = 0, shape: tuple[int, ...] | None = None,
                  encoding: str = "pixel", scale: float | None = None,
                  mean: str | Path | None = None, x_key: str = "x", y_key: str = "y",
                  separator: str = ",") -> Written:
    """Write one split of ``source`` as a SINGA store; see the module docstring.

    Args:
        source: ``"digits"`` or the path of an ``.npz`` file (arrays ``x_key``, ``y_key``).
        output: the store's path (a file; a folder for ``shard``).
        fmt: ``kvfile`` (v0.2.0+), ``shard`` (v0.1.0's DataShard) or ``csv``.
        split: ``train``, ``test``, ``val`` or ``all`` (every sample, in stored order).
        test_fraction, val_fraction, seed: the split, as data_conf makes it.
        shape: each sample's shape in the store (resampled); default the source's.
        encoding: ``pixel`` (bytes 0..255) or ``float`` (float32 data); csv is float.
        scale: multiplies the values first (default 255/16 for digits as pixels, else 1).
        mean: also write the mean of the written samples to this path, in the matching
            mean-file format.
        x_key, y_key: the arrays of an ``.npz`` source.
        separator: the CSV separator.

    Raises:
        ParamError: an unknown format, split or encoding, a source that cannot be read, a
            shape the samples cannot be resampled to, pixel values outside 0..255.
    """
    from ..train.data import DIGITS, load_dataset

    backend = FORMATS.get(fmt)
    if backend in TEXT_FORMATS:
        raise ParamError(f"--format {fmt} writes text (write_text), not samples")
    if backend is None:
        raise ParamError(f"Invalid Input: '{fmt}', valid values are: "
                         + "{" + ", ".join(repr(f) for f in FORMATS) + "}")
    if split not in SPLITS:
        raise ParamError(f"Invalid Input: '{split}', valid values are: "
                         + "{" + ", ".join(repr(s) for s in SPLITS) + "}")
    if encoding not in ("pixel", "float"):
        raise ParamError(f"Invalid Input: '{encoding}', valid values are: {{'float', 'pixel'}}")
    if backend == "textfile":
        encoding = "float"
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ParamError(f"--scale {scale:g}: the values' factor must be a finite number above "
                         "0")
    if seed < 0:
        raise ParamError(f"--seed {seed}: the seed of the split must be at least 0")
    _check_paths(source, output, backend, mean)
    if shape is not None:
        check_shape(shape, encoding)
    every = split == "all"  # no split: the training "split" is every sample, in order
    ds = load_dataset(source, test_fraction=0.0 if every else test_fraction, split_seed=seed,
                      normalize=False, x_key=x_key, y_key=y_key, dtype=np.float64,
                      val_fraction=0.0 if every else val_fraction)
    x, y = ds.split("train" if every else split)
    if len(y) == 0:
        raise ParamError(f"the {split} split of {ds.source} is empty (test_fraction "
                         f"{test_fraction:g}, val_fraction {val_fraction:g})")
    if len(y) and int(np.max(y)) > INT32_MAX:
        raise ParamError(f"{ds.source}: the label {int(np.max(y)):,} does not fit SINGA's "
                         f"records (labels are int32: at most {INT32_MAX:,})")
    images = _images(np.asarray(x, np.float64), source == DIGITS)
    target = tuple(shape) if shape else images.shape[1:]
    _check_memory(len(y), images.shape[1:], target)
    out = resample(images, target)
    if scale is None:
        scale = DIGITS_SCALE if source == DIGITS and encoding == "pixel" else 1.0
    out = out * scale
    if encoding == "pixel":
        values = np.rint(out)
        if values.size and (values.min() < 0 or values.max() > 255):
            raise ParamError(f"pixel values must be 0..255, these are {values.min():g}.."
                             f"{values.max():g} (after --scale {scale:g}); use --encoding "
                             "float, or another --scale")
        data = values.astype(np.uint8)
    else:
        data = out.astype(np.float32)
    samples = stores.Samples(data, np.asarray(y, np.int64))
    if backend == "textfile":
        stores.write_csv(output, samples, separator)
    else:
        stores.write_records(output, samples, backend)
    mean_path = None
    if mean is not None:
        mean_path = stores.write_mean(mean, data.astype(np.float64).mean(axis=0), backend)
    return Written(Path(output), len(y), data.shape[1:], encoding, backend, mean_path)


def _check_paths(source: str, output: str | Path, backend: str, mean: str | Path | None
                 ) -> None:
    """Refuse an empty output path, and outputs that are the source or each other."""
    if not str(output):
        raise ParamError("the output path is empty: give the store's file (a folder for "
                         "--format shard)")
    store = Path(output) / stores.SHARD_FILE if backend == "shard" else Path(output)
    from ..train.data import DIGITS

    refuse_inputs([("the output", store), ("--mean", mean)],
                  [("the source", None if source == DIGITS else source)])


def check_shape(shape: tuple[int, ...], encoding: str = "float") -> None:
    """Refuse a sample shape SINGA's records cannot hold: a dimension below 1 or beyond
    int32, or a sample of 2 GiB or more (a protocol buffer's limit)."""
    text = _text(shape)
    if any(d < 1 for d in shape):
        raise ParamError(f"--shape {shown(text)}: every dimension must be at least 1")
    if any(d > INT32_MAX for d in shape):
        raise ParamError(f"--shape {shown(text)}: a dimension is at most {INT32_MAX:,} (SINGA's "
                         "records hold shapes as int32)")
    size = math.prod(shape)
    per = 1 if encoding == "pixel" else 4
    if size * per > MAX_RECORD_BYTES:
        raise ParamError(f"--shape {shown(text)}: a sample of {size:,} values takes "
                         f"{size * per / 2**30:,.1f} GiB; a SINGA record (a protocol buffer) "
                         "holds less than 2 GiB")


def _check_memory(count: int, source: tuple[int, ...], target: tuple[int, ...]) -> None:
    """Refuse samples whose resampling would not fit in this machine's memory: it holds
    the samples in float64, before and after, and one more copy on the way."""
    from ..params import physical_memory

    need = 8 * count * (math.prod(source) + 2 * math.prod(target))
    have = physical_memory()
    if have is not None and need > have:
        raise ParamError(f"--shape {shown(_text(target))}: {count:,} samples of that shape "
                         f"need about {need / 2**30:,.1f} GiB of memory to make; this machine "
                         f"has {have / 2**30:,.1f} GiB")


def _images(x: np.ndarray, digits: bool) -> np.ndarray:
    """Samples as images ``(n, H, W)`` or ``(n, C, H, W)`` where their shape tells; flat
    samples of a square size are square grey images (the digits are 8x8)."""
    if x.ndim == 2:
        side = math.isqrt(x.shape[1])
        if side * side == x.shape[1] or digits:
            return x.reshape(x.shape[0], side, side)
    return x


def resample(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Samples ``x`` (``(n, *s)``) in ``shape``: reshaped when the sizes agree and no image
    needs resizing, else resized bilinearly (pixel centres aligned, as image libraries do);
    a grey image ``(H, W)`` becomes each channel of ``(C, H, W)``."""
    src = x.shape[1:]
    if any(d < 1 for d in shape):
        raise ParamError(f"--shape {shown(_text(shape))}: every dimension must be at least 1")
    if src == shape:
        return x
    size = int(np.prod(shape, dtype=np.int64))
    if len(shape) == 1:
        if size == int(np.prod(src, dtype=np.int64)):
            return x.reshape(x.shape[0], size)
        side = math.isqrt(size)
        if side * side != size or len(src) != 2:
            raise ParamError(f"--shape {_text(shape)}: samples of shape {_text(src)} cannot "
                             "be made flat samples of that size (a square image can)")
        return resample(x, (side, side)).reshape(x.shape[0], size)
    if len(shape) not in (2, 3) or len(src) not in (2, 3):
        raise ParamError(f"--shape {_text(shape)}: samples of shape {_text(src)} are not "
                         "images (H,W) or (C,H,W) to resize")
    if len(shape) == 2 and len(src) == 3:
        raise ParamError(f"--shape {_text(shape)}: {src[0]}-channel images cannot be made "
                         "grey; give the channels (C,H,W)")
    if len(shape) == 3 and len(src) == 3 and src[0] != shape[0]:
        raise ParamError(f"--shape {_text(shape)}: the images have {src[0]} channels, not "
                         f"{shape[0]}")
    rows = _weights(src[-2], shape[-2])
    cols = _weights(src[-1], shape[-1])
    out = np.einsum("ih,...hw,jw->...ij", rows, x, cols)
    if len(shape) == 3 and len(src) == 2:
        out = np.repeat(out[:, None], shape[0], axis=1)
    return out


def _weights(n_in: int, n_out: int) -> np.ndarray:
    """The ``(n_out, n_in)`` matrix of bilinear interpolation along one axis."""
    pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = pos - lo
    w = np.zeros((n_out, n_in))
    w[np.arange(n_out), lo] += 1 - frac
    w[np.arange(n_out), hi] += frac
    return w


def _text(shape: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in shape)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"28,28"`` or ``"3x32x32"`` as a shape (for the command line)."""
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a shape such as 28,28 or "
                                         "3,32,32") from None
    if not shape:
        raise argparse.ArgumentTypeError("a shape needs at least one dimension")
    return shape


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``paramserver data``."""
    p.add_argument("source", help="'digits' (the 8x8 digits shipped with paramserver) or an "
                   ".npz file with arrays x and y; for --format text and words, 'pydoc' "
                   "(Python's bundled help text) or a text file")
    p.add_argument("output", help="the store to write (a folder for --format shard)")
    p.add_argument("--format", dest="fmt", default="kvfile", choices=list(FORMATS),
                   help="kvfile (SINGA v0.2+, kRecordInput), shard (v0.1's DataShard, "
                   "kShardData), csv (kCSVInput), text (kCharRNN), words (the rnnlm "
                   "example's WordRecords) or wordshard (v0.1's rnnlm: a DataShard of "
                   "them); default kvfile")
    p.add_argument("--split", default="train", choices=SPLITS,
                   help="which samples (the split kData makes; default train)")
    p.add_argument("--test-fraction", type=float, default=0.2, help="default 0.2")
    p.add_argument("--val-fraction", type=float, default=0.0, help="default 0")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    p.add_argument("--shape", type=parse_shape, help="each sample's shape, e.g. 28,28 or "
                   "3,32,32 (resampled; default the source's)")
    p.add_argument("--encoding", choices=("pixel", "float"), default="pixel",
                   help="pixel bytes 0..255 (default) or float32 data")
    p.add_argument("--scale", type=float, help="multiply the values first (default 255/16 "
                   "for digits as pixels, else 1)")
    p.add_argument("--mean", help="also write the mean of the samples here (a mean_file)")
    p.add_argument("--x-key", default="x", help="the features of an .npz (default x)")
    p.add_argument("--y-key", default="y", help="the labels of an .npz (default y)")
    p.add_argument("--separator", default=",", help="CSV separator (default ',')")
    p.add_argument("--vocab", help="--format text: also write the vocabulary file here")
    p.add_argument("--vocab-size", type=int, help="--format text: keep the N most frequent "
                   "characters; words: the N-1 most frequent words and <unk>")
    p.add_argument("--classes", type=int, default=100,
                   help="--format words: word classes (default 100)")


def write_text(source: str, output: str | Path, *, fmt: str = "text", split: str = "train",
               test_fraction: float = 0.2, val_fraction: float = 0.0,
               vocab: str | Path | None = None, vocab_size: int | None = None,
               classes: int = 100) -> Any:
    """Write one split of a text for char-rnn (``text``) or rnnlm (``words``); see
    :mod:`paramserver.singa.text`."""
    from . import text

    if split not in SPLITS:
        raise ParamError(f"Invalid Input: '{split}', valid values are: "
                         + "{" + ", ".join(repr(s) for s in SPLITS) + "}")
    if not str(output):
        raise ParamError("the output path is empty: give the file to write")
    refuse_inputs([("the output", output), ("--vocab", vocab)],
                  [("the source", None if source == text.PYDOC else source)])
    whole = text.load_text(source)
    part = text.split_lines(whole, split, test_fraction, val_fraction)
    train = text.split_lines(whole, "train", test_fraction, val_fraction)
    if fmt == "text":
        return text.write_chars(part, train, output, vocab, vocab_size)
    return text.write_words(part, train, output, classes, vocab_size,
                            shard=fmt == "wordshard")


def run(args: argparse.Namespace) -> int:
    """``paramserver data``: write the store and say what was written."""
    if FORMATS.get(args.fmt) in TEXT_FORMATS:
        t = write_text(args.source, args.output, fmt=args.fmt, split=args.split,
                       test_fraction=args.test_fraction, val_fraction=args.val_fraction,
                       vocab=args.vocab, vocab_size=args.vocab_size, classes=args.classes)
        what = "characters" if args.fmt == "text" else "word records"
        print(f"{t.path}: {t.count} {what} ({t.vocab} in the vocabulary; the {args.split} "
              f"split of {args.source})")
        if t.vocab_path is not None:
            print(f"{t.vocab_path}: the vocabulary")
        return 0
    w = write_dataset(args.source, args.output, fmt=args.fmt, split=args.split,
                      test_fraction=args.test_fraction, val_fraction=args.val_fraction,
                      seed=args.seed, shape=args.shape, encoding=args.encoding,
                      scale=args.scale, mean=args.mean, x_key=args.x_key, y_key=args.y_key,
                      separator=args.separator)
    kind = "CSV lines" if w.backend == "textfile" else f"{w.encoding} records"
    print(f"{w.path}: {w.count} {kind} of shape {_text(w.shape)} ({w.backend}; the {args.split}"
          f" split of {args.source})")
    if w.mean_path is not None:
        print(f"{w.mean_path}: their mean")
    return 0


__all__ = ["FORMATS", "SPLITS", "TEXT_FORMATS", "Written", "add_arguments", "resample", "run",
           "write_dataset", "write_text"]
