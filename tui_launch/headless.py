"""Headless front end (``--no-tui``): event lines, torchrun's worker output, a summary.

On a pipe or in CI it prints one line per event on stderr and the workers' output as torchrun
would show it; on a terminal it also keeps a live status line at the bottom. At the end it
prints a summary table. It reads the same store snapshots as the dashboard.

Worker output reaches the console as bytes, the way torchrun writes it (see
:mod:`tui_launch.core.logs.console`): a stream torchrun leaves on the console is copied from its
rank file by the kernel (``\r`` progress bars move in place on a terminal), a tee'd one is
prefixed line by line (one line per ``\r`` update), and a console that is ``/dev/null`` is not
fed at all. A console that goes away (``| head``) is silenced at its first failed write
(:class:`~tui_launch.core.logs.console.ConsoleStream`): its streams are no longer read for it,
a notice says so once (on the other console if it is still there, and in the journal), and
the run goes on.
"""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tui_launch.core.logs.console import (
    ConsoleStream,
    PrefixedLines,
    copy_range,
    is_devnull,
    lost_words,
    silence,
    write_all,
)
from tui_launch.core.logs.tail import STDOUT, LogSource
from tui_launch.core.model.events import (
    Event,
    EventTable,
    ExitBarrier,
    JobStacks,
    NodeStatus,
    Notice,
    StacksDumped,
)
from tui_launch.core.model.store import RankState, RunStore, Snapshot
from tui_launch.core.model.text import clock, cluster_lines, describe
from tui_launch.core.run.handle import RunHandle
from tui_launch.summary import isatty, print_summary, run_duration

TAG = "[tuilaunch]"
# How long a passed-through worker line that has not ended is held back before it is shown as
# it is: short enough that a progress bar or a prompt waiting on a line of its own shows at once.
HOLD_S = 0.04
# A file grows a page at a time while one write(2) copies into it, so a range that ends inside
# a line exactly on a page boundary is most likely a write still under way (its writer may be
# descheduled mid-copy on a loaded machine), not a bar or a prompt, which end anywhere.
PAGE = os.sysconf("SC_PAGE_SIZE")
HOLD_MID_WRITE_S = 1.0
LINE_END_WINDOW = 1 << 12
CLUSTER_LINES_MAX = 32


def cluster_lines_shown(nodes: tuple[NodeStatus, ...], stale_after: float) -> set[str]:
    """The nodes whose cluster line headless prints when it changes: every node up to
    :data:`CLUSTER_LINES_MAX`, past that only those not running or lost (at 1,000 nodes a
    line per node and change is a screenful a second). The test was a match of " running "
    in the line, which never matched ("running," is followed by a comma): every node was
    printed at any N (``bench/scale.py`` counted 64 lines at 64 nodes)."""
    if len(nodes) <= CLUSTER_LINES_MAX:
        return {n.node for n in nodes}
    return {
        n.node for n in nodes if n.state != "running" or (n.age is not None and n.age > stale_after)
    }


