"""A group of keys updated as one: the dense pieces a batch of pushes names, on one server.

An MXNet user pushes and pulls the same list of keys every step. A key server
(:class:`~.keys.KeyServer`) keeps a :class:`~.server.Server` per key's piece, each with its
own values, updater state, versions and clocks; updating thousands of small keys one
``Server`` at a time costs tens of microseconds of Python each. A :class:`KeyGroup` holds
the pieces of one list of keys so that a step of all of them is one updater call:

- their **values** lie in one buffer, their **versions** in one array and their **updater
  state** in one :class:`~paramserver.state.UpdaterState` of one segment per key (the update
  counts per segment, so each key keeps its own); each piece's ``Server`` keeps *views* of
  them, so everything that reads or writes a key's own (a key's own push or get, save and
  load, ``state_dict``) sees and changes the same memory;
- their **clocks** (steps completed per worker group; the step gives the learning rate)
  are the group's while it holds them, one array per worker group. A key left out of a
  push is a step behind the others; a step of the group is one updater call when every
  key's step gives the same learning rate (always, for a constant rate or no updater),
  else the group lets its pieces go and the step runs key by key.

A group is made only of pieces that take a summed step (:meth:`~.server.Server.join`: a
plain dense piece of a key-value store, nothing open or waiting, the store's updater). It
holds them until anything else reaches one of them: every entry of a ``Server`` first asks
its holding group to :meth:`release` it (the clocks written back to every piece), so a
key's own requests — a push of the key alone, a get that waits for a version or a clock,
a worker leaving, a new updater, a restore — run on the piece's own state exactly as
without the group. A step applied through the group is bit for bit the step each piece
would have applied alone: the same updater over the same segments, with the same step.
"""

from __future__ import annotations

import threading

import numpy as np

from ..state import UpdaterState
from ..updaters import Updater
from .passes import kernel_guard
from .server import Server


class KeyGroup:
    """The pieces of one list of keys on one server, held and updated as one.

    Made by :meth:`make`; see the module docstring.

    Attributes:
        keys: the list of keys (the batch's names, joined).
        servers: each key's piece.
        bounds: each key's part of the buffers (``len(servers) + 1`` offsets).
        values: the pieces' values, one after the other.
        versions: each piece's version (its slice's).
        alive: whether the group holds its pieces (False once released).
    """

    def __init__(self, keys: str, servers: list[Server], bounds: list[int]):
        self.keys = keys
        self.servers = servers
        self.bounds = bounds
        self.offsets = np.asarray(bounds, np.int64)
        self.values: np.ndarray = np.zeros(0)
        self.versions: np.ndarray = np.zeros(0, np.int64)
        self.state: UpdaterState | None = None
        self.updater: Updater | None = None
        self.replaces = False
        self.clocks: dict[int, np.ndarray] = {}  # per worker group, each key's
        self.steps = 0  # steps applied while it held its pieces
        self.alive = False
        self._views: list[tuple[np.ndarray, np.ndarray, UpdaterState]] = []
        self._lock = threading.Lock()

    @classmethod
    def make(cls, keys: str, servers: list[Server], bounds: list[int], updater: Updater,
             replaces: bool, before: KeyGroup | None = None) -> KeyGroup | None:
        """Hold ``servers`` as one group (None: one of them cannot be held now, and none
        is). ``replaces``: the updater makes the values the summed gradient (no state to
        keep but the counts). ``before``: a group of the same list released earlier,
        whose buffers are taken again when every piece still views them (no copy)."""
        group = cls(keys, servers, bounds)
        with group._lock:
            joined: list[Server] = []
            clocks: list[dict[int, int]] = []
            for s in servers:
                if not s.join(group, updater):
                    for t in joined:
                        t.held_by = None
                    return None
                joined.append(s)
                clocks.append(s.clocks)
            group.clocks = {g: np.array([c[g] for c in clocks], np.int64)
                            for g in clocks[0]}
            group.updater, group.replaces = updater, replaces
            if before is not None and before.servers == servers and all(
                    s.values is v and s.versions is r and s.state is st
                    for s, (v, r, st) in zip(servers, before._views, strict=True)):
                group.values, group.versions = before.values, before.versions
                group.state, group._views = before.state, before._views
            else:
                group._gather()
            group.alive = True
        return group

    def _gather(self) -> None:
        """Copy the pieces' values, versions and state into one buffer each, and give
        every piece views of them."""
        servers = self.servers
        assert self.updater is not None
        self.values = np.concatenate([s.values for s in servers])  # type: ignore[misc]
        self.versions = np.concatenate([s.versions for s in servers])
        first = servers[0].state
        self.state = UpdaterState(first.roles, self.offsets, first.dtype, {
            r.name: np.concatenate([s.state.arrays[r.name] for s in servers])
            for r in first.roles})
        views = []
        for i, s in enumerate(servers):
            a, b = self.bounds[i], self.bounds[i + 1]
            view = (self.values[a:b], self.versions[i:i + 1], self.state.segments(i, i + 1))
            s.values, s.versions, s.state = view
            views.append(view)
        self._views = views

    def apply(self, group: int, total: np.ndarray) -> bool:
        """One step of worker group ``group``, ``total`` the summed (finite) gradients of
        every key, in the buffer's order: every piece updated, its version and its clock
        moved. False, with nothing done, once the group released its pieces."""
        with self._lock:
            if not self.alive or group not in self.clocks:
                return False
            assert self.state is not None and self.updater is not None
            clocks = self.clocks[group]
            if self.replaces:
                np.add(self.state.counts, 1, out=self.state.counts)
                np.copyto(self.values, total)
            else:
                with kernel_guard():
                    for step, skip in self._runs(clocks):
                        self.updater.apply(step, self.values, total, self.state, skip=skip)
            self.versions += 1
            clocks += 1
            self.steps += 1
            return True

    def _runs(self, clocks: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
        """The updater calls of a step: ``(step, skip)`` — one call when every key's step
        gives the same learning rate; else one per rate, each skipping the keys of the
        others (a key's update is then exactly its own step's)."""
        first = int(clocks[0])
        if int(clocks.min()) == int(clocks.max()):
            return [(first, None)]
        assert self.updater is not None
        by_rate: dict[float, list[int]] = {}
        for t in np.unique(clocks).tolist():
            by_rate.setdefault(float(self.updater.lr(t)), []).append(t)
        if len(by_rate) == 1:
            return [(first, None)]
        return [(steps[0], ~np.isin(clocks, steps)) for steps in by_rate.values()]

    def release(self) -> None:
        """Give every piece its clocks back; from now on each holds its own."""
        with self._lock:
            if not self.alive:
                return
            self.alive = False
            clocks = {g: c.tolist() for g, c in self.clocks.items()}
            for i, s in enumerate(self.servers):
                s.leave_group({g: c[i] for g, c in clocks.items()}, self.steps)

    def holds_views(self) -> bool:
        """Whether every piece still views this group's buffers (a group of the same
        list made again may take them without a copy)."""
        return bool(self._views) and all(
            s.values is v for s, (v, _, _) in zip(self.servers, self._views, strict=True))

    def __repr__(self) -> str:
        return (f"KeyGroup({len(self.servers)} keys, {self.values.size} values, "
                f"{'held' if self.alive else 'released'})")


__all__ = ["KeyGroup"]
