"""A journal as a timeline: the run's snapshot, and how far each log had grown, at any event.

:class:`Timeline` opens a ``journal.jsonl`` (finished, still written, or cut off mid-line by a
killed launcher) without parsing it. An event is a whole line with the prefix every journal
line has (``{"seq": N, "kind": K, "mono": M, "wall": W, ...``); a line without its newline (a
write cut short) ends the timeline: replay goes up to the last whole event.

**The index is sparse, so that a day-long journal opens in about a second.** Most lines of a
long journal are ``log_mark`` events (how far each rank's log had grown, about once a second),
which change no state. Opening reads the file in 16 MB chunks and, with C-level passes only
(``bytes.count`` and one regex ``finditer``), records:

- *blocks* of about 64 kB of whole lines: their byte range, the number of their first event,
  and that event's ``mono``;
- every *state* event (anything but a log mark): its number, byte range, kind, mono and wall.

A chunk is checked as it is indexed (every line has the prefix, and each is a state event or
a log mark); one that is not (a line without the prefix, which is no event) is indexed line by
line instead, its blocks stopping around such lines. A mark's own kind, ``mono`` and ``wall``
are read back on demand from its block (a block is parsed as a whole and a few are cached):
``kinds``, ``mono`` and ``wall`` are sequences over every event that do so.

The state after the first ``n`` events, :meth:`Timeline.snapshot`, is ``store.reduce`` of the
state events among them, from the last kept snapshot: one is kept every ``every`` state events
(checkpoints). How far each log had grown by event ``n``, :meth:`Timeline.log_offsets`, folds
the marks from the last kept cut (one every :attr:`Timeline.CUT_EVERY` events): the marks'
bytes, with the state lines among them cut out, go through one regex ``findall`` and one
``dict.update`` (the last offset of each stream wins) with no JSON parsed and no event built.
:meth:`Timeline.precompute` fills both kinds of checkpoint (a replay does it in the background,
on ``tuilaunch-replay`` or ``tuilaunch-attach``, started by ``apps/replay.py`` and
``apps/attach.py`` once the first frame is up); until then a cursor move computes the
checkpoints up to its place, and a jump past the indexed frontier waits for it.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from itertools import pairwise

from tui_launch.core.journal.text import (
    MARK,
    MARK_KIND,
    OFFSET,
    PREFIX,
    STATE,
    Block,
    Column,
    LogKey,
    Names,
    fold_marks,
    log_key,
    mark_name,
)
from tui_launch.core.model.events import (
    AttemptFailed,
    Event,
    Injected,
    Restart,
    RunFinished,
    from_dict,
)
from tui_launch.core.model.store import Snapshot, reduce

# Where the replay's ]/[ keys stop: a failure, a restart, an injected fault, the end. By the
# types' kinds, as the index knows a state event (it parses none to find them).
MOMENTS = frozenset(t.kind for t in (AttemptFailed, Restart, Injected, RunFinished))


class Timeline:
    """The events of one journal, indexed by position, with snapshots on demand.

    Args:
        path: the journal file.
        every: state events (all but log marks) between two kept snapshots (checkpoints).
    """

    CHUNK = 1 << 24  # bytes read at once to index
    BLOCK = 1 << 16  # bytes of lines in one block
    CUT_EVERY = 1024  # events between two kept log cuts
    SPAN = 1 << 23  # bytes read at once when the lines wanted lie close together
    CACHED = 16  # parsed blocks kept

    def __init__(self, path: str, every: int = 8, index: bool = True) -> None:
        self.path = path
        self.every = every
        self._names = Names()
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._lock = threading.RLock()
        self._scanned = 0  # bytes indexed so far
        self.indexed = False  # whether the last refresh reached the end of the file
        self._count = 0  # events indexed so far
        # Blocks: byte range, first event, first event's mono.
        self._block_start = array("q")
        self._block_end = array("q")
        self._block_first = array("q")
        self._block_mono = array("d")
        self._cache: OrderedDict[int, Block] = OrderedDict()
        # State events: number, byte range, kind, mono, wall.
        self.states = array("q")
        self._state_start = array("q")
        self._state_end = array("q")
        self._state_kind: list[str] = []
        self._state_mono = array("d")
        self._state_wall = array("d")
        self.kinds: Column[str] = Column(self, "kinds")
        self.mono: Column[float] = Column(self, "mono")
        self.wall: Column[float] = Column(self, "wall")
        self._snaps: list[Snapshot] = [Snapshot()]  # [k]: after the first k*every states
        self._cuts: list[dict[LogKey, int]] = [{}]  # [k]: after the first k*CUT_EVERY events
        self.refresh(None if index else 1)

    def close(self) -> None:
        """Release the journal file."""
        os.close(self._fd)

    def __len__(self) -> int:
        return self._count

    def size(self) -> int:
        """The journal file's size now (one ``fstat``: a follower's cheap "anything new?")."""
        return os.fstat(self._fd).st_size

    # ------------------------------------------------------------------- index

    def refresh(self, chunks: int | None = None) -> int:
        """Index what was appended since the last call (a run still writing), or only the
        next ``chunks`` chunks of it; the new count. :attr:`indexed` says whether the end of
        the file (as it was then) was reached."""
        with self._lock:
            size = self.CHUNK
            self.indexed = False
            while True:
                if chunks is not None and chunks <= 0:
                    return self._count
                chunk = os.pread(self._fd, size, self._scanned)
                last = chunk.rfind(b"\n") + 1
                if not last and len(chunk) == size:
                    size *= 2  # one line longer than a chunk
                    continue
                if not last:
                    break  # no whole line yet: one being written, or cut off
                size = self.CHUNK
                if not self._index_fast(chunk, last):
                    self._index_slow(chunk, last)
                self._scanned += last
                if len(chunk) < size:
                    break  # the end of the file, as it is now
                chunks = None if chunks is None else chunks - 1
            self.indexed = True
            return self._count

    def _index_fast(self, chunk: bytes, last: int) -> bool:
        """Index ``chunk[:last]`` if every line is a state event or a log mark (False, and
        nothing indexed, if not). Each byte is counted once: newlines between the blocks'
        and the state lines' starts, in order."""
        found = [
            m for m in STATE.finditer(chunk, 0, last) if not m.start() or chunk[m.start() - 1] == 10
        ]
        blocks = [0]  # block starts: about BLOCK bytes apart, at line starts
        while blocks[-1] < last:
            blocks.append(chunk.find(b"\n", min(blocks[-1] + self.BLOCK, last) - 1) + 1)
        number: dict[int, int] = {}  # chunk position -> lines before it
        at, lines = 0, 0
        for pos in sorted({*blocks, *(m.start() for m in found)}):
            lines += chunk.count(b"\n", at, pos)
            number[pos] = lines
            at = pos
        if chunk.count(MARK_KIND, 0, last) + len(found) != lines:
            return False  # a line that is neither: index line by line
        base, first = self._scanned, self._count
        for m in found:
            end = chunk.index(b"\n", m.start()) + 1
            self._add_state(first + number[m.start()], base + m.start(), base + end, m)
        for pos, end in pairwise(blocks):
            head = PREFIX.match(chunk, pos)
            mono = float(head.group(2)) if head is not None else 0.0
            self._add_block(base + pos, base + end, first + number[pos], mono)
        self._count = first + lines
        return True

    def _index_slow(self, chunk: bytes, last: int) -> None:
        """Index ``chunk[:last]`` line by line: a line without the prefix is no event, and
        no block spans it."""
        base = self._scanned
        pos = 0
        block = -1  # the chunk position where the open block starts (-1: none)
        for line in chunk[:last].split(b"\n")[:-1]:
            end = pos + len(line) + 1
            m = PREFIX.match(line)
            if m is None:
                block = -1
            else:
                if block < 0 or pos - block >= self.BLOCK:
                    block = pos
                    self._add_block(base + pos, base + end, self._count, float(m.group(2)))
                else:
                    self._block_end[-1] = base + end
                if m.group(1) != MARK.encode():
                    self._add_state(self._count, base + pos, base + end, m)
                self._count += 1
            pos = end

    def _add_block(self, start: int, end: int, first: int, mono: float) -> None:
        if self._block_end and self._block_end[-1] == start and first > self._block_first[-1]:
            size = self._block_end[-1] - self._block_start[-1]
            if size + (end - start) <= self.BLOCK:  # a small block of a live journal grows
                self._block_end[-1] = end
                self._cache.pop(len(self._block_end) - 1, None)
                return
        self._block_start.append(start)
        self._block_end.append(end)
        self._block_first.append(first)
        self._block_mono.append(mono)

    def _add_state(self, number: int, start: int, end: int, m: re.Match[bytes]) -> None:
        self.states.append(number)
        self._state_start.append(start)
        self._state_end.append(end)
        self._state_kind.append(self._names[m.group(1)])
        self._state_mono.append(float(m.group(2)))
        self._state_wall.append(float(m.group(3)))

    # ---------------------------------------------------------------- blocks

    def _block(self, b: int) -> Block:
        with self._lock:
            block = self._cache.get(b)
            if block is None:
                start = self._block_start[b]
                data = os.pread(self._fd, self._block_end[b] - start, start)
                block = self._cache[b] = Block(data, start, self._names)
                if len(self._cache) > self.CACHED:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(b)
            return block

    def _where(self, i: int) -> tuple[Block, int]:
        """Event ``i``'s block, parsed, and its line there."""
        b = bisect.bisect_right(self._block_first, i) - 1
        return self._block(b), i - self._block_first[b]

    def field(self, i: int, field: str) -> object:
        """Field ``field`` (``kinds``, ``mono`` or ``wall``) of event ``i``."""
        k = bisect.bisect_left(self.states, i)
        if k < len(self.states) and self.states[k] == i:  # a state event: no block needed
            if field == "kinds":
                return self._state_kind[k]
            return (self._state_mono if field == "mono" else self._state_wall)[k]
        block, line = self._where(i)
        return getattr(block, field)[line]

    def first_state(self, kind: str, start: int, stop: int) -> int | None:
        """The first state event of ``kind`` in ``[start, stop)`` (from the state list)."""
        for k in range(bisect.bisect_left(self.states, start), len(self.states)):
            if self.states[k] >= stop:
                break
            if self._state_kind[k] == kind:
                return self.states[k]
        return None

    def _offset(self, i: int) -> int:
        """Where event ``i`` starts in the file (``len(self)``: where the last one ends)."""
        if i >= self._count:
            return self._block_end[-1] if self._block_end else 0
        block, line = self._where(i)
        return block.bounds[line]

    # ------------------------------------------------------------------ events

    def _state_lines(self, a: int, b: int) -> Iterator[tuple[int, bytes]]:
        """The lines of the state events ``states[a:b]`` as ``(event, line)``, read in spans."""
        k = a
        starts, ends = self._state_start, self._state_end
        while k < b:
            first = starts[k]
            # As many of the next lines as end within SPAN bytes (at least one).
            j = max(k + 1, bisect.bisect_right(ends, first + self.SPAN, k, b))
            if 4 * (j - k) < self.states[j - 1] - self.states[k] + 1:  # sparse: one by one
                for s in range(k, j):
                    yield self.states[s], os.pread(self._fd, ends[s] - starts[s], starts[s])
            else:
                data = os.pread(self._fd, ends[j - 1] - first, first)
                for s in range(k, j):
                    yield self.states[s], data[starts[s] - first : ends[s] - first]
            k = j

    def _parse(self, a: int, b: int) -> Iterator[tuple[int, Event]]:
        """The state events ``states[a:b]``, parsed (a kind this version does not know is
        skipped)."""
        for i, line in self._state_lines(a, b):
            try:
                yield i, from_dict(json.loads(line))
            except (KeyError, TypeError, ValueError):
                continue

    def events(self, start: int, stop: int, marks: bool = False) -> Iterator[tuple[int, Event]]:
        """Events ``start <= i < stop`` as ``(i, e)``: all but the log marks, or (``marks``)
        the log marks only."""
        if not marks:
            a = bisect.bisect_left(self.states, start)
            yield from self._parse(a, bisect.bisect_left(self.states, stop))
            return
        for i, line in self._mark_lines(start, stop):
            try:
                yield i, from_dict(json.loads(line))
            except (KeyError, TypeError, ValueError):
                continue

    def _mark_lines(self, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
        """The log marks' lines among events ``start <= i < stop``, one by one."""
        i = start
        while i < min(stop, self._count):
            b = bisect.bisect_right(self._block_first, i) - 1
            block, first = self._block(b), self._block_first[b]
            base = block.bounds[0]
            data = os.pread(self._fd, block.bounds[-1] - base, base)
            for line in range(i - first, min(stop - first, len(block.kinds))):
                if block.kinds[line] == MARK:
                    lo, hi = block.bounds[line] - base, block.bounds[line + 1] - base
                    yield first + line, data[lo:hi]
            i = first + len(block.kinds)

    def indices(self, kind: str) -> list[int]:
        """Positions of the (state) events of ``kind``."""
        return [self.states[k] for k, name in enumerate(self._state_kind) if name == kind]

    # --------------------------------------------------------------- snapshots

    def snapshot(self, n: int) -> Snapshot:
        """The snapshot after the first ``n`` events."""
        n = max(0, min(n, len(self)))
        with self._lock:
            j = bisect.bisect_left(self.states, n)  # state events among the first n
            k = j // self.every
            self._ensure(k)
            snap = self._snaps[k]
            for _, e in self._parse(k * self.every, j):
                snap = reduce(snap, e)
            return snap

    def _ensure(self, k: int) -> None:
        """Compute the snapshot checkpoints up to the ``k``-th."""
        while len(self._snaps) <= k:
            have = len(self._snaps) - 1
            snap = self._snaps[have]
            for _, e in self._parse(have * self.every, (have + 1) * self.every):
                snap = reduce(snap, e)
            self._snaps.append(snap)

    def ready(self, n: int) -> bool:
        """Whether the state and log cut at cursor ``n`` are answered from kept checkpoints
        (a few ms), not by computing the ones before it."""
        j = bisect.bisect_left(self.states, n)
        return len(self._snaps) > j // self.every and len(self._cuts) > n // self.CUT_EVERY

    def frontier(self) -> int:
        """The cursor up to which :meth:`ready` holds (what the precompute has reached)."""
        snaps = len(self._snaps) * self.every
        at_snap = self.states[snaps] if snaps < len(self.states) else self._count
        return min(at_snap, len(self._cuts) * self.CUT_EVERY, self._count)

    def precompute(self, stop: threading.Event | None = None) -> None:
        """Index the rest of the file, then compute every checkpoint (from a background
        thread; ``stop`` ends it early).

        One chunk or checkpoint at a time under the lock, so the UI thread gets the lock in
        between.
        """
        while not self.indexed and not (stop is not None and stop.is_set()):
            self.refresh(1)
        while not (stop is not None and stop.is_set()):
            with self._lock:
                # Both kinds advance together along the journal: a cursor behind both
                # frontiers is answered from checkpoints.
                snaps = len(self._snaps) <= len(self.states) // self.every
                cuts = len(self._cuts) <= self._count // self.CUT_EVERY
                at_snap = self.states[len(self._snaps) * self.every - 1] if snaps else -1
                if snaps and (not cuts or at_snap < len(self._cuts) * self.CUT_EVERY):
                    self._ensure(len(self._snaps))
                elif cuts:
                    self._ensure_cut(len(self._cuts))
                else:
                    return

    # --------------------------------------------------------------- log cuts

    def log_offsets(self, n: int) -> dict[LogKey, int]:
        """How far each rank's log file had been written (whole lines) by event ``n``."""
        n = max(0, min(n, len(self)))
        with self._lock:
            k = n // self.CUT_EVERY
            self._ensure_cut(k)
            offsets = dict(self._cuts[k])
            offsets.update(self._fold_marks(k * self.CUT_EVERY, n))
            return offsets

    def _ensure_cut(self, k: int) -> None:
        """Compute the log-cut checkpoints up to the ``k``-th."""
        while len(self._cuts) <= k:
            have = len(self._cuts) - 1
            cut = dict(self._cuts[have])
            cut.update(self._fold_marks(have * self.CUT_EVERY, (have + 1) * self.CUT_EVERY))
            self._cuts.append(cut)

    def _fold_marks(self, a: int, b: int) -> dict[LogKey, int]:
        """The last offset of each stream in the log marks among events ``a <= i < b``."""
        if a >= b:
            return {}
        start, end = self._offset(a), self._offset(b)
        data = os.pread(self._fd, end - start, start)
        # The state lines among them cut out: what is left is log marks only.
        s0, s1 = bisect.bisect_left(self.states, a), bisect.bisect_left(self.states, b)
        pieces, at = [], 0
        for s in range(s0, s1):
            pieces.append(data[at : self._state_start[s] - start])
            at = self._state_end[s] - start
        pieces.append(data[at:])
        marks = b"".join(pieces)
        raw = fold_marks(marks, (b - a) - (s1 - s0))
        if raw is None:  # not the writer's usual layout (or lines that are no event)
            raw = {}
            for _, line in self._mark_lines(a, b):
                try:
                    offsets = json.loads(line)["offsets"]
                except (KeyError, TypeError, ValueError):
                    continue
                for attempt, rank, stream, offset in offsets:
                    raw[mark_name((attempt, rank, stream))] = b"%d" % offset
        return {log_key(key): int(value) for key, value in raw.items()}

    def marks(
        self, start: int, stop: int, floor: dict[bytes, int], limit: int | None = None
    ) -> list[tuple[int, list[tuple[bytes, bytes]]]]:
        """The log marks among events ``start <= i < stop`` that matter above ``floor``, in
        journal order, as ``(i, [(stream, offset), ...])``: how far each stream that moved
        since the mark before had grown. A stream is named by its bytes in the journal
        (:func:`mark_name`); ``floor`` maps the streams wanted to the offset below which
        their bytes are not wanted. Read backwards from ``stop``, stopping once every
        stream's mark at or below its floor was seen, or after the newest ``limit`` marks.
        One regex pass a line, no JSON. The merged log orders the ranks' lines by them."""
        out: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        wanted = dict(floor)
        i = min(stop, len(self))
        while i > start and wanted and (limit is None or len(out) < limit):
            b = bisect.bisect_right(self._block_first, i - 1) - 1
            first = max(start, self._block_first[b])
            for at, line in reversed(list(self._mark_lines(first, i))):
                if limit is not None and len(out) >= limit:
                    break
                offsets = OFFSET.findall(line)
                out.append((at, offsets))
                for name, off in offsets:
                    low = wanted.get(name)
                    if low is not None and int(off) <= low:
                        del wanted[name]  # the marks before this one lie below its floor
            i = first
        out.reverse()
        return out

    def marks_since(self, stop: int, floor: dict[LogKey, int], limit: int) -> int:
        """Where to start reading :meth:`marks` so that every stream's marks above
        ``floor[stream]`` (the bytes about to be shown) are seen, up to event ``stop``: the
        latest kept log cut at or below every floor (at most ``limit`` events back; older
        lines are shown in one piece per stream)."""
        with self._lock:
            k = max(0, min(stop, len(self)) // self.CUT_EVERY)
            self._ensure_cut(k)
            lowest = max(0, (stop - limit) // self.CUT_EVERY)
            while k > lowest and any(self._cuts[k].get(key, 0) > f for key, f in floor.items()):
                k -= 1
            return k * self.CUT_EVERY

    # ------------------------------------------------------------------ cursor

    def at_time(self, mono: float) -> int:
        """The cursor (event count) at clock ``mono``: every event up to that time."""
        with self._lock:
            b = bisect.bisect_right(self._block_mono, mono) - 1
            if b < 0:
                return 0
            block = self._block(b)
            return self._block_first[b] + bisect.bisect_right(block.mono, mono)

    def next_moment(self, n: int, forward: bool = True) -> int:
        """The cursor just after the next (or previous) failure, restart or injection."""
        states, kinds = self.states, self._state_kind
        if forward:
            for s in range(bisect.bisect_left(states, n), len(states)):
                if kinds[s] in MOMENTS:
                    return states[s] + 1
            return len(self)
        for s in range(bisect.bisect_left(states, n - 1) - 1, -1, -1):
            if kinds[s] in MOMENTS:
                return states[s] + 1
        return 0
