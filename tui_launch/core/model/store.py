"""The run's state: events in, versioned immutable snapshots out.

:func:`reduce` is a pure function from (snapshot, event) to the next snapshot, so the live
store, a replayed journal and every front end agree by construction. It dispatches each event
to the reducer of its type (:mod:`tui_launch.core.model.reducers`, one module per event family);
the snapshot and its views are :mod:`tui_launch.core.model.snapshot`'s, importable from here too.
:class:`RunStore` applies events under a lock, keeps the full event history (a failure is never
lost between two UI frames), notifies listeners such as the journal, and lets readers wait for
a newer version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable

from tui_launch.core.model.events import Event, LogMark
from tui_launch.core.model.reducers import reducer_for
from tui_launch.core.model.snapshot import (
    EXITED,
    FAILED,
    LIVE_STATES,
    OUTCOMES,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    AttemptView,
    Phase,
    RankState,
    RankView,
    RendezvousView,
    Snapshot,
    pick_root_cause,
    recovered,
)


def reduce(s: Snapshot, e: Event) -> Snapshot:
    """Return the snapshot that follows ``s`` once ``e`` has happened."""
    if isinstance(e, LogMark):
        return s  # for replays (log cut points): not a change of state, no redraw
    # Every other event makes a new version; ``events`` counts those the journal keeps (a
    # sample is not one of them, its journaled twin is).
    s = _advanced(s, e.journaled)
    fn = reducer_for(type(e))
    return s if fn is None else fn(s, e)


def _advanced(s: Snapshot, journaled: bool) -> Snapshot:
    """``s`` one version on (and one journaled event more when ``journaled``).

    ``dataclasses.replace`` without its per-field work (it reads and passes every one of the
    snapshot's ~45 fields to ``__init__``): every event pays for this copy, and it was half of
    folding a journal. The snapshot has no ``__post_init__`` and no slots, so a copy of its
    ``__dict__`` with two values changed is the same snapshot ``replace`` would make.
    """
    new = object.__new__(Snapshot)
    state = new.__dict__
    state.update(s.__dict__)
    state["version"] = s.version + 1
    state["events"] = s.events + journaled
    return new


class RunStore:
    """Thread-safe holder of the run's snapshot and event history.

    ``post`` may be called from any thread; it never blocks on readers. Listeners run under
    the store's lock, in event order, and must be quick (the journal appends one line).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._snapshot = Snapshot()
        self._history: list[Event] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._wakeups = 0
        self._last_mono = float("-inf")  # the latest journaled event's monotonic time

    def subscribe(self, listener: Callable[[Event], None], replay: bool = True) -> None:
        """Call ``listener`` with every event from now on (and, with ``replay``, past ones)."""
        with self._cond:
            if replay:
                for e in self._history:
                    with contextlib.suppress(Exception):
                        listener(e)
            self._listeners.append(listener)

    def post(self, event: Event) -> Snapshot:
        """Apply ``event`` and return the new snapshot.

        The history's clock never goes back: an event stamped on one thread a moment before
        another thread's, but posted after it, takes that one's time (microseconds; replay and
        the report seek and measure by it)."""
        with self._cond:
            if event.journaled:
                if event.mono < self._last_mono:
                    event = dataclasses.replace(event, mono=self._last_mono)
                self._last_mono = event.mono
            self._snapshot = reduce(self._snapshot, event)
            if not event.journaled:
                self._cond.notify_all()
                return self._snapshot
            self._history.append(event)
            for listener in self._listeners:
                with contextlib.suppress(Exception):  # a broken listener must not stop the run
                    listener(event)
            self._cond.notify_all()
            return self._snapshot

    def wake(self) -> None:
        """Wake every :meth:`wait_newer` caller (e.g. because the run is over)."""
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()

    def snapshot(self) -> Snapshot:
        """The latest snapshot (immutable; no copy needed)."""
        return self._snapshot

    @property
    def version(self) -> int:
        """The latest snapshot's version."""
        return self._snapshot.version

    def events(self, start: int = 0) -> list[Event]:
        """Events from index ``start`` on (a copy of the history's tail)."""
        with self._cond:
            return self._history[start:]

    def wait_newer(self, version: int, timeout: float | None = None) -> Snapshot:
        """Block until the version exceeds ``version``, :meth:`wake` is called or ``timeout``
        passes; return the latest snapshot either way."""
        with self._cond:
            woken = self._wakeups
            self._cond.wait_for(
                lambda: self._snapshot.version > version or self._wakeups != woken, timeout
            )
            return self._snapshot


def replay(events: Iterable[Event]) -> Snapshot:
    """Fold ``events`` (e.g. read back from a journal) into the snapshot they lead to."""
    s = Snapshot()
    for e in events:
        s = reduce(s, e)
    return s


__all__ = [
    "EXITED",
    "FAILED",
    "LIVE_STATES",
    "OUTCOMES",
    "RESTARTING",
    "RUNNING",
    "STARTING",
    "STOPPED",
    "AttemptView",
    "Phase",
    "RankState",
    "RankView",
    "RendezvousView",
    "RunStore",
    "Snapshot",
    "pick_root_cause",
    "recovered",
    "reduce",
    "replay",
]
