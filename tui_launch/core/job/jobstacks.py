"""Job-wide stack dumps: a dump asked for on one node reaches every node through the job's store.

The cluster view already gives every agent a client of the store the rendezvous uses (no new
server, no new port); :class:`JobDumps` rides on its loop (``tuilaunch-cluster``). A dump taken
on this node for a person or a hang (the ``d`` key, the control API's ``dump_stacks``, the hang
watch's suspicion) becomes a request in the store; every node's loop polls the request counter,
dumps its own ranks (a dump taken here in the last two seconds serves instead) and publishes
where each rank is; the requesting node gathers the answers and posts one
:class:`~tui_launch.core.model.events.JobStacks` (the journal keeps it; the Cluster and Stacks tabs
show it) and writes ``job.json`` and ``job.txt`` beside its own dump, and puts that record in the
store, where every node that answered reads it and posts it too.

Keys, under the cluster view's prefix ``tuilaunch/<run id>/cluster/``:

* ``d/n``               a counter (``add``): how many job-wide dumps were asked for;
* ``d/r/<k>``           the k-th request: who asked, why (JSON, written once);
* ``d/a/<k>/``          the answers, a list (``KV.append``: a counter and a slot each on a
  ``TCPStore``, etcd's in-order keys): one node's verdict and where each of its ranks is
  (JSON, a summary per rank: place, the collective it waits in, its Flight Recorder's last
  collective, a few innermost frames; the stack files stay on that node, named by path);
* ``d/j/<k>``           the gathered record, for the nodes that answered (their Cluster and
  Stacks tabs show the job too): every rank with its frames for jobs of up to 64 ranks; past
  that, the verdict with only the odd ranks and their nodes (every rank is in ``job.json`` on
  the asking node), so that N nodes reading it back move N small records, not N copies of
  the job.

Dumps taken before a failed group's teardown (``before-kill``: every node tears down anyway),
the hang watch's confirming dump (its suspicion already asked) and the answers themselves
(``remote``) are not broadcast. A node that joins later answers only requests made after it
joined. Requests, answers and gathers are small; the only steady cost is one counter read per
cluster tick (every :data:`~tui_launch.core.job.view.RIDER_TICK`, 0.25 s, while a request or
an answer is under way; every :data:`FOLLOW_TICK` while a node that answered waits for the
gathered record). The asking node expects an answer from every node registered in the cluster
view (read from the store when it asks, not from its last read, which at 1,000 nodes may be
40 s old) but those last seen finished or silent; bench/scale.py measured it (docs/SCALING.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tui_launch.core.diagnosis.dumps import Dumper, Taken
from tui_launch.core.diagnosis.stacks import RankPlace, judge, place_of, rank_list
from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.diagnosis.stacks.model import Collective, RankRecord
from tui_launch.core.job.view import KV, RIDER_TICK, registered_nodes
from tui_launch.core.model.events import (
    Event,
    JobNode,
    JobRank,
    JobStacks,
    NodeStatus,
    from_dict,
    to_dict,
)
from tui_launch.core.model.layout import job_files
from tui_launch.core.model.store import OUTCOMES, Snapshot

GATHER_TIMEOUT = 15.0  # s the requesting node waits for every node's answer
FRAMES_KEPT = 8  # innermost main-thread frames published per rank
REUSE_WITHIN = 2.0  # s: a dump this recent answers a request without dumping again
NOT_BROADCAST_SOURCES = frozenset({"remote", "before-kill"})
NOT_BROADCAST_REASONS = frozenset({"hang-confirm"})
REMOTE = "remote"  # the source of a dump taken because another node asked
MISSING_REQUEST_WAIT = 10.0  # s a counted request may stay unwritten before it is skipped
SHARED_FRAMES_UP_TO = 64  # ranks: bigger jobs share only the verdict and the odd ranks
FOLLOW_TICK = 1.0  # s between reads of the gathered record on a node that answered


def wants_broadcast(taken: Taken) -> bool:
    """Whether a local dump should be asked of every node too."""
    e = taken.event
    return e.source not in NOT_BROADCAST_SOURCES and e.reason not in NOT_BROADCAST_REASONS


def node_answer(
    node: str, host: str, group_rank: int | None, taken: Taken | None, error: str = ""
) -> tuple[JobNode, tuple[JobRank, ...]]:
    """This node's answer from one of its dumps (None: nothing to dump, ``error`` says why)."""
    if taken is None:
        return JobNode(node, host, group_rank, verdict="", error=error or "no running worker"), ()
    e, dump = taken.event, taken.dump
    last = {rec.global_rank: rec.last for rec in dump.records}
    ranks = []
    for r in dump.ranks:
        p = place_of(r)
        main = r.process.main_thread
        frames = tuple(f.where for f in main.frames[:FRAMES_KEPT]) if main is not None else ()
        c = last.get(r.global_rank)
        ranks.append(
            JobRank(
                node,
                p.global_rank,
                p.local_rank,
                p.pid,
                p.place,
                p.collective,
                p.known,
                frames,
                coll_op=c.op if c is not None else "",
                coll_seq=c.seq if c is not None else -1,
                coll_bytes=max(c.in_bytes, c.out_bytes) if c is not None else 0,
            )
        )
    info = JobNode(
        node,
        host,
        group_rank,
        verdict=e.verdict,
        path=e.path,
        method=e.method,
        duration=e.duration,
        note=e.note,
    )
    return info, tuple(ranks)


