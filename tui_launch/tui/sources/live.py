"""What the dashboard reads and commands: a live run, or a fixed fake for tests.

The dashboard only knows :class:`Source`: snapshots, kept log lines, the agent's log lines,
a clock, and :meth:`Source.send`, which carries a command
(:mod:`tui_launch.core.model.commands`) to the run. :class:`LiveSource` wraps a live run through its
:class:`~tui_launch.core.run.handle.RunHandle`; tests and snapshots use a fake with the same
surface, and attaching to or replaying a run will be further implementations.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.model.commands import Command, Outcome
from tui_launch.core.model.events import Event, RunFinished
from tui_launch.core.model.store import Snapshot
from tui_launch.core.run.handle import RunHandle

if TYPE_CHECKING:  # a type only: the stack modules load when a dump is shown
    from tui_launch.core.diagnosis.stacks import StackDump


class Source(Protocol):
    """The dashboard's window onto a run.

    The dashboard calls every method on its own (UI) thread, so each must return quickly;
    :meth:`on_finished` callbacks may come from any thread.
    """

    logs: LogBuffer
    """The kept worker log lines (per rank and merged), filled by the source."""

    def snapshot(self) -> Snapshot:
        """The run's latest snapshot (plain data; the dashboard redraws on a new version)."""
        ...

    def now(self) -> float:
        """The source's clock, in the snapshot's ``time.monotonic`` terms (a fake's is fixed)."""
        ...

    def agent_lines(self) -> list[str]:
        """The agent's recent log lines (torch, c10d, the launcher's stderr), oldest first."""
        ...

    def send(self, cmd: Command) -> Outcome:
        """Act on the run (:mod:`tui_launch.core.model.commands`): what was done or why not.
        A :class:`DumpStacks` takes up to seconds: never send it on the UI thread."""
        ...

    def is_stopped(self, local_rank: int) -> bool:
        """Whether this rank was stopped from here (or an injection) and not continued."""
        ...

    # A source may also define ``inject_refusal(kind) -> str | None``: why its run can never
    # inject ``kind`` (the inject menu greys that kind out with the reason). A source without
    # it (an attach --control, whose launcher answers the injection itself) offers every kind.

    def stack_dump(self, path: str) -> StackDump | None:
        """The dump a ``StacksDumped`` points to (quick: kept in memory)."""
        ...

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Stop the run (``sig`` to the workers); a second call kills them at once."""
        ...

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the run to end; its exit code, or None."""
        ...

    def on_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the run has finished (on whatever thread notices it)."""
        ...

    @property
    def done(self) -> bool:
        """Whether the run has finished (the snapshot is final)."""
        ...


class LiveSource:
    """A live run (its :class:`~tui_launch.core.run.handle.RunHandle`) as a :class:`Source`.

    Args:
        run: the run's handle (a :class:`~tui_launch.core.run.runner.Runner`).
        logs: where worker lines are kept (default: a new :class:`LogBuffer`); it is added as
            a lossy log sink, so that a flood never slows the workers down.
    """

    def __init__(self, run: RunHandle, logs: LogBuffer | None = None) -> None:
        self.runner = run
        self.logs = logs or LogBuffer()
        run.add_log_sink(self.logs, lossy=True)
        run.add_partial_sink(self.logs.partial)

    def snapshot(self) -> Snapshot:
        """The store's latest snapshot."""
        return self.runner.store.snapshot()

    def now(self) -> float:
        """``time.monotonic()``: the clock the events are stamped with."""
        return time.monotonic()

    def agent_lines(self) -> list[str]:
        """The agent log's most recent lines."""
        return self.runner.agent_lines()

    def send(self, cmd: Command) -> Outcome:
        """Have the run execute ``cmd`` (it judges and journals it)."""
        return self.runner.execute(cmd)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether the run's rank table has this rank stopped by tuilaunch."""
        return self.runner.is_stopped(local_rank)

    def inject_refusal(self, kind: str) -> str | None:
        """Why the run can never inject ``kind`` (None: it can)."""
        return self.runner.inject_refusal(kind)

    def stack_dump(self, path: str) -> StackDump | None:
        """The run's dump at ``path``."""
        return self.runner.stack_dump(path)

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Stop the run (see :meth:`~tui_launch.core.run.handle.RunHandle.stop`)."""
        self.runner.stop(sig, reason)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the run to end."""
        return self.runner.wait(timeout)

    def on_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the agent's thread) once the run has finished."""

        def listener(event: Event) -> None:
            if isinstance(event, RunFinished):
                callback()

        self.runner.store.subscribe(listener)

    @property
    def done(self) -> bool:
        """Whether the run has finished."""
        return self.runner.done
