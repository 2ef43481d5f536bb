"""The Ray backend: servers and workers as Ray actors, the same code beneath (SPEC §7).

``Cluster(job, params)`` with ``cluster { backend: "ray" }`` uses a :class:`RayBackend`:

- every server of every server group with something to hold is a
  :class:`~paramserver.cluster.ray_actors.ServerActor` holding the embedded
  :class:`~paramserver.cluster.server.Server`, and every worker a
  :class:`~paramserver.cluster.ray_actors.WorkerActor` holding the embedded
  :class:`~paramserver.cluster.worker.Worker` stub; they exchange the same messages, through
  Ray's object store (:mod:`paramserver.cluster.ray_transport`);
- actors are built from plain data (configurations as JSON, ranges and Params as arrays,
  user modules by name; :mod:`paramserver.cluster.ray_wire`), never from pickled objects of
  ours; the gradient function is the user's callable (pickled by Ray, once per run) or a
  :class:`~paramserver.cluster.gradfn.RemoteGradFn` that each worker builds itself;
- a worker actor runs a part of a run in one call, a Ray streaming generator of its steps'
  outcomes (in batches: see :class:`~paramserver.cluster.ray_actors.WorkerActor`), which a
  thread of this process per worker reads; its messages to a server on its own node go
  over a link (:mod:`paramserver.cluster.node_link`), to others as Ray calls. With
  ``compiled=True`` the steps of a synchronous run go through a Ray Compiled Graph of the
  actors instead, compiled at the first such run (:mod:`paramserver.cluster.ray_compiled`:
  channels, no scheduling per call), except for ``clip_norm``, row-sparse tables and the
  rest of a part after a worker died (see
  :func:`~paramserver.cluster.ray_compiled.compiled_reason`). Either way the outcomes go
  to the
  :class:`~paramserver.cluster.driver.Driver`, which does everything else, as embedded;
- actors go on as many nodes as Ray can (``placement="spread"``, the default), and the
  nodes of the actors are logged at the start (``where`` asks each actor for its node).

Fault tolerance: server actors are restarted by Ray (``max_restarts``) and the driver brings
them back to their checkpoints (:meth:`RayBackend.revive`); a worker actor that dies is a
``dead`` outcome as soon as Ray reports it. A node that leaves the cluster is named, with
what lived on it, in the errors it causes.

A local Ray started here listens on the loopback interface only (:func:`loopback_only`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ParamError
from ..config.job import ClusterConf
from ..params import ParamSet
from ..updaters import Updater
from .driver import DEAD, ENDED, ERROR, Outcome, Pauses, server_folder
from .errors import ClusterError
from .gradfn import RemoteGradFn
from .keys import updater_text
from .layout import ServerLayout
from .messages import Address
from .ray_logs import RayOutput
from .ray_wire import layout_to_data, main_components, params_to_data, user_modules
from .server import Server, server_name

if TYPE_CHECKING:  # ray_compiled imports Ray: only when the backend is made
    from .ray_compiled import CompiledSteps

log = logging.getLogger(__name__)

#: What an actor asks of its node's ``server_resource`` / ``worker_resource``: a token
#: amount (Ray's smallest is 0.0001), so the resource chooses nodes and never limits how
#: many actors a node takes.
_TOKEN_AMOUNT = 0.001


def import_ray() -> Any:
    """The ``ray`` module, or a ParamError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ParamError("cluster.backend 'ray' needs Ray: pip install 'paramserver[ray]' "
                         "(or 'ray>=2.9')") from None
    return ray


#: Ray's switch for a single-machine Ray (its mode on macOS and Windows): the node's address
#: is 127.0.0.1 and every service of Ray listens there only. Read by Ray at import time.
_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def loopback_only() -> Iterator[None]:
    """Within: a Ray started in this process (``ray.init(address="local")``, or Ray's own
    test cluster) listens on 127.0.0.1 only — its GCS, raylets (node and object managers),
    runtime-env agents, and every worker's RPC server — instead of every interface. This
    is Ray's single-machine mode; its processes inherit the setting as they start, and this
    process needs it only to choose its node's address (Ray keeps that switch in a module
    constant read at import, set here for the call and put back)."""
    from ray._private import ray_constants

    before = os.environ.get(_SINGLE_MACHINE), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_SINGLE_MACHINE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop(_SINGLE_MACHINE, None)
        else:
            os.environ[_SINGLE_MACHINE] = before[0]
        ray_constants.ENABLE_RAY_CLUSTER = before[1]


