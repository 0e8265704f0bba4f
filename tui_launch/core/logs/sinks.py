"""Where the tailer's lines go besides the console, and the agent's own log.

- :class:`LogBuffer`: bounded in-memory worker lines, per rank and merged, with each stream's
  unterminated (``\r``-rewritten) line kept apart: what the dashboard's log view reads;
- :class:`DuplicateFilter`: torchrun's ``--duplicate-stdout/stderr-filters`` files;
- :class:`AgentLogCapture`: torch's and c10d's log records of the agent itself.

The tailer that feeds the first two is :class:`~tui_launch.core.logs.tail.LogTailer`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tui_launch.core.logs.tail import LogSource, last_segment
from tui_launch.core.model.diskspace import write_error
from tui_launch.core.model.layout import AGENT_LOG_NAME, RunDirLayout


class DuplicateFilter:
    """torchrun's ``--duplicate-stdout/stderr-filters``: matching tee'd lines to one file.

    torch implements them with its own tee threads, which tuilaunch replaces; this sink writes
    the same lines (with the same prefix) to the same ``filtered_std*.log`` files.
    """

    def __init__(self, filters: dict[str, list[str]]) -> None:
        self._filters = {k: v for k, v in filters.items() if v}
        self._paths: dict[str, str] = {}
        self._files: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self._filters)

    @staticmethod
    def accepts(src: LogSource) -> bool:
        """Only tee'd streams are filtered (the tailer reads no other stream for it)."""
        return src.teed

    def set_files(self, paths: dict[str, str]) -> None:
        """The files of a new attempt (torch has just created them)."""
        self.close()
        self._paths = dict(paths)

    def __call__(self, src: LogSource, lines: list[str]) -> None:
        """Tailer sink: append the lines of ``src`` that pass its stream's filter."""
        needles = self._filters.get(src.stream)
        path = self._paths.get(src.stream)
        if not needles or not path or not src.teed or path.startswith(os.devnull):
            return
        hits = [ln for ln in lines if any(n in ln for n in needles)]
        if not hits:
            return
        fp = self._files.get(path)
        if fp is None:
            fp = self._files[path] = open(path, "a", errors="replace")  # noqa: SIM115
        fp.write("".join(f"{src.prefix or ''}{ln}\n" for ln in hits))
        fp.flush()

    def close(self) -> None:
        """Close the files of the current attempt."""
        for fp in self._files.values():
            fp.close()
        self._files.clear()


LogLine = tuple[int, int, str, str]
"""(sequence number, local rank, stream, text): one kept line."""


class LogBuffer:
    """Bounded in-memory worker lines, per local rank and merged, for the dashboard.

    Every line gets a sequence number, so a view can ask for what it has not shown yet
    (:meth:`since`). Memory stays bounded however much the workers print: old lines fall off
    the front, and the files keep everything. A marker line separates attempts. Each stream's
    unterminated line (a progress bar being rewritten with ``\r``) is kept apart, as its last
    state (:meth:`partial_lines`), and replaced at each update until a newline completes it.
    """

    def __init__(self, per_rank: int = 5000, merged: int = 20000) -> None:
        self._per_rank = per_rank
        self._lock = threading.Lock()
        self._ranks: dict[int, collections.deque[LogLine]] = {}
        self._merged: collections.deque[LogLine] = collections.deque(maxlen=merged)
        self._attempt: dict[int, int] = {}
        self._merged_attempt = 0
        self._partials: dict[tuple[int, str], str] = {}
        self.seq = 0
        self.partial_version = 0  # changes whenever an unterminated line does
        self.last_line_at: dict[int, float] = {}

    def __call__(self, src: LogSource, lines: list[str]) -> None:
        """Tailer sink: keep ``lines`` of ``src``."""
        lr = src.local_rank
        now = time.monotonic()
        with self._lock:
            dq = self._ranks.get(lr)
            if dq is None:
                dq = self._ranks[lr] = collections.deque(maxlen=self._per_rank)
            seq = self.seq
            if self._attempt.get(lr, src.attempt) != src.attempt:
                seq += 1
                marker = (seq, lr, "marker", f"---- attempt {src.attempt} ----")
                dq.append(marker)
                if src.attempt > self._merged_attempt:  # one marker per attempt when merged
                    self._merged.append(marker)
                    self._merged_attempt = src.attempt
                self._drop_partials(lr)
            self._attempt[lr] = src.attempt
            stream = src.stream
            kept = [(seq + i + 1, lr, stream, text) for i, text in enumerate(lines)]
            self.seq = seq + len(lines)
            dq.extend(kept)
            self._merged.extend(kept)
            self.last_line_at[lr] = now
            # The unterminated line was completed by these lines (the tailer sends the next).
            if self._partials.pop((lr, stream), None) is not None:
                self.partial_version += 1

    def partial(self, src: LogSource, text: str, t: float) -> None:
        """Tailer partial sink: ``src``'s unterminated line is now ``text`` (raw)."""
        shown = last_segment(text)
        key = (src.local_rank, src.stream)
        with self._lock:
            if self._attempt.get(src.local_rank, src.attempt) > src.attempt:
                return  # an ended attempt's last words come as lines
            if shown:
                self._partials[key] = shown
                self.last_line_at[src.local_rank] = t
            elif self._partials.pop(key, None) is None:
                return
            self.partial_version += 1

    def _drop_partials(self, local_rank: int) -> None:
        for key in [k for k in self._partials if k[0] == local_rank]:
            del self._partials[key]
            self.partial_version += 1

    def partial_lines(self, local_rank: int | None = None) -> list[LogLine]:
        """The unterminated lines as last drawn (sequence number 0), by rank then stream."""
        with self._lock:
            items = sorted(self._partials.items())
        return [(0, lr, s, t) for (lr, s), t in items if local_rank in (None, lr)]

    def since(self, seq: int, local_rank: int | None = None) -> list[LogLine]:
        """Kept lines after sequence number ``seq``: one rank's, or all ranks' merged."""
        with self._lock:
            dq = self._merged if local_rank is None else self._ranks.get(local_rank)
            if not dq:
                return []
            out: list[LogLine] = []
            for item in reversed(dq):
                if item[0] <= seq:
                    break
                out.append(item)
        out.reverse()
        return out

    def lines(self, local_rank: int, stream: str | None = None) -> list[str]:
        """The kept text of one rank (one stream, or both interleaved)."""
        return [t for _, _, s, t in self.since(0, local_rank) if stream in (None, s)]


