"""The journal's text, read without JSON: line prefixes, parsed blocks, log-mark folds.

Helpers of :mod:`tui_launch.core.journal.timeline`'s
:class:`~tui_launch.core.journal.timeline.Timeline`: the
regexes for a journal line's fixed prefix (``{"seq": N, "kind": K, "mono": M, "wall": W``)
and a log mark's offsets as :mod:`json` writes them, a block of lines parsed at once
(:class:`Block`), :func:`fold_marks`, which folds log marks' bytes into the last offset of
each stream, mostly without parsing them, :func:`mark_name`, a stream's name in a mark, and
:class:`Column`, one field of every event as a sequence.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from array import array
from collections.abc import Sequence
from itertools import accumulate, repeat
from typing import Generic, Protocol, TypeVar, cast, overload

from tui_launch.core.model.events import LogMark

MARK = LogMark.kind
LogKey = tuple[int, int, str]  # (attempt, local rank, stream)

# The prefix of every journal line: its kind, mono and wall.
PREFIX = re.compile(
    rb'\{"seq": \d+, "kind": "([a-z_]+)", "mono": ([-+0-9.eE]+), "wall": ([-+0-9.eE]+)'
)
# A state event's prefix (anything but a log mark); a match must start a line.
STATE = re.compile(
    rb'\{"seq": \d+, "kind": "(?!' + MARK.encode() + rb'")([a-z_]+)", '
    rb'"mono": ([-+0-9.eE]+), "wall": ([-+0-9.eE]+)'
)
MARK_KIND = b', "kind": "' + MARK.encode() + b'", "mono": '
# One entry of a log mark's offsets, as json.dumps writes it: the key's text and the offset.
# (A stream name with a quote or a backslash fails the count check: the marks are parsed.)
OFFSET = re.compile(rb'\[(\d+, \d+, "[^"\\]*"), (\d+)\]')


class Names(dict[bytes, str]):
    """Kind names, decoded and interned once each."""

    def __missing__(self, key: bytes) -> str:
        name = self[key] = key.decode()
        return name


class Block:
    """One block's events, parsed: where each line starts, and its kind, mono and wall."""

    __slots__ = ("bounds", "kinds", "mono", "wall")

    def __init__(self, data: bytes, base: int, names: Names) -> None:
        lines = data.split(b"\n")
        lines.pop()  # the empty tail after the last newline
        # Byte offsets: bounds[k] is where line k starts, bounds[-1] where the block ends.
        self.bounds = array(
            "q", accumulate(map(operator.add, map(len, lines), repeat(1)), initial=base)
        )
        self.kinds: list[str] = []
        self.mono = array("d")
        self.wall = array("d")
        for m in map(PREFIX.match, lines):
            if m is None:  # validated at open: only a mark with an odd clock gets here
                self.kinds.append(MARK)
                self.mono.append(self.mono[-1] if self.mono else 0.0)
                self.wall.append(self.wall[-1] if self.wall else 0.0)
                continue
            self.kinds.append(names[m.group(1)])
            self.mono.append(float(m.group(2)))
            self.wall.append(float(m.group(3)))


@functools.lru_cache(maxsize=64)
def _other_stream(keys: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A regex for an entry of a log mark whose stream is not one of ``keys``."""
    return re.compile(rb"\[(?!(?:" + b"|".join(map(re.escape, keys)) + rb"), )\d")


def fold_marks(marks: bytes, count: int, tail: int = 64) -> dict[bytes, bytes] | None:
    """Fold ``count`` log-mark lines (``marks``, in journal order) into the last offset of each
    stream, as the journal's text; None if they are not laid out as the writer writes them.

    Only the last ``tail`` lines are parsed when the lines before them name no stream that
    the tail does not (the tail then has the last word on each): one regex ``search`` for an
    entry of another stream checks that, creating no object per entry. Otherwise every entry
    is parsed (a regex ``findall`` into one dict).
    """
    cut = len(marks)
    for _ in range(min(tail, count)):
        cut = marks.rfind(b"\n", 0, cut - 1) + 1 if cut > 1 else 0
    head, last = marks[:cut], marks[cut:]
    found = OFFSET.findall(last)
    lines_last = last.count(b"\n")
    if len(found) != last.count(b"]") - lines_last:
        return None
    raw = dict(found)  # in journal order: the last mark of each stream wins
    if raw and _other_stream(tuple(raw)).search(head) is None:
        return raw  # the lines before the tail only move streams the tail moves later
    found = OFFSET.findall(marks)
    if len(found) != marks.count(b"]") - count:
        return None
    return dict(found)


def log_key(raw: bytes) -> LogKey:
    attempt, rank, stream = raw.split(b", ", 2)
    return int(attempt), int(rank), json.loads(stream)


def mark_name(key: LogKey) -> bytes:
    """How a log mark names the stream ``key`` (``b'0, 1, "stdout"'``)."""
    attempt, rank, stream = key
    return f"{attempt}, {rank}, {json.dumps(stream)}".encode()


T = TypeVar("T")


class _Events(Protocol):
    """What a :class:`Column` reads of its timeline."""

    def __len__(self) -> int: ...
    def field(self, i: int, field: str) -> object: ...
    def first_state(self, kind: str, start: int, stop: int) -> int | None: ...


class Column(Sequence[T], Generic[T]):
    """One field of every event (``kinds``, ``mono``, ``wall``), read from its block."""

    def __init__(self, events: _Events, field: str) -> None:
        self._events = events
        self._field = field

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self._events)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("event index out of range")
        return cast(T, self._events.field(i, self._field))

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        """The first event from ``start`` with this value (state kinds: from the state list)."""
        stop = len(self._events) if stop is None else stop
        if self._field == "kinds" and value != MARK:
            found = self._events.first_state(str(value), start, stop)
            if found is None:
                raise ValueError(f"{value!r} is not in the journal")
            return found
        return super().index(value, start, stop)
