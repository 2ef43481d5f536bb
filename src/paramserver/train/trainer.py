"""The main job: train a job file's net on the cluster (``paramserver train``), embedded or
on Ray (``--backend ray``).

The run is cut into chunks at every test, validation and checkpoint step; between chunks
every worker has stopped, so tests see one consistent model and a checkpoint is a consistent
cut of the servers (values, updater state, versions, step). Everything a step computes is a
function of (seed, step, worker), so a run resumed from a checkpoint continues exactly as if
it had not stopped.

Schedules are SINGA's: an event with frequency ``f`` and start ``a`` (``test_freq`` and
``test_after``; ``validate_*``, ``checkpoint_*``, ``disp_*``) happens after step ``s`` when
``f > 0``, ``s >= a`` and ``(s - a) % f == 0`` (:func:`due`), never at step 0; a test also
runs at the end. A SINGA job (:attr:`~paramserver.config.job.JobConf.singa_job`) keeps
SINGA's own test schedule: tests and validations at step 0 too, none added at the end.
Workers train the kTrain net; tests run the kTest net and validations the kVal net, built
from the same file and sharing the Params by name (SINGA's include/exclude).

A checkpoint is written at every checkpoint step, at the end of training, and when the run
is interrupted (Ctrl-C: the run stops at its next step boundary, writes one, and ends), so
that ``--resume`` always has the newest state. A SINGA job also writes SINGA's checkpoints
(``<workspace>/checkpoint/step<N>-worker0``) beside them, which ``checkpoint_path`` of a
later job loads, and ``--resume`` goes on from those too when they are the newest, as
SINGA's ``-resume`` did.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..checkpoint import (
    CheckpointError,
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    read_checkpoints,
    save_checkpoint,
)
from ..cluster import Cluster, RemoteGradFn, Worker, workers_share_process
from ..config import ParamError
from ..config.job import JobConf, unbuilt_error
from ..console import LOG_FORMATS, OutputClosed, on_output_closed
from ..export import TABLE, param_table
from ..faults import marker
from ..init import init_params
from ..params import ParamSet, physical_memory, plan_params
from ..paths import NoSpaceError
from ..singa import checkpoints as singa_checkpoints
from ..singa import logs as singa_logs
from ..singa.releases import job_release
from . import algorithms
from .layers.base import require_torch
from .metrics import MetricsLog, Row
from .misfit import misfit
from .net import Net
from .partition import Comm, group_exchange
from .progress import CompileNotice, Progress, Rate
from .tensorboard import FOLDER as TENSORBOARD_FOLDER
from .tensorboard import TensorBoardLog
from .workspace import (
    check_workspace,
    earlier_run,
    job_inputs,
    no_space,
    place_outputs,
    remove_earlier_run,
    remove_temporaries,
    set_aside,
    workspace_lock,
)

FORMAT = "paramserver-checkpoint/1"
#: The steps between two stops of a run where an interrupted run can write a checkpoint: its
#: display steps, at least this many apart...
MIN_CHUNK = 10
#: ... and at most this many.
MAX_CHUNK = 100
log = logging.getLogger(__name__)


def default_disp_freq(train_steps: int) -> int:
    """Steps between progress reports when the job leaves ``disp_freq`` at 0: a round
    number (1, 2 or 5 times a power of ten) giving 10 to 25 reports."""
    target = max(train_steps / 10, 1.0)
    power = 10 ** math.floor(math.log10(target))
    return int(max(m * power for m in (1, 2, 5) if m * power <= target))


@dataclass(frozen=True)
class TrainResult:
    """How a run ended: the step reached, the last test (if any), and where files are."""

    step: int
    test_loss: float | None
    test_accuracy: float | None
    seconds: float
    workspace: Path


class Trainer:
    """Builds the net, the Params and the cluster of a job, and trains it.

    Args:
        job: the job.
        progress: show the progress display (or, off a terminal, a line per display step).
        stream: where progress goes (default stderr). Messages (test results, checkpoints)
            go to the ``paramserver`` logger.
        base_dir: folder that relative data paths are read from (the job file's folder).
        cluster_options: keyword arguments of :class:`~paramserver.cluster.Cluster`
            (``max_restarts``; on Ray ``placement``, ``server_options``,
            ``worker_options``, ...).
        tensorboard: write TensorBoard event files into ``<workspace>/tensorboard``.
        allow_outside: let output layers (kCSVOutput, kRecordOutput) write where an absolute
            path says, outside the workspace (``--allow-outside``; see
            :func:`~paramserver.train.workspace.place_outputs`).

    Every worker builds its own kTrain Net from the job's configuration (sent as JSON, with
    the names of the modules that registered user components), in its thread or its Ray
    actor; the servers' own checkpoints (kept where servers can be lost and restarted: on
    Ray) are in ``<workspace>/checkpoints/servers``. :meth:`close` stops the actors.

    Attributes:
        nets: empty (every worker builds its own net).
        eval_net: the kTest and kVal nets (those the job runs), or None.
        params: the job's Params, initialised (and loaded from ``checkpoint_path``).
    """

    def __init__(self, job: JobConf, *, progress: bool = True, stream: TextIO | None = None,
                 base_dir: str | os.PathLike[str] | None = None,
                 cluster_options: Mapping[str, Any] | None = None, tensorboard: bool = True,
                 log_format: str = "paramserver", allow_outside: bool = False):
        self.job = job
        if log_format not in LOG_FORMATS:
            raise ParamError(f"Invalid Input: '{log_format}', valid values are: "
                             + "{" + ", ".join(repr(f) for f in LOG_FORMATS) + "}")
        self.log_format = log_format
        #: The SINGA release the job is written for: its checkpoints' names, its log lines.
        self.release = job_release(job)
        unbuilt = job.unbuilt()
        if unbuilt:
            raise unbuilt_error(unbuilt)
        require_torch()
        self.tensorboard = tensorboard
        self.workspace = check_workspace(job.workspace_dir)  # before anything is built
        place_outputs(job, self.workspace, allow_outside=allow_outside,
                      inputs=job_inputs(job, base_dir))  # before a net writes anything
        self.show = progress
        self.stream = stream
        self.eval_phases = job.eval_phases()
        self._base_versions: dict[str, int] = {}
        # Every worker builds its own Net from the job (here in a thread, or in a Ray
        # actor): the cluster's backend decides where workers run, nothing here.
        self.nets: list[Net] = []
        c = job.cluster
        try:
            net = Net(job.neuralnet, seed=job.seed, base_dir=base_dir, phases=("kTrain",))
            if job.train_steps > job.step:
                net.check_trainable(job.train_one_batch.alg)
            if c.nworkers_per_group > 1 and not workers_share_process(c):
                parted = net.partitioned_on_features()
                if parted:  # refused before any actor starts, not after a timeout
                    raise ParamError(
                        f"layers {', '.join(repr(n) for n in parted)} are partitioned on the "
                        "features (partition_dim 1): the workers of a group exchange their "
                        "parts in memory, in one process, and cluster.backend "
                        f"'{c.backend}' runs every worker in a process of its own; partition "
                        "them on the batch (partition_dim 0), or use the embedded backend")
            with CompileNotice():  # the initialisers' random fills, on a job's first run
                self.params = self._make_params(net)
            #: The types of the layers that report metrics, by phase (SINGA's log lines).
            self._reporting = {"kTrain": [x.type for x in net.reporting_layers("kTrain")]}
            folder = self.workspace / "checkpoints" / "servers"
            # The workers of a group that share this process exchange the parts of layers
            # partitioned on the features through this run's exchanges (partition.py).
            self._step_fn = RemoteGradFn(f"{__name__}:net_grad_fn", {
                "job": job.to_json(), "base_dir": os.path.abspath(base_dir or os.getcwd()),
                "run": uuid.uuid4().hex})
            options: dict[str, Any] = {"checkpoint_dir": folder}
            if c.backend == "ray" and job.train_steps > job.step:
                # Ray's workers build their nets (import torch: seconds) while the rest of
                # the cluster starts, not in the first steps.
                options["build_ahead"] = self._step_fn
            self.cluster = Cluster(job, self.params, **{**options, **dict(cluster_options or {})})
        except MemoryError:  # the Params fit, but not with a gradient per worker (or state)
            plan = plan_params(Net(job.neuralnet, seed=job.seed, base_dir=base_dir,
                                   phases=("kTrain",)).param_specs())
            raise ParamError(plan.too_big(np.float32, physical_memory()) + (
                f"; every worker ({c.nworker_groups * c.nworkers_per_group}) holds its own "
                "gradients, and the updater its state")) from None
        self.eval_net: Net | None = None
        if self.eval_phases:
            self.eval_net = Net(job.neuralnet, seed=job.seed, base_dir=base_dir,
                                phases=self.eval_phases, device=worker_device(job, 0))
            self._check_eval_params(self.eval_net)
            self.eval_net.bind(self.params)
            for phase in self.eval_phases:  # a split to evaluate on: refused now, not later
                self.eval_net.data_layer_of(phase).eval_batches(phase)
                self._reporting[phase] = [x.type for x in
                                          self.eval_net.reporting_layers(phase)]
        self.log = MetricsLog(self.workspace / "metrics.csv")
        self._window: list[dict[str, float]] = []  # train metrics since the last display row
        self._singa_window: list[dict[str, float]] = []  # ... since SINGA's last display
        self.disp_freq = job.disp_freq or default_disp_freq(job.train_steps)
        self._interrupted = threading.Event()
        #: Whether the run writes metrics.csv and its plot (a test-only run in a workspace
        #: holding an earlier run's keeps them); the step its test is labelled with.
        self._write_metrics = True
        self._tested_step = 0
        self._output_closed = False
        #: Seconds this object spent in training steps and in tests and validations.
        self.seconds = {"steps": 0.0, "tests": 0.0}

    def _make_params(self, net: Net) -> ParamSet:
        """The job's Params: initialised from the seed, then (``checkpoint_path``) loaded
        from SINGA checkpoints; records the versions SINGA checkpoints count from. The
        Params that the job's algorithm does not train (kCD: those below the RBM) are
        frozen: ``lr_scale`` and ``wd_scale`` 0 for the run."""
        job = self.job
        frozen = algorithms.frozen_params(net, job.train_one_batch)
        specs = []
        for spec in net.param_specs():
            if spec.name in frozen and spec.conf.share_from is None:
                conf = spec.conf.copy()
                conf.__dict__.update(lr_scale=0.0, wd_scale=0.0)
                spec = type(spec)(spec.name, spec.shape, conf, spec.place, spec.row_sparse)
            specs.append(spec)
        params = ParamSet(specs, tables=True)  # an embedding's table: rows by id (SPEC §10)
        init_params(params, self.job.seed)
        loaded = singa_checkpoints.load_checkpoints(params, job.checkpoint_path)
        self._base_versions = {
            p.name: (loaded[p.name] if p.name in loaded and not job.reset_param_version
                     else job.step) for p in params.owners}
        return params

    def _check_eval_params(self, net: Net) -> None:
        """Every Param of the test and validation nets must be one the training net has
        (by name): no training step would change any other."""
        problems = [f"Param '{s.name}' ({s.place}) is used in {', '.join(net.phases)} but no "
                    "layer of the kTrain net has it: no training step would change it (name "
                    "it as the training layer's Param, or give that layer to kTrain too)"
                    for s in net.param_specs() if s.name not in self.params]
        problems += [f"Param '{s.name}' ({s.place}) has shape {s.shape} but "
                     f"{self.params[s.name].shape} in the kTrain net"
                     for s in net.param_specs() if s.name in self.params
                     and self.params[s.name].shape != s.shape]
        if problems:
            raise ParamError(problems)

    def close(self) -> None:
        """Stop the cluster's actors (Ray backend; nothing to do embedded)."""
        close = getattr(self.cluster, "close", None)
        if close is not None:
            close()

    # -- the run ----------------------------------------------------------------------------

    def train(self, resume: bool = False, *, overwrite: bool = False,
              or_start: bool = False) -> TrainResult:
        """Train to ``job.train_steps``.

        Args:
            resume: go on from the newest checkpoint in the workspace that can be read (also
                the job's ``resume: true``), or from SINGA's ``step<N>-worker<M>`` files when
                they are newer; a damaged newer one is set aside with a warning. With
                nothing to resume from, refused, unless ``or_start``.
            overwrite: start afresh in a workspace that holds an earlier run's results,
                deleting them (its checkpoints, SINGA checkpoints, TensorBoard event files and
                metrics). Without it (or ``resume``) such a workspace is refused.
            or_start: with ``resume``, start from the job's ``step`` when the workspace holds
                nothing to resume from (a script that reruns a job until it ends).

        Raises:
            ParamError: the workspace holds an earlier run and neither ``resume`` nor
                ``overwrite`` is given, or another run holds the workspace.
            CheckpointError: ``resume`` and no checkpoint in the workspace (without
                ``or_start``) or none that can be read, or the newest readable one is not of
                this job.
            KeyboardInterrupt: Ctrl-C (SIGINT), after the checkpoint of the step the run
                stopped at is written (a second Ctrl-C stops at once, writing nothing).
            OutputClosed: the reader of stdout went away (``... | head``), after the
                checkpoint of the step the run stopped at is written.
        """
        resumed = resume or self.job.resume
        if resumed and overwrite:
            raise _exclusive(resume)
        if resumed and not or_start and not self.workspace.is_dir():
            raise self._nothing_to_resume()  # refused before the workspace is made
        with workspace_lock(self.workspace), self._stop_requests():
            return self._train(resumed, overwrite, or_start)

    @contextmanager
    def _stop_requests(self) -> Iterator[None]:
        """What asks the run to stop at its next step boundary and write a checkpoint
        there: Ctrl-C (:meth:`_sigint`), and a write to stdout that finds its reader gone
        (``paramserver train job.conf | grep -m1 "step 250"``; see console.write_line)."""
        self._interrupted.clear()
        self._output_closed = False

        def closed() -> None:
            if self._output_closed:
                return
            self._output_closed = True
            if not self._interrupted.is_set():
                self._interrupted.set()
                log.warning("stdout was closed (its reader went away): stopping at the next "
                            "step boundary to write a checkpoint")

        with on_output_closed(closed), self._sigint():
            yield

    @contextmanager
    def _sigint(self) -> Iterator[None]:
        """The first Ctrl-C asks the run to stop at its next step boundary and write a
        checkpoint there (said on stderr); a second one stops at once. Only where signals
        can be handled (the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self._interrupted.is_set():
                raise KeyboardInterrupt
            self._interrupted.set()
            log.warning("interrupted: stopping at the next step boundary to write a "
                        "checkpoint (Ctrl-C again to stop at once, without one)")

        before = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def _train(self, resumed: bool, overwrite: bool, or_start: bool) -> TrainResult:
        job = self.job
        t0 = time.perf_counter()
        if not job.train_steps and not resumed:  # SINGA's -test: tests, trains nothing
            start = self._test_only(overwrite)
        else:
            start = self._resume(or_start) if resumed else self._fresh(overwrite)  # or refused
        removed = remove_temporaries(self.workspace)  # held: no other run writes them
        if removed:
            log.info("removed %d temporary file(s) of an interrupted run: %s",
                     len(removed), ", ".join(str(p) for p in removed))
        if resumed and start >= job.train_steps and job.train_steps:
            # A resume with nothing to do changes nothing: no file is written again (only a
            # plot that a run killed at its very end did not write yet).
            log.info("nothing to do: the job is at step %d of %d", start, job.train_steps)
            if not (self.workspace / "metrics.png").exists():
                self._plot()
            return TrainResult(start, None, None, time.perf_counter() - t0, self.workspace)
        checkpoints = self._checkpoint_steps(start)
        try:  # a full disk stops the run, saying what it keeps (no_space)
            board = TensorBoardLog(self.workspace / TENSORBOARD_FOLDER, start, checkpoints,
                                   enabled=self.tensorboard and start < job.train_steps)
            shown = self.show and self.log_format == "paramserver"
            # Steps/s of the display, its log lines and TensorBoard: training steps only
            # (see progress.Rate), not the first one, nor those during which kernels compile.
            rate = Rate()
            with Progress(job.train_steps, start, self.stream, shown) as progress, board, \
                    torch_threads(job.num_openblas_threads), CompileNotice(rate):
                step, test = self._run(start, set(checkpoints), progress, board, rate,
                                       fresh=not (resumed and start > job.step))
            plot = None
            if self._write_metrics:
                self.log.write()
                plot = self._plot()
        except NoSpaceError as e:
            raise no_space(e, self.workspace) from None
        seconds = time.perf_counter() - t0
        files = [self.log.path if self._write_metrics else None, plot,  # this run's
                 board.folder if board.wrote else None]
        wrote = ", ".join(str(p) for p in files if p is not None)
        if not job.train_steps and not resumed:  # a test-only run: it trained no step
            log.info("done: tested step %d in %.1f s%s", self._tested_step, seconds,
                     f"; {wrote}" if wrote else "")
        else:
            ran = (f"{step} steps" if start == 0
                   else f"ran {step - start} steps ({start} → {step})")
            log.info("done: %s in %.1f s (training %.1f s, tests %.1f s)%s", ran, seconds,
                     self.seconds["steps"], self.seconds["tests"],
                     f"; {wrote}" if wrote else "")
        return TrainResult(step, None if test is None else test["loss"],
                           None if test is None else test["accuracy"], seconds,
                           self.workspace)

    def _plot(self) -> Path | None:
        """metrics.png, its learning rate drawn from the schedule itself."""
        return self.log.plot(self.workspace / "metrics.png", self.job.name,
                             lr=self.cluster.updater.lr)

    def run_steps(self, steps: int, start: int = 0) -> list[list[Mapping[str, Any] | None]]:
        """Run ``steps`` training steps from ``start`` on the cluster and nothing else: no
        evaluation, display, file or checkpoint (what ``benchmarks/train.py`` times).
        Returns each step's metrics by worker."""
        with torch_threads(self.job.num_openblas_threads):
            return self.cluster.run(self._step_fn, steps, start_step=start)

    def _run(self, start: int, checkpoints: set[int], progress: Progress,
             board: TensorBoardLog, rate: Rate, fresh: bool
             ) -> tuple[int, dict[str, float] | None]:
        job = self.job
        if start >= job.train_steps and job.train_steps:
            log.info("nothing to do: the job is at step %d of %d", start, job.train_steps)
        window = self._window
        last: dict[str, dict[str, float]] = {}
        rate.skip_next()  # the run's first step is its warm-up
        displayed = [False]

        def on_step(step: int, metrics: list[Mapping[str, Any] | None]) -> None:
            steps_per_s = rate.add()
            window.append(mean_metrics([m for m in metrics if m is not None]))
            if self.log_format == "singa":
                self._singa_display(step, window[-1])
            done = step + 1
            marker("step", done)
            shown = due(done, self.disp_freq, job.disp_after)
            if shown or done == job.train_steps:
                means = mean_metrics(window)
                loss, acc = means.pop("loss", math.nan), means.pop("accuracy", math.nan)
                lr = self.cluster.updater.lr(step)
                self.log.add(Row(done, "train", loss, acc, lr, means))
                progress.update(done, steps_per_s, (loss, acc, lr), force=True, extra=means)
                scalars = {"loss": loss, "accuracy": acc, "lr": lr, **means}
                if steps_per_s is not None:
                    scalars["steps_per_second"] = steps_per_s
                board.scalars("train", done, scalars)
                displayed[0] = True
                if shown:
                    window.clear()  # else kept: a resumed run goes on with the same window
            elif progress.tty:  # the last display window's means stay until the next one
                if displayed[0]:
                    progress.update(done, steps_per_s)
                else:  # before the first display step: the mean of the steps so far
                    means = mean_metrics(window)
                    progress.update(done, steps_per_s, (
                        means.pop("loss", math.nan), means.pop("accuracy", math.nan),
                        self.cluster.updater.lr(step)), extra=means)

        step = start
        if job.train_steps == 0 and start == 0:  # a job that only tests (-test): once
            self._evaluate(self._tested_step, True, last, progress, board)
            if self._write_metrics:
                self.log.write()
        elif job.singa_job and start < job.train_steps:
            # SINGA tests (and validates) before the first step, a resumed run's too; one
            # that the run before already made (before its checkpoint) is not made again.
            made = set() if fresh else {r.phase for r in self.log.rows if r.step == start}
            self._evaluate(start, False, last, progress, board, skip=made)
            self.log.write()
        events = set(self._boundaries(start, board.stops(start)))
        pauses = self._pauses(start)
        for stop in sorted(events):
            board.before_chunk(step, stop, self.params)
            t = time.perf_counter()
            rate.start()
            # Ends early at a pause when a stop was asked for (Ctrl-C, stdout closed).
            self.cluster.run(self._step_fn, stop - step, start_step=step, on_step=on_step,
                             pauses=pauses, stop=self._interrupted.is_set)
            self.seconds["steps"] += time.perf_counter() - t
            step = self.cluster.step
            stopped = self._interrupted.is_set() and step < job.train_steps
            if step not in events and not stopped:
                continue  # cannot be: a run ends early only when asked to stop
            self._evaluate(step, step == job.train_steps, last, progress, board)
            self.log.write()
            if step in checkpoints or stopped:
                board.histograms(step, self.params)
                board.flush()  # what the checkpoint covers is on disk before it
                path = self.save(step)
                log.info("step %d: checkpoint %s", step, path)
            if stopped:  # the plot of the steps so far too: what the user stopped to look at
                self._plot()
                log.warning("%s at step %d of %d: --resume goes on from there",
                            "stopped" if self._output_closed else "interrupted", step,
                            job.train_steps)
                if self._output_closed:
                    raise OutputClosed(f"stdout closed; stopped at step {step}")
                raise KeyboardInterrupt
        return step, last.get("kTest")

    def _evaluate(self, step: int, final: bool, last: dict[str, dict[str, float]],
                  progress: Progress, board: TensorBoardLog,
                  skip: set[str] | frozenset[str] = frozenset()) -> None:
        """The validation and the test due after ``step`` (the test also at the end, but in
        a SINGA job), each a row of metrics.csv and a TensorBoard scalar. A SINGA job,
        whose worker stops before its last step's tests, neither tests nor validates after
        the last step; a run that trains nothing tests once. Each reads on in its store
        from where the one before it in the run stopped (:meth:`Net.evaluate`'s
        ``index``: the evaluations of the phase due from the job's first step on). The
        rows of ``skip`` (``test``, ``val``) are not made."""
        job = self.job
        lr = self.cluster.updater.lr(max(step - 1, 0))
        singa = job.singa_job
        when = singa_due if singa else due
        ended = job.train_steps > 0 and step >= job.train_steps
        for phase, row, freq, after, steps in (
                ("kVal", "val", job.validate_freq, job.validate_after, job.validate_steps),
                ("kTest", "test", job.test_freq, job.test_after, job.test_steps)):
            if phase not in self.eval_phases or row in skip:
                continue
            if not job.train_steps:  # a run that only tests (-test): one test, from the start
                if phase != "kTest":
                    continue
                index = 0
            elif (when(step, freq, after) and not (singa and ended)) or (
                    final and phase == "kTest" and not singa):
                index = events_before(step, freq, after, job.step, at_zero=singa)
            else:
                continue
            net = self.eval_net
            assert net is not None
            progress.set_phase(row)
            t = time.perf_counter()
            result = net.evaluate(steps=steps, phase=phase, index=index)
            seconds = time.perf_counter() - t
            self.seconds["tests"] += seconds
            progress.set_phase("train")
            loss, acc = result.get("loss", math.nan), result.get("accuracy", math.nan)
            last[phase] = {**result, "loss": loss, "accuracy": acc}
            extra = {k: v for k, v in result.items() if k not in ("loss", "accuracy")}
            batches = net.eval_count(phase, steps=steps)
            self.log.add(Row(step, row, loss, acc, lr, extra))
            board.scalars(row, step, {"loss": loss, "accuracy": acc, "lr": lr, **extra,
                                      "steps_per_second": batches / max(seconds, 1e-9)})
            what = "validation" if row == "val" else "test"
            if self.log_format == "singa":
                for line in singa_logs.eval_lines(
                        self.release, phase, step, self._reporting[phase], result,
                        bptt=job.train_one_batch.alg == "kBPTT", alone=not job.train_steps):
                    log.info("%s", line)
                continue
            log.info("step %d: %s %s", step, what, ", ".join(
                f"{k} {100 * v:.2f}%" if k == "accuracy" else f"{k} {v:.4f}"
                for k, v in result.items() if not math.isnan(v))
                or f"{batches} batches, no metrics")

    def _singa_display(self, step: int, metrics: dict[str, float]) -> None:
        """SINGA's lines of a display window (``--log-format singa``): after training
        (0-based) step ``step`` when SINGA's ``DisplayNow(step)`` (its first step too), the
        mean of the steps since the last one, labelled ``step``
        (:mod:`paramserver.singa.logs`)."""
        self._singa_window.append(metrics)
        if singa_due(step, self.disp_freq, self.job.disp_after):
            for line in singa_logs.train_lines(
                    self.release, step, self._reporting["kTrain"],
                    mean_metrics(self._singa_window),
                    bptt=self.job.train_one_batch.alg == "kBPTT"):
                log.info("%s", line)
            self._singa_window.clear()

    def _checkpoint_steps(self, start: int) -> list[int]:
        """The steps after ``start`` that write a checkpoint: the job's, and the end."""
        job = self.job
        return [s for s in self._boundaries(start) if due(s, job.checkpoint_freq,
                job.checkpoint_after) or s == job.train_steps]

    def _pauses(self, start: int) -> set[int]:
        """Where an interrupted run (Ctrl-C) may also stop, to write a checkpoint there:
        every display step, at least :data:`MIN_CHUNK` and at most :data:`MAX_CHUNK` steps
        apart (where the workers cannot end a run as they go, the cluster stops them at
        each, which costs every worker a pause; a compiled Ray graph does not stop)."""
        every = min(max(self.disp_freq, MIN_CHUNK), MAX_CHUNK)
        return {s for s in range(every, self.job.train_steps, every) if s > start}

    def _boundaries(self, start: int, extra: set[int] | frozenset[int] = frozenset()
                    ) -> list[int]:
        """Where the run stops between chunks: its events (tests, validations,
        checkpoints, the end) and ``extra``."""
        job = self.job
        stops = {job.train_steps, *extra}
        for freq, after in ((job.test_freq, job.test_after),
                            (job.validate_freq, job.validate_after),
                            (job.checkpoint_freq, job.checkpoint_after)):
            if freq:
                first = after if after > 0 else freq
                stops.update(range(first, job.train_steps, freq))
        return sorted(s for s in stops if s > start)

    # -- checkpoints ------------------------------------------------------------------------

    def _layout(self) -> list[list[Any]]:
        return [[p.name, p.size] for p in self.params.owners]

    def save(self, step: int) -> Path:
        """Write the checkpoint of ``step`` into ``<workspace>/checkpoints``, then in a SINGA
        job SINGA's (:meth:`save_singa`). A SINGA checkpoint newer than every one of ours
        is therefore not ours (``--resume`` goes on from it); one of ours that a kill left
        without SINGA's beside it gets it when the run resumes from it."""
        meta = {"format": FORMAT, "job": self.job.name, "step": step,
                "params": self._layout(), "dtype": self.params.dtype.name,
                "window": self._window, TABLE: param_table(self.params),
                "job_conf": self.job.to_dict()}
        path = save_checkpoint(self.workspace / "checkpoints" / checkpoint_name(step),
                               self.cluster.state_dict(), meta)
        if self.job.singa_job:
            self.save_singa(step)
        return path

    def save_singa(self, step: int) -> Path:
        """Write SINGA's checkpoint of ``step``: ``<workspace>/checkpoint/step<N>-worker0``,
        every owner Param's name (as the job's SINGA release names it: ``0#w1``, or v0.1.0's
        ``w1``), version and values (float32)."""
        path = (self.workspace / singa_checkpoints.FOLDER
                / singa_checkpoints.checkpoint_file_name(step))
        return singa_checkpoints.write_checkpoint(path, [
            (singa_checkpoints.stored_name(p.name, self.release), p.data,
             self._base_versions.get(p.name, 0) + p.version) for p in self.params.owners])

    def _fresh(self, overwrite: bool) -> int:
        """A new run from the job's ``step`` (0 unless given). An earlier run's results in
        the workspace are refused, or with ``overwrite`` deleted (so that a later
        ``--resume`` cannot pick up one of its checkpoints)."""
        job = self.job
        earlier = earlier_run(self.workspace, training=job.train_steps > job.step)
        if earlier.files and not overwrite:
            raise _earlier_error(self.workspace, earlier)
        removed = remove_earlier_run(earlier, keep=job.checkpoint_path, workspace=self.workspace)
        if removed.files:
            log.warning("--overwrite: deleted the earlier run's %s",
                        removed.describe(self.workspace))
        self.log.rows = []
        return job.step

    def _test_only(self, overwrite: bool) -> int:
        """A run that trains nothing (SINGA's ``-test``; ``train_steps: 0``) tests the
        Params ``checkpoint_path`` gives, as SINGA's did; without one, in a workspace that
        holds checkpoints, the newest that can be read (paramserver's, or SINGA's when
        newer), its step labelling the test. In a workspace that holds an earlier run's
        results it writes none of its own over them: its test is printed and metrics.csv
        and the plot are kept (unless ``overwrite``)."""
        job = self.job
        earlier = earlier_run(self.workspace, training=False)
        if earlier.files and not overwrite:
            self._write_metrics = False
            log.info("test only: %s of the earlier run in %s kept (the test is not written "
                     "into it)", earlier.describe(self.workspace), self.workspace)
        else:
            self._fresh(overwrite)
        if job.checkpoint_path:
            return 0
        singa = singa_checkpoints.newest_checkpoint(self.workspace / singa_checkpoints.FOLDER)
        ours = next(((path, read) for path, read in read_checkpoints(
            self.workspace / "checkpoints") if not isinstance(read, CheckpointError)), None)
        if ours is not None and (singa is None or ours[1][1].get("step", 0) >= singa[0]):
            self._restore(ours[0], *ours[1])
            self._tested_step, path = self.cluster.step, ours[0]
        elif singa is not None:
            singa_checkpoints.load_checkpoints(self.params, singa[1], "the workspace's")
            self._tested_step, path = singa[0], singa[1][0]
        else:
            return 0
        log.info("testing %s (step %d)", path, self._tested_step)
        return 0

    def _nothing_to_resume(self) -> CheckpointError:
        return _nothing_to_resume(self.job, self.workspace)

    def _resume(self, or_start: bool) -> int:
        """Restore the newest checkpoint that can be read; the damaged ones after it are
        set aside (renamed, kept) with a warning naming each. SINGA's newer checkpoint: its
        values. None at all: refused, or with ``or_start`` the job's ``step``; only
        unreadable ones: refused, naming every file."""
        folder = self.workspace / "checkpoints"
        refused: list[tuple[Path, CheckpointError]] = []
        singa = singa_checkpoints.newest_checkpoint(self.workspace / singa_checkpoints.FOLDER)
        ours = [step for step, _ in list_checkpoints(folder)]
        if singa is not None and ours and singa[0] <= max(ours):
            singa = None  # written with one of ours (damaged or not): ours resume exactly
        for path, read in read_checkpoints(folder):
            if singa is not None:
                break  # SINGA's is newer than any of ours: resumed from below
            if isinstance(read, CheckpointError):
                refused.append((path, read))
                continue
            self._restore(path, *read)  # one of another job is refused, not passed over
            break
        else:
            if refused and singa is None:
                raise CheckpointError([
                    f"cannot resume: none of the {len(refused)} checkpoint(s) in {folder} can "
                    "be read (move them away to resume from the start, or give --overwrite "
                    "to start afresh, deleting the earlier run's files)",
                    *(str(e) for _, e in refused)])
            if singa is None:
                if not or_start:
                    raise self._nothing_to_resume()
                log.info("no checkpoint in %s: starting from step %d (--resume-or-start)",
                         folder, self.job.step)
                self.log.rows = []
                return self.job.step
        if singa is not None:
            path = self._restore_singa(*singa)
        step = self.cluster.step
        job = self.job
        if job.singa_job and not (self.workspace / singa_checkpoints.FOLDER /
                                  singa_checkpoints.checkpoint_file_name(step)).exists():
            self.save_singa(step)  # killed between ours and SINGA's: as a straight run has
        # Keep every row up to this step, as TensorBoard keeps its events: those of a run
        # that ended here too (its last train row and its final test, which a straight run
        # would not have made), since they happened; the rows after it, of a run killed
        # after its checkpoint, are the steps this run does again.
        self.log.resume_at(step, lambda r: True)
        for bad, error in refused:  # the resume stands: out of the way of the new ones
            kept = set_aside(bad)
            log.warning("%s; resuming from %s instead%s", error, path.name,
                        f" (the damaged file is kept as {kept.name})" if kept != bad else "")
        log.info("resuming from %s (step %d)", path, step)
        return step

    def _restore_singa(self, step: int, files: list[Path]) -> Path:
        """Go on from SINGA's checkpoint of ``step`` (every worker's file), as SINGA's
        ``-resume`` does: its Params' values and versions; the updater's state (momentum,
        histories), which SINGA's files do not hold, starts afresh, with a warning."""
        versions = singa_checkpoints.load_checkpoints(self.params, files, "--resume")
        self._base_versions.update(versions)
        self.cluster.step = step  # the servers take the values at the first step (a put)
        self._window.clear()
        log.warning("resuming from SINGA's checkpoint of step %d (%s): it holds the values "
                    "but not the updater's state, which starts afresh (paramserver's own "
                    "checkpoints resume exactly)", step, ", ".join(p.name for p in files))
        return files[0]

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint of this job; refused whole if it does not fit."""
        arrays, meta = load_checkpoint(path)
        self._restore(path, arrays, meta)

    def _restore(self, path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                 meta: dict[str, Any]) -> None:
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a paramserver training checkpoint")
        layout, dtype = self._layout(), self.params.dtype.name
        if meta.get("params") != layout or meta.get("dtype") != dtype:
            raise CheckpointError(misfit(path, meta, self.job, layout, dtype))
        window = meta.get("window", [])
        try:
            self.cluster.load_state_dict(arrays)
            # (loss, accuracy) pairs in checkpoints of earlier releases
            self._window[:] = [{k: float(v) for k, v in (
                w.items() if isinstance(w, dict) else zip(("loss", "accuracy"), w))}
                for w in window]
        except CheckpointError:
            raise
        except ParamError as e:  # the state does not fit: what changed, in one sentence
            raise CheckpointError(misfit(path, meta, self.job, layout, dtype,
                                         [str(p) for p in e.problems])) from None
        except Exception as e:
            raise CheckpointError(f"{path}: {e}") from None


def check_start(job: JobConf, *, resume: bool = False, overwrite: bool = False,
                or_start: bool = False) -> None:
    """The refusals of :meth:`Trainer.train` that need nothing built, raised before any
    net, Param or actor is made (the command asks first: a ``--resume`` with nothing to
    resume starts no Ray actor, and writes nothing). :meth:`Trainer.train` asks again,
    holding the workspace."""
    workspace = check_workspace(job.workspace_dir)
    resumed = resume or job.resume
    if resumed and overwrite:
        raise _exclusive(resume)
    if resumed:
        if not or_start and not list_checkpoints(workspace / "checkpoints") and (
                singa_checkpoints.newest_checkpoint(workspace / singa_checkpoints.FOLDER)
                is None):
            raise _nothing_to_resume(job, workspace)
    elif not job.train_steps:
        return  # a test-only run (SINGA's -test) keeps an earlier run's files: _test_only
    elif not overwrite:
        earlier = earlier_run(workspace, training=job.train_steps > job.step)
        if earlier.files:
            raise _earlier_error(workspace, earlier)


def _exclusive(resume: bool) -> ParamError:
    return ParamError("--resume and --overwrite exclude each other: resume the run in the "
                      "workspace, or overwrite it" + (
                          " (the job file sets resume: true)" if not resume else ""))


def _earlier_error(workspace: Path, earlier: Any) -> ParamError:
    return ParamError(f"workspace {workspace} holds the results of an earlier run "
                      f"({earlier.describe(workspace)}): give --resume to go on from its "
                      "newest checkpoint, or --overwrite to start afresh (deleting them), or "
                      "another --workspace")


def _nothing_to_resume(job: JobConf, workspace: Path) -> CheckpointError:
    folder = workspace / "checkpoints"
    return CheckpointError(
        f"cannot resume: no checkpoint in {folder}"
        + (f" nor SINGA's in {workspace / singa_checkpoints.FOLDER}" if job.singa_job else "")
        + (" (the job file sets resume: true)" if job.resume else "")
        + ": train without --resume to start the job, or give --resume-or-start to "
        "start from the beginning when there is nothing to resume")


def due(step: int, freq: int, after: int) -> bool:
    """Whether an event of frequency ``freq`` from step ``after`` happens after ``step``
    steps: SINGA's rule (never when ``freq`` is 0), never at step 0."""
    return freq > 0 and step > 0 and step >= after and (step - after) % freq == 0