def encode_answer(info: JobNode, ranks: tuple[JobRank, ...]) -> bytes:
    """An answer as the bytes published in the store."""
    data = {"n": asdict(info), "r": [asdict(r) for r in ranks]}
    return json.dumps(data, separators=(",", ":")).encode()


def decode_answer(raw: bytes) -> tuple[JobNode, tuple[JobRank, ...]] | None:
    """An answer read back from the store (None: not one of ours)."""
    try:
        data = json.loads(raw)
        info = JobNode(**data["n"])
        ranks = tuple(JobRank(**{**r, "frames": tuple(r.get("frames") or ())}) for r in data["r"])
        return info, ranks
    except (ValueError, KeyError, TypeError):
        return None


def job_event(
    request: int,
    reason: str,
    source: str,
    requested_by: str,
    answers: dict[str, tuple[JobNode, tuple[JobRank, ...]]],
    missing: Iterable[str] = (),
    path: str = "",
) -> JobStacks:
    """The job-wide record: every node's answer and one verdict over all the ranks."""
    infos = sorted(
        (a[0] for a in answers.values()),
        key=lambda n: (n.group_rank is None, n.group_rank or 0, n.node),
    )
    ranks = sorted((r for a in answers.values() for r in a[1]), key=lambda r: r.global_rank)
    places = tuple(
        RankPlace(r.global_rank, r.local_rank, r.pid, None, r.collective, r.place, r.known)
        for r in ranks
    )
    notes = sorted({n.note for n in infos if n.note})
    v = judge(places, "; ".join(notes) or None)
    text, odd = v.text, v.odd
    # The Flight Recorder on the nodes: the collective-level verdict over every node's records.
    records = [
        RankRecord(r.global_rank, (Collective(r.coll_seq, r.coll_op, "0", 0, r.coll_bytes),))
        if r.coll_seq >= 0
        else RankRecord(r.global_rank, error="no record")
        for r in ranks
    ]
    if any(rec.collectives for rec in records):
        where = {p.global_rank: p.place for p in places if p.known and not p.collective}
        waiting = {p.global_rank for p in places if p.collective}
        cv = collective_verdict(records, where, waiting)
        if cv is not None and not (cv.kind == "same" and v.odd):
            text, odd = cv.text, cv.odd
    gone = tuple(sorted(missing))
    if gone:
        text += f"; no answer from {', '.join(gone)}"
    return JobStacks(
        request=request,
        reason=reason,
        source=source,
        requested_by=requested_by,
        verdict=text,
        odd_ranks=odd,
        nodes=tuple(infos),
        ranks=tuple(ranks),
        missing=gone,
        path=path,
    )


@dataclass(frozen=True)
class PlaceGroup:
    """Ranks of the job that are in the same place, and the nodes that run them."""

    place: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    frames: tuple[str, ...]
    odd: bool


