"""The Stacks tab's content: the latest stack dump, grouped, with the odd ranks highlighted.

A pure renderer like :mod:`tui_launch.tui.panels.render`: the snapshot's dumps (the
:class:`~tui_launch.core.model.events.StacksDumped` events), the latest dump itself and the clock
in, one rich ``Text`` out. The verdict on the run's Flight Recorder dumps (NCCL's
dump-on-timeout files, judged by ``tuilaunch why``'s judge as they appear: the latest
:class:`~tui_launch.core.model.events.FlightRecorderVerdict`) comes first, its one line then
each process group that waits (:func:`fr_panel`). Identical main-thread stacks are folded
into one block ("x 7 ranks"); the ranks the verdict names as the odd ones out come first, in
yellow; older dumps of the run are listed at the bottom with their verdicts and where their
files are. In a job of several nodes, :func:`job_panel` adds where every rank of the job is
(the latest :class:`~tui_launch.core.model.events.JobStacks`); the Cluster tab shows the same
block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from tui_launch.core.model.events import FlightRecorderVerdict, FrGroup, JobStacks, StacksDumped
from tui_launch.core.model.layout import job_files
from tui_launch.core.model.store import Snapshot
from tui_launch.core.model.text import clock, fr_source
from tui_launch.tui.panels.base import Frame, Panel, Where
from tui_launch.tui.panels.progress import hang_watch_text

if TYPE_CHECKING:
    from tui_launch.core.diagnosis.stacks import StackDump

# The stack modules (core.stacks, core.jobstacks: ~0.1 s of imports) are imported by the
# panels that show a dump, when there is one: an attach or a replay waits for its first frame
# while the dashboard's modules load.

OLDER_LISTED = 10
FRAMES_SHOWN = 12
JOB_PLACES_SHOWN = 20  # places of a job-wide dump listed (a 1,000-node job: the odd first)
JOB_FRAMES_SHOWN = 4
FR_GROUPS_SHOWN = 8  # process groups of a Flight Recorder verdict listed, those that name a rank


def job_panel(s: Snapshot, now: float, frames: int = JOB_FRAMES_SHOWN) -> Text | None:
    """Where every rank of the job is, from the latest job-wide dump (None: none yet).

    Each place once with its ranks and nodes, the odd ones out first in yellow; nodes that did
    not answer in red. ``frames``: innermost frames shown per place (0: the place only)."""
    if not s.job_stacks:
        return None
    e: JobStacks = s.job_stacks[-1]
    out = Text()
    out.append("stacks of the job", style="bold")
    out.append(
        f"  ({e.reason}, asked by {e.requested_by}; {max(0, int(now - e.mono))}s ago): "
        f"{len(e.ranks)} ranks on {len(e.nodes)} node(s)\n",
        style="dim",
    )
    out.append(e.verdict + "\n", style="bold yellow" if e.odd_ranks or e.missing else "bold")
    from tui_launch.core.diagnosis.stacks import rank_list
    from tui_launch.core.job.jobstacks import place_groups

    groups = place_groups(e)
    for g in groups[:JOB_PLACES_SHOWN]:
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {rank_list(g.ranks)}"
        out.append(f"  {who}", style="bold yellow" if g.odd else "bold")
        if len(g.ranks) > 1:
            out.append(f"  \u00d7 {len(g.ranks)} ranks", style="cyan")
        nodes = ", ".join(g.nodes[:3]) + (f" +{len(g.nodes) - 3}" if len(g.nodes) > 3 else "")
        out.append(f" on {nodes}: ", style="dim")
        out.append(g.place + "\n", style="yellow" if g.odd else "")
        for f in g.frames[:frames]:
            out.append(f"      {f}\n", style="yellow" if g.odd else "dim")
    if len(groups) > JOB_PLACES_SHOWN:
        out.append(f"  ... {len(groups) - JOB_PLACES_SHOWN} more places (job.txt)\n", style="dim")
    for n in e.nodes:
        if n.error:
            out.append(f"  {n.node}: {n.error}\n", style="dim")
    for m in e.missing:
        out.append(f"  {m}: no answer\n", style="red")
    if e.path:
        out.append(job_files(e.path)[1] + "\n", style="dim")
    return out


def fr_panel(s: Snapshot, now: float) -> Text | None:
    """The verdict on the run's Flight Recorder dumps (None: none judged yet): the line a
    person reads first, in yellow when it names a rank, then each process group that waits."""
    e: FlightRecorderVerdict | None = s.flight_recorder
    if e is None:
        return None
    out = Text()
    out.append("flight recorder", style="bold")
    out.append(
        f"  ({fr_source(e)}, attempt {e.attempt}; {max(0, int(now - e.mono))}s ago)\n",
        style="dim",
    )
    out.append(e.verdict + "\n", style="bold yellow" if e.culprits else "bold")
    if e.groups_waiting:
        out.append(f"{e.groups_waiting} of {e.groups_total} process groups wait:\n", style="dim")
    _groups(out, e.groups, e.groups_waiting)
    if e.path:
        out.append(f"{e.path}*\n", style="dim")
    return out


def _groups(out: Text, groups: tuple[FrGroup, ...], waiting: int) -> None:
    """Each process group that names a rank, then how many more wait (of ``waiting``):
    groups where every member waits in one collective name no rank, so they are counted, not
    listed (one is listed when no group names a rank)."""
    named = [g for g in groups if g.kind != "same"]
    shown = named[:FR_GROUPS_SHOWN] or list(groups[:1])
    for g in shown:
        style = "yellow" if g.kind != "same" else ""
        out.append(f"  {g.label}", style=f"bold {style}".strip())
        out.append(f" (ranks {g.ranks}): ", style="dim")
        out.append(g.text + "\n", style=style)
    rest = waiting - len(shown)
    if rest:
        same = sum(1 for g in groups if g.kind == "same" and g not in shown)
        why = f", {same} with no member out of step" if same else ""
        out.append(f"  ... {rest} more groups wait{why} (tuilaunch why)\n", style="dim")


def _when(s: Snapshot, e: StacksDumped, now: float) -> str:
    into = clock(e.mono - s.started_mono) if s.started_mono is not None else "-"
    return f"{into} into the run, {max(0, int(now - e.mono))}s ago"


def stacks_panel(s: Snapshot, dump: StackDump | None, now: float) -> Text:
    """The latest dump (``dump`` is its content, None if unreadable) and the older ones."""
    out = Text()
    fr = fr_panel(s, now)
    if fr is not None:  # the dumps' verdict first: it names the rank the others wait on
        out.append_text(fr)
        out.append("\n")
    rule = hang_watch_text(s, full=True)
    if rule:
        out.append_text(rule)
        out.append("\n")
    if not s.dumps:
        job = job_panel(s, now)
        if job is not None:  # asked by another node while no rank of this one ran
            if fr is not None:
                out.append_text(job)
                return out
            return job
        out.append("No stack dump yet.", style="dim")
        out.append(
            "\nd dumps every rank of this node now; tuilaunch also dumps when a rank fails "
            "(the others, before they are terminated) and when the job stands still for "
            "longer than its steps allow (--hang-timeout; docs/hangs.md).",
            style="dim",
        )
        return out
    from tui_launch.core.diagnosis.stacks import group_stacks, rank_list
    from tui_launch.core.diagnosis.stacks.model import native_summary

    e = s.dumps[-1]
    job = job_panel(s, now)
    if job is not None:
        out.append_text(job)
        out.append("\n")
    out.append(f"stacks ({e.reason})", style="bold")
    out.append(
        f"  {_when(s, e, now)}; attempt {e.attempt}, ranks {rank_list(e.ranks)}, "
        f"{e.method} in {e.duration:.2f}s\n",
        style="dim",
    )
    out.append(e.verdict + "\n", style="bold yellow" if e.odd_ranks else "bold")
    if e.note:
        out.append(e.note + "\n", style="yellow")
    if s.hang is not None and s.hang.second_path == e.path:
        out.append(f"HANG: {s.hang.confirmation}\n", style="bold red")
    out.append(f"{e.path}\n", style="dim")
    cv = s.collective_verdict
    if cv is not None and cv.path == e.path:
        # The Flight Recorder (by default): each rank's newest collective, from its Flight Recorder.
        odd_c = set(cv.odd_ranks)
        out.append("last collective: ", style="bold")
        for i, rc in enumerate(cv.ranks):
            what = f"{rc.op} #{rc.seq}" if rc.seq >= 0 else (rc.error or "no record")
            sep = "; " if i else ""
            style = "yellow" if rc.global_rank in odd_c else ""
            out.append(f"{sep}rank {rc.global_rank} {what}", style=style)
        out.append("\n")
        _groups(out, cv.groups, len(cv.groups))
    if dump is not None:
        odd = set(e.odd_ranks)
        groups = group_stacks(dump)
        # The odd ones out first: they are why the others wait.
        groups.sort(key=lambda g: (not (set(g.ranks) & odd), -len(g.ranks), g.ranks))
        for g in groups:
            n = len(g.ranks)
            who = f"rank {g.ranks[0]}" if n == 1 else f"ranks {rank_list(g.ranks)}"
            is_odd = bool(set(g.ranks) & odd)
            out.append("\n")
            out.append(who, style="bold yellow" if is_odd else "bold")
            if n > 1:
                out.append(f"  \u00d7 {n} ranks", style="cyan")
            if is_odd:
                out.append("  <- odd one out", style="yellow")
            out.append("\n")
            if g.native:  # read when the hang was confirmed: what the C++ below waits in
                out.append(f"    in C/C++: {native_summary(g.native)}\n", style="dim")
            for f in g.frames[:FRAMES_SHOWN]:
                out.append(f"    {f.where}\n", style="yellow" if is_odd else "")
            if len(g.frames) > FRAMES_SHOWN:
                out.append(f"    ... {len(g.frames) - FRAMES_SHOWN} more frames\n", style="dim")
        missing = [r.global_rank for r in dump.ranks if r.process.main_thread is None]
        if missing:
            out.append(f"\nno stack for ranks {rank_list(missing)}: ", style="red")
            out.append("; ".join(p for p in e.places if p.split(":")[0][5:] in map(str, missing)))
            out.append("\n")
    elif e.places:
        out.append("\n" + "\n".join(e.places) + "\n")
    older = s.dumps[-1 - OLDER_LISTED : -1]
    if older:
        out.append("\nearlier dumps\n", style="bold")
        for o in reversed(older):
            out.append(f"  {_when(s, o, now)} ({o.reason}): ", style="dim")
            out.append(f"{o.verdict}\n")
            out.append(f"    {o.path}\n", style="dim")
    return out


def _stacks_tab(f: Frame) -> Text:
    latest = f.snap.dumps[-1] if f.snap.dumps else None
    dump = f.stack_dump(latest.path) if latest is not None else None
    return stacks_panel(f.snap, dump, f.now)


STACKS = Panel(
    "stacks",
    Where.TAB,
    "Stacks",
    tab="stacks-tab",
    while_shown=True,  # the dump is read (a replay: from its file) only to be shown
    key=lambda f: (
        len(f.snap.dumps),
        len(f.snap.job_stacks),
        f.snap.hang,
        f.snap.flight_recorder,
        f.snap.collective_verdict,
        int(f.now),
    ),
    render=_stacks_tab,
)
