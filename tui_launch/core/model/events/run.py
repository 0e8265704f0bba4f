"""The run's lifecycle: rendezvous, attempts, ranks, control actions, shutdown, the cluster
view, injected faults and log marks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tui_launch.core.model.events.base import Event, register


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of an attempt, as the agent assigned it."""

    local_rank: int
    global_rank: int
    role_rank: int
    world_size: int
    pid: int


@dataclass(frozen=True)
class Failure:
    """A rank that ended badly, with everything needed to explain it.

    ``collateral`` is True for peers that the agent itself terminated after another rank
    failed: they are kept for the record but are never the root cause.
    """

    attempt: int
    local_rank: int
    global_rank: int
    host: str
    pid: int
    exit_code: int
    signal: str | None
    hint: str | None
    time: float
    message: str
    traceback: str | None
    stderr_tail: tuple[str, ...]
    error_file: str | None
    collateral: bool = False
    caused_by: str | None = None
    # The stacks of the other ranks, taken before torch terminated them: the dump's
    # directory and one line per rank ("rank 0: all_reduce (train.py:12 in step)").
    stacks: str = ""
    peers: tuple[str, ...] = ()
    hung: bool = False  # the rank did not exit: a confirmed hang (--on-hang restart/stop)
    # Its class (core/model/failclass.py: startup, exception, oom, signal, backend, hang,
    # teardown, ...), a short detail (the exception's type, the OOM's source, the sender) and
    # the training step the rank was last seen at (None: none seen).
    failure_class: str = ""
    failure_detail: str = ""
    step: int | None = None


@dataclass(frozen=True)
class Participant:
    """A node in the rendezvous as this agent last saw it (cached state, no network I/O)."""

    node: str
    rank: int | None
    heartbeat_age: float | None
    this_node: bool = False


@dataclass(frozen=True)
class RendezvousSample(Event):
    """A reading of the rendezvous handler's cached state (a sample: not journaled)."""

    kind: ClassVar[str] = "rendezvous_sample"
    journaled: ClassVar[bool] = False
    round: int | None
    complete: bool | None
    closed: bool | None
    min_nodes: int | None
    max_nodes: int | None
    join_timeout: float | None
    participants: tuple[Participant, ...]
    waiting: tuple[str, ...]
    # The last-call deadline of a round in progress (wall clock), when torch has set one.
    deadline: float | None = None


@dataclass(frozen=True)
class Connecting(Event):
    """The launcher is creating torch's rendezvous handler (a sample: not journaled).

    For c10d that is a ``TCPStore`` on the endpoint, which blocks until the store answers or
    ``timeout`` passes: the front ends show what is being contacted, and for how long.
    """

    kind: ClassVar[str] = "connecting"
    journaled: ClassVar[bool] = False
    backend: str
    endpoint: str
    min_nodes: int
    max_nodes: int
    timeout: float | None  # the store's connect timeout (c10d: --rdzv-conf read_timeout, 60 s)
    join_timeout: float | None  # --rdzv-conf join_timeout (600 s)


@dataclass(frozen=True)
class StoreRetry(Event):
    """torch's TCPStore client failed to reach the store and retries (a sample).

    Parsed from torch's C++ warning, whose full text (with its stack frames) is in agent.log.
    """

    kind: ClassVar[str] = "store_retry"
    journaled: ClassVar[bool] = False
    endpoint: str
    attempt: int
    delay: float | None
    timeout: float | None


@dataclass(frozen=True)
class RunStarted(Event):
    """The launcher parsed its arguments and is about to start torch's agent."""

    kind: ClassVar[str] = "run_started"
    entrypoint: str
    args: tuple[str, ...]
    role: str
    nproc_per_node: int
    min_nodes: int
    max_nodes: int
    max_restarts: int
    backend: str
    endpoint: str
    run_id: str
    host: str
    launcher_pid: int
    torch_version: str
    notes: tuple[str, ...] = ()
    # When the launcher began (monotonic): before torch's rendezvous handler, whose creation
    # can block for a whole connect timeout. Durations count from here.
    launched_mono: float | None = None
    # For a report read elsewhere: tuilaunch's version, the launcher's own command line and
    # the environment variables that shape a run (``core/run/reports.py``'s ``RUN_ENV``), both
    # with the values of secret-named ones already replaced (``core/model/redact.py``).
    tuilaunch_version: str = ""
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    slurm_job: str | None = None  # SLURM_JOB_ID when the launcher runs in a Slurm job


