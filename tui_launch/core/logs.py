"""Worker and agent logs: every line to a file, tailed by byte offset, bounded in memory.

torchrun writes a worker's output to the console unless it is redirected, and drops the output
of ranks outside ``--local-ranks-filter``. tuilaunch wraps the user's ``LogsSpecs`` so that every
rank's stdout and stderr always land in per-rank files (keeping torch's own layout and error
files), then decides itself what the console shows, with torchrun's rules. Workers write to
regular files, so they never block on a pipe, and one tailer thread reads all files in large
chunks (torch's ``--tee`` polls one thread per stream and reads line by line).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.periodic import Periodic

STDOUT, STDERR = "stdout", "stderr"


@dataclass
class LogSource:
    """One stream of one rank in one attempt, and how the console treats it."""

    attempt: int
    local_rank: int
    global_rank: int
    stream: str
    path: str
    console: bool
    prefix: str | None
    teed: bool = False
    offset: int = 0
    partial: bytes = b""
    closed: bool = False
    fp: Any = field(default=None, repr=False)  # kept open: one read per poll, no reopening

    def close(self) -> None:
        """Stop reading this stream and release its file."""
        self.closed = True
        if self.fp is not None:
            self.fp.close()
            self.fp = None


LineSink = Callable[[LogSource, list[str]], None]


class LogTailer:
    """One thread that tails every log file by byte offset and hands whole lines to sinks.

    Lines are delivered in file order per stream. ``drain`` reads everything written so far,
    synchronously, so that a failure report can follow the last lines that led to it.
    """

    CHUNK = 1 << 22
    MAX_LINE = 1 << 20
    # With only lossy sinks, a stream more than SKIP_OVER bytes behind is read from its last
    # SKIP_KEEP bytes: a view can show a screenful of a flood, never all of it.
    SKIP_OVER = 1 << 18
    SKIP_KEEP = 1 << 15

    def __init__(
        self, interval: float = 0.05, idle_interval: float = 0.2, view_interval: float = 0.5
    ) -> None:
        self._interval = interval
        self._idle_interval = max(interval, idle_interval)
        # Views redraw their logs once a second and show ages in whole seconds: two polls a
        # second keep them current.
        self._view_interval = max(interval, view_interval)
        self._delivered = 0  # lines delivered so far (tells the loop whether a poll found any)
        self._sources: list[LogSource] = []
        self._sinks: list[LineSink] = []
        self._lossless_sinks = 0
        self._lock = threading.RLock()
        self._wait = interval  # the delay before the next poll (the back-off's state)
        self._loop: Periodic | None = None
        # Log marks (see set_mark_sink): what was last reported, and when.
        self._mark_sink: Callable[[tuple[tuple[int, int, str, int], ...]], object] | None = None
        self._mark_interval = 1.0
        self._marked: dict[tuple[int, int, str], int] = {}
        self._mark_at = 0.0

    def set_mark_sink(
        self,
        sink: Callable[[tuple[tuple[int, int, str, int], ...]], object],
        interval: float = 1.0,
    ) -> None:
        """Report, at most every ``interval`` seconds while files grow, how far each stream
        has been read in whole lines: ``sink(((attempt, local_rank, stream, offset), ...))``
        with the streams that moved since the last report (a replay cuts the logs there)."""
        self._mark_sink = sink
        self._mark_interval = interval

    def _mark(self, force: bool = False) -> None:
        if self._mark_sink is None:
            return
        now = time.monotonic()
        if not force and now - self._mark_at < self._mark_interval:
            return
        moved = []
        for src in self._sources:
            key = (src.attempt, src.local_rank, src.stream)
            end = src.offset - len(src.partial)  # a line boundary: logs are cut between lines
            if self._marked.get(key) != end:
                self._marked[key] = end
                moved.append((*key, end))
        if moved:
            self._mark_at = now
            try:
                self._mark_sink(tuple(moved))
            except Exception:
                logging.getLogger(__name__).exception("log mark sink failed")

    def add_sink(self, sink: LineSink, lossy: bool = False) -> None:
        """Deliver lines to ``sink(source, lines)`` from now on.

        A ``lossy`` sink (a view that shows the latest lines) accepts that, in a flood, the
        tailer jumps over what it has fallen behind by and hands it a line saying so instead:
        the files keep every line. While any sink is lossless (a console, a filter file),
        every line is read and delivered.
        """
        with self._lock:
            self._sinks.append(sink)
            self._lossless_sinks += not lossy

    @property
    def _views_only(self) -> bool:
        """Only lossy sinks (views) read the lines: a flood may be skipped, polls may be slow."""
        return bool(self._sinks) and not self._lossless_sinks

    def add_sources(self, sources: list[LogSource]) -> None:
        """Start tailing ``sources`` (a new attempt's files)."""
        with self._lock:
            self._sources.extend(sources)

    def start(self) -> None:
        """Start the tailer thread (once)."""
        if self._loop is not None:
            return
        # The observer must not slow the observed (nice 10): on a busy machine the workers get
        # the CPU first and the tailer catches up (the files hold every line meanwhile).
        self._loop = Periodic(
            "tuilaunch-logs", self._interval, self._poll, first_delay=self._interval, nice=10
        ).start()

    def stop(self) -> None:
        """Read what is left, flush partial lines, and stop the thread."""
        if self._loop is not None:
            self._loop.stop(timeout=5)
        self.drain(final=True)
        with self._lock:
            for src in self._sources:
                src.close()
            self._sources = []

    def drain(self, final: bool = False) -> None:
        """Read all sources to their current end now; ``final`` also flushes partial lines."""
        with self._lock:
            for src in self._sources:
                self._read(src, final)
            if final:
                self._mark(force=True)
                self._sources = [s for s in self._sources if not s.closed]

    def close_attempt(self, attempt: int) -> None:
        """Read an ended attempt's files to the end and stop tailing them."""
        with self._lock:
            for src in self._sources:
                if src.attempt == attempt:
                    self._read(src, final=True)
            self._mark(force=True)
            for src in self._sources:
                if src.attempt == attempt:
                    src.close()
            self._sources = [s for s in self._sources if not s.closed]

    def _poll(self) -> float:
        """One poll of every file; returns the delay before the next one.

        Poll fast while lines flow; back off (doubling, up to idle_interval) while the files
        are quiet, as in a steady training loop that prints a line a second: most polls of
        every rank's files would find nothing. When only views read the lines (they redraw
        about once a second), polling faster than view_interval would show nothing sooner.
        """
        before = self._delivered
        self.drain()
        with self._lock:
            self._mark()
        if self._views_only:
            self._wait = self._view_interval
        else:
            found = self._delivered != before
            self._wait = self._interval if found else min(self._wait * 2, self._idle_interval)
        return self._wait

    def _read(self, src: LogSource, final: bool) -> None:
        """Deliver every whole line written to ``src`` since the last read.

        ``final`` (the writer is gone) also delivers a last line without a newline. A "line"
        longer than ``MAX_LINE`` (progress bars that only ever print \\r) is delivered in
        pieces, so memory stays bounded.
        """
        while not src.closed:
            try:
                if src.fp is None:
                    src.fp = open(src.path, "rb")  # noqa: SIM115 (kept open across polls)
                    src.fp.seek(src.offset)
                if not final and self._views_only:
                    self._skip_ahead(src)
                data = src.fp.read(self.CHUNK)
            except OSError:  # not created yet, or gone with a deleted attempt
                return
            more = len(data) == self.CHUNK
            flush = final and not more  # the partial line is final once the file is read out
            src.offset += len(data)
            data = src.partial + data
            cut = data.rfind(b"\n")
            whole, src.partial = (b"", data) if cut < 0 else (data[: cut + 1], data[cut + 1 :])
            if (flush or len(src.partial) > self.MAX_LINE) and src.partial:
                whole += src.partial + b"\n"
                src.partial = b""
            if flush:
                src.close()
            if whole:
                self._deliver(src, whole)
            if not more:
                return

    def _skip_ahead(self, src: LogSource) -> None:
        """Jump to the last ``SKIP_KEEP`` bytes of a stream far behind; say so in a line."""
        end = os.fstat(src.fp.fileno()).st_size
        if end - src.offset <= self.SKIP_OVER:
            return
        src.fp.seek(end - self.SKIP_KEEP)
        head = src.fp.readline()  # the rest of a line cut in two: skipped with the others
        skipped = end - self.SKIP_KEEP + len(head) - src.offset + len(src.partial)
        src.offset = end - self.SKIP_KEEP + len(head)
        src.partial = b""
        note = f"... {skipped / 1e6:.1f} MB not shown here; every line is in {src.path} ..."
        self._deliver(src, note.encode() + b"\n")

    def _deliver(self, src: LogSource, whole: bytes) -> None:
        # Split on newlines only: a progress bar's \r stays inside its line, as in the file.
        lines = whole.decode("utf-8", "replace").split("\n")[:-1]
        self._delivered += len(lines)
        for sink in self._sinks:
            try:
                sink(src, lines)
            except Exception:  # a sink's failure must not stall the other sinks or workers
                logging.getLogger(__name__).exception("log sink failed")


class DuplicateFilter:
    """torchrun's ``--duplicate-stdout/stderr-filters``: matching tee'd lines to one file.

    torch implements them with its own tee threads, which tuilaunch replaces; this sink writes
    the same lines (with the same prefix) to the same ``filtered_std*.log`` files.
    """

    def __init__(self, filters: dict[str, list[str]]) -> None:
        self._filters = {k: v for k, v in filters.items() if v}
        self._paths: dict[str, str] = {}
        self._files: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self._filters)

    def set_files(self, paths: dict[str, str]) -> None:
        """The files of a new attempt (torch has just created them)."""
        self.close()
        self._paths = dict(paths)

    def __call__(self, src: LogSource, lines: list[str]) -> None:
        """Tailer sink: append the lines of ``src`` that pass its stream's filter."""
        needles = self._filters.get(src.stream)
        path = self._paths.get(src.stream)
        if not needles or not path or not src.teed or path.startswith(os.devnull):
            return
        hits = [ln for ln in lines if any(n in ln for n in needles)]
        if not hits:
            return
        fp = self._files.get(path)
        if fp is None:
            fp = self._files[path] = open(path, "a", errors="replace")  # noqa: SIM115
        fp.write("".join(f"{src.prefix or ''}{ln}\n" for ln in hits))
        fp.flush()

    def close(self) -> None:
        """Close the files of the current attempt."""
        for fp in self._files.values():
            fp.close()
        self._files.clear()


