"""The run's state at one version: :class:`Snapshot` and the views it is made of.

Plain frozen data, safe to read from any thread. :func:`~tui_launch.core.model.store.reduce`
makes the next one from an event; the reducers of each event family
(:mod:`tui_launch.core.model.reducers`) say how. Importers find these names in
:mod:`tui_launch.core.model.store` too, beside the store that holds them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tui_launch.core.model import errors
from tui_launch.core.model.events import (
    ClusterSample,
    CollectiveSample,
    CollectiveVerdictFound,
    Connecting,
    ControlAction,
    Failure,
    FlightRecorderVerdict,
    HangCleared,
    HangDetected,
    HangWatchSample,
    JobStacks,
    NodeChange,
    Notice,
    PolicyDecision,
    Preempted,
    RendezvousSample,
    RunFinished,
    RunStarted,
    Shutdown,
    StacksDumped,
    Straggler,
    WorkersSaved,
)
from tui_launch.core.model.history import History
from tui_launch.core.model.progress import ProgressView
from tui_launch.core.model.telemetry import TelemetryView
from tui_launch.core.model.words import Word

# The empty history every new snapshot starts from (its lists of events grow without copying:
# :mod:`tui_launch.core.model.history`).
NO_EVENTS: History[Any] = History()


class RankState(Word):
    """A rank's state as the front ends show it (:attr:`RankView.state`)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"  # SIGSTOPped by a control
    EXITED = "exited"  # exit 0, or terminated by the agent (a peer failed, a shutdown)
    FAILED = "failed"
    RESTARTING = "restarting"


# The names the reducers and tests have always used for the rank states.
STARTING, RUNNING, STOPPED, EXITED, FAILED, RESTARTING = (
    RankState.STARTING,
    RankState.RUNNING,
    RankState.STOPPED,
    RankState.EXITED,
    RankState.FAILED,
    RankState.RESTARTING,
)
# The states in which a rank's process is alive: a signal or a stop can still reach it.
LIVE_STATES: tuple[RankState, ...] = (RankState.RUNNING, RankState.STOPPED)


class Phase(Word):
    """The run's phase, in the one vocabulary that the snapshot and the runner share.

    Once the run is over the snapshot's phase is its outcome (one of :data:`OUTCOMES`).
    """

    STARTING = "starting"  # before the first rendezvous; the runner: spawning workers
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"  # the workers run and the agent monitors them
    RESTARTING = "restarting"
    FINISHING = "finishing"  # the workers succeeded; the exit barrier
    STOPPING = "stopping"
    # The outcomes: the run is over.
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    PREEMPTED = "preempted"
    ERROR = "error"


# The phases of a run that is over (a RunFinished's outcome).
OUTCOMES: tuple[Phase, ...] = (
    Phase.SUCCEEDED,
    Phase.FAILED,
    Phase.STOPPED,
    Phase.PREEMPTED,
    Phase.ERROR,
)


@dataclass(frozen=True)
class RankView:
    """One local worker as the front ends show it."""

    local_rank: int
    global_rank: int
    pid: int
    attempt: int
    state: RankState
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
    """The whole run at one version. Plain data: safe to read from any thread.

    Its lists of events (``failures``, ``notices``, ``controls``, ...) are
    :class:`~tui_launch.core.model.history.History` views: read-only sequences that the next
    snapshot extends without copying them.
    """

    version: int = 0
    run: RunStarted | None = None
    phase: Phase = Phase.STARTING
    attempt: int = 0
    group_state: str = "INIT"
    rendezvous: RendezvousView | None = None
    rendezvous_live: RendezvousSample | None = None
    ranks: tuple[RankView, ...] = ()
    attempts: tuple[AttemptView, ...] = ()
    failures: History[Failure] = NO_EVENTS
    root_cause: Failure | None = None
    failure_restarts: int = 0
    manual_restarts: int = 0
    membership_restarts: int = 0
    budget_left: int = 0
    notices: History[Notice] = NO_EVENTS
    controls: History[ControlAction] = NO_EVENTS
    shutdown: Shutdown | None = None
    finished: RunFinished | None = None
    started_wall: float | None = None
    started_mono: float | None = None
    events: int = 0
    telemetry: TelemetryView | None = None
    cluster: ClusterSample | None = None
    node_changes: History[NodeChange] = NO_EVENTS
    connecting: Connecting | None = None  # while torch's rendezvous handler is being created
    store_retries: int = 0  # the TCPStore client's retries so far (torch's C++ warnings)
    launched_mono: float | None = None  # when the launcher began: durations count from here
    dumps: History[StacksDumped] = NO_EVENTS  # the run's stack dumps (the last 100), oldest first
    hang: HangDetected | None = None  # the latest confirmed hang of the current attempt
    hung_ranks: tuple[int, ...] = ()  # global ranks the Workers table marks as hanging
    hang_cleared: HangCleared | None = None  # the hang's ranks moved again (this attempt)
    hang_watch: HangWatchSample | None = None  # what the hang rule expects now
    job_stacks: History[JobStacks] = NO_EVENTS  # job-wide dumps (every node's ranks), oldest
    progress: ProgressView | None = None
    straggler: Straggler | None = None  # the inferred straggler (global_rank None: none now)
    decisions: History[PolicyDecision] = NO_EVENTS  # the restart policy's, oldest first
    preempted: Preempted | None = None  # the launcher was told it is being preempted
    saved: WorkersSaved | None = None  # how long the workers took to go after it
    # Each rank's newest collective (the Flight Recorder's polls), and the latest collective-level
    # verdict of a dump.
    collectives: CollectiveSample | None = None
    collective_verdict: CollectiveVerdictFound | None = None
    # The latest verdict on the live run's Flight Recorder dumps (NCCL's dump-on-timeout
    # files), by ``tuilaunch why``'s judge.
    flight_recorder: FlightRecorderVerdict | None = None

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


def recovered(s: Snapshot, f: Failure | None) -> bool:
    """Whether failure ``f`` was recovered: the group restarted and a later attempt's workers
    started (a run stopped after that did not end because of it)."""
    return f is not None and s.attempt > f.attempt and any(a.number > f.attempt for a in s.attempts)


# Seconds apart two exits can be seen for the same cause: a rank killed and the peer whose
# collective it broke, reaped in one look of the monitor (or the peer's first).
SAME_LOOK = 1.0


def pick_root_cause(failures: Iterable[Failure]) -> Failure | None:
    """The first real failure: earliest seen, never a peer the agent terminated itself, and
    not a rank that only says a peer broke when the one that broke exited with it."""
    failures = list(failures)
    real = [f for f in failures if not f.collateral] or failures
    if not real:
        return None
    first = min(f.time for f in real)
    near = [f for f in real if f.time - first <= SAME_LOOK]
    own = [f for f in near if not errors.peer_failure(f.message, f.traceback, *f.stderr_tail)]
    return min(own or real, key=lambda f: (f.time, f.global_rank))


__all__ = [
    "EXITED",
    "FAILED",
    "LIVE_STATES",
    "OUTCOMES",
    "RESTARTING",
    "RUNNING",
    "STARTING",
    "STOPPED",
    "AttemptView",
    "Phase",
    "RankState",
    "RankView",
    "RendezvousView",
    "Snapshot",
    "pick_root_cause",
    "recovered",
]
