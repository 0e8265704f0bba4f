"""``tuilaunch replay RUN_DIR | journal.jsonl``: the dashboard on a recorded run, with a cursor.

:class:`ReplaySource` is a :class:`~tui_launch.tui.sources.live.Source` over a
:class:`~tui_launch.core.journal.timeline.Timeline`: its snapshot is the run's state after the
events up
to the cursor, its clock the cursor's, and its log buffer holds each rank's output up to the
last log mark before the cursor (read from the rank log files). It acts on nothing: every
control call is refused, and the keys that act on a run are hidden (``Needs.REPLAY`` /
``ACTS_ON_RUN`` in :mod:`tui_launch.tui.actions`). The dashboard's
:class:`~tui_launch.tui.modes.ReplayMode` adds the cursor's line (wall clock, event number, play
state) under the header and the replay keys.
"""

from __future__ import annotations

import bisect
import os
import signal
from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING

from tui_launch.core.journal.steps import progress_at
from tui_launch.core.journal.text import LogKey, mark_name
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.logs.tail import LogSource
from tui_launch.core.model.commands import REPLAY_REFUSAL, Command, Outcome
from tui_launch.core.model.events import WorkersStarted
from tui_launch.core.model.layout import rank_log_in, run_dir_of
from tui_launch.core.model.store import RankState, Snapshot

if TYPE_CHECKING:
    from tui_launch.core.diagnosis.stacks import StackDump

# When the cursor moves back (or jumps ahead), each rank's logs are re-read from this many bytes
# before their cuts (newest attempt first): about 800 lines of 80 bytes, read in a few ms.
REREAD = 1 << 16
OPEN_AT_END = 20000  # events: up to this many, the replay opens on the end
END = -1  # a pending jump to the end of the journal, once indexed
# Events back whose log marks order the lines of a jump or a rebuild in the merged view (older
# lines of a rank come first, as one piece): about half an hour of a run's marks.
MERGE_SPAN = 2 * Timeline.CUT_EVERY
# The newest log marks a delivery reads (a jump: about 4 minutes of a run's marks); a stream's
# lines older than the oldest of them come first, in one piece per stream.
MERGE_MARKS = 256
MERGE_EXACT = 64  # the newest marks, by which a delivery always orders the ranks' lines
MERGE_PIECES = 1024  # about how many pieces a delivery cuts the streams' lines into, at most
SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0, 1000.0)


