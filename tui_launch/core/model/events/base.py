"""The base of every event, the registry that turns journal lines back into events, and the
tables that dispatch on an event's type.

Each module of this package defines a family of events and registers them with
:func:`register` (the ``kind`` each is written under, and the fields that hold nested frozen
records), so :func:`from_dict` can rebuild any journaled event.

Whatever is done per event type (reduce it, describe it, mark it on a report's time axis, ...)
is an :class:`EventTable` filled by a decorator beside each handler, never an ``isinstance``
chain: one dispatch style, and a table a test can check for completeness.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast


def _now_mono() -> float:
    return time.monotonic()


def _now_wall() -> float:
    return time.time()


@dataclass(frozen=True)
class Event:
    """Base class: every event carries when it happened, on both clocks."""

    kind: ClassVar[str] = "event"
    # Samples (live readings that change all the time) update the snapshot but are kept out
    # of the history and the journal.
    journaled: ClassVar[bool] = True
    mono: float = field(default_factory=_now_mono, kw_only=True)
    wall: float = field(default_factory=_now_wall, kw_only=True)


H = TypeVar("H")
F = TypeVar("F", bound=Callable[..., Any])


class EventTable(Generic[H]):
    """Handlers keyed by event type, looked up along the type's MRO.

    An event type without a handler of its own gets its nearest base class's (a sample's
    journaled twin, say, gets the sample's); :meth:`get` returns None when no class of the
    MRO has one. Registering a type twice is an error, so that two handlers cannot race for it.

    Args:
        what: what a handler is, for the error (``"reducer"``: "two reducers for Notice").
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._own: dict[type[Event], H] = {}
        # Resolved lookups, an event type's MRO walked once: a replay looks up every event.
        self._resolved: dict[type[Event], H | None] = {}

    def add(self, kind: type[Event], handler: H) -> None:
        """Make ``handler`` the one of ``kind`` (and of its subclasses that have none)."""
        if kind in self._own:
            raise ValueError(f"two {self.what}s for {kind.__name__}")
        self._own[kind] = handler
        self._resolved.clear()

    def on(self, *kinds: type[Event]) -> Callable[[F], F]:
        """Decorate a function (a method, say) to register it as the handler of ``kinds``."""

        def register(fn: F) -> F:
            for kind in kinds:
                self.add(kind, cast(H, fn))
            return fn

        return register

    def get(self, kind: type[Event]) -> H | None:
        """The handler of ``kind``: its own, else its nearest base class's, else None."""
        try:
            return self._resolved[kind]
        except KeyError:
            pass
        found = next((self._own[c] for c in kind.__mro__ if c in self._own), None)
        self._resolved[kind] = found
        return found

    def kinds(self) -> frozenset[type[Event]]:
        """The types registered with a handler of their own."""
        return frozenset(self._own)

    def __len__(self) -> int:
        return len(self._own)


EVENT_TYPES: dict[str, type[Event]] = {}
# (event kind, field name) -> the frozen record type of that field's items.
_NESTED: dict[tuple[str, str], type[Any]] = {}


def register(*classes: type[Event], nested: dict[str, type[Any]] | None = None) -> None:
    """Make ``classes`` readable by :func:`from_dict`; ``nested`` maps a field name to the
    record type of its items, for every one of ``classes``."""
    for cls in classes:
        EVENT_TYPES[cls.kind] = cls
        for name, record in (nested or {}).items():
            _NESTED[(cls.kind, name)] = record


def to_dict(event: Event) -> dict[str, Any]:
    """Return ``event`` as a JSON-ready dict with its ``kind`` first."""
    return {"kind": event.kind, **dataclasses.asdict(event)}


def from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from :func:`to_dict`'s output (as read back from a journal)."""
    data = dict(data)
    kind = data.pop("kind")
    data.pop("seq", None)
    cls = EVENT_TYPES[kind]
    for (k, name), nested in _NESTED.items():
        if k == kind and name in data:
            data[name] = tuple(nested(**_tuplify(item)) for item in data[name])
    return cls(**_tuplify(data))


def _tuplify(data: dict[str, Any]) -> dict[str, Any]:
    # JSON turns tuples into lists; frozen records want tuples back so they stay hashable.
    # (Only lists are looked into: a replay rebuilds hundreds of thousands of fields.)
    return {k: _deep_tuple(v) if type(v) is list else v for k, v in data.items()}


def _deep_tuple(value: Any) -> Any:
    # Nested too: a node's ranks are tuples of tuples.
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value
