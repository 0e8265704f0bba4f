"""The cluster view: every agent publishes its node's status into the job's own store.

No new server and no new port: each agent opens its own client connection to the store the
rendezvous already uses (the c10d ``TCPStore``; the etcd server of the ``etcd``/``etcd-v2``
backends; for ``static``, the ``TCPStore`` that node rank 0 hosts) and, every ``interval``
seconds (2 s by default, ``TUILAUNCH_CLUSTER_INTERVAL``; 0 turns it off), writes one compact JSON
record of its node and reads every node's record back. The result is posted to the run store
as a :class:`~tui_launch.core.model.events.ClusterSample`, which the dashboard's Cluster tab and the
headless ``[tuilaunch] cluster`` lines render.

Keys (all under ``tuilaunch/<run id>/cluster/``):

* ``n``       a counter (``add``): how many nodes have registered;
* ``i/<k>``   the id of the k-th node to register (written once);
* ``s/<id>``  that node's latest status (overwritten; ~300-600 bytes).

(and ``d/...``: job-wide stack dumps, :mod:`.jobstacks`, which rides on this loop as the view's
``rider``: one counter read per tick, and a tick every 0.25 s while a dump is under way; those
fast ticks do not write this node's record again, which stays at its interval).

A ``TCPStore`` cannot list keys, hence the counter and index (read in O(log N) round trips
while its last entries are counted but not yet written); etcd can, and its records carry a TTL
so that a dead node's record disappears. Every node reads every record every ``interval x
max(1, N/50)`` s, about 25 records a second, and backs off (up to 8x) while a read is slow.
Everything runs on one daemon thread with short store timeouts, the GIL released while a store
call waits: the agent thread never waits for the cluster view, and a store that is gone (its
host died) or buried only leaves the view stale, marked with an error. ``bench/scale.py``
measures it at up to 1,000 nodes against torch's own keep-alives (docs/SCALING.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from tui_launch.core.model.errors import one_line_error
from tui_launch.core.model.events import ClusterSample, Event, NodeStatus
from tui_launch.core.model.store import Snapshot
from tui_launch.core.periodic import Periodic
from tui_launch.core.seam import rendezvous
from tui_launch.core.seam.rendezvous import node_name

ENV_INTERVAL = "TUILAUNCH_CLUSTER_INTERVAL"
DEFAULT_INTERVAL = 2.0
# Past this many nodes, readers poll more slowly (see docs/SCALING.md): the store serves
# N writers and N readers of N records, which grows as N squared.
READ_BUDGET_NODES = 50
_TIMEOUT_S = 3.0
_ERROR_CHARS = 160
# Something else that uses the cluster view's store client on its loop (job-wide stack dumps):
# called every tick with the client, the key prefix and the nodes last read; returns the
# seconds to its next tick when it wants one sooner than the interval (None: the interval).
Rider = Callable[["KV", str, "tuple[NodeStatus, ...]"], "float | None"]
RIDER_TICK = 0.25  # s between cluster ticks while a rider asks for them (a job-wide dump)
# A reader backs off when the store is slow: a read of every record that takes more than this
# share of its interval doubles the next interval (up to MAX_BACKOFF times), a fast one halves
# it again. A loaded store then serves fewer reads, and torch's keep-alives keep their share.
SLOW_READ_SHARE = 0.05
MAX_BACKOFF = 8.0


def interval_from_env() -> float:
    """The publish interval in seconds from ``TUILAUNCH_CLUSTER_INTERVAL`` (0 = off)."""
    try:
        return max(0.0, float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def prefix(run_id: str) -> str:
    """The key prefix of one run's cluster view."""
    return f"tuilaunch/{run_id}/cluster/"


def read_interval(interval: float, nodes: int, backoff: float = 1.0) -> float:
    """How often to read every node's record: ``interval`` up to 50 nodes, then slower in
    proportion, so that each reader fetches at most ~25 records per second; ``backoff`` times
    that while the store is slow."""
    return interval * max(1.0, nodes / READ_BUDGET_NODES) * backoff


