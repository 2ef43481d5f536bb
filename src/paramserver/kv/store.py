"""The key-value client (SPEC §10), in the spirit of MXNet's KVStore and ps-lite's KVWorker.

``create(mode)`` makes the servers (:class:`~paramserver.cluster.keys.KeyServer`, embedded or
as Ray actors) and returns the :class:`KVStore` of the caller::

    kv = paramserver.kv.create("local")
    kv.init(3, np.ones((2, 3), np.float32))
    kv.push(3, [g1, g2])              # summed first
    kv.pull(3, out=w)                 # without an updater: w = g1 + g2

With several workers (``dist_sync``, ``dist_async``), :meth:`KVStore.run` runs a function on
every worker — threads of this process, or Ray actors — each with a store of its own rank::

    kv = paramserver.kv.create("dist_sync", num_workers=4, num_servers=2)
    def train(kv):
        kv.init("w", w0)              # rank 0's value is used
        kv.set_updater({"type": "kSGD", "learning_rate": {"base_lr": 0.1}})
        for step in range(100):
            kv.push("w", grad(kv.rank, step))
            kv.pull("w", out=w)
    kv.run(train)

Every request is a message of :mod:`paramserver.cluster.messages` through the backend's
transport, and the driver of a run is the cluster's
(:class:`~paramserver.cluster.driver.Driver`): the same code on both backends.

Ordering: a push returns at once; a later pull (or push) of the same key by the same store
waits for it first, so a store reads its own writes; :meth:`KVStore.wait` waits for every
push. In ``dist_sync`` a push is applied when every live worker has pushed that key as many
times (one update with the sum); in ``dist_async`` each push is applied as it comes, and
with ``staleness`` a pull waits until no worker is more than that many pushes of the key
behind the puller.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from ..checkpoint import load_checkpoint, save_checkpoint
from ..cluster.compression import Compression, encode, encode_ids
from ..cluster.driver import Driver
from ..cluster.errors import ClusterError
from ..cluster.keys import BOUND, FUNCTION, home_of, key_name, plan_key, row_dim, updater_text_of
from ..cluster.layout import plan_servers
from ..cluster.messages import (
    KEY_SEPARATOR,
    Barrier,
    Describe,
    DescribeKeys,
    Get,
    GetState,
    KeyBatch,
    Keyed,
    KeyInfo,
    KeyInfos,
    KeyInit,
    KeyInits,
    Problems,
    Reply,
    SetState,
    SetUpdater,
    State,
    Update,
    Values,
)
from ..cluster.passes import all_finite, nonfinite_text, workers_check
from ..cluster.transport import LocalTransport, Pending, Transport, send_after
from ..config import ParamError
from ..config.job import ClusterConf, UpdaterConf
from ..params import ParamSet
from ..paths import shown
from ..updaters import Updater, create_updater
from .modes import MODES, mode_of
from .plans import Plan, gather, make_plan, outs_fit, scatter, values_fit
from .rowsparse import place_rows, pull_plan, row_ids_of
from .values import Fill, RowResidual, RowSparse, value_dtype

FORMAT = "paramserver-kv/1"


@dataclass(frozen=True)
class StoreSpec:
    """What every store of one key-value store shares, as plain data (sent to Ray workers).

    Attributes:
        mode: ``local``, ``dist_sync`` or ``dist_async``.
        num_workers, num_servers: the store's.
        bound: values below which a key lies whole on one server.
        compression: ``{"type", "threshold"}`` of the pushes.
        cluster: the cluster configuration's JSON.
    """

    mode: str
    num_workers: int
    num_servers: int
    bound: int
    compression: tuple[str, float]
    cluster: str

    def conf(self) -> ClusterConf:
        return ClusterConf.parse(json.loads(self.cluster))


@dataclass
class _Key:
    """A key as a store knows it: its description, where its pieces lie, its pushes."""

    name: str
    int_key: bool
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    row_sparse: bool
    pieces: list[tuple[int, int, int]]
    pending: list[Pending] = field(default_factory=list)
    residuals: list[Any] = field(default_factory=list)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dim(self) -> int:
        return row_dim(self.shape) if self.row_sparse else 1

    @property
    def num_rows(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    def bounds(self, lo: int, hi: int) -> tuple[int, int]:
        """Values ``lo:hi`` of the flat value for a piece of rows (table) or values."""
        return (lo * self.dim, hi * self.dim) if self.row_sparse else (lo, hi)

    def describe(self) -> str:
        kind = "row-sparse " if self.row_sparse else ""
        return f"{kind}{self.dtype.name} {self.shape}"


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


class _Batch:
    """What one server is sent of a call: each key's part (its values, or its rows by id,
    or the ids of the rows asked for), then one :class:`KeyBatch` of them."""

    __slots__ = ("data", "dims", "ids", "names", "reply", "tables")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.data: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.tables: list[bool] = []
        self.dims: list[int] = []
        self.reply: np.ndarray | None = None

    def add(self, name: str, data: np.ndarray | None, ids: np.ndarray | None = None,
            dim: int = 0) -> None:
        self.names.append(name)
        if data is not None:
            self.data.append(data)
        self.tables.append(ids is not None)
        self.ids.append(ids if ids is not None else _NO_IDS)
        self.dims.append(dim)

    def message(self, request: Get | Update, dtype: Any, sends_copy: bool) -> KeyBatch:
        """The batch: an update's parts in one buffer, and the ids in one (copies, unless
        ``sends_copy`` -- the transport copies as it sends, or the arrays are the store's
        own -- and there is one part)."""
        data = offsets = None
        # (the bounds summed in Python: np.cumsum of a list of a few sizes costs more)
        if self.data:
            offsets = np.array([0, *accumulate(p.size for p in self.data)], np.int64)
            one = self.data[0]
            data = (one if sends_copy and len(self.data) == 1 and one.dtype == dtype
                    else np.concatenate(self.data, dtype=dtype))
        tables = ids = id_offsets = None
        if any(self.tables):
            tables = np.array(self.tables, np.bool_)
            id_offsets = np.array([0, *accumulate(i.size for i in self.ids)], np.int64)
            ids = (self.ids[0] if sends_copy and len(self.ids) == 1
                   else np.concatenate(self.ids, dtype=np.int64))
        return KeyBatch(KEY_SEPARATOR.join(self.names), request, offsets, data, tables, ids,
                        id_offsets)


_NO_IDS = np.zeros(0, np.int64)
#: Lists of keys whose plans a store keeps (more: it forgets them all and plans again).
MAX_PLANS = 64


class KVStore:
    """A key-value store as one worker (or the process that made it) sees it.

    Made by :func:`create`; the stores of a run's workers are made by :meth:`run`.

    Attributes:
        type: the mode (``local``, ``dist_sync``, ``dist_async``).
        rank: this worker's rank (0 for the store :func:`create` returns).
        num_workers: the workers of the store.
        num_servers: its servers.
    """

    def __init__(self, spec: StoreSpec, transport: Transport, *, group: int = 0,
                 index: int = 0, rank: int = 0, worker: bool = True,
                 driver: Driver | None = None):
        self._spec = spec
        self._conf = spec.conf()
        self._transport = transport
        self._group, self._index, self.rank = group, index, rank
        self._worker = worker
        self._driver = driver
        self._keys: dict[str, _Key] = {}
        self._known: dict[Any, _Key] = {}  # by the key as given (an int or a str), once checked
        self._int_keys: bool | None = None
        self._compression = Compression.parse(
            {"type": spec.compression[0], **({"threshold": spec.compression[1]}
                                              if spec.compression[0] == "2bit" else {})})
        self._plans: dict[tuple[Any, ...], Plan | None] = {}  # by list of keys as given
        self._barriers = 0
        self._updater: str | None = None
        self._closed = False
        #: The servers are in this process and run each request in the sender's thread, and
        #: this store is the only worker: a push is applied before send returns, and a
        #: table's rows may be read straight into an out (:meth:`KeyServer.rows_into`).
        self._in_process = (isinstance(transport, LocalTransport)
                            and spec.num_workers == 1)
        self._lock = threading.Lock()

    # -- what it is -------------------------------------------------------------------------

    @property
    def type(self) -> str:
        return self._spec.mode

    @property
    def num_workers(self) -> int:
        return self._spec.num_workers

    @property
    def num_servers(self) -> int:
        return self._spec.num_servers

    @property
    def _who(self) -> str:
        return f"worker {self.rank}" if self._worker else "the store's maker"

    def __repr__(self) -> str:
        return (f"KVStore({self.type}, rank {self.rank} of {self.num_workers} workers, "
                f"{self.num_servers} servers, {len(self._keys)} keys known)")

    # -- messages ---------------------------------------------------------------------------

    def _send(self, server: int, request: Any, what: str) -> Pending:
        self._check_open()
        return self._transport.send((0, server), request, f"server {server}'s {what}")

    def _check_open(self) -> None:
        if self._closed:
            raise ParamError("the key-value store is closed (close() stopped its servers): "
                             "create() another")

    def _wait(self, pendings: Sequence[Pending]) -> list[Reply]:
        return [p.wait(self._conf.timeout, self._who) for p in pendings]

    # -- keys -------------------------------------------------------------------------------

    def _name(self, key: Any) -> tuple[str, bool]:
        name, int_key = key_name(key)
        if self._int_keys is not None and int_key != self._int_keys:
            have = "int" if self._int_keys else "str"
            raise ParamError(f"key {key!r} is {'an int' if int_key else 'a str'}, but this store's "
                             f"keys are {have}s: a store's keys are all int or all str")
        return name, int_key

    def _key(self, key: Any) -> _Key:
        """A key's description: known, or asked of its home server (waits for its init)."""
        if type(key) is int or type(key) is str:  # (not bool, which is an int)
            known = self._known.get(key)
            if known is not None:
                return known
        name, int_key = self._name(key)
        found = self._keys.get(name)
        if found is not None:
            self._known[key] = found
            return found
        home = home_of(name, int_key, self.num_servers)
        # With other workers, rank 0 may not have made it yet: wait for its init.
        try:
            reply = self._wait([self._send(home, Describe(name, self.num_workers > 1),
                                           f"description of key {key!r} (its init)")])[0]
        except ClusterError as e:
            raise (ParamError(str(e).split(": ", 1)[-1]) if self.num_workers == 1
                   else e) from None
        assert isinstance(reply, KeyInfo)
        return self._remember(reply)

    def _prefetch(self, keys: Sequence[Any]) -> None:
        """Ask for the descriptions of the keys not known yet, one message per home server
        (a worker's first call with many keys; each waits for the key's init). With one
        worker every key is its own store's: nothing to ask."""
        if self.num_workers == 1:
            return
        wanted: dict[int, dict[str, None]] = {}
        for key in keys:
            if (type(key) is int or type(key) is str) and key in self._known:
                continue
            name, int_key = self._name(key)
            if name not in self._keys:
                wanted.setdefault(home_of(name, int_key, self.num_servers), {})[name] = None
        asked = [(s, list(names)) for s, names in wanted.items() if len(names) > 1]
        if not asked:
            return
        replies = self._wait([self._send(s, DescribeKeys(KEY_SEPARATOR.join(names)),
                                         f"descriptions of {len(names)} keys (their init)")
                              for s, names in asked])
        for reply in replies:
            assert isinstance(reply, KeyInfos)
            for name, shape, dtype, sparse, int_key in json.loads(reply.infos):
                if name not in self._keys:
                    self._remember(KeyInfo(name, tuple(shape), dtype, sparse, int_key))

    def _remember(self, info: KeyInfo) -> _Key:
        shape = tuple(int(x) for x in info.shape)
        k = _Key(info.key, bool(info.int_key), shape, np.dtype(info.dtype),
                 bool(info.row_sparse), plan_key(info.key, bool(info.int_key), shape,
                                                 bool(info.row_sparse), self.num_servers,
                                                 self._spec.bound))
        k.residuals = [None] * len(k.pieces)
        self._keys[k.name] = k
        self._plans.clear()
        if self._int_keys is None:
            self._int_keys = k.int_key
        return k

    @staticmethod
    def _pairs(keys: Any, values: Any, what: str) -> list[tuple[Any, Any]]:
        """MXNet's pairing: one key and a value (or a list of values for it), or a list of
        keys and one value (or list) for each."""
        if _is_list(keys):
            if not _is_list(values) or len(values) != len(keys):
                raise ParamError(f"{what}: {len(keys)} keys need a list of {len(keys)} values, "
                                 f"one per key")
            return list(zip(keys, values, strict=True))
        return [(keys, values)]

    # -- init -------------------------------------------------------------------------------

    def init(self, key: Any, value: Any, *, row_sparse: bool | Sequence[bool] = False) -> None:
        """Initialise keys (an int or str, or a list) with values (arrays, or :class:`Fill`,
        or a list). Every worker calls it for the same keys; only rank 0's values are used
        (the others wait for them, and their shapes must agree). A second init of a key is
        an error. ``row_sparse`` (for every key, or a list with one per key): the keys are
        tables whose rows are pulled and pushed by id (:meth:`row_sparse_pull`), sliced over
        the servers by rows."""
        pairs = self._pairs(key, value, "init")
        sparse = (list(row_sparse) if isinstance(row_sparse, (list, tuple))
                  else [bool(row_sparse)] * len(pairs))
        if len(sparse) != len(pairs):
            raise ParamError(f"init: row_sparse has {len(sparse)} flags for {len(pairs)} keys")
        seen: set[str] = set()
        for k, _ in pairs:  # every problem of the call before anything is sent
            name, _ = self._name(k)
            if name in self._keys or name in seen:
                raise ParamError(f"init of key {k!r}: it is initialised already (a second init "
                                 "of a key is an error)")
            seen.add(name)
        if len(pairs) == 1:
            self._init_one(pairs[0][0], pairs[0][1], bool(sparse[0]))
            return
        if self.rank != 0:  # rank 0's descriptions, to check ours against
            self._prefetch([k for k, _ in pairs])
        plans = [self._init_plan(k, v, bool(flag))
                 for (k, v), flag in zip(pairs, sparse, strict=True)]
        made = [p for p in plans if p is not None]
        if not made:
            return
        # one message per server: the home servers' first (each refuses a second init
        # before any piece is made), then the other pieces of keys cut over several
        what = f"reply to the init of {len(made)} keys"
        for first in (True, False):
            per_server: dict[int, list[KeyInit]] = {}
            for _, messages in made:
                for s, m in messages[:1] if first else messages[1:]:
                    per_server.setdefault(s, []).append(m)
            self._wait([self._send(s, m[0] if len(m) == 1 else _key_inits(m), what)
                        for s, m in per_server.items()])
        for k, _ in made:
            k.residuals = [None] * len(k.pieces)
            self._keys[k.name] = k

    def _init_one(self, key: Any, value: Any, row_sparse: bool) -> None:
        plan = self._init_plan(key, value, row_sparse)
        if plan is None:
            return
        k, messages = plan
        (home, first), rest = messages[0], messages[1:]
        # The home server first: it refuses a second init before any piece is made.
        self._wait([self._send(home, first, f"reply to the init of key {key!r}")])
        self._wait([self._send(s, m, f"reply to the init of key {key!r}") for s, m in rest])
        k.residuals = [None] * len(k.pieces)
        self._keys[k.name] = k

    def _init_plan(self, key: Any, value: Any, row_sparse: bool
                   ) -> tuple[_Key, list[tuple[int, KeyInit]]] | None:
        """A key's init on rank 0: its description and the message of each server, the
        home server's first; on another rank (None), its description checked against rank
        0's."""
        name, int_key = self._name(key)
        where = f"init of key {key!r}"
        if isinstance(value, Fill):
            shape = tuple(int(x) for x in value.shape)
            dtype = value_dtype(value.dtype, where)
            array = None
        else:
            array = np.asarray(value)
            shape, dtype = tuple(array.shape), value_dtype(array.dtype, where)
        if row_sparse and len(shape) < 1:
            raise ParamError(f"{where}: a row-sparse key is a table (rows first), not a scalar")
        if dtype.kind != "f" and (row_sparse or isinstance(value, Fill)):
            raise ParamError(f"{where}: {dtype} values (counts) are given as an array of a "
                             "dense key; row-sparse tables and fills hold floats")
        info = KeyInfo(name, shape, dtype.name, row_sparse, int_key)
        if self.rank != 0:  # rank 0's value is used: wait for it, and check ours agrees
            k = self._key(key)
            if (k.shape, k.dtype, k.row_sparse) != (shape, dtype, row_sparse):
                raise ParamError(f"{where} on rank {self.rank}: {info_text(info)}, but rank 0 "
                                 f"initialised it as {k.describe()}")
            return None
        if self._int_keys is None:
            self._int_keys = int_key
        plan = plan_key(name, int_key, shape, row_sparse, self.num_servers, self._spec.bound)
        k = _Key(name, int_key, shape, dtype, row_sparse, plan)
        fill, seed = "", 0
        flat: np.ndarray | None = None
        if isinstance(value, Fill):
            gen_conf = value.conf()
            from ..init import create_param_generator

            generator = create_param_generator(gen_conf)
            if generator.fills_pieces:
                fill, seed = gen_conf.to_json(), int(value.seed)
            else:  # a method that fills whole Params: filled here, sent as values
                flat = _fill_whole(generator, name, shape, dtype, int(value.seed))
        else:
            assert array is not None
            # a copy: in one process the servers keep what they are given, and the caller's
            # array (one array given to several keys, say) must not become the keys' values
            flat = np.array(array, dtype, order="C", copy=True).reshape(-1)
        home = home_of(name, int_key, self.num_servers)

        def message(server: int, lo: int, hi: int, is_home: bool) -> KeyInit:
            a, b = k.bounds(lo, hi)
            return KeyInit(name, shape, dtype.name, row_sparse, int_key, is_home, (lo, hi),
                           None if flat is None else flat[a:b], fill, seed)

        holds = {s: (lo, hi) for s, lo, hi in plan}
        first = (message(home, *holds[home], True) if home in holds else
                 KeyInit(name, shape, dtype.name, row_sparse, int_key, True, None))
        return k, [(home, first), *((s, message(s, lo, hi, False)) for s, lo, hi in plan
                                    if s != home)]

    # -- the updater ------------------------------------------------------------------------

    def set_updater(self, updater: UpdaterConf | Mapping[str, Any] | str | Updater
                    | Callable[[Any, np.ndarray, np.ndarray], None] | None) -> None:
        """The update method of every key, as a declaration: an ``updater { }`` block's text,
        a dict or an ``UpdaterConf`` (SPEC §5), never a pickled object; None: none (a push
        then replaces the values by the sum of the step's gradients). Changing the method
        starts every key's updater state from zero; setting the same one changes nothing.

        Or, as MXNet's ``set_updater``, a Python function ``updater(key, input, stored)``
        that updates ``stored`` (the key's values, an array to change in place) from
        ``input`` (the sum of the step's pushes); the key is given as it was made (int or
        str). The function runs where the servers are, so only on a store whose servers are
        in this process (the embedded backend), set on the store :func:`create` returned;
        on Ray it is refused (it would have to be pickled to reach them). A key cut into
        pieces on several servers (``bound`` values or more) is given piece by piece, each
        flat; a table's push, the rows pushed (``len(ids) × row``)."""
        if callable(updater) and not isinstance(updater, (str, Mapping, UpdaterConf,
                                                          Updater)):
            self._set_function(updater)
            return
        text = _updater_text(updater)
        self._wait([self._send(s, SetUpdater(text), "reply to set_updater")
                    for s in range(self.num_servers)])
        self._updater = text

    #: MXNet's name (it takes the same declarations).
    set_optimizer = set_updater
    #: MXNet's private name of the in-process form (``kv._set_updater(fn)``).
    _set_updater = set_updater

    def _set_function(self, fn: Callable[[Any, np.ndarray, np.ndarray], None]) -> None:
        backend = getattr(self._driver, "backend", None)
        servers = getattr(backend, "servers", None)
        if backend is None or not getattr(backend, "one_process", False) or servers is None:
            where = ("its servers are Ray actors in other processes" if backend is not None
                     else "this store is a worker's (set it on the store create() returned, "
                          "before run())")
            raise ParamError(f"set_updater: a Python function runs in-process only, and {where}"
                             "; give the update method as a declaration (an updater { } "
                             "block's text, a dict or an UpdaterConf), which every server "
                             "reads as it is")
        self.wait()
        for server in servers.values():
            server.set_function(fn)
        self._updater = updater_text_of(fn)

    #: What :meth:`is_capable` answers to (MXNet's ``KVStoreBase.OPTIMIZER``).
    OPTIMIZER = "optimizer"

    def is_capable(self, capability: str) -> bool:
        """MXNet's query of what the store can do: ``"optimizer"`` -- whether the servers
        run the update method (here always: every mode, every backend). Anything else is a
        ValueError (a :class:`~paramserver.ParamError`), as MXNet's."""
        if str(capability).lower() == self.OPTIMIZER:
            return True
        raise ParamError(f"Unknown capability: {capability} (known: '{self.OPTIMIZER}')")

    def set_gradient_compression(self, compression: Mapping[str, Any] | str | None) -> None:
        """Compress this store's pushes: ``{"type": "2bit", "threshold": 0.5}`` (MXNet's),
        ``{"type": "bf16"}`` or None (see :mod:`paramserver.cluster.compression`)."""
        self._compression = Compression.parse(compression)
        for k in self._keys.values():
            k.residuals = [None] * len(k.pieces)

    # -- broadcast ----------------------------------------------------------------------------

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        """MXNet's: initialise keys with rank 0's ``value`` and pull them into ``out`` on
        every worker (:meth:`init`, then :meth:`pull`; lists as theirs). As with MXNet's
        store, a key is broadcast once: it is initialised then. ``priority`` is accepted
        and not used."""
        self.init(key, value)
        self.pull(key, out=out)

    # -- push -------------------------------------------------------------------------------

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Push gradients: a key and its value (an array, a :class:`RowSparse` or an
        ``(ids, rows)`` tuple for a table, or a list of them, summed first), or a list of
        keys and a value (or list) for each. Returns at
        once; the store's next pull or push of the key waits for it. ``priority`` is
        accepted and not used."""
        if not self._worker:
            raise ParamError("push: the store's maker does not push when the store has "
                             f"{self.num_workers} workers; its workers do, in run()")
        if (_is_list(key) and _is_list(value) and len(key) == len(value)
                and not self._compression.codec):
            plan = self._plan(key)
            if plan is not None and values_fit(plan, value) and self._push_planned(plan, value):
                return
        if self._in_process and not _is_list(key) and self._push_rows(key, value):
            return
        pairs = self._pairs(key, value, "push")
        if not self._push_batch(pairs):
            for k, v in pairs:  # every dense array checked before any key is pushed
                kk = self._key(k)
                if not kk.row_sparse and isinstance(v, np.ndarray):
                    _dense_value(kk, v, f"push of key {k!r}")
            for k, v in pairs:
                self._push_one(k, v)

    def _push_batch(self, pairs: list[tuple[Any, Any]]) -> bool:
        """ps-lite's push: one :class:`~paramserver.cluster.messages.KeyBatch` per server,
        every key's gradient for it (a dense key's values, a table's rows by id) in one
        buffer (a copy: the caller may change its arrays once push returns). False, with
        nothing sent, when a value needs a key's own path: a list of values to sum, counts,
        compression, a key given twice, a value of another shape, or a non-finite gradient
        the workers check (that path names the key)."""
        if self._compression.codec:
            return False
        self._prefetch([key for key, _ in pairs])
        keys: list[_Key] = []
        grads: list[tuple[np.ndarray | None, np.ndarray]] = []  # (sorted ids or None, values)
        for key, v in pairs:
            k = self._key(key)
            if k.dtype.kind != "f":
                return False
            if k.row_sparse:
                if isinstance(v, tuple) and len(v) == 2:
                    v = RowSparse(*v)
                if not isinstance(v, RowSparse):
                    return False
                got, rows = v.coalesced(k.num_rows, k.dim, k.dtype, f"push of key {key!r}")
                grads.append((got, rows.reshape(-1)))
            else:
                if not isinstance(v, np.ndarray) or v.dtype.kind != "f" or v.shape != k.shape:
                    return False
                grads.append((None, v.reshape(-1)))
            keys.append(k)
        if len({k.name for k in keys}) != len(keys) or len({k.dtype for k in keys}) != 1:
            return False
        dtype = keys[0].dtype
        batches: dict[int, _Batch] = {}
        for k, (ids, flat) in zip(keys, grads, strict=True):
            if ids is None:
                for s, lo, hi in k.pieces:
                    batches.setdefault(s, _Batch()).add(
                        k.name, flat if hi - lo == flat.size else flat[lo:hi])
                continue
            dim = k.dim
            if len(k.pieces) == 1:
                s, lo, _ = k.pieces[0]
                batches.setdefault(s, _Batch()).add(k.name, flat, ids - lo if lo else ids)
                continue
            cuts = np.searchsorted(ids, [lo for _, lo, _ in k.pieces[1:]]).tolist()
            for (s, lo, _), a, b in zip(k.pieces, [0, *cuts], [*cuts, ids.size], strict=True):
                batches.setdefault(s, _Batch()).add(k.name, flat[a * dim:b * dim],
                                                    ids[a:b] - lo)
        # a copy (the caller may change its arrays once push returns), made here unless the
        # transport copies as it sends (between processes) and the buffer is one array
        # (in process, with one worker, the push is applied before send returns and nothing
        # keeps its buffer: the caller's arrays are read there, not copied first)
        sends_copy = getattr(self._transport, "copies", False) or self._in_process
        messages = {s: b.message(Update(self._group, self._index, -1, None), dtype, sends_copy)
                    for s, b in batches.items()}
        if workers_check(self._conf) and not all(all_finite(m.data) for m in messages.values()
                                                 if m.data is not None):
            return False
        self._finish_keys(keys)
        what = (f"reply to a push of key {pairs[0][0]!r}" if len(pairs) == 1
                else f"reply to a push of {len(pairs)} keys")
        pendings = {s: self._send(s, m, what) for s, m in messages.items()}
        for k in keys:
            k.pending = [pendings[s] for s, _, _ in k.pieces]
        return True

    def _push_rows(self, key: Any, value: Any) -> bool:
        """A table's rows handed to its server in this process, which applies them at once
        (:meth:`KeyServer.push_rows`), as :meth:`_push_batch` would send them; False, with
        nothing pushed, when they go that way (several pieces, compression, a check of
        NaN and Inf here, or a step the server does not apply at once). Called with this
        store the only worker of servers in this process (``_in_process``)."""
        self._check_open()  # (no message goes: nothing else would say so)
        if isinstance(value, tuple) and len(value) == 2:
            value = RowSparse(*value)
        if (not isinstance(value, RowSparse) or self._compression.codec
                or workers_check(self._conf)):
            return False
        k = self._key(key)
        if not k.row_sparse or len(k.pieces) != 1 or k.dtype.kind != "f":
            return False
        ids, rows = value.coalesced(k.num_rows, k.dim, k.dtype, f"push of key {key!r}")
        self._finish(k)
        s, lo, _ = k.pieces[0]
        server = self._transport.servers[(0, s)]  # type: ignore[attr-defined]
        return bool(server.push_rows(k.name, self._group, self._index,
                                     ids - lo if lo else ids, rows))

    def _plan(self, keys: Sequence[Any]) -> Plan | None:
        """The plan of a list of keys (:mod:`.plans`), made on its first call; None: the
        list is not one of distinct dense float keys (or not hashable)."""
        try:
            given = tuple(keys)
            if given in self._plans:
                return self._plans[given]
        except TypeError:
            return None
        self._prefetch(given)
        plan = make_plan([self._key(k) for k in given])
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[given] = plan
        return plan

    def _push_planned(self, plan: Plan, values: Sequence[np.ndarray]) -> bool:
        """:meth:`_push_batch` of a planned list: one buffer per server (a copy: the
        caller may change its arrays once push returns). False, with nothing sent, when a
        non-finite gradient is for the workers to check (the key's own path names it)."""
        update = Update(self._group, self._index, -1, None)
        messages = [(p.server, KeyBatch(p.names, update, p.offsets, gather(plan, values, p)))
                    for p in plan.parts]
        if workers_check(self._conf) and not all(all_finite(m.data) for _, m in messages
                                                 if m.data is not None):
            return False
        self._finish_keys(plan.keys)
        what = f"reply to a push of {len(plan.keys)} keys"
        pendings = [self._send(s, m, what) for s, m in messages]
        if len(pendings) == 1:
            for k in plan.keys:
                k.pending = pendings
        else:
            for k, where in zip(plan.keys, plan.where, strict=True):
                k.pending = [pendings[j] for j in where]
        return True

    def _pull_planned(self, plan: Plan, outs: list[np.ndarray]) -> None:
        """:meth:`_pull_batch` of a planned list, into ``outs`` (checked)."""
        get = self._get(after=True)
        what = f"values of {len(plan.keys)} keys"
        replies = self._get_behind({p.server: KeyBatch(p.names, get) for p in plan.parts},
                                   plan.keys, what)
        for p, reply in zip(plan.parts, replies, strict=True):
            assert isinstance(reply, Values)
            values = reply.values.reshape(-1)
            if values.size != int(p.offsets[-1]):
                raise ClusterError(f"server {p.server} answered a pull of {len(p.pieces)} "
                                   f"key pieces with {values.size} values, not "
                                   f"{int(p.offsets[-1])}")
            scatter(plan, values, p, outs)

    def _push_one(self, key: Any, value: Any) -> None:
        k = self._key(key)
        values = list(value) if isinstance(value, list) else [value]  # a tuple: (ids, rows)
        if not values:
            raise ParamError(f"push of key {key!r}: no values")
        where = f"push of key {key!r}"
        self._finish(k)
        c = self._compression
        if k.dtype.kind != "f":
            if self._updater and not self._updater.startswith(FUNCTION):
                raise ParamError(f"{where}: the key holds {k.dtype} values (counts), which the "
                                 f"update method {json.loads(self._updater)['type']} does not "
                                 "update: push to integer keys with no update method (the "
                                 "sum replaces the value) or with set_updater(function)")
            c = Compression.parse(None)  # counts travel exactly
        if k.row_sparse:
            ids, rows = self._sum_rows(k, values, where)
            if self._drops(key, rows):
                k.pending = self._dropped(k, key)
                return
            parts = self._split_rows(k, ids, rows)
            pendings = []
            for i, (s, _, _) in enumerate(k.pieces):
                pids, prows = parts[i]
                if c.codec:
                    if c.error_feedback:
                        if k.residuals[i] is None:
                            k.residuals[i] = RowResidual(k.dim, k.dtype)
                        data = k.residuals[i].encode(pids, prows, c.threshold)
                    else:
                        data = encode(prows.reshape(-1), c.codec)
                    update = Update(self._group, self._index, -1, None, encode_ids(pids),
                                    data, None, c.codec, c.threshold, pids.size)
                else:
                    update = Update(self._group, self._index, -1, None, pids,
                                    prows.reshape(-1), None)
                pendings.append(self._send(s, Keyed(k.name, update), f"reply to a push of "
                                                                     f"key {key!r}"))
        else:
            flat = self._sum_dense(k, values, where)
            if self._drops(key, flat):
                k.pending = self._dropped(k, key)
                return
            pendings = []
            for i, (s, lo, hi) in enumerate(k.pieces):
                part = flat[lo:hi]
                if c.codec:
                    if c.error_feedback and k.residuals[i] is None:
                        k.residuals[i] = np.zeros(part.size, k.dtype)
                    part = encode(part, c.codec, c.threshold, k.residuals[i])
                update = Update(self._group, self._index, -1, part, codec=c.codec,
                                threshold=c.threshold)
                pendings.append(self._send(s, Keyed(k.name, update), f"reply to a push of "
                                                                     f"key {key!r}"))
        k.pending = pendings

    def _drops(self, key: Any, data: np.ndarray) -> bool:
        """Whether a push of NaN or Inf is dropped (``nonfinite: skip``, with a warning);
        under ``error`` it is refused here, before any server has it. Checked here where
        the servers cannot decide alone (:func:`~paramserver.cluster.passes.workers_check`:
        'skip', or a key whose pieces may lie on several servers); else the server's own
        check refuses it."""
        if not workers_check(self._conf) or all_finite(data.reshape(-1)):
            return False
        found = nonfinite_text(data)
        if self._conf.nonfinite == "error":
            raise ClusterError(f"non-finite gradient in the push of key {key!r} ({found}): "
                               "the push is refused and nothing is written "
                               "(cluster.nonfinite 'skip' drops such pushes instead)")
        warnings.warn(f"non-finite gradient in the push of key {key!r} ({found}): the push "
                      "is dropped (cluster.nonfinite is 'skip')", RuntimeWarning, stacklevel=4)
        return True

    def _dropped(self, k: _Key, key: Any) -> list[Pending]:
        """An empty push to each server of the key: a round of workers in step completes
        without this worker's gradient, as the cluster's dropped pushes do."""
        return [self._send(s, Keyed(k.name, Update(self._group, self._index, -1, None)),
                           f"reply to a push of key {key!r}") for s, _, _ in k.pieces]

    def _sum_dense(self, k: _Key, values: list[Any], where: str) -> np.ndarray:
        """The sum of the values pushed for a dense key, in the order given (flat)."""
        total: np.ndarray | None = None
        for v in values:
            if isinstance(v, RowSparse):
                ids, rows = v.coalesced(k.num_rows, row_dim(k.shape), k.dtype, where)
                dense = np.zeros((k.num_rows, row_dim(k.shape)), k.dtype)
                dense[ids] = rows
                arr = dense.reshape(-1)
            else:
                arr = _dense_value(k, v, where).reshape(-1)
            total = arr.astype(k.dtype) if total is None else total + arr
        assert total is not None
        return total  # a copy: the caller may change its arrays once push returns

    def _sum_rows(self, k: _Key, values: list[Any], where: str
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The coalesced rows pushed for a table (several values: summed in order)."""
        parts = []
        for v in values:
            if isinstance(v, tuple) and len(v) == 2:
                v = RowSparse(*v)
            if not isinstance(v, RowSparse):
                arr = np.asarray(v)
                if arr.shape == k.shape:
                    v = RowSparse(np.arange(k.num_rows), arr)
                else:
                    raise ParamError(f"{where}: a table's gradient is a RowSparse(ids, rows), "
                                     f"an (ids, rows) pair or an array of the table's shape "
                                     f"{k.shape}, not {type(v).__name__}")
            parts.append(v.coalesced(k.num_rows, k.dim, k.dtype, where))
        if len(parts) == 1:  # copies: the caller may change its arrays once push returns
            return parts[0][0].copy(), parts[0][1].copy()
        return RowSparse(np.concatenate([p[0] for p in parts]),
                         np.concatenate([p[1] for p in parts])).coalesced(
            k.num_rows, k.dim, k.dtype, where)

    @staticmethod
    def _split_rows(k: _Key, ids: np.ndarray, rows: np.ndarray
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Sorted ids and their rows, per piece (ids from the piece's first row)."""
        out = []
        for _, lo, hi in k.pieces:
            a, b = np.searchsorted(ids, [lo, hi])
            out.append((ids[a:b] - lo, rows[a:b]))
        return out

    def _finish(self, k: _Key) -> None:
        """Wait for the key's last push (its errors are raised here)."""
        pending, k.pending = k.pending, []
        self._wait(pending)

    def _finish_keys(self, keys: Sequence[_Key]) -> None:
        """Wait for the last pushes of keys (a batch's reply is waited for once)."""
        pending: dict[int, Pending] = {}
        for k in keys:
            if k.pending:
                for p in k.pending:
                    pending[id(p)] = p
                k.pending = []
        self._wait(list(pending.values()))

    def wait(self) -> None:
        """Wait for every push of this store (ps-lite's ``Wait``); raise their errors."""
        self._check_open()
        self._finish_keys(list(self._keys.values()))

    # -- pull -------------------------------------------------------------------------------

    def _lag(self) -> int | None:
        c = self._conf
        return (c.staleness if self._worker and c.staleness is not None
                and c.nworker_groups > 1 else None)

    def _get(self, ids: np.ndarray | None = None, after: bool = False) -> Get:
        """A get of a key's piece: whole, or rows ``ids`` of a table (``after``: see
        :meth:`_get_behind`)."""
        return Get(self._group, self._index if self._worker else -1, 0, ids=ids,
                   segment=-1 if ids is None else 0, whole=ids is None, lag=self._lag(),
                   after=after and self._worker)

    def _get_behind(self, gets: dict[int, Any], keys: Sequence[_Key], what: str
                    ) -> list[Reply]:
        """The replies of ``gets`` (a message per server, each a get made ``after``) of
        ``keys``, whose last pushes may not be answered yet: each get goes right behind
        them where its channel keeps their order (the server answers it once they are;
        a wake-up less per server and step than waiting for their replies first), else
        once they are answered. The pushes' errors are raised first, and before anything
        is read from a get's reply."""
        pushes: dict[int, Pending] = {}
        for k in keys:
            for p in k.pending:
                pushes[id(p)] = p
            k.pending = []
        pending = list(pushes.values())
        self._check_open()
        sent = []
        for s, msg in gets.items():
            before = [q for q in pending if q.address == (0, s)]
            behind = (send_after(self._transport, (0, s), msg, f"server {s}'s {what}", before)
                      if before else None)
            if behind is None:  # no push there, or a channel that keeps no order
                self._wait(before)
                behind = self._send(s, msg, what)
            sent.append(behind)
        self._wait(pending)  # every push's error first (those to servers not asked too)
        return self._wait(sent)

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True
             ) -> Any:
        """The values of keys: into ``out`` (an array of the key's shape, or a list of them
        for one key, or a list per key); without ``out``, returned as new arrays. A pull of
        a table pulls every row. ``priority`` and ``ignore_sparse`` are accepted and not
        used."""
        if _is_list(key) and (out is None or (_is_list(out) and len(out) == len(key))):
            plan = self._plan(key)
            if plan is not None and (out is None or outs_fit(plan, out)):
                targets = (list(out) if out is not None else
                           [np.empty(shape, plan.dtype) for shape in plan.shapes])
                self._pull_planned(plan, targets)
                return targets if out is None else out
        if out is None:
            keys = list(key) if _is_list(key) else [key]
            got = self._pull_batch([(k, None) for k in keys])
            return got if _is_list(key) else got[0]
        self._pull_batch([(k, target) for k, o in self._pairs(key, out, "pull")
                          for target in (o if _is_list(o) else [o])])
        return out

    def _pull_batch(self, pairs: list[tuple[Any, np.ndarray | None]]) -> list[np.ndarray]:
        """ps-lite's pull: one :class:`~paramserver.cluster.messages.KeyBatch` per server
        for every key's piece there; each reply, one buffer, is copied into the keys' outs
        (new arrays where None)."""
        self._prefetch([key for key, _ in pairs])
        keys = [self._key(key) for key, _ in pairs]
        for (key, out), k in zip(pairs, keys, strict=True):
            if out is not None:
                _check_out(out, k.shape, f"pull of key {key!r}")
        names: dict[int, list[str]] = {}
        spans: dict[int, list[tuple[int, int, int]]] = {}
        for i, k in enumerate(keys):
            for s, lo, hi in k.pieces:
                a, b = k.bounds(lo, hi)
                names.setdefault(s, []).append(k.name)
                spans.setdefault(s, []).append((i, a, b))
        what = (f"values of key {pairs[0][0]!r}" if len(pairs) == 1
                else f"values of {len(pairs)} keys")
        get = self._get(after=True)
        servers = list(names)
        replies = self._get_behind({s: KeyBatch(KEY_SEPARATOR.join(names[s]), get)
                                    for s in servers}, keys, what)
        targets = [out if out is not None else np.empty(k.shape, k.dtype)
                   for (_, out), k in zip(pairs, keys, strict=True)]
        flats = [t.reshape(-1) for t in targets]
        for s, reply in zip(servers, replies, strict=True):
            assert isinstance(reply, Values)
            values = reply.values.reshape(-1)
            at = 0
            for i, a, b in spans[s]:
                flats[i][a:b] = values[at:at + b - a]
                at += b - a
            if at != values.size:
                raise ClusterError(f"server {s} answered a pull of {len(spans[s])} key "
                                   f"pieces with {values.size} values, not {at}")
        return targets

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0,
                        row_ids: Any = None) -> Any:
        """Rows ``row_ids`` of a table (any order, repeats; ints, or floats of whole numbers;
        any shape, read flat): into ``out`` of the table's shape (the rows named written at
        their ids, every other row 0, as MXNet's), or of ``len(row_ids)`` rows (in the order
        of ``row_ids``), or returned as a new array of rows. Keys, outs and row ids pair as
        MXNet's (:mod:`paramserver.kv.rowsparse`). Only the rows asked for travel: one
        message per server for every key of the call (each server's rows of every key in
        one buffer)."""
        plan = pull_plan(key, out, row_ids)
        self._prefetch([k for k, _, _ in plan])
        wanted = []
        for key_, out_, ids_ in plan:  # every problem of the call before anything is sent
            k = self._key(key_)
            where = f"row_sparse_pull of key {key_!r}"
            if not k.row_sparse:
                raise ParamError(f"{where}: the key is not row-sparse (init it with "
                                 "row_sparse=True); pull it whole with pull()")
            ids, unique, at = row_ids_of(ids_, k.num_rows, where)
            if out_ is not None:
                whole = isinstance(out_, np.ndarray) and out_.shape == k.shape
                _check_out(out_, k.shape if whole else (ids.size, *k.shape[1:]),
                           where + ("" if whole else " (out: the table's shape, or one row "
                                                     "per row id)"))
            wanted.append((k, ids, unique, at))
        if len(wanted) == 1 and self._in_process and self._lag() is None:
            self._check_open()  # (no message goes: nothing else would say so)
            self._finish_keys([k for k, *_ in wanted])
            k, ids, unique, at = wanted[0]
            out_ = plan[0][1]
            # rows in the order asked, none twice, into an out of one row per id: gathered
            # there by the server, in one pass
            if (at is None and len(k.pieces) == 1 and isinstance(out_, np.ndarray)
                    and out_.shape != k.shape and out_.dtype == k.dtype):
                s, lo, _ = k.pieces[0]
                server = self._transport.servers[(0, s)]  # type: ignore[attr-defined]
                if server.rows_into(k.name, unique - lo if lo else unique,
                                    out_.reshape(unique.size, k.dim)):
                    return out
        batches: dict[int, _Batch] = {}
        spans: list[list[tuple[int, int, int]]] = []  # per pull: (server, entry, rows)
        for k, _, unique, _ in wanted:
            mine = []
            if len(k.pieces) == 1:
                s, lo, _ = k.pieces[0]
                b = batches.setdefault(s, _Batch())
                mine.append((s, len(b.names), unique.size))
                b.add(k.name, None, unique - lo if lo else unique, k.dim)
            else:
                cuts = np.searchsorted(unique, [lo for _, lo, _ in k.pieces[1:]]).tolist()
                for (s, lo, _), a, b_ in zip(k.pieces, [0, *cuts], [*cuts, unique.size],
                                             strict=True):
                    if b_ > a:
                        b = batches.setdefault(s, _Batch())
                        mine.append((s, len(b.names), b_ - a))
                        b.add(k.name, None, unique[a:b_] - lo, k.dim)
            spans.append(mine)
        what = (f"rows of key {plan[0][0]!r}" if len(plan) == 1
                else f"rows of {len(plan)} pulls")
        servers = list(batches)
        replies = self._get_behind({s: batches[s].message(self._get(after=True), None, True)
                                    for s in servers}, [k for k, *_ in wanted], what)
        # each server's reply: every entry's rows, one after the other
        starts: dict[tuple[int, int], int] = {}
        for s, reply in zip(servers, replies, strict=True):
            assert isinstance(reply, Values)
            b = batches[s]
            pos = 0
            for e, ids_ in enumerate(b.ids):
                starts[(s, e)] = pos
                pos += ids_.size * b.dims[e]
            if pos != reply.values.size:
                raise ClusterError(f"server {s} answered a pull of {len(b.names)} tables' rows "
                                   f"with {reply.values.size} values, not {pos}")
            b.reply = reply.values.reshape(-1)
        got = []
        for (k, ids, unique, at), (_, out_, _), mine in zip(wanted, plan, spans, strict=True):
            dim = k.dim
            if len(mine) == 1:
                s, e, n = mine[0]
                a = starts[(s, e)]
                rows = batches[s].reply[a:a + n * dim].reshape(n, dim)  # type: ignore[index]
            else:
                # the pieces' rows straight into an out of one row per id, in their order
                # (no copy of them all between: 1 MB less to write a step of 4,096 rows)
                direct = (at is None and isinstance(out_, np.ndarray) and out_.shape != k.shape
                          and out_.dtype == k.dtype)  # (checked C-contiguous)
                rows = (out_.reshape(unique.size, dim) if direct
                        else np.empty((unique.size, dim), k.dtype))
                row = 0
                for s, e, n in mine:
                    a = starts[(s, e)]
                    rows[row:row + n] = batches[s].reply[a:a + n * dim].reshape(n, dim)  # type: ignore[index]
                    row += n
                if direct:
                    got.append(out_)
                    continue
            got.append(place_rows(out_, k.shape, ids, unique, at, rows, k.dtype))
        if out is not None:
            return out
        return got if _is_list(key) else got[0]

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """:meth:`push`, then :meth:`pull` into ``out`` (by default into ``value``)."""
        self.push(key, value, priority)
        return self.pull(key, value if out is None else out, priority)

    # -- barrier ----------------------------------------------------------------------------

    def barrier(self) -> None:
        """Wait until every live worker has come here (its pushes done first)."""
        if not self._worker:
            raise ParamError("barrier: the store's maker is not one of its workers")
        self.wait()
        self._barriers += 1
        self._wait([self._send(0, Barrier(self._group, self._index, self._barriers),
                               f"barrier {self._barriers}")])

    #: MXNet's name.
    _barrier = barrier

    # -- server state -----------------------------------------------------------------------

    def _all_keys(self) -> list[_Key]:
        """Every key of the store (their home servers list them)."""
        out = []
        replies = self._wait([self._send(s, GetState(), "list of keys")
                              for s in range(self.num_servers)])
        for server, reply in enumerate(replies):
            assert isinstance(reply, State)
            for entry in sorted(reply.arrays):
                if not entry.startswith("key/"):
                    continue
                name = entry[len("key/"):]
                k = self._keys.get(name)
                if k is None:
                    info = self._wait([self._send(server, Describe(name),
                                                  f"description of key '{name}'")])[0]
                    assert isinstance(info, KeyInfo)
                    k = self._remember(info)
                out.append(k)
        return sorted(out, key=lambda k: k.name)

    def _updater_held(self) -> str:
        reply = self._wait([self._send(0, GetState(), "state")])[0]
        assert isinstance(reply, State)
        return bytes(reply.arrays.get("updater", np.zeros(0, np.uint8))).decode()

    def save(self, path: str, dump_optimizer: bool = True) -> None:
        """Write the servers' state — every key's values, its updater state (MXNet cannot
        save those) and versions, and (``dump_optimizer``) the update method's declaration
        — to ``path`` (safetensors, atomically). Waits for this store's pushes first. A
        Python function (``set_updater(fn)``) is not data: save it with
        ``dump_optimizer=False`` and set it again after loading."""
        self.wait()
        held = self._updater_held()
        if dump_optimizer and held.startswith(FUNCTION):
            raise ParamError(f"save: the update method is a Python function ({held[1:-1]}), "
                             "which is not saved (no pickle): save with dump_optimizer=False "
                             "and set_updater() it again after loading")
        arrays: dict[str, np.ndarray] = {}
        keys = {}

        def put(name: str, value: np.ndarray) -> None:
            # Every key's arrays are <key>/values, <key>/version and <key>/state/<role>,
            # roles without '/': no two keys' names can meet (load reads them back so).
            if name in arrays or "/" in name[len(k.name) + 1:].removeprefix("state/"):
                raise ParamError(f"save: key '{shown(k.name)}' has the array name '{name}' of "
                                 "another key's, or an updater state role with a '/'")
            arrays[name] = value

        for k in self._all_keys():
            parts = self._wait([self._send(s, Keyed(k.name, GetState()), f"state of key "
                                                                           f"'{k.name}'")
                                for s, _, _ in k.pieces])
            states = [p.arrays for p in parts if isinstance(p, State)]
            put(f"{k.name}/values", np.concatenate(
                [st["values"] for st in states]).reshape(k.shape))
            put(f"{k.name}/version", np.array(min(int(st["versions"].min())
                                                  for st in states), np.int64))
            prefix = f"state/{k.name}/"
            roles = sorted({n[len(prefix):] for st in states for n in st if n.startswith(prefix)})
            for role in roles:
                pieces = [st[prefix + role] for st in states]
                put(f"{k.name}/state/{role}",
                    pieces[0] if role == "count" else np.concatenate(pieces))
            keys[k.name] = {"shape": list(k.shape), "dtype": k.dtype.name,
                            "row_sparse": k.row_sparse, "int_key": k.int_key}
        meta = {"format": FORMAT, "updater": held if dump_optimizer else "", "keys": keys}
        save_checkpoint(path, arrays, meta)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """MXNet's name: :meth:`save` (here the values are saved too), the update method's
        declaration with it when ``dump_optimizer`` (MXNet's default: not)."""
        self.save(fname, dump_optimizer=dump_optimizer)

    def load(self, path: str, *, take_updater: bool = False) -> None:
        """Restore :meth:`save`'s file: keys that exist take its values and updater state
        (checked whole, by every server, before anything changes); keys that do not are
        initialised from it. A file with the update method (``dump_optimizer``) sets it when
        the store has none; when the store has another, it is refused -- unless
        ``take_updater`` (then the file's replaces it, as MXNet's
        ``load_optimizer_states`` of a dumped optimizer does). A file without one needs the
        store's to keep the state of the same roles."""
        arrays, meta = load_checkpoint(path)
        if meta.get("format") != FORMAT:
            raise ParamError(f"{path}: not a key-value store's state (format "
                             f"{meta.get('format')!r}, expected {FORMAT!r})")
        saved, held = str(meta.get("updater", "")), self._updater_held()
        if saved and not saved.startswith(FUNCTION):  # as this version writes it (its
            saved = _updater_text(json.loads(saved))  # defaults of later fields filled in)
        if held and saved and held != saved and not take_updater:
            raise ParamError(f"{path} was saved with the updater {saved}, and the store has "
                             f"{held}: set_updater() the file's first")
        if saved and held != saved:
            self.set_updater(json.loads(saved))
        self.wait()
        existing = {k.name: k for k in self._all_keys()}
        problems: list[str] = []
        plan: list[tuple[_Key | KeyInfo, dict[str, Any]]] = []
        for info in _saved_keys(meta, arrays, path):
            name, d = info.key, meta["keys"][info.key]
            k = existing.get(name)
            if k is not None and (k.shape, k.dtype.name, k.row_sparse) != (
                    info.shape, info.dtype, info.row_sparse):
                problems.append(f"key '{name}' is {k.describe()} here, {info_text(info)} in "
                                f"{path}")
            plan.append((k if k is not None else info, d))
        if problems:
            raise ParamError(problems)
        for target, _ in plan:
            if isinstance(target, KeyInfo):
                key: Any = int(target.key) if target.int_key else target.key
                self._init_one(key, arrays[f"{target.key}/values"], target.row_sparse)
        pieces: list[tuple[_Key, int, dict[str, np.ndarray]]] = []
        for target, _ in plan:
            k = self._keys[target.key if isinstance(target, KeyInfo) else target.name]
            for s, lo, hi in k.pieces:
                pieces.append((k, s, self._piece_state(k, arrays, lo, hi)))
        checks = self._wait([self._send(s, Keyed(k.name, SetState(part, True,
                                                                  f"{path}: '{k.name}' ")),
                                        "check of a state") for k, s, part in pieces])
        for reply in checks:
            assert isinstance(reply, Problems)
            problems += reply.problems
        if problems:
            raise ParamError(problems)
        self._wait([self._send(s, Keyed(k.name, SetState(part)), "load of a state")
                    for k, s, part in pieces])

    def load_optimizer_states(self, fname: str) -> None:
        """MXNet's name: :meth:`load`, a dumped update method replacing the store's."""
        self.load(fname, take_updater=True)

    @staticmethod
    def _piece_state(k: _Key, arrays: Mapping[str, np.ndarray], lo: int, hi: int
                     ) -> dict[str, np.ndarray]:
        a, b = k.bounds(lo, hi)
        out = {"values": np.asarray(arrays[f"{k.name}/values"]).reshape(-1)[a:b],
               "versions": np.asarray(arrays.get(f"{k.name}/version", 0), np.int64).reshape(1)}
        prefix = f"{k.name}/state/"
        for name, arr in arrays.items():
            role = name[len(prefix):]
            if name.startswith(prefix) and "/" not in role:  # 'w/state/m/values': a key's
                arr = np.asarray(arr).reshape(-1)
                out[f"state/{k.name}/{role}"] = arr if role == "count" else arr[a:b]
        return out

    # -- runs -------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Run ``fn(kv, *args)`` on every worker, each with the store of its rank (threads of
        this process, or Ray actors, which get ``fn`` pickled); returns their results by
        rank. A worker's exception stops the run (``on_worker_failure: stop``) and is raised
        as a :class:`~paramserver.cluster.ClusterError` with it as the cause."""
        if self._driver is None:
            raise ParamError("run: only the store create() returned runs workers")
        self._check_open()
        results = self._driver.run(_Run(fn, args, self._spec), 1)
        return [None if r is None else r.get("result") for r in results[0]]

    def close(self) -> None:
        """Stop the servers (Ray: their actors). Idempotent. A closed store refuses every
        other call (a ParamError)."""
        if not self._closed:
            self._closed = True
            if self._driver is not None:
                self._driver.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _saved_keys(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], path: str
                ) -> list[KeyInfo]:
    """The keys a saved file describes, checked against its arrays before anything is made
    of them (a file may say anything: a key of 2^40 values, a dtype that is not one)."""
    keys = meta.get("keys", {})
    if not isinstance(keys, dict):
        raise ParamError(f"{path}: damaged key-value state (its 'keys' are not a JSON object)")
    out, problems = [], []
    for name, d in sorted(keys.items()):
        try:
            key_name(int(name) if isinstance(d, dict) and d.get("int_key") is True
                     and name.isdigit() else name)
            shape = tuple(d["shape"])
            if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in shape):
                raise ParamError(f"the shape {shape} is not one of sizes >= 0")
            info = KeyInfo(name, shape, value_dtype(str(d["dtype"]), "its values").name,
                           d["row_sparse"] is True, d["int_key"] is True)
            values = arrays.get(f"{name}/values")
            if values is None or values.shape != shape or values.dtype.name != info.dtype:
                raise ParamError(f"its values are not {info_text(info)} in the file")
        except (ParamError, KeyError, TypeError, ValueError) as e:
            problems.append(f"{path}: key {shown(repr(name))}: damaged description ({e})")
            continue
        out.append(info)
    if problems:
        raise ParamError(problems)
    return out


def info_text(info: KeyInfo) -> str:
    kind = "row-sparse " if info.row_sparse else ""
    return f"{kind}{info.dtype} {tuple(info.shape)}"


def _dense_value(k: _Key, value: Any, where: str) -> np.ndarray:
    """A value pushed to a dense key, as an array, checked: its shape and its kind."""
    arr = np.asarray(value)
    if arr.shape != k.shape:
        raise ParamError(f"{where}: a value of shape {arr.shape}, the key's is {k.shape}")
    floats = k.dtype.kind == "f"
    if (arr.dtype.kind == "f") != floats or arr.dtype.kind not in "fiu":
        want = "floats" if floats else f"integers (it holds {k.dtype})"
        raise ParamError(f"{where}: the key's pushes are {want}, not {arr.dtype}")
    return arr


def _check_out(out: Any, shape: tuple[int, ...], where: str) -> None:
    if not isinstance(out, np.ndarray) or tuple(out.shape) != tuple(shape):
        what = (f"an array of shape {out.shape}" if isinstance(out, np.ndarray)
                else type(out).__name__)
        raise ParamError(f"{where}: out must be a numpy array of shape {tuple(shape)}, not "
                         f"{what}")
    if not out.flags.writeable or not out.flags.c_contiguous:
        raise ParamError(f"{where}: out must be writeable and C-contiguous")


def _updater_text(updater: Any) -> str:
    if updater is None:
        return ""
    from .mxnet_optimizers import is_mxnet_optimizer, to_declaration

    if is_mxnet_optimizer(updater):  # MXNet's optimizer: the updater computing the same
        updater = to_declaration(updater)
    if isinstance(updater, Updater):
        return updater.conf.to_json()
    if isinstance(updater, (UpdaterConf, Mapping, str)):
        made = create_updater(dict(updater) if isinstance(updater, Mapping) else updater)
        return made.conf.to_json()
    raise ParamError(f"set_updater takes a declaration (an updater {{ }} block's text, a dict "
                     f"or an UpdaterConf; SPEC §5), not a {type(updater).__name__} object: "
                     "updaters never travel pickled")


def _key_inits(inits: list[KeyInit]) -> KeyInits:
    """Several keys' inits for one server as one message (their values' bytes in one
    buffer, each from a multiple of 8 bytes)."""
    entries, spans, end = [], [], 0
    for m in inits:
        entries.append([m.key, list(m.shape), m.dtype, m.row_sparse, m.int_key, m.home,
                        None if m.piece is None else list(m.piece), m.fill, m.seed])
        start = end + (-end % 8)
        end = start + (0 if m.values is None else m.values.nbytes)
        spans.append((start, end))
    data = np.empty(end, np.uint8)
    for m, (a, b) in zip(inits, spans, strict=True):
        if m.values is not None:
            data[a:b] = np.ascontiguousarray(m.values).reshape(-1).view(np.uint8)
    return KeyInits(json.dumps(entries), np.array(spans, np.int64).reshape(-1, 2), data)


def _fill_whole(generator: Any, name: str, shape: tuple[int, ...], dtype: np.dtype[Any],
                seed: int) -> np.ndarray:
    from ..init import stream
    from ..params import Param

    p = Param(name, shape, dtype)
    generator.fill(p, stream(seed, name))
    return p.data.reshape(-1)


# -- the workers of a run ----------------------------------------------------------------------

_STORES: weakref.WeakKeyDictionary[Any, KVStore] = weakref.WeakKeyDictionary()


class _Run:
    """A run's gradient function for the cluster's driver: ``fn(kv, *args)`` once, with the
    store of the worker (kept with the worker from run to run: its residuals, barriers)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], spec: StoreSpec):
        self.fn, self.args, self.spec = fn, args, spec

    def __call__(self, worker: Any, step: int) -> dict[str, Any]:
        store = _STORES.get(worker)
        if store is None:
            store = _STORES[worker] = KVStore(self.spec, worker._transport, group=worker.group,
                                              index=worker.index, rank=worker.rank)
        result = self.fn(store, *self.args)
        store.wait()
        return {"result": result}


