"""Input layers: they read no srclayers and give each step's batch (and its labels).

Every input layer answers the same questions, so the net and the trainer drive all of them
alike: :meth:`InputLayer.batch` (worker ``rank``'s share of a step's batch, a pure function
of the seed and the step, so a resumed run reads what a straight one would),
:meth:`InputLayer.feed` and :meth:`InputLayer.eval_batches` (the batches a test or a
validation reads). Data files are read whole when the net is built for a run, so that a
missing or malformed file is reported before training starts; a net built to be checked
(``read_data`` False: ``paramserver check`` without ``--data``) reads no data, only what
tells the samples' shape (an ``.npz`` file's array headers, a store's first record).

* ``kData`` (paramserver's): the 8x8 digits (shipped with paramserver) or an ``.npz`` file,
  shuffled each epoch.
* SINGA's stores: ``kRecordInput`` (kvfile of records), ``kCSVInput`` (textfile),
  ``kShardData`` (v0.1.0's DataShard). As SINGA's, they read their records in stored order
  after a random skip, and wrap around; relative paths start at the working folder.
* v0.1.0's parser layers on a kShardData: ``kMnist``, ``kRGBImage``, ``kLabel``; and
  ``kImagePreprocess`` (crop, mirror, scale).
* the char-rnn example's: ``kCharRNN`` (a text file as character ids), ``kOneHot``,
  ``kRNNLabel``, and ``kRNNDummy`` (the input of a sampling net).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...config import ParamError, Parameter, field
from ...config.job import LayerConf
from ...paths import require_regular
from ...singa.confs import (
    CharRNNConf,
    MnistConf,
    OnehotConf,
    RGBImageConf,
    RNNDummyConf,
    ShardConf,
    StoreConf,
)
from ..data import Batch, DataLayout, Dataset, derive_rng, describe_dataset, load_dataset
from .base import Layer, as_tensor, register_layer, require_torch, shape_text, torch_dtype


class InputLayer(Layer):
    """Base of the layers that feed batches; see the module docstring.

    Attributes:
        labels: the labels of the fed batch (int64), for loss layers.
    """

    min_srcs = 0
    max_srcs = 0
    gives_labels = True

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self._fed = False

    @property
    def batchsize(self) -> int:
        """Samples per step, all workers together."""
        raise NotImplementedError

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        """Worker ``rank``'s shard of step ``step``'s batch (disjoint across ranks)."""
        raise NotImplementedError

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        """The batches a net of ``phase`` (``"test"`` or ``"val"``) evaluates on, at most
        ``steps`` (0: all)."""
        raise NotImplementedError

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        """How many batches :meth:`eval_batches` gives."""
        raise NotImplementedError

    def eval_pass(self, phase: str, index: int, batchsize: int | None = None, steps: int = 0
                  ) -> Iterator[Batch]:
        """The batches the ``index``-th evaluation of ``phase`` in a run (from 0) reads.
        Here those of :meth:`eval_batches`, every time (paramserver's ``kData``: the whole
        split, or its first ``steps`` batches); SINGA's stores and ``kCharRNN`` read on
        from where the evaluation before stopped, as SINGA's test and validation layers
        did (their reader is kept from one test to the next)."""
        return self.eval_batches(phase, batchsize, steps)

    def num_classes(self) -> int | None:
        """One more than the largest label of the data (None when not known ahead)."""
        return None

    def id_range(self) -> tuple[int, int] | None:
        """``(min, max)`` of integer features (ids), when the data holds ids."""
        return None

    @property
    def steps_per_epoch(self) -> int:
        """Steps in one pass over the training data."""
        return 1

    def feed(self, batch: Batch) -> None:
        """Make ``batch`` the output of the next :meth:`forward`."""
        x = np.asarray(batch.x)
        if tuple(x.shape[1:]) != self.out_shape:
            raise self.error(f"fed samples of shape {shape_text(x.shape[1:])}, the data's "
                             f"are {shape_text(self.out_shape)}")
        if x.shape[0] != np.shape(batch.y)[0]:
            raise self.error(f"fed {x.shape[0]} samples with {np.shape(batch.y)[0]} labels")
        self.set_output(self.transform(x), np.asarray(batch.y, np.int64))

    def transform(self, x: np.ndarray) -> np.ndarray:
        """A batch's samples as the layer gives them (normalised, ...)."""
        return x if self.int_output else np.asarray(x, dtype=self.dtype)

    def set_output(self, x: Any, y: Any) -> None:
        data = as_tensor(x)
        labels = as_tensor(y)
        if self.device is not None:
            data, labels = data.to(self.device), labels.to(self.device)
        self.data, self.labels = data, labels
        self._fed = True

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        if not self._fed:
            raise self.error("has no batch; the net feeds one before forward()")