def next_backoff(backoff: float, took: float, due: float) -> float:
    """The reader's back-off after a read of every record that took ``took`` seconds, when
    reads are ``due`` seconds apart: doubled when the read was slow, else halved (>= 1)."""
    if took > SLOW_READ_SHARE * due:
        return min(MAX_BACKOFF, backoff * 2)
    return max(1.0, backoff / 2)


class KV(Protocol):
    """The few store operations the cluster view needs."""

    def set(self, key: str, value: bytes) -> None:
        """Write one node's record (with a TTL where the store has them)."""
        ...

    def add(self, key: str, amount: int) -> int:
        """Atomically add to a counter and return it (0 for a counter not yet there)."""
        ...

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys``, None for a key that is not there; never blocks on one."""
        ...

    def list_status(self, pfx: str) -> list[bytes] | None:
        """Every record under ``pfx``, or None if the store cannot list (use the index)."""
        ...

    def append(self, pfx: str, value: bytes) -> None:
        """Add ``value`` to the list at ``pfx`` (many writers at once, none waits on another)."""
        ...

    def appended(self, pfx: str, start: int) -> list[bytes]:
        """The values of the list at ``pfx`` from position ``start`` on, in order; stops at
        one that is counted but not yet written (read it next time)."""
        ...

    def describe(self) -> str:
        """The store in a few words, for the dashboard ("etcd host:port")."""
        ...


class TCPStoreKV:
    """Our own client connection to a job's ``TCPStore`` (never the agent's own object)."""

    def __init__(
        self, host: str, port: int, timeout: float = _TIMEOUT_S, store: Any = None
    ) -> None:
        from torch.distributed import TCPStore

        self.host, self.port = host, port
        # ``store``: a client connected already (the scale harness counts its requests).
        self._store = store or TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False
        )

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, value.decode())

    def add(self, key: str, amount: int) -> int:
        return int(self._store.add(key, amount))

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        # get() blocks until a key exists: only fetch what check() says is there.
        if self._store.check(keys):
            return self._fetch(keys)
        # Lists that writers fill in order (the index) miss only their last few keys: fetch
        # the run that exists at once, and only the rest a key at a time.
        head: list[bytes | None] = list(self.get_prefix(keys))
        rest = keys[len(head) :]
        return head + [bytes(self._store.get(k)) if self._store.check([k]) else None for k in rest]

    def _fetch(self, keys: list[str]) -> list[bytes | None]:
        multi = getattr(self._store, "multi_get", None)
        if multi is not None:
            return [bytes(v) for v in multi(keys)]
        return [bytes(self._store.get(k)) for k in keys]

    def get_prefix(self, keys: list[str]) -> list[bytes]:
        """The values of the longest run of ``keys`` from the first that all exist: a list
        that writers fill in order (an index, answers) is read in O(log N) round trips even
        while its last slots are counted but not yet written (a key at a time was O(N))."""
        lo, hi = 0, len(keys)  # keys[:lo] exist; keys[:hi + 1] do not all exist (or hi = len)
        if hi and not self._store.check(keys):
            hi -= 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._store.check(keys[:mid]):
                    lo = mid
                else:
                    hi = mid - 1
        return [v for v in self._fetch(keys[:hi]) if v is not None] if hi else []

    def list_status(self, pfx: str) -> list[bytes] | None:
        return None  # a TCPStore cannot list keys: the caller uses the index

    def append(self, pfx: str, value: bytes) -> None:
        # A counter gives each writer its own slot: one round trip each, no retries.
        k = self.add(pfx + "n", 1)
        self.set(pfx + str(k), value)

    def appended(self, pfx: str, start: int) -> list[bytes]:
        n = self.add(pfx + "n", 0)
        return self.get_prefix([pfx + str(k) for k in range(start + 1, n + 1)])

    def describe(self) -> str:
        return f"tcpstore {self.host}:{self.port}"


class EtcdKV:
    """Our own python-etcd (v2 API) client to the job's etcd server; records have a TTL."""

    def __init__(self, host: str, port: int, protocol: str = "http", ttl: int = 30) -> None:
        import etcd

        self.host, self.port, self.ttl = host, port, ttl
        self._etcd = etcd
        self._client = etcd.Client(
            host=host, port=port, protocol=protocol, read_timeout=int(_TIMEOUT_S)
        )

    def set(self, key: str, value: bytes) -> None:
        self._client.write("/" + key, value.decode(), ttl=self.ttl)

    def add(self, key: str, amount: int) -> int:
        # The cluster view needs no index here (etcd lists keys); job-wide dumps count their
        # requests: a compare-and-swap loop, without a TTL (a counter must never restart).
        k = "/" + key
        while True:
            try:
                cur = self._client.read(k)
                value = int(cur.value)
                if amount == 0:
                    return value
                self._client.write(k, str(value + amount), prevValue=cur.value)
                return value + amount
            except self._etcd.EtcdKeyNotFound:
                if amount == 0:
                    return 0
                try:
                    self._client.write(k, str(amount), prevExist=False)
                    return amount
                except self._etcd.EtcdAlreadyExist:
                    continue
            except self._etcd.EtcdCompareFailed:
                continue

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for k in keys:
            try:
                out.append(str(self._client.read("/" + k).value).encode())
            except self._etcd.EtcdKeyNotFound:
                out.append(None)
        return out

    def list_status(self, pfx: str) -> list[bytes] | None:
        try:
            res = self._client.read("/" + pfx + "s", recursive=True)
        except self._etcd.EtcdKeyNotFound:
            return []
        return [str(c.value).encode() for c in res.leaves if c.value]

    def append(self, pfx: str, value: bytes) -> None:
        # etcd's in-order keys: the server numbers them, so 1,000 writers at once never retry
        # (a counter's compare-and-swap loop would, N times over).
        self._client.write("/" + pfx.rstrip("/"), value.decode(), append=True, ttl=self.ttl)

    def appended(self, pfx: str, start: int) -> list[bytes]:
        try:
            res = self._client.read("/" + pfx.rstrip("/"), recursive=True, sorted=True)
        except self._etcd.EtcdKeyNotFound:
            return []
        values = [str(c.value).encode() for c in res.leaves if c.value is not None and c.key]
        return values[start:]

    def describe(self) -> str:
        return f"etcd {self.host}:{self.port}"


