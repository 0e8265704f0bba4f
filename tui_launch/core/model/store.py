"""The run's state: events in, versioned immutable snapshots out.

:func:`reduce` is a pure function from (snapshot, event) to the next snapshot, so the live
store, a replayed journal and every front end agree by construction. :class:`RunStore` applies
events under a lock, keeps the full event history (a failure is never lost between two UI
frames), notifies listeners such as the journal, and lets readers wait for a newer version.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from tui_launch.core.model.events import (
    AttemptFailed,
    ClusterSample,
    Connecting,
    ControlAction,
    Event,
    ExitBarrier,
    Failure,
    GroupState,
    HangCleared,
    HangDetected,
    JobStacks,
    LogMark,
    NodeChange,
    Notice,
    ProgressSample,
    RankExited,
    RendezvousCompleted,
    RendezvousSample,
    RendezvousStarted,
    Restart,
    RunFinished,
    RunStarted,
    Shutdown,
    Slowdown,
    StacksDumped,
    StoreRetry,
    Straggler,
    TelemetrySample,
    TelemetryTotals,
    WorkersStarted,
)
from tui_launch.core.model.progress import ProgressView, fold_slowdown
from tui_launch.core.model.progress import fold as fold_progress
from tui_launch.core.model.telemetry import TelemetryView, fold

# Rank states shown to users.
STARTING, RUNNING, STOPPED, EXITED, FAILED, RESTARTING = (
    "starting",
    "running",
    "stopped",
    "exited",
    "failed",
    "restarting",
)


class Phase:
    """The run's phase, in the one vocabulary that the snapshot and the runner share.

    Once the run is over the snapshot's phase is its outcome (one of :attr:`OUTCOMES`).
    """

    STARTING = "starting"  # before the first rendezvous; the runner: spawning workers
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"  # the workers run and the agent monitors them
    RESTARTING = "restarting"
    FINISHING = "finishing"  # the workers succeeded; the exit barrier
    STOPPING = "stopping"
    OUTCOMES = ("succeeded", "failed", "stopped", "error")


@dataclass(frozen=True)
class RankView:
    """One local worker as the front ends show it."""

    local_rank: int
    global_rank: int
    pid: int
    attempt: int
    state: str
    started: float
    exit_code: int | None = None
    signal: str | None = None
    exited: float | None = None


@dataclass(frozen=True)
class AttemptView:
    """One attempt of the worker group: from its workers' start to why it ended."""

    number: int
    started: float
    world_size: int
    ended: float | None = None
    end_reason: str | None = None