def singa_due(step: int, freq: int, after: int) -> bool:
    """SINGA's own test and validation schedule (``Worker::TestNow``), step 0 included."""
    return freq > 0 and step >= after and (step - after) % freq == 0


def events_before(step: int, freq: int, after: int, start: int, *, at_zero: bool) -> int:
    """How many steps ``s`` with ``start <= s < step`` an event of frequency ``freq`` from
    step ``after`` happens at (:func:`due`, or with ``at_zero`` :func:`singa_due`)."""
    if freq <= 0:
        return 0
    low = max(start, after, 0 if at_zero else 1)
    first = low + (after - low) % freq
    return 0 if first >= step else (step - 1 - first) // freq + 1


def mean_metrics(metrics: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The mean of each metric over ``metrics`` (workers, or the steps of a window), in the
    order the names first appear; NaN where none has it."""
    names = list(dict.fromkeys(k for m in metrics for k in m))
    out = {}
    for name in names:
        values = [float(m[name]) for m in metrics if name in m]
        out[name] = float(np.mean(values)) if values else math.nan
    return out


def _train_step(net: Net, job: JobConf, worker: Worker, step: int) -> Mapping[str, Any]:
    """One worker's step: its shard of the step's batch, and its gradients by the job's
    algorithm (:mod:`paramserver.train.algorithms`)."""
    c = job.cluster
    # Groups read different data: group g takes batch step * G + g of the data order.
    batch = net.batch(step * c.nworker_groups + worker.group, rank=worker.index,
                      num_workers=c.nworkers_per_group)
    return algorithms.train_step(net, job.train_one_batch, batch,
                                 net.step_rng(step, worker.rank))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``n`` (``num_openblas_threads``) for a run, and
    put back after. Tiny layers run fastest on one thread (a parallel region costs more
    than their arithmetic, and much more when other processes load the cores)."""
    torch = require_torch()
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


_warned_gpu: set[str] = set()


def worker_device(job: JobConf, rank: int) -> str | None:
    """The torch device worker ``rank`` computes on: ``cuda:<id>`` of the job's ``gpu``
    list (SINGA's: one id per worker, in turn) when torch sees that GPU, else None (the
    CPU, with a warning once)."""
    if not job.gpu:
        return None
    torch = require_torch()
    gpu = int(job.gpu[rank % len(job.gpu)])
    if torch.cuda.is_available() and gpu < torch.cuda.device_count():
        return f"cuda:{gpu}"
    why = ("torch sees no GPU" if not torch.cuda.is_available()
           else f"torch sees {torch.cuda.device_count()} GPU(s)")
    message = f"the job asks for GPU {gpu} (gpu) but {why}: computing on the CPU"
    if message not in _warned_gpu:
        _warned_gpu.add(message)
        log.warning("%s", message)
    return None


def net_grad_fn(job: str, base_dir: str | None = None, run: str = ""
                ) -> Callable[[Worker, int], Any]:
    """The gradient function of a worker (in its thread, or its Ray actor): its own Net,
    built from the job's JSON (:class:`~paramserver.cluster.gradfn.RemoteGradFn` data) on
    the first step — on the worker's device (the job's ``gpu``), joined to the other
    workers of its group for layers partitioned on the features (the exchange of run
    ``run`` in this process) — and bound to the worker's replica."""
    conf = JobConf.parse(json.loads(job))
    require_torch().set_num_threads(int(conf.num_openblas_threads))  # an actor's process
    made: list[Net] = []
    bound: list[ParamSet] = []

    def grad_fn(worker: Worker, step: int) -> Mapping[str, Any]:
        if not made:
            size = conf.cluster.nworkers_per_group
            comm = Comm(worker.index, size, group_exchange(
                f"{run}/{worker.group}", size, conf.cluster.timeout))
            made.append(Net(conf.neuralnet, seed=conf.seed, base_dir=base_dir,
                            phases=("kTrain",), device=worker_device(conf, worker.rank),
                            comm=comm))
        net = made[0]
        if not bound or bound[0] is not worker.params:
            net.bind(worker.params)
            bound[:] = [worker.params]
        return _train_step(net, conf, worker, step)

    return grad_fn


__all__ = ["LOG_FORMATS", "TrainResult", "Trainer", "check_start", "due", "events_before",
           "mean_metrics", "net_grad_fn", "singa_due", "worker_device"]