def create(name: str = "local", *, num_workers: int = 1, num_servers: int = 1,
           backend: str = "local", updater: Any = None, staleness: int | None = None,
           compression: Mapping[str, Any] | str | None = None, timeout: float = 60.0,
           bound: int = BOUND, on_worker_failure: str = "stop", nonfinite: str = "error",
           ray_address: str | None = None, transport: Any = None, **options: Any) -> KVStore:
    """A key-value store (SPEC §10) and the caller's store of it.

    Args:
        name: the mode: ``local`` (one worker), ``dist_sync`` (workers in step: each key is
            updated once per round with the sum of every worker's push), ``dist_async``
            (each push applied as it comes); MXNet's names of its types are read as
            :func:`~paramserver.kv.modes.mode_of` says (``device``, ``nccl``,
            ``local_allreduce_cpu``, ``dist_device_sync``, ...; any case).
        num_workers: workers (``run`` runs them); with one, the store returned is rank 0.
        num_servers: servers (keys are placed on them as :mod:`~paramserver.cluster.keys`
            says).
        backend: ``local`` (embedded: servers and workers in this process) or ``ray``.
        updater: the update method (see :meth:`KVStore.set_updater`); default none.
        staleness: (``dist_async``) how many pushes of a key a worker may be ahead of the
            slowest when it pulls the key (default: no bound).
        compression: of every worker's pushes (see
            :meth:`KVStore.set_gradient_compression`).
        timeout: seconds any wait may take before it is an error.
        bound: values below which a key lies whole on one server (MXNet's
            ``MXNET_KVSTORE_BIGARRAY_BOUND``, 10^6).
        on_worker_failure, nonfinite: as the cluster's (``stop``/``continue``,
            ``error``/``skip``).
        ray_address: an existing Ray cluster (default: this machine's, started if needed).
        transport: (embedded) makes the transport from the servers; the seam for tests
            and benchmarks (e.g. to count the bytes of every message).
        **options: the Ray backend's (``placement``, ``server_options``, ...).
    """
    mode = mode_of(name)
    for what, n in (("num_workers", num_workers), ("num_servers", num_servers),
                    ("bound", bound)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParamError(f"{what} must be an integer >= 1, not {n!r}")
    if mode == "local" and num_workers != 1:
        raise ParamError(f"a 'local' store has one worker, not {num_workers}: use 'dist_sync' "
                         "or 'dist_async' for several")
    if staleness is not None and mode != "dist_async":
        raise ParamError("staleness bounds 'dist_async' stores (a 'dist_sync' store's workers "
                         "are in step)")
    groups, per_group = (num_workers, 1) if mode == "dist_async" else (1, num_workers)
    conf = ClusterConf(nworker_groups=groups, nworkers_per_group=per_group,
                       nservers_per_group=num_servers, backend=backend, timeout=timeout,
                       staleness=staleness, on_worker_failure=on_worker_failure,
                       nonfinite=nonfinite, ray_address=ray_address)
    comp = Compression.parse(compression)
    spec = StoreSpec(mode, num_workers, num_servers, int(bound),
                     (comp.type, comp.threshold), conf.to_json())
    params = ParamSet([])
    layouts = plan_servers(params, num_servers)
    text = _updater_text(updater)
    made = create_updater(json.loads(text)) if text else None
    if backend == "ray":
        from ..cluster.ray_backend import RayBackend

        if transport is not None:
            raise ParamError("the Ray backend has its own transport; 'transport' is for the "
                             "embedded store")
        back: Any = RayBackend(conf, params, layouts, made, None, actor_restarts=0, keys=True,
                               **options)
    else:
        if options:
            raise ParamError(f"unknown options {sorted(options)} (they are the Ray backend's)")
        from ..cluster.local import LocalBackend

        back = LocalBackend(conf, params, layouts, made, None, transport, keys=True)
    driver = Driver(conf, params, layouts, back, max_restarts=0, checkpoint_dir=None,
                    temp_dir=False, checkpoint_freq=0)
    try:
        driver._put_values(0)
    except BaseException:
        driver.close()
        raise
    store = KVStore(spec, back.transport, rank=0, worker=num_workers == 1, driver=driver)
    store._updater = text
    return store


__all__ = ["FORMAT", "MODES", "KVStore", "StoreSpec", "create"]