def start_ray(address: str | None = None, num_cpus: int | None = None, *,
              log_to_driver: bool = True) -> bool:
    """Connect this process to Ray; returns True when this call started it.

    With Ray already connected (``ray.init`` called by you, with the options you need),
    that connection is used. Otherwise, with ``address``, this joins the existing cluster
    there (``HOST:6379`` or ``ray://HOST:10001``; as Ray does, the token is shown only
    under ``RAY_AUTH_MODE=token``: never to an address by chance); without, it starts a
    local instance that listens on 127.0.0.1 only (:func:`loopback_only`), without a
    dashboard, its token made private first. A cluster that cannot be joined is a
    ParamError (the address or the token is the user's to change), in one line.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    from .ray_auth import ensure_local_token, join_error

    if address:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=log_to_driver)
        except Exception as e:
            raise join_error(address, e) from None
    else:
        ensure_local_token()
        with loopback_only():
            try:
                ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                         logging_level="WARNING", log_to_driver=log_to_driver)
            except Exception as e:  # Ray's own failure (a machine too busy, no space)
                raise ClusterError(f"cannot start a local Ray: {_first_line(e)}") from e
        if sys.platform.startswith("linux"):  # its agents end with this process, however
            from .ray_reaper import Reaper

            _REAPER[:] = [Reaper()]
            _REAPER[0].watch()
    return True


#: The watcher of the local Ray this process started (:mod:`.ray_reaper`), while it runs.
_REAPER: list[Any] = []


def stop_ray() -> None:
    """Stop the Ray this process started (:func:`start_ray`), and its watcher."""
    ray = import_ray()
    ray.shutdown()
    while _REAPER:
        _REAPER.pop().done()


class RemoteWorker:
    """A worker of the Ray backend, seen from the driver: who it is and its actor."""

    def __init__(self, group: int, index: int, rank: int, actor: Any):
        self.group = group
        self.index = index
        self.rank = rank
        self.actor = actor
        self.name = f"worker {index} of group {group}"

    def __repr__(self) -> str:
        return f"RemoteWorker({self.name}, rank={self.rank})"


Options = Mapping[str, Any] | Callable[[Any], Mapping[str, Any]] | None


class RayBackend:
    """Servers and workers as Ray actors; see the module docstring.

    Args:
        conf, params, layouts, updater: the cluster's.
        checkpoint_dir: the folder of the servers' checkpoints (a folder every node can
            reach, on several machines).
        placement: ``"spread"`` places the actors on as many nodes as Ray can (Ray's
            ``SPREAD`` strategy); ``"pack"`` (or ``None``) leaves it to Ray, which packs
            them on the driver's node while it has room; by default the cluster's
            ``placement`` (spread unless set). The cluster's ``server_resource`` /
            ``worker_resource`` put servers / workers only on nodes with that resource.
        server_options, worker_options: options for Ray's ``.options()`` of every server /
            worker actor (``num_cpus``, ``resources``, ``scheduling_strategy`` — e.g. a
            placement group or a node —, ``runtime_env``...), or a function of the server's
            address ``(group, index)`` / the worker's rank returning them.
        modules: more modules for every actor to import (those that registered a user's
            components are imported without being named).
        actor_restarts: restarts of a server actor allowed by Ray (the cluster's
            ``max_restarts``).
        keys: the servers of a key-value store (:class:`~.keys.KeyServer`, an actor for
            every layout of group 0; ``updater`` None: none) instead of ranges of ``params``.
        compiled: run the steps of a synchronous run through a Ray Compiled Graph
            (:mod:`~paramserver.cluster.ray_compiled`). Off by default: on one node the
            links (:mod:`~.node_link`) are quicker (docs/ray.md), and across nodes Ray
            2.60's raylet can crash when an actor of a graph dies mid-step
            (ray-project/ray#63229), which would take a run's recovery from a lost node
            with it.
        log_file: where Ray's own messages go while this backend lives (its C++ logging
            and Python loggers, and the output of the actors), instead of this process's
            stderr (:class:`~paramserver.cluster.ray_logs.RayOutput`); paramserver's own
            messages stay on stderr. The command line gives ``<workspace>/ray.log``.
        placement_file: a JSON file that says where every actor is (node id and name),
            rewritten whenever that changes (the command line gives
            ``<workspace>/placement.json``).
        build_ahead: the :class:`~paramserver.cluster.gradfn.RemoteGradFn` of the runs to
            come: every worker actor starts building it (on a thread of its own) as it
            starts, and the graph of compiled steps is made with the actors, so that the
            first run waits for neither (importing a framework, making a net, compiling:
            seconds); that run waits for what is left of the build, and reports a build
            that failed.

    Attributes:
        dead: the workers whose actors died, by rank.
        nodes: the Ray node of every actor, by its name ("server 0", "worker 1 of group 0").
    """

    default_restarts = 3
    one_process = False  # every worker is a process of its own

    def __init__(self, conf: ClusterConf, params: ParamSet, layouts: Sequence[ServerLayout],
                 updater: Updater | None, checkpoint_dir: Path | None = None, *,
                 placement: str | None = "conf", server_options: Options = None,
                 worker_options: Options = None, modules: Sequence[str] = (),
                 actor_restarts: int = 3, keys: bool = False, compiled: bool = False,
                 log_file: str | os.PathLike[str] | None = None,
                 placement_file: str | os.PathLike[str] | None = None,
                 build_ahead: RemoteGradFn | None = None):
        if placement == "conf":
            placement = conf.placement
        if placement not in (None, "spread", "pack"):
            raise ParamError(f"placement must be 'spread', 'pack' or None, not {placement!r}")
        placement = None if placement == "pack" else placement
        self._ray = import_ray()
        self.conf = conf
        self.updater = updater
        self.layouts = list(layouts)
        self.checkpoint_dir = checkpoint_dir
        self.actor_restarts = int(actor_restarts)
        self.keys = keys
        self.servers: dict[Address, Any] = {}
        self.workers: list[RemoteWorker] = []
        self.local_workers: Sequence[Any] = ()
        self._idle: dict[Address, Server] = {}  # servers with nothing to hold: no actor
        self._names = {(g, L.index): server_name(L.index, g, conf.nserver_groups)
                       for g in range(conf.nserver_groups) for L in self.layouts}
        self._params = params
        self._readers: list[threading.Thread] = []
        self._incarnations: dict[Address, str] = {}
        self.dead: set[int] = set()
        self.nodes: dict[str, str] = {}
        from .ray_compiled import compiled_reason

        why = compiled_reason(conf, params, updater, keys) if compiled else "compiled=False"
        self._compile = why is None
        self._steps: CompiledSteps | None = None
        self._warned_across = False  # that a graph across nodes risks Ray's raylet
        self._owns_ray = False
        self._closed = False
        self._placement_file = Path(placement_file) if placement_file is not None else None
        if build_ahead is not None and not isinstance(build_ahead, RemoteGradFn):
            raise ParamError(f"build_ahead must be a RemoteGradFn, not "
                             f"{type(build_ahead).__name__}")
        self._build = build_ahead.to_data() if build_ahead is not None else None
        self._output: RayOutput | None = None
        joined = False
        try:
            if log_file is not None and not self._ray.is_initialized():
                self._output = RayOutput(Path(log_file))
            self._owns_ray = start_ray(conf.ray_address, log_to_driver=self._output is None)
            joined = True
            if self._output is not None:
                self._output.capture_loggers()
            self._check_resources()
            self._start(params, placement, server_options, worker_options, list(modules))
        except BaseException:
            self.close(discard_log=not joined)  # Ray's lines of a run that never was
            raise

    # -- actors -----------------------------------------------------------------------------

    def _start(self, params: ParamSet, placement: str | None, server_options: Options,
               worker_options: Options, modules: list[str]) -> None:
        from .ray_actors import ServerActor, WorkerActor
        from .ray_transport import RayTransport

        ray, c = self._ray, self.conf
        main = main_components()
        if main:
            warnings.warn(f"components registered in __main__ ({', '.join(main)}) cannot be "
                          "imported by Ray actors; define them in a module (paramserver "
                          "--import MODULE)", RuntimeWarning, stacklevel=4)
        def hosted(L: ServerLayout) -> bool:
            """Whether the server of ``L`` is an actor: a cluster's server of an empty range
            is not (as embedded: only its state)."""
            return bool(L.size) or bool(self.keys)

        actors = (c.nworker_groups * c.nworkers_per_group
                  + c.nserver_groups * sum(map(hosted, self.layouts)))
        cpus = int(ray.cluster_resources().get("CPU", 0))
        common: dict[str, Any] = {
            "cluster": c.to_json(), "modules": sorted({*user_modules(), *modules}),
            "sys_path": [os.getcwd(), *(p for p in sys.path if isinstance(p, str))],
            # each actor's kernels: on the cluster's CPUs per actor (ray_actors._thread_policy)
            "threads": max(1, cpus // actors) if cpus and actors else None}

        def options(base: dict[str, Any], resource: str | None, extra: Options,
                    key: Any) -> dict[str, Any]:
            opts = dict(base)
            if placement == "spread":
                opts["scheduling_strategy"] = "SPREAD"
            if resource:  # a token amount: any number of actors fits on such a node
                opts.update(num_cpus=0, resources={resource: _TOKEN_AMOUNT})
            opts.update((extra(key) if callable(extra) else extra) or {})
            return opts

        server_cls = ray.remote(ServerActor)
        # Requests that can wait in a server at once: one per worker it serves, their
        # diagnoses, the syncs of the other server groups, and the driver's.
        threads = 2 * c.nworker_groups * c.nworkers_per_group + c.nserver_groups + 16
        if self.keys:  # every push of every key may wait for its step (Ray 2.60 makes all
            threads = max(threads, 4096)  # of them as the actor starts: memory, no CPU)
        masters: dict[Address, str] = {(0, L.index): self._names[(0, L.index)]
                                       for L in self.layouts}
        for g in range(c.nserver_groups):
            for L in self.layouts:
                address = (g, L.index)
                folder = server_folder(self.checkpoint_dir, address)
                if not hosted(L):
                    assert self.updater is not None
                    self._idle[address] = Server(L, self.updater, c, g, folder)
                    continue
                spec = {**common, "group": g, "layout": layout_to_data(L), "keys": self.keys,
                        "updater": updater_text(self.updater),
                        "folder": str(folder) if folder is not None else None,
                        "names": masters}
                self.servers[address] = server_cls.options(**options(
                    {"max_restarts": self.actor_restarts, "max_task_retries": 0,
                     "max_concurrency": threads}, c.server_resource, server_options,
                    address)).remote(spec)
        worker_cls = ray.remote(WorkerActor)
        spec_params = params_to_data(params)
        layouts = [layout_to_data(L) for L in self.layouts]

        def new_worker(rank: int) -> RemoteWorker:
            g, i = divmod(rank, c.nworkers_per_group)
            s = g % c.nserver_groups
            handles = {(s, L.index): self.servers[(s, L.index)]
                       for L in self.layouts if (s, L.index) in self.servers}
            names = {(s, L.index): self._names[(s, L.index)] for L in self.layouts}
            spec = {**common, "group": g, "index": i, "params": spec_params,
                    "layouts": layouts, "names": names, "build": self._build}
            actor = worker_cls.options(**options(
                {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 1},
                c.worker_resource, worker_options, rank)).remote(spec, handles)
            return RemoteWorker(g, i, rank, actor)

        self._new_worker = new_worker
        self.workers = [new_worker(r) for r in range(c.nworker_groups * c.nworkers_per_group)]
        self.transport = RayTransport(self.servers, self._names, self._idle)
        for server in self._idle.values():
            server.connect(self.transport.send)
        pings = {a: h.ping.remote() for a, h in self.servers.items()}
        self._started(self.workers, lambda wait: {a: ray.get(r, timeout=wait)
                                                  for a, r in pings.items()})
        self._connect()
        self._locate()
        if self._build is not None:  # the first run's graph too, before it
            self._compiled_steps()

    def _started(self, workers: Sequence[RemoteWorker],
                 servers: Callable[[float], Any] | None = None) -> None:
        """Wait for ``workers`` to answer (and with ``servers(wait)``, the servers: their
        incarnations); a start that fails or takes too long is an error saying why."""
        ray = self._ray
        wait = max(60.0, self.conf.timeout)
        try:
            ray.get([w.actor.ping.remote() for w in workers], timeout=wait)
            if servers is not None:
                self._incarnations = servers(wait)
        except ray.exceptions.GetTimeoutError:
            n = len(workers) + (len(self.servers) if servers is not None else 0)
            raise ClusterError(f"the {n} Ray actors of the cluster did not start within "
                               f"{wait:g} s: {self._not_started()}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError) as e:
            raise ClusterError(f"a Ray actor of the cluster could not start: {_first_line(e)}"
                               + _cause(e)) from None

    def replace_workers(self, ranks: Sequence[int]) -> bool:
        """New actors in the places of the dead workers ``ranks`` (anywhere their options
        allow: on another node when theirs is gone); they start as at the first run, and
        the driver runs their part again."""
        self._drop_steps()  # the graph of the dead ones is broken
        new = []
        for rank in ranks:
            try:
                self._ray.kill(self.workers[rank].actor, no_restart=True)
            except Exception:  # gone already
                pass
            self.workers[rank] = self._new_worker(rank)
            new.append(self.workers[rank])
        self._started(new)
        self.dead.difference_update(ranks)
        self._locate([w.name for w in new])
        return True

    def _check_resources(self) -> None:
        """The cluster's ``server_resource`` / ``worker_resource``: some live node must
        have each, else the actors would wait for ever (a mistake of the job: ParamError)."""
        c = self.conf
        wanted = {k: v for k, v in (("server_resource", c.server_resource),
                                    ("worker_resource", c.worker_resource)) if v}
        if not wanted:
            return
        have: set[str] = set()
        for node in self._ray.nodes():
            if node.get("Alive"):
                have |= {r for r, n in (node.get("Resources") or {}).items() if n > 0}
        custom = sorted(r for r in have if r not in ("CPU", "GPU", "memory",
                                                      "object_store_memory")
                        and not r.startswith("node:"))
        problems = [f"cluster.{key} '{name}': no node of the Ray cluster has that resource "
                    f"(its nodes have: {', '.join(custom) or 'no resource of their own'}; "
                    f"give one with ray start --resources='{{\"{name}\": 1}}')"
                    for key, name in wanted.items() if name not in have]
        if problems:
            raise ParamError(problems)

    def _not_started(self) -> str:
        """Why actors have not started yet, from Ray's actor table: waiting for a node
        with room (not placed yet), or placed and still starting (their process, their
        imports, the kernels' compilation: a busy machine)."""
        handles = self._actors()
        try:
            from ray._private import state

            table = state.actors()
        except Exception:  # asking Ray failed: say what is known
            table = {}
        waiting, starting, dead = [], [], []
        for name, h in handles.items():
            info = table.get(h._actor_id.hex()) if table else None
            if info is None or info.get("State") == "ALIVE":
                continue
            if info.get("State") == "DEAD":
                dead.append(name)
            elif info.get("Address", {}).get("NodeID", "").strip("0") == "":
                waiting.append(name)
            else:
                starting.append(name)
        parts = []
        if waiting:
            parts.append(f"{', '.join(waiting)} {_verb(waiting, 'waits', 'wait')} for a node "
                         "with room (the resources and placement asked for: "
                         "cluster.placement, server_resource, worker_resource, "
                         "server_options, worker_options)")
        if starting:
            parts.append(f"{', '.join(starting)} {_verb(starting, 'is', 'are')} placed and "
                         "still starting (processes that start and import on a busy "
                         "machine: a larger cluster.timeout gives them longer)")
        if dead:
            parts.append(f"{', '.join(dead)} died while starting (Ray's logs say why)")
        return "; ".join(parts) or "Ray did not say why"

    def _actors(self) -> dict[str, Any]:
        """Every actor by its name."""
        return {**{self._names[a]: h for a, h in self.servers.items()},
                **{w.name: w.actor for w in self.workers}}

    def _locate(self, names: Sequence[str] | None = None) -> None:
        """Ask actors (default: all) on which node they run; log where all are."""
        actors = self._actors()
        names = list(actors) if names is None else list(names)
        refs = [actors[n].where.remote() for n in names]
        self.nodes.update(zip(names, self._ray.get(refs, timeout=max(60.0, self.conf.timeout)),
                              strict=True))
        on: dict[str, list[str]] = {}
        for name, node in self.nodes.items():
            on.setdefault(node, []).append(name)
        labels = _node_labels(self._ray)
        self._write_placement(labels)
        log.info("on Ray: %d server(s) and %d worker(s) on %d node(s): %s", len(self.servers),
                 len(self.workers), len(on), "; ".join(
                     f"{labels.get(node, node[:8])}: {', '.join(held)}"
                     for node, held in sorted(on.items(), key=lambda kv: labels.get(kv[0], ""))))

    def _write_placement(self, labels: Mapping[str, str]) -> None:
        """Where the actors are, as JSON in ``placement_file`` (atomically): each actor's
        node id and its name, for a user without Ray's dashboard (``ray list actors``
        needs ``ray[default]``; ``ray status`` shows no resource held by the actors)."""
        if self._placement_file is None:
            return
        from ..atomic import write_atomically

        nodes = {node: labels.get(node, node[:8]) for node in set(self.nodes.values())}
        data = {"actors": {name: {"node_id": node, "node": nodes[node]}
                           for name, node in sorted(self.nodes.items())},
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            text = json.dumps(data, indent=2) + "\n"
            write_atomically(self._placement_file, lambda p: p.write_text(text),
                             "the actors' placement")
        except (OSError, ParamError) as e:  # a report, not the run: say so and go on
            log.warning("%s", e)

    def _node_left(self, name: str, error: BaseException | None = None) -> str:
        """When the node of actor ``name`` has left the Ray cluster (Ray's list of nodes
        says so, or the actor's death, ``error``, says its node died): a sentence naming
        the node and what lived there ("" while it is alive or unknown)."""
        node = self.nodes.get(name)
        if node is None:
            return ""
        said = error is not None and any(t in str(error).lower() for t in (
            "node has died", "node died", "node is dead"))
        try:
            alive = {n["NodeID"]: bool(n.get("Alive")) for n in self._ray.nodes()}
        except Exception:  # asking Ray failed: what the error said, or nothing
            alive = {}
        if alive.get(node, True) and not said:
            return ""
        there = ", ".join(n for n, at in self.nodes.items() if at == node)
        return (f"; its node {_node_labels(self._ray).get(node, node[:8])} left the Ray "
                f"cluster (it held {there})")

    def _connect(self) -> None:
        """Servers of groups > 0 get the master group's actors (for their syncs)."""
        masters = {a: h for a, h in self.servers.items() if a[0] == 0}
        refs = [h.connect.remote(masters) for a, h in self.servers.items() if a[0] > 0]
        self._ray.get(refs, timeout=max(60.0, self.conf.timeout))

    # -- what the driver needs --------------------------------------------------------------

    def values_of(self, group: int) -> np.ndarray:
        return self._params.values  # a put copies them into the actor

    def prepare(self, grad_fn: Any) -> Any:
        """The gradient function as data (a RemoteGradFn) or put in the object store once
        (a callable: pickled by Ray, with what it refers to)."""
        if isinstance(grad_fn, RemoteGradFn):
            return grad_fn.to_data()
        if not callable(grad_fn):
            raise ParamError(f"grad_fn must be callable, not {type(grad_fn).__name__}")
        try:
            return self._ray.put(grad_fn)
        except Exception as e:
            raise ClusterError(f"the gradient function cannot be sent to the Ray workers (it "
                               f"must pickle): {type(e).__name__}: {e}") from e

    @property
    def halts(self) -> bool:
        """The compiled steps end a part where the driver says, as they go (the driver gives
        the graph one step at a time); the actor calls run a part to its end."""
        return self._compiled_steps() is not None

    def start(self, ranks: Sequence[int], fn: Any, first: int, last: int,
              deliver: Callable[[Outcome], None], halt: Pauses | None = None) -> None:
        self._readers = []
        steps = self._compiled_steps()
        if steps is None:
            # (a graph that could not be made: `halts` said so first)
            self._stream(ranks, fn, first, last, deliver)
            return
        t = threading.Thread(target=steps.run, args=(ranks, fn, first, last, deliver,
                                                     self._stream, halt),
                             daemon=True, name="paramserver-ray-compiled-steps")
        self._readers.append(t)
        t.start()

    def _compiled_steps(self) -> CompiledSteps | None:
        """The compiled graph of a step over the live actors (made at the first run, again
        after an actor was lost), or None where the steps take the actor calls."""
        if not self._compile:
            return None
        if self._steps is not None and self._steps.broken:
            self._drop_steps()
        if self._steps is None:
            live = [w for w in self.workers if w.rank not in self.dead]
            if not live or not self.servers:
                return None
            from .ray_compiled import CompiledSteps

            # Updates held by a graph that broke midway go first.
            self._ray.get([h.begin.remote() for h in self.servers.values()],
                          timeout=max(60.0, self.conf.timeout))
            biggest = max(L.size for L in self.layouts) * np.dtype(self._params.dtype).itemsize
            try:
                here = str(self._ray.get_runtime_context().get_node_id())
                across = set(self.nodes.values()) != {here}
                self._steps = CompiledSteps(live, self.servers, self._names, self.conf, biggest,
                                            across, self._dead_outcome, self._lost)
            except Exception as e:  # a Ray that cannot compile: the actor calls serve
                self._compile = False
                warnings.warn(f"the steps go through Ray actor calls: Ray could not compile "
                              f"them into a graph ({type(e).__name__}: {e})", RuntimeWarning,
                              stacklevel=4)
                return None
            if across and not self._warned_across:
                self._warned_across = True
                warnings.warn(
                    "compiled=True across Ray nodes: the steps go through a Compiled Graph, "
                    "and an actor of it lost on one node can make Ray 2.60's raylet on "
                    "another abort (ray-project/ray#63229), ending the run, and Ray there, "
                    "where actor calls would have recovered it (leave compiled unset for "
                    "those)", RuntimeWarning, stacklevel=4)
        return self._steps

    def _drop_steps(self) -> None:
        if self._steps is not None:
            steps, self._steps = self._steps, None
            steps.teardown()

    def _stream(self, ranks: Sequence[int], fn: Any, first: int, last: int,
                deliver: Callable[[Outcome], None]) -> None:
        """Workers ``ranks`` run steps ``[first, last)`` in one call each (the ordinary
        path); a thread per worker reads its stream of outcomes."""
        for rank in ranks:
            w = self.workers[rank]
            stream = w.actor.steps.options(num_returns="streaming").remote(first, last, fn)
            t = threading.Thread(target=self._read, args=(w, stream, first, deliver),
                                 daemon=True, name=f"paramserver-ray-{w.group}.{w.index}")
            self._readers.append(t)
            t.start()

    def _read(self, w: RemoteWorker, stream: Any, first: int,
              deliver: Callable[[Outcome], None]) -> None:
        """Hand a worker's outcomes to the driver as they come; its death as one."""
        ray = self._ray
        step = first
        try:
            for ref in stream:  # the outcomes of one or more steps
                for data in ray.get(ref):
                    outcome = Outcome.from_data(data)
                    step = outcome.step + 1
                    deliver(outcome)
        except ray.exceptions.RayActorError as e:
            deliver(self._dead_outcome(w, self._died_in(w, step), e))
        except ray.exceptions.RayTaskError as e:  # e.g. metrics that do not pickle
            deliver(Outcome(w.rank, step, ERROR, cause=e.cause, message=(
                f"{w.name} (rank {w.rank}) failed at step {step}: "
                f"{type(e.cause).__name__}: {e.cause}")))
        except Exception as e:
            deliver(Outcome(w.rank, step, ERROR, cause=e, message=(
                f"{w.name} (rank {w.rank}) failed at step {step}: {type(e).__name__}: {e}")))
        finally:
            deliver(Outcome(w.rank, step, ENDED))

    def _died_in(self, w: RemoteWorker, step: int) -> int:
        """The step a worker that died was in: its outcomes come in batches, so the driver
        may not have had those of its last steps (``step``: the one after the last it
        had); its servers saw how far it went (:meth:`~.server.Server.reached`)."""
        group = w.group % self.conf.nserver_groups
        refs = [h.reached.remote(w.group, w.index) for a, h in self.servers.items()
                if a[0] == group]
        seen = []
        for ref in refs:
            try:
                reached = self._ray.get(ref, timeout=30.0)
            except Exception:  # a server lost too says nothing
                continue
            if reached is not None:
                seen.append(int(reached))
        return max(step, min(seen)) if seen else step

    def _dead_outcome(self, w: RemoteWorker, step: int, e: BaseException) -> Outcome:
        """A worker's actor died at ``step`` (Ray said so with ``e``)."""
        self.dead.add(w.rank)
        e = self._settled(w, e)
        return Outcome(w.rank, step, DEAD, cause=e, message=(
            f"{w.name} (rank {w.rank}) died at step {step}: its Ray actor is gone "
            f"({type(e).__name__}){self._node_left(w.name, e)}"))

    def _settled(self, w: RemoteWorker, e: BaseException) -> BaseException:
        """What Ray finally says of a worker's actor that it called unavailable (``e``): its
        calls broke, but Ray decides whether it died, and why, only later — when its
        node's raylet stopped answering, once the cluster's health checks gave the node
        up (seconds). A worker actor is never restarted, so a call to it ends in its death
        with the cause (its node died, its process ended) or is answered (it was a passing
        fault: ``e`` stands). Any other error is final already."""
        ray = self._ray
        if not isinstance(e, ray.exceptions.ActorUnavailableError):
            return e
        deadline = time.monotonic() + max(60.0, 2 * self.conf.timeout)
        while time.monotonic() < deadline:
            try:
                ray.get(w.actor.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
                return e
            except ray.exceptions.ActorDiedError as died:
                return died
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                time.sleep(0.1)  # Ray has not decided yet; ask again
        return e

    def _lost(self) -> list[Address]:
        """The servers whose actors died since :meth:`revive` last looked (restarted, or
        restarting); changes nothing."""
        ray = self._ray
        pings = {a: h.ping.remote() for a, h in self.servers.items()}
        lost = []
        for a, ref in pings.items():
            try:
                if ray.get(ref, timeout=30.0) != self._incarnations.get(a):
                    lost.append(a)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
                lost.append(a)
            except ray.exceptions.GetTimeoutError:  # busy: not lost
                pass
        return lost

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        joined: set[threading.Thread] = set()
        while True:  # a compiled part may hand its workers to new readers meanwhile
            todo = [t for t in list(self._readers) if t not in joined]
            if not todo:
                return
            for t in todo:
                t.join(max(0.0, deadline - time.monotonic()))
                joined.add(t)

    def busy(self) -> list[str]:
        return [t.name for t in self._readers if t.is_alive()]

    def revive(self) -> list[Address]:
        """Wait for every server actor to answer (Ray restarts a dead one); those restarted
        since we last looked (they are then connected again)."""
        ray = self._ray
        limit = max(60.0, 2 * self.conf.timeout)
        deadline = time.monotonic() + limit
        restarted: list[Address] = []
        for address, h in self.servers.items():
            name = self._names[address]
            while True:
                try:
                    now = ray.get(h.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
                    break
                except ray.exceptions.ActorDiedError:
                    raise ClusterError(f"{name} died and Ray did not restart it (max_restarts "
                                       f"{self.actor_restarts}){self._node_left(name)}"
                                       ) from None
                except ray.exceptions.ActorUnschedulableError as e:
                    raise ClusterError(f"{name} died and Ray cannot start it again: "
                                       f"{_first_line(e)}{self._node_left(name)}") from None
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{name} was not back within {limit:g} s after its "
                                           f"actor died{self._node_left(name)}") from None
                    time.sleep(0.05)  # the actor is restarting; ask again
            if now != self._incarnations.get(address):
                restarted.append(address)
                self._incarnations[address] = now
        if restarted:
            self._drop_steps()  # its loop of the compiled graph died with it
            self._connect()
            self._locate([self._names[a] for a in restarted])
        return restarted

    def kill_server(self, address: Address) -> None:
        """Kill a server's actor, and return once Ray has restarted it (with no values until
        restored) or given it up (no restarts left)."""
        ray = self._ray
        h, old = self.servers[address], self._incarnations.get(address)
        self._drop_steps()
        ray.kill(h, no_restart=False)
        deadline = time.monotonic() + max(60.0, 2 * self.conf.timeout)
        while time.monotonic() < deadline:
            try:
                if ray.get(h.ping.remote(), timeout=5.0) != old:
                    return
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnschedulableError):
                return
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(0.05)  # the old actor is still going, or the new one starting

    # -- the end ----------------------------------------------------------------------------

    def close(self, discard_log: bool = False) -> None:
        """Stop the actors, and Ray if this backend started it. Idempotent. (With
        ``discard_log``, the cluster never started: its ``log_file`` goes if made here.)"""
        if self._closed:
            return
        self._closed = True
        ray = getattr(self, "_ray", None)
        if ray is not None and ray.is_initialized():
            for actor in [*self.servers.values(), *(w.actor for w in self.workers)]:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # gone already
                    pass
            self._drop_steps()  # after the kills: a worker stuck in its step cannot hold it
            transport = getattr(self, "transport", None)
            if transport is not None:
                transport.close()  # its shared memory
            if self._owns_ray:
                stop_ray()
        output = getattr(self, "_output", None)
        if output is not None:
            output.close(discard=discard_log)

    def __repr__(self) -> str:
        c = self.conf
        return (f"RayBackend({c.nworker_groups}×{c.nworkers_per_group} worker actors, "
                f"{c.nserver_groups}×{c.nservers_per_group} servers)")


def _verb(names: Sequence[str], one: str, many: str) -> str:
    return one if len(names) == 1 else many


def _first_line(e: BaseException) -> str:
    """The first line of Ray's message (the rest is its advice on Ray's internals)."""
    text = str(e).strip()
    return text.splitlines()[0].rstrip(".") if text else type(e).__name__


def _cause(e: BaseException) -> str:
    """What failed in an actor's creation task: the last line of the traceback Ray keeps
    (``ValueError: ...``), which its first line does not name."""
    cause = getattr(e, "error_msg", None) or str(e)
    lines = [x.strip() for x in str(cause).strip().splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    return f" ({last})" if len(lines) > 1 and "creation task" in lines[0] else ""


def _node_labels(ray: Any) -> dict[str, str]:
    """How messages name each Ray node: its name (``ray start --node-name``; by default
    its address) and the start of its id."""
    try:
        nodes = ray.nodes()
    except Exception:  # naming nodes must not fail what it describes
        return {}
    return {n["NodeID"]: f"'{n.get('NodeName') or n.get('NodeManagerAddress')}' "
                         f"({n['NodeID'][:8]})" for n in nodes}


__all__ = ["RayBackend", "RemoteWorker", "import_ray", "loopback_only", "start_ray"]