STACK_FRAMES = 12  # innermost frames printed per distinct stack (the files keep all)
_CLEAR = "\r\x1b[2K"
# Events printed with more than their line (describe's), or not always: by type, as the store
# reduces them. A printer is a method of Headless that gets the event and whether the run has
# one node.
_PRINTERS: EventTable[Callable[[Headless, Any, bool], None]] = EventTable("headless printer")


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
            status_line = isatty(self.err)
        self.status_line = status_line
        self.verbose = verbose
        self._lock = threading.Lock()
        self._status = ""
        self._status_shown = False
        # The last worker bytes on the terminal left a line open (a progress bar being drawn):
        # the status line waits, or it would be drawn onto the bar.
        self._open_line = False
        self._tee: dict[int, PrefixedLines] = {}  # by id(source)
        # Passed-through streams, by id(source): how far the console has them, and the start
        # of an unended line held back since when (monotonic).
        self._sent: dict[int, int] = {}
        self._held: dict[int, tuple[int, float]] = {}
        # Whether the last byte written to each console file was a newline (a [tuilaunch] line
        # must start a line); stdout and stderr share one entry when they are the same file.
        self._where: dict[str, object] = {"stdout": "stdout", "stderr": "stderr"}
        self._line_start: dict[object, bool] = {}
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}  # console without an fd
        self._next_event = 0
        self._cluster_seen: object = None
        self._cluster_lines: dict[str, str] = {}
        self._cluster_error: str | None = None
        # Consoles that went away (stdout, stderr: why), and their notices not yet posted.
        self._gone: dict[str, str] = {}
        self._gone_notes: list[str] = []
        for stream in (self.out, self.err):
            if isinstance(stream, ConsoleStream):
                stream.on_gone = self._console_gone

    def _console_gone(self, name: str, reason: str) -> None:
        # Any thread, maybe under self._lock: the notice is posted by the main loop.
        if name not in self._gone:
            self._gone[name] = reason
            self._gone_notes.append(
                f"{name} went away ({reason}): the run goes on; what it showed is in the "
                "run directory (the ranks' log files, agent.log, the journal)"
            )

    def _lost(self, name: str, stream: TextIO, fd: int, e: OSError) -> None:
        """A write of worker bytes to the console's ``fd`` failed: it went away."""
        if isinstance(stream, ConsoleStream):
            stream.lost(e)
        else:
            silence(fd)
            self._console_gone(name, lost_words(e))

    def _post_gone(self) -> None:
        while self._gone_notes:
            self.store.post(Notice(level="warning", message=self._gone_notes.pop(0)))

    def attach_console(self) -> None:
        """Have the tailer hand this console the streams torchrun would show on it."""
        fds = {"stdout": _fileno(self.out), "stderr": _fileno(self.err)}
        self._fds = fds
        self._where = {k: _file_id(fd, k) for k, fd in fds.items()}
        null = {k: fd is not None and is_devnull(fd) for k, fd in fds.items()}

        def shown(src: LogSource) -> bool:
            return src.console and not null[src.stream] and src.stream not in self._gone

        self.runner.add_raw_sink(self.console_bytes, accepts=shown)

    # Called on the log tailer's thread.
    def console_bytes(
        self, src: LogSource, fd: int, start: int, end: int, final: bool
    ) -> bool | None:
        """Write bytes ``[start, end)`` of a worker stream the way torchrun would.

        Returns True while bytes of an unended line are held back (the tailer calls again).
        """
        stream = self.out if src.stream == STDOUT else self.err
        out_fd = self._fds[src.stream]
        if src.prefix is None:
            return self._pass_through(src, fd, end, final, stream, out_fd)
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
                        try:
                            write_all(out_fd, text)
                        except OSError as e:
                            self._lost(src.stream, stream, out_fd, e)
                    else:
                        stream.write(text.decode("utf-8", "replace"))
                        stream.flush()
                    self._open_line = False
                    self._line_start[self._where[src.stream]] = True
                    self._show_status()
            if last or not data:
                break
        if final:
            self._tee.pop(id(src), None)
        return None

    def _pass_through(
        self, src: LogSource, fd: int, end: int, final: bool, stream: TextIO, out_fd: int | None
    ) -> bool:
        """A stream torchrun leaves on the console: the worker's own bytes, in whole lines.

        Under torchrun every ``write(2)`` of a worker lands on the console whole, so lines
        written together never mix with another rank's. Here the bytes come from a file that
        grows while it is read (a block of lines becomes visible a page at a time), so a range
        may end inside a line: it is copied up to its last line end (``\n`` or ``\r``, so a
        progress bar keeps moving) and the rest is held back until the line ends, or, if it
        does not within ``HOLD_S`` (a bar or a prompt that waits), let out as it is; a range
        that ends on a page boundary is a write under way and waits up to ``HOLD_MID_WRITE_S``.
        """
        key = id(src)
        pos = self._sent.get(key, 0)
        if end <= pos and not final:
            return False
        cut, tail = end, b""
        if not final:
            cut, tail = _line_cut(fd, pos, end)
            if cut < end:
                now = time.monotonic()
                since = self._held.get(key)
                if since is None or since[0] != cut:
                    self._held[key] = (cut, now)
                elif now - since[1] >= (HOLD_MID_WRITE_S if end % PAGE == 0 else HOLD_S):
                    cut, tail = end, b""  # the writer stopped mid-line: show what it wrote
        if cut >= end:
            self._held.pop(key, None)
        if cut > pos:
            with self._lock:
                self._hide_status()
                if out_fd is not None:
                    stream.flush()
                    try:
                        copy_range(fd, out_fd, pos, cut)
                    except OSError as e:
                        self._lost(src.stream, stream, out_fd, e)
                else:
                    dec = self._decoders.setdefault(
                        key, codecs.getincrementaldecoder("utf-8")("replace")
                    )
                    stream.write(dec.decode(os.pread(fd, cut - pos, pos), final))
                    stream.flush()
                last = tail[-1:] if tail else os.pread(fd, 1, cut - 1)
                self._line_start[self._where[src.stream]] = last == b"\n"
                if self.status_line:  # a bar mid-way: the status line must not land on it
                    self._open_line = last != b"\n"
                self._show_status()
            self._sent[key] = cut
        if final:
            self._sent.pop(key, None)
            self._held.pop(key, None)
            self._decoders.pop(key, None)
        return cut < end

    def say(self, line: str, tag: bool = True) -> None:
        """Print one ``[tuilaunch]`` line, from any thread; ``tag=False``: a line of torch's
        own (its log records, its C++ messages), as it is, where torchrun would show it."""
        self._say(line, tag)

    def _say(self, line: str, tag: bool = True) -> None:
        with self._lock:
            self._hide_status()
            self._start_line()
            self.err.write(f"{TAG} {line}\n" if tag else f"{line}\n")
            self.err.flush()
            self._line_start[self._where["stderr"]] = True
            self._show_status()

    def _start_line(self) -> None:
        """Make what is written next to stderr start a line (with the lock held).

        A worker's last bytes may have left a line open: a progress bar mid-way, or one that
        ended with ``\r`` (tqdm's ``leave=False``). On a terminal with the status line the bar
        is erased (it comes back at its next update); elsewhere a newline ends it, so that
        every ``[tuilaunch]`` line starts a line of the file (``grep '^\\[tuilaunch\\]'``).
        """
        if self._open_line and self.status_line:
            self.err.write(_CLEAR)
            self._open_line = False
        elif not self._line_start.get(self._where["stderr"], True):
            self.err.write("\n")
        self._line_start[self._where["stderr"]] = True

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
        self._post_gone()
        events = self.store.events(self._next_event)
        self._next_event += len(events)
        single = self._single_node()
        for e in events:
            printer = _PRINTERS.get(type(e))
            if printer is None:
                self._print_line(e)
            else:
                printer(self, e, single)
        self._print_cluster()

    def _print_line(self, e: Event) -> None:
        """The event's line (``describe``), if it has one: how most events are printed."""
        line = describe(e)
        if line:
            self._say(line)

    @_PRINTERS.on(ExitBarrier)
    def _print_barrier(self, e: ExitBarrier, single: bool) -> None:
        if not single:  # alone, nobody else to wait for: the line would only puzzle
            self._print_line(e)

    @_PRINTERS.on(StacksDumped)
    def _print_dump(self, e: StacksDumped, single: bool) -> None:
        self._print_line(e)
        if e.reason != "hang-suspected":
            # A suspicion's stacks come again with its confirmation: printed once, then.
            self._print_stacks(e)

    @_PRINTERS.on(JobStacks)
    def _print_job_stacks(self, e: JobStacks, single: bool) -> None:
        self._print_line(e)
        self._print_job(e)

    def _print_job(self, e: JobStacks) -> None:
        """Where every rank of the job is: each place once, with its ranks and nodes."""
        from tui_launch.core.diagnosis.stacks import rank_list
        from tui_launch.core.job.jobstacks import place_groups

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
        from tui_launch.core.diagnosis.stacks import group_stacks, rank_list

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
        shown = cluster_lines_shown(sample.nodes, stale)
        for node, line in lines.items():
            if self._cluster_lines.get(node) != line:
                self._cluster_lines[node] = line
                if node in shown:
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
        # Every post and the run's end wake the loop; the timeout only redraws the status
        # line's clock (and posts a console's "went away" a little later without one).
        timeout = 0.25 if self.status_line else 1.0
        while not self.runner.done:
            snap = self.store.wait_newer(version, timeout=timeout)
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
            self._start_line()
        self.err.flush()
        snap = self.store.snapshot()
        print_summary(snap, self.runner, self.err, verbose=self.verbose)
        return self.runner.exit_code if self.runner.exit_code is not None else 1