def _problems_at(layer: Layer, error: ParamError) -> ParamError:
    return ParamError([f"layer '{layer.name}' ({layer.type}): {p}" for p in error.problems])


# -- kData ----------------------------------------------------------------------------------


class DataConf(Parameter):
    """The data layer's ``data_conf``."""

    source: str = field("digits", path=True,
                        doc="'digits' (scikit-learn's 8x8 digits, shipped with "
                            "paramserver) or the path of an .npz file.")
    batchsize: int = field(64, lower=1, aliases=("batch_size",),
                           doc="Samples per step, all workers together.")
    test_fraction: float = field(0.2, lower=0.0, upper=1.0,
                                 doc="Share of the samples held out for tests, below 1 (not "
                                     "used when the file holds x_test and y_test).")
    val_fraction: float = field(0.0, lower=0.0, upper=1.0,
                                doc="Share of the samples held out for validation "
                                    "(validate_freq), below 1 with test_fraction (not used "
                                    "when the file holds x_val and y_val).")
    split_seed: int | None = field(None, doc="Seed of the train/test split; None: the job "
                                             "seed.")
    shuffle: bool = field(True, doc="A new order of the training samples every epoch.")
    normalize: bool = field(True, doc="digits: scale pixel values into [0, 1]. Files are "
                                      "read as stored.")
    x_key: str = field("x", doc="Name of the feature array in the .npz file.")
    y_key: str = field("y", doc="Name of the label array in the .npz file.")
    x_test_key: str = field("x_test", doc="Name of an optional test feature array.")
    y_test_key: str = field("y_test", doc="Name of an optional test label array.")
    x_val_key: str = field("x_val", doc="Name of an optional validation feature array.")
    y_val_key: str = field("y_val", doc="Name of an optional validation label array.")

    def check(self) -> list[str]:
        if not self.test_fraction < 1.0:
            return [f"test_fraction must be below 1, got {self.test_fraction:g}"]
        if not self.test_fraction + self.val_fraction < 1.0:
            return [f"test_fraction and val_fraction must leave training samples (sum below "
                    f"1), got {self.test_fraction:g} + {self.val_fraction:g}"]
        return []


