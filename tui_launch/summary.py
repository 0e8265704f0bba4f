"""The end-of-run summary both front ends print (rich, imported only when it is printed).

A clean success gets a few lines; anything that happened (a failure, a restart, an injection,
a control action, a hang) or ``--verbose`` gets the tables: ranks, resources, attempts,
failures, goodput. Also the run's duration and the injection lines the headless output uses.
"""

from __future__ import annotations

import io
import time
from typing import Any, TextIO

from tui_launch.core.model import errors, failclass
from tui_launch.core.model.events import Event, Failure, Injected
from tui_launch.core.model.store import Snapshot, recovered
from tui_launch.core.model.text import failure_details, failure_headline, stood_still
from tui_launch.core.run.handle import RunHandle


def print_summary(
    s: Snapshot, runner: RunHandle | None, stream: TextIO, verbose: bool = False
) -> None:
    """Print the end-of-run summary.

    A clean success (no failure, restart, injection or control action) gets a few lines:
    state, duration, restarts, where the logs are. Anything that happened, or ``verbose``
    (``--verbose``), gets the full tables: ranks, resources, attempts and the failures.
    """
    # rich is imported here, not at start-up: launch time is measured against torchrun's.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    tty = isatty(stream)
    console = Console(
        file=stream,
        width=None if tty else 120,
        force_terminal=tty,
        highlight=False,
        no_color=not tty,
    )
    fin = s.finished
    outcome = fin.outcome if fin else s.phase
    code = fin.exit_code if fin else None
    style = {
        "succeeded": "bold green",
        "failed": "bold red",
        "stopped": "bold yellow",
        "preempted": "bold yellow",
    }.get(outcome, "bold red")
    title = Text.assemble(
        ("tuilaunch summary: ", "bold"),
        (outcome.upper(), style),
        f"  exit code {code}  duration {run_duration(s):.1f}s",
    )
    console.print()
    console.print(title)
    if fin and fin.outcome == "error":
        console.print(Text(f"error: {fin.message}", style="red"), soft_wrap=True)
    if fin and fin.meaning and fin.exit_code != 0:
        what = f"; {failclass.describe(fin.failure_class, '')}" if fin.failure_class else ""
        console.print(f"exit code {fin.exit_code}: {fin.meaning}{what}")
    if fin and fin.failure_class == failclass.TEARDOWN:
        console.print(Text(fin.message, style="yellow"), soft_wrap=True)
    for d in s.decisions:
        saved = f"; saved {d.saved} restart(s)" if d.saved else ""
        console.print(
            f"restart policy: {d.action} after attempt {d.attempt} "
            f"({failclass.describe(d.failure_class, '')}): {d.reason}{saved}",
            soft_wrap=True,
        )
    if s.preempted is not None:
        sv = s.saved
        took = f"; workers took {sv.seconds:.1f}s to save" if sv is not None else ""
        late = " (not all in time: SIGKILLed)" if sv is not None and not sv.in_time else ""
        console.print(f"preempted by {s.preempted.signal}{took}{late}")
    injected = injection_lines(runner.store.events()) if runner is not None else []
    # The launcher's own trouble (a full disk under the journal): said whatever the outcome.
    for n in s.notices:
        if n.level == "error":
            console.print(Text(f"error: {n.message}", style="red"), soft_wrap=True)
    eventful = (
        outcome != "succeeded"
        or s.failures
        or s.restarts_used
        or s.controls
        or injected
        or s.dumps
        or s.hang is not None
        or s.decisions
    )
    if not (eventful or verbose):
        ranks = len(s.ranks)
        nodes = s.rendezvous.group_world_size if s.rendezvous else None
        where = f" on {nodes} nodes" if nodes and nodes > 1 else ""
        console.print(f"{ranks} rank(s){where} exited 0; no failures, no restarts")
        _print_goodput(s, console)  # how far it got (only when the ranks printed steps)
        _print_paths(runner, console, s)
        return

    if s.ranks:
        table = Table(title=f"ranks (attempt {s.attempt})", title_justify="left", expand=False)
        for col in ("rank", "local", "pid", "state", "exit", "uptime"):
            table.add_column(col, justify="right" if col != "state" else "left")
        for r in s.ranks:
            end = r.exited if r.exited is not None else (fin.mono if fin else time.monotonic())
            table.add_row(
                str(r.global_rank),
                str(r.local_rank),
                str(r.pid),
                r.state,
                errors.describe_exit(r.exit_code) if r.exit_code is not None else "-",
                f"{max(0.0, end - r.started):.1f}s",
            )
        console.print(table)

    _print_resources(s, console)
    _print_goodput(s, console)

    if s.attempts:
        t = Table(title="attempts", title_justify="left")
        for col in ("attempt", "world size", "duration", "ended by"):
            t.add_column(col)
        for a in s.attempts:
            dur = f"{a.ended - a.started:.1f}s" if a.ended is not None else "-"
            t.add_row(str(a.number), str(a.world_size), dur, a.end_reason or "-")
        console.print(t)
    console.print(
        f"restarts: {s.failure_restarts}/{s.max_restarts} on failure, "
        f"{s.manual_restarts} manual, {s.membership_restarts} membership"
    )

    for line in injected:
        console.print(line, soft_wrap=True)

    if s.hang is not None:
        h = s.hang
        console.print(Text("hang", style="bold red"))
        console.print(
            Text(
                f"  attempt {h.attempt}: {stood_still(h)}; {h.confirmation}\n"
                f"  verdict: {h.verdict}\n  stacks: {h.second_path}"
            ),
            soft_wrap=True,
        )
    rc = s.root_cause
    if outcome in ("stopped", "preempted") and recovered(s, rc):
        # A failure a restart recovered did not end this run (it was stopped later): it is
        # listed with the other recovered failures below, never as the root cause.
        rc = None
    if rc is not None and outcome != "succeeded":
        console.print(Text("root cause", style="bold red"))
        console.print(Text("\n".join("  " + ln for ln in failure_details(rc))), soft_wrap=True)
    shown = rc if outcome != "succeeded" else None
    others = [f for f in s.failures if not f.collateral and f is not shown]
    for heading, group in _failure_groups(others, shown):
        console.print(Text(heading, style="bold"))
        for f in group:
            console.print(Text(f"  attempt {f.attempt}: {failure_headline(f)}"), soft_wrap=True)
    _print_paths(runner, console, s)


