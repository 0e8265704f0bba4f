"""What the dashboard reads and commands: a live runner, or a fixed fake for tests.

The dashboard only knows :class:`Source`: snapshots, kept log lines, the agent's log lines,
a clock, and the runner's control API. :class:`LiveSource` wraps a real
:class:`~tui_launch.core.runner.Runner`; tests and snapshots use a fake with the same surface.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Protocol

from tui_launch.core.events import Event, RunFinished
from tui_launch.core.logs import LogBuffer
from tui_launch.core.runner import Runner
from tui_launch.core.store import Snapshot


class Source(Protocol):
    """The dashboard's window onto a run."""

    logs: LogBuffer

    def snapshot(self) -> Snapshot: ...
    def now(self) -> float: ...
    def agent_lines(self) -> list[str]: ...
    def signal_rank(self, local_rank: int, sig: int, source: str = "dashboard") -> bool: ...
    def restart(self, source: str = "dashboard") -> bool: ...
    def inject(self, spec: str, source: str = "dashboard") -> tuple[bool, str]: ...
    def is_stopped(self, local_rank: int) -> bool: ...
    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None: ...
    def wait(self, timeout: float | None = None) -> int | None: ...
    def on_finished(self, callback: Callable[[], None]) -> None: ...
    @property
    def done(self) -> bool: ...


class LiveSource:
    """A running :class:`Runner` seen through the :class:`Source` surface."""

    def __init__(self, runner: Runner, logs: LogBuffer | None = None) -> None:
        self.runner = runner
        self.logs = logs or LogBuffer()
        runner.tailer.add_sink(self.logs, lossy=True)

    def snapshot(self) -> Snapshot:
        return self.runner.store.snapshot()

    def now(self) -> float:
        return time.monotonic()

    def agent_lines(self) -> list[str]:
        return list(self.runner.agent_log.recent)

    def signal_rank(self, local_rank: int, sig: int, source: str = "dashboard") -> bool:
        return self.runner.signal_rank(local_rank, sig, source)

    def restart(self, source: str = "dashboard") -> bool:
        return self.runner.restart(source)

    def is_stopped(self, local_rank: int) -> bool:
        return self.runner.is_stopped(local_rank)

    def inject(self, spec: str, source: str = "dashboard") -> tuple[bool, str]:
        return self.runner.inject(spec, source)

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        self.runner.stop(sig, reason)

    def wait(self, timeout: float | None = None) -> int | None:
        return self.runner.wait(timeout)

    def on_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the agent's thread) once the run has finished."""

        def listener(event: Event) -> None:
            if isinstance(event, RunFinished):
                callback()

        self.runner.store.subscribe(listener)

    @property
    def done(self) -> bool:
        return self.runner.done