def connect(handler: Any, endpoint: str) -> KV:
    """A client to the store that ``handler``'s rendezvous uses. Raises if there is none."""
    backend = rendezvous.call(handler, "get_backend") or ""
    if backend in ("etcd", "etcd-v2"):
        client = rendezvous.etcd_client(handler)
        if client is None:
            raise RuntimeError(f"no etcd client in the {backend} handler")
        return EtcdKV(str(client.host), int(client.port), str(client.protocol))
    if backend == "static":
        return TCPStoreKV(str(handler.master_addr), int(handler.master_port))
    address = rendezvous.store_address(handler)
    if address is None:
        host, _, p = endpoint.rpartition(":")
        address = (host, int(p))
    return TCPStoreKV(*address)


def status_record(
    s: Snapshot, node: str, host: str, pid: int, seq: int, gpu: str | None = None
) -> dict[str, Any]:
    """This node's compact status, as published (short keys: it is sent every interval)."""
    rv = s.rendezvous
    rc = s.root_cause
    err = None
    if s.finished is not None and s.finished.outcome == "error":
        err = s.finished.message
    elif rc is not None and (rc.attempt == s.attempt or s.finished is not None):
        err = f"rank {rc.global_rank}: {rc.message}"  # a recovered failure is history
    return {
        "v": 1,
        "id": node,
        "h": host,
        "p": pid,
        "t": round(time.time(), 1),
        "q": seq,
        "st": s.phase,
        "gr": rv.group_rank if rv else None,
        "gw": rv.group_world_size if rv else None,
        "lw": s.run.nproc_per_node if s.run else len(s.ranks),
        "a": max(s.attempt, 0),
        "r": [[r.global_rank, r.local_rank, r.pid, r.state] for r in s.ranks],
        "rs": [s.failure_restarts, s.manual_restarts, s.membership_restarts],
        "g": gpu,
        "e": err[:_ERROR_CHARS] if err else None,
    }


