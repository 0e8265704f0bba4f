"""Emulated nodes for the scale harness (``bench/scale.py``) and its small-N test.

An emulated node runs tuilaunch's real node-side code, the cluster view's publisher and reader
(:class:`~tui_launch.core.job.view.ClusterView`) and the job-wide dump responder and gatherer
(:class:`~tui_launch.core.job.jobstacks.JobDumps`), against a real store; only its ranks are
synthetic: :class:`SyntheticDumper` answers a dump with stacks and Flight Recorder summaries
built here, every rank waiting in ``all_reduce`` #``seq`` but the placed culprits, which are in
their own ``load_batch`` and never issued it. :class:`Counting` wraps a store client and counts
the requests and bytes that go through it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.diagnosis.dumps import Taken
from tui_launch.core.diagnosis.stacks import (
    Frame,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    verdict,
)
from tui_launch.core.diagnosis.stacks.model import Collective, RankRecord
from tui_launch.core.model.events import (
    Event,
    RendezvousCompleted,
    RunStarted,
    StacksDumped,
    WorkerInfo,
    WorkersStarted,
)
from tui_launch.core.model.store import RunStore, Snapshot

SEQ = 1000  # the all_reduce every rank but the culprits waits in
_DIST = "torch/distributed/distributed_c10d.py"
_WAITING = (
    Frame("all_reduce", _DIST, 3252, "/site-packages/" + _DIST),
    Frame("train_step", "train.py", 87),
    Frame("main", "train.py", 120),
)
_CULPRIT = (
    Frame("load_batch", "data.py", 41),
    Frame("train_step", "train.py", 80),
    Frame("main", "train.py", 120),
)


def node_name(index: int) -> str:
    """The emulated node's name (as the rendezvous names nodes: ``addr:pid``)."""
    return f"node{index:04d}.sim:{10000 + index}"


def synthetic_dump(
    index: int, nproc: int, culprits: Iterable[int], reason: str = "remote"
) -> StackDump:
    """Node ``index``'s ranks (global ``index * nproc + local``) at one instant: each waits in
    ``all_reduce`` #:data:`SEQ`, but a global rank in ``culprits`` is in ``load_batch`` and its
    Flight Recorder's last collective is #``SEQ - 1``."""
    odd = set(culprits)
    ranks, records = [], []
    for local in range(nproc):
        g = index * nproc + local
        pid = 100000 + g
        frames = _CULPRIT if g in odd else _WAITING
        main = ThreadStack(thread_id=1, name="MainThread", frames=frames, native_id=pid, main=True)
        proc = ProcessStack(pid=pid, state="S", method="py-spy", threads=(main,), duration=0.05)
        ranks.append(RankStack(local_rank=local, global_rank=g, process=proc))
        seq = SEQ - 1 if g in odd else SEQ
        coll = Collective(seq, "all_reduce", "0", 4096, 4096, "scheduled")
        records.append(RankRecord(g, (coll,), last_enqueued=seq, last_completed=seq - 1))
    return StackDump(
        reason=reason, wall=time.time(), duration=0.05, ranks=tuple(ranks), records=tuple(records)
    )


def dumped(dump: StackDump, path: str, source: str) -> StacksDumped:
    """The event a real dumper posts for ``dump``."""
    v = verdict(dump)
    return StacksDumped(
        reason=dump.reason,
        attempt=0,
        ranks=tuple(r.global_rank for r in dump.ranks),
        verdict=v.text,
        odd_ranks=v.odd,
        path=path,
        method=dump.method,
        duration=dump.duration,
        places=tuple(f"rank {p.global_rank}: {p.place}" for p in v.places),
        source=source,
    )


