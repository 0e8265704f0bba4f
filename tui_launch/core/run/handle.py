"""The run handle: the one surface the front ends use to follow and steer a run.

The dashboard (through ``tui.source.LiveSource``), the headless output and the CLI know a run
only as a :class:`RunHandle`; :class:`~tui_launch.core.run.runner.Runner` is the live one. What
each part carries:

- the store: every event and the current snapshot (the dashboard and headless render it);
- worker output, through sinks on the log tailer (they bypass the store: a flood of lines
  would drown the events): whole lines (:meth:`RunHandle.add_log_sink`), raw byte ranges for
  a console (:meth:`RunHandle.add_raw_sink`) and each stream's unterminated text, a progress
  bar being rewritten with ``\r`` (:meth:`RunHandle.add_partial_sink`);
- the agent's own log lines (torch and c10d records, raw stderr under the dashboard);
- the run directory, journal path and cluster-view interval, for the summary and headless;
- exit hooks, run just before a ``node`` injection kills the launcher;
- the control API: :meth:`RunHandle.execute` carries out a command
  (:mod:`tui_launch.core.model.commands`: signal a rank, restart, inject, dump the stacks,
  stop...); each is also a ``ControlAction`` event in the store, a dump a ``StacksDumped``.

Threads: every method may be called from any thread; sinks and hooks run on the runner's
threads and must be quick.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tui_launch.core.logs.sinks import AgentLogCapture
from tui_launch.core.logs.tail import Accepts, LineSink, PartialSink, RawSink
from tui_launch.core.model.commands import Command, Outcome
from tui_launch.core.model.store import RunStore

if TYPE_CHECKING:  # the parts import torch; a front end importing this module need not
    from tui_launch.core.diagnosis.stacks import StackDump


class RunHandle(Protocol):
    """One run, live: what the front ends may read and do."""

    @property
    def store(self) -> RunStore:
        """The run's event store (``snapshot``, ``events``, ``wait_newer``, ``subscribe``)."""
        ...

    @property
    def agent_log(self) -> AgentLogCapture:
        """The agent's log capture (the dashboard routes the launcher's fd 2 into it)."""
        ...

    @property
    def run_dir(self) -> str | None:
        """The run's log directory (None until torch made it; always set once done)."""
        ...

    @property
    def journal_path(self) -> str | None:
        """Where the JSONL journal is written (None until the run directory is known)."""
        ...

    @property
    def cluster_interval(self) -> float | None:
        """Seconds between two cluster-view records (None: no cluster view yet)."""
        ...

    @property
    def done(self) -> bool:
        """True once the run has finished and the summary is final."""
        ...

    @property
    def exit_code(self) -> int | None:
        """The run's exit status once done (0, 1, 2 or 128+N), else None."""
        ...

    def add_log_sink(
        self, sink: LineSink, lossy: bool = False, accepts: Accepts | None = None
    ) -> None:
        """Give ``sink`` every batch of worker lines, in file order per stream.

        ``lossy``: the sink is a view that may skip lines in a flood (the dashboard); when every
        sink of a stream is lossy the tailer may skip ahead. ``accepts(source)``: the streams
        it wants (default: all). The files always keep every line.
        """
        ...

    def add_raw_sink(self, sink: RawSink, accepts: Accepts | None = None) -> None:
        """Give ``sink`` each new byte range of the streams it ``accepts``, as file offsets
        (a console copies them with ``os.sendfile``; see
        :data:`~tui_launch.core.logs.tail.RawSink`)."""
        ...

    def add_partial_sink(self, sink: PartialSink) -> None:
        """Give ``sink(source, text, t)`` each stream's text after its last newline whenever
        it changes ("" once completed; see :meth:`LogTailer.add_partial_sink`)."""
        ...

    def agent_lines(self) -> list[str]:
        """The agent's most recent log lines, oldest first."""
        ...

    def before_exit(self, hook: Callable[[], None], first: bool = False) -> None:
        """Call ``hook`` just before a ``node`` injection SIGKILLs the launcher (``first``:
        before the hooks already added, e.g. to give the terminal back)."""
        ...

    def start(self) -> None:
        """Start the run (the agent thread, the log tailer, the samplers)."""
        ...

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the run to end; return its exit code (None on timeout)."""
        ...

    def stop(self, sig: int = signal.SIGTERM, reason: str = "stop requested") -> None:
        """Stop the run: workers get ``sig``, then SIGKILL after the shutdown timeout; a second
        call SIGKILLs every worker at once."""
        ...

    # ------------------------------------------------------------------ control API

    def execute(self, cmd: Command) -> Outcome:
        """Carry out a command (signal a rank, restart, inject, dump, stop...) if the run's
        state allows it; every command is journaled (a ``ControlAction``, or the dump's
        ``StacksDumped``). A :class:`DumpStacks` blocks up to a few seconds: call it off a
        UI thread."""
        ...

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch stopped this rank and has not continued it."""
        ...

    def inject_refusal(self, kind: str) -> str | None:
        """Why this run can never inject ``kind`` (``exit`` without the worker bootstrap);
        None when it can."""
        ...

    def attempt_alive(self, attempt: int) -> bool:
        """Whether ``attempt`` is current and its workers are being monitored."""
        ...

    def stack_dump(self, path: str) -> StackDump | None:
        """The dump a ``StacksDumped`` points to (None: unreadable)."""
        ...
