"""SINGA's rnnlm example's layers, as a user's module: Mikolov's RNN language model with a
class-factored softmax (rnnlm.org), written by SINGA as user layers in C++
(``examples/rnnlm/rnnlm.cc``) and here in Python on paramserver's layer interface.

Load it with ``--import`` (run from the repository root, as SINGA's paths are; the module is
found beside the job file)::

    paramserver --import rnnlm train examples/rnnlm/job.conf

The job file selects these layers with ``user_type: "kData"`` and so on: users' layers live
in their own namespace, so ``kData`` here is not paramserver's built-in ``kData``. Each
reads its own configuration block (``[data_conf]``, ``[embedding_conf]``, ``[loss_conf]``,
the messages of SINGA's ``rnnlm.proto``). SINGA v0.1.0's job (its data in DataShard folders,
``paramserver data --format wordshard``) has a fifth layer, ``kLabel``, which gives the
loss the window's words; v0.2.0's loss reads the data layer itself.

One step is one window of at most ``max_window`` words of the text (up to the end of a
sentence); the layers compute along the window's words (the "batch" axis is time), and the
gradients are autograd's of their forward computations (SINGA's hand-written ones copied,
rather than added, the embedding gradient of a word seen twice in a window).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paramserver.config import ParamError, Parameter, field
from paramserver.singa import stores
from paramserver.singa.records import word_record
from paramserver.train.data import Batch
from paramserver.train.layers import InputLayer, Layer, LossLayer, register_layer

#: The columns of a window's rows: the word, its class, and the class's range of words.
WORD, CLASS, START, END = range(4)


class DataConf(Parameter):
    """``[data_conf]`` of the data layer (rnnlm.proto's DataProto)."""

    path: str = field(doc="The kvfile of WordRecords (v0.2.0; paramserver data --format "
                          "words) or the DataShard folder of Records holding them (v0.1.0; "
                          "--format wordshard).")
    max_window: int = field(10, lower=1, doc="Words per step at most (a window ends at the "
                                             "end of a sentence).")
    backend: str = field("kvfile", enum=("kvfile",), doc="The store: SINGA's kvfile.")


class EmbeddingConf(Parameter):
    """``[embedding_conf]`` (rnnlm.proto's EmbeddingProto)."""

    word_dim: int = field(lower=1, doc="Length of a word's vector.")
    vocab_size: int = field(lower=1, doc="Number of words.")


class LossConf(Parameter):
    """``[loss_conf]`` (rnnlm.proto's LossProto)."""

    nclass: int = field(lower=1, doc="Number of word classes.")
    vocab_size: int = field(lower=1, doc="Number of words.")


def read_windows(path: str, max_window: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The words of the store as rows ``(word, class, start, end)``, and the windows SINGA's
    reader makes of them: each window starts with the last word of the one before (row 0,
    the word to predict from) and takes up to ``max_window`` more, up to a sentence end."""
    records = stores.read_kvfile(path)
    if not records:
        raise ParamError(f"'{path}' holds no words")
    rows = np.zeros((len(records), 4), np.int64)
    for i, (_, value) in enumerate(records):
        r = word_record(value, f"'{path}', record {i}")
        rows[i] = (r.word_index, r.class_index, r.class_start, r.class_end)
    if np.any(rows[:, START] >= rows[:, END]) or np.any(rows[:, WORD] < rows[:, START]) or \
            np.any(rows[:, WORD] >= rows[:, END]):
        raise ParamError(f"'{path}': a word is outside its class's range of words")
    windows, first = [], 0
    while first + 1 < len(rows):
        stop = first + 1
        while stop < len(rows) and stop - first <= max_window:
            stop += 1
            if rows[stop - 1, WORD] == 0:  # the end of a sentence ends the window
                break
        windows.append((first, stop))  # row `first`, then the window's words
        first = stop - 1
    return rows, windows


@register_layer("kData")
class RNNLMDataLayer(InputLayer):
    """rnnlm's data layer: each step the next window of words of ``path`` (rows ``(word,
    class, class start, class end)``, the first row the last word of the window before);
    step ``s`` reads window ``s`` modulo the windows of the text."""

    Config = DataConf
    conf_name = "data_conf"

    def setup(self) -> None:
        super().setup()
        path = Path(os.fspath(self.own.path))
        try:
            self.rows, self.windows = read_windows(str(path), int(self.own.max_window))
        except ParamError as e:
            raise self.error(str(e)) from None
        self.out_shape = (4,)
        self.int_output = True

    @property
    def batchsize(self) -> int:
        return 1

    @property
    def steps_per_epoch(self) -> int:
        return len(self.windows)

    def id_range(self) -> tuple[int, int] | None:
        return 0, int(self.rows[:, WORD].max())

    def window(self, i: int) -> Batch:
        first, stop = self.windows[i % len(self.windows)]
        x = self.rows[first:stop]
        return Batch(x, np.zeros(x.shape[0], np.int64), i, i // len(self.windows), 0, 1,
                     x.shape[0])

    def batch(self, step: int, rank: int = 0, num_workers: int = 1) -> Batch:
        if num_workers != 1:
            raise self.error("reads one window per step: one worker per group")
        return self.window(step)

    def eval_batches(self, phase: str, batchsize: int | None = None, steps: int = 0
                     ) -> Iterator[Batch]:
        for i in range(self.eval_count(phase, batchsize, steps)):
            yield self.window(i)

    def eval_count(self, phase: str, batchsize: int | None = None, steps: int = 0) -> int:
        return min(steps, len(self.windows)) if steps else len(self.windows)


@register_layer("kLabel")
class RNNLMLabelLayer(Layer):
    """v0.1.0's label layer: the rows of the window its data layer read (the words, their
    classes and the classes' ranges of words), for the loss layer."""

    min_srcs = 1
    max_srcs = 1

    def setup(self) -> None:
        super().setup()
        self.int_output = True

    def forward(self, phase: str, rng: Any) -> None:
        self.data = self.srcs[0].data


