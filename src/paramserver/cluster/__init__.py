"""Parameter servers and workers (SPEC §7), embedded in one process by default, on Ray
across processes and machines.

- :func:`compute_slices`, :func:`partition_slices`: SINGA's slicing of Params over servers;
- :class:`Cluster`: servers and workers built from a job; :meth:`Cluster.run` trains;
  :func:`workers_share_process`: what a backend can do for layers exchanging data;
- :class:`Server`, :class:`Worker`: the two ends of the message vocabulary in
  :mod:`paramserver.cluster.messages`, joined by a transport
  (:class:`~paramserver.cluster.transport.LocalTransport` in one process);
- :mod:`paramserver.cluster.driver`: the life of a step and of a run, for every backend;
- :func:`server_loads`: what each server carries, for ``paramserver check``;
- :class:`ClusterError`: runtime failures (timeouts, dead workers, non-finite gradients).

See ``docs/cluster.md``.
"""

from __future__ import annotations

from .errors import ClusterError, ServerLost
from .gradfn import GradFn, OnStep, RemoteGradFn
from .layout import ServerLayout, ServerLoad, plan_servers, server_loads
from .runtime import Cluster, workers_share_process
from .server import Server
from .slicing import compute_slices, partition_slices
from .transport import Handler, LocalTransport, Pending, Transport
from .worker import Worker

__all__ = ["Cluster", "ClusterError", "GradFn", "Handler", "LocalTransport", "OnStep",
           "Pending", "RemoteGradFn", "Server", "ServerLayout", "ServerLoad", "ServerLost",
           "Transport", "Worker", "compute_slices", "partition_slices", "plan_servers",
           "server_loads", "workers_share_process"]