@register_layer("kData", aliases=("input",))
class DataLayer(InputLayer):
    """Feeds batches of a dataset (paramserver's own input layer): ``data`` is the
    features, ``labels`` the class labels; each epoch in a new order."""

    Config = DataConf

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self._dataset: Dataset | None = None
        self._layout: DataLayout | None = None

    def setup(self) -> None:
        super().setup()
        c = self.own
        where = dict(test_fraction=c.test_fraction, x_key=c.x_key, y_key=c.y_key,
                     x_test_key=c.x_test_key, y_test_key=c.y_test_key, base_dir=self.base_dir,
                     val_fraction=c.val_fraction, x_val_key=c.x_val_key, y_val_key=c.y_val_key)
        try:
            if self.read_data:
                ds = self._dataset = load_dataset(
                    c.source, split_seed=self.seed if c.split_seed is None else c.split_seed,
                    normalize=c.normalize, dtype=self.dtype, **where)
                layout = DataLayout(ds.source, ds.sample_shape, ds.integer_input,
                                    ds.num_train, ds.num_classes)
            else:
                layout = describe_dataset(c.source, **where)
        except ParamError as e:
            raise _problems_at(self, e) from None
        if layout.num_train < c.batchsize:
            raise self.error(f"batchsize {c.batchsize} is larger than the training split "
                             f"({layout.num_train} samples of {layout.source})")
        self._layout = layout
        self.out_shape = layout.sample_shape
        self.int_output = layout.integer_input

    @property
    def dataset(self) -> Dataset:
        if self._dataset is None:
            raise self.error("is not set up yet" if self._layout is None else
                             "was built to be checked, without reading its data")
        return self._dataset

    @property
    def batchsize(self) -> int:
        return int(self.own.batchsize)

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset.steps_per_epoch(self.batchsize)

    def num_classes(self) -> int | None:
        if self._dataset is None:  # built to be checked: known for the digits only
            return self._layout.num_classes if self._layout is not None else None
        return self.dataset.num_classes

    def id_range(self) -> tuple[int, int] | None:
        return self._dataset.id_range() if self._dataset is not None else None

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        try:
            return self.dataset.train_batch(step, self.batchsize, seed=self.seed,
                                            shuffle=self.own.shuffle, rank=rank,
                                            num_workers=num_workers)
        except ParamError as e:
            raise _problems_at(self, e) from None

    def _split(self, phase: str) -> str:
        from .base import phase_name

        split = phase_name(phase)
        x, _ = self.dataset.split(split)
        if x.shape[0] == 0:
            what = {"test": "test_fraction is 0 and the file holds no x_test/y_test",
                    "val": "val_fraction is 0 and the file holds no x_val/y_val"}[split]
            raise self.error(f"there is no {'validation' if split == 'val' else 'test'} "
                             f"split ({what})")
        return split

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        """That split of the dataset (test or val), in stored order."""
        return self.dataset.eval_batches(self._split(phase), batchsize or self.batchsize,
                                         steps)

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        n = self.dataset.split(self._split(phase))[1].shape[0]
        count = -(-n // (batchsize or self.batchsize))
        return min(count, steps) if steps else count


# -- SINGA's stores -------------------------------------------------------------------------


_stores: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_stores_lock = threading.Lock()


def _read_store(path: Path, backend: str, separator: str, has_label: bool,
                limit: int | None = None) -> Any:
    """The samples of a store, shared by the layers (and workers) that read the same file;
    the first ``limit`` only, when given."""
    from ...singa import stores

    file = stores.kvfile_path(path) if backend == "kvfile" else (
        path / stores.SHARD_FILE if backend == "shard" else path)
    try:
        st = file.stat()
    except FileNotFoundError:
        from ...shipped import doc_file

        raise ParamError(f"data store '{path}' does not exist (make it with paramserver "
                         f"data, see {doc_file('singa.md')})") from None
    except OSError as e:
        raise ParamError(f"data store '{path}' cannot be read: {e.strerror or e}") from None
    key = (str(file.resolve()), st.st_mtime_ns, st.st_size, backend, separator, has_label,
           limit)
    with _stores_lock:
        if key in _stores:
            _stores.move_to_end(key)
            return _stores[key]
    samples = stores.read_records(path, backend, separator=separator, has_label=has_label,
                                  limit=limit)
    samples.x.setflags(write=False)
    with _stores_lock:
        _stores[key] = samples
        while len(_stores) > 8:
            _stores.popitem(last=False)
    return samples


class StoreInputLayer(InputLayer):
    """Reads the records of a SINGA store (see the module docstring): each step the next
    ``batchsize`` records in stored order, wrapping around (a batch may be larger than the
    store, as in SINGA), after skipping a random number in ``[0, random_skip]`` (keyed by
    the job seed) at the start. Tests and validations read it as SINGA's test and
    validation layers did: ``steps`` batches of ``batchsize`` records, wrapping around, each
    evaluation of a run on from where the one before stopped (0 steps: the store once, the
    last batch smaller)."""

    #: The store's backend when the configuration does not say.
    backend = "kvfile"

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.x: np.ndarray = np.zeros((0,))
        self.y: np.ndarray = np.zeros((0,), np.int64)

    def store(self) -> tuple[Path, str, str, bool, list[int]]:
        """``(path, backend, separator, has_label, shape)`` of the configuration."""
        c = self.own
        if not c.path:
            raise self.error("store_conf path is not given")
        return (Path(os.fspath(c.path)), c.backend or self.backend, c.separator,
                bool(c.has_label), list(c.shape))

    def setup(self) -> None:
        super().setup()
        path, backend, separator, has_label, shape = self.store()
        if getattr(self.own, "encoded", False):
            raise self.error("store_conf encoded: true (JPEG records) is not read; write the "
                             "records as raw pixels (paramserver data)")
        if self.batchsize < 1:
            raise self.error("the batchsize is not given (store_conf batchsize)")
        if backend not in ("kvfile", "textfile", "shard"):
            raise self.error(f"store_conf backend '{backend}' is not one of SINGA's: "
                             "'kvfile', 'textfile'")
        try:  # built to be checked: the first record, for the samples' shape
            samples = _read_store(path, backend, separator, has_label,
                                  None if self.read_data else 1)
        except ParamError as e:
            raise _problems_at(self, e) from None
        x = samples.x
        if shape:
            size = int(np.prod(shape, dtype=np.int64))
            if x[0].size != size:
                raise self.error(f"the records of '{path}' hold {x[0].size} values, but "
                                 f"store_conf shape {shape_text(shape)} is {size}")
            x = x.reshape((x.shape[0], *shape))
        self.x, self.y = x, samples.y
        self.out_shape = tuple(x.shape[1:])
        self.skip = self._random_skip()
        self.setup_normalisation()

    def _random_skip(self) -> int:
        limit = int(getattr(self.own, "random_skip", 0))
        if not limit:
            return 0
        return int(derive_rng(self.seed, "data", "skip", self.name).integers(0, limit + 1))

    def setup_normalisation(self) -> None:
        """Read what :meth:`transform` needs."""

    @property
    def batchsize(self) -> int:
        sizes = self.own.batchsize
        return int(sum(sizes)) if isinstance(sizes, list) else int(sizes)

    @property
    def steps_per_epoch(self) -> int:
        return max(self.x.shape[0] // self.batchsize, 1)

    def num_classes(self) -> int | None:
        if not self.read_data:
            return None  # built to be checked: the labels were not read
        return int(self.y.max()) + 1 if self.y.size else 0

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        n, size = self.x.shape[0], self.batchsize
        if num_workers < 1 or not 0 <= rank < num_workers:
            raise ParamError(f"worker rank {rank} is not in [0, {num_workers})")
        if size < num_workers:
            raise self.error(f"batchsize {size} is smaller than the number of workers "
                             f"({num_workers}): some workers would get no samples")
        first = self.skip + int(step) * size
        idx = (first + np.arange(size)) % n
        shard = np.array_split(idx, num_workers)[rank]
        return Batch(self.x[shard], self.y[shard], int(step), first // n, rank, num_workers,
                     size)

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        return self.eval_pass(phase, 0, batchsize, steps)

    def eval_pass(self, phase: str, index: int, batchsize: int | None = None, steps: int = 0
                  ) -> Iterator[Batch]:
        n, size = self.x.shape[0], batchsize or self.batchsize
        per_pass = steps * size if steps else n
        first = self.skip + int(index) * per_pass
        for i in range(self.eval_count(phase, size, steps)):
            idx = np.arange(first + i * size, first + min((i + 1) * size, per_pass)) % n
            yield Batch(self.x[idx], self.y[idx], i, 0, 0, 1, idx.size)

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        return steps if steps else -(-self.x.shape[0] // (batchsize or self.batchsize))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=self.dtype)


class _Normalised(StoreInputLayer):
    """SINGA's SingleLabelRecordLayer: values minus the mean (``mean_file`` or
    ``mean_value``), divided by the deviation (``std_file`` or ``std_value``)."""

    Config = StoreConf

    def setup_normalisation(self) -> None:
        c = self.own
        size = int(np.prod(self.out_shape, dtype=np.int64))
        self.mean = self._vector(c.mean_file, c.mean_value, size, "mean")
        self.std = self._vector(c.std_file, c.std_value, size, "std")
        if self.std is not None and not np.all(self.std != 0):
            raise self.error("the std values must not be 0")

    def _vector(self, file: str | None, value: float | None, size: int, what: str
                ) -> np.ndarray | None:
        from ...singa import stores

        if file:
            backend = self.own.backend or self.backend
            try:
                v = stores.read_mean(os.fspath(file), backend)
            except ParamError as e:
                raise _problems_at(self, e) from None
            if v.size != size:
                raise self.error(f"{what}_file '{file}' holds {v.size} values; a sample has "
                                 f"{size}")
            return v.reshape(self.out_shape).astype(self.dtype)
        if value is not None:
            return np.full(self.out_shape, value, self.dtype)
        return None

    def transform(self, x: np.ndarray) -> np.ndarray:
        out = np.asarray(x, dtype=self.dtype)
        if self.mean is not None:
            out = out - self.mean
        if self.std is not None:
            out = out / self.std
        return out


@register_layer("kRecordInput")
class RecordInputLayer(_Normalised):
    """SINGA's records from a kvfile store (``store_conf { backend: "kvfile" path shape
    batchsize mean_file std_value ... }``): pixel bytes become floats, then the mean is
    subtracted and the deviation divided."""


@register_layer("kCSVInput")
class CSVInputLayer(_Normalised):
    """SINGA's CSV store (``backend: "textfile"``): per line the label (``has_label``), then
    the values, split by ``separator``; normalised as kRecordInput."""

    backend = "textfile"


@register_layer("kShardData")
class ShardDataLayer(StoreInputLayer):
    """SINGA v0.1.0's DataShard (``sharddata_conf { path batchsize random_skip }``): the
    records' values as floats, unparsed (kMnist, kRGBImage and kLabel parse them)."""

    Config = ShardConf
    backend = "shard"

    def store(self) -> tuple[Path, str, str, bool, list[int]]:
        return Path(os.fspath(self.own.path)), "shard", ",", True, []


# -- v0.1.0's parsers -----------------------------------------------------------------------


class ParserLayer(Layer):
    """Reads the records of a kShardData (v0.1.0's parser layers)."""

    def setup(self) -> None:
        super().setup()
        check_store_source(self)


def check_store_source(layer: Layer) -> None:
    src = layer.srcs[0]
    if not isinstance(src, StoreInputLayer):
        raise layer.error(f"srclayer '{src.name}' is {src.type}; {layer.type} parses the "
                          "records of a kShardData (or another store input layer)")


@register_layer("kLabel")
class LabelLayer(ParserLayer):
    """The labels of its source's records, as integers; a loss layer may read them."""

    gives_labels = True

    def setup(self) -> None:
        super().setup()
        self.out_shape = ()
        self.int_output = True

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.labels = self.srcs[0].labels
        self.data = self.labels


@register_layer("kMnist")
class MnistLayer(ParserLayer):
    """MNIST records as images ``(1, s, s)`` with values ``pixel / norm_a - norm_b``. The
    elastic-distortion fields (``kernel``, ``sigma``, ``alpha``, ``beta``, ``gamma``,
    ``resize``, ``elastic_freq``) are read and have no effect, as in SINGA, whose parser
    never applied them."""

    Config = MnistConf

    def setup(self) -> None:
        super().setup()
        size = int(np.prod(self.srcs[0].out_shape, dtype=np.int64))
        side = int(np.sqrt(size))
        if side * side != size or size == 0:
            raise self.error(f"records of shape {shape_text(self.srcs[0].out_shape)} are "
                             "not square images")
        if self.own.norm_a == 0:
            raise self.error("mnist_conf norm_a must not be 0")
        self.out_shape = (1, side, side)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        self.data = (x / self.own.norm_a - self.own.norm_b).reshape(x.shape[0],
                                                                     *self.out_shape)


def crop_mirror(x: Any, cropsize: int, mirror: bool, train: bool,
                rng: np.random.Generator | None) -> Any:
    """Images ``(n, c, h, w)`` cropped to ``cropsize`` squares (at random in training, the
    centre otherwise) and, in training with ``mirror``, flipped left-right at random."""
    n, _, h, w = x.shape
    if cropsize and (cropsize != h or cropsize != w):
        if train and rng is not None:
            top = rng.integers(0, h - cropsize + 1, n)
            left = rng.integers(0, w - cropsize + 1, n)
            x = require_torch().stack([x[k, :, top[k]:top[k] + cropsize,
                                         left[k]:left[k] + cropsize] for k in range(n)])
        else:
            top, left = (h - cropsize) // 2, (w - cropsize) // 2
            x = x[:, :, top:top + cropsize, left:left + cropsize]
    if mirror and train and rng is not None:
        flip = as_tensor(rng.random(n) < 0.5).to(x.device)
        x = require_torch().where(flip[:, None, None, None], x.flip(3), x)
    return x


class _ImageLayer(Layer):
    """Crop, mirror and scale of ``rgbimage_conf``, on 3-D samples ``(c, h, w)``."""

    Config = RGBImageConf

    def setup(self) -> None:
        super().setup()
        shape = self.srcs[0].out_shape
        if len(shape) != 3:
            raise self.error(f"srclayer '{self.srcs[0].name}' gives shape "
                             f"{shape_text(shape)}; {self.type} reads images (channels, "
                             "height, width)")
        crop = int(self.own.cropsize)
        if crop > min(shape[1], shape[2]):
            raise self.error(f"cropsize {crop} is larger than the images "
                             f"({shape[1]}x{shape[2]})")
        self.out_shape = (shape[0], crop, crop) if crop else shape

    def images(self, x: Any, phase: str, rng: np.random.Generator | None) -> Any:
        x = crop_mirror(x, int(self.own.cropsize), bool(self.own.mirror), phase == "train",
                        rng)
        scale = float(self.own.scale)
        return x * scale if scale not in (0.0, 1.0) else x


@register_layer("kRGBImage")
class RGBImageLayer(_ImageLayer):
    """v0.1.0's RGB image records: minus the mean image (``meanfile``: a bare serialized
    record, or Caffe's ``.binaryproto``), then cropped (at random in training, the centre
    in tests), mirrored at random in training (``mirror``) and multiplied by ``scale``."""

    def setup(self) -> None:
        super().setup()
        check_store_source(self)
        self.mean = None
        if self.own.meanfile:
            from ...singa import stores

            try:
                mean = stores.read_mean(self.own.meanfile, "shard")
            except ParamError as e:
                try:  # v0.2.0's examples write the mean as a kvfile at the same path
                    mean = stores.read_mean(self.own.meanfile, "kvfile")
                except ParamError:
                    raise _problems_at(self, e) from None
            shape = self.srcs[0].out_shape
            if mean.size != int(np.prod(shape)):
                raise self.error(f"meanfile '{self.own.meanfile}' holds {mean.size} values; "
                                 f"an image has {int(np.prod(shape))}")
            self.mean = mean.reshape(shape).astype(self.dtype)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        if self.mean is not None:
            x = x - as_tensor(self.mean).to(x.device)
        self.data = self.images(x, phase, rng)


@register_layer("kImagePreprocess")
class ImagePreprocessLayer(_ImageLayer):
    """Crops (at random in training, the centre in tests), mirrors at random in training and
    scales the images of its source (``rgbimage_conf { cropsize mirror scale }``)."""

    def setup(self) -> None:
        super().setup()
        self.float_source()

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.data = self.images(self.srcs[0].data, phase, rng)


# -- char-rnn -------------------------------------------------------------------------------


def read_vocab(layer: Layer, path: str | None) -> str:
    """A vocabulary file: its characters, in id order (SINGA's char-rnn writes them as one
    string)."""
    if not path:
        raise layer.error("char_rnn_conf vocab_path is not given")
    try:
        require_regular(path, "vocab_path")  # a pipe or a device is not read
        vocab = Path(path).read_text(encoding="utf-8")
    except ParamError as e:
        raise layer.error(str(e)) from None
    except FileNotFoundError:
        raise layer.error(f"vocab_path '{path}' does not exist (make it with paramserver "
                          "data --format text)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise layer.error(f"vocab_path '{path}' cannot be read: {e}") from None
    if not vocab:
        raise layer.error(f"vocab_path '{path}' is empty")
    if len(set(vocab)) != len(vocab):
        twice = sorted({c for c in vocab if vocab.count(c) > 1})
        raise layer.error(f"vocab_path '{path}' holds a character twice: {twice[:5]}")
    return vocab


@register_layer("kCharRNN")
class CharRNNLayer(InputLayer):
    """A text file as character ids for an unrolled RNN (``char_rnn_conf { path vocab_path
    batchsize unroll_len }``).

    As SINGA's: the text is cut into ``batchsize`` equal parts, one per instance; each step
    every instance reads the next ``unroll_len + 1`` characters of its part (the last one is
    the label of the one before), and the next step starts ``unroll_len`` further on. An
    epoch ends when an instance would run past its part. ``data`` is ``(batch, unroll_len
    + 1)`` ids: the unrolled copies of kOneHot and kRNNLabel read their column.
    """

    Config = CharRNNConf
    gives_labels = False

    def setup(self) -> None:
        super().setup()
        c = self.own
        self.vocab = read_vocab(self, c.vocab_path)
        if not c.path:
            raise self.error("char_rnn_conf path is not given")
        self.unroll_len = int(c.unroll_len)
        self.out_shape = (self.unroll_len + 1,)
        self.int_output = True
        if not self.read_data:  # built to be checked: the text is not read
            if not Path(c.path).exists():
                raise self.error(f"path '{c.path}' does not exist (make it with paramserver "
                                 "data --format text)")
            self.ids, self.part, self.per_epoch = np.zeros(0, np.int64), 0, 1
            return
        try:
            require_regular(c.path, "path")  # a pipe or a device is not read
            text = Path(c.path).read_text(encoding="utf-8")
        except ParamError as e:
            raise self.error(str(e)) from None
        except FileNotFoundError:
            raise self.error(f"path '{c.path}' does not exist (make it with paramserver "
                             "data --format text)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise self.error(f"path '{c.path}' cannot be read: {e}") from None
        index = {ch: i for i, ch in enumerate(self.vocab)}
        unknown = sorted({ch for ch in set(text) if ch not in index})
        if unknown:
            raise self.error(f"'{c.path}' holds characters that are not in the vocabulary "
                             f"'{c.vocab_path}': {unknown[:5]}")
        self.ids = np.array([index[ch] for ch in text], np.int64)
        self.part = len(text) // int(c.batchsize)
        if self.part <= self.unroll_len:
            raise self.error(f"the text has {len(text)} characters: too few for batchsize "
                             f"{c.batchsize} instances of unroll_len {self.unroll_len} + 1")
        self.per_epoch = (self.part - 1 - self.unroll_len) // self.unroll_len + 1

    @property
    def batchsize(self) -> int:
        return int(self.own.batchsize)

    @property
    def steps_per_epoch(self) -> int:
        return self.per_epoch

    def id_range(self) -> tuple[int, int] | None:
        return 0, len(self.vocab) - 1

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        offset = (int(step) % self.per_epoch) * self.unroll_len
        starts = np.arange(self.batchsize) * self.part + offset
        rows = np.array_split(starts, num_workers)[rank]
        x = self.ids[rows[:, None] + np.arange(self.unroll_len + 1)]
        return Batch(x, np.zeros(x.shape[0], np.int64), int(step), int(step) // self.per_epoch,
                     rank, num_workers, self.batchsize)

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        return self.eval_pass(phase, 0, batchsize, steps)

    def eval_pass(self, phase: str, index: int, batchsize: int | None = None, steps: int = 0
                  ) -> Iterator[Batch]:
        count = self.eval_count(phase, batchsize, steps)
        for i in range(count):
            yield self.batch(int(index) * count + i)

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        return min(self.per_epoch, steps) if steps else self.per_epoch

    def set_output(self, x: Any, y: Any) -> None:
        super().set_output(x, y)
        self.labels = None


def unrolled_column(layer: Layer, src: Layer, offset: int = 0) -> Any:
    """The ids ``layer`` (copy ``unroll_index``) reads from ``src``: column ``unroll_index
    + offset`` of a kCharRNN's data, else the source's data itself."""
    x = src.data
    if isinstance(src, CharRNNLayer):
        return x[:, layer.unroll_index + offset]
    return x.reshape(x.shape[0])


@register_layer("kOneHot")
class OneHotLayer(Layer):
    """Ids to one-hot vectors of ``onehot_conf { vocab_size }`` floats (the copy of an
    unrolled net reads its column of a kCharRNN). Without ``vocab_size`` (0, as SINGA's
    char-rnn sampling file leaves it, which SINGA's layer did not survive), the vectors are
    as long as the ids its source can give (a kCharRNN's vocabulary, a kRNNDummy's
    ``high``)."""

    Config = OnehotConf

    def setup(self) -> None:
        super().setup()
        src = self.srcs[0]
        if not src.int_output:
            raise self.error(f"srclayer '{src.name}' gives floats; {self.type} reads ids")
        size = int(self.own.vocab_size)
        ids = getattr(src, "id_range", lambda: None)()
        if size < 1:
            if ids is None:
                raise self.error("onehot_conf vocab_size must be set (at least 1): srclayer "
                                 f"'{src.name}' does not tell how many ids there are")
            size = ids[1] + 1
        if ids is not None and ids[1] >= size:
            raise self.error(f"the ids of '{src.name}' go up to {ids[1]}, beyond vocab_size "
                             f"{size}")
        self.size = size
        self.out_shape = (size,)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        torch = require_torch()
        ids = unrolled_column(self, self.srcs[0]).long()
        size = self.size
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise self.error(f"an id is outside [0, {size})")
        self.data = torch.nn.functional.one_hot(ids, size).to(torch_dtype(self.dtype))


@register_layer("kRNNLabel")
class RNNLabelLayer(Layer):
    """The labels of an unrolled char-rnn: copy ``t`` gives the id of character ``t + 1``
    of its kCharRNN source (the character to predict)."""

    gives_labels = True

    def setup(self) -> None:
        super().setup()
        src = self.srcs[0]
        if not isinstance(src, CharRNNLayer):
            raise self.error(f"srclayer '{src.name}' is {src.type}; {self.type} reads a "
                             "kCharRNN")
        self.out_shape = ()
        self.int_output = True

    def num_classes(self) -> int | None:
        src = self.srcs[0]
        assert isinstance(src, CharRNNLayer)
        return len(src.vocab)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        self.labels = unrolled_column(self, self.srcs[0], 1)
        self.data = self.labels


@register_layer("kRNNDummy")
class RNNDummyLayer(InputLayer):
    """The input of a sampling net (``rnn_dummy_conf``): at the first step random values of
    ``shape`` in ``[low, high)`` (whole numbers with ``integer``), then the output of
    ``dynamic_srclayer`` at the step before (the character just sampled)."""

    Config = RNNDummyConf
    gives_labels = False

    def setup(self) -> None:
        super().setup()
        c = self.own
        if not c.shape:
            raise self.error("rnn_dummy_conf shape is not given")
        if not c.low < c.high:
            raise self.error(f"rnn_dummy_conf low ({c.low:g}) must be below high ({c.high:g})")
        self.sample_shape = tuple(int(s) for s in c.shape)
        self.out_shape = self.sample_shape[1:]
        self.int_output = bool(c.integer)
        self.dynamic: Layer | None = None
        self._step = 0

    def link(self, later: Sequence[Layer]) -> None:
        name = self.own.dynamic_srclayer
        if name:
            found = [x for x in later if x.name == name]
            if not found:
                raise self.error(f"dynamic_srclayer '{name}' is not a layer of this net "
                                 "written after it")
            self.dynamic = found[0]

    @property
    def batchsize(self) -> int:
        return self.sample_shape[0]

    def id_range(self) -> tuple[int, int] | None:
        if not self.int_output:
            return None
        return int(np.floor(self.own.low)), int(np.ceil(self.own.high)) - 1

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        rng = derive_rng(self.seed, "rnn-dummy", self.name, step)
        x = rng.uniform(self.own.low, self.own.high, self.sample_shape)
        x = np.floor(x).astype(np.int64) if self.int_output else x.astype(self.dtype)
        return Batch(x, np.zeros(x.shape[0], np.int64), int(step), 0, 0, 1, x.shape[0])

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        for i in range(self.eval_count(phase, batchsize, steps)):
            yield self.batch(i)

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        return steps or 1

    def feed(self, batch: Batch) -> None:
        self._step = batch.step
        super().feed(batch)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        super().forward(phase, rng)
        src = self.dynamic
        if self._step > 0 and src is not None and src.data is not None:
            prev = src.data.reshape(self.data.shape[0], -1)[:, 0]
            self.data = prev.reshape(self.data.shape).to(self.data.dtype)
        self.labels = None


__all__ = ["CSVInputLayer", "CharRNNLayer", "DataConf", "DataLayer", "ImagePreprocessLayer",
           "InputLayer", "LabelLayer", "MnistLayer", "OneHotLayer", "ParserLayer",
           "RGBImageLayer", "RNNDummyLayer", "RNNLabelLayer", "RecordInputLayer",
           "ShardDataLayer", "StoreInputLayer", "crop_mirror", "read_vocab",
           "unrolled_column"]
