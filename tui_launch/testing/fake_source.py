"""A deterministic stand-in for a live run, for pilot and snapshot tests and screenshots.

:class:`FakeSource` has the dashboard's :class:`~tui_launch.tui.sources.live.Source` surface: a
fixed
clock, snapshots built by folding real events through the store's own reducer (so the
dashboard sees exactly what a real run would produce), kept log lines, and a ``send`` that
records the command asked for instead of signalling processes.

What is refused is not re-implemented: the fake asks
:func:`~tui_launch.core.model.commands.allowed`, as the runner does, and builds its events
with the same :func:`~tui_launch.core.model.commands.control_event`. What it simulates (a
``hang`` injection as a SIGSTOP, ``128 + N`` when stopped by signal N) is checked by
``tests/test_fake_conformance.py``, which drives this fake and a live runner through the same
commands and compares the :class:`~tui_launch.core.model.events.ControlAction` events they post.
The runs themselves live in :mod:`tui_launch.testing.scenarios`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from tui_launch.core.diagnosis.stacks import StackDump
from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.model.commands import (
    LIVE_STATES,
    Command,
    DumpStacks,
    Inject,
    Outcome,
    Restart,
    SignalRank,
    StopRun,
    allowed,
    control_event,
)
from tui_launch.core.model.events import Event, RunFinished
from tui_launch.core.model.store import Snapshot, reduce
from tui_launch.testing.builders import T0_MONO, T0_WALL


@dataclass
class FakeSource:
    """A run frozen at one moment, built from events; controls are recorded, not performed."""

    events: list[Event] = field(default_factory=list)
    clock: float = T0_MONO + 95.0
    logs: LogBuffer = field(default_factory=LogBuffer)
    agent: list[str] = field(default_factory=list)
    actions: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    stopped: set[int] = field(default_factory=set)
    exit_code: int | None = None
    injected: list[str] = field(default_factory=list)
    dumps: dict[str, StackDump] = field(default_factory=dict)
    # Whether the workers were started through the bootstrap (not --no-bootstrap): without it, the
    # fake refuses exit and exception with the runner's words.
    inject_ready: bool = True

    def __post_init__(self) -> None:
        self._snap = Snapshot()
        self._on_finished: list[Callable[[], None]] = []
        for e in self.events:
            self._snap = reduce(self._snap, e)

    def settle_logs(self) -> None:
        """Pin every rank's last-log time to the fake clock (deterministic 'last log')."""
        for rank in list(self.logs.last_line_at):
            self.logs.last_line_at[rank] = self.clock - 1.0 - rank

    def post(self, event: Event) -> None:
        """Apply one more event (tests use this to move the fake run on)."""
        self.events.append(event)
        self._snap = reduce(self._snap, event)
        if isinstance(event, RunFinished):
            for callback in self._on_finished:
                callback()

    def _stamp(self) -> dict[str, float]:
        return {"mono": self.clock, "wall": T0_WALL + self.clock - T0_MONO}

    def on_finished(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the run has finished (at once if it already has)."""
        if self._snap.finished is not None:
            callback()
        self._on_finished.append(callback)

    def snapshot(self) -> Snapshot:
        """The run as folded so far."""
        return self._snap

    def now(self) -> float:
        """The fixed clock."""
        return self.clock

    def agent_lines(self) -> list[str]:
        """The agent's log lines given to the fake."""
        return list(self.agent)

    def send(self, cmd: Command) -> Outcome:
        """Simulate ``cmd`` as the runner would: :func:`allowed` decides (as it does for the
        runner), the request is recorded in :attr:`actions`, and the events the runner
        would post are posted."""
        reason = allowed(self._snap, cmd)
        if isinstance(cmd, SignalRank):
            return self._signal(cmd, reason)
        if isinstance(cmd, Restart):
            self.actions.append(("restart", None, None))
            self.post(control_event(cmd, reason is None, reason or "", stamp=self._stamp()))
            return Outcome(reason is None, reason or "")
        if isinstance(cmd, Inject):
            return self._inject(cmd)
        if isinstance(cmd, DumpStacks):
            return self._dump(cmd, reason)
        if isinstance(cmd, StopRun):
            detail = f"{signal.Signals(cmd.sig).name} to the workers"
            self.post(control_event(cmd, True, detail, stamp=self._stamp()))
            self.stop(cmd.sig, cmd.reason)
            return Outcome(True, detail)
        # ExitRank, RaiseInRank, KillNode: only injections give them, and the fake fires none.
        return Outcome(False, f"the fake does not simulate {cmd.kind}")

    def _signal(self, cmd: SignalRank, reason: str | None) -> Outcome:
        self.actions.append(("signal", cmd.local_rank, int(cmd.sig)))
        row = self._snap.rank(cmd.local_rank)
        if reason is None and cmd.sig == signal.SIGSTOP:
            self.stopped.add(cmd.local_rank)
        elif reason is None and cmd.sig == signal.SIGCONT:
            self.stopped.discard(cmd.local_rank)
        grank, pid = (row.global_rank, row.pid) if row else (None, None)
        stamp = self._stamp()
        self.post(
            control_event(
                cmd, reason is None, reason or "", global_rank=grank, pid=pid, stamp=stamp
            )
        )
        return Outcome(reason is None, reason or "")

    def is_stopped(self, local_rank: int) -> bool:
        """Whether this fake stopped the rank and has not continued it."""
        return local_rank in self.stopped

    def _inject(self, cmd: Inject) -> Outcome:
        """Check the spec as ``--inject`` does and record it; a hang stops its rank."""
        from tui_launch.core.run.inject import InjectError, parse_spec

        try:
            parsed = parse_spec(cmd.spec)
        except InjectError as e:
            return Outcome(False, str(e))
        refusal = self.inject_refusal(parsed.kind)
        if refusal is not None:
            return Outcome(False, refusal)
        self.injected.append(cmd.spec)
        if parsed.kind == "hang":  # as the runner does: a stop through the control API
            for r in self._snap.ranks:
                if r.global_rank == parsed.rank:
                    stop = SignalRank(r.local_rank, signal.SIGSTOP, source=f"inject, {cmd.source}")
                    self.send(stop)
        return Outcome(True, f"scheduled {parsed.canonical()}")

    def inject_refusal(self, kind: str) -> str | None:
        """The runner's refusal of ``exit``/``exception`` when not ``inject_ready``."""
        from tui_launch.core.run.control import ShimDir
        from tui_launch.core.run.inject import SHIM_KINDS

        if kind in SHIM_KINDS and not self.inject_ready:
            return ShimDir(False, no_python=False).no_shim_reason(kind)
        return None

    def _dump(self, cmd: DumpStacks, reason: str | None) -> Outcome:
        """A deterministic dump of the running ranks (rank 1 the odd one out), posted as the
        runner posts one; refused like the runner's when no rank runs."""
        from tui_launch.testing.builders import fake_dump, fake_dumped

        if reason is not None:
            self.post(control_event(cmd, False, reason, stamp=self._stamp()))
            return Outcome(False, reason)
        self.actions.append(("dump", None, None))
        live = [r for r in self._snap.ranks if r.state in LIVE_STATES]
        dump = fake_dump(cmd.reason, [(r.local_rank, r.global_rank, r.pid) for r in live])
        where = f"/runs/demo/stacks/{len(self.dumps):03d}-{cmd.reason}"
        event = fake_dumped(dump, where, cmd.source)
        self.dumps[event.path] = dump
        self.post(event)
        return Outcome(True, "", event)

    def stack_dump(self, path: str) -> StackDump | None:
        """A dump this fake made."""
        return self.dumps.get(path)

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Record the stop and finish the run as stopped, with exit code 128 + ``sig``."""
        self.actions.append(("stop", None, int(sig)))
        self.exit_code = 128 + int(sig)
        self.post(
            RunFinished(
                outcome="stopped",
                exit_code=self.exit_code,
                message=reason,
                failure_class="",
                meaning="stopped",
                **self._stamp(),
            )
        )

    def wait(self, timeout: float | None = None) -> int | None:
        """The run's exit code (never blocks)."""
        fin = self._snap.finished
        return fin.exit_code if fin else self.exit_code

    @property
    def done(self) -> bool:
        """Whether the run has finished."""
        return self._snap.finished is not None