def parse_record(raw: bytes, me: str, now: float | None = None) -> NodeStatus | None:
    """A published record back as a :class:`NodeStatus` (None if it is not one of ours)."""
    try:
        d = json.loads(raw)
        now = time.time() if now is None else now
        age = float(max(0, int(now - float(d["t"]))))
        return NodeStatus(
            node=str(d["id"]),
            host=str(d["h"]),
            pid=int(d["p"]),
            state=str(d["st"]),
            group_rank=d.get("gr"),
            group_world_size=d.get("gw"),
            local_world_size=int(d.get("lw") or 0),
            attempt=int(d.get("a") or 0),
            ranks=tuple((int(g), int(lr), int(p), str(st)) for g, lr, p, st in d.get("r", ())),
            restarts=tuple(int(x) for x in d.get("rs", (0, 0, 0)))[:3],  # type: ignore[arg-type]
            gpu=d.get("g"),
            error=d.get("e"),
            age=age,
            this_node=str(d["id"]) == me,
        )
    except (ValueError, KeyError, TypeError):
        return None


def gpu_summary(s: Snapshot) -> str | None:
    """A short GPU summary from the store's telemetry (None without GPU readings)."""
    gpus = s.telemetry.latest.gpus if s.telemetry is not None else ()
    if not gpus:
        return None
    utils, used, total = [], 0.0, 0.0
    for g in gpus:
        if g.util is not None:
            utils.append(float(g.util))
        used += float(g.mem_used or 0)
        total += float(g.mem_total or 0)
    util = f"{sum(utils) / len(utils):.0f}%" if utils else "-"
    mem = f" mem {used / 2**30:.0f}/{total / 2**30:.0f}G" if total else ""
    return f"{len(gpus)} GPU util {util}{mem}"


