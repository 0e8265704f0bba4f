"""Headless front end (``--no-tui``): event lines, torchrun's worker output, a summary.

On a pipe or in CI it prints one line per event on stderr and the workers' output as torchrun
would show it; on a terminal it also keeps a live status line at the bottom. At the end it
prints a summary table. It reads the same store snapshots as the dashboard.

Worker output reaches the console as bytes, the way torchrun writes it (see
:mod:`tui_launch.core.console`): a stream torchrun leaves on the console is copied from its
rank file by the kernel (``\r`` progress bars move in place on a terminal), a tee'd one is
prefixed line by line (one line per ``\r`` update), and a console that is ``/dev/null`` is not
fed at all.
"""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
import time
from typing import Any, TextIO

from tui_launch.core import errors
from tui_launch.core.console import PrefixedLines, copy_range, is_devnull, write_all
from tui_launch.core.events import (
    Event,
    ExitBarrier,
    Failure,
    Injected,
    JobStacks,
    StacksDumped,
)
from tui_launch.core.handle import RunHandle
from tui_launch.core.logs import STDOUT, LogSource
from tui_launch.core.store import RunStore, Snapshot
from tui_launch.core.text import (
    clock,
    cluster_lines,
    describe,
    failure_details,
    failure_headline,
)

TAG = "[tuilaunch]"
CLUSTER_LINES_MAX = 32
STACK_FRAMES = 12  # innermost frames printed per distinct stack (the files keep all)
_CLEAR = "\r\x1b[2K"