@register_layer("kEmbedding")
class RNNLMEmbeddingLayer(Layer):
    """The vectors of the window's words but the last (each predicts the word after it):
    rows of the ``(vocab_size, word_dim)`` table."""

    Config = EmbeddingConf
    conf_name = "embedding_conf"

    def setup(self) -> None:
        super().setup()
        self.out_shape = (int(self.own.word_dim),)

    def param_shapes(self) -> list[tuple[int, ...]]:
        return [(int(self.own.vocab_size), int(self.own.word_dim))]

    def compute(self, rows: Any) -> Any:
        ids = rows[:-1, WORD]
        if ids.numel() and int(ids.max()) >= self.own.vocab_size:
            raise self.error(f"a word index is beyond vocab_size {self.own.vocab_size}")
        return self.weights[0][ids]


@register_layer("kHidden")
class RNNLMHiddenLayer(Layer):
    """``h[t] = sigmoid(h[t-1] · W + x[t])``, ``h[0] = sigmoid(x[0])``; W is
    ``(word_dim, word_dim)``."""

    def param_shapes(self) -> list[tuple[int, ...]]:
        d = self.srcs[0].out_shape[0]
        return [(d, d)]

    def compute(self, x: Any) -> Any:
        w = self.weights[0]
        h = [torch.sigmoid(x[0])]
        for t in range(1, x.shape[0]):
            h.append(torch.sigmoid(h[-1] @ w + x[t]))
        return torch.stack(h)


@register_layer("kLoss")
class RNNLMLossLayer(LossLayer):
    """The class-factored softmax: ``p(word) = p(class | h) · p(word | class, h)``, the
    class by softmax over ``nclass`` scores ``h · Cᵀ``, the word by softmax over the
    scores ``h · W[start:end]ᵀ`` of its class's words. ``loss`` is the mean of ``-ln p``
    over the window's words; ``ppl`` the perplexity ``exp(loss)``. Its srclayers: the hidden
    layer, then the data layer (v0.2.0) or the label layer (v0.1.0): the words to
    predict."""

    Config = LossConf
    conf_name = "loss_conf"
    min_srcs = 2
    max_srcs = 2

    def param_shapes(self) -> list[tuple[int, ...]]:
        d = self.srcs[0].out_shape[0]
        return [(int(self.own.vocab_size), d), (int(self.own.nclass), d)]

    def forward(self, phase: str, rng: Any) -> None:
        loss = self.run(self.objective, self.srcs[0].data, self.srcs[1].data)
        self.loss = loss
        self.data = self.srcs[0].data

    def objective(self, h: Any, rows: Any) -> Any:
        words, class_w = self.weights
        target = rows[1:]
        if int(target[:, CLASS].max()) >= self.own.nclass or \
                int(target[:, END].max()) > self.own.vocab_size:
            raise self.error("a word or class is beyond nclass or vocab_size")
        class_logp = torch.log_softmax(h @ class_w.t(), 1)
        total = -class_logp.gather(1, target[:, CLASS:CLASS + 1]).sum()
        for t in range(h.shape[0]):
            start, end, word = (int(v) for v in target[t, [START, END, WORD]])
            scores = words[start:end] @ h[t]
            total = total - torch.log_softmax(scores, 0)[word - start]
        return total / max(h.shape[0], 1)

    def metrics(self) -> dict[str, float]:
        loss = float(self.loss)
        return {"loss": loss, "ppl": float(np.exp(loss))}


__all__ = ["DataConf", "EmbeddingConf", "LossConf", "RNNLMDataLayer", "RNNLMEmbeddingLayer",
           "RNNLMHiddenLayer", "RNNLMLabelLayer", "RNNLMLossLayer", "read_windows"]