@dataclass(frozen=True)
class RendezvousView:
    """What this node knows about the rendezvous."""

    backend: str
    endpoint: str
    run_id: str
    state: str
    since: float
    round: int | None = None
    group_rank: int | None = None
    group_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    participants: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The whole run at one version. Plain data: safe to read from any thread."""

    version: int = 0
    run: RunStarted | None = None
    phase: str = Phase.STARTING
    attempt: int = 0
    group_state: str = "INIT"
    rendezvous: RendezvousView | None = None
    rendezvous_live: RendezvousSample | None = None
    ranks: tuple[RankView, ...] = ()
    attempts: tuple[AttemptView, ...] = ()
    failures: tuple[Failure, ...] = ()
    root_cause: Failure | None = None
    failure_restarts: int = 0
    manual_restarts: int = 0
    membership_restarts: int = 0
    budget_left: int = 0
    notices: tuple[Notice, ...] = ()
    controls: tuple[ControlAction, ...] = ()
    shutdown: Shutdown | None = None
    finished: RunFinished | None = None
    started_wall: float | None = None
    started_mono: float | None = None
    events: int = 0
    telemetry: TelemetryView | None = None
    cluster: ClusterSample | None = None
    node_changes: tuple[NodeChange, ...] = ()
    connecting: Connecting | None = None  # while torch's rendezvous handler is being created
    store_retries: int = 0  # the TCPStore client's retries so far (torch's C++ warnings)
    launched_mono: float | None = None  # when the launcher began: durations count from here
    dumps: tuple[StacksDumped, ...] = ()  # every stack dump of the run, oldest first
    hang: HangDetected | None = None  # the latest confirmed hang of the current attempt
    hung_ranks: tuple[int, ...] = ()  # global ranks the Workers table marks as hanging
    hang_cleared: HangCleared | None = None  # the hang's ranks moved again (this attempt)
    job_stacks: tuple[JobStacks, ...] = ()  # job-wide dumps (every node's ranks), oldest first
    progress: ProgressView | None = None
    straggler: Straggler | None = None  # the inferred straggler (global_rank None: none now)

    @property
    def restarts_used(self) -> int:
        """All restarts so far, whatever their cause."""
        return self.failure_restarts + self.manual_restarts + self.membership_restarts

    @property
    def max_restarts(self) -> int:
        """The failure budget the user asked for (``--max-restarts``)."""
        return self.run.max_restarts if self.run else 0

    def rank(self, local_rank: int) -> RankView | None:
        """The row of ``local_rank`` in the current attempt, if any."""
        for r in self.ranks:
            if r.local_rank == local_rank:
                return r
        return None


_CONTROLS_KEPT = 200
_DUMPS_KEPT = 100
_JOB_DUMPS_KEPT = 20


def _close_attempt(attempts: tuple[AttemptView, ...], when: float, reason: str):
    if attempts and attempts[-1].ended is None:
        return (*attempts[:-1], replace(attempts[-1], ended=when, end_reason=reason))
    return attempts


def recovered(s: Snapshot, f: Failure | None) -> bool:
    """Whether failure ``f`` was recovered: the group restarted and a later attempt's workers
    started (a run stopped after that did not end because of it)."""
    return f is not None and s.attempt > f.attempt and any(a.number > f.attempt for a in s.attempts)


def pick_root_cause(failures: Iterable[Failure]) -> Failure | None:
    """The first real failure: earliest seen, never a peer the agent terminated itself."""
    failures = list(failures)
    real = [f for f in failures if not f.collateral] or failures
    if not real:
        return None
    return min(real, key=lambda f: (f.time, f.global_rank))


def reduce(s: Snapshot, e: Event) -> Snapshot:
    """Return the snapshot that follows ``s`` once ``e`` has happened."""
    if isinstance(e, LogMark):
        return s  # for replays (log cut points): not a change of state, no redraw
    s = replace(s, version=s.version + 1, events=s.events + 1)
    if isinstance(e, RendezvousSample):
        return replace(s, rendezvous_live=e, events=s.events - 1)
    if isinstance(e, TelemetrySample):  # and TelemetryRecord, its journaled twin
        return replace(s, telemetry=fold(s.telemetry, e), events=s.events - (not e.journaled))
    if isinstance(e, TelemetryTotals):
        if s.telemetry is None:
            return s
        return replace(s, telemetry=replace(s.telemetry, totals=e.totals))
    if isinstance(e, Connecting):
        launched = s.launched_mono if s.launched_mono is not None else e.mono
        return replace(s, connecting=e, launched_mono=launched, events=s.events - 1)
    if isinstance(e, StoreRetry):
        return replace(s, store_retries=s.store_retries + 1, events=s.events - 1)
    if isinstance(e, ProgressSample):  # and ProgressRecord, its journaled twin
        progress = fold_progress(s.progress, e)
        return replace(s, progress=progress, events=s.events - (not e.journaled))
    if isinstance(e, Slowdown):
        return replace(s, progress=fold_slowdown(s.progress, e))
    if isinstance(e, Straggler):
        return replace(s, straggler=e)
    if isinstance(e, ClusterSample):
        return replace(s, cluster=e, events=s.events - 1)
    if isinstance(e, StacksDumped):
        return replace(s, dumps=(*s.dumps, e)[-_DUMPS_KEPT:])
    if isinstance(e, HangDetected):
        # The odd ranks out are the suspects; when every rank waits alike, all of them.
        return replace(s, hang=e, hung_ranks=e.odd_ranks or e.still_ranks, hang_cleared=None)
    if isinstance(e, HangCleared):
        if e.attempt != s.attempt:
            return s
        return replace(s, hung_ranks=(), hang_cleared=e)
    if isinstance(e, JobStacks):
        return replace(s, job_stacks=(*s.job_stacks, e)[-_JOB_DUMPS_KEPT:])
    if isinstance(e, NodeChange):
        # Shown in the attempt timeline: the attempt that starts next has these nodes.
        return replace(s, node_changes=(*s.node_changes, e))
    if isinstance(e, RunStarted):
        began = e.launched_mono if e.launched_mono is not None else s.launched_mono
        return replace(
            s,
            run=e,
            budget_left=e.max_restarts,
            started_wall=e.wall,
            started_mono=e.mono,
            launched_mono=e.mono if began is None else began,
        )
    if isinstance(e, RendezvousStarted):
        # A new round: what the last one decided (group rank, master) no longer holds.
        rv = RendezvousView(
            backend=e.backend, endpoint=e.endpoint, run_id=e.run_id, state="waiting", since=e.mono
        )
        ranks = tuple(
            r if r.state in (EXITED, FAILED) else replace(r, state=RESTARTING) for r in s.ranks
        )
        phase = Phase.RENDEZVOUS if e.attempt == 0 and not s.attempts else Phase.RESTARTING
        return replace(s, rendezvous=rv, phase=phase, ranks=ranks)
    if isinstance(e, RendezvousCompleted):
        rv = RendezvousView(
            backend=e.backend,
            endpoint=e.endpoint,
            run_id=e.run_id,
            state="complete",
            since=e.mono,
            round=e.round,
            group_rank=e.group_rank,
            group_world_size=e.group_world_size,
            master_addr=e.master_addr,
            master_port=e.master_port,
            participants=e.participants,
        )
        return replace(s, rendezvous=rv)
    if isinstance(e, WorkersStarted):
        ranks = tuple(
            RankView(
                local_rank=w.local_rank,
                global_rank=w.global_rank,
                pid=w.pid,
                attempt=e.attempt,
                state=RUNNING,
                started=e.mono,
            )
            for w in e.workers
        )
        world = e.workers[0].world_size if e.workers else 0
        attempts = (*_close_attempt(s.attempts, e.wall, "restarted"),)
        attempts = (*attempts, AttemptView(number=e.attempt, started=e.wall, world_size=world))
        return replace(
            s,
            ranks=ranks,
            attempt=e.attempt,
            attempts=attempts,
            phase=Phase.RUNNING,
            group_state="HEALTHY",
            hung_ranks=(),
            hang_cleared=None,
        )
    if isinstance(e, RankExited):
        if e.attempt != s.attempt:
            return s
        # A rank the agent terminated (a peer failed, a shutdown) did not fail by itself.
        state = EXITED if e.exit_code == 0 or e.by_agent else FAILED
        ranks = tuple(
            replace(r, state=state, exit_code=e.exit_code, signal=e.signal, exited=e.mono)
            if r.local_rank == e.local_rank and r.exit_code is None
            else r
            for r in s.ranks
        )
        return replace(s, ranks=ranks)
    if isinstance(e, GroupState):
        phase = s.phase
        if e.state == "SUCCEEDED":
            phase = Phase.FINISHING
        return replace(s, group_state=e.state, phase=phase)
    if isinstance(e, AttemptFailed):
        failures = (*s.failures, *e.failures)
        return replace(s, failures=failures, root_cause=pick_root_cause(e.failures))
    if isinstance(e, Restart):
        counts = {
            "failure": "failure_restarts",
            "manual": "manual_restarts",
            "membership": "membership_restarts",
        }
        name = counts.get(e.cause, "failure_restarts")
        s = replace(s, **{name: getattr(s, name) + 1})
        attempts = _close_attempt(s.attempts, e.wall, e.cause)
        ranks = tuple(
            r if r.state in (EXITED, FAILED) else replace(r, state=RESTARTING) for r in s.ranks
        )
        return replace(
            s, attempts=attempts, budget_left=e.budget_left, phase=Phase.RESTARTING, ranks=ranks
        )
    if isinstance(e, ControlAction):
        controls = (*s.controls, e)[-_CONTROLS_KEPT:]
        s = replace(s, controls=controls)
        if e.ok and e.local_rank is not None and e.action in ("stop", "continue"):
            new_state = STOPPED if e.action == "stop" else RUNNING
            ranks = tuple(
                replace(r, state=new_state)
                if r.local_rank == e.local_rank and r.pid == e.pid and r.exit_code is None
                else r
                for r in s.ranks
            )
            s = replace(s, ranks=ranks)
        return s
    if isinstance(e, ExitBarrier):
        return replace(s, phase=Phase.FINISHING if not e.done else s.phase)
    if isinstance(e, Notice):
        return replace(s, notices=(*s.notices, e))
    if isinstance(e, Shutdown):
        return replace(s, shutdown=e, phase=Phase.STOPPING)
    if isinstance(e, RunFinished):
        attempts = _close_attempt(s.attempts, e.wall, e.outcome)
        closed = s.rendezvous
        if closed is not None and closed.state == "waiting":
            closed = replace(closed, state="closed")
        return replace(s, finished=e, phase=e.outcome, attempts=attempts, rendezvous=closed)
    return s


class RunStore:
    """Thread-safe holder of the run's snapshot and event history.

    ``post`` may be called from any thread; it never blocks on readers. Listeners run under
    the store's lock, in event order, and must be quick (the journal appends one line).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._snapshot = Snapshot()
        self._history: list[Event] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._wakeups = 0

    def subscribe(self, listener: Callable[[Event], None], replay: bool = True) -> None:
        """Call ``listener`` with every event from now on (and, with ``replay``, past ones)."""
        with self._cond:
            if replay:
                for e in self._history:
                    with contextlib.suppress(Exception):
                        listener(e)
            self._listeners.append(listener)

    def post(self, event: Event) -> Snapshot:
        """Apply ``event`` and return the new snapshot."""
        with self._cond:
            self._snapshot = reduce(self._snapshot, event)
            if not event.journaled:
                self._cond.notify_all()
                return self._snapshot
            self._history.append(event)
            for listener in self._listeners:
                with contextlib.suppress(Exception):  # a broken listener must not stop the run
                    listener(event)
            self._cond.notify_all()
            return self._snapshot

    def wake(self) -> None:
        """Wake every :meth:`wait_newer` caller (e.g. because the run is over)."""
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()

    def snapshot(self) -> Snapshot:
        """The latest snapshot (immutable; no copy needed)."""
        return self._snapshot

    @property
    def version(self) -> int:
        """The latest snapshot's version."""
        return self._snapshot.version

    def events(self, start: int = 0) -> list[Event]:
        """Events from index ``start`` on (a copy of the history's tail)."""
        with self._cond:
            return self._history[start:]

    def wait_newer(self, version: int, timeout: float | None = None) -> Snapshot:
        """Block until the version exceeds ``version``, :meth:`wake` is called or ``timeout``
        passes; return the latest snapshot either way."""
        with self._cond:
            woken = self._wakeups
            self._cond.wait_for(
                lambda: self._snapshot.version > version or self._wakeups != woken, timeout
            )
            return self._snapshot


def replay(events: Iterable[Event]) -> Snapshot:
    """Fold ``events`` (e.g. read back from a journal) into the snapshot they lead to."""
    s = Snapshot()
    for e in events:
        s = reduce(s, e)
    return s


__all__ = [
    "AttemptView",
    "RankView",
    "RendezvousView",
    "RunStore",
    "Snapshot",
    "pick_root_cause",
    "recovered",
    "reduce",
    "replay",
]
