"""The collective-level verdict: every rank's newest Flight Recorder entry, fused with its stack.

In the categories of torch's own analyser (``torch.distributed.flight_recorder``): a rank that
never issued the collective the others wait in ("rank 1 never issued all_reduce #41 (it is in
train.py:17 in wandered_off); rank 0 waits in it"), ranks that disagree on the collective at
one sequence number (op or size: "ranks disagree at #57: rank 2 called all_gather of 4 MB, the
others all_reduce of 1 MB"), every rank gone on past its last collective into its own code
("no rank waits in a collective: every rank went on past all_reduce #1, the last one issued
(ranks 0-7 in sleep (idle.py:9))"), and every rank at the same collective, which names no rank
("every rank is at the same collective (all_reduce #9): no rank out of step; suspect the
network, a GPU or NCCL"). The words are those of ``tuilaunch why``'s judge
(:mod:`tui_launch.core.diagnosis.frjudge`, which judges whole dumps, every group's members
known), so the two read alike wherever a run shows both; this one is the in-run verdict because
it has what a dump lacks: where each rank's stack is, and a second look. Ranks whose sequence
numbers advance between two looks are moving:
a skew of a collective between them is no culprit ("ranks 0, 1 move on (...): not a hang").
gloo records no completion (its entries stay ``scheduled``), so the
sequence numbers carry the verdict. Each group is judged by its name (the same on every
member; the local ``pg_id`` is not); where ranks are behind in several (Megatron's tensor
groups, torchtitan's dp and tp meshes), the one the others wait on is named (:func:`_cause`).
Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tui_launch.core.diagnosis.stacks.model import Collective, RankRecord
from tui_launch.core.model.text import fmt_bytes, rank_list


def _ranks(ranks: Iterable[int]) -> str:
    nums = sorted(set(ranks))
    return f"rank {nums[0]}" if len(nums) == 1 else f"ranks {rank_list(nums)}"


def _size(c: Collective) -> int:
    return max(c.in_bytes, c.out_bytes)


@dataclass(frozen=True)
class CollectiveVerdict:
    """The collective-level verdict: ``text`` in one line, the ranks it names (``odd``), and
    ``kind``: ``behind`` (a rank never issued it), ``held`` (ranks are behind in several groups,
    and the stacks tell the cause from ranks held up elsewhere), ``mismatch`` (ranks disagree),
    ``left`` (every record at one collective, but some ranks' stacks are elsewhere: they
    completed it and went on), ``past`` (every rank's stack is in its own code, past its last
    collective: no collective waits), ``same`` (every rank at one collective: no culprit),
    ``moving`` (the ranks' sequence numbers advanced between two looks: no culprit, whatever
    skew one look shows)."""

    text: str
    odd: tuple[int, ...]
    kind: str
    group: str = ""  # the group judged: "TENSOR_MODEL_PARALLEL_GROUP pg 14", "pg 3", "" (pg 0)
    waiting: tuple[int, ...] = ()  # the ranks that wait in it (``behind``)


def collective_verdict(
    records: Iterable[RankRecord], places: dict[int, str], waiting: Iterable[int] | None = None
) -> CollectiveVerdict | None:
    """Judge the ranks by their newest collective of each process group (sequence numbers
    count per group): the first group where a rank is behind or the ranks disagree, else the
    default group's verdict. ``places`` says where each rank's stack is (``wandered_off
    (train.py:17)``), ``waiting`` the ranks whose stack waits (None: not known). None when no
    two ranks have a record to compare."""
    recs = list(records)
    moving = {r.global_rank for r in recs if r.moved}
    known = [r for r in recs if r.error is None]
    if len(known) > 1 and all(r.global_rank in moving for r in known):
        return _moving(recs, moving)
    pgs = sorted({c.pg for r in recs for c in r.collectives}, key=lambda pg: (pg != "0", pg))
    found = [v for pg in pgs if (v := _judge_group(recs, pg, places, waiting, moving)) is not None]
    cause = _cause(found, waiting)
    if cause is not None:
        return cause
    for kinds in (("behind", "mismatch"), ("left",)):
        for v in found:
            if v.kind in kinds:
                return v
    return found[0] if found else None


def _cause(
    found: list[CollectiveVerdict], waiting: Iterable[int] | None
) -> CollectiveVerdict | None:
    """Where ranks are behind in several groups, the one that holds the others up (None when
    nothing tells them apart: the first group's verdict stands).

    From the records: a rank behind in one group that waits in another group's collective,
    which someone else never issued, is held up there (FSDP's rank that waits in the
    data-parallel all-gather its peer never joined, so it never issues its tensor-parallel
    all-reduce). From the stacks (``held``): a rank behind in one group whose stack waits in a
    send/recv or a collective is held up by someone the records do not show (gloo records no
    send/recv: in a pipeline, the stage it sends to), where another rank behind does not wait.
    """
    behind = [v for v in found if v.kind == "behind"]
    if len(behind) < 2:
        return None
    held = {r for v in behind for r in v.odd if any(r in w.waiting for w in behind if w is not v)}
    roots = [v for v in behind if not set(v.odd) <= held]
    kind, why = "behind", ""
    if len(roots) > 1 and waiting is not None:
        stuck = set(waiting)
        free = [v for v in roots if not set(v.odd) <= stuck]
        if free and len(free) < len(roots):
            symptoms = sorted({r for v in roots if v not in free for r in v.odd})
            where = ", ".join(dict.fromkeys(v.group or "pg 0" for v in roots if v not in free))
            verb, wait = ("is", "waits") if len(symptoms) == 1 else ("are", "wait")
            why = (
                f"; {_ranks(symptoms)} {verb} behind in {where} too, but {wait} itself (in a "
                "send/recv or another collective): held up, not the cause"
            )
            held |= set(symptoms)
            roots, kind = free, "held"
    if not roots or len(roots) == len(behind):
        return None
    named = {r for v in roots for r in v.odd}
    said = named | (held if kind == "held" else set())
    # One line per culprit, from its first group; the other groups that point at it counted.
    lines: dict[tuple[int, ...], tuple[str, int]] = {}
    for v in roots:
        text, more = lines.get(v.odd, (v.text, -1))
        if more < 0:
            said.update(v.waiting)
        lines[v.odd] = (text, more + 1)
    rest = sorted({r for v in behind for r in (*v.odd, *v.waiting)} - said)
    parts = []
    for text, more in lines.values():
        if more:
            groups = "1 more group points" if more == 1 else f"{more} more groups point"
            text += f" ({groups} at it)"
        parts.append(text)
    text = "; ".join(parts) + why
    if rest:
        verb = "waits" if len(rest) == 1 else "wait"
        text += f"; {_ranks(rest)} {verb} behind {'it' if len(named) == 1 else 'them'}"
    return CollectiveVerdict(text, tuple(sorted(named)), kind, roots[0].group, roots[0].waiting)


def _moving(recs: list[RankRecord], moving: set[int]) -> CollectiveVerdict:
    """Ranks whose sequence numbers advanced between two looks: no culprit, whatever skew
    one look shows (a rank one collective behind a moving peer is simply later to it)."""
    spans = []
    for r in sorted(recs, key=lambda r: r.global_rank):
        if r.global_rank in moving:
            seen = sorted({n for n in (*r.looks, r.last_enqueued) if n >= 0})
            spans.append(f"rank {r.global_rank} #{seen[0]} to #{seen[-1]}")
    verb = "moves" if len(moving) == 1 else "move"
    text = f"{_ranks(moving)} {verb} on ({', '.join(spans)} between two looks): not a hang"
    return CollectiveVerdict(text, (), "moving")


def _judge_group(
    recs: list[RankRecord],
    pg: str,
    places: dict[int, str],
    waiting: Iterable[int] | None,
    moving: set[int],
) -> CollectiveVerdict | None:
    """One process group's verdict (see :func:`collective_verdict`); a rank in ``moving``
    (its sequence number advanced between two looks) is never the one named."""
    last = {r.global_rank: c for r in recs if (c := r.last_in(pg)) is not None}
    if len(last) < 2:
        return None
    top = max(c.seq for c in last.values())
    behind = sorted(r for r, c in last.items() if c.seq < top)
    if behind and all(r in moving for r in behind):
        return _moving(recs, moving)
    behind = [r for r in behind if r not in moving]
    ahead = sorted(r for r, c in last.items() if c.seq == top)
    op = Counter(last[r].op for r in ahead).most_common(1)[0][0]
    # "#5 of TENSOR_MODEL_PARALLEL_GROUP pg 14", as frjudge labels a group.
    desc = next((c.desc for c in last.values() if c.desc), "")
    group = "" if pg == "0" else f"{desc} pg {pg}" if desc else f"pg {pg}"
    of = f" of {group}" if group else ""
    # A rank with no entry of a group other than the default one may not be in it: only one
    # with no record at all is said to lack one.
    missing = sorted(
        r.global_rank
        for r in recs
        if r.global_rank not in last and (pg == "0" or r.error is not None)
    )
    tail = f"; no record for {_ranks(missing)}" if missing else ""
    if behind:
        wheres = [(r, places.get(r)) for r in behind]
        if len(behind) == 1:
            where = f" (it is in {wheres[0][1]})" if wheres[0][1] else ""
        else:
            known = "; ".join(f"rank {r} in {w}" for r, w in wheres if w)
            where = f" ({known})" if known else ""
        wait = "waits" if len(ahead) == 1 else "wait"
        text = f"{_ranks(behind)} never issued {op} #{top}{of}{where}; {_ranks(ahead)} {wait} in it"
        text += tail
        return CollectiveVerdict(text, tuple(behind), "behind", group, tuple(ahead))
    kinds = Counter((last[r].op, _size(last[r])) for r in ahead)
    if len(kinds) > 1:
        (common, _), *_ = kinds.most_common()
        odd = sorted(r for r in ahead if (last[r].op, _size(last[r])) != common)
        others = [r for r in ahead if r not in odd]
        what = ", ".join(
            f"rank {r} called {last[r].op} of {fmt_bytes(_size(last[r]), words=True)}" for r in odd
        )
        text = (
            f"ranks disagree at #{top}{of}: {what}, "
            f"{'the others' if len(others) > 1 else _ranks(others)} "
            f"{common[0]} of {fmt_bytes(common[1], words=True)}"
        )
        return CollectiveVerdict(text + tail, tuple(odd), "mismatch", group)
    stuck = set(waiting) if waiting is not None else set(ahead)
    idle = sorted(r for r in ahead if r not in stuck and r in places)
    if idle and all(r in moving for r in idle):
        return _moving(recs, moving)  # they went on past it, and on again
    idle = [r for r in idle if r not in moving]
    if idle and len(idle) < len(ahead):
        # Every record is at #top, but some ranks' stacks are elsewhere: they completed it and
        # went on (gloo records no completion), the others still wait in it.
        where = "; ".join(f"rank {r} in {places[r]}" for r in idle)
        rest = [r for r in ahead if r not in idle]
        wait = "waits" if len(rest) == 1 else "wait"
        text = f"{_ranks(idle)} left {op} #{top}{of} and did not come back ({where}); "
        text += f"{_ranks(rest)} {wait} in it" + tail
        return CollectiveVerdict(text, tuple(idle), "left", group)
    if idle and len(idle) == len(ahead) and waiting is not None:
        # Every rank's stack is in its own code: each went on past the last collective it
        # issued (gloo's record says "scheduled" still). No collective waits: not the
        # network's or NCCL's doing, whatever stands still.
        return CollectiveVerdict(
            f"no rank waits in a collective: {'every rank' if not tail else _ranks(idle)} went"
            f" on past {op} #{top}{of}, the last one issued ({_places(idle, places)})" + tail,
            (),
            "past",
            group,
        )
    text = (
        f"every rank is at the same collective ({op} #{top}{of}): no rank out of step; "
        "suspect the network, a GPU or NCCL" + tail
    )
    return CollectiveVerdict(text, (), "same", group)


def _places(ranks: list[int], places: dict[int, str]) -> str:
    """``ranks 0-7 in sleep (idle.py:9)``, each place with its ranks, most ranks first."""
    by: dict[str, list[int]] = {}
    for r in ranks:
        by.setdefault(places[r], []).append(r)
    ordered = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return "; ".join(f"{_ranks(rs)} in {where}" for where, rs in ordered)
