"""The verdict on a job's Flight Recorder dumps: per process group, then one culprit per cause.

Each process group (``TENSOR_MODEL_PARALLEL_GROUP`` pg 41: its name and its ranks, as every
member's ``pg_config`` says) is judged from what each member issued and completed
(``pg_status``, else the entries), its outstanding entries and its point-to-point operations:

- **never issued**: the collective after the last one the most-behind member issued, which
  others issued and wait in ("rank 12 never issued all_to_all #20537 of
  EXPERT_MODEL_PARALLEL_GROUP pg 74; ranks 13-15 wait in it");
- **stopped completing**: a member whose oldest outstanding collective a peer has completed,
  while it kept issuing (more entries outstanding than its peers): its stream or GPU stopped,
  not its program path (``stalled``);
- **no dump**: a member with no dump, or an unreadable one: a suspect, not a gap;
- **mismatch**: members that disagree at one sequence number, in the classes of torch's own
  analyser (:class:`MatchClass`, :func:`match`, ported from ``Op.match``);
- **same**: every member waits in the same collective: no rank out of step.

Across groups, each waiting rank waits *on* the ranks that block it (a collective they never
issued, a send or recv they never posted, no dump): the culprits are the ranks at the end of
those waits (a rank that waits on another is a symptom, however many groups name it), and a
rank whose work stopped completing. :func:`judge` returns a :class:`FrVerdict`: one line a
person reads first, each group's verdict, and a dictionary for scripts. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tui_launch.core.diagnosis.frdump import DumpSet, Entry, GroupInfo, RankDump
from tui_launch.core.model.events import FlightRecorderVerdict, FrGroup
from tui_launch.core.model.events.diagnosis import FR_GROUPS_KEPT
from tui_launch.core.model.text import rank_list

__all__ = [
    "FrVerdict",
    "GroupVerdict",
    "MatchClass",
    "Mismatch",
    "judge",
    "match",
]

SCHEMA = 1
# The blockers kept per waiter and group (the most behind first).
_BLOCKERS = 64
# A list of ranks longer than this many runs is said by its count, its ends and an ellipsis.
_LIST_RUNS = 8


class MatchClass(str, Enum):
    """How two ranks' entries at one sequence number compare: torch's ``MatchState``."""

    FULLY_MATCHED = "FULLY_MATCHED"
    COLLECTIVE_TYPE_MISMATCH = "COLLECTIVE_TYPE_MISMATCH"
    SIZE_OR_SYNTAX_MISMATCH = "SIZE_OR_SYNTAX_MISMATCH"
    COLLECTIVE_STATE_MISMATCH = "COLLECTIVE_STATE_MISMATCH"
    COLLECTIVE_DTYPE_MISMATCH = "COLLECTIVE_DTYPE_MISMATCH"
    UNDECIDED = "UNDECIDED"


# The collectives and coalescing markers torch's analyser knows (``types.COLLECTIVES``).
_ALL_GATHERS = ("all_gather", "all_gather_base", "all_gather_into_tensor_coalesced")
_REDUCE_SCATTERS = ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced")
_COALESCED = ("coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced")
# Mismatches that name a culprit; a state mismatch is what a stalled rank shows.
_DISAGREE = (
    MatchClass.COLLECTIVE_TYPE_MISMATCH,
    MatchClass.SIZE_OR_SYNTAX_MISMATCH,
    MatchClass.COLLECTIVE_DTYPE_MISMATCH,
)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _first(sizes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return sizes[0] if sizes else ()


def _dtype_mismatch(a: Entry, b: Entry) -> bool:
    # torch compares sets of dtypes, and only where the first tensor has a shape.
    ain, aout = set(a.input_dtypes), set(a.output_dtypes)
    bin_, bout = set(b.input_dtypes), set(b.output_dtypes)
    a_in, a_out, b_in, b_out = (
        _first(a.input_sizes),
        _first(a.output_sizes),
        _first(b.input_sizes),
        _first(b.output_sizes),
    )
    return bool(
        (a.op not in ("scatter", "gather", "broadcast") and ain != aout and a_in and a_out)
        or (a.op not in ("scatter", "broadcast") and ain != bin_ and a_in and b_in)
        or (a.op != "gather" and aout != bout and a_out and b_out)
    )


def match(a: Entry, b: Entry, pg_size: int) -> MatchClass:
    """How ``b`` compares with ``a`` (the reference) in a group of ``pg_size`` ranks: the
    class torch's ``Op.match`` gives the same two entries."""
    if a.op == "send":
        ok = b.op == "recv" and (a.src, a.dst) == (b.src, b.dst) and a.input_sizes == b.output_sizes
        return MatchClass.FULLY_MATCHED if ok else MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op == "recv":
        ok = b.op == "send" and (a.src, a.dst) == (b.src, b.dst) and a.output_sizes == b.input_sizes
        return MatchClass.FULLY_MATCHED if ok else MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op in _COALESCED:
        return MatchClass.FULLY_MATCHED if a.op == b.op else MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op != b.op:
        return MatchClass.COLLECTIVE_TYPE_MISMATCH
    if a.op not in ("all_to_all", "scatter") and a.input_sizes != b.input_sizes:
        return MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op not in ("all_to_all", "gather") and a.output_sizes != b.output_sizes:
        return MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op in ("all_reduce", "allreduce_coalesced") and a.input_sizes != b.output_sizes:
        return MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op in _ALL_GATHERS and _numel(_first(b.output_sizes)) != _numel(
        _first(a.input_sizes)
    ) * max(pg_size, 1):
        return MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if a.op in _REDUCE_SCATTERS and _numel(_first(b.input_sizes)) != _numel(
        _first(a.output_sizes)
    ) * max(pg_size, 1):
        return MatchClass.SIZE_OR_SYNTAX_MISMATCH
    if _dtype_mismatch(a, b):
        return MatchClass.COLLECTIVE_DTYPE_MISMATCH
    if a.state != b.state:
        return MatchClass.COLLECTIVE_STATE_MISMATCH
    if a.op == "all_to_all":
        return MatchClass.UNDECIDED
    return MatchClass.FULLY_MATCHED


