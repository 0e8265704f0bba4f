"""What the HTML and the Markdown report both show, as rows of plain text."""

from __future__ import annotations

import shlex
import time

from tui_launch.core.journal.report import Report
from tui_launch.core.model import errors
from tui_launch.core.model.events import Failure
from tui_launch.core.model.progress import fmt_duration, goodput_lines
from tui_launch.core.model.snapshot import recovered
from tui_launch.core.model.text import failure_details, fr_source


def when(wall: float | None) -> str:
    """A wall-clock time as ``2026-11-26 01:02:03 UTC+01:00`` (local time, its offset)."""
    if wall is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC%z", time.localtime(wall))


def offset(report: Report, wall: float) -> str:
    """``+12.3s`` from the run's start."""
    return f"+{wall - (report.start_wall or wall):.1f}s"


def title(report: Report) -> str:
    """``train.py: FAILED (exit code 1)``."""
    s = report.snapshot
    what = s.run.entrypoint if s.run is not None else report.journal
    fin = s.finished
    code = f" (exit code {fin.exit_code})" if fin is not None else ""
    return f"{what}: {report.outcome.upper()}{code}"


def header_rows(report: Report) -> list[tuple[str, str]]:
    """The header: command, outcome, exit code, duration, nodes, versions, where."""
    s = report.snapshot
    run = s.run
    fin = s.finished
    rows = [("command", shlex.join(report.command) if report.command else "-")]
    outcome = report.outcome
    if report.running:
        outcome = "running (no end recorded: still running, or the launcher was killed)"
    rows.append(("outcome", outcome))
    rows.append(("exit code", str(fin.exit_code) if fin is not None else "-"))
    if fin is not None and fin.message:
        rows.append(("message", fin.message))
    rows.append(("duration", f"{report.duration:.1f}s ({fmt_duration(report.duration)})"))
    rows.append(("started", when(report.start_wall)))
    rows.append(("ended" if not report.running else "last event", when(report.end_wall)))
    if run is not None:
        rv = s.rendezvous
        nodes = rv.group_world_size if rv is not None and rv.group_world_size else None
        span = (
            f"{run.min_nodes}"
            if run.min_nodes == run.max_nodes
            else f"{run.min_nodes}:{run.max_nodes}"
        )
        rows.append(
            (
                "nodes",
                f"{nodes if nodes is not None else '?'} (asked {span}), "
                f"{run.nproc_per_node} rank(s) per node, this node {run.host}",
            )
        )
        if rv is not None and rv.participants:
            rows.append(("participants", ", ".join(rv.participants)))
        rows.append(("rendezvous", f"{run.backend} at {run.endpoint}, run id {run.run_id}"))
        rows.append(
            (
                "restarts",
                f"{s.failure_restarts}/{run.max_restarts} on failure, "
                f"{s.manual_restarts} manual, {s.membership_restarts} membership",
            )
        )
        rows.append(("torch", run.torch_version))
    rows.append(
        (
            "tuilaunch",
            f"{report.tuilaunch_version or 'unknown (not journaled)'} (run); "
            f"{report.reader_version} (this report)",
        )
    )
    rows.append(("run directory", report.run_dir))
    rows.append(
        (
            "journal",
            f"{report.journal} ({report.events:,} events, {report.state_events:,} "
            "without log marks)",
        )
    )
    return rows


def attempt_rows(report: Report) -> list[tuple[str, str, str, str, str]]:
    """Per attempt: number, start, duration, world size, how it ended."""
    rows = []
    for a in report.spans:
        end = a.end if a.end is not None else report.end_wall
        dur = f"{(end or a.start) - a.start:.1f}s"
        reason = a.end_reason or ("running" if report.running else "-")
        rows.append((str(a.number), offset(report, a.start), dur, str(a.world_size), reason))
    return rows


def goodput_text(report: Report) -> list[str]:
    """The goodput lines (per attempt and the totals), or why there are none."""
    if report.goodput is None:
        return ["no progress seen: the ranks printed no step counter tuilaunch reads"]
    return goodput_lines(report.goodput)


def root_cause(report: Report) -> Failure | None:
    """The failure that ended the run (None: it succeeded, or a restart recovered it)."""
    s = report.snapshot
    rc = s.root_cause
    if rc is None or report.outcome == "succeeded":
        return None
    if report.outcome in ("stopped", "running") and recovered(s, rc):
        return None
    return rc


def root_cause_lines(f: Failure) -> list[str]:
    """The failure's details but its traceback (shown apart)."""
    lines = []
    for line in failure_details(f):
        if line.startswith("traceback  :"):
            break
        lines.append(line)
    return lines


def other_failures(report: Report) -> list[Failure]:
    """Every failure but the root cause (the recovered ones among them), collateral ones
    (peers the agent terminated) left out."""
    shown = root_cause(report)
    return [f for f in report.snapshot.failures if not f.collateral and f is not shown]


def resource_rows(report: Report) -> list[tuple[str, ...]]:
    """Per rank and attempt: peak RSS, mean CPU, peak GPU memory, mean GPU % (the totals the
    run journaled at its end; none while it runs)."""
    from tui_launch.core.model.text import fmt_bytes

    tel = report.snapshot.telemetry
    rows: list[tuple[str, ...]] = []
    for r in tel.totals if tel is not None else ():
        cpu, util = r.mean_cpu, r.mean_gpu_util
        rows.append(
            (
                str(r.attempt),
                str(r.global_rank),
                fmt_bytes(r.peak_rss),
                f"{cpu:.0f}" if cpu is not None else "-",
                fmt_bytes(r.peak_gpu_mem) if r.peak_gpu_mem is not None else "-",
                f"{util:.0f}" if util is not None else "-",
            )
        )
    return rows


def exit_text(code: int | None) -> str:
    """An exit code in words (``-``)."""
    return errors.describe_exit(code) if code is not None else "-"


def flight_recorder(report: Report) -> tuple[list[tuple[str, str]], str, list[str]] | None:
    """The verdict on the run's Flight Recorder dumps (the latest one judged while it ran):
    its rows (verdict, what was read, culprits), the groups' heading (``3 of 13 process
    groups wait``) and each process group that waits, worst first; None when none was
    judged."""
    e = report.snapshot.flight_recorder
    if e is None:
        return None
    rows = [
        ("verdict", e.verdict),
        ("read", f"{fr_source(e)} of attempt {e.attempt}, at {offset(report, e.wall)}"),
        ("culprits", ", ".join(map(str, e.culprits)) or "none"),
        ("files", f"{e.path}*" if e.path else "-"),
    ]
    groups = [f"{g.label} (ranks {g.ranks}): {g.text}" for g in e.groups]
    if e.groups_waiting > len(e.groups):
        groups.append(f"... {e.groups_waiting - len(e.groups)} more (tuilaunch why)")
    return rows, f"{e.groups_waiting} of {e.groups_total} process groups wait", groups
