"""Reducers of the run's lifecycle events: rendezvous, workers, attempts, restarts, the end."""

from __future__ import annotations

from dataclasses import replace

from tui_launch.core.model.events import (
    AttemptFailed,
    ClusterSample,
    Connecting,
    ControlAction,
    ExitBarrier,
    GroupState,
    NodeChange,
    Notice,
    PolicyDecision,
    Preempted,
    RankExited,
    RendezvousCompleted,
    RendezvousSample,
    RendezvousStarted,
    Restart,
    RunFinished,
    RunStarted,
    Shutdown,
    StoreRetry,
    WorkersSaved,
    WorkersStarted,
)
from tui_launch.core.model.history import History
from tui_launch.core.model.reducers.base import reduces
from tui_launch.core.model.snapshot import (
    EXITED,
    FAILED,
    OUTCOMES,
    RESTARTING,
    RUNNING,
    STOPPED,
    AttemptView,
    Phase,
    RankView,
    RendezvousView,
    Snapshot,
    pick_root_cause,
)

# Every control action is journaled; the snapshot keeps the latest for the dashboard.
CONTROLS_KEPT = 200


def _close_attempt(
    attempts: tuple[AttemptView, ...], when: float, reason: str
) -> tuple[AttemptView, ...]:
    if attempts and attempts[-1].ended is None:
        return (*attempts[:-1], replace(attempts[-1], ended=when, end_reason=reason))
    return attempts


def _restarting(ranks: tuple[RankView, ...]) -> tuple[RankView, ...]:
    """The ranks once the group restarts: those still alive are restarting."""
    return tuple(r if r.state in (EXITED, FAILED) else replace(r, state=RESTARTING) for r in ranks)


@reduces(RendezvousSample)
def _rendezvous_sample(s: Snapshot, e: RendezvousSample) -> Snapshot:
    return replace(s, rendezvous_live=e)


@reduces(Connecting)
def _connecting(s: Snapshot, e: Connecting) -> Snapshot:
    launched = s.launched_mono if s.launched_mono is not None else e.mono
    return replace(s, connecting=e, launched_mono=launched)


@reduces(StoreRetry)
def _store_retry(s: Snapshot, e: StoreRetry) -> Snapshot:
    return replace(s, store_retries=s.store_retries + 1)


@reduces(ClusterSample)
def _cluster(s: Snapshot, e: ClusterSample) -> Snapshot:
    return replace(s, cluster=e)


@reduces(NodeChange)
def _node_change(s: Snapshot, e: NodeChange) -> Snapshot:
    # Shown in the attempt timeline: the attempt that starts next has these nodes.
    return replace(s, node_changes=History.of(s.node_changes).appended(e))


@reduces(RunStarted)
def _run_started(s: Snapshot, e: RunStarted) -> Snapshot:
    began = e.launched_mono if e.launched_mono is not None else s.launched_mono
    return replace(
        s,
        run=e,
        budget_left=e.max_restarts,
        started_wall=e.wall,
        started_mono=e.mono,
        launched_mono=e.mono if began is None else began,
    )


@reduces(RendezvousStarted)
def _rendezvous_started(s: Snapshot, e: RendezvousStarted) -> Snapshot:
    # A new round: what the last one decided (group rank, master) no longer holds.
    rv = RendezvousView(
        backend=e.backend, endpoint=e.endpoint, run_id=e.run_id, state="waiting", since=e.mono
    )
    phase = Phase.RENDEZVOUS if e.attempt == 0 and not s.attempts else Phase.RESTARTING
    return replace(s, rendezvous=rv, phase=phase, ranks=_restarting(s.ranks))


@reduces(RendezvousCompleted)
def _rendezvous_completed(s: Snapshot, e: RendezvousCompleted) -> Snapshot:
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


@reduces(WorkersStarted)
def _workers_started(s: Snapshot, e: WorkersStarted) -> Snapshot:
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


@reduces(RankExited)
def _rank_exited(s: Snapshot, e: RankExited) -> Snapshot:
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


@reduces(GroupState)
def _group_state(s: Snapshot, e: GroupState) -> Snapshot:
    phase = Phase.FINISHING if e.state == "SUCCEEDED" else s.phase
    return replace(s, group_state=e.state, phase=phase)


@reduces(AttemptFailed)
def _attempt_failed(s: Snapshot, e: AttemptFailed) -> Snapshot:
    failures = History.of(s.failures).extended(e.failures)
    return replace(s, failures=failures, root_cause=pick_root_cause(e.failures))


# Which counter a restart adds to, by its cause (an unknown cause counts as a failure's).
_RESTART_COUNTERS = {
    "failure": "failure_restarts",
    "manual": "manual_restarts",
    "membership": "membership_restarts",
}


@reduces(Restart)
def _restart(s: Snapshot, e: Restart) -> Snapshot:
    name = _RESTART_COUNTERS.get(e.cause, "failure_restarts")
    s = replace(s, **{name: getattr(s, name) + 1})
    return replace(
        s,
        attempts=_close_attempt(s.attempts, e.wall, e.cause),
        budget_left=e.budget_left,
        phase=Phase.RESTARTING,
        ranks=_restarting(s.ranks),
    )


@reduces(ControlAction)
def _control(s: Snapshot, e: ControlAction) -> Snapshot:
    s = replace(s, controls=History.of(s.controls).appended(e, CONTROLS_KEPT))
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


@reduces(ExitBarrier)
def _exit_barrier(s: Snapshot, e: ExitBarrier) -> Snapshot:
    return replace(s, phase=Phase.FINISHING if not e.done else s.phase)


@reduces(Notice)
def _notice(s: Snapshot, e: Notice) -> Snapshot:
    return replace(s, notices=History.of(s.notices).appended(e))


@reduces(Shutdown)
def _shutdown(s: Snapshot, e: Shutdown) -> Snapshot:
    return replace(s, shutdown=e, phase=Phase.STOPPING)


@reduces(RunFinished)
def _run_finished(s: Snapshot, e: RunFinished) -> Snapshot:
    attempts = _close_attempt(s.attempts, e.wall, e.outcome)
    closed = s.rendezvous
    if closed is not None and closed.state == "waiting":
        closed = replace(closed, state="closed")
    # An outcome this version does not know (a newer journal's) reads as an error, not a crash.
    phase = Phase(e.outcome) if e.outcome in OUTCOMES else Phase.ERROR
    return replace(s, finished=e, phase=phase, attempts=attempts, rendezvous=closed)


@reduces(PolicyDecision)
def _policy(s: Snapshot, e: PolicyDecision) -> Snapshot:
    return replace(s, decisions=History.of(s.decisions).appended(e))


@reduces(Preempted)
def _preempted(s: Snapshot, e: Preempted) -> Snapshot:
    return replace(s, preempted=e)


@reduces(WorkersSaved)
def _saved(s: Snapshot, e: WorkersSaved) -> Snapshot:
    return replace(s, saved=e)
