"""SINGA's log lines of training, tests and validations (``--log-format singa``), as the
job's release printed them (:mod:`paramserver.singa.releases`), for scripts that read
SINGA's logs.

SINGA's worker logs each loss layer's metrics (``Layer::ToString``) behind a prefix:

v0.2.0 and v0.3.0 (``Worker::Display``: ``prefix + "  " + disp``, one line per layer)::

    Train @ step 10  Loss = 2.223607, accuracy = 0.189063
    Test @ step 60
       Loss = 2.180334, accuracy = 0.212000

(``Worker::Run`` logs ``Test @ step N`` and ``Validation @ step N`` alone, then ``Test``
displays with the prefix ``" "``; ``Driver::Test``, SINGA's ``-test``, only the second line.)
A kSoftmaxLoss shows ``Loss`` and ``accuracy``, kEuclideanLoss and kCudnnSoftmaxLoss
``Loss``, kAccuracy ``accuracy``, kRBMVis ``Squared Error``. The kBPTT worker
(``BPTTWorker::Display``) sums each metric over the layers (the unrolled copies) into one
line, in the order of its ``std::unordered_map`` and with a trailing comma:
``Train @ step 10 accuracy = 12.350000, Loss = 98.612345, ``.

v0.1.0 (``prefix + ": " + disp``, the metrics in its ``unordered_map``'s order)::

    Train @ step 10: accuracy = 0.189063, loss = 2.223607
    Test @ step 60: accuracy = 0.212000, loss = 2.180334

Values are ``std::to_string`` of a float: six decimals of the float32 value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .releases import V010

#: v0.2.0's labels of what each loss or output layer type shows, in its order:
#: (paramserver's metric, SINGA's label).
_SHOWN: dict[str, tuple[tuple[str, str], ...]] = {
    "kSoftmaxLoss": (("loss", "Loss"), ("accuracy", "accuracy")),
    "kCudnnSoftmaxLoss": (("loss", "Loss"),),
    "kEuclideanLoss": (("loss", "Loss"),),
    "kAccuracy": (("accuracy", "accuracy"),),
    "kRBMVis": (("loss", "Squared Error"),),
}
#: v0.1.0's (``Metric::ToLogString``: the order its unordered_map iterates in).
_SHOWN_V010: dict[str, tuple[tuple[str, str], ...]] = {
    "kSoftmaxLoss": (("accuracy", "accuracy"), ("loss", "loss")),
    "kEuclideanLoss": (("loss", "loss"),),
    "kRBMVis": (("loss", "Squared Error"),),
}
#: The order of ``BPTTWorker::Display``'s unordered_map for the labels it sums.
_BPTT_ORDER = ("accuracy", "Loss")


def value(v: float) -> str:
    """``std::to_string`` of a float: six decimals of the float32 value."""
    return f"{float(np.float32(v)):.6f}" if math.isfinite(v) else (
        "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def shown(release: str, layer_types: Sequence[str], metrics: Mapping[str, float]
          ) -> list[list[tuple[str, float]]]:
    """What each reporting layer (by type, in net order) shows: its ``(label, value)``
    pairs, from the metrics paramserver measured (a metric several layers report, such as
    the loss of every unrolled copy, is their mean; each copy shows it). A net with no
    layer SINGA had (a user's) shows its metrics by paramserver's names, as one layer."""
    table = _SHOWN_V010 if release == V010 else _SHOWN
    out = [[(label, metrics[name]) for name, label in table.get(kind, ())
            if name in metrics and not math.isnan(metrics[name])] for kind in layer_types]
    if not any(out):
        out = [[(name, v) for name, v in metrics.items() if not math.isnan(v)]]
    return out


def lines(release: str, prefix: str, layer_types: Sequence[str],
          metrics: Mapping[str, float], *, bptt: bool = False) -> list[str]:
    """The lines SINGA's ``Worker::Display`` logged for ``prefix`` (``Train @ step 10``, or
    ``" "`` for a test's results; see the module docstring)."""
    per_layer = [pairs for pairs in shown(release, layer_types, metrics) if pairs]
    if release == V010:
        return [f"{prefix}: " + ", ".join(f"{k} = {value(v)}" for k, v in pairs)
                for pairs in per_layer]
    if bptt:  # one line: each label summed over the layers (the unrolled copies)
        sums: dict[str, float] = {}
        for pairs in per_layer:
            for label, v in pairs:  # as SINGA parsed them back from each layer's text
                sums[label] = sums.get(label, 0.0) + float(value(v))
        ordered = [k for k in _BPTT_ORDER if k in sums] + [k for k in sums
                                                            if k not in _BPTT_ORDER]
        return [f"{prefix} " + "".join(f"{k} = {value(sums[k])}, " for k in ordered)]
    return [f"{prefix}  " + ", ".join(f"{k} = {value(v)}" for k, v in pairs)
            for pairs in per_layer]


def train_lines(release: str, step: int, layer_types: Sequence[str],
                metrics: Mapping[str, float], *, bptt: bool = False) -> list[str]:
    """The lines of a display window ending with (0-based) step ``step``, as SINGA's
    ``Worker::Run`` logged them after training that step."""
    return lines(release, f"Train @ step {step}", layer_types, metrics, bptt=bptt)


def eval_lines(release: str, phase: str, step: int, layer_types: Sequence[str],
               metrics: Mapping[str, float], *, bptt: bool = False, alone: bool = False
               ) -> list[str]:
    """The lines of a test (``phase`` kTest) or a validation (kVal) before step ``step``;
    ``alone``: SINGA's ``-test`` (``Driver::Test``), which logs the results only."""
    title = f"{'Validation' if phase == 'kVal' else 'Test'} @ step {step}"
    if release == V010:
        return lines(release, title, layer_types, metrics)
    return ([] if alone else [title]) + lines(release, " ", layer_types, metrics, bptt=bptt)


__all__ = ["eval_lines", "lines", "shown", "train_lines", "value"]