def _failure_groups(
    others: list[Failure], shown: Failure | None
) -> list[tuple[str, list[Failure]]]:
    """The failures besides the root cause, under headings that say which attempt they are."""
    if shown is None:
        return [("failures (recovered by restarts)", others)] if others else []
    same = [f for f in others if f.attempt == shown.attempt]
    earlier = [f for f in others if f.attempt != shown.attempt]
    groups = []
    if same:
        groups.append((f"other failures of attempt {shown.attempt}", same))
    if earlier:
        groups.append(("failures of earlier attempts", earlier))
    return groups


def _print_paths(runner: RunHandle | None, console: Any, s: Snapshot) -> None:
    if runner is not None:
        if runner.run_dir:
            console.print(f"logs: {runner.run_dir}", soft_wrap=True)
        if runner.journal_path:
            console.print(f"journal: {runner.journal_path}", soft_wrap=True)
    if s.dumps:
        last = s.dumps[-1]
        console.print(f"stacks: {len(s.dumps)} dump(s); latest: {last.path}", soft_wrap=True)
    if s.job_stacks:
        job = s.job_stacks[-1]
        console.print(
            f"stacks of the job: {len(job.ranks)} ranks on {len(job.nodes)} node(s): {job.verdict}",
            soft_wrap=True,
        )


