"""The base of every event, and the registry that turns journal lines back into events.

Each module of this package defines a family of events and registers them with
:func:`register` (the ``kind`` each is written under, and the fields that hold nested frozen
records), so :func:`from_dict` can rebuild any journaled event.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar


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
