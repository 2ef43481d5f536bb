"""The actors of the Ray backend: a server and a worker, around the embedded code.

Both are built from plain data (:mod:`paramserver.cluster.ray_wire`): the configurations as
their declarations' JSON, the server ranges and Params as numbers and arrays, the modules
that register a user's components by name.

:class:`ServerActor` holds one :class:`~paramserver.cluster.server.Server` and passes each
request to its handler, on a thread of its own; a request whose reply must wait (an update
before its group's step is complete, a get before its version) waits until the handler
answers it, and the replies made from one state of the server share one object-store copy
of the values. It also writes its part of the checkpoints (values, updater state, versions)
and restores them after a restart.

:class:`WorkerActor` holds one :class:`~paramserver.cluster.worker.Worker` stub with its
own ParamSet replica, and runs one training step per call: the gradient function, then the
push to the servers (through :class:`~paramserver.cluster.ray_transport.RayTransport`) and
the replies. A step never raises: it returns what happened, as data, for the driver.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import ray

from ..checkpoint import checkpoint_name, list_checkpoints, load_checkpoint, save_checkpoint
from ..config import ParamError
from ..config.job import ClusterConf
from ..updaters import create_updater
from .errors import ClusterError
from .messages import Address, Get, Leave, Put, Reply, Request, Sync, Update
from .numerics import _SMALL as SMALL
from .numerics import all_finite, sum_into
from .ray_transport import RayTransport, ServerLost
from .ray_wire import (
    LARGE,
    build_grad_fn,
    encode_reply,
    import_modules,
    layout_from_data,
    params_from_data,
)
from .server import Server
from .worker import Worker

SERVER_FORMAT = "paramserver-server-checkpoint/1"
#: Server checkpoints kept per server (the newest ones).
KEEP = 2


def _passive_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning (unless the environment says
    otherwise). An actor runs its kernels in bursts between messages; threads spinning for
    ~0.2 s after each burst would take the cores of the actors beside it (the process that
    sends the next message, Ray's copies into the object store). Set before the first
    parallel kernel loads the OpenMP runtime; changes no result."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def server_folder(root: str | os.PathLike[str], address: Address) -> Path:
    return Path(root) / f"server-{address[0]}-{address[1]}"


class _Slot:
    """Where one request's encoded reply lands, and the event its thread waits on."""

    __slots__ = ("data", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.data: tuple[Any, ...] = ("error", "no reply")


class ServerActor:
    """One server as a Ray actor; see the module docstring.

    A threaded actor: each request runs on a thread of its own, and one whose reply must
    wait (an update before its group's step is complete, a get before its version) waits on
    an event that the handler sets when it answers. Every call of the handler holds
    :attr:`_lock`, and a reply is encoded inside that call, so the replies of one call see
    one state of the server, and their values share one object-store copy. Ray gives the
    actor enough threads for every request that can wait at once (``max_concurrency``).

    Args:
        spec: ``group``, ``layout``, ``updater`` and ``cluster`` (JSON), ``modules``,
            ``sys_path``, ``checkpoint_dir``, ``names`` (of the master servers).
    """

    def __init__(self, spec: Mapping[str, Any]):
        _passive_threads()
        import_modules(spec["modules"], spec["sys_path"])
        layout = layout_from_data(spec["layout"])
        conf = ClusterConf.parse(json.loads(spec["cluster"]))
        updater = create_updater(json.loads(spec["updater"]))
        self.server = Server(layout, updater, conf, int(spec["group"]))
        self.address: Address = (int(spec["group"]), layout.index)
        self.names = dict(spec["names"])
        self.folder = server_folder(spec["checkpoint_dir"], self.address)
        self.incarnation = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._memo: Any = None
        _warm_up(self.server)

    def ping(self) -> str:
        """This incarnation's id: another one after a restart."""
        return self.incarnation

    def connect(self, masters: Mapping[Address, Any]) -> None:
        """The master group's server actors (for a server of a group > 0; again after a
        restart: actor handles are not constructor arguments, which a restart re-reads)."""
        self.server.connect(RayTransport(masters, self.names).send)

    # -- requests ---------------------------------------------------------------------------

    def _share(self, values: np.ndarray) -> Any:
        """The values of a reply: a copy now, or one object shared by this state's replies."""
        if values.nbytes < LARGE:
            return values.copy()
        if self._memo is None:
            self._memo = ray.put(values)
        return self._memo

    def _call(self, fn: Callable[[], None]) -> None:
        """Run the handler (``handle`` or ``abort``): replies made in it share a state."""
        with self._lock:
            self._memo = None
            try:
                fn()
            finally:
                self._memo = None

    def _request(self, request: Request) -> tuple[Any, ...]:
        slot = _Slot()

        def reply(answer: Reply) -> None:
            # Encoded at once, in the handler's call: before any other request changes
            # the values.
            slot.data = encode_reply(answer, self._share)
            slot.event.set()

        self._call(lambda: self.server.handle(request, reply))
        slot.event.wait()  # a stop (abort) or the next put answers every waiting request
        return slot.data

    def put(self, values: np.ndarray, num_shares: np.ndarray, step: int) -> tuple[Any, ...]:
        own = np.array(values, copy=True)  # the server updates its values in place
        return self._request(Put(own, np.asarray(num_shares, np.int64), int(step)))

    def get(self, group: int, worker: int, step: int, version: int,
            clock: int | None) -> tuple[Any, ...]:
        return self._request(Get(group, worker, step, version, clock))

    def update(self, group: int, worker: int, step: int, grads: np.ndarray | None,
               flush: bool) -> tuple[Any, ...]:
        return self._request(Update(group, worker, step, grads, flush))

    def leave(self, group: int, worker: int, step: int) -> tuple[Any, ...]:
        return self._request(Leave(group, worker, step))

    def sync(self, server_group: int, delta: np.ndarray) -> tuple[Any, ...]:
        return self._request(Sync(server_group, delta))

    def restart(self, step: int) -> tuple[Any, ...]:
        """Start serving again from ``step`` with the values held (a put of its own)."""
        s = self.server
        if s.values is None:
            raise ClusterError(f"{s.name} has no values to restart from")
        return self._request(Put(s.values, s.num_shares, int(step)))

    def abort(self, reason: str) -> None:
        self._call(lambda: self.server.abort(reason))

    def waiting_for(self) -> str:
        return self.server.waiting_for()

    # -- state and checkpoints --------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.server.state_dict()

    def check_state(self, state: dict[str, np.ndarray], prefix: str) -> list[str]:
        return self.server.check_state(state, prefix)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        with self._lock:
            self.server.load_state_dict(state)

    def checkpoint(self, step: int) -> str:
        """Write this server's slices (values, updater state, versions) as of ``step``."""
        s, layout = self.server, self.server.layout
        meta = {"format": SERVER_FORMAT, "address": list(self.address), "step": int(step),
                "start": layout.start, "stop": layout.stop,
                "num_shares": s.num_shares.tolist()}
        path = save_checkpoint(self.folder / checkpoint_name(int(step)), s.state_dict(), meta)
        for _, old in list_checkpoints(self.folder)[:-KEEP]:
            old.unlink(missing_ok=True)
        return str(path)

    def restore(self, step: int) -> str:
        """Take the values, updater state and versions of the checkpoint of ``step`` and
        serve from that step (after a restart of this actor, or to roll back with it)."""
        path = self.folder / checkpoint_name(int(step))
        arrays, meta = load_checkpoint(path)
        layout = self.server.layout
        if (meta.get("format") != SERVER_FORMAT or meta.get("address") != list(self.address)
                or (meta.get("start"), meta.get("stop")) != (layout.start, layout.stop)):
            raise ParamError(f"{path}: not a checkpoint of {self.server.name}")
        values = np.array(arrays["values"], copy=True)
        with self._lock:  # a put is answered at once; nothing comes between it and the load
            result = self._request(Put(values, np.asarray(meta["num_shares"], np.int64),
                                       int(step)))
            if result[0] == "error":
                raise ClusterError(result[1])
            self.server.load_state_dict(arrays)
        return self.incarnation


def _warm_up(server: Server | None = None) -> None:
    """Compile (or load from numba's cache) what the first step runs, before it runs: a
    cold kernel costs a new process about a second, which a short cluster.timeout would
    take for a hang."""
    big = np.zeros(SMALL, np.float32)
    all_finite(big)
    if server is None:
        return
    dtype = server.layout.dtype
    ro = np.zeros(SMALL, dtype)
    ro.flags.writeable = False  # gradients arrive read-only from the object store
    sum_into(np.empty_like(ro), ro, ro)
    w = np.zeros(1, dtype)
    server.updater.apply(0, w, ro[:1], server.updater.init_state(1, 1, dtype),
                         np.array([0, 1], np.int64))


def _picklable(e: BaseException) -> BaseException | None:
    try:
        ray.cloudpickle.dumps(e)
    except Exception:
        return None
    return e


class WorkerActor:
    """One worker as a Ray actor; see the module docstring.

    Args:
        spec: ``group``, ``index``, ``cluster`` (JSON), ``params`` (the ParamSet's structure),
            ``layouts``, ``names`` (of its servers), ``modules``, ``sys_path``.
        servers: the server actors of its server group, by address.
    """

    def __init__(self, spec: Mapping[str, Any], servers: Mapping[Address, Any]):
        _passive_threads()
        import_modules(spec["modules"], spec["sys_path"])
        conf = ClusterConf.parse(json.loads(spec["cluster"]))
        params = params_from_data(spec["params"])
        layouts = [layout_from_data(d) for d in spec["layouts"]]
        self.worker = Worker(int(spec["group"]), int(spec["index"]), params, layouts,
                             RayTransport(servers, dict(spec["names"])), conf)
        self.continue_on_failure = conf.on_worker_failure == "continue"
        _warm_up()
        self._fn: Callable[[Worker, int], Any] | None = None
        self._fn_key: tuple[str, str] | None = None
        self._stopped = False

    def ping(self) -> int:
        return os.getpid()

    def set_grad_fn(self, fn: Any) -> None:
        """A gradient function: a callable, or a RemoteGradFn's data (built here, once)."""
        if isinstance(fn, tuple) and len(fn) == 3 and fn[0] == "remote-grad-fn":
            key = (str(fn[1]), str(fn[2]))
            if key != self._fn_key:
                self._fn, self._fn_key = build_grad_fn(key), key
        else:
            self._fn, self._fn_key = fn, None

    def step(self, step: int, flush: bool, clock: int | None, begin: bool) -> dict[str, Any]:
        """Run one step; the outcome as data: ``kind`` is ``ok`` (with ``metrics``),
        ``failed`` or ``left`` (the gradient function raised: ``message``, ``cause``),
        ``error`` (a ClusterError: ``message``, ``server_lost``) or ``skipped`` (the
        worker stopped at an earlier step of this run)."""
        if begin:
            self._stopped = False
        if self._stopped:
            return {"kind": "skipped"}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = self._step(step, flush, clock, begin)
        if out["kind"] != "ok":
            self._stopped = True
        out["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
        out["skipped"] = self.worker.skipped
        return out

    def _step(self, step: int, flush: bool, clock: int | None, begin: bool) -> dict[str, Any]:
        w = self.worker
        try:
            if begin:
                w.pull(step)
            if clock is not None:
                w.pull(step, clock=clock)
            w.step = step
            assert self._fn is not None, "set_grad_fn comes first"
            try:
                metrics = self._fn(w, step)
            except Exception as e:
                message = (f"{w.name} (rank {w.rank}) failed at step {step}: "
                           f"{type(e).__name__}: {e}")
                if self.continue_on_failure:
                    w.leave(step)
                return {"kind": "left" if self.continue_on_failure else "failed",
                        "message": message, "cause": _picklable(e)}
            w.collect(w.push(step, flush=flush), step)
            return {"kind": "ok", "metrics": metrics}
        except ServerLost as e:
            return {"kind": "error", "message": str(e), "server_lost": True}
        except ClusterError as e:
            return {"kind": "error", "message": str(e), "server_lost": False}
        except Exception as e:
            return {"kind": "error", "server_lost": False, "cause": _picklable(e),
                    "message": f"{w.name} (rank {w.rank}) failed at step {step}: "
                               f"{type(e).__name__}: {e}"}


__all__ = ["SERVER_FORMAT", "ServerActor", "WorkerActor", "server_folder"]