LogLine = tuple[int, int, str, str]
"""(sequence number, local rank, stream, text): one kept line."""


class LogBuffer:
    """Bounded in-memory worker lines, per local rank and merged, for the dashboard.

    Every line gets a sequence number, so a view can ask for what it has not shown yet
    (:meth:`since`). Memory stays bounded however much the workers print: old lines fall off
    the front, and the files keep everything. A marker line separates attempts.
    """

    def __init__(self, per_rank: int = 5000, merged: int = 20000) -> None:
        self._per_rank = per_rank
        self._lock = threading.Lock()
        self._ranks: dict[int, collections.deque[LogLine]] = {}
        self._merged: collections.deque[LogLine] = collections.deque(maxlen=merged)
        self._attempt: dict[int, int] = {}
        self._merged_attempt = 0
        self.seq = 0
        self.last_line_at: dict[int, float] = {}

    def __call__(self, src: LogSource, lines: list[str]) -> None:
        """Tailer sink: keep ``lines`` of ``src``."""
        lr = src.local_rank
        now = time.monotonic()
        with self._lock:
            dq = self._ranks.get(lr)
            if dq is None:
                dq = self._ranks[lr] = collections.deque(maxlen=self._per_rank)
            seq = self.seq
            if self._attempt.get(lr, src.attempt) != src.attempt:
                seq += 1
                marker = (seq, lr, "marker", f"---- attempt {src.attempt} ----")
                dq.append(marker)
                if src.attempt > self._merged_attempt:  # one marker per attempt when merged
                    self._merged.append(marker)
                    self._merged_attempt = src.attempt
            self._attempt[lr] = src.attempt
            stream = src.stream
            kept = [(seq + i + 1, lr, stream, text) for i, text in enumerate(lines)]
            self.seq = seq + len(lines)
            dq.extend(kept)
            self._merged.extend(kept)
            self.last_line_at[lr] = now

    def since(self, seq: int, local_rank: int | None = None) -> list[LogLine]:
        """Kept lines after sequence number ``seq``: one rank's, or all ranks' merged."""
        with self._lock:
            dq = self._merged if local_rank is None else self._ranks.get(local_rank)
            if not dq:
                return []
            out: list[LogLine] = []
            for item in reversed(dq):
                if item[0] <= seq:
                    break
                out.append(item)
        out.reverse()
        return out

    def lines(self, local_rank: int, stream: str | None = None) -> list[str]:
        """The kept text of one rank (one stream, or both interleaved)."""
        return [t for _, _, s, t in self.since(0, local_rank) if stream in (None, s)]


