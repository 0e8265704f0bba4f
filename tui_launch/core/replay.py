"""A journal as a timeline: the run's snapshot, and how far each log had grown, at any event.

:class:`Timeline` opens a ``journal.jsonl`` (finished, still written, or cut off mid-line by a
killed launcher) without parsing it: one pass over the bytes records where each whole line
starts and ends, with its ``kind``, ``mono`` and ``wall`` read from the fixed prefix every
journal line has (``{"seq": N, "kind": K, "mono": M, "wall": W, ...``). A line without its
newline (a write cut short) ends the timeline: replay goes up to the last whole event.

The state after the first ``n`` events, :meth:`Timeline.snapshot`, is ``store.reduce`` of
those events. Snapshots are kept at checkpoints (every ``every`` events, 250 by default) as
they are computed, so a cursor anywhere re-reduces at most one checkpoint's worth of events
once the checkpoints up to it exist; :meth:`Timeline.precompute` fills them (a replay does it
in the background).
``log_mark`` events change no state: they are never parsed to reduce, only to cut logs.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
from array import array
from collections.abc import Iterator

from tui_launch.core.events import Event, LogMark, from_dict
from tui_launch.core.store import Snapshot, reduce

# The prefix of every journal line: its kind, mono and wall.
_PREFIX = re.compile(
    rb'\{"seq": \d+, "kind": "([a-z_]+)", "mono": ([-+0-9.eE]+), "wall": ([-+0-9.eE]+)'
)
MARK = LogMark.kind
# Where the replay's ]/[ keys stop: a failure, a restart, an injected fault, the end.
MOMENTS = frozenset({"attempt_failed", "restart", "injection", "run_finished"})
LogKey = tuple[int, int, str]  # (attempt, local rank, stream)


class Timeline:
    """The events of one journal, indexed by position, with snapshots on demand.

    Args:
        path: the journal file.
        every: events between two kept snapshots (checkpoints).
    """

    CHUNK = 1 << 24

    def __init__(self, path: str, every: int = 250) -> None:
        self.path = path
        self.every = every
        self.starts = array("q")
        self.ends = array("q")
        self.mono = array("d")
        self.wall = array("d")
        self.kinds: list[str] = []
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._scanned = 0  # bytes indexed so far
        self._lock = threading.RLock()
        self._snaps: dict[int, Snapshot] = {0: Snapshot()}
        self._marks: dict[int, dict[LogKey, int]] = {0: {}}
        self.refresh()

    def close(self) -> None:
        """Release the journal file."""
        os.close(self._fd)

    def __len__(self) -> int:
        return len(self.kinds)

    def refresh(self) -> int:
        """Index what was appended since the last call (a run still writing); new count."""
        with self._lock:
            intern = {k: k for k in set(self.kinds)}
            while True:
                chunk = os.pread(self._fd, self.CHUNK, self._scanned)
                last = chunk.rfind(b"\n") + 1
                if not last:
                    break  # no whole line yet: one being written, or cut off
                base = self._scanned
                pos = base
                for line in chunk[:last].split(b"\n")[:-1]:
                    m = _PREFIX.match(line)
                    if m is not None:
                        kind = m.group(1).decode()
                        self.kinds.append(intern.setdefault(kind, kind))
                        self.starts.append(pos)
                        self.ends.append(pos + len(line) + 1)
                        self.mono.append(float(m.group(2)))
                        self.wall.append(float(m.group(3)))
                    pos += len(line) + 1
                self._scanned = base + last
            return len(self.kinds)

    # ------------------------------------------------------------------ events

    def events(self, start: int, stop: int, marks: bool = False) -> Iterator[tuple[int, Event]]:
        """Events ``start <= i < stop`` as ``(i, e)``: all but the log marks, or (``marks``)
        the log marks only."""
        i = start
        while i < stop:
            j = min(stop, i + 4096)
            data = os.pread(self._fd, self.ends[j - 1] - self.starts[i], self.starts[i])
            base = self.starts[i]
            for k in range(i, j):
                if (self.kinds[k] == MARK) != marks:  # marks only, or everything but marks
                    continue
                line = data[self.starts[k] - base : self.ends[k] - base]
                try:
                    yield k, from_dict(json.loads(line))
                except (KeyError, TypeError, ValueError):
                    continue  # a kind this version does not know
            i = j

    # --------------------------------------------------------------- snapshots

    def snapshot(self, n: int) -> Snapshot:
        """The snapshot after the first ``n`` events."""
        n = max(0, min(n, len(self)))
        with self._lock:
            base = self._ensure(n // self.every * self.every)
            snap = self._snaps[base]
            for _, e in self.events(base, n):
                snap = reduce(snap, e)
            return snap

    def _ensure(self, target: int) -> int:
        """Compute the checkpoints up to ``target``; return ``target``."""
        if target in self._snaps:
            return target
        have = max(c for c in self._snaps if c <= target)
        snap = self._snaps[have]
        for c in range(have, target, self.every):
            for _, e in self.events(c, c + self.every):
                snap = reduce(snap, e)
            self._snaps[c + self.every] = snap
        return target

    def precompute(self, stop: threading.Event | None = None) -> None:
        """Compute every checkpoint (from a background thread; ``stop`` ends it early)."""
        last = len(self) // self.every * self.every
        c = 0
        while c < last and not (stop is not None and stop.is_set()):
            c += self.every
            with self._lock:  # one checkpoint at a time: the UI thread gets the lock between
                self._ensure(c)
                self.log_offsets(c)

    # --------------------------------------------------------------- log cuts

    def log_offsets(self, n: int) -> dict[LogKey, int]:
        """How far each rank's log file had been written (whole lines) by event ``n``."""
        n = max(0, min(n, len(self)))
        with self._lock:
            have = max(c for c in self._marks if c <= n)
            offsets = dict(self._marks[have])
            step = self.every
            for i, e in self.events(have, n, marks=True):
                if isinstance(e, LogMark):
                    for attempt, rank, stream, offset in e.offsets:
                        offsets[(attempt, rank, stream)] = offset
                if (i + 1) % step == 0 and (i + 1) not in self._marks:
                    self._marks[i + 1] = dict(offsets)
            return offsets

    # ------------------------------------------------------------------ cursor

    def at_time(self, mono: float) -> int:
        """The cursor (event count) at clock ``mono``: every event up to that time."""
        return bisect.bisect_right(self.mono, mono)

    def next_moment(self, n: int, forward: bool = True) -> int:
        """The cursor just after the next (or previous) failure, restart or injection."""
        if forward:
            for i in range(n, len(self)):
                if self.kinds[i] in MOMENTS:
                    return i + 1
            return len(self)
        for i in range(n - 2, -1, -1):
            if self.kinds[i] in MOMENTS:
                return i + 1
        return 0