class AgentLogCapture(logging.Handler):
    """Collects the agent's own torch and c10d log records.

    Records go to ``agent.log`` in the run directory once it is known (buffered until then)
    and the last lines stay in memory for the front ends.
    """

    LOGGERS = ("torch", "torch.distributed")

    def __init__(self, keep: int = 500) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s"))
        self.recent: collections.deque[str] = collections.deque(maxlen=keep)
        self._pending: list[str] = []
        self._fp: Any = None
        self._muted: list[tuple[logging.Logger, logging.Handler]] = []
        self.path: str | None = None
        # A full or failing file system: the first failure in words (the file is given up,
        # the lines stay in ``recent``), and who hears it once (a notice to the store).
        self.error: str | None = None
        self.on_error: Callable[[str], None] | None = None

    def install(self, mute_console: bool) -> None:
        """Attach to torch's loggers; with ``mute_console``, detach their stderr handlers."""
        for name in self.LOGGERS:
            lg = logging.getLogger(name)
            if mute_console:
                for h in list(lg.handlers):
                    lg.removeHandler(h)
                    self._muted.append((lg, h))
            lg.addHandler(self)

    def unmute(self) -> None:
        """Give torch's loggers their console handlers back (the dashboard that showed these
        lines is gone: ``D`` leaves the run headless); the capture stays."""
        for lg, h in self._muted:
            lg.addHandler(h)
        self._muted.clear()

    def uninstall(self) -> None:
        """Detach, restore muted handlers and close the file."""
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)
        for lg, h in self._muted:
            lg.addHandler(h)
        self._muted.clear()
        self.acquire()
        try:
            if self._fp is not None:
                fp, self._fp = self._fp, None
                try:
                    fp.close()  # flushes: ENOSPC may come here
                except OSError as e:
                    self._write_failed(e)
        finally:
            self.release()

    def _write_failed(self, e: OSError) -> None:
        # Under the handler's lock. Never raise into torch's logging call or the stderr pump
        # (a dead pump would leave fd 2 a full pipe, and every later write to it would block).
        fp, self._fp = self._fp, None
        if fp is not None:
            with contextlib.suppress(OSError, ValueError):
                fp.close()
        if self.error is None:
            self.error = write_error(e, self.path or AGENT_LOG_NAME)
            if self.on_error is not None:
                with contextlib.suppress(Exception):
                    self.on_error(self.error)

    def set_dir(self, directory: str) -> None:
        """Start writing to ``directory/agent.log``, flushing what was buffered."""
        self.acquire()
        try:
            if self._fp is not None:
                return
            self.path = RunDirLayout(directory).agent_log
            try:
                self._fp = open(self.path, "a", buffering=1)  # noqa: SIM115
                for line in self._pending:
                    self._fp.write(line + "\n")
            except OSError as e:
                self._write_failed(e)
            self._pending.clear()
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        """Format and keep one record."""
        try:
            line = self.format(record)
        except Exception:
            return
        self.add_line(line)

    def add_line(self, line: str) -> None:
        """Keep one line that did not come through logging (the agent's raw stderr)."""
        self.acquire()  # re-entrant: emit() already holds it
        try:
            self.recent.append(line)
            if self._fp is not None:
                try:
                    self._fp.write(line + "\n")
                except OSError as e:
                    self._write_failed(e)
            elif self.path is None and len(self._pending) < 10000:
                self._pending.append(line)
        finally:
            self.release()