class ReplaySource:
    """A recorded run as the dashboard's source; the cursor is an event count."""

    def __init__(self, timeline: Timeline, cursor: int | None = None) -> None:
        self.timeline = timeline
        self.logs = LogBuffer()
        self.cursor = len(timeline) if cursor is None else cursor
        self.playing = False
        self.speed = 1.0
        self.pending: int | None = None  # where a jump waits for the checkpoints (END: the end)
        self.rebuilt = 0  # how often the log buffer was rebuilt (the pane must rerender)
        self._cut: dict[LogKey, int] = {}
        self._cut_at = -1  # the cursor of self._cut
        self._dirs: dict[int, str] = {}
        self._snap_at = -1
        self._snap = self._state_at(self.cursor)
        self._snap_at = self.cursor
        self._cut_logs()
        self._snap = self._with_log_steps(self._snap)

    # ----------------------------------------------------------------- cursor

    def move(self, cursor: int) -> None:
        """Put the cursor after the first ``cursor`` events (clamped)."""
        cursor = max(0, min(cursor, len(self.timeline)))
        if cursor != self.cursor:
            self.cursor = cursor
            self._snap = self._state_at(cursor)
            self._snap_at = cursor
            self._cut_logs()
            self._snap = self._with_log_steps(self._snap)

    def _with_log_steps(self, snap: Snapshot) -> Snapshot:
        """``snap`` with the step the log at the cursor shows (the journal's progress
        records are 10 s apart: see :func:`~tui_launch.core.journal.steps.progress_at`)."""
        return progress_at(snap, self._attempt_lines)

    def _attempt_lines(self, local_rank: int, stream: str) -> list[str]:
        """The kept lines of ``stream`` of ``local_rank`` in its latest attempt."""
        kept = self.logs.since(0, local_rank)
        for k in range(len(kept) - 1, -1, -1):
            if kept[k][2] == "marker":  # "---- attempt N ----": what follows is N's
                kept = kept[k + 1 :]
                break
        return [text for _, _, s, text in kept if s == stream]

    def _state_at(self, cursor: int) -> Snapshot:
        """The snapshot after the first ``cursor`` events (from the kept checkpoints)."""
        return self.timeline.snapshot(cursor)

    def advance(self, seconds: float) -> None:
        """Play: move the cursor ``seconds`` times the speed along the run's clock."""
        if not self.playing or self.cursor >= len(self.timeline):
            self.playing = False
            return
        self.move(max(self.cursor + 1, self.timeline.at_time(self.now() + seconds * self.speed)))

    @property
    def wall(self) -> float:
        """The cursor's wall-clock time (that of the last event before it)."""
        tl = self.timeline
        return tl.wall[self.cursor - 1] if self.cursor else (tl.wall[0] if len(tl) else 0.0)

    # ------------------------------------------------------------------ logs

    def _log_dir(self, attempt: int) -> str | None:
        if attempt not in self._dirs:
            tl = self.timeline
            for i in tl.indices(WorkersStarted.kind):  # state events only: no full scan
                for _, e in tl.events(i, i + 1):
                    if isinstance(e, WorkersStarted):
                        self._dirs[e.attempt] = self._resolve(e.log_dir)
        return self._dirs.get(attempt)

    def _resolve(self, log_dir: str) -> str:
        """An attempt's directory as the journal names it, found from here: a relative
        ``--log-dir`` gives a path relative to the launcher's working directory, not to a
        replay or attach run elsewhere; the attempt directories sit next to the journal
        (``RUN_DIR/attempt_N``), where it is looked for then."""
        if os.path.isabs(log_dir) or os.path.isdir(log_dir):
            return log_dir
        beside = os.path.join(run_dir_of(os.path.abspath(self.timeline.path)), "")
        candidate = os.path.join(beside, os.path.basename(os.path.normpath(log_dir)))
        return candidate if os.path.isdir(candidate) else log_dir

    def _cut_logs(self) -> None:
        cut = self.timeline.log_offsets(self.cursor)
        onward = all(cut.get(k, -1) >= v for k, v in self._cut.items())
        since = self._cut_at
        if not onward:
            self.logs = LogBuffer()
            self.rebuilt += 1
            self._cut = {}
            since = -1
        # Each rank's newest REREAD bytes at most (newest attempt first): the bounded buffer
        # would drop anything older, and a jump across hours of output or a rebuild of every
        # attempt's files then costs one read of REREAD bytes a rank, not of all of them.
        budget: dict[int, int] = {}
        reads: list[tuple[LogKey, int, int]] = []
        for key in sorted(cut, reverse=True):
            rank, end = key[1], cut[key]
            done = self._cut.get(key)
            left = budget.get(rank, REREAD)
            start = max(0 if done is None else done, end - left, 0)
            if end > start:
                budget[rank] = left - (end - start)
                reads.append((key, start, end))
        self._deliver_merged(reads, since)
        self._cut = cut
        self._cut_at = self.cursor

    def _deliver_merged(self, reads: list[tuple[LogKey, int, int]], since: int) -> None:
        """Deliver the bytes ``reads`` names in the order they were written across ranks:
        each stream's lines are cut at the offsets of the log marks among the events read
        (about once a second while files grow), and the pieces go out mark by mark, so the
        merged view interleaves the ranks at the marks' granularity; each rank's own order
        is kept (its pieces are in file order). ``since``: the cursor of the previous cut
        when this one only adds to it (no mark before it lies inside a read), else -1."""
        if not reads:
            return
        tl, cursor = self.timeline, self.cursor
        first = tl.marks_since(cursor, {key: start for key, start, _ in reads}, MERGE_SPAN)
        if 0 <= since <= cursor:
            first = max(first, since)
        floor = {mark_name(key): start for key, start, _ in reads}
        by_name: dict[bytes, list[tuple[int, int]]] = {name: [] for name in floor}
        for i, offsets in tl.marks(first, cursor, floor, MERGE_MARKS):
            for name, raw in offsets:
                found = by_name.get(name)
                if found is not None:
                    found.append((i, int(raw)))
        # A delivery costs ~15 us a piece in the log buffer: a jump across a chatty run
        # (8 ranks, a line each a second: 6,400 pieces) took 100 ms for that alone. The
        # newest marks (what the merged view shows) stay exact; older ones are thinned so
        # that one delivery makes about MERGE_PIECES pieces (their lines are then ordered
        # at every few marks: still each in its span, each rank in its order).
        used = sorted({i for found in by_name.values() for i, _ in found})
        room = max(MERGE_EXACT, MERGE_PIECES // len(reads))
        if len(used) > room:
            older = used[:-MERGE_EXACT]
            if room > MERGE_EXACT:
                step = -(-len(older) // (room - MERGE_EXACT))
                kept = set(used[-MERGE_EXACT:]) | set(older[::-1][::step])
            else:
                kept = set(used[-room:])
            by_name = {n: [(i, o) for i, o in found if i in kept] for n, found in by_name.items()}
        bounds = {key: by_name[mark_name(key)] for key, _, _ in reads}
        pieces: list[tuple[int, LogKey, int, int]] = []
        texts: dict[LogKey, tuple[LogSource, list[str]]] = {}
        for key, start, end in reads:
            got = self._read(key, start, end)
            if got is None:
                continue
            src, data = got
            skip = 0
            if start != self._cut.get(key, 0):  # the first line was cut in two
                skip = data.find(b"\n") + 1
            lines = data[skip:].decode("utf-8", "replace").split("\n")[:-1]
            texts[key] = (src, lines)
            # Each line's end in the file: a mark's offset (a line boundary) is where the
            # lines written before it end.
            ends = list(accumulate((len(b) + 1 for b in data[skip:].split(b"\n")[:-1]), initial=0))
            base, at = start + skip, 0
            for i, off in bounds[key]:
                upto = bisect.bisect_right(ends, off - base) - 1  # lines ending by the mark
                if upto > at:
                    pieces.append((i, key, at, upto))
                    at = upto
            if at < len(lines):  # written after the last mark looked at (or a long jump)
                pieces.append((cursor, key, at, len(lines)))
        pieces.sort(key=lambda p: (p[0], p[1]))  # stable: a stream's pieces stay in order
        k = 0
        while k < len(pieces):  # one delivery for a stream's run of consecutive pieces
            _, key, lo, hi = pieces[k]
            k += 1
            while k < len(pieces) and pieces[k][1] == key:
                hi = pieces[k][3]
                k += 1
            src, lines = texts[key]
            self.logs(src, lines[lo:hi])

    def _read(self, key: LogKey, start: int, end: int) -> tuple[LogSource, bytes] | None:
        """The bytes ``start:end`` of ``key``'s log file, with its source (None: unreadable)."""
        attempt, rank, stream = key
        d = self._log_dir(attempt)
        if d is None:
            return None
        path = rank_log_in(d, rank, stream)
        try:
            with open(path, "rb") as fp:
                fp.seek(start)
                data = fp.read(end - start)
        except OSError:
            return None
        return LogSource(attempt, rank, rank, stream, path, console=False, prefix=None), data

    # ---------------------------------------------------------------- Source

    def snapshot(self) -> Snapshot:
        """The run's state after the events up to the cursor."""
        return self._snap

    def now(self) -> float:
        """The cursor's time on the run's clock."""
        tl = self.timeline
        return tl.mono[self.cursor - 1] if self.cursor else (tl.mono[0] if len(tl) else 0.0)

    def agent_lines(self) -> list[str]:
        """None: the agent log is a file of the run directory (agent.log)."""
        return []

    def send(self, cmd: Command) -> Outcome:
        """Refused, whatever the command: a replay acts on nothing."""
        return Outcome(False, REPLAY_REFUSAL)

    def stack_dump(self, path: str) -> StackDump | None:
        """A dump the run saved (read from its file; None: unreadable)."""
        from tui_launch.core.diagnosis.stacks.save import (
            load as load_stacks,  # only once one is shown
        )

        try:
            return load_stacks(path)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def is_stopped(self, local_rank: int) -> bool:
        """Whether the rank is stopped at the cursor."""
        row = self._snap.rank(local_rank)
        return row is not None and row.state == RankState.STOPPED

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Nothing to stop."""

    def wait(self, timeout: float | None = None) -> int | None:
        """0 at once: leaving a replay is the replay's success."""
        return 0

    def on_finished(self, callback: Callable[[], None]) -> None:
        """Never called: a replay does not finish by itself."""

    @property
    def done(self) -> bool:
        """True: quitting a replay stops nothing (and asks nothing)."""
        return True
