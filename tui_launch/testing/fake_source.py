"""A deterministic stand-in for a live run, for pilot and snapshot tests and screenshots.

:class:`FakeSource` has the dashboard's :class:`~tui_launch.tui.sources.live.Source` surface: a
fixed
clock, snapshots built by folding real events through the store's own reducer (so the
dashboard sees exactly what a real run would produce), kept log lines, and a control API that
records what was asked instead of signalling processes.

The control API re-implements the runner's semantics (which signal is which action, a
``hang`` injection as a SIGSTOP, ``128 + N`` when stopped by signal N, what is refused when no
worker runs); ``tests/test_fake_conformance.py`` drives this fake and a live runner through the
same calls and compares the :class:`~tui_launch.core.model.events.ControlAction` events they post.
The runs themselves live in :mod:`tui_launch.testing.scenarios`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from tui_launch.core.diagnosis.stacks import StackDump
from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.model.events import ControlAction, Event, RunFinished, StacksDumped
from tui_launch.core.model.store import Snapshot, reduce
from tui_launch.testing.builders import T0_MONO, T0_WALL

# The runner's names for what a signal does to a rank (ControlAction.action).
SIGNAL_ACTIONS = {signal.SIGSTOP: "stop", signal.SIGCONT: "continue", signal.SIGKILL: "kill"}
LIVE_STATES = ("running", "stopped")


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
    # Whether the workers were started through the bootstrap (--inject-ready): without it, the
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

    def signal_rank(self, local_rank: int, sig: int, source: str = "dashboard") -> bool:
        """Record the signal and post the ControlAction the runner would post."""
        sig = signal.Signals(sig)
        self.actions.append(("signal", local_rank, int(sig)))
        row = self._snap.rank(local_rank)
        ok = row is not None and row.state in LIVE_STATES and self._snap.finished is None
        if ok and sig == signal.SIGSTOP:
            self.stopped.add(local_rank)
        elif ok and sig == signal.SIGCONT:
            self.stopped.discard(local_rank)
        self.post(
            ControlAction(
                action=SIGNAL_ACTIONS.get(sig, "signal"),
                local_rank=local_rank,
                global_rank=row.global_rank if row else None,
                pid=row.pid if row else None,
                signal=sig.name,
                source=source,
                ok=ok,
                detail="" if ok else "no running worker",
                **self._stamp(),
            )
        )
        return ok

    def restart(self, source: str = "dashboard") -> bool:
        """Record the request; as the runner, it is refused unless the workers run."""
        self.actions.append(("restart", None, None))
        snap = self._snap
        ok = snap.phase == "running" and snap.finished is None
        detail = "" if ok else f"agent is {snap.phase}"
        self.post(ControlAction.on_run("restart", source, ok, detail, **self._stamp()))
        return ok

    def is_stopped(self, local_rank: int) -> bool:
        """Whether this fake stopped the rank and has not continued it."""
        return local_rank in self.stopped

    def inject(self, spec: str, source: str = "dashboard") -> tuple[bool, str]:
        """Check ``spec`` as ``--inject`` does and record it; a hang stops its rank."""
        from tui_launch.core.run.inject import InjectError, parse_spec

        try:
            parsed = parse_spec(spec)
        except InjectError as e:
            return False, str(e)
        refusal = self.inject_refusal(parsed.kind)
        if refusal is not None:
            return False, refusal
        self.injected.append(spec)
        if parsed.kind == "hang":  # as the runner does: a stop through the control API
            for r in self._snap.ranks:
                if r.global_rank == parsed.rank:
                    self.signal_rank(r.local_rank, signal.SIGSTOP, f"inject, {source}")
        return True, f"scheduled {parsed.canonical()}"

    def inject_refusal(self, kind: str) -> str | None:
        """The runner's refusal of ``exit``/``exception`` when not ``inject_ready``."""
        from tui_launch.core.run.control import ShimDir
        from tui_launch.core.run.inject import SHIM_KINDS

        if kind in SHIM_KINDS and not self.inject_ready:
            return ShimDir(False, no_python=False).no_shim_reason(kind)
        return None

    def dump_stacks(self, reason: str = "key", source: str = "dashboard") -> StacksDumped | None:
        """A deterministic dump of the running ranks (rank 1 the odd one out), posted as the
        runner posts one; refused like the runner's when no rank runs."""
        from tui_launch.testing.builders import fake_dump, fake_dumped

        live = [r for r in self._snap.ranks if r.state in LIVE_STATES]
        if not live or self._snap.finished is not None:
            refused = ControlAction.on_run(
                "dump", source, False, "no running worker", **self._stamp()
            )
            self.post(refused)
            return None
        self.actions.append(("dump", None, None))
        dump = fake_dump(reason, [(r.local_rank, r.global_rank, r.pid) for r in live])
        event = fake_dumped(dump, f"/runs/demo/stacks/{len(self.dumps):03d}-{reason}", source)
        self.dumps[event.path] = dump
        self.post(event)
        return event

    def stack_dump(self, path: str) -> StackDump | None:
        """A dump this fake made."""
        return self.dumps.get(path)

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Record the stop and finish the run as stopped, with exit code 128 + ``sig``."""
        self.actions.append(("stop", None, int(sig)))
        self.exit_code = 128 + int(sig)
        self.post(
            RunFinished(
                outcome="stopped", exit_code=self.exit_code, message=reason, **self._stamp()
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
