"""TensorBoard event files of a training run, in ``<workspace>/tensorboard``.

Scalars per phase: ``train/loss``, ``train/accuracy``, ``train/lr``,
``train/steps_per_second`` and the net's own metrics (rnnlm's ``train/ppl``) at every display
step (the same window as ``metrics.csv``); ``test/...`` and ``val/...`` at every test and
validation. A metric the net does not compute (an RBM's accuracy: NaN) is not written. At
every checkpoint, histograms of each owner Param's values (``values/<name>``) and of its
last update (``update/<name>``: the values after the checkpoint's step less those before it).

Events are written in order, as they happen, by the training thread itself (the records are
tensorboardX's; tensorboardX's own writer queues them for a thread of its own, so that a
"flush" left queued events unwritten). :meth:`TensorBoardLog.flush` puts every event so far
on disk (``fsync``) — the trainer calls it before each checkpoint, so that a checkpoint on
disk means every event of its steps is too.

A resumed run appends a new event file to the same folder and tells TensorBoard, with a
*purge* event, to drop what an earlier run wrote after the checkpoint resumed from, so no
step shows twice; a new run purges from step 0 (the earlier run's files stay, hidden). A run
killed while it wrote an event leaves that record cut short at the end of its file: the next
run in the workspace cuts it off (:func:`repair`), so that TensorBoard reads the file to its
end. The file is opened at the first event: a run refused or failed before it wrote any
leaves no event file behind. A write that fails (a full disk) stops the run with one message
naming the event file (:func:`paramserver.paths.path_error`), where tensorboardX's own writer
thread would print a traceback and go on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..params import ParamSet
from ..paths import path_error

log = logging.getLogger(__name__)

FOLDER = "tensorboard"
#: How TensorBoard recognises an event file by its name.
EVENTS = "events.out.tfevents."


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
        self.start = start
        self.histogram_steps = set(histogram_steps)
        self._before: tuple[int, np.ndarray] | None = None
        self._api: Any = _tensorboardx() if enabled else None
        self._writer: Any = None
        #: Whether this run wrote an event (what its ``done:`` line may name).
        self.wrote = False

    @property
    def enabled(self) -> bool:
        return self._api is not None

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
        """``<phase>/<name>`` of every entry of ``values`` at ``step`` (NaN ones left out: a
        metric not computed)."""
        if not self.enabled:
            return
        summary = self._api.Summary(value=[
            self._api.scalar(f"{phase}/{name}", float(value)).value[0]
            for name, value in values.items() if not math.isnan(value)])
        if summary.value:
            self._write(step, summary)

    def histograms(self, step: int, params: ParamSet) -> None:
        """Histograms of every owner's values, and of its last update when known."""
        if not self.enabled or step not in self.histogram_steps:
            return
        before = self._before[1] if self._before and self._before[0] == step else None
        for i, p in enumerate(params.owners):
            if p.size == 0:
                continue
            self._histogram(f"values/{p.name}", p.data.reshape(-1), step)
            if before is not None:
                lo, hi = int(params.offsets[i]), int(params.offsets[i + 1])
                self._histogram(f"update/{p.name}", params.values[lo:hi] - before[lo:hi],
                                step)
        self._before = None

    def _histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        finite = values[np.isfinite(values)]  # TensorBoard's bins hold numbers only
        if finite.size:
            self._write(step, self._api.histogram(tag, finite.astype(np.float64),
                                                  self._api.bins))

    def _write(self, step: int, summary: Any) -> None:
        if self._writer is None:
            self._writer = self._open()
        self.wrote = True
        self._do(self._writer.write_event,
                 self._api.Event(wall_time=time.time(), step=int(step), summary=summary))

    def _do(self, write: Any, *args: Any) -> None:
        """A write of the event file: a failure stops the run, the file named, and nothing
        more is written to it."""
        try:
            write(*args)
        except OSError as e:
            writer, self._writer = self._writer, None
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.close()
            self._api = None  # written no more
            raise path_error(e, self._path(writer), "TensorBoard event file") from None

    def _path(self, writer: Any) -> Path:
        name = getattr(writer, "_file_name", None)
        return Path(name) if name else self.folder

    def _open(self) -> Any:
        try:
            return self._open_file()
        except OSError as e:
            self._api = None
            raise path_error(e, self.folder, "TensorBoard folder") from None

    def _open_file(self) -> Any:
        self.folder.mkdir(parents=True, exist_ok=True)
        for path, cut in repair(self.folder):
            log.warning("%s: cut off a TensorBoard event cut short at byte %d (the run "
                        "that wrote it was killed)", path, cut)
        # Event file names hold whole seconds; the suffix orders two runs of the same second.
        suffix = f".{time.time_ns():020d}.{os.getpid()}"
        writer = self._api.EventsWriter(str(self.folder / "events"), suffix)
        # A resumed run keeps what was written up to its checkpoint's step (everything at
        # that step was on disk before the checkpoint); a new run starts the curves afresh.
        purge = self.start + 1 if self.start > 0 else 0
        api = self._api
        writer.write_event(api.Event(step=purge, wall_time=time.time(),
                                     session_log=api.SessionLog(status=api.SessionLog.START)))
        return writer

    def flush(self) -> None:
        """Put every event written so far on disk (before a checkpoint: what it covers)."""
        if self._writer is not None:
            self._do(self._writer.flush)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as e:
                raise path_error(e, self._path(writer), "TensorBoard event file") from None