@dataclass(frozen=True)
class Mismatch:
    """A rank whose entry at ``seq`` disagrees with its group's (``reference``: the rank
    whose entry the others are compared with)."""

    rank: int
    seq: int
    cls: MatchClass
    op: str
    reference: int
    reference_op: str
    record_id: int
    ambiguous: bool = False

    def to_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "rank": self.rank,
            "seq": self.seq,
            "class": self.cls.value,
            "op": self.op,
            "reference_rank": self.reference,
            "reference_op": self.reference_op,
            "record_id": self.record_id,
            "ambiguous": self.ambiguous,
        }


@dataclass(frozen=True)
class Stall:
    """Why a rank's work stopped completing in one group."""

    seq: int
    op: str
    completed_by: tuple[int, ...]
    outstanding: int
    peers: int

    def to_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "seq": self.seq,
            "op": self.op,
            "completed_by": list(self.completed_by),
            "outstanding": self.outstanding,
            "peers_outstanding": self.peers,
        }


@dataclass
class GroupVerdict:
    """One process group's verdict. ``kind``: ``never_issued``, ``stalled``, ``mismatch``,
    ``no_dump``, ``p2p`` (a send or recv a peer never posted), ``same`` (every member waits
    in one collective), ``idle`` (nothing outstanding)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    kind: str
    text: str
    culprits: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    seq: int = -1
    op: str = ""
    stalled: tuple[int, ...] = ()
    # A stalled rank's evidence: the collective outstanding on it, the peers that completed
    # it, its outstanding count and its peers' (median).
    stall: dict[int, Stall] = field(default_factory=dict)
    missing: tuple[int, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    created_ns: int = 0

    @property
    def label(self) -> str:
        """``EXPERT_MODEL_PARALLEL_GROUP pg 74`` (the name alone when it has no description)."""
        return group_label(self.name, self.desc)

    def to_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "name": self.name,
            "desc": self.desc,
            "ranks": list(self.ranks),
            "kind": self.kind,
            "text": self.text,
            "culprits": list(self.culprits),
            "waiting": list(self.waiting),
            "seq": self.seq,
            "op": self.op,
            "stalled": list(self.stalled),
            "stall": {str(r): st.to_dict() for r, st in sorted(self.stall.items())},
            "missing": list(self.missing),
            "mismatches": [m.to_dict() for m in self.mismatches],
        }


@dataclass
class Culprit:
    """A rank the verdict names, and why: ``never_issued``, ``stalled``, ``no_dump``,
    ``mismatch``, ``p2p``; ``groups`` every group that points at it."""

    rank: int
    why: tuple[str, ...]
    text: str
    groups: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "rank": self.rank,
            "why": list(self.why),
            "text": self.text,
            "groups": list(self.groups),
        }


@dataclass
class FrVerdict:
    """The verdict on a job's dumps: ``text`` the one line, ``kind`` (``culprit``,
    ``mismatch``, ``same``, ``idle``), the culprits, each group's verdict."""

    text: str
    kind: str
    culprits: tuple[Culprit, ...]
    groups: tuple[GroupVerdict, ...]
    ranks: tuple[int, ...]
    dumps: int
    missing: tuple[int, ...] = ()
    unreadable: dict[int, str] = field(default_factory=dict)
    waiting: tuple[int, ...] = ()

    @property
    def culprit_ranks(self) -> tuple[int, ...]:
        """The ranks named, in order."""
        return tuple(sorted(c.rank for c in self.culprits))

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (``schema`` 1)."""
        return {
            "schema": SCHEMA,
            "verdict": self.text,
            "kind": self.kind,
            "culprits": [c.to_dict() for c in self.culprits],
            "ranks": len(self.ranks),
            "dumps": self.dumps,
            "missing": list(self.missing),
            "unreadable": {str(k): v for k, v in sorted(self.unreadable.items())},
            "waiting": list(self.waiting),
            "groups": [g.to_dict() for g in self.groups if g.kind != "idle"],
        }

    def waiting_groups(self) -> list[GroupVerdict]:
        """The groups that are not idle, worst first (as :meth:`lines` lists them)."""
        return sorted(
            (g for g in self.groups if g.kind != "idle"),
            key=lambda g: (_ORDER.index(g.kind) if g.kind in _ORDER else 9, _name_key(g.name)),
        )

    def group_records(self) -> tuple[FrGroup, ...]:
        """The first ``FR_GROUPS_KEPT`` waiting groups, worst first, as events carry them."""
        return tuple(
            FrGroup(g.label, rank_list(g.ranks), g.kind, g.text)
            for g in self.waiting_groups()[:FR_GROUPS_KEPT]
        )

    def event(self, attempt: int, source: str, path: str) -> FlightRecorderVerdict:
        """The verdict as the journal's event: the line, the culprits, the first
        ``FR_GROUPS_KEPT`` waiting groups (the dashboard, the report, a replay show them)."""
        return FlightRecorderVerdict(
            attempt,
            self.text,
            self.kind,
            self.culprit_ranks,
            self.group_records(),
            self.dumps,
            groups_waiting=len(self.waiting_groups()),
            groups_total=len(self.groups),
            source=source,
            path=path,
        )

    def lines(self) -> list[str]:
        """For a person: the verdict, then each group that is not idle, worst first."""
        out = [self.text]
        shown = self.waiting_groups()
        if shown:
            out.append("")
            out.append(f"{len(shown)} of {len(self.groups)} process groups wait:")
        for g in shown:
            out.append(f"  {g.label} (ranks {rank_list(g.ranks)}): {g.text}")
            for m in g.mismatches:
                out.append(
                    f"    rank {m.rank} at #{m.seq}: {m.cls.value} ({m.op} vs rank "
                    f"{m.reference}'s {m.reference_op})"
                )
        for r, why in sorted(self.unreadable.items()):
            out.append(f"rank {r}: unreadable dump ({why})")
        return out


# Worst first: the order groups are listed in.
_ORDER = ("never_issued", "stalled", "no_dump", "mismatch", "p2p", "same")


def group_label(name: str, desc: str) -> str:
    """``EXPERT_MODEL_PARALLEL_GROUP pg 74``; ``pg 0`` without a description."""
    return f"{desc} pg {name}" if desc and desc != "undefined" else f"pg {name}"


def _name_key(name: str) -> tuple[int, str]:
    try:
        return int(name), name
    except ValueError:
        return 1 << 62, name


def _ranks(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-2, 7``; a long scattered list as ``64 ranks (8, 16, ..., 512)``
    (the JSON keeps every rank)."""
    nums = sorted(set(ranks))
    if len(nums) == 1:
        return f"rank {nums[0]}"
    text = rank_list(nums)
    runs = text.split(", ")
    if len(runs) > _LIST_RUNS:
        return f"{len(nums)} ranks ({', '.join(runs[:3])}, ..., {runs[-1]})"
    return f"ranks {text}"


