"""Recurrent layers: the GRU (trained by kBPTT on the unrolled net), and the char-rnn
example's output layer.

kGRU computes, from its input ``x`` and the hidden state ``h`` before (its second source:
the copy of the step before in an unrolled net; zeros for the first copy):

    z = σ(x W_zxᵀ + h W_zhᵀ + b_z)              update gate
    r = σ(x W_rxᵀ + h W_rhᵀ + b_r)              reset gate
    c = tanh(r ⊙ (h W_chᵀ) + x W_cxᵀ + b_c)     new memory
    h' = z ⊙ h + (1 − z) ⊙ c

as SINGA's GRULayer does; its gradient is autograd's (SINGA's hand-written one added ``z``
rather than ``grad ⊙ z`` into the state's gradient). Params, in SINGA's order: ``z_hx``,
``r_hx``, ``c_hx`` ``(dim_hidden, input)``, ``z_hh``, ``r_hh``, ``c_hh`` ``(dim_hidden,
dim_hidden)``, then the biases ``z_b``, ``r_b``, ``c_b`` when ``bias_term`` and the layer
gives more than six ``param`` entries or none (SINGA made the biases only for more than
six: its sampling net's second GRU has none).

In a net that samples (its input a kRNNDummy, one step at a time), each GRU keeps its
hidden state from one step to the next (SINGA v0.2's "full state", which its release left
off: without it each character would be sampled from a zero state).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from ...config.job import LayerConf
from ...singa.confs import CharRNNConf, GRUConf
from .base import Layer, register_layer, require_torch
from .input import RNNDummyLayer, read_vocab


@register_layer("kGRU")
class GRULayer(Layer):
    """A gated recurrent unit; see the module docstring."""

    Config = GRUConf
    max_srcs = 2

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.state: Any = None
        self.carries_state = False

    def setup(self) -> None:
        super().setup()
        src = self.float_source(0)
        self.vdim = int(np.prod(src.out_shape, dtype=np.int64))
        hdim = int(self.own.dim_hidden)
        if len(self.srcs) == 2 and tuple(self.srcs[1].out_shape) != (hdim,):
            raise self.error(f"its second srclayer '{self.srcs[1].name}' (the state before) "
                             f"gives {self.srcs[1].out_shape}, not ({hdim},)")
        given = len(self.conf.param)
        self.has_bias = bool(self.own.bias_term) and (given == 0 or given > 6)
        self.out_shape = (hdim,)

    def link(self, later: Sequence[Layer]) -> None:
        todo, seen = list(self.srcs), set()
        while todo:
            layer = todo.pop()
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            if isinstance(layer, RNNDummyLayer):
                self.carries_state = len(self.srcs) == 1
            todo += layer.srcs

    def param_shapes(self) -> list[tuple[int, ...]]:
        h, v = int(self.own.dim_hidden), self.vdim
        shapes: list[tuple[int, ...]] = [(h, v), (h, v), (h, v), (h, h), (h, h), (h, h)]
        return shapes + [(h,)] * 3 if self.has_bias else shapes

    def reset_state(self) -> None:
        self.state = None

    def inputs(self) -> list[Any]:
        xs = [self.srcs[0].data]
        if len(self.srcs) == 2:
            xs.append(self.srcs[1].data)
        elif self.carries_state and self.state is not None:
            xs.append(self.state)
        return xs

    def compute(self, x: Any, h: Any = None) -> Any:
        torch = require_torch()
        x = x.reshape(x.shape[0], -1)
        w = self.weights
        zx, rx, cx = (x @ w[i].t() for i in range(3))
        if self.has_bias:
            zx, rx, cx = zx + w[6], rx + w[7], cx + w[8]
        if h is None:
            z, r = torch.sigmoid(zx), torch.sigmoid(rx)
            c = torch.tanh(cx)
            return (1 - z) * c
        z = torch.sigmoid(zx + h @ w[3].t())
        r = torch.sigmoid(rx + h @ w[4].t())
        c = torch.tanh(r * (h @ w[5].t()) + cx)
        return z * h + (1 - z) * c

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        super().forward(phase, rng)
        if self.carries_state:
            self.state = self.data


@register_layer("kCharRNNOutput")
class CharRNNOutputLayer(Layer):
    """Writes the characters whose ids its source gives (the first column of each row: a
    kArgSort's top id), by the vocabulary of ``char_rnn_conf { vocab_path }``, to the
    standard output as SINGA's does; :attr:`text` keeps what it wrote."""

    Config = CharRNNConf

    def __init__(self, conf: LayerConf, srcs: Sequence[Layer] = (), **kwargs: Any):
        super().__init__(conf, srcs, **kwargs)
        self.text = ""
        self.stream: TextIO | None = None

    def setup(self) -> None:
        super().setup()
        if not self.srcs[0].int_output:
            raise self.error(f"srclayer '{self.srcs[0].name}' gives floats; {self.type} "
                             "reads character ids (a kArgSort)")
        self.vocab = read_vocab(self, self.own.vocab_path)

    def forward(self, phase: str, rng: np.random.Generator | None) -> None:
        x = self.srcs[0].data
        ids = x.reshape(x.shape[0], -1)[:, 0].tolist()
        if any(not 0 <= i < len(self.vocab) for i in ids):
            raise self.error(f"an id is outside the vocabulary of {len(self.vocab)} "
                             "characters")
        out = "".join(self.vocab[i] for i in ids)
        self.text += out
        self._write(out)
        self.data = x

    def end_evaluation(self) -> None:
        """The end of a test: end the line written."""
        self._write("\n")

    def _write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        stream.write(text)
        stream.flush()


__all__ = ["CharRNNOutputLayer", "GRULayer"]