def run_duration(s: Snapshot, now: float | None = None) -> float:
    """Seconds from the launch to the end (or to ``now`` while the run goes on)."""
    start = s.launched_mono if s.launched_mono is not None else s.started_mono
    if start is None:
        return 0.0
    end = s.finished.mono if s.finished else (time.monotonic() if now is None else now)
    return max(0.0, end - start)


def _print_resources(s: Snapshot, console: object) -> None:
    """Per rank and attempt: peak RSS, mean CPU, peak GPU memory, mean GPU utilisation."""
    from rich.table import Table

    from tui_launch.core.model.text import fmt_bytes

    tel = s.telemetry
    if tel is None or not tel.totals:
        return
    t = Table(title="resources (telemetry)", title_justify="left", expand=False)
    for col in ("attempt", "rank", "local", "peak RSS", "mean CPU %", "peak GPU mem", "mean GPU %"):
        t.add_column(col, justify="right")
    for r in tel.totals:
        mark = "~" if r.mapping == "inferred" else ""
        cpu, util = r.mean_cpu, r.mean_gpu_util
        t.add_row(
            str(r.attempt),
            str(r.global_rank),
            str(r.local_rank),
            fmt_bytes(r.peak_rss),
            f"{cpu:.0f}" if cpu is not None else "-",
            mark + fmt_bytes(r.peak_gpu_mem) if r.peak_gpu_mem is not None else "-",
            f"{mark}{util:.0f}" if util is not None else "-",
        )
    console.print(t)  # type: ignore[attr-defined]
    notes = [f"GPUs: {tel.latest.gpu_note}"]
    if any(r.mapping == "inferred" for r in tel.totals):
        notes.append("~ inferred from LOCAL_RANK/CUDA_VISIBLE_DEVICES (whole-GPU figures)")
    console.print("; ".join(notes), soft_wrap=True)  # type: ignore[attr-defined]


def _print_goodput(s: Snapshot, console: object) -> None:
    """Per attempt: steps reached, resumed from, work redone, time to first step; the share
    of wall time the job made progress (from the workers' own progress lines)."""
    from tui_launch.core.model.progress import (
        fmt_rate,
        fmt_step,
        goodput,
        goodput_lines,
        straggler_line,
        unit_of,
    )

    fin = s.finished
    if s.straggler is not None and s.straggler.global_rank is not None:
        console.print(straggler_line(s.straggler), soft_wrap=True)  # type: ignore[attr-defined]
    summary = goodput(s.progress, s.attempts, fin.wall if fin else time.time())
    if summary is None or s.progress is None:
        return
    job = s.progress.job
    unit = unit_of(job)
    head = "progress (from the logs)"
    if job is not None:
        head += f": rank {job.global_rank} printed {unit} {fmt_step(job).removeprefix('epoch ')}"
        head += f", last rate {fmt_rate(job.rate)} {unit}s/s"
    console.print(head, soft_wrap=True)  # type: ignore[attr-defined]
    for line in goodput_lines(summary, unit):
        console.print("  " + line, soft_wrap=True)  # type: ignore[attr-defined]
    slow = [e for e in s.progress.slowdowns if e.active]
    if slow:
        flagged = sorted({f"rank {e.global_rank} {e.what}" for e in slow})
        console.print("  slowdowns flagged: " + ", ".join(flagged), soft_wrap=True)  # type: ignore[attr-defined]


def injection_lines(events: list[Event]) -> list[str]:
    """``injected: kill:rank=1,after=2s,times=3 in attempts 0, 1, 2`` for each spec fired."""
    by_spec: dict[str, list[str]] = {}
    for e in events:
        if isinstance(e, Injected):
            mark = str(e.attempt) if e.ok else f"{e.attempt} (not done: {e.detail})"
            by_spec.setdefault(e.spec, []).append(mark)
    return [
        f"injected: {spec} in attempt{'s' if len(marks) > 1 else ''} {', '.join(marks)}"
        for spec, marks in by_spec.items()
    ]


def isatty(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for in-memory and closed streams)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
