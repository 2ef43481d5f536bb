"""TensorBoard event files of a training run, in ``<workspace>/tensorboard``.

Scalars per phase: ``train/loss``, ``train/accuracy``, ``train/lr`` and
``train/steps_per_second`` at every display step (the same window as ``metrics.csv``);
``test/loss``, ``test/accuracy``, ``test/steps_per_second`` (test batches) at every test.
At every checkpoint, histograms of each owner Param's values (``values/<name>``) and of its
last update (``update/<name>``: the values after the checkpoint's step less those before it).

Written with ``tensorboardX`` (or ``torch.utils.tensorboard`` where only that is installed).
A resumed run appends to the same folder and tells TensorBoard, with a *purge* event, to drop
what an earlier run wrote after the checkpoint resumed from, so no step shows twice; a new
run purges from step 0 (the earlier run's files stay, hidden).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..params import ParamSet

log = logging.getLogger(__name__)

FOLDER = "tensorboard"


class TensorBoardLog:
    """The event files of one run; a no-op when ``enabled`` is False.

    Args:
        folder: where event files go.
        start: the step the run starts at; events an earlier run wrote after it are purged.
        histogram_steps: the steps whose histograms are written (the checkpoint steps).
        enabled: write nothing when False (``--no-tensorboard``).
    """

    def __init__(self, folder: str | os.PathLike[str], start: int,
                 histogram_steps: Iterable[int] = (), enabled: bool = True):
        self.folder = Path(folder)
        self.histogram_steps = set(histogram_steps)
        self._before: tuple[int, np.ndarray] | None = None
        self._writer: Any = _open_writer(self.folder, start) if enabled else None

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stops(self, start: int) -> set[int]:
        """Steps the run must stop at, besides its own: just before each histogram step, so
        that the values before that step's update can be kept."""
        if not self.enabled:
            return set()
        return {s - 1 for s in self.histogram_steps if s - 1 > start}

    def before_chunk(self, step: int, stop: int, params: ParamSet) -> None:
        """Called before the steps ``[step, stop)`` run: keep the values a histogram step's
        update starts from."""
        if self.enabled and stop in self.histogram_steps and stop - step == 1:
            self._before = (stop, params.values.copy())

    def scalars(self, phase: str, step: int, values: dict[str, float]) -> None:
        """``<phase>/<name>`` of every entry of ``values`` at ``step``."""
        if not self.enabled:
            return
        for name, value in values.items():
            self._writer.add_scalar(f"{phase}/{name}", float(value), step)

    def histograms(self, step: int, params: ParamSet) -> None:
        """Histograms of every owner's values, and of its last update when known."""
        if not self.enabled or step not in self.histogram_steps:
            return
        before = self._before[1] if self._before and self._before[0] == step else None
        for i, p in enumerate(params.owners):
            if p.size == 0:
                continue
            self._writer.add_histogram(f"values/{p.name}", p.data.reshape(-1), step)
            if before is not None:
                lo, hi = int(params.offsets[i]), int(params.offsets[i + 1])
                self._writer.add_histogram(f"update/{p.name}",
                                           params.values[lo:hi] - before[lo:hi], step)
        self._before = None

    def flush(self) -> None:
        """Write what is pending (before a checkpoint: what it covers is then on disk)."""
        if self.enabled:
            self._writer.flush()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


def _open_writer(folder: Path, start: int) -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter  # type: ignore[no-redef]
        except ImportError:
            log.warning("no TensorBoard event files: install tensorboardX "
                        "(pip install tensorboardX) or use --no-tensorboard")
            return None
    folder.mkdir(parents=True, exist_ok=True)
    # A resumed run keeps what was written up to its checkpoint's step (everything at that
    # step was flushed before the checkpoint); a new run starts the curves afresh.
    purge = start + 1 if start > 0 else 0
    # Event file names hold whole seconds; the suffix orders two runs of the same second.
    suffix = f".{time.time_ns():020d}.{os.getpid()}"
    return SummaryWriter(str(folder), purge_step=purge, flush_secs=10,
                         filename_suffix=suffix)


__all__ = ["FOLDER", "TensorBoardLog"]
