"""Worker and agent logs: every line to a file, tailed by byte offset, bounded in memory.

torchrun writes a worker's output to the console unless it is redirected, and drops the output
of ranks outside ``--local-ranks-filter``. tuilaunch wraps the user's ``LogsSpecs`` so that every
rank's stdout and stderr always land in per-rank files (keeping torch's own layout and error
files), then decides itself what the console shows, with torchrun's rules. Workers write to
regular files, so they never block on a pipe, and one tailer thread reads all files in large
chunks (torch's ``--tee`` polls one thread per stream and reads line by line).

What the tailer hands out, per stream:

- *bytes* (:meth:`LogTailer.add_raw_sink`): each newly written byte range of the file, as an
  open file descriptor and offsets, so that a console copies it with ``os.sendfile`` (the
  kernel moves it; Python never sees it) or turns it into prefixed lines with a few bytes
  operations. A stream no sink accepts is not read at all.
- *whole lines* (:meth:`LogTailer.add_sink`): decoded, split on ``\n`` only (a progress
  bar's ``\r`` stays inside its line, as in the file). When every line sink of a stream is
  lossy (views, the progress and hang watches), a poll that finds it more than ``SKIP_KEEP``
  bytes behind reads its lines only if ``view_interval`` has passed since the last read, and
  then, in a flood, only its last ``SKIP_KEEP`` bytes: those sinks see a bounded sample
  however fast the ranks print, even while a console makes the tailer poll 20 times a second
  (a trickle of lines is read at every poll, so their arrival times stay exact).
- *the unterminated tail* (:meth:`LogTailer.add_partial_sink`): the text after the last
  ``\n`` (a ``\r``-rewritten progress bar), whenever it changed; read from the end of the
  file only, so it costs nothing in a flood.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.fswatch import FsWatch

# The stream names are the log files' names too: the run directory's layout owns them.
from tui_launch.core.model.layout import STDERR as STDERR
from tui_launch.core.model.layout import STDOUT as STDOUT
from tui_launch.core.periodic import Periodic


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
    offset: int = 0  # read for lines (or the tail) up to here
    partial: bytes = b""
    closed: bool = False
    raw_offset: int = 0  # handed to raw sinks up to here
    raw_held: bool = False  # a raw sink holds back bytes (an unended line): call it again
    partial_sent: bytes | None = None  # the partial last handed to partial sinks
    lines_at: float = float("-inf")  # when lossy sinks alone last got its lines (monotonic)
    read_to: int = -1  # the file's size when a read last handed on all of it (-1: read it)
    fp: Any = field(default=None, repr=False)  # kept open: one read per poll, no reopening

    def close(self) -> None:
        """Stop reading this stream and release its file."""
        self.closed = True
        if self.fp is not None:
            self.fp.close()
            self.fp = None


LineSink = Callable[[LogSource, list[str]], None]
RawSink = Callable[[LogSource, int, int, int, bool], "bool | None"]
"""``sink(source, fd, start, end, final)``: bytes ``[start, end)`` of ``source``'s file are new.