@dataclass
class _Member:
    """One rank's state in one group."""

    issued: int | None  # last collective enqueued (None: not known)
    completed: int | None  # last completed (None: not known, e.g. gloo)
    colls: dict[int, list[Entry]]  # collective entries by sequence number
    p2p_out: list[Entry]  # point-to-point entries not completed

    def oldest(self) -> int | None:
        """The collective it waits in: the first not completed (its newest, when completion
        is not recorded); None when nothing is outstanding."""
        if self.issued is None:
            return None
        if self.completed is None:
            return self.issued if self.issued >= 0 and self.colls else None
        return self.completed + 1 if self.issued > self.completed else None

    def outstanding(self) -> int:
        """How many collectives it issued and has not completed."""
        if self.issued is None or self.completed is None:
            return 0
        return max(0, self.issued - self.completed)


def _member(dump: RankDump, name: str, entries: list[Entry], p2p_group: bool) -> _Member:
    colls: dict[int, list[Entry]] = {}
    p2p_out: list[Entry] = []
    for e in entries:
        if e.p2p:
            if e.state != "completed":
                p2p_out.append(e)
        else:
            colls.setdefault(e.seq, []).append(e)
    st = dump.status.get(name)
    issued: int | None
    completed: int | None
    if st is not None and not p2p_group:
        # pg_status counts collectives only where the group carries no point-to-point
        # operation (it counts those too, in one number).
        issued, completed = (
            st.enqueued,
            (st.completed if st.completed >= 0 or st.enqueued < 0 else None),
        )
        if colls:
            issued = max(issued, max(colls))
    elif colls:
        issued = max(colls)
        done = [s for s, es in colls.items() if all(e.state == "completed" for e in es)]
        pending = [s for s, es in colls.items() if any(e.state != "completed" for e in es)]
        if done or any(e.state == "started" for es in colls.values() for e in es):
            completed = min(pending) - 1 if pending else issued
        else:
            completed = None  # gloo records no completion: its entries stay scheduled
    else:
        issued, completed = (st.enqueued, None) if st is not None else (None, None)
    return _Member(issued, completed, colls, p2p_out)


