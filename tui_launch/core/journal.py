"""The run's journal: every event as one JSON object per line.

Each line has the event's ``kind``, a sequence number, its monotonic and wall-clock times and
its fields. Until the run's log directory exists (torch creates it when the first workers
start) lines are kept in memory, so the journal always starts with the first event.
"""

from __future__ import annotations

import json
import os
import threading
from typing import IO, Any

from tui_launch.core.events import Event, from_dict, to_dict

JOURNAL_NAME = "journal.jsonl"


class Journal:
    """Append-only JSONL writer; a store listener (``store.subscribe(journal.write)``)."""

    def __init__(self, path: str | None = None) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._fp: IO[str] | None = None
        self._seq = 0
        self.path: str | None = None
        if path:
            self._open(path)

    def _open(self, path: str) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._fp = open(path, "a", buffering=1)  # noqa: SIM115
        self.path = path
        for line in self._pending:
            self._fp.write(line)
        self._pending.clear()

    def set_dir(self, directory: str) -> None:
        """Write to ``directory/journal.jsonl`` unless an explicit path was given."""
        with self._lock:
            if self._fp is None:
                self._open(os.path.join(directory, JOURNAL_NAME))

    def write(self, event: Event) -> None:
        """Append one event."""
        data: dict[str, Any] = to_dict(event)
        with self._lock:
            data = {"seq": self._seq, **data}
            self._seq += 1
            line = json.dumps(data, default=str) + "\n"
            if self._fp is not None:
                self._fp.write(line)
            else:
                self._pending.append(line)

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            if self._fp is not None:
                self._fp.close()
                self._fp = None


def read_journal(path: str) -> list[Event]:
    """Read a journal back into events (skipping lines this version does not know)."""
    events: list[Event] = []
    with open(path) as fp:
        for line in fp:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(from_dict(json.loads(line)))
            except (KeyError, TypeError, ValueError):
                continue
    return events