class Headless:
    """Drive a run without a dashboard and return its exit code from :meth:`run`."""

    def __init__(
        self,
        store: RunStore,
        runner: RunHandle,
        out: TextIO | None = None,
        err: TextIO | None = None,
        status_line: bool | None = None,
        verbose: bool = False,
    ) -> None:
        self.store = store
        self.runner = runner
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if status_line is None:
            status_line = _isatty(self.err)
        self.status_line = status_line
        self.verbose = verbose
        self._lock = threading.Lock()
        self._status = ""
        self._status_shown = False
        # The last worker bytes on the terminal left a line open (a progress bar being drawn):
        # the status line waits, or it would be drawn onto the bar.
        self._open_line = False
        self._tee: dict[int, PrefixedLines] = {}  # by id(source)
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}  # console without an fd
        self._next_event = 0
        self._cluster_seen: object = None
        self._cluster_lines: dict[str, str] = {}
        self._cluster_error: str | None = None

    def attach_console(self) -> None:
        """Have the tailer hand this console the streams torchrun would show on it."""
        fds = {"stdout": _fileno(self.out), "stderr": _fileno(self.err)}
        self._fds = fds
        null = {k: fd is not None and is_devnull(fd) for k, fd in fds.items()}

        def shown(src: LogSource) -> bool:
            return src.console and not null[src.stream]

        self.runner.add_raw_sink(self.console_bytes, accepts=shown)

    # Called on the log tailer's thread.
    def console_bytes(self, src: LogSource, fd: int, start: int, end: int, final: bool) -> None:
        """Write bytes ``[start, end)`` of a worker stream the way torchrun would."""
        stream = self.out if src.stream == STDOUT else self.err
        out_fd = self._fds[src.stream]
        if src.prefix is None:
            # Straight to the console under torchrun: the worker's own bytes, as they come.
            if end <= start:
                return
            with self._lock:
                self._hide_status()
                if out_fd is not None:
                    stream.flush()
                    copy_range(fd, out_fd, start, end)
                else:
                    dec = self._decoders.setdefault(
                        id(src), codecs.getincrementaldecoder("utf-8")("replace")
                    )
                    stream.write(dec.decode(os.pread(fd, end - start, start), final))
                    stream.flush()
                if self.status_line:  # a bar mid-way: the status line must not land on it
                    self._open_line = os.pread(fd, 1, end - 1) != b"\n"
                self._show_status()
            return
        tee = self._tee.setdefault(id(src), PrefixedLines(src.prefix))
        pos = start
        while pos < end or final:
            data = os.pread(fd, min(end - pos, 1 << 22), pos) if pos < end else b""
            pos += len(data)
            last = final and pos >= end
            text = tee.feed(data, final=last)
            if text:
                with self._lock:
                    self._hide_status()
                    if out_fd is not None:
                        stream.flush()
                        write_all(out_fd, text)
                    else:
                        stream.write(text.decode("utf-8", "replace"))
                        stream.flush()
                    self._open_line = False
                    self._show_status()
            if last or not data:
                break
        if final:
            self._tee.pop(id(src), None)

    def say(self, line: str) -> None:
        """Print one ``[tuilaunch]`` line (from any thread: torch's stderr lines too)."""
        self._say(line)

    def _say(self, line: str) -> None:
        with self._lock:
            self._hide_status()
            if self._open_line and self.status_line:
                self.err.write(_CLEAR)  # a bar being drawn: it comes back at its next update
                self._open_line = False
            self.err.write(f"{TAG} {line}\n")
            self.err.flush()
            self._show_status()

    def _hide_status(self) -> None:
        if self._status_shown:
            self.err.write(_CLEAR)
            self.err.flush()
            self._status_shown = False

    def _show_status(self) -> None:
        if self.status_line and self._status and not self._open_line:
            self.err.write(self._status)
            self.err.flush()
            self._status_shown = True

    def _print_new_events(self) -> None:
        events = self.store.events(self._next_event)
        self._next_event += len(events)
        single = self._single_node()
        for e in events:
            if isinstance(e, ExitBarrier) and single:
                continue  # nobody else to wait for: the line would only puzzle
            line = describe(e)
            if line:
                self._say(line)
            if isinstance(e, StacksDumped) and e.reason != "hang-suspected":
                # A suspicion's stacks come again with its confirmation: printed once, then.
                self._print_stacks(e)
            if isinstance(e, JobStacks):
                self._print_job(e)
        self._print_cluster()

    def _print_job(self, e: JobStacks) -> None:
        """Where every rank of the job is: each place once, with its ranks and nodes."""
        from tui_launch.core.jobstacks import place_groups
        from tui_launch.core.stacks import rank_list

        for g in place_groups(e):
            who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 else f"ranks {rank_list(g.ranks)}"
            odd = "  <- odd one out" if g.odd else ""
            frames = [f"    {f}" for f in g.frames[:STACK_FRAMES]]
            self._say("\n".join([f"  {who} on {', '.join(g.nodes)}: {g.place}{odd}", *frames]))

    def _print_stacks(self, e: StacksDumped) -> None:
        """Each distinct main-thread stack of a dump once, with the ranks that share it."""
        dump = self.runner.stack_dump(e.path)
        if dump is None:
            return
        from tui_launch.core.stacks import group_stacks, rank_list

        for group in group_stacks(dump):
            n = len(group.ranks)
            who = f"rank {group.ranks[0]}" if n == 1 else f"ranks {rank_list(group.ranks)}"
            who += f" (\u00d7 {n} ranks)" if n > 1 else ""
            lines = [f"  {f.where}" for f in group.frames[:STACK_FRAMES]]
            if len(group.frames) > STACK_FRAMES:
                lines.append(f"  ... {len(group.frames) - STACK_FRAMES} more (stacks.txt)")
            lines = lines or ["  (no Python frame)"]
            self._say("\n".join([f"  {who}, main thread (innermost first):", *lines]))

    def _print_cluster(self) -> None:
        # One line per node whenever what it says changes (not its heartbeat age). Past
        # CLUSTER_LINES_MAX nodes, only nodes that are not running are printed (see SCALING.md).
        sample = self.store.snapshot().cluster
        if sample is None or sample is self._cluster_seen:
            return
        self._cluster_seen = sample
        if len(sample.nodes) < 2:
            return  # one node: the lines above say all of it
        interval = self.runner.cluster_interval
        stale = 5 * interval if interval is not None else 10.0
        lines = cluster_lines(sample.nodes, stale)
        many = len(lines) > CLUSTER_LINES_MAX
        for node, line in lines.items():
            if self._cluster_lines.get(node) != line:
                self._cluster_lines[node] = line
                if not many or " running " not in f" {line} ":
                    self._say(f"cluster {line}")
        if sample.error and sample.error != self._cluster_error:
            self._say(f"cluster view: store unreachable: {sample.error}")
        self._cluster_error = sample.error

    def _single_node(self) -> bool:
        snap = self.store.snapshot()
        if snap.rendezvous is not None and snap.rendezvous.group_world_size is not None:
            return snap.rendezvous.group_world_size == 1
        return snap.run is not None and snap.run.max_nodes == 1

    def run(self) -> int:
        """Start nothing, but follow the runner until it is done; print the summary."""
        self.attach_console()
        version = -1
        while not self.runner.done:
            snap = self.store.wait_newer(version, timeout=0.25)
            version = snap.version
            self._print_new_events()
            if self.status_line:
                with self._lock:
                    self._hide_status()
                    self._status = status_text(snap)
                    self._show_status()
        self._print_new_events()
        with self._lock:
            self._hide_status()
            self._status = ""
        self.err.flush()
        snap = self.store.snapshot()
        print_summary(snap, self.runner, self.err, verbose=self.verbose)
        return self.runner.exit_code if self.runner.exit_code is not None else 1


