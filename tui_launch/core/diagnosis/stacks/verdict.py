"""A verdict on a stack dump: which ranks wait in a collective, and which rank is the odd one out.

In a distributed hang almost every rank sits in the same collective (``all_reduce``,
``barrier``, ...) waiting for a peer, and the culprit is the rank that is somewhere else: in its
own data loading, a deadlock, a kernel wait. :func:`place_of` decides, from every thread of a
rank, whether it waits: a thread in a collective (any thread, since DDP issues its gradient
all-reduce from autograd's threads; what is a collective is :mod:`.waits`'s one list), a main
thread in autograd's ``backward`` (where a DDP rank waits for that all-reduce), or a main
thread whose innermost frame is the program's own line calling ``.wait()`` or
``synchronize()`` (an asynchronous collective: ``Work.wait`` is native, so no Python frame of
torch's shows it). A stopped rank (``SIGSTOP``, state ``T``) never waits:
it is the one the others wait for. :func:`verdict` names the ranks that do not wait, never one
that does, or says that every rank is in the same place; :func:`group_stacks` folds identical
main-thread stacks ("x 7 ranks").

Functions of a :class:`StackDump`; the one read is a frame's source line (``linecache``,
for the program's own ``.wait()``), which a verdict on another node's dump simply lacks.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.diagnosis.stacks.lastwords import short_exception
from tui_launch.core.diagnosis.stacks.model import WCHAN, Frame, RankStack, StackDump, ThreadStack
from tui_launch.core.diagnosis.stacks.waits import wait_at
from tui_launch.core.model.text import rank_list

# Files of the collective machinery and its bindings: a frame in one is the library's, not the
# program's (which waits, and in what, is :mod:`.waits`'s list).
_DIST_FILE = re.compile(r"(^|/)(torch/distributed/|.*c10d|.*gloo|.*nccl)", re.IGNORECASE)
# Autograd's entry into the C++ engine: a DDP rank whose peers have not reached the gradient
# all-reduce waits here, on its main thread, while autograd's threads wait in the reducer.
_BACKWARD_FILE = re.compile(r"(^|/)torch/autograd/")
_BACKWARD_FUNCTION = re.compile(r"^_engine_run_backward$|^run_backward$")
# The program's own line that waits for an asynchronous collective or the GPU: ``Work.wait``,
# ``torch.cuda.synchronize`` and ``Event.synchronize`` are native, so no Python frame of
# torch's shows them and only the line itself says what the thread waits in.
_CALL = re.compile(r"[\w.\[\]]*(?:\.wait|\bsynchronize|\bbarrier)\s*\([^()]*\)")
# What a stopped process's state letter looks like (/proc/<pid>/stat: T stopped, t traced).
_STOPPED = ("T", "t")
BACKWARD = "backward (DDP's gradient all-reduce)"


@dataclass(frozen=True)
class RankPlace:
    """Where one rank is: ``top`` its innermost main-thread frame (None without a stack),
    ``collective`` the collective it waits in (None when not in one), ``place`` in words."""

    global_rank: int
    local_rank: int
    pid: int
    top: Frame | None
    collective: str | None
    place: str
    known: bool = True  # False: no stack was taken (error), so the rank cannot be judged
    stopped: bool = False  # SIGSTOPped (state T): it waits for nobody, the others wait for it


@dataclass(frozen=True)
class Verdict:
    """One line for the user (``text``), the odd ranks out, and where every rank is;
    ``collective`` the kind of the collective-level verdict the line is (empty: the stacks
    alone), ``stacks`` where the stacks overruled the records."""

    text: str
    odd: tuple[int, ...]
    places: tuple[RankPlace, ...]
    same_place: bool = False
    collective: str = ""


# Verdicts made from more than the ranks' records: a second look (``moving``), the stacks of
# ranks that went on past a collective gloo never completes (``left``), a stopped rank the
# records cannot see (``stacks``), the one rank behind whose stack does not wait where others
# behind wait in a send/recv gloo does not record (``held``), every rank in its own code past
# its last collective (``past``). ``tuilaunch why`` on the same records alone would say
# otherwise: where a run shows both, this one stands (core/remote/status.py, apps/why.py).
SEES_MORE = frozenset({"moving", "left", "stacks", "held", "past"})


@dataclass(frozen=True)
class StackGroup:
    """One distinct main-thread stack and the global ranks that share it."""

    frames: tuple[Frame, ...]
    ranks: tuple[int, ...]
    native: tuple[Frame, ...] = ()  # the C/C++ frames above them, when read


def _bare(function: str) -> str:
    # py-spy gives qualified names (Thread.run), faulthandler bare ones (run).
    return function.rsplit(".", 1)[-1]


def _is_library(frame: Frame) -> bool:
    path = frame.path or frame.file
    return bool(_DIST_FILE.search(path) or _DIST_FILE.search(frame.file)) or "torch/" in path


def collective_of(frames: Iterable[Frame]) -> str | None:
    """The collective a thread waits in, from its frames (innermost first), or None.

    Only the innermost run of library frames counts (a ``wait`` in the user's own code is not
    a collective), and only a frame of :data:`~.waits.WAITS` is a wait. Of those the outermost
    is named, since that is the call the user wrote (``all_reduce`` rather than a helper
    inside it, DDP's buffer broadcast rather than the native call under it).
    """
    found = None
    for frame in frames:
        if not _is_library(frame):
            break
        w = wait_at(frame)
        if w is not None:
            found = w.says
    return found


def _source_line(frame: Frame) -> str:
    """The text of the frame's line, when its file can be read here (local ranks)."""
    path = frame.path or frame.file
    return linecache.getline(path, frame.line).strip() if path else ""


def wait_of(thread: ThreadStack) -> str | None:
    """What ``thread`` waits in, or None: a collective (:func:`collective_of`), autograd's
    ``backward`` (:data:`BACKWARD`), or the program's own ``.wait()``/``synchronize()`` line."""
    frames = thread.frames
    if not frames:
        return None
    coll = collective_of(frames)
    if coll:
        return coll
    for frame in frames:
        if not _is_library(frame):
            break
        if _BACKWARD_FILE.search(frame.file) and _BACKWARD_FUNCTION.search(_bare(frame.function)):
            return BACKWARD
    top = frames[0]
    if not _is_library(top):
        m = _CALL.search(_source_line(top))
        if m is not None:
            # Named by the call and where it is: "work.wait() at train.py:27 in sync_point".
            return f"{m.group(0)} at {top.where}"
    return None


def place_of(rank: RankStack) -> RankPlace:
    """Where ``rank`` is, and whether it waits (any thread in a collective, the main thread in
    ``backward`` or at the program's own ``.wait()``); a stopped rank never waits."""
    proc = rank.process
    main = proc.main_thread
    if proc.method == WCHAN or (main is None and proc.wchan and proc.state == "D"):
        where = f"in D state, kernel wait {proc.wchan or '?'}"
        return RankPlace(rank.global_rank, rank.local_rank, proc.pid, None, None, where)
    stopped = proc.state in _STOPPED
    if main is None or not main.frames:
        if stopped:
            return RankPlace(
                rank.global_rank, rank.local_rank, proc.pid, None, None, "stopped", stopped=True
            )
        why = proc.error or "no Python frame"
        return RankPlace(rank.global_rank, rank.local_rank, proc.pid, None, None, why, known=False)
    top = main.frames[0]
    # The frame the user wrote: the first one outside torch.
    user = next((f for f in main.frames if not _is_library(f)), top)
    if stopped:
        where = f"stopped (state {proc.state}) at {user.where}"
        return RankPlace(
            rank.global_rank, rank.local_rank, proc.pid, top, None, where, stopped=True
        )
    coll = wait_of(main)
    if coll is None:
        # Another thread in a collective: DDP's reducer, a thread the program started.
        others = (t for t in proc.threads if t is not main)
        coll = next((c for c in (collective_of(t.frames) for t in others) if c), None)
    if coll is None:
        where = top.where
    elif " at " in coll:  # the program's own wait line already says where it is
        where = coll
    else:
        where = f"{coll} ({user.where})"
    if proc.raised:  # its last words: where it was when its collective broke
        where = f"{where}, where it raised {short_exception(proc.raised)}"
    return RankPlace(rank.global_rank, rank.local_rank, proc.pid, top, coll, where)


def _ranks(ranks: Iterable[int]) -> str:
    nums = sorted(set(ranks))
    return f"rank {nums[0]}" if len(nums) == 1 else f"ranks {rank_list(nums)}"


def _by(items: Iterable[RankPlace], key: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in items:
        out.setdefault(getattr(p, key) or "", []).append(p.global_rank)
    return out


def _waiting(in_coll: list[RankPlace]) -> str:
    """``ranks 0, 2-7 wait in all_reduce`` (several collectives: each with its ranks)."""
    ops = sorted(_by(in_coll, "collective").items(), key=lambda kv: (-len(kv[1]), kv[1]))
    first, *rest = ops
    verb = "waits" if len(first[1]) == 1 else "wait"
    text = f"{_ranks(first[1])} {verb} in {first[0]}"
    return "; ".join([text, *(f"{_ranks(r)} in {op}" for op, r in rest)])


def main_signature(rank: RankStack) -> tuple[tuple[str, str, int], ...] | None:
    """The rank's main-thread stack as comparable data (None without one)."""
    main = rank.process.main_thread
    if main is None:
        return None
    return tuple((f.function, f.file, f.line) for f in main.frames)


def verdict(dump: StackDump) -> Verdict:
    """Judge a dump: name the odd ranks out, or say that every rank is in the same place.

    With the ranks' Flight Recorder records (``dump.records``) the verdict is the collective
    one (:func:`~tui_launch.core.diagnosis.stacks.collective.collective_verdict`), the stacks
    saying where a rank out of step is; but when the records see every answering rank at one
    collective and the stacks name a rank (a stopped one cannot answer), the stacks win.
    """
    places = tuple(place_of(r) for r in dump.ranks)
    v = judge(places, dump.note)
    if not dump.records:
        return v
    where = {p.global_rank: p.place for p in places if p.known and not p.collective}
    waiting = {p.global_rank for p in places if p.collective}
    cv = collective_verdict(dump.records, where, waiting)
    if cv is None:
        return v
    if cv.kind in ("same", "past") and v.odd:
        return Verdict(
            f"{v.text} (records: {cv.text})", v.odd, places, v.same_place, collective="stacks"
        )
    same = cv.kind == "same" or (cv.kind == "past" and v.same_place)
    return Verdict(cv.text, cv.odd, places, same_place=same, collective=cv.kind)


def judge(places: tuple[RankPlace, ...], note: str | None = None) -> Verdict:
    """The verdict on ranks already placed: one node's dump, or every node's answer to a
    job-wide dump (``note``: why there are no stacks at all, said once)."""
    known = [p for p in places if p.known]
    unknown = [p for p in places if not p.known]
    missing = "; ".join(f"{_ranks(r)} ({why})" for why, r in _by(unknown, "place").items())
    tail = f"; no stack for {missing}" if unknown else ""
    if not known:
        # The note (no ptrace, no py-spy) says it once instead of once per rank.
        text = f"no stacks: {note or missing or 'no ranks'}"
        return Verdict(text=text, odd=(), places=places)
    in_coll = [p for p in known if p.collective]
    out = [p for p in known if not p.collective]
    stopped = [p for p in known if p.stopped]
    if stopped and len(stopped) < len(known):
        # A stopped rank cannot take part in anything: it is the one the others wait for,
        # wherever they are (a collective, or torch's own setup before the first one).
        where = _by(stopped, "place")
        lead = "; ".join(
            f"{_ranks(r)} {'is' if len(r) == 1 else 'are'} not in a collective: {pl}"
            for pl, r in where.items()
        )
        rest = [p for p in known if not p.stopped]
        waiting = [p for p in rest if p.collective]
        others = [p for p in rest if not p.collective]
        parts = [_waiting(waiting)] if waiting else []
        if others:
            parts.append(_where(others))
        text = "; ".join([lead, *parts])
        odd = tuple(sorted(p.global_rank for p in stopped))
        return Verdict(text=text + tail, odd=odd, places=places)
    if len(known) > 1 and len({p.place for p in known}) == 1:
        what = "a collective" if in_coll else "no collective"
        text = f"every rank is in the same place: {known[0].place} ({what})"
        return Verdict(text=text + tail, odd=(), places=places, same_place=True)
    if in_coll and out:
        where = _by(out, "place")
        if len(where) == 1:
            (place, ranks_out), *_ = where.items()
            verb = "is" if len(ranks_out) == 1 else "are"
            lead = f"{_ranks(ranks_out)} {verb} not in a collective: {place}"
        else:
            lead = f"{_ranks(p.global_rank for p in out)} are not in a collective: " + ", ".join(
                f"{_ranks(r)} at {pl}" for pl, r in where.items()
            )
        text = f"{lead}; {_waiting(in_coll)}"
        odd = tuple(sorted(p.global_rank for p in out))
        return Verdict(text=text + tail, odd=odd, places=places)
    if in_coll:
        ops = _by(in_coll, "collective")
        if len(ops) == 1 and len(in_coll) == 1:  # one rank dumped (the survivor of two)
            text = f"{_ranks([in_coll[0].global_rank])} waits in {in_coll[0].place}"
            return Verdict(text=text + tail, odd=(), places=places)
        if len(ops) == 1:
            text = f"every rank waits in {next(iter(ops))}, called from different places: "
            text += _where(in_coll)
            return Verdict(text=text + tail, odd=(), places=places)
        # Ranks in different collectives: the smaller groups are out of step with the rest.
        biggest = max(ops.values(), key=len)
        odd = tuple(sorted(r for rs in ops.values() if rs is not biggest for r in rs))
        text = "ranks are in different collectives: " + _waiting(in_coll)
        return Verdict(text=text + tail, odd=odd, places=places)
    text = "no rank is in a collective: " + _where(known)
    return Verdict(text=text + tail, odd=(), places=places)


def _where(places: list[RankPlace]) -> str:
    groups = sorted(_by(places, "place").items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return "; ".join(f"{_ranks(r)} at {pl}" for pl, r in groups)


def group_stacks(dump: StackDump) -> list[StackGroup]:
    """Distinct main-thread stacks, each with the ranks that share it, biggest group first."""
    groups: dict[tuple[object, ...], tuple[ThreadStack, list[int]]] = {}
    for r in dump.ranks:
        main = r.process.main_thread
        sig = main_signature(r)
        if main is None or sig is None:
            continue
        key = (sig, tuple(f.function for f in main.native))
        groups.setdefault(key, (main, []))[1].append(r.global_rank)
    out = [StackGroup(t.frames, tuple(sorted(rs)), t.native) for t, rs in groups.values()]
    return sorted(out, key=lambda g: (-len(g.ranks), g.ranks))