@dataclass
class _Group:
    name: str
    desc: str
    ranks: tuple[int, ...]
    members: dict[int, _Member] = field(default_factory=dict)
    p2p: bool = False


def _groups(dumps: DumpSet) -> list[_Group]:
    """Every process group, by name and ranks (a split group whose members each see a
    different ``ranks`` is as many groups), with each dumped member's state."""
    by_rank_entries: dict[int, dict[str, list[Entry]]] = {}
    p2p_names: set[str] = set()
    for r, d in dumps.dumps.items():
        per: dict[str, list[Entry]] = {}
        for e in d.entries:
            per.setdefault(e.group, []).append(e)
            if e.p2p:
                p2p_names.add(e.group)
        by_rank_entries[r] = per
    # Keyed by the ranks tuple's identity: dumps that list the same ranks share one tuple
    # (frdump parses each list once), and hashing a 4,096-rank tuple per dump would cost more
    # than the rest of the verdict.
    groups: dict[tuple[str, int], _Group] = {}
    for r, d in sorted(dumps.dumps.items()):
        per = by_rank_entries[r]
        infos = dict(d.groups)
        for name in per:
            if name not in infos:  # an entry whose group the config does not list
                infos[name] = GroupInfo(name, per[name][0].desc, (r,), frozenset((r,)))
        for name, info in infos.items():
            ranks = info.ranks or (r,)
            if r not in (info.members or ranks):
                continue
            key = (name, id(ranks))
            g = groups.get(key)
            if g is None:
                desc = info.desc
                if desc == "undefined" and per.get(name):
                    desc = per[name][0].desc
                g = groups[key] = _Group(name, desc, ranks, p2p=name in p2p_names)
            g.members[r] = _member(d, name, per.get(name, []), g.p2p)
    merged: dict[tuple[str, tuple[int, ...]], _Group] = {}
    for g in groups.values():  # equal lists that are not one tuple (a dump's own list)
        same = merged.setdefault((g.name, g.ranks), g)
        if same is not g:
            same.members.update(g.members)
    return sorted(merged.values(), key=lambda g: (_name_key(g.name), g.ranks))


def _op_at(g: _Group, seq: int, ranks: Iterable[int]) -> tuple[str, int]:
    """The op of collective ``seq`` as the ranks that issued it recorded it, and when the
    first of them issued it."""
    ops: Counter[str] = Counter()
    created = 0
    for r in ranks:
        for e in g.members[r].colls.get(seq, ()):
            ops[e.op] += 1
            if e.created_ns and (not created or e.created_ns < created):
                created = e.created_ns
    return (ops.most_common(1)[0][0] if ops else "collective"), created


