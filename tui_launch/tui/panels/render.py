"""Pure renderers: store snapshot (+ the current time) in, rich renderables out.

The dashboard's panels call these on every new store version. Keeping them pure makes the
snapshot tests deterministic (a fake snapshot and a fixed clock) and keeps widget code thin.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tui_launch.core.model.events import Failure, NodeStatus
from tui_launch.core.model.progress import fmt_duration
from tui_launch.core.model.redact import redact_args
from tui_launch.core.model.store import Phase, RankState, Snapshot
from tui_launch.core.model.text import clock, failure_details, failure_headline, stood_still
from tui_launch.tui.panels.base import Panel, Where
from tui_launch.tui.panels.progress import (
    attempt_steps,
    goodput_text,
    hang_watch_text,
    header_progress,
)
from tui_launch.tui.panels.stacks import job_panel

PHASE_STYLE: dict[Phase, tuple[str, str]] = {
    Phase.STARTING: ("starting", "bold cyan"),
    Phase.RENDEZVOUS: ("waiting for nodes", "bold yellow"),
    Phase.RUNNING: ("running", "bold green"),
    Phase.RESTARTING: ("restarting", "bold magenta"),
    Phase.FINISHING: ("finishing", "bold green"),
    Phase.STOPPING: ("stopping", "bold yellow"),
    Phase.SUCCEEDED: ("succeeded", "bold green"),
    Phase.FAILED: ("failed", "bold red"),
    Phase.STOPPED: ("stopped", "bold yellow"),
    Phase.PREEMPTED: ("preempted", "bold yellow"),
    Phase.ERROR: ("error", "bold red"),
}

STATE_STYLE: dict[RankState, str] = {
    RankState.STARTING: "cyan",
    RankState.RUNNING: "green",
    RankState.STOPPED: "bold yellow",
    RankState.EXITED: "dim",
    RankState.FAILED: "bold red",
    RankState.RESTARTING: "magenta",
}


def phase_label(s: Snapshot) -> tuple[str, str]:
    """The overall state in words and its style."""
    return PHASE_STYLE.get(s.phase, (s.phase, "bold"))


def header(s: Snapshot, now: float) -> Text:
    """State, elapsed time and exit code first (a narrow terminal cuts the end), then the
    error of a run that failed before its workers, or the job: command, run id, endpoint."""
    label, style = phase_label(s)
    preempted = s.preempted if s.finished is None else None
    if preempted is not None:
        label, style = "preempted", "bold yellow"
    run = s.run
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {label.upper()} ", style=f"reverse {style}")
    if preempted is not None:
        # The scheduler is taking the node back: how long the workers have left to save.
        left = max(0.0, preempted.mono + preempted.grace - now)
        t.append(f" {left:.0f}s grace left", style=style)
    start = s.launched_mono if s.launched_mono is not None else s.started_mono
    elapsed = (s.finished.mono if s.finished else now) - (start if start is not None else now)
    t.append(f"  {clock(elapsed)}")
    t.append_text(header_progress(s))
    t.append_text(hang_watch_text(s))
    if s.finished is not None:
        t.append(f"  exit code {s.finished.exit_code}", style=style)
    if s.finished is not None and s.finished.outcome == "error":
        t.append(f"  {s.finished.message}", style="red")
        return t
    if run is None:
        c = s.connecting
        if c is None:
            t.append("  starting torch's elastic agent...")
        else:
            t.append(f"  contacting the {c.backend} rendezvous store at {c.endpoint}...")
        return t
    script = " ".join(redact_args((run.entrypoint, *run.args)))  # an older journal's too
    t.append("  ")
    t.append(script, style="bold")
    t.append(f"   run {run.run_id}", style="dim")
    if run.slurm_job:
        t.append(f"   slurm job {run.slurm_job}", style="dim")
    t.append(f"   {run.backend} {run.endpoint}", style="dim")
    return t


def _connecting_rows(t: Table, s: Snapshot, now: float) -> None:
    """Before torch's agent exists: the store being contacted, the time against its timeout,
    the retries; or why it failed."""
    c = s.connecting
    if c is None:
        t.add_row("state", "starting")
        return
    t.add_row("store", c.endpoint)
    t.add_row("backend", c.backend)
    nodes = str(c.min_nodes) if c.min_nodes == c.max_nodes else f"{c.min_nodes}:{c.max_nodes}"
    t.add_row("nodes", nodes)
    fin = s.finished
    if fin is not None:
        t.add_row("state", Text("failed" if fin.outcome == "error" else fin.outcome, style="red"))
        if fin.outcome == "error":
            t.add_row("why", Text("no answer (c: root cause)", style="red"))
    else:
        t.add_row("state", Text("no answer yet", style="yellow"))
        of = f" ({c.timeout:g}s a try)" if c.timeout else ""
        t.add_row("waited", f"{clock(now - c.mono)}{of}")
    if s.store_retries:
        t.add_row("retries", f"{s.store_retries} (o: agent log)")


def rendezvous_panel(s: Snapshot, now: float) -> RenderableType:
    """Backend, endpoint, round, state, nodes and their heartbeats, master address."""
    rv = s.rendezvous
    run = s.run
    live = s.rendezvous_live
    t = Table.grid(padding=(0, 1))
    t.add_column(style="dim", no_wrap=True)
    t.add_column()
    if run is None:
        _connecting_rows(t, s, now)
        return t
    t.add_row("backend", f"{run.backend}  {run.endpoint}")
    t.add_row("run id", run.run_id)
    if run.slurm_job:
        t.add_row("slurm job", run.slurm_job)
    nodes = (
        str(run.min_nodes) if run.min_nodes == run.max_nodes else f"{run.min_nodes}:{run.max_nodes}"
    )
    t.add_row("nodes", nodes)
    if rv is None:
        t.add_row("state", "not started")
        return t
    state_style = {"waiting": "yellow", "complete": "green", "closed": "dim"}.get(rv.state, "")
    t.add_row(
        "state",
        Text(
            rv.state + (f" (round {rv.round})" if rv.round is not None else ""), style=state_style
        ),
    )
    # While this node joins a new round, the cached state still describes the last one until
    # the agent syncs: show its members only once it is a round in progress.
    if live is not None and rv.state == "waiting" and live.complete:
        live = None
    if rv.state == "waiting":
        joined = len(live.participants) if live else 0
        need = live.min_nodes if live and live.min_nodes else run.min_nodes
        t.add_row("joined", f"{joined} of min {need}")
        timeout = (
            live.join_timeout
            if live
            else s.rendezvous_live.join_timeout
            if s.rendezvous_live
            else None
        )
        if timeout is not None:
            left = rv.since + timeout - now
            t.add_row("deadline", f"{clock(left)} left")
    if rv.group_rank is not None:
        t.add_row("this node", f"group rank {rv.group_rank} of {rv.group_world_size}")
    if rv.master_addr:
        t.add_row("master", f"{rv.master_addr}:{rv.master_port}")
    if live and not live.complete and live.deadline is not None and s.started_wall is not None:
        # The last call: once MIN nodes are in, torch waits this long for more.
        wall_now = s.started_wall + (now - (s.started_mono or now))
        t.add_row("last call", f"{clock(live.deadline - wall_now)} left")
    if live and live.participants:
        # The cluster view knows what the rendezvous does not: each node's local world size.
        local = {n.node: n.local_world_size for n in s.cluster.nodes} if s.cluster else {}
        for p in live.participants:
            mark = "*" if p.this_node else " "
            age = p.heartbeat_age
            hb = (
                ""
                if age is None
                else ("hb <5s" if age < 5 else f"hb {fmt_duration(age, floor=True)}")
            )
            if s.finished is not None:
                hb = ""  # the last heartbeat seen is not a live one once the job is over
            lw = f"x{local[p.node]}" if p.node in local else ""
            t.add_row(f"{mark}node {p.rank}", " ".join(x for x in (p.node, lw, hb) if x))
    elif rv.participants:
        for i, name in enumerate(rv.participants):
            t.add_row(f" node {i}", name)
    if live and live.waiting:
        t.add_row("waiting", ", ".join(live.waiting))
    return t


def restarts_panel(s: Snapshot, now: float) -> RenderableType:
    """Restart counters and the attempt timeline."""
    head = Table.grid(padding=(0, 1))
    head.add_column(style="dim", no_wrap=True)  # "budget left" on one line, even at 80x24
    head.add_column()
    head.add_row("on failure", f"{s.failure_restarts} / {s.max_restarts}")
    head.add_row("budget left", str(s.budget_left))
    head.add_row("manual", str(s.manual_restarts))
    head.add_row("membership", str(s.membership_restarts))
    timeline = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    steps = s.progress is not None
    # With progress, the steps (resumed from -> reached) take the start offset's place.
    cols = ("#", "took", "world", "steps") if steps else ("#", "start", "took", "world")
    for col in (*cols, "ended by"):
        timeline.add_column(col, no_wrap=True)
    t0 = s.started_wall or 0.0
    for a in s.attempts[-8:]:
        # The running attempt's duration would change every second: the header has the clock.
        took = f"{a.ended - a.started:.1f}s" if a.ended is not None else "-"
        reason = a.end_reason or "running"
        style = {
            "failure": "red",
            "failed": "red",
            "manual": "cyan",
            "membership": "magenta",
            "succeeded": "green",
            "running": "green",
        }.get(reason, "")
        cells = (
            (took, str(a.world_size), attempt_steps(s, a.number))
            if steps
            else (f"+{clock(a.started - t0)}", took, str(a.world_size))
        )
        timeline.add_row(str(a.number), *cells, Text(reason, style=style))
    # Nodes that joined or left, under the attempts they started (multi-node runs only).
    changes = Text(style="magenta")
    for c in s.node_changes[-4:]:
        who = [f"+{n}" for n in c.joined] + [f"-{n}" for n in c.left]
        changes.append(f"#{c.attempt} {c.group_world_size} nodes: {' '.join(who) or 'same'}\n")
    changes.rstrip()
    good = goodput_text(s)
    extra = (*((changes,) if changes else ()), *((Text(""), good) if good is not None else ()))
    return Group(head, Text(""), timeline, *extra)


def root_cause_panel(s: Snapshot) -> RenderableType:
    """The latest failure in full, then one line for each earlier one."""
    rc = s.root_cause
    fin = s.finished
    if rc is None and fin is not None and fin.outcome == "error":
        # The run ended before (or outside) any worker: torch's agent said why.
        out = Text()
        out.append("the run failed before its workers started\n", style="bold red")
        out.append(fin.message + "\n", style="red")
        out.append("\ntorch's own messages are in the agent log (key o)", style="dim")
        return out
    if rc is None and s.hang is not None:
        h = s.hang
        out = Text()
        out.append("hang", style="bold red")
        out.append(f"  (attempt {h.attempt}; --on-hang {h.action})\n", style="dim")
        out.append(f"{stood_still(h)}; {h.confirmation}\n")
        out.append(f"{h.verdict}\n", style="yellow")
        out.append(f"stacks: {h.second_path}\n", style="dim")
        if s.hang_cleared is not None:
            c = s.hang_cleared
            out.append(f"over: the ranks move again ({c.detail or c.why})\n", style="green")
        return out
    if rc is None:
        return Text("No failure so far.", style="dim")
    # One Text, not a Group: Textual keeps a Text's leading spaces (traceback indentation).
    out = Text()
    out.append("root cause", style="bold red")
    out.append(f"  (attempt {rc.attempt})\n", style="dim")
    out.append_text(_failure_text(rc))
    earlier = [f for f in s.failures if not f.collateral and f is not rc]
    if earlier:
        out.append("\nother failures\n", style="bold")
        for f in earlier:
            out.append(f"  attempt {f.attempt}: {failure_headline(f)}\n")
    return out


def _failure_text(f: Failure) -> Text:
    t = Text()
    for line in failure_details(f):
        style = ""
        if line.startswith(("exit", "hint")):
            style = "red" if line.startswith("exit") else "yellow"
        t.append(line + "\n", style=style)
    return t


CLUSTER_ROWS = 64
_NODE_STYLE = {
    "running": "green",
    "failed": "bold red",
    "error": "bold red",
    "restarting": "yellow",
    "rendezvous": "yellow",
    "stopped": "yellow",
    "preempted": "yellow",
    "succeeded": "green",
}


def cluster_panel(s: Snapshot, now: float) -> RenderableType:
    """Every node of the job as its agent last published it: one row per node.

    Nodes that need attention (lost, failed, restarting) come first; past ``CLUSTER_ROWS``
    rows the healthy rest is counted, not listed, so a 1,000-node job stays one screen of
    problems plus a count (docs/SCALING.md).
    """
    c = s.cluster
    if c is None:
        empty = Text("no cluster view yet: it starts after the first rendezvous", style="dim")
        job = job_panel(s, now, frames=0)  # a replayed journal keeps job-wide dumps, not samples
        return empty if job is None else Group(empty, Text(""), job)
    stale_after = 10.0
    t = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    t.add_column("node", no_wrap=True, min_width=12)
    t.add_column("rank", no_wrap=True, min_width=4)
    t.add_column("state", no_wrap=True, min_width=10)
    t.add_column("att", no_wrap=True, min_width=3)
    t.add_column("ranks", no_wrap=True, min_width=14)
    t.add_column("f/m/n", no_wrap=True, min_width=5)  # restarts: failure, manual, membership
    t.add_column("gpu", no_wrap=True, overflow="ellipsis", max_width=24)
    t.add_column("seen", no_wrap=True, min_width=4)
    t.add_column("error", overflow="ellipsis", no_wrap=True, max_width=48)

    def lost(n: NodeStatus) -> bool:
        return n.age is not None and n.age > stale_after

    def attention(n: NodeStatus) -> int:
        return 0 if lost(n) else 1 if n.state not in ("running", "succeeded") else 2

    nodes = sorted(c.nodes, key=lambda n: (attention(n), n.group_rank or 0, n.node))
    for n in nodes[:CLUSTER_ROWS]:
        states: dict[str, int] = {}
        for _g, _lr, _pid, st in n.ranks:
            states[st] = states.get(st, 0) + 1
        ranks = " ".join(f"{k} {v}" for k, v in sorted(states.items())) or "-"
        if n.ranks:
            lo, hi = min(r[0] for r in n.ranks), max(r[0] for r in n.ranks)
            ranks = f"{lo}-{hi}: {ranks}" if lo != hi else f"{lo}: {ranks}"
        f, m, mb = (*n.restarts, 0, 0, 0)[:3]
        state = Text("lost" if lost(n) else n.state, style="bold red" if lost(n) else "")
        if not lost(n):
            state.stylize(_NODE_STYLE.get(n.state, ""))
        name = n.node if n.node.startswith(n.host) else f"{n.node} ({n.host})"
        t.add_row(
            ("* " if n.this_node else "  ") + name,
            "-" if n.group_rank is None else f"{n.group_rank}/{n.group_world_size}",
            state,
            str(n.attempt),
            ranks,
            f"{f}/{m}/{mb}",
            n.gpu or "-",
            "now" if not n.age else fmt_duration(n.age, floor=True),
            Text(n.error or "", style="red"),
        )
    more = len(nodes) - CLUSTER_ROWS
    head = Text(f"{len(nodes)} node(s)", style="bold")
    if c.store:
        head.append(f" - via {c.store}", style="dim")
    if c.error:
        head.append(f" - store unreachable: {c.error}", style="red")
    parts: list[RenderableType] = [head, t]
    if more > 0:
        parts.append(Text(f"... and {more} more healthy node(s)", style="dim"))
    job = job_panel(s, now, frames=0)
    if job is not None:  # where every rank of the job is (d, dump_stacks, a hang)
        parts += [Text(""), job]
    return Group(*parts)


def steps_key(snap: Snapshot, second: int) -> tuple[object, ...] | None:
    """What the Restarts panel shows of progress: the steps each attempt reached and resumed
    from. The running attempt's step moves every second, and measuring and repainting the
    panel that often was a fifth of the dashboard's CPU: it is redrawn every 10 s (the table
    and the header show the live step), and exactly once the attempt or the run ends."""
    if snap.progress is None:
        return None
    *ended, live = snap.progress.attempts or (None,)
    steps = tuple((a.attempt, a.first_step, a.steps_reached) for a in ended if a is not None)
    if live is None:
        return steps
    moving = live.steps_reached if snap.finished is not None else second // 10
    return (*steps, (live.attempt, live.first_step, moving))


def waiting(snap: Snapshot) -> bool:
    """Whether the run waits to join (the Rendezvous panel's deadline counts every second)."""
    if snap.finished is not None:
        return False
    if snap.run is None and snap.connecting is not None:
        return True
    return snap.rendezvous is not None and snap.rendezvous.state == "waiting"


# The panels these renderers draw (listed in order by tui/panels/board.py). Each key is what the
# panel shows: a Textual refresh costs far more than comparing a few fields.

HEADER = Panel(
    "header",
    Where.HEADER,
    key=lambda f: (f.snap.phase, f.snap.run, f.snap.connecting, f.snap.finished, f.second),
    render=lambda f: header(f.snap, f.now),
)

RENDEZVOUS = Panel(
    "rendezvous",
    Where.SIDE,
    "Rendezvous",
    key=lambda f: (
        f.snap.run,
        f.snap.rendezvous,
        f.snap.rendezvous_live,
        f.snap.connecting,
        f.snap.store_retries,
        f.snap.finished,
        f.second if waiting(f.snap) else 0,  # a deadline counts down while it waits
    ),
    render=lambda f: rendezvous_panel(f.snap, f.now),
)

RESTARTS = Panel(
    "restarts",
    Where.SIDE,
    "Restarts",
    key=lambda f: (
        f.snap.attempts,
        f.snap.budget_left,
        f.snap.restarts_used,
        f.snap.finished,
        steps_key(f.snap, f.second),
    ),
    render=lambda f: restarts_panel(f.snap, f.now),
)

ROOT_CAUSE = Panel(
    "rootcause",
    Where.TAB,
    "Root cause",
    tab="cause-tab",
    key=lambda f: (
        f.snap.root_cause,
        len(f.snap.failures),
        f.snap.hang,
        f.snap.hang_cleared,
        f.snap.finished,
    ),
    render=lambda f: root_cause_panel(f.snap),
)

CLUSTER = Panel(
    "cluster",
    Where.TAB,
    "Cluster",
    tab="cluster-tab",
    while_shown=True,  # every node's row
    key=lambda f: (f.snap.cluster, f.snap.job_stacks[-1:]),
    render=lambda f: cluster_panel(f.snap, f.now),
)