class _Api:
    """What is used of tensorboardX: its event and summary messages, its histogram bins
    (TensorBoard's own), and its synchronous event writer (one record at a time, written
    and checksummed with crc32c; ``flush`` syncs the file)."""

    def __init__(self) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import histogram, scalar

        self.EventsWriter, self.Event, self.SessionLog, self.Summary = (
            EventsWriter, Event, SessionLog, Summary)
        self.scalar, self.histogram = scalar, histogram
        # TensorBoard's default bins (tensorboardX's SummaryWriter makes the same): powers
        # of 1.1 from 1e-12 to 1e20, both signs, and 0.
        v, edges = 1e-12, []
        while v < 1e20:
            edges.append(v)
            v *= 1.1
        self.bins = [-e for e in reversed(edges)] + [0.0] + edges


def _tensorboardx() -> _Api | None:
    try:
        return _Api()
    except ImportError:
        log.warning("no TensorBoard event files: install tensorboardX "
                    "(pip install tensorboardX) or use --no-tensorboard")
        return None


_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def _masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset."""
    import crc32c

    x = crc32c.crc32c(data) & 0xFFFFFFFF
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records_end(data: bytes) -> int:
    """Where the whole, checksummed records of an event file's bytes end (TensorBoard's
    record format: length, its checksum, the bytes, their checksum)."""
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, length_crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length + _FOOTER.size
        if _masked_crc(data[pos:pos + 8]) != length_crc or end > len(data):
            break
        body = data[pos + _HEADER.size:end - _FOOTER.size]
        if _masked_crc(body) != _FOOTER.unpack_from(data, end - _FOOTER.size)[0]:
            break
        pos = end
    return pos


def repair(folder: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Cut off the record a killed run left cut short at the end of an event file of
    ``folder`` (a torn write: what follows the last whole record is not one), so that
    TensorBoard reads the file to its end and goes on to the next. A file damaged before
    its last record is left as it is. Returns each file cut and where."""
    cut = []
    for path in sorted(Path(folder).glob(EVENTS + "*")):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        end = records_end(data)
        if end == len(data) or _whole_record_after(data, end):
            continue
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        cut.append((path, end))
    return cut


def _whole_record_after(data: bytes, pos: int) -> bool:
    """Whether a whole record could follow ``pos`` (a damaged record in the middle, not a
    torn last one): its length fits in what is left after it."""
    if pos + _HEADER.size > len(data):
        return False
    length = _HEADER.unpack_from(data, pos)[0]
    return pos + _HEADER.size + length + _FOOTER.size < len(data)


__all__ = ["EVENTS", "FOLDER", "TensorBoardLog", "records_end", "repair"]