def _signature(entries: list[Entry]) -> tuple[Any, ...]:
    return tuple(
        (e.op, e.input_sizes, e.output_sizes, str(e.input_dtypes), str(e.output_dtypes))
        for e in entries
    )


def _mismatches(g: _Group) -> list[Mismatch]:
    """Members that disagree with the majority at a sequence number both recorded (entries
    of one coalesced call share it: compared position by position). ``ambiguous`` when no
    majority says which side is odd (two members, or a tie)."""
    by_seq: dict[int, dict[int, list[Entry]]] = {}
    for r, m in g.members.items():
        for seq, es in m.colls.items():
            by_seq.setdefault(seq, {})[r] = es
    out: list[Mismatch] = []
    size = len(g.ranks)
    for seq in sorted(by_seq):
        have = by_seq[seq]
        if len(have) < 2:
            continue
        sigs = {r: _signature(es) for r, es in have.items()}
        counts = Counter(sigs.values())
        if len(counts) == 1:
            continue  # every member recorded the same call (the usual case)
        (common, n), *rest = counts.most_common()
        ambiguous = bool(rest) and rest[0][1] == n
        ref_rank = min(r for r, sg in sigs.items() if sg == common)
        ref = have[ref_rank]
        for r, es in sorted(have.items()):
            if sigs[r] == common:
                continue
            for a, b in zip(ref, es, strict=False):
                cls = match(a, b, size)
                if cls in _DISAGREE:
                    out.append(
                        Mismatch(r, seq, cls, _call(b), ref_rank, _call(a), b.record_id, ambiguous)
                    )
                    break
    return out


def _call(e: Entry) -> str:
    """``all_reduce of [[1024]] BFloat16``: what a rank called, for a mismatch's line."""
    sizes = ",".join("x".join(str(d) for d in s) for s in e.input_sizes) or "-"
    dtypes = e.input_dtypes if isinstance(e.input_dtypes, str) else ",".join(e.input_dtypes)
    return f"{e.op} of [{sizes}] {dtypes}".rstrip()


@dataclass
class _Edge:
    blocker: int
    group: str
    why: str  # never_issued, p2p, no_dump


