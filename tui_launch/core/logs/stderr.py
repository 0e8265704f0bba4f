"""The launcher's own file descriptor 2: into the agent log, and onto the console in short.

torch's C++ code (the TCPStore client, c10d) writes to fd 2 directly, past Python's logging: a
rendezvous store that nobody serves costs a screenful of stack frames per retry. While a
:class:`StderrPipe` is open, fd 2 is a pipe: every line goes to the agent log in full, and the
console (a callback; none for the dashboard, which owns the terminal) gets torch's lines as
torchrun shows them (its log records, such as the ``OMP_NUM_THREADS`` banner, and its C++
messages: unprefixed, unchanged), with the stack frames of C++ exceptions left out, and a
store client's retries as one line each in tuilaunch's words (``[tuilaunch]``-prefixed). A
retry of the store client also becomes a :class:`~tui_launch.core.model.events.StoreRetry` for the
front ends. ``sys.stderr`` and
``sys.__stderr__`` become a private copy of the original fd 2, so the launcher's own output
goes straight to the terminal; that copy is a :class:`~tui_launch.core.logs.console.ConsoleStream`,
so a console that went away (a closed pipe) silences it, and the pump goes on filling the agent
log.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from tui_launch.core.logs.console import ConsoleStream
from tui_launch.core.model.events import Event, StoreRetry

# glog-style lines of torch's C++ logging: "[W1124 00:23:20.014587443 TCPStore.cpp:340] msg".
_GLOG = re.compile(r"^\[?[EWIF]\d{4} [\d:.]+ +(?:\d+ )?[\w.]+:\d+\] (?:\[c10d\] )?(?P<msg>.*)$")
# What follows a C++ exception's message: where it was raised, and its stack.
_TRACE = re.compile(r"^(frame #\d+: |Exception raised from |<omitting python frames>)")
_RETRY = re.compile(
    r"failed to connect/validate to host (?P<ep>\S+) - retrying "
    r"\(try=(?P<try>\d+), timeout=(?P<timeout>\d+)ms, delay=(?P<delay>\d+)ms\)"
)
_GAVE_UP = re.compile(
    r"failed to connect/validate to host (?P<ep>\S+) - timed out "
    r"\(try=(?P<try>\d+), timeout=(?P<timeout>\d+)ms\)"
)
# The socket's own line that precedes each retry line: the retry line says it all.
_SOCKET_DETAIL = re.compile(r"The client socket has (timed out after|failed to connect)")


@dataclass
class TorchLine:
    """What one line of the launcher's stderr becomes on the console."""

    console: str | None  # None: agent.log only
    event: Event | None = None
    ours: bool = False  # tuilaunch's words ([tuilaunch] line), not torch's own (as it is)


class StderrFilter:
    """Turns the launcher's raw stderr lines into console lines (stateful: stack traces)."""

    def __init__(self) -> None:
        self._in_trace = False

    def feed(self, line: str) -> TorchLine:
        """Classify one line (without its newline)."""
        if _TRACE.match(line):
            self._in_trace = True
            return TorchLine(None)
        if self._in_trace and not line.strip():
            self._in_trace = False  # the blank line that ends torch's stack dump
            return TorchLine(None)
        self._in_trace = False
        glog = _GLOG.match(line)
        if glog is None:  # a log record of torch's Python code, or any other line: as it is
            return TorchLine(line)
        msg = glog.group("msg")
        retry = _RETRY.search(msg)
        if retry is not None:
            ep, timeout = retry.group("ep"), int(retry.group("timeout")) / 1000
            delay = int(retry.group("delay")) / 1000
            n = int(retry.group("try")) + 1
            return TorchLine(
                f"rendezvous: the store at {ep} did not answer within {timeout:g}s "
                f"(try {n}); torch retries in {delay:.0f}s (details in agent.log)",
                StoreRetry(endpoint=ep, attempt=n, delay=delay, timeout=timeout),
                ours=True,
            )
        gave_up = _GAVE_UP.search(msg)
        if gave_up is not None:
            ep, n = gave_up.group("ep"), int(gave_up.group("try")) + 1
            return TorchLine(
                f"rendezvous: the store at {ep} did not answer (try {n}, the last)", ours=True
            )
        if _SOCKET_DETAIL.search(msg):
            return TorchLine(None)
        return TorchLine(line)  # torch's C++ message, as torchrun shows it


class StderrPipe:
    """A context manager that routes fd 2 through :class:`StderrFilter` (see the module doc).

    Args:
        capture: the agent log (``add_line`` keeps a line in full).
        post: where :class:`~tui_launch.core.model.events.StoreRetry` events go (the store).
        console: called with each console line and whether it is tuilaunch's own words
            (``console(line, ours)``: an ``ours`` line is shown ``[tuilaunch]``-prefixed, any
            other as it is); None: nothing reaches the console. :attr:`console` may be set
            later (lines before that go to the terminal the same way).
    """

    def __init__(
        self,
        capture: Any,
        post: Callable[[Event], object] | None = None,
        console: Callable[[str, bool], None] | None = None,
        *,
        to_terminal: bool = True,
    ) -> None:
        self.capture = capture
        self.post = post
        self.console = console
        self._to_terminal = to_terminal
        self.terminal: ConsoleStream | None = None
        self._reader: threading.Thread | None = None
        self._term_fd = -1
        self._saved: tuple[Any, Any] = (None, None)

    def __enter__(self) -> StderrPipe:
        sys.stderr.flush()
        self._term_fd = os.dup(2)
        stream: TextIO = os.fdopen(
            self._term_fd, "w", buffering=1, encoding=sys.stderr.encoding, errors="replace"
        )
        self.terminal = ConsoleStream(stream, "stderr")
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._saved = (sys.__stderr__, sys.stderr)
        sys.__stderr__ = sys.stderr = self.terminal  # type: ignore[misc,assignment]
        self._reader = threading.Thread(
            target=self._pump, args=(read_fd,), name="tuilaunch-stderr", daemon=True
        )
        self._reader.start()
        return self

    def _pump(self, read_fd: int) -> None:
        filt = StderrFilter()
        with os.fdopen(read_fd, "rb") as fp:
            for raw in fp:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.capture.add_line(line)
                out = filt.feed(line)
                if out.event is not None and self.post is not None:
                    self.post(out.event)
                if out.console is None or not self._to_terminal:
                    continue
                if self.console is not None:
                    self.console(out.console, out.ours)
                elif self.terminal is not None:
                    tag = "[tuilaunch] " if out.ours else ""
                    self.terminal.write(f"{tag}{out.console}\n")

    def __exit__(self, *exc: object) -> None:
        assert self.terminal is not None
        self.terminal.flush()
        os.dup2(self._term_fd, 2)  # closes the pipe's last write end: the pump sees EOF
        sys.__stderr__, sys.stderr = self._saved  # type: ignore[misc]
        if self._reader is not None:
            self._reader.join(timeout=1)
        with contextlib.suppress(OSError):
            self.terminal.stream.close()  # flushes: a console gone meanwhile must not raise