class SyntheticDumper:
    """A :class:`~tui_launch.core.diagnosis.dumps.Dumper` whose ranks are synthetic: what
    :class:`~tui_launch.core.job.jobstacks.JobDumps` calls (``take``, ``last``, ``listeners``)."""

    def __init__(self, index: int, nproc: int, culprits: Iterable[int], run_dir: str) -> None:
        self.index, self.nproc, self.culprits = index, nproc, tuple(culprits)
        self.run_dir = run_dir
        self.last: Taken | None = None
        self.listeners: list[Callable[[Taken], None]] = []
        self._n = 0

    def take(self, reason: str, source: str) -> Taken:
        """Dump this node's synthetic ranks; the listeners hear of it, as a real dump's do."""
        self._n += 1
        dump = synthetic_dump(self.index, self.nproc, self.culprits, reason)
        path = f"{self.run_dir}/stacks/{self._n}"
        taken = Taken(dump, dumped(dump, path, source))
        self.last = taken
        for fn in self.listeners:
            fn(taken)
        return taken


def node_snapshot(index: int, nodes: int, nproc: int, run_id: str) -> Snapshot:
    """A running node's snapshot: group rank ``index`` of ``nodes``, ``nproc`` running ranks."""
    store = RunStore()
    events: list[Event] = [
        RunStarted(
            entrypoint="train.py",
            args=(),
            role="default",
            nproc_per_node=nproc,
            min_nodes=nodes,
            max_nodes=nodes,
            max_restarts=3,
            backend="c10d",
            endpoint="store.sim:29400",
            run_id=run_id,
            host=f"node{index:04d}.sim",
            launcher_pid=10000 + index,
            torch_version="2.13.0",
        ),
        RendezvousCompleted(
            attempt=0,
            round=0,
            backend="c10d",
            endpoint="store.sim:29400",
            run_id=run_id,
            group_rank=index,
            group_world_size=nodes,
            master_addr="node0000.sim",
            master_port=29500,
            participants=(),
            duration=1.0,
        ),
        WorkersStarted(
            attempt=0,
            workers=tuple(
                WorkerInfo(
                    local_rank=lr,
                    global_rank=index * nproc + lr,
                    role_rank=index * nproc + lr,
                    world_size=nodes * nproc,
                    pid=100000 + index * nproc + lr,
                )
                for lr in range(nproc)
            ),
            log_dir="/nonexistent",
        ),
    ]
    for e in events:
        store.post(e)
    return store.snapshot()


@dataclass
class Tally:
    """Requests and bytes (sent and received) through one or more :class:`Counting` clients."""

    requests: int = 0
    sent: int = 0
    received: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, op: str, sent: int, received: int) -> None:
        """Count one request."""
        with self.lock:
            self.requests += 1
            self.sent += sent
            self.received += received
            self.by_op[op] = self.by_op.get(op, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """The counts, for JSON."""
        with self.lock:
            return {
                "requests": self.requests,
                "sent": self.sent,
                "received": self.received,
                "by_op": dict(self.by_op),
            }


def _size(x: Any) -> int:
    if isinstance(x, bytes | bytearray | str):
        return len(x)
    if isinstance(x, list | tuple):
        return sum(_size(v) for v in x)
    value = getattr(x, "value", None)  # an etcd result
    if isinstance(value, str):
        return len(value) + len(str(getattr(x, "key", "")))
    leaves = getattr(x, "_children", None)
    if isinstance(leaves, list):
        return sum(len(str(c.get("value", ""))) + len(str(c.get("key", ""))) for c in leaves)
    return 8


class Counting:
    """A store client (a ``TCPStore``, a python-etcd ``Client``) whose every call is counted:
    one request each, the bytes of its arguments sent and of its result received."""

    def __init__(self, inner: Any, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        tally = self._tally

        def call(*args: Any, **kwargs: Any) -> Any:
            sent = _size(list(args)) + _size(list(kwargs.values()))
            try:
                out = attr(*args, **kwargs)
            except Exception:
                tally.add(name, sent, 0)
                raise
            tally.add(name, sent, _size(out))
            return out

        return call