class AgentLogCapture(logging.Handler):
    """Collects the agent's own torch and c10d log records.

    Records go to ``agent.log`` in the run directory once it is known (buffered until then)
    and the last lines stay in memory for the front ends.
    """

    LOGGERS = ("torch", "torch.distributed")

    def __init__(self, keep: int = 500) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s"))
        self.recent: collections.deque[str] = collections.deque(maxlen=keep)
        self._pending: list[str] = []
        self._fp: Any = None
        self._muted: list[tuple[logging.Logger, logging.Handler]] = []
        self.path: str | None = None

    def install(self, mute_console: bool) -> None:
        """Attach to torch's loggers; with ``mute_console``, detach their stderr handlers."""
        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            if mute_console:
                for h in list(lg.handlers):
                    lg.removeHandler(h)
                    self._muted.append((lg, h))
            lg.addHandler(self)

    def uninstall(self) -> None:
        """Detach, restore muted handlers and close the file."""
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)
        for lg, h in self._muted:
            lg.addHandler(h)
        self._muted.clear()
        self.acquire()
        try:
            if self._fp is not None:
                self._fp.close()
                self._fp = None
        finally:
            self.release()

    def set_dir(self, directory: str) -> None:
        """Start writing to ``directory/agent.log``, flushing what was buffered."""
        self.acquire()
        try:
            if self._fp is not None:
                return
            self.path = os.path.join(directory, "agent.log")
            self._fp = open(self.path, "a", buffering=1)  # noqa: SIM115
            for line in self._pending:
                self._fp.write(line + "\n")
            self._pending.clear()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        """Format and keep one record."""
        try:
            line = self.format(record)
        except Exception:
            return
        self.add_line(line)

    def add_line(self, line: str) -> None:
        """Keep one line that did not come through logging (the agent's raw stderr)."""
        self.acquire()  # re-entrant: emit() already holds it
        try:
            self.recent.append(line)
            if self._fp is not None:
                self._fp.write(line + "\n")
            elif len(self._pending) < 10000:
                self._pending.append(line)
        finally:
            self.release()
