"""The embedded backend: servers and workers in this process, workers as threads.

Server group 0 holds the ParamSet's own values (``params.values`` is the model, updated in
place); every further server group holds a copy. Each worker has a replica of the ParamSet
viewing its server group's values, with gradients of its own, and talks to the servers
through a :class:`~paramserver.cluster.transport.LocalTransport`: the servers work on the
workers' memory, nothing is copied. A worker's steps run :func:`~.driver.work` in a thread
of its own; an exception that ends the thread otherwise (``SystemExit``) is the worker's
death, as a crashed process is on Ray.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config.job import ClusterConf
from ..params import ParamSet
from ..updaters import Updater
from .driver import DEAD, ENDED, Outcome, Pauses, server_folder, work
from .errors import ClusterError
from .gradfn import GradFnCache
from .keys import KeyServer, updater_text
from .layout import ServerLayout
from .messages import Address
from .server import Server
from .transport import Handler, LocalTransport, Transport
from .worker import Worker


class LocalBackend:
    """Servers and worker threads in this process; see the module docstring.

    Args:
        conf, params, layouts, updater: the cluster's.
        checkpoint_dir: the folder of the servers' own checkpoints (None: they keep none).
        transport: makes the transport from the servers (default :class:`LocalTransport`);
            the seam for tests.
        keys: the servers of a key-value store (:class:`~.keys.KeyServer`, one per layout
            of group 0; ``updater`` None: none) instead of ranges of ``params``.
    """

    default_restarts = 0  # a server in this process is lost only with the process
    one_process = True  # the workers of a group share this process (and its memory)

    def __init__(self, conf: ClusterConf, params: ParamSet, layouts: Sequence[ServerLayout],
                 updater: Updater | None, checkpoint_dir: Path | None = None,
                 transport: Callable[[Mapping[Address, Handler]], Transport] | None = None,
                 keys: bool = False):
        self.conf = conf
        self.updater = updater
        self.checkpoint_dir = checkpoint_dir
        self._values = [params.values] + [params.values.copy()
                                          for _ in range(1, conf.nserver_groups)]
        self.servers: dict[Address, Any] = {
            (g, L.index): KeyServer(L.index, conf, updater_text(updater)) if keys
            else self._server(L, g) for g in range(conf.nserver_groups) for L in layouts}
        self.transport: Transport = (transport or LocalTransport)(self.servers)
        for server in self.servers.values():
            server.connect(self.transport.send)
        self.workers = [
            Worker(g, i, params.replica(self._values[g % conf.nserver_groups]), layouts,
                   self.transport, conf)
            for g in range(conf.nworker_groups) for i in range(conf.nworkers_per_group)]
        self.local_workers: Sequence[Worker] = self.workers
        self._fns = [GradFnCache() for _ in self.workers]
        self._threads: list[threading.Thread] = []
        self._restarted: list[Address] = []

    def _server(self, layout: ServerLayout, group: int) -> Server:
        assert self.updater is not None
        return Server(layout, self.updater, self.conf, group,
                      server_folder(self.checkpoint_dir, (group, layout.index)))

    def values_of(self, group: int) -> np.ndarray:
        return self._values[group]

    def prepare(self, grad_fn: Any) -> Any:
        return grad_fn

    #: the workers run their steps on their own (the driver cuts a run where it may stop)
    halts = False

    def start(self, ranks: Sequence[int], fn: Any, first: int, last: int,
              deliver: Callable[[Outcome], None], halt: Pauses | None = None) -> None:
        assert halt is None, "the embedded workers run their part to its end"
        self._threads = [threading.Thread(
            target=self._work, args=(self.workers[r], fn, first, last, deliver), daemon=True,
            name=f"paramserver-worker-{self.workers[r].group}.{self.workers[r].index}")
            for r in ranks]
        for t in self._threads:
            t.start()

    def _work(self, worker: Worker, fn: Any, first: int, last: int,
              deliver: Callable[[Outcome], None]) -> None:
        try:
            grad_fn = self._fns[worker.rank].get(fn)
            for outcome in work(worker, grad_fn, first, last):
                deliver(outcome)
        except BaseException as e:  # the thread ends otherwise: the worker died
            deliver(Outcome(worker.rank, worker.step, DEAD, cause=e, message=(
                f"{worker.name} (rank {worker.rank}) died at step {worker.step}: its thread "
                f"ended ({type(e).__name__}: {e})")))
        finally:
            deliver(Outcome(worker.rank, worker.step, ENDED))

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def busy(self) -> list[str]:
        return [t.name for t in self._threads if t.is_alive()]

    def replace_workers(self, ranks: Sequence[int]) -> bool:
        """Embedded workers are threads of this process: none is lost but with it."""
        return False

    def revive(self) -> list[Address]:
        restarted, self._restarted = self._restarted, []
        return restarted

    def kill_server(self, address: Address) -> None:
        """Replace a server by a fresh one, as a restarted process would be: no values, no
        state; requests that waited on the old one hear that it was lost."""
        old = self.servers[address]
        if not isinstance(old, Server):
            raise ClusterError("a key-value store's servers are not restarted")
        new = self._server(old.layout, old.group)
        new.values = old.values  # the same memory (workers view it), to restore into:
        new.abort(f"{new.name} was restarted and waits for its checkpoint")  # until then
        new.connect(self.transport.send)
        self.servers[address] = new
        if isinstance(self.transport, LocalTransport):
            self.transport.servers[address] = new
        self._restarted.append(address)
        old.abort(f"{old.name} was lost", lost=True)

    def close(self) -> None:
        pass


__all__ = ["LocalBackend"]