``fd`` is the tailer's descriptor of the file (read it with ``os.pread``/``os.sendfile`` at an
explicit offset, never move its position); ``final``: the writer is gone and this is the end.
A sink that returns True holds some of the bytes back (a line not ended yet, which a console
must not let another rank's lines cut in two): it is called again at the next poll, with
``start == end`` if nothing new came, so that it can decide to let them out.
"""
PartialSink = Callable[[LogSource, str, float], None]
"""``sink(source, text, t)``: the stream's text after its last ``\n`` is now ``text`` (raw,
``\r`` segments included; "" once a ``\n`` completed it), read at ``t`` (``time.monotonic``)."""
Accepts = Callable[[LogSource], bool]


def _every(src: LogSource) -> bool:
    return True


def last_segment(text: str) -> str:
    """What a terminal shows of a ``\r``-rewritten line: its last non-empty segment."""
    if "\r" not in text:
        return text
    return text.rstrip("\r").rsplit("\r", 1)[-1]


def _decode_partial(data: bytes) -> str:
    """Decode an unterminated line that may end inside a UTF-8 character (not shown yet).

    A partial kept from a file's last bytes may also start inside a character (a bar drawn
    with 3-byte block characters): its leading continuation bytes are dropped, not shown as
    replacement characters.
    """
    skip = 0
    while skip < 3 and skip < len(data) and data[skip] & 0xC0 == 0x80:
        skip += 1
    data = data[skip:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.end == len(data) and e.reason == "unexpected end of data":
            return data[: e.start].decode("utf-8", "replace")
        return data.decode("utf-8", "replace")


def _compact(partial: bytes, limit: int) -> bytes:
    """Keep a ``\r``-rewritten partial line bounded: from its last non-empty segment on.

    The dropped segments are earlier states of a progress bar (the file keeps them). A line
    without ``\r`` is left as it is (the caller delivers it in pieces).
    """
    if len(partial) <= limit:
        return partial
    body = partial.rstrip(b"\r")
    cut = body.rfind(b"\r")
    return partial[cut:] if cut > 0 else partial


class LogTailer:
    """One thread that tails every log file by byte offset and hands bytes and lines to sinks.

    Per stream, in file order: raw byte ranges to raw sinks, whole lines to line sinks, then
    the unterminated tail to partial sinks. ``drain`` reads everything written so far,
    synchronously, so that a failure report can follow the last lines that led to it.
    """

    CHUNK = 1 << 22
    MAX_LINE = 1 << 20
    # With only lossy sinks, a stream more than SKIP_OVER bytes behind is read from its last
    # SKIP_KEEP bytes: a view can show a screenful of a flood, never all of it.
    SKIP_OVER = 1 << 18
    SKIP_KEEP = 1 << 15
    # When no line sink reads a stream, partial sinks get its unterminated tail from at most
    # the last TAIL bytes (a progress bar's last states), however much was written.
    TAIL = 1 << 16

    def __init__(
        self,
        interval: float = 0.05,
        idle_interval: float = 0.2,
        view_interval: float = 0.5,
        *,
        fswatch: FsWatch | None = None,
        quiet_interval: float = 2.0,
    ) -> None:
        self._interval = interval
        self._idle_interval = max(interval, idle_interval)
        # With every stream's directory watched (inotify wakes the loop on a write), a quiet
        # poll is only a safety net: at idle the tailer then wakes every quiet_interval.
        self._fswatch = fswatch
        self._quiet_interval = max(self._idle_interval, quiet_interval)
        self._watched: dict[str, int] = {}  # directory -> live sources in it
        self._unwatched = 0  # live sources whose directory could not be watched
        self._pending = False  # a poll left bytes for the next one (a lossy stream's turn)
        self._written = False  # the file watch saw a write since the poll began
        # Views redraw their logs once a second and show ages in whole seconds: two polls a
        # second keep them current.
        self._view_interval = max(interval, view_interval)
        self._moved = 0  # bytes handed on so far (tells the loop whether a poll found any)
        self._sources: list[LogSource] = []
        self._sinks: list[tuple[LineSink, bool, Accepts]] = []  # (sink, lossy, accepts)
        self._raw_sinks: list[tuple[RawSink, Accepts]] = []
        self._partial_sinks: list[PartialSink] = []
        self._lock = threading.RLock()
        # Notified after every read of every source (caught_up waits on it, never on _lock).
        self._progress = threading.Condition()
        self._wait = interval  # the delay before the next poll (the back-off's state)
        self._loop: Periodic | None = None
        self._changes = 0  # sinks or sources added or removed (``_views_only`` is cached)
        self._views_at = -1
        self._views = False
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

    def add_sink(self, sink: LineSink, lossy: bool = False, accepts: Accepts | None = None) -> None:
        """Deliver lines to ``sink(source, lines)`` from now on.

        A ``lossy`` sink (a view that shows the latest lines) accepts that, in a flood, the
        tailer jumps over what it has fallen behind by and hands it a line saying so instead:
        the files keep every line. While any sink of a stream is lossless (a filter file),
        every line of it is read and delivered. ``accepts(source)``: the streams the sink
        wants (default: all); a stream no sink wants is not read for lines.
        """
        with self._lock:
            self._sinks.append((sink, lossy, accepts or _every))
            self._reread()

    def add_raw_sink(self, sink: RawSink, accepts: Accepts | None = None) -> None:
        """Hand ``sink`` every new byte range of the streams it ``accepts`` (see RawSink).

        For a console: the bytes are the worker's own, unsplit and undecoded, so it can copy
        them as they are (``os.sendfile``) or prefix their lines with bytes operations.
        """
        with self._lock:
            self._raw_sinks.append((sink, accepts or _every))
            self._reread()

    def add_partial_sink(self, sink: PartialSink) -> None:
        """Hand ``sink(source, text, t)`` each stream's unterminated text when it changes.

        ``text`` is what follows the last ``\\n`` (raw: a progress bar's ``\\r`` segments
        included; :func:`last_segment` gives what a terminal shows), "" once a ``\\n``
        completed it (the whole line then goes to the line sinks); ``t`` is the
        ``time.monotonic()`` of the read. Only the end of each file is read for it.
        """
        with self._lock:
            self._partial_sinks.append(sink)
            self._reread()

    def _reread(self) -> None:
        """A new sink may want what the others had: read every stream again at the next poll."""
        self._changes += 1
        for src in self._sources:
            src.read_to = -1

    @property
    def _views_only(self) -> bool:
        """Only lossy sinks (views) read the output: a flood may be skipped, polls may be slow.

        A raw sink that accepts none of the streams (a console to ``/dev/null``, or every
        stream redirected) does not count.
        """
        sinks = self._sinks or self._partial_sinks
        if not self._sources:  # nothing to tail yet: the next attempt's files may want it
            raw = bool(self._raw_sinks)
        else:
            raw = any(accepts(src) for _, accepts in self._raw_sinks for src in self._sources)
        return bool(sinks) and not raw and all(lossy for _, lossy, _ in self._sinks)

    def add_sources(self, sources: list[LogSource]) -> None:
        """Start tailing ``sources`` (a new attempt's files), from the next poll on, at once."""
        with self._lock:
            self._sources.extend(sources)
            for src in sources:
                self._watch(src)
            self._changes += 1
            self._wait = self._interval  # a new attempt's first lines are not read late
        if self._loop is not None:
            self._loop.wake()

    def _woken(self) -> None:
        """The file watch saw a write in a tailed directory: poll now if the loop sleeps for
        want of output (a loop that polls on its own keeps its pace: a flood would otherwise
        wake a views-only tailer 20 times a second instead of twice)."""
        self._written = True  # before reading _wait: _poll relies on this order
        if self._wait >= self._quiet_interval and self._loop is not None:
            self._loop.wake()

    def _watch(self, src: LogSource) -> None:
        """Under the lock: have the file watch wake the loop when ``src`` is written."""
        directory = os.path.dirname(src.path)
        if directory in self._watched:
            self._watched[directory] += 1
        elif self._fswatch is not None and self._fswatch.watch(directory, self._woken):
            self._watched[directory] = 1
        else:
            self._unwatched += 1

    def _unwatch(self, src: LogSource) -> None:
        """Under the lock: ``src`` is no longer tailed."""
        directory = os.path.dirname(src.path)
        left = self._watched.get(directory)
        if left is None:
            self._unwatched = max(0, self._unwatched - 1)
        elif left > 1:
            self._watched[directory] = left - 1
        else:
            del self._watched[directory]
            if self._fswatch is not None:
                self._fswatch.unwatch(directory, self._woken)

    def _drop_closed(self) -> None:
        """Under the lock: forget the closed sources (and their directories' watches)."""
        for src in self._sources:
            if src.closed:
                self._unwatch(src)
        self._sources = [s for s in self._sources if not s.closed]
        self._changes += 1

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
            self._drop_closed()

    def drain(self, final: bool = False, polled: bool = False) -> None:
        """Read all sources to their current end now; ``final`` also flushes partial lines.

        ``polled`` (the tailer's own poll): a stream read only by lossy line sinks is read
        for lines at most every ``view_interval``.
        """
        with self._lock:
            for src in self._sources:
                self._read(src, final, polled)
            if final:
                self._mark(force=True)
                self._drop_closed()
        with self._progress:
            self._progress.notify_all()

    def caught_up(self, attempt: int, local_ranks: Collection[int], timeout: float) -> bool:
        """Wait, ``timeout`` seconds at most, until every sink has had what the streams of
        ``local_ranks`` in ``attempt`` hold now; whether they all did.

        For a thread that must not read them itself (the agent thread, which has just seen
        those ranks exit): the tailer writes to the console, and a console nobody reads
        blocks its writer. This waits on the tailer's thread and never takes its lock.
        """
        wanted = []
        for src in list(self._sources):
            if src.attempt == attempt and src.local_rank in local_ranks and not src.closed:
                with contextlib.suppress(OSError):  # never created: nothing to wait for
                    wanted.append((src, os.stat(src.path).st_size))
        if not wanted:
            return True
        loop = self._loop
        if loop is not None:
            loop.wake()  # the last writes may still be on their way through the file watch

        def done() -> bool:
            return all(src.closed or src.read_to >= size for src, size in wanted)

        with self._progress:
            return self._progress.wait_for(done, timeout)

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
            self._drop_closed()

    def _poll(self) -> float:
        """One poll of every file; returns the delay before the next one.

        Poll fast while output flows; back off (doubling, up to idle_interval) while the files
        are quiet, as in a steady training loop that prints a line a second: most polls of
        every rank's files would find nothing. When only views read the output (they redraw
        about once a second), polling faster than view_interval would show nothing sooner.
        When the file watch covers every stream, a poll that found nothing sleeps
        quiet_interval: the next write wakes it at once.
        """
        before = self._moved
        self._pending = False
        self._written = False
        self.drain(polled=True)
        with self._lock:
            self._mark()
            # Asked of every sink and stream: only when one of them changed (at idle the
            # console's filter was called for each of 16 streams five times a second).
            if self._views_at != self._changes:
                self._views_at, self._views = self._changes, self._views_only
            views_only = self._views
            found = self._moved != before or self._pending
            held = any(src.raw_held for src in self._sources)
            # Quiet, and a write to any stream wakes the loop: sleep until it does.
            watched = bool(self._sources) and not self._unwatched and not held
        if not found and watched:
            self._wait = self._quiet_interval
            # Set before _written is read (_woken writes them in the other order): a write
            # seen during this poll either wakes the sleep or is seen here.
            if not self._written:
                return self._wait
            found = True
        if views_only:
            self._wait = self._view_interval
        else:
            self._wait = self._interval if found else min(self._wait * 2, self._idle_interval)
        return self._wait

    def _read(self, src: LogSource, final: bool, polled: bool = False) -> None:
        """Hand on what was written to ``src`` since the last read; ``final``: to its end;
        ``polled``: lines only lossy sinks want wait for ``view_interval`` since the last."""
        if src.closed:
            return
        try:
            if src.fp is None:
                src.fp = open(src.path, "rb")  # noqa: SIM115 (kept open across polls)
                src.fp.seek(src.offset)
        except OSError:  # not created yet, or gone with a deleted attempt
            return
        # A quiet stream costs one fstat: at idle the tailer polls every rank's two files
        # five times a second, and reading each for nothing was most of the launcher's CPU.
        size = os.fstat(src.fp.fileno()).st_size
        if size == src.read_to and not final and not src.raw_held:
            return
        t = time.monotonic()
        raw = [sink for sink, accepts in self._raw_sinks if accepts(src)]
        if raw:
            self._read_raw(src, raw, final)
        sinks = [(sink, lossy) for sink, lossy, accepts in self._sinks if accepts(src)]
        lines = False
        if sinks and polled and not final and all(lossy for _, lossy in sinks):
            # Views and watches: a sample twice a second is all they show or need. A console
            # poll 20 times a second must not make them decode and parse 10 times as much.
            # A trickle is read at every poll (the progress watch's arrival times stay exact);
            # a stream more than SKIP_KEEP behind waits for its turn. (0.8: a poll on the
            # view_interval grid must not miss its turn by a jitter.)
            soon = t - src.lines_at < 0.8 * self._view_interval
            if soon and size - src.offset > self.SKIP_KEEP:
                self._pending = True
                return  # its lines and its partial wait for the next turn (read_to unset)
            src.lines_at = t
        if sinks:
            lines = self._read_lines(src, sinks, final)
        elif self._partial_sinks:
            self._read_tail(src)
        if self._partial_sinks and not src.closed:
            self._send_partial(src, t, lines)
        src.read_to = size  # every sink had all of it (what came since is read next time)
        if final:
            src.close()

    def _read_raw(self, src: LogSource, sinks: list[RawSink], final: bool) -> None:
        fd = src.fp.fileno()
        end = os.fstat(fd).st_size
        if end <= src.raw_offset and not final and not src.raw_held:
            return
        held = False
        for sink in sinks:
            try:
                held = bool(sink(src, fd, src.raw_offset, end, final)) or held
            except Exception:  # a sink's failure must not stall the other sinks or workers
                logging.getLogger(__name__).exception("raw log sink failed")
        src.raw_held = held and not final
        self._moved += end - src.raw_offset
        src.raw_offset = end

    def _read_lines(self, src: LogSource, sinks: list[tuple[LineSink, bool]], final: bool) -> bool:
        """Deliver every whole line written to ``src`` since the last read; whether any was.

        ``final`` (the writer is gone) also delivers a last line without a newline. A
        ``\\r``-rewritten line (a progress bar) longer than ``MAX_LINE`` is kept from its last
        states on (:func:`_compact`); any other "line" that long is delivered in pieces, so
        memory stays bounded.
        """
        views_only = all(lossy for _, lossy in sinks)
        delivered = False
        if src.fp.tell() != src.offset:  # the tail reader moved on without moving the file
            src.fp.seek(src.offset)
        while True:
            try:
                size = self.CHUNK
                if views_only:  # a closing attempt's flood too: its last lines are kept
                    # No further than the end it measured: a writer that goes on meanwhile
                    # must not make this read longer than SKIP_OVER (it waits for the next).
                    size = self._skip_ahead(src, sinks)
                data = src.fp.read(size)
            except OSError:
                return delivered
            more = len(data) == self.CHUNK
            flush = final and not more  # the partial line is final once the file is read out
            src.offset += len(data)
            self._moved += len(data)
            data = src.partial + data
            cut = data.rfind(b"\n")
            whole, partial = (b"", data) if cut < 0 else (data[: cut + 1], data[cut + 1 :])
            partial = _compact(partial, self.MAX_LINE)
            if (flush or len(partial) > self.MAX_LINE) and partial:
                whole += partial + b"\n"
                partial = b""
            src.partial = partial
            if whole:
                self._deliver(src, whole, sinks)
                delivered = True
            if not more:
                return delivered

    def _read_tail(self, src: LogSource) -> None:
        """Keep ``src.partial`` current from the file's last bytes only (no line sink reads it)."""
        fd = src.fp.fileno()
        end = os.fstat(fd).st_size
        if end <= src.offset:
            return
        start = max(src.offset, end - self.TAIL)
        data = os.pread(fd, end - start, start)
        cut = data.rfind(b"\n")
        if cut >= 0:
            src.partial = data[cut + 1 :]
        else:  # no newline: the line goes on; its last TAIL bytes hold its last states
            src.partial = (src.partial + data if start == src.offset else data)[-self.TAIL :]
        self._moved += end - src.offset
        src.offset = end

    def _send_partial(self, src: LogSource, t: float, lines: bool) -> None:
        """Tell partial sinks about ``src``'s unterminated text if it changed (or lines came)."""
        partial = src.partial
        if partial == src.partial_sent and not (lines and partial):
            return
        if not partial and not src.partial_sent:
            src.partial_sent = partial
            return
        src.partial_sent = partial
        text = _decode_partial(partial)
        for sink in self._partial_sinks:
            try:
                sink(src, text, t)
            except Exception:
                logging.getLogger(__name__).exception("partial log sink failed")

    def _skip_ahead(self, src: LogSource, sinks: list[tuple[LineSink, bool]]) -> int:
        """Jump to the last ``SKIP_KEEP`` bytes of a stream far behind; say so in a line.
        Returns how many bytes are left to its end, as measured here (at most SKIP_OVER)."""
        end = os.fstat(src.fp.fileno()).st_size
        if end - src.offset <= self.SKIP_OVER:
            return max(0, end - src.offset)
        src.fp.seek(end - self.SKIP_KEEP)
        head = src.fp.readline()  # the rest of a line cut in two: skipped with the others
        skipped = end - self.SKIP_KEEP + len(head) - src.offset + len(src.partial)
        self._moved += end - self.SKIP_KEEP + len(head) - src.offset
        src.offset = end - self.SKIP_KEEP + len(head)
        src.partial = b""
        note = f"... {skipped / 1e6:.1f} MB not shown here; every line is in {src.path} ..."
        self._deliver(src, note.encode() + b"\n", sinks)
        return end - src.offset

    def _deliver(self, src: LogSource, whole: bytes, sinks: list[tuple[LineSink, bool]]) -> None:
        # Split on newlines only: a progress bar's \r stays inside its line, as in the file.
        lines = whole.decode("utf-8", "replace").split("\n")[:-1]
        for sink, _ in sinks:
            try:
                sink(src, lines)
            except Exception:  # a sink's failure must not stall the other sinks or workers
                logging.getLogger(__name__).exception("log sink failed")