def place_groups(e: JobStacks) -> list[PlaceGroup]:
    """The job's ranks grouped by where they are, the odd ones out first, then the biggest."""
    groups: dict[str, list[JobRank]] = {}
    for r in e.ranks:
        groups.setdefault(r.place, []).append(r)
    odd = set(e.odd_ranks)
    out = [
        PlaceGroup(
            place,
            tuple(sorted(r.global_rank for r in rs)),
            tuple(sorted({r.node for r in rs})),
            rs[0].frames,
            any(r.global_rank in odd for r in rs),
        )
        for place, rs in groups.items()
    ]
    return sorted(out, key=lambda g: (not g.odd, -len(g.ranks), g.ranks))


def job_text(e: JobStacks) -> str:
    """``job.txt``: the job-wide verdict, each place with its ranks and nodes, each node."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.wall))
    out = [
        e.verdict,
        "",
        f"job-wide dump #{e.request} ({e.reason}), asked by {e.requested_by} ({e.source}) at "
        f"{when}; {len(e.ranks)} ranks on {len(e.nodes)} node(s)",
    ]
    for g in place_groups(e):
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {rank_list(g.ranks)}"
        mark = "  <- odd one out" if g.odd else ""
        out += ["", f"{who} on {', '.join(g.nodes)}: {g.place}{mark}"]
        out += [f"    {f}" for f in g.frames]
    out += ["", "nodes:"]
    for n in e.nodes:
        rank = "-" if n.group_rank is None else str(n.group_rank)
        what = n.error or f"{n.verdict} ({n.method}, {n.duration:.2f} s) -> {n.host}:{n.path}"
        out.append(f"  {n.node} (group rank {rank}): {what}")
    for m in e.missing:
        out.append(f"  {m}: no answer")
    return "\n".join(out) + "\n"


def save_job(e: JobStacks, directory: str) -> None:
    """Write ``job.json`` and ``job.txt`` into the requesting node's dump directory."""
    if not directory:
        return
    json_file, text_file = job_files(directory)
    try:
        Path(json_file).write_text(json.dumps(asdict(e), indent=1) + "\n")
        Path(text_file).write_text(job_text(e))
    except OSError:
        pass  # the journal keeps the record; a full disk must not stop the run


@dataclass
class _Gather:
    request: int
    reason: str
    source: str
    path: str
    expected: tuple[str, ...]
    deadline: float
    answers: dict[str, tuple[JobNode, tuple[JobRank, ...]]] = field(default_factory=dict)
    read: int = 0  # answers read from the store's list so far


