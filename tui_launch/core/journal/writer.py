"""The run's journal: every event as one JSON object per line.

Each line has the event's ``kind``, a sequence number, its monotonic and wall-clock times and
its fields. Until the run's log directory exists (torch creates it when the first workers
start) lines are kept in memory, so the journal always starts with the first event.

A journal on a full (or failing) file system never raises into the run and never ends
mid-line: each line is written with one unbuffered ``write``; a line the file system took only
part of is cut off again (``ftruncate`` to the last whole line), and the lines that could not
be written wait in memory (up to :data:`MAX_PENDING` bytes) for the next write to try again,
so a disk that gets room back loses nothing. ``on_error`` hears the first failure once, in
words that name the file and its file system (:func:`~.diskspace.write_error`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from tui_launch.core.model.diskspace import write_error
from tui_launch.core.model.events import Event, from_dict, to_dict
from tui_launch.core.model.layout import JOURNAL_NAME, RunDirLayout

# Lines kept in memory while the file system refuses them; beyond this the journal gives up
# (and says so): a launcher must not grow without bound because its disk is full.
MAX_PENDING = 16 * 1024 * 1024


class Journal:
    """Append-only JSONL writer; a store listener (``store.subscribe(journal.write)``).

    Args:
        path: ``--journal``; None: ``journal.jsonl`` in the directory given to :meth:`set_dir`.
        on_error: called once, with one sentence, when a write first fails (not under any lock
            of the journal's; it may post a notice to the store).
    """

    def __init__(
        self, path: str | None = None, on_error: Callable[[str], None] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._fd: int | None = None
        self._size = 0  # the file's length after the last whole line written
        self._seq = 0
        self.path: str | None = None
        self.on_error = on_error
        self.error: str | None = None  # the first write failure, in words
        self.dropped = 0  # events lost for good (the memory cap was reached)
        if path:
            with self._lock:
                failure = self._open(path)
            self._report(failure)

    def _open(self, path: str) -> str | None:
        # Under the lock. Returns a failure to report (outside the lock), or None.
        self.path = path
        try:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            self._fd = os.open(path, flags, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as e:
            return self._failed(e)
        return self._flush()

    def _failed(self, e: OSError) -> str | None:
        message = write_error(e, self.path or JOURNAL_NAME)
        if self.error is None:
            self.error = message
            return message
        return None

    def _flush(self) -> str | None:
        """Write the pending lines, each whole or not at all; under the lock."""
        if self._fd is None:
            return None
        written = 0
        failure = None
        for line in self._pending:
            try:
                n = os.write(self._fd, line)
                if n != len(line):  # the file system took part of it: full
                    raise OSError(28, os.strerror(28))
            except OSError as e:
                # Cut the partial line off: the journal ends on a whole event.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
                failure = self._failed(e)
                break
            self._size += n
            written += 1
        if written:
            self._pending_bytes -= sum(len(x) for x in self._pending[:written])
            del self._pending[:written]
        return failure

    def _report(self, failure: str | None) -> None:
        if failure is not None and self.on_error is not None:
            with contextlib.suppress(Exception):  # a broken callback must not break the writer
                self.on_error(failure)

    def set_dir(self, directory: str) -> None:
        """Write to ``directory/journal.jsonl`` unless an explicit path was given."""
        with self._lock:
            failure = None
            if self._fd is None and self.path is None:
                failure = self._open(RunDirLayout(directory).journal)
        self._report(failure)

    def write(self, event: Event) -> None:
        """Append one event (never raises: see the module doc)."""
        data: dict[str, Any] = to_dict(event)
        with self._lock:
            data = {"seq": self._seq, **data}
            self._seq += 1
            line = (json.dumps(data, default=str) + "\n").encode("utf-8", "replace")
            if self._pending_bytes + len(line) > MAX_PENDING:
                self.dropped += 1
                return
            self._pending.append(line)
            self._pending_bytes += len(line)
            failure = self._flush()
        self._report(failure)

    def close(self) -> None:
        """Try the pending lines a last time, then close the file (never raises)."""
        with self._lock:
            failure = self._flush()
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
        self._report(failure)

    @property
    def unwritten(self) -> int:
        """Events not in the file: waiting in memory, or dropped."""
        with self._lock:
            return len(self._pending) + self.dropped


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