@dataclass(frozen=True)
class RendezvousStarted(Event):
    """The agent entered a rendezvous (first start, restart or membership change)."""

    kind: ClassVar[str] = "rendezvous_started"
    attempt: int
    backend: str
    endpoint: str
    run_id: str


@dataclass(frozen=True)
class RendezvousCompleted(Event):
    """The rendezvous finished: this node knows its group rank and the world."""

    kind: ClassVar[str] = "rendezvous_completed"
    attempt: int
    round: int | None
    backend: str
    endpoint: str
    run_id: str
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    participants: tuple[str, ...]
    duration: float


@dataclass(frozen=True)
class WorkersStarted(Event):
    """The local worker group of an attempt was spawned."""

    kind: ClassVar[str] = "workers_started"
    attempt: int
    workers: tuple[WorkerInfo, ...]
    log_dir: str


@dataclass(frozen=True)
class RankExited(Event):
    """One worker process ended (seen by the monitor, or reaped after the agent stopped it)."""

    kind: ClassVar[str] = "rank_exited"
    attempt: int
    local_rank: int
    global_rank: int
    pid: int
    exit_code: int
    signal: str | None
    by_agent: bool


@dataclass(frozen=True)
class GroupState(Event):
    """The worker group changed state (torch's ``WorkerState`` names)."""

    kind: ClassVar[str] = "group_state"
    attempt: int
    state: str


@dataclass(frozen=True)
class AttemptFailed(Event):
    """An attempt ended with failed ranks; ``failures`` holds all of them, collateral included."""

    kind: ClassVar[str] = "attempt_failed"
    attempt: int
    failures: tuple[Failure, ...]


@dataclass(frozen=True)
class Restart(Event):
    """The agent restarts the worker group.

    ``cause`` is ``failure`` (spends the failure budget), ``manual`` (asked for through the
    control API) or ``membership`` (nodes joined or left).
    """

    kind: ClassVar[str] = "restart"
    cause: str
    from_attempt: int
    to_attempt: int
    restarts_used: int
    budget_left: int


@dataclass(frozen=True)
class PolicyDecision(Event):
    """The restart policy decided after a failed attempt (``core/model/policy.py``).

    ``action`` is ``restart`` or ``stop``; ``rule`` names the rule that decided (``startup``,
    ``same-failure``, ``storm``, ``teardown``, ``budget``, ``torchrun``...); ``saved`` is the
    number of restarts of ``--max-restarts`` it did not spend (0 for a restart); ``step`` the
    furthest training step the policy saw the attempt reach (None: none seen).
    """

    kind: ClassVar[str] = "policy_decision"
    attempt: int
    action: str
    rule: str
    reason: str
    failure_class: str
    saved: int = 0
    step: int | None = None


@dataclass(frozen=True)
class Preempted(Event):
    """The launcher was told it is being preempted (SIGTERM, or the scheduler's warning
    signal): the workers got ``signal`` and have ``grace`` seconds (``--shutdown-timeout``)
    before SIGKILL. ``deadline`` is that moment, on the wall clock."""

    kind: ClassVar[str] = "preempted"
    signal: str
    grace: float
    deadline: float


@dataclass(frozen=True)
class WorkersSaved(Event):
    """After a preemption signal: how long this node's workers took to exit (to save and go),
    and whether they all made it before SIGKILL."""

    kind: ClassVar[str] = "workers_saved"
    seconds: float
    in_time: bool
    exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ControlAction(Event):
    """Someone acted on the run through the control API (a key, a signal, an injection)."""

    kind: ClassVar[str] = "control"
    action: str
    local_rank: int | None
    global_rank: int | None
    pid: int | None
    signal: str | None
    source: str
    ok: bool
    detail: str = ""

    @classmethod
    def on_run(
        cls, action: str, source: str, ok: bool, detail: str = "", **stamp: float
    ) -> ControlAction:
        """An action on the whole run, not on one rank (a restart, a dump, a refusal)."""
        return cls(
            action=action,
            local_rank=None,
            global_rank=None,
            pid=None,
            signal=None,
            source=source,
            ok=ok,
            detail=detail,
            **stamp,
        )