def _judge_group(g: _Group, absent: dict[int, str], edges: dict[int, list[_Edge]]) -> GroupVerdict:
    label = group_label(g.name, g.desc)
    members = g.members
    missing = tuple(r for r in g.ranks if r not in members)
    waiting_at = {r: s for r, m in members.items() if (s := m.oldest()) is not None}
    p2p_wait = {r: m.p2p_out for r, m in members.items() if m.p2p_out}
    base = GroupVerdict(g.name, g.desc, g.ranks, "idle", "nothing outstanding", missing=missing)
    if not waiting_at and not p2p_wait:
        return base
    mism = tuple(_mismatches(g))
    # Stalled: its oldest outstanding collective was completed by a peer, and it issued on.
    stalled: list[int] = []
    completed = {r: m.completed for r, m in members.items() if m.completed is not None}
    top_done = max(completed.values(), default=-1)
    for r, s in waiting_at.items():
        m = members[r]
        if m.completed is not None and s <= top_done and (m.issued or -1) >= s:
            stalled.append(r)
    # Never issued: the first collective the most-behind member never issued.
    known = {r: m.issued for r, m in members.items() if m.issued is not None}
    culprits: list[int] = []
    waiting: list[int] = []
    seq = -1
    op = ""
    created = 0
    if known and waiting_at:
        lag = min(known.values())
        seq = lag + 1
        waiting = sorted(
            r
            for r, m in members.items()
            if m.issued is not None
            and m.issued >= seq
            and (m.completed is None or m.completed < seq)
        )
        if waiting:
            culprits = sorted(r for r, i in known.items() if i == lag)
            op, created = _op_at(g, seq, waiting)
    # Each waiter waits on the members that never issued the collective it waits in: the
    # most-behind ones first, at most _BLOCKERS of them (a 4,096-rank group where half are
    # behind must not make 4 million edges).
    behind_first = sorted(known.items(), key=lambda kv: kv[1])
    for w, s in waiting_at.items():
        for r, i in behind_first[:_BLOCKERS]:
            if i >= s:
                break
            if r != w:
                edges.setdefault(w, []).append(_Edge(r, g.name, "never_issued"))
        for r in missing[:_BLOCKERS]:
            edges.setdefault(w, []).append(_Edge(r, g.name, "no_dump"))
    # The ranks that issued the collective the most-behind members never issued wait on them,
    # even where their own oldest outstanding one is earlier (none of them completed it).
    for w in waiting:
        if not any(e.group == g.name and e.why == "never_issued" for e in edges.get(w, ())):
            for c in culprits[:_BLOCKERS]:
                edges.setdefault(w, []).append(_Edge(c, g.name, "never_issued"))
    # Point to point: a send or recv whose peer has posted no recv or send to match it.
    p2p_blockers: dict[int, set[int]] = {}
    ordered = sorted(g.ranks)
    for w, outs in p2p_wait.items():
        for e in outs:
            local = e.dst if e.op == "send" else e.src
            if not 0 <= local < len(ordered):
                continue
            peer = ordered[local]
            if peer == w:
                continue
            if peer not in members:
                edges.setdefault(w, []).append(_Edge(peer, g.name, "no_dump"))
                continue
            # Only the other half of the pair answers it, as torch's analyser pairs them (a
            # send with a recv): two stages that each send to the other and wait (a pipeline
            # schedule's order wrong on one side) each wait on the other.
            posted = any(
                (ordered[p.dst] if p.op == "send" and 0 <= p.dst < len(ordered) else None) == w
                if e.op == "recv"
                else (ordered[p.src] if p.op == "recv" and 0 <= p.src < len(ordered) else None) == w
                for p in members[peer].p2p_out
            )
            if not posted:
                p2p_blockers.setdefault(peer, set()).add(w)
                edges.setdefault(w, []).append(_Edge(peer, g.name, "p2p"))
    verdict = GroupVerdict(
        g.name,
        g.desc,
        g.ranks,
        "same",
        "",
        culprits=tuple(culprits),
        waiting=tuple(waiting),
        seq=seq,
        op=op,
        stalled=tuple(sorted(stalled)),
        missing=missing,
        mismatches=mism,
        created_ns=created,
    )
    parts: list[str] = []
    if culprits:
        verdict.kind = "never_issued"
        verb = "wait" if len(waiting) > 1 else "waits"
        parts.append(f"{_ranks(culprits)} never issued {op} #{seq}; {_ranks(waiting)} {verb} in it")
    if stalled:
        verdict.kind = "stalled" if not culprits else verdict.kind
        for r in sorted(stalled):
            m = members[r]
            s = waiting_at[r]
            done = sorted(p for p, c in completed.items() if p != r and c >= s)
            peers = [members[p].outstanding() for p in members if p != r]
            typical = sorted(peers)[len(peers) // 2] if peers else 0
            sop, _ = _op_at(g, s, [r])
            verdict.stall[r] = Stall(s, sop, tuple(done), m.outstanding(), typical)
            parts.append(
                f"rank {r}'s work stopped completing: {sop} #{s} is outstanding on it, "
                f"{_ranks(done)} completed it ({m.outstanding()} outstanding, peers {typical})"
            )
    if missing and waiting_at:
        if not parts:
            verdict.kind = "no_dump"
        whats = "; ".join(f"rank {r}: {absent.get(r, 'no dump')}" for r in missing)
        parts.append(f"no dump from {_ranks(missing)} ({whats})")
    disagree = [m for m in mism if m.cls in _DISAGREE]
    if disagree:
        if not parts:
            verdict.kind = "mismatch"
        for mm in disagree[:3]:
            parts.append(
                f"rank {mm.rank} called {mm.op} at #{mm.seq}, rank {mm.reference} "
                f"{mm.reference_op} ({mm.cls.value})"
            )
    if p2p_blockers:
        if not parts:
            verdict.kind = "p2p"
        for peer, ws in sorted(p2p_blockers.items()):
            verb = "wait" if len(ws) > 1 else "waits"
            parts.append(
                f"{_ranks(ws)} {verb} in send/recv with rank {peer}, which posted none to match"
            )
    if not parts:
        if waiting_at:
            at = Counter(waiting_at.values()).most_common(1)[0][0]
            sop, _ = _op_at(g, at, [r for r, s in waiting_at.items() if s == at])
            n = len(waiting_at)
            who = (
                f"all {n} members wait"
                if n == len(g.ranks) and n > 2
                else f"{_ranks(waiting_at)} wait"
            )
            if n == 2 and n == len(g.ranks):
                who = "both members wait"
            if n == 1:
                who = f"rank {next(iter(waiting_at))} waits"
            parts.append(f"{who} in {sop} #{at}: no member out of step")
            verdict.seq, verdict.op = at, sop
        else:
            peers = sorted(p2p_wait)
            parts.append(f"{_ranks(peers)} wait in send/recv their peers posted too")
    verdict.text = "; ".join(parts)
    del label
    return verdict


def _roots(
    suspects: set[int], stalled: set[int], absent: set[int], edges: dict[int, list[_Edge]]
) -> list[int]:
    """The suspects at the end of the waits: stalled, absent, or waiting on nobody. A rank
    that waits on another is a symptom; a knot with no way out is all roots."""
    roots = sorted(r for r in suspects if r in stalled or r in absent or not edges.get(r))
    if roots:
        return roots
    return sorted(suspects)


def judge(dumps: DumpSet) -> FrVerdict:
    """The verdict on every rank's dump (see the module's docstring)."""
    absent_reason: dict[int, str] = {}
    groups = _groups(dumps)
    world = set(dumps.world())
    for g in groups:
        world.update(g.ranks)
    for r in world:
        if r not in dumps.dumps:
            absent_reason[r] = (
                f"unreadable dump: {dumps.unreadable[r]}" if r in dumps.unreadable else "no dump"
            )
    edges: dict[int, list[_Edge]] = {}
    verdicts = [_judge_group(g, absent_reason, edges) for g in groups]
    stalled = {r for v in verdicts for r in v.stalled}
    odd = [m for v in verdicts for m in v.mismatches if m.cls in _DISAGREE]
    # A majority names the odd rank; where none does (two members), the rank a majority
    # elsewhere named is the odd one, else the one compared with the lower rank.
    mismatched = {m.rank for m in odd if not m.ambiguous}
    mismatched |= {
        m.reference if m.reference in mismatched else m.rank
        for m in odd
        if m.ambiguous and m.rank not in mismatched
    }
    blockers = {e.blocker for es in edges.values() for e in es}
    absent = set(absent_reason)
    suspects = blockers | stalled
    waiting = {w for w in edges} | {r for v in verdicts for r in v.waiting}
    roots = _roots(suspects, stalled, absent, edges)
    culprits: list[Culprit] = []
    covered: set[int] = set()
    said: set[int] = set()  # waiting ranks a culprit's line already names
    parts: list[str] = []
    by_rank_groups: dict[int, list[GroupVerdict]] = {}
    for v in verdicts:
        for r in (*v.culprits, *v.stalled):
            by_rank_groups.setdefault(r, []).append(v)
    never = [r for r in roots if any(r in v.culprits for v in verdicts)]
    # One line per cause: the group that covers the most culprits, then the most waiters,
    # then the one blocked first.
    findings = [v for v in verdicts if v.kind in ("never_issued", "stalled") and v.culprits]
    while True:
        left = [r for r in never if r not in covered]
        if not left:
            break
        best = max(
            (v for v in findings if set(v.culprits) & set(left)),
            key=lambda v: (
                len(set(v.culprits) & set(left)),
                len(v.waiting),
                -(v.created_ns or 0),
                -_name_key(v.name)[0],
            ),
        )
        named = sorted(set(best.culprits) & set(left))
        covered.update(named)
        said.update(best.waiting)
        verb = "wait" if len(best.waiting) > 1 else "waits"
        line = (
            f"{_ranks(named)} never issued {best.op} #{best.seq} of {best.label}; "
            f"{_ranks(best.waiting)} {verb} in it"
        )
        more = {v.name for r in named for v in by_rank_groups.get(r, ()) if v is not best}
        if more:
            groups_word = (
                f"{len(more)} more groups point" if len(more) > 1 else "1 more group points"
            )
            line += f" ({groups_word} at {'it' if len(named) == 1 else 'them'})"
        also = [r for r in named if r in stalled]
        if also:
            line += f"; {_ranks(also)}: work had stopped completing too (a GPU or stream fault)"
        parts.append(line)
        for r in named:
            culprits.append(
                Culprit(
                    r,
                    ("never_issued", "stalled") if r in stalled else ("never_issued",),
                    line,
                    tuple(sorted({v.label for v in by_rank_groups.get(r, ())})),
                )
            )
    for r in roots:
        if r in covered:
            continue
        if r in stalled:
            gs = [v for v in by_rank_groups.get(r, ()) if r in v.stall]
            # The group where it is furthest behind its peers says it best.
            worst = max(gs, key=lambda v: v.stall[r].outstanding - v.stall[r].peers)
            st = worst.stall[r]
            line = (
                f"rank {r}'s work stopped completing while it kept issuing: {st.op} #{st.seq} "
                f"of {worst.label} is outstanding on it and {_ranks(st.completed_by)} "
                f"completed it ({st.outstanding} outstanding on it, {st.peers} on its peers): "
                "a GPU or stream fault, not a program path"
            )
            culprits.append(Culprit(r, ("stalled",), line, tuple(sorted({v.label for v in gs}))))
        elif r in absent:
            who = sorted(w for w, es in edges.items() if any(e.blocker == r for e in es))
            verb = "wait" if len(who) > 1 else "waits"
            line = f"rank {r} left {absent_reason[r]}; {_ranks(who)} {verb} on it"
            if absent_reason[r] == "no dump":
                line = f"rank {r} left no dump; {_ranks(who)} {verb} on it"
            culprits.append(Culprit(r, ("no_dump",), line))
            said.update(who)
        else:
            es = [(w, e) for w, es in edges.items() for e in es if e.blocker == r]
            who = sorted({w for w, _ in es})
            verb = "wait" if len(who) > 1 else "waits"
            kinds = {e.why for _, e in es}
            gname = next((e.group for _, e in es), "")
            glabel = next((v.label for v in verdicts if v.name == gname), f"pg {gname}")
            what = "send/recv" if kinds == {"p2p"} else "collective"
            line = f"rank {r} never posted the {what} {_ranks(who)} {verb} in ({glabel})"
            said.update(who)
            culprits.append(Culprit(r, tuple(sorted(kinds)), line))
        covered.add(r)
        parts.append(culprits[-1].text)
    kind = "culprit" if culprits else "same"
    if not culprits:
        if odd:
            kind = "mismatch"
            first = sorted(odd, key=lambda m: (m.ambiguous, m.seq))[0]
            v = next(v for v in verdicts if first in v.mismatches)
            m = first
            parts.append(
                f"ranks disagree in {v.label} at #{m.seq}: rank {m.rank} called {m.op}, "
                f"rank {m.reference} {m.reference_op} ({m.cls.value})"
            )
            for r in sorted(mismatched):
                culprits.append(Culprit(r, ("mismatch",), parts[-1]))
        else:
            busy = [v for v in verdicts if v.kind == "same"]
            if busy:
                v = max(busy, key=lambda v: (len(v.ranks), -_name_key(v.name)[0]))
                at = {r for b in busy for r in b.ranks}
                every = (
                    "every rank is"
                    if len(at) == len(world)
                    else f"{_ranks(at)} {'is' if len(at) == 1 else 'are'}"
                )
                parts.append(
                    f"{every} at the same collective ({v.op or 'send/recv'}"
                    f"{' #' + str(v.seq) if v.seq >= 0 else ''} of {v.label}"
                    f"{f' and {len(busy) - 1} more groups' if len(busy) > 1 else ''}): no rank out "
                    f"of step; suspect the network, a GPU or NCCL"
                )
            else:
                kind = "idle"
                n = len(dumps.dumps)
                text = f"no collective is outstanding in {n} dump{'s' if n != 1 else ''}"
                if absent:
                    # Nothing to weigh them against: said, not named.
                    text += f"; no dump from {_ranks(absent)}, which may be waiting"
                else:
                    text += ": they show no hang"
                parts.append(text)
    blocked = waiting | {
        r for g in groups for r, m in g.members.items() if m.oldest() is not None or m.p2p_out
    }
    behind = sorted(blocked - {c.rank for c in culprits})
    rest = [r for r in behind if r not in said]
    if culprits and rest:
        verb = "wait" if len(rest) > 1 else "waits"
        parts.append(f"{_ranks(rest)} {verb} behind {'it' if len(culprits) == 1 else 'them'}")
    return FrVerdict(
        text="; ".join(parts),
        kind=kind,
        culprits=tuple(culprits),
        groups=tuple(verdicts),
        ranks=tuple(sorted(world)),
        dumps=len(dumps.dumps),
        missing=tuple(sorted(absent)),
        unreadable=dict(dumps.unreadable),
        waiting=tuple(behind),
    )