def _line_cut(fd: int, pos: int, end: int) -> tuple[int, bytes]:
    """Where bytes ``[pos, end)`` of ``fd`` end their last line (just past its ``\n`` or
    ``\r``; ``pos`` if none does), and a few bytes before that point (its last one included).

    Reads backwards from ``end`` in growing windows: in a flood the last line end is within the
    last line's length, so one small ``pread`` per range.
    """
    window = LINE_END_WINDOW
    hi = end
    while hi > pos:
        lo = max(pos, hi - window)
        data = os.pread(fd, hi - lo, lo)
        i = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if i >= 0:
            return lo + i + 1, data[: i + 1]
        if len(data) < hi - lo:  # the file is shorter than it said: keep what was found
            return pos, b""
        hi = lo
        window = min(window * 4, 1 << 22)
    return pos, b""


def _file_id(fd: int | None, name: str) -> object:
    """The file ``fd`` writes to (stdout and stderr on one terminal, pipe or file share it)."""
    if fd is None:
        return name
    try:
        st = os.fstat(fd)
    except OSError:
        return name
    return (st.st_dev, st.st_ino)


def _fileno(stream: object) -> int | None:
    """The descriptor under a text stream (None: an in-memory one, written as text)."""
    try:
        return int(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def status_text(s: Snapshot) -> str:
    """The one-line live status: phase, ranks, restarts, elapsed time, and the job's progress
    once a rank printed some (``step 120/500 24% 9.8/s ETA 39s``)."""
    running = sum(1 for r in s.ranks if r.state == RankState.RUNNING)
    elapsed = run_duration(s)
    parts = [
        f"{TAG} {s.phase}",
        f"attempt {max(s.attempt, 0)}",
        f"ranks running {running}/{len(s.ranks)}",
        f"restarts {s.failure_restarts}/{s.max_restarts}",
        clock(elapsed),
    ]
    progress = _progress_status(s)
    if progress:
        parts.append(progress)
    return " | ".join(parts)


def _progress_status(s: Snapshot) -> str:
    """The job's progress for the status line: the leading rank's counter, rate and ETA (or
    why there is none); the dashboard's header says the same."""
    from tui_launch.core.model.progress import fmt_eta, fmt_rate, fmt_step, unit_of

    view = s.progress
    if view is None or view.latest.attempt != s.attempt:
        return ""
    job = view.job
    if job is None or job.step is None:
        return ""
    unit = unit_of(job)
    text = fmt_step(job) if unit == "epoch" else f"step {fmt_step(job)}"
    if job.total:
        text += f" {100 * job.step / job.total:.0f}%"
    text += f" {fmt_rate(job.rate)}/s"
    if not job.finished and any(r.state == RankState.RUNNING for r in s.ranks):
        stalled = any(what == "stalled" for _, what in view.active)
        stuck = job.eta is not None and (stalled or bool(s.hung_ranks))
        text += f" ETA {'—' if stuck else fmt_eta(job)}"
    return text
