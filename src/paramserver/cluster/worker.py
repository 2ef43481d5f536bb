"""The worker stub: a worker's side of the messages (SPEC §7).

A :class:`Worker` owns a replica of the job's :class:`~paramserver.params.ParamSet`: the
values of its server group (inside one process, the very memory the servers update) and
gradients of its own. Per step it

1. sums the gradients of the Params that share one owner (stub aggregation, SPEC §7),
2. under ``cluster.nonfinite: skip``, checks them for NaN and Inf and drops such a push,
   noting why in :attr:`Worker.notes` (the driver warns with it; under ``error``, the
   default, the servers check the gradients before they update, and stop the run with an
   error naming the Params),
3. sends each server with a part of the values an :class:`Update` holding a view of its
   range of the gradients (nothing is copied), and
4. collects the replies: a reply's values are copied into the replica only when they are
   not its own memory already (between processes), and the versions are recorded. With the
   updater's ``clip_norm`` the servers first answer with their parts of the squared
   gradient norm (:class:`Norm`); the worker adds them in server order and sends each server
   the global norm (:class:`Clip`), whose replies are the values.

Row-sparse tables (SPEC §10; :class:`~paramserver.params.TableParam`) are not pulled with
the values: a table's :meth:`~paramserver.params.TableParam.rows` asks the servers holding
them for the rows it needs (:meth:`Worker.pull_rows`), and its gradient rows, summed per id,
travel with the step's update as ``(ids, rows)`` to the servers of their rows. A worker's
replica then need not hold the tables at all.

Every wait is :meth:`Pending.wait <paramserver.cluster.transport.Pending.wait>` with the
cluster's timeout, and its message names this worker, the step and what it waited for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..config.job import ClusterConf
from ..params import ParamSet, TableParam
from .errors import ClusterError
from .layout import ServerLayout
from .messages import Clip, Get, Leave, Norm, Reply, Update, Values
from .passes import all_finite, nonfinite_text, workers_check
from .server import server_name
from .transport import Pending, Transport


def _data(a: np.ndarray) -> tuple[int, tuple[int, ...]]:
    return a.__array_interface__["data"][0], a.shape


def _idle_of(idle: np.ndarray | None, layout: ServerLayout) -> np.ndarray | None:
    """A server's part of the owners' idle flags: one per dense segment of its range (None
    when none is idle)."""
    if idle is None:
        return None
    part = np.ascontiguousarray(idle[layout.owners[:layout.num_dense]], bool)
    return part if part.any() else None


class Worker:
    """One worker of one group; what a gradient function gets to fill its gradients.

    Attributes:
        group: its worker group.
        index: its index within the group.
        rank: its index among all workers (``group × nworkers_per_group + index``).
        params: its replica of the ParamSet: write the gradients into ``params[name].grad``
            (or ``params.grads``); read the values from ``params[name].data``.
        version: the smallest slice version it has seen (the updates applied to the values
            it reads); each Param of ``params`` records its own.
        step: the step it is working on.
        skipped: pushes it dropped for non-finite gradients.
        notes: warnings of its steps, for the driver to raise in the caller's thread (a
            worker's thread or process is not where the user looks).
    """

    def __init__(self, group: int, index: int, params: ParamSet,
                 layouts: Sequence[ServerLayout], transport: Transport, conf: ClusterConf):
        self.group = group
        self.index = index
        self.rank = group * conf.nworkers_per_group + index
        self.params = params
        self.conf = conf
        self.server_group = group % conf.nserver_groups
        self.version = 0
        self.step = 0
        self.skipped = 0
        self.notes: list[str] = []
        self.name = f"worker {index} of group {group}"
        self._transport = transport
        # Servers with nothing to hold take no part.
        self._layouts = [L for L in layouts if L.size > 0]
        grads, values = params.owner_grads(), params.values
        dense = params.dense_size  # the tables' values are not pulled with the others
        self._grads = [grads[L.start:min(L.stop, dense)] for L in self._layouts]
        self._values = [values[L.start:max(L.start, min(L.stop, dense))]
                        for L in self._layouts]
        # Per table, its pieces: (server position, segment, first row, rows).
        self._pieces: dict[str, list[tuple[int, int, int, int]]] = {}
        for i, L in enumerate(self._layouts):
            for seg in L.tables:
                rows = int(L.offsets[seg + 1] - L.offsets[seg]) // int(L.dims[seg])
                self._pieces.setdefault(L.names[seg], []).append(
                    (i, seg, int(L.first_rows[seg]), rows))  # type: ignore[index]
        for table in params.tables:
            table.fetch = self.pull_rows
        self._shares = [params.num_shares[L.owners] for L in self._layouts]
        self._has_sharers = any(p.owner is not None for p in params.params)
        nslices = sum(L.num_slices for L in self._layouts)
        self._slice_versions = np.zeros(nslices, np.int64)
        self._slice_pos = np.cumsum([0, *(L.num_slices for L in self._layouts)])
        # Param versions: the smallest version of each owner's slices.
        owner_of_slice = np.concatenate([L.slice_owners for L in self._layouts]
                                        or [np.zeros(0, np.int64)])
        self._versioned, self._first_slice = np.unique(owner_of_slice, return_index=True)

    def _address(self, layout: ServerLayout) -> tuple[int, int]:
        return self.server_group, layout.index

    def _server_name(self, layout: ServerLayout) -> str:
        return server_name(layout.index, self.server_group, self.conf.nserver_groups)

    def _who(self, step: int) -> str:
        return f"{self.name} at step {step}"

    # -- the messages -----------------------------------------------------------------------

    def pull(self, step: int, version: int = 0, clock: int | None = None) -> None:
        """Get the values once every server is at ``version`` and, with ``clock``, once
        every live worker group it serves has finished ``clock`` steps."""
        def what(L: ServerLayout) -> str:
            if clock is not None:
                return (f"every worker group of {self._server_name(L)} to finish step "
                        f"{clock - 1} (staleness {self.conf.staleness})")
            return f"{self._server_name(L)} to reach version {version}"

        pendings = [self._transport.send(
            self._address(L), Get(self.group, self.index, step, version, clock), what(L))
            for L in self._layouts]
        for i, pending in enumerate(pendings):
            reply = pending.wait(self.conf.timeout, self._who(step))
            assert isinstance(reply, Values)
            self._adopt(i, reply.values, reply.versions)
        self._update_versions()

    def push(self, step: int) -> list[Pending]:
        """Send this step's gradients to every server; returns what :meth:`collect` waits on."""
        self.step = step
        idle, self.params.idle = self.params.idle, None  # the grad function's, this step's
        if self._has_sharers:
            self.params.sum_shared_grads()
        grads: list[np.ndarray | None] = list(self._grads)
        tables = {t.name: t.take_grad_rows() for t in self.params.tables}
        rows = self._rows_by_server(tables)
        # A pass here where the servers cannot decide alone (passes.workers_check).
        if workers_check(self.conf) and not (
                all_finite(self.params.owner_grads())
                and all(all_finite(r.reshape(-1)) for _, r in tables.values())):
            if self.conf.nonfinite == "error":  # no server has this step: none writes it
                raise ClusterError(
                    f"non-finite gradient at step {step} from {self.name} (rank {self.rank})"
                    f": {self._nonfinite_params(tables)}; this step's update is refused and "
                    "the run stops (the values and the updater state are as they were "
                    "before the step; cluster.nonfinite 'skip' drops such pushes instead)")
            self.notes.append(f"non-finite gradient at step {step} from {self.name} (rank "
                              f"{self.rank}): {self._nonfinite_params(tables)}; the push is "
                              "dropped (cluster.nonfinite is 'skip')")
            self.skipped += 1
            grads = [None] * len(grads)
            rows = [None] * len(rows)
        out = []
        for L, g, r in zip(self._layouts, grads, rows, strict=True):
            ids, part, splits = r if r is not None else (None, None, None)
            out.append(self._transport.send(
                self._address(L), Update(self.group, self.index, step, g, ids, part, splits,
                                         idle=_idle_of(idle, L)),
                f"{self._server_name(L)}'s reply to its update"))
        return out

    def _rows_by_server(self, tables: dict[str, tuple[np.ndarray, np.ndarray]]
                        ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
        """Per server, the gradient rows of its table segments: ``(ids, rows, splits)``
        (ids from each segment's first row), or None for a server without tables."""
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = []
        for L in self._layouts:
            if not len(L.tables):
                out.append(None)
                continue
            ids, rows, splits = [], [], [0]
            for seg in L.tables:
                t_ids, t_rows = tables[L.names[seg]]
                first = int(L.first_rows[seg])  # type: ignore[index]
                n = int(L.offsets[seg + 1] - L.offsets[seg]) // int(L.dims[seg])
                a, b = np.searchsorted(t_ids, [first, first + n])
                ids.append(t_ids[a:b] - first)
                rows.append(t_rows[a:b].reshape(-1))
                splits.append(splits[-1] + int(b - a))
            out.append((np.concatenate(ids), np.concatenate(rows),
                        np.array(splits, np.int64)))
        return out

    def pull_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (sorted, unique) of table ``name`` from the servers that hold them,
        as they are now (``len(ids) × dim``)."""
        table = self.params[name]
        assert isinstance(table, TableParam)
        out = np.empty((len(ids), table.dim), table.dtype)
        pendings = []
        for i, seg, first, n in self._pieces.get(name, []):
            a, b = (int(x) for x in np.searchsorted(ids, [first, first + n]))
            if b > a:
                L = self._layouts[i]
                pendings.append(((a, b), self._transport.send(
                    self._address(L), Get(self.group, self.index, self.step,
                                          ids=ids[a:b] - first, segment=seg),
                    f"rows of '{name}' from {self._server_name(L)}")))
        for (a, b), pending in pendings:
            reply = pending.wait(self.conf.timeout, self._who(self.step))
            assert isinstance(reply, Values)
            out[a:b] = reply.values.reshape(b - a, table.dim)
        return out

    def collect(self, pendings: Sequence[Pending], step: int) -> None:
        """Wait for the replies to :meth:`push`: the values after the step's update (with
        ``clip_norm``, after the exchange of the global norm)."""
        replies: list[Reply] = [p.wait(self.conf.timeout, self._who(step)) for p in pendings]
        if replies and isinstance(replies[0], Norm):
            replies = self._clip(replies, step)
        for i, reply in enumerate(replies):
            assert isinstance(reply, Values)
            self._adopt(i, reply.values, reply.versions)
        self._update_versions()

    def _clip(self, parts: Sequence[Reply], step: int) -> list[Reply]:
        """The global norm from every server's part (added in server order, so that every
        worker of the group finds the same), sent to every server; their values."""
        total = 0.0
        for part in parts:
            assert isinstance(part, Norm)
            total += part.sum_squares
        norm = math.sqrt(total)
        pendings = [self._transport.send(
            self._address(L), Clip(self.group, self.index, step, norm),
            f"{self._server_name(L)}'s reply to its clip (the global gradient norm)")
            for L in self._layouts]
        return [p.wait(self.conf.timeout, self._who(step)) for p in pendings]

    def leave(self, step: int) -> None:
        """Tell the servers this worker sends nothing from ``step`` on."""
        pendings = [self._transport.send(
            self._address(L), Leave(self.group, self.index, step),
            f"{self._server_name(L)}'s reply to its leave") for L in self._layouts]
        for pending in pendings:
            pending.wait(self.conf.timeout, self._who(step))

    # -- bookkeeping ------------------------------------------------------------------------

    def _adopt(self, i: int, values: np.ndarray, versions: np.ndarray) -> None:
        if _data(values) != _data(self._values[i]):  # not our memory: values travelled
            np.copyto(self._values[i], values)
        self._record(i, versions)

    def _record(self, i: int, versions: np.ndarray) -> None:
        self._slice_versions[self._slice_pos[i]:self._slice_pos[i + 1]] = versions

    def _update_versions(self) -> None:
        v = self._slice_versions
        if len(v) == 0:
            return
        self.version = int(v.min())
        per_owner = np.minimum.reduceat(v, self._first_slice)
        owners = self.params.owners
        for i, ver in zip(self._versioned.tolist(), per_owner.tolist(), strict=True):
            owners[i].version = ver

    def _nonfinite_params(self, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
        found = []
        for p in self.params.params:
            counts = nonfinite_text(tables[p.name][1] if p.row_sparse else p.grad)
            if counts:
                share = f", shares '{p.owner.name}'" if p.owner is not None else ""
                found.append(f"'{p.name}' ({counts}{share})")
        return "Params " + ", ".join(found) if found else "the sum of shared gradients"

    def __repr__(self) -> str:
        return f"Worker({self.name}, rank={self.rank}, version={self.version})"


__all__ = ["Worker"]