class JobDumps:
    """Ask every node for its stacks, answer the others, gather the answers.

    Args:
        post: the run store's ``post`` (the gathered :class:`JobStacks`).
        dumper: this node's dumper (answers; its listeners tell of local dumps).
        node: this node's name in the cluster view.
        host: this node's host name.
        snapshot: the run store's ``snapshot`` (this node's group rank).
        wake: wakes the cluster loop (a request or an answer to publish now).
        timeout: seconds to wait for every node's answer.

    Threads: :meth:`on_taken` runs on whatever thread took a dump; :meth:`tick` on the
    cluster loop (the only one that talks to the store); answers are dumped on a short-lived
    thread each (``tuilaunch-jobdump``), so that the loop never waits for py-spy.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        dumper: Dumper,
        node: str,
        host: str,
        snapshot: Callable[[], Snapshot],
        wake: Callable[[], None],
        timeout: float = GATHER_TIMEOUT,
    ) -> None:
        self._post = post
        self._dumper = dumper
        self.node = node
        self.host = host
        self._snapshot = snapshot
        self._wake = wake
        self.timeout = timeout
        self._lock = threading.Lock()
        self._outgoing: list[tuple[Taken, tuple[JobNode, tuple[JobRank, ...]]]] = []
        self._answers: list[tuple[int, bytes]] = []
        self._answering = 0
        self._follow: dict[int, float] = {}  # answered here -> until when to wait for the record
        self._gathers: dict[int, _Gather] = {}
        self._seen: int | None = None  # the last request looked at
        self._missing: dict[int, float] = {}  # counted requests not written yet: since when
        self._since = time.time()  # requests made before this are not ours to answer

    def _group_rank(self) -> int | None:
        rv = self._snapshot().rendezvous
        return rv.group_rank if rv is not None else None

    @property
    def busy(self) -> bool:
        """Whether a request, an answer or a gather is under way (the loop then ticks fast)."""
        with self._lock:
            return bool(self._outgoing or self._answers or self._answering or self._gathers)

    @property
    def following(self) -> bool:
        """Whether this node answered and waits for the gathered record."""
        with self._lock:
            return bool(self._follow)

    def on_taken(self, taken: Taken) -> None:
        """A dumper listener: a local dump for a person or a hang goes to every node."""
        if not wants_broadcast(taken):
            return
        answer = node_answer(self.node, self.host, self._group_rank(), taken)
        with self._lock:
            self._outgoing.append((taken, answer))
        self._wake()

    def tick(self, kv: KV, pfx: str, nodes: Sequence[NodeStatus]) -> float | None:
        """On the cluster loop: send requests, answer others', gather; returns the seconds to
        the next tick while something is under way (None: the cluster interval)."""
        key = pfx + "d/"
        if self._seen is None:
            self._seen = self._first_seen(kv, key)
        with self._lock:
            outgoing, self._outgoing = self._outgoing, []
            answers, self._answers = self._answers, []
        now = time.monotonic()
        try:
            self._send(kv, pfx, now, outgoing, answers, nodes)
        except Exception:
            with self._lock:  # the store failed: send what is left at the next tick
                self._outgoing[:0] = outgoing
                self._answers[:0] = answers
            raise
        self._poll_requests(kv, key)
        self._gather(kv, key, now)
        self._read_gathered(kv, key, now)
        if self.busy:
            return RIDER_TICK
        return FOLLOW_TICK if self.following else None

    def _send(
        self,
        kv: KV,
        pfx: str,
        now: float,
        outgoing: list[tuple[Taken, tuple[JobNode, tuple[JobRank, ...]]]],
        answers: list[tuple[int, bytes]],
        nodes: Sequence[NodeStatus],
    ) -> None:
        """Publish this node's requests and answers; each leaves its list once sent."""
        key = pfx + "d/"
        while outgoing:
            taken, (info, ranks) = outgoing[0]
            k = kv.add(key + "n", 1)
            request = {"node": self.node, "reason": taken.event.reason, "t": time.time()}
            request["source"] = taken.event.source
            kv.set(key + f"r/{k}", json.dumps(request).encode())
            # Every node registered now, but those last seen finished or silent.
            world = next((n.group_world_size for n in nodes if n.node == self.node), None)
            gone = {n.node for n in nodes if not _alive(n, world)}
            alive = {n.node for n in nodes if _alive(n, world)}
            expected = (registered_nodes(kv, pfx) - gone) | alive | {self.node}
            gather = _Gather(
                k,
                taken.event.reason,
                taken.event.source,
                taken.event.path,
                tuple(sorted(expected)),
                now + self.timeout,
                {self.node: (info, ranks)},
            )
            with self._lock:
                self._gathers[k] = gather
            outgoing.pop(0)
        while answers:
            k, raw = answers[0]
            kv.append(key + f"a/{k}/", raw)
            with self._lock:
                self._follow[k] = now + self.timeout + 5.0
            answers.pop(0)

    def _first_seen(self, kv: KV, key: str) -> int:
        """The last request not ours to answer: those made before this node joined. The
        newest may have been made between this node's registration (which the asking node
        counted on) and this first look: that one is answered."""
        n = kv.add(key + "n", 0)
        if n <= 0:
            return n
        (raw,) = kv.get_many([key + f"r/{n}"])
        if raw is None:
            return n - 1  # counted, not written yet: being made now (two writes), so new
        try:
            made = float(json.loads(raw).get("t", 0.0))
        except (ValueError, TypeError, AttributeError):
            made = 0.0
        return n - 1 if made >= self._since else n

    def _read_gathered(self, kv: KV, key: str, now: float) -> None:
        """On a node that answered: the asking node's gathered record, posted here too."""
        with self._lock:
            follow = sorted(self._follow.items())
        if not follow:
            return
        raws = kv.get_many([key + f"j/{k}" for k, _ in follow])
        for (k, until), raw in zip(follow, raws, strict=True):
            if raw is None and now < until:
                continue
            with self._lock:
                self._follow.pop(k, None)
            event = _shared_event(raw) if raw is not None else None
            if event is not None:
                # Its clocks are the asking node's: "ago" is counted from its arrival here.
                self._post(replace(event, mono=time.monotonic()))

    def _poll_requests(self, kv: KV, key: str) -> None:
        seen = self._seen or 0
        n = kv.add(key + "n", 0)
        if n <= seen:
            return
        numbers = list(range(seen + 1, n + 1))
        for k, raw in zip(numbers, kv.get_many([key + f"r/{k}" for k in numbers]), strict=True):
            if raw is None:
                # Counted but not written yet: look again next tick. A request whose asker
                # lost the store between the two writes never comes: skip it after a while.
                first = self._missing.setdefault(k, time.monotonic())
                if time.monotonic() - first < MISSING_REQUEST_WAIT:
                    break
            self._missing.pop(k, None)
            self._seen = k
            if raw is None:
                continue
            try:
                req = json.loads(raw)
                asker, reason = str(req["node"]), str(req["reason"])
            except (ValueError, KeyError, TypeError):
                continue
            if asker == self.node:
                continue
            with self._lock:
                self._answering += 1
            threading.Thread(
                target=self._answer, args=(k, reason), name="tuilaunch-jobdump", daemon=True
            ).start()

    def _answer(self, k: int, reason: str) -> None:
        try:
            last = self._dumper.last
            recent = (
                last is not None
                and time.time() - last.event.wall < REUSE_WITHIN
                and last.event.source != "before-kill"
            )
            taken = last if recent else self._dumper.take(reason, REMOTE)
            info, ranks = node_answer(self.node, self.host, self._group_rank(), taken)
            raw = encode_answer(info, ranks)
        except Exception as e:  # an answer that says why beats none
            info = JobNode(self.node, self.host, None, verdict="", error=f"dump failed: {e}")
            raw = encode_answer(info, ())
        with self._lock:
            self._answers.append((k, raw))
            self._answering -= 1
        self._wake()

    def _gather(self, kv: KV, key: str, now: float) -> None:
        with self._lock:
            gathers = list(self._gathers.values())
        for g in gathers:
            if any(x not in g.answers for x in g.expected):
                # Only the answers not read yet: one or two round trips however many nodes.
                new = kv.appended(key + f"a/{g.request}/", g.read)
                g.read += len(new)
                for raw in new:
                    got = decode_answer(raw)
                    if got is not None:
                        g.answers[got[0].node] = got
            missing = [x for x in g.expected if x not in g.answers]
            if missing and now < g.deadline:
                continue
            event = job_event(g.request, g.reason, g.source, self.node, g.answers, missing, g.path)
            save_job(event, g.path)
            with self._lock:
                self._gathers.pop(g.request, None)
            self._post(event)
            data = json.dumps(to_dict(shared_record(event)), separators=(",", ":")).encode()
            kv.set(key + f"j/{g.request}", data)


