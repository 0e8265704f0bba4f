"""The reducers' registry: which function folds which event type into the snapshot.

A reducer is a pure function ``(snapshot, event) -> snapshot`` for one event type, registered
with :func:`reduces` in the module of its event family. It gets the snapshot with its version
and event count already advanced (:func:`~tui_launch.core.model.store.reduce` does that for
every event) and returns the next one; returning its input unchanged is how an event that does
not apply (a previous attempt's) is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tui_launch.core.model.events import Event, EventTable
from tui_launch.core.model.snapshot import Snapshot

E = TypeVar("E", bound=Event)

# The table holds reducers of different event types: its values take any event, and
# reducer_for() hands each one only the type it was registered for (or a subclass).
Reducer = Callable[[Snapshot, Any], Snapshot]

REDUCERS: EventTable[Reducer] = EventTable("reducer")


def reduces(
    kind: type[E],
) -> Callable[[Callable[[Snapshot, E], Snapshot]], Callable[[Snapshot, E], Snapshot]]:
    """Register the decorated function as the reducer of ``kind`` (and of its subclasses
    that have none of their own, such as a sample's journaled twin)."""

    def register(fn: Callable[[Snapshot, E], Snapshot]) -> Callable[[Snapshot, E], Snapshot]:
        REDUCERS.add(kind, fn)
        return fn

    return register


def reducer_for(kind: type[Event]) -> Reducer | None:
    """The reducer of ``kind``: its own, else its nearest base class's; None when the event
    changes nothing but the snapshot's version."""
    return REDUCERS.get(kind)


__all__ = ["REDUCERS", "Reducer", "reducer_for", "reduces"]