class ClusterView:
    """Publish this node's status and read every node's, on one :class:`Periodic` thread.

    Args:
        post: the run store's ``post`` (each sample goes there).
        snapshot: the run store's ``snapshot`` (what this node publishes).
        host: this node's host name.
        handler: the rendezvous handler, to find the store it uses.
        endpoint: the rendezvous endpoint of a handler (its real port once the store is up).
        run_id: the job's run id (the key prefix).
        interval: seconds between two publications.
        connector: builds the store client (tests pass their own).
    """

    def __init__(
        self,
        *,
        post: Callable[[Event], object],
        snapshot: Callable[[], Snapshot],
        host: str,
        handler: Any,
        endpoint: Callable[[Any], str],
        run_id: str,
        interval: float = DEFAULT_INTERVAL,
        connector: Callable[[Any, str], KV] | None = None,
    ) -> None:
        self._post = post
        self._snapshot = snapshot
        self.host = host
        self.interval = interval
        # The rendezvous's own name for this node (addr:pid) where it has one, so that the
        # rendezvous panel and the cluster view name nodes alike.
        this = rendezvous.this_node(handler)
        self.node = node_name(this) if this is not None else f"{host}:{os.getpid()}"
        self._connector = connector or connect
        self._endpoint = endpoint
        self._handler = handler
        self._kv: KV | None = None
        self._registered = False
        self._ids: list[str] = []
        self._seq = 0
        self._soon: float | None = None  # the rider's wish for the next tick
        self._last_read = 0.0
        self._last_publish = 0.0
        self.backoff = 1.0  # the reader's back-off factor (1: none; the store answers fast)
        self.nodes: tuple[NodeStatus, ...] = ()  # every node, as last read
        self.rider: Rider | None = None
        # After stop(), one last tick publishes the run's outcome for the other nodes.
        self._loop = Periodic("tuilaunch-cluster", interval, self.run_once, final_call=True)
        self.prefix = prefix(str(run_id))

    def set_handler(self, handler: Any) -> None:
        """A new rendezvous round: publish at once (the group rank may have changed)."""
        self._handler = handler
        self._last_publish = 0.0
        self._loop.wake()

    def start(self) -> None:
        """Start the publishing thread."""
        self._loop.start()

    def wake(self) -> None:
        """Tick now (the rider has something to send)."""
        self._loop.wake()

    def stop(self, timeout: float = 1.0) -> None:
        """Publish a last record (the run's outcome) if quick, then stop."""
        self._loop.stop(timeout)

    def run_once(self) -> float:
        """One tick of the loop; returns the seconds to the next one (the interval, or sooner
        while the rider has a job-wide dump under way)."""
        self._soon = None
        self.tick()
        return self.interval if self._soon is None else min(self._soon, self.interval)

    def tick(self) -> ClusterSample | None:
        """One publish (and, when due, read); posts and returns the sample. Never raises."""
        try:
            if self._kv is None:
                self._kv = self._connector(self._handler, self._endpoint(self._handler))
            self._publish(self._kv)
            nodes = self._read(self._kv)
            if nodes is not None:
                self.nodes = nodes
            if self.rider is not None:
                self._soon = self.rider(self._kv, self.prefix, self.nodes)
            if nodes is None:
                return None
            sample = ClusterSample(nodes=nodes, store=self._kv.describe())
        except Exception as e:
            self._kv = None  # reconnect next time (the store's host may be back)
            self._registered = False
            old = self._snapshot().cluster
            sample = ClusterSample(
                nodes=old.nodes if old is not None else (),
                store=old.store if old is not None else "",
                error=one_line_error(e)[:_ERROR_CHARS],
            )
        self._post(sample)
        return sample

    def _publish(self, kv: KV) -> None:
        # The rider's fast ticks (a job-wide dump under way) do not republish: at 1,000 nodes
        # that was 4,000 writes/s for the length of every dump.
        now = time.monotonic()
        recent = now - self._last_publish < self.interval * 0.95
        if recent and self._registered and not self._loop.stopped:
            return
        self._last_publish = now
        snap = self._snapshot()
        self._seq += 1
        record = status_record(
            snap, self.node, self.host, os.getpid(), self._seq, gpu_summary(snap)
        )
        kv.set(self.prefix + "s/" + self.node, json.dumps(record, separators=(",", ":")).encode())
        if not self._registered:
            if kv.list_status(self.prefix) is None:  # no listing: register in the index
                k = kv.add(self.prefix + "n", 1) - 1
                kv.set(self.prefix + f"i/{k}", self.node.encode())
            self._registered = True

    def _read(self, kv: KV) -> tuple[NodeStatus, ...] | None:
        now = time.monotonic()
        due = read_interval(self.interval, len(self._ids) or len(self.nodes) or 1, self.backoff)
        if now - self._last_read < due * 0.95 and not self._loop.stopped and self._last_read:
            return None
        self._last_read = now
        raws = self._read_all(kv)
        took = time.monotonic() - now
        self.backoff = next_backoff(self.backoff, took, due / self.backoff)
        parsed = (parse_record(r, self.node) for r in raws)
        nodes = [n for n in parsed if n is not None]
        nodes.sort(key=lambda n: (n.group_rank is None, n.group_rank or 0, n.node))
        return tuple(nodes)

    def _read_all(self, kv: KV) -> list[bytes]:
        raws = kv.list_status(self.prefix)
        if raws is None:
            n = kv.add(self.prefix + "n", 0)
            if n > len(self._ids):
                new = kv.get_many([self.prefix + f"i/{k}" for k in range(len(self._ids), n)])
                for v in new:
                    if v is None:
                        break  # registered but not yet indexed: next time
                    self._ids.append(v.decode())
            raws = [r for r in kv.get_many([self.prefix + "s/" + i for i in self._ids]) if r]
        return raws


def registered_nodes(kv: KV, pfx: str) -> set[str]:
    """Every node registered in the cluster view under ``pfx`` now (from the store: the index
    on a ``TCPStore``, the records, which expire, on etcd)."""
    raws = kv.list_status(pfx)
    if raws is not None:
        return {n.node for n in (parse_record(r, "") for r in raws) if n is not None}
    n = kv.add(pfx + "n", 0)
    return {v.decode() for v in kv.get_many([pfx + f"i/{k}" for k in range(n)]) if v}


def read_cluster(kv: KV, run_id: str, me: str = "") -> list[NodeStatus]:
    """Every node's record of run ``run_id`` from a store (for tools and tests)."""
    pfx = prefix(run_id)
    raws = kv.list_status(pfx)
    if raws is None:
        n = kv.add(pfx + "n", 0)
        ids = [v.decode() for v in kv.get_many([pfx + f"i/{k}" for k in range(n)]) if v]
        raws = [r for r in kv.get_many([pfx + "s/" + i for i in ids]) if r]
    return [n for n in (parse_record(r, me) for r in raws) if n is not None]