def shared_record(e: JobStacks) -> JobStacks:
    """What the asking node puts in the store for the nodes that answered: the whole record
    for a job of up to :data:`SHARED_FRAMES_UP_TO` ranks; past that, the verdict with only the
    odd ranks (their frames kept) and the nodes that run them or did not answer as they should
    (every node reads it back: N copies of every rank is what would grow as N squared)."""
    if len(e.ranks) <= SHARED_FRAMES_UP_TO:
        return e
    odd = set(e.odd_ranks)
    ranks = tuple(r for r in e.ranks if r.global_rank in odd)
    where = {r.node for r in ranks} | {e.requested_by}
    nodes = tuple(n for n in e.nodes if n.node in where or n.error)
    return replace(e, ranks=ranks, nodes=nodes)


def _shared_event(raw: bytes) -> JobStacks | None:
    """The gathered record read back from the store (None: not one of ours)."""
    try:
        event = from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError):
        return None
    return event if isinstance(event, JobStacks) else None


# Seconds a node's record may lag a new round before the node counts as not in it.
ROUND_LAG = 2.0


def _alive(n: NodeStatus, world: int | None) -> bool:
    """Whether ``n`` is expected to answer a dump of a group of ``world`` nodes."""
    # A node that finished or stopped publishing answers nobody: do not wait for it.
    if n.state in OUTCOMES or (n.age is not None and n.age > 10.0):
        return False
    # Nor one whose last record is of another round (a lost node, its record still fresh
    # enough): the group it holds ranks of is not this one. A live node of this round
    # republishes within a tick of the restart.
    stale = n.age is not None and n.age > ROUND_LAG
    return not (stale and None not in (world, n.group_world_size) and n.group_world_size != world)
