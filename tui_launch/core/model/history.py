"""An append-only sequence whose snapshots share one buffer: what a snapshot's lists of events are.

The snapshot is immutable, so a reducer that kept a tuple of every notice had to copy it to add
one: a run with ``N`` notices cost ``N²/2`` copies (a million never finished). A
:class:`History` is a read-only view, ``[start, stop)``, of a list that only grows: adding an
item to the newest view appends to that list in place and returns a new view one longer, so
each append costs O(1) and every earlier snapshot still sees exactly what it saw. Adding to an
older view (a replay that jumps back and folds forward from a checkpoint) copies that view's
items once into a list of its own, which the new branch then grows.

``keep`` bounds what a view shows (the newest ``keep`` items: the stack dumps a dashboard lists)
without copying either; the list is compacted once its dropped head outweighs the window, so
memory stays proportional to what is shown and each append stays O(1) amortized.

Readers see a :class:`~collections.abc.Sequence`: ``len``, indexing, iteration, ``in``; a slice
is a tuple; it equals a tuple or another history with the same items.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

T = TypeVar("T")

COMPACT_AFTER = 1024  # dropped items a buffer keeps at most before a compaction is considered


class _Buffer:
    """The list that views share; the lock makes "at the tip? then append" one step, since
    replays fold on more than one thread (a dashboard's jump, the checkpoint thread)."""

    __slots__ = ("items", "lock")

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.lock = threading.Lock()


class History(Sequence[T]):
    """An immutable sequence of events; :meth:`appended` and :meth:`extended` make the next
    one in O(1) (amortized) per item, sharing storage with this one."""

    __slots__ = ("_buf", "_start", "_stop")

    def __init__(self, items: Iterable[T] = ()) -> None:
        data = list(items)
        self._buf = _Buffer(data)
        self._start = 0
        self._stop = len(data)

    @classmethod
    def of(cls, items: Sequence[T]) -> History[T]:
        """``items`` as a history (itself when it is one already: no copy)."""
        return items if isinstance(items, History) else cls(items)

    @classmethod
    def _view(cls, buf: _Buffer, start: int, stop: int) -> History[T]:
        view: History[T] = cls.__new__(cls)
        view._buf, view._start, view._stop = buf, start, stop
        return view

    def appended(self, item: T, keep: int | None = None) -> History[T]:
        """This history with ``item`` after its last (only the newest ``keep`` shown)."""
        return self.extended((item,), keep)

    def extended(self, items: Iterable[T], keep: int | None = None) -> History[T]:
        """This history with ``items`` after its last (only the newest ``keep`` shown)."""
        new = list(items)
        if not new:
            return self if keep is None or len(self) <= keep else self._window(self._buf, keep)
        buf = self._buf
        # An empty view never grows a buffer in place: the empty default every new snapshot
        # starts from would otherwise keep the first run's items alive.
        if self._stop > self._start:
            with buf.lock:
                if len(buf.items) == self._stop:
                    buf.items.extend(new)
                    return self._window(buf, keep, len(buf.items))
        # An older view (a branch), or an empty one: a buffer of its own.
        first = self._start if keep is None else max(self._start, self._stop + len(new) - keep)
        own = _Buffer([*self._buf.items[first : self._stop], *new][-keep if keep else 0 :])
        return self._view(own, 0, len(own.items))

    def _window(self, buf: _Buffer, keep: int | None, stop: int | None = None) -> History[T]:
        stop = self._stop if stop is None else stop
        start = self._start if keep is None else max(self._start, stop - keep)
        if start > COMPACT_AFTER and 2 * start > stop:
            # The dropped head outweighs the window: a buffer of the window alone.
            return self._view(_Buffer(buf.items[start:stop]), 0, stop - start)
        return self._view(buf, start, stop)

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...
    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(self._buf.items[self._start : self._stop][index])
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("History index out of range")
        return self._buf.items[self._start + index]

    def __iter__(self) -> Iterator[T]:
        return iter(self._buf.items[self._start : self._stop])

    def __reversed__(self) -> Iterator[T]:
        return reversed(self._buf.items[self._start : self._stop])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            if other._buf is self._buf and (other._start, other._stop) == (self._start, self._stop):
                return True
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        if isinstance(other, tuple):
            return len(self) == len(other) and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"History({list(self)!r})"

    def __reduce__(self) -> tuple[type[History[T]], tuple[tuple[T, ...]]]:
        # Pickled (and deep-copied) as its items: the lock and the shared buffer stay behind.
        return (type(self), (tuple(self),))


__all__ = ["History"]