def _fileno(stream: object) -> int | None:
    """The descriptor under a text stream (None: an in-memory one, written as text)."""
    try:
        return int(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def status_text(s: Snapshot) -> str:
    """The one-line live status: phase, ranks, restarts, elapsed time."""
    running = sum(1 for r in s.ranks if r.state == "running")
    elapsed = run_duration(s)
    parts = [
        f"{TAG} {s.phase}",
        f"attempt {max(s.attempt, 0)}",
        f"ranks running {running}/{len(s.ranks)}",
        f"restarts {s.failure_restarts}/{s.max_restarts}",
        clock(elapsed),
    ]
    return " | ".join(parts)


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

    tty = _isatty(stream)
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
    style = {"succeeded": "bold green", "failed": "bold red", "stopped": "bold yellow"}.get(
        outcome, "bold red"
    )
    title = Text.assemble(
        ("tuilaunch summary: ", "bold"),
        (outcome.upper(), style),
        f"  exit code {code}  duration {run_duration(s):.1f}s",
    )
    console.print()
    console.print(title)
    if fin and fin.outcome == "error":
        console.print(Text(f"error: {fin.message}", style="red"), soft_wrap=True)
    injected = injection_lines(runner.store.events()) if runner is not None else []
    eventful = (
        outcome != "succeeded"
        or s.failures
        or s.restarts_used
        or s.controls
        or injected
        or s.dumps
        or s.hang is not None
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
                f"  attempt {h.attempt}: no output for {h.silence:.0f}s; {h.confirmation}\n"
                f"  verdict: {h.verdict}\n  stacks: {h.second_path}"
            ),
            soft_wrap=True,
        )
    rc = s.root_cause
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

    from tui_launch.core.text import fmt_bytes

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
    from tui_launch.core.progress_view import fmt_rate, goodput, goodput_lines, straggler_line

    fin = s.finished
    if s.straggler is not None and s.straggler.global_rank is not None:
        console.print(straggler_line(s.straggler), soft_wrap=True)  # type: ignore[attr-defined]
    summary = goodput(s.progress, s.attempts, fin.wall if fin else time.time())
    if summary is None or s.progress is None:
        return
    job = s.progress.job
    head = "progress (from the logs)"
    if job is not None:
        head += f": rank {job.global_rank} printed step {job.step}"
        head += f"/{job.total}" if job.total else ""
        head += f", last rate {fmt_rate(job.rate)} steps/s"
    console.print(head, soft_wrap=True)  # type: ignore[attr-defined]
    for line in goodput_lines(summary):
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


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