@dataclass(frozen=True)
class ExitBarrier(Event):
    """The local group finished and the agent waits for the other nodes (``done`` when past it)."""

    kind: ClassVar[str] = "exit_barrier"
    attempt: int
    done: bool


@dataclass(frozen=True)
class Notice(Event):
    """Something the user should read once: a change tuilaunch made, a warning."""

    kind: ClassVar[str] = "notice"
    level: str
    message: str


@dataclass(frozen=True)
class Shutdown(Event):
    """The launcher is stopping the run (a signal, a quit, a stop request)."""

    kind: ClassVar[str] = "shutdown"
    reason: str
    signal: str | None


@dataclass(frozen=True)
class RunFinished(Event):
    """The run is over. ``outcome`` is succeeded, failed, stopped or error."""

    kind: ClassVar[str] = "run_finished"
    outcome: str
    exit_code: int
    message: str
    # The class of the failure that ended it ("" on success), and what the exit code means
    # in the exit-code table (docs/restart-policy.md): success, program, infrastructure,
    # preempted, usage, stopped.
    failure_class: str = ""
    meaning: str = ""


@dataclass(frozen=True)
class NodeStatus:
    """One node of the cluster view, as its agent last published it into the job's store."""

    node: str
    host: str
    pid: int
    state: str
    group_rank: int | None
    group_world_size: int | None
    local_world_size: int
    attempt: int
    ranks: tuple[tuple[int, int, int, str], ...]  # (global rank, local rank, pid, state)
    restarts: tuple[int, int, int]  # failure, manual, membership
    gpu: str | None
    error: str | None
    age: float | None  # seconds since it published, in whole seconds
    this_node: bool = False


@dataclass(frozen=True)
class ClusterSample(Event):
    """Every node's latest status read back from the store (not journaled: a live reading)."""

    kind: ClassVar[str] = "cluster_sample"
    journaled: ClassVar[bool] = False
    nodes: tuple[NodeStatus, ...]
    store: str
    error: str | None = None


@dataclass(frozen=True)
class NodeChange(Event):
    """Nodes joined or left the group between two rendezvous rounds."""

    kind: ClassVar[str] = "node_change"
    attempt: int
    joined: tuple[str, ...]
    left: tuple[str, ...]
    group_world_size: int


@dataclass(frozen=True)
class Injected(Event):
    """A fault was injected on purpose (``--inject`` or the dashboard's inject menu).

    ``spec`` is the spec as written back by ``InjectSpec.canonical``; ``count`` is which firing
    of it this is (1 of ``times``). ``ok`` is False when it could not be done (the rank had
    already exited, the worker has no bootstrap for ``exit``/``exception``), with ``detail``.
    """

    kind: ClassVar[str] = "injection"
    spec: str
    fault: str
    attempt: int
    global_rank: int | None
    local_rank: int | None
    pid: int | None
    count: int
    times: int
    source: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class LogMark(Event):
    """How far rank log files had been written, in whole lines, at this event's time.

    Posted by the log tailer at most once a second while files grow (and when an attempt's
    files close), with only the streams that moved: ``(attempt, local_rank, stream, offset)``.
    A replay cuts each rank's log at the last mark before its cursor. The snapshot ignores it.
    """

    kind: ClassVar[str] = "log_mark"
    offsets: tuple[tuple[int, int, str, int], ...]


register(
    PolicyDecision,
    Preempted,
    WorkersSaved,
    RunStarted,
    RendezvousStarted,
    RendezvousCompleted,
    WorkersStarted,
    RankExited,
    GroupState,
    AttemptFailed,
    Restart,
    ControlAction,
    ExitBarrier,
    Notice,
    Shutdown,
    RunFinished,
    RendezvousSample,
    ClusterSample,
    NodeChange,
    Connecting,
    StoreRetry,
    Injected,
    LogMark,
)
register(WorkersStarted, nested={"workers": WorkerInfo})
register(AttemptFailed, nested={"failures": Failure})
register(RendezvousSample, nested={"participants": Participant})
register(ClusterSample, nested={"nodes": NodeStatus})
