"""TensorBoard event files of a training run, in ``<workspace>/tensorboard``.

Scalars per phase: ``train/loss``, ``train/accuracy``, ``train/lr`` and
``train/steps_per_second`` at every display step (the same window as ``metrics.csv``);
``test/loss``, ``test/accuracy``, ``test/steps_per_second`` (test batches) at every test.
At every checkpoint, histograms of each owner Param's values (``values/<name>``) and of its
last update (``update/<name>``: the values after the checkpoint's step less those before it).

Written with ``tensorboardX``'s summaries and event records, in the training thread: a
write that fails (a full disk) stops the run with one message naming the event file, where
``tensorboardX``'s writer thread would print a traceback and go on.
A resumed run appends to the same folder and tells TensorBoard, with a *purge* event, to drop
what an earlier run wrote after the checkpoint resumed from, so no step shows twice; a new
run purges from step 0 (the earlier run's files stay, hidden).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..params import ParamSet
from ..paths import path_error

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
        self._writer: Any = None
        self.path = self.folder
        if enabled:
            self._writer, self.path = _open_writer(self.folder, start)

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
        from tensorboardX.summary import scalar

        for name, value in values.items():
            self._write(step, scalar(f"{phase}/{name}", float(value)))

    def histograms(self, step: int, params: ParamSet) -> None:
        """Histograms of every owner's values, and of its last update when known."""
        if not self.enabled or step not in self.histogram_steps:
            return
        from tensorboardX.summary import histogram

        before = self._before[1] if self._before and self._before[0] == step else None
        for i, p in enumerate(params.owners):
            if p.size == 0:
                continue
            self._write(step, histogram(f"values/{p.name}", p.data.reshape(-1), _bins()))
            if before is not None:
                lo, hi = int(params.offsets[i]), int(params.offsets[i + 1])
                self._write(step, histogram(f"update/{p.name}",
                                            params.values[lo:hi] - before[lo:hi], _bins()))
        self._before = None

    def flush(self) -> None:
        """Write what is pending to disk (before a checkpoint: what it covers is then on
        disk)."""
        if self.enabled:
            self._do(self._writer.flush)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as e:
                raise path_error(e, self.path, "TensorBoard event file") from None

    def _write(self, step: int, summary: Any) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self._do(self._writer.write_event,
                 Event(wall_time=time.time(), step=int(step), summary=summary))

    def _do(self, write: Any, *args: Any) -> None:
        """A write of the event file, here in the training thread (not tensorboardX's writer
        thread, whose failures only print a traceback): a failure stops the run, named."""
        try:
            write(*args)
        except OSError as e:
            writer, self._writer = self._writer, None  # written no more
            with contextlib.suppress(OSError):
                writer.close()
            raise path_error(e, self.path, "TensorBoard event file") from None


def _open_writer(folder: Path, start: int) -> tuple[Any, Path]:
    """An event file of this run, its first events written: tensorboardX's writer of
    records, used directly (its SummaryWriter writes from a thread of its own)."""
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Event file names hold whole seconds; the suffix orders two runs of the same second.
        writer = EventsWriter(str(folder / "events"), f".{time.time_ns():020d}.{os.getpid()}")
        # A resumed run keeps what was written up to its checkpoint's step (everything at
        # that step was flushed before the checkpoint); a new run starts the curves afresh.
        purge = start + 1 if start > 0 else 0
        writer.write_event(Event(step=purge, wall_time=time.time(),
                                 session_log=SessionLog(status=SessionLog.START)))
    except OSError as e:
        raise path_error(e, folder, "TensorBoard folder") from None
    return writer, Path(writer._file_name)


@functools.cache
def _bins() -> list[float]:
    """TensorBoard's default histogram buckets (TensorFlow's): edges growing by 10% from
    1e-12 to 1e20, both signs, and 0."""
    edges = []
    v = 1e-12
    while v < 1e20:
        edges.append(v)
        v *= 1.1
    return [-e for e in reversed(edges)] + [0.0] + edges


__all__ = ["FOLDER", "TensorBoardLog"]
