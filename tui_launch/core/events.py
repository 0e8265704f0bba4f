"""Typed, immutable records of every transition of a run.

Producers (the agent thread, the runner, log tailers) create events and post them to the
:class:`~tui_launch.core.store.RunStore`; the store folds them into snapshots and the journal
writes each one as a JSON line. Events are plain frozen dataclasses made of str, int, float,
bool, None and tuples of those (or of other frozen records), so that they serialise to JSON and
back without a schema of their own (:func:`to_dict`, :func:`from_dict`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar


def _now_mono() -> float:
    return time.monotonic()


def _now_wall() -> float:
    return time.time()


@dataclass(frozen=True)
class Event:
    """Base class: every event carries when it happened, on both clocks."""

    kind: ClassVar[str] = "event"
    # Samples (live readings that change all the time) update the snapshot but are kept out
    # of the history and the journal.
    journaled: ClassVar[bool] = True
    mono: float = field(default_factory=_now_mono, kw_only=True)
    wall: float = field(default_factory=_now_wall, kw_only=True)


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
    # The stacks of the other ranks, taken before torch terminated them (issue 14): the dump's
    # directory and one line per rank ("rank 0: all_reduce (train.py:12 in step)").
    stacks: str = ""
    peers: tuple[str, ...] = ()
    hung: bool = False  # the rank did not exit: a confirmed hang (--on-hang restart/stop)


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


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
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
    )
}

_NESTED: dict[tuple[str, str], type[Any]] = {
    ("workers_started", "workers"): WorkerInfo,
    ("attempt_failed", "failures"): Failure,
    ("rendezvous_sample", "participants"): Participant,
    ("cluster_sample", "nodes"): NodeStatus,
}


def to_dict(event: Event) -> dict[str, Any]:
    """Return ``event`` as a JSON-ready dict with its ``kind`` first."""
    return {"kind": event.kind, **dataclasses.asdict(event)}


def from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from :func:`to_dict`'s output (as read back from a journal)."""
    data = dict(data)
    kind = data.pop("kind")
    data.pop("seq", None)
    cls = EVENT_TYPES[kind]
    for (k, name), nested in _NESTED.items():
        if k == kind and name in data:
            data[name] = tuple(nested(**_tuplify(item)) for item in data[name])
    return cls(**_tuplify(data))


def _tuplify(data: dict[str, Any]) -> dict[str, Any]:
    # JSON turns tuples into lists; frozen records want tuples back so they stay hashable.
    return {k: _deep_tuple(v) for k, v in data.items()}


def _deep_tuple(value: Any) -> Any:
    # Nested too: a node's ranks are tuples of tuples.
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


# ----------------------------------------------------------------- telemetry (issue 4)


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one sampler tick. None means not available (not supported, no permission).

    ``state`` is ``ok`` or ``lost`` (NVML said the GPU is lost; it is no longer queried).
    Memory is in bytes, power in watts, temperature in degrees Celsius.
    """

    index: int
    name: str
    uuid: str
    util: int | None
    mem_used: int | None
    mem_total: int | None
    temp: int | None = None
    power: float | None = None
    power_limit: float | None = None
    state: str = "ok"


@dataclass(frozen=True)
class RankReading:
    """One local rank's process tree at one sampler tick.

    ``cpu`` is percent of one core, summed over the tree (data-loader workers included); ``rss``
    bytes summed over the tree; ``status`` is the rank process's psutil status (running,
    sleeping, disk-sleep, stopped, zombie, ...); ``d_state`` counts processes of the tree in
    uninterruptible disk sleep. ``mapping`` says how ``gpus`` were found: ``pid`` (the tree's
    pids are in NVML's process lists; ``gpu_mem``/``gpu_util`` are the tree's own), ``inferred``
    (from LOCAL_RANK and CUDA_VISIBLE_DEVICES; the figures are the whole device's) or None.
    """

    local_rank: int
    global_rank: int
    pid: int
    cpu: float | None
    rss: int | None
    threads: int | None
    status: str | None
    procs: int = 1
    d_state: int = 0
    gpus: tuple[int, ...] = ()
    mapping: str | None = None
    gpu_mem: int | None = None
    gpu_util: int | None = None


@dataclass(frozen=True)
class TelemetrySample(Event):
    """A sampler tick: every rank's process tree and every GPU (a sample: not journaled).

    ``gpu_state`` is ``ok``, ``off`` (``--no-gpu``), ``no-library``, ``no-driver``,
    ``no-devices``, ``permission``, ``lost`` (NVML failed mid-run) or ``error``; ``gpu_note``
    says it in words. ``simulated`` is True when the readings come from the fake NVML.
    """

    kind: ClassVar[str] = "telemetry_sample"
    journaled: ClassVar[bool] = False
    attempt: int
    gpu_state: str
    gpu_note: str
    gpus: tuple[GpuReading, ...]
    ranks: tuple[RankReading, ...]
    simulated: bool = False


@dataclass(frozen=True)
class TelemetryRecord(TelemetrySample):
    """The same reading, at the journal's low rate (every 10 s by default)."""

    kind: ClassVar[str] = "telemetry"
    journaled: ClassVar[bool] = True


@dataclass(frozen=True)
class RankTotals:
    """One rank of one attempt over the whole run, for the end summary."""

    attempt: int
    local_rank: int
    global_rank: int
    samples: int = 0
    peak_rss: int | None = None
    cpu_sum: float = 0.0
    cpu_n: int = 0
    peak_gpu_mem: int | None = None
    gpu_util_sum: float = 0.0
    gpu_util_n: int = 0
    mapping: str | None = None

    @property
    def mean_cpu(self) -> float | None:
        """Mean CPU % over the samples that had one."""
        return self.cpu_sum / self.cpu_n if self.cpu_n else None

    @property
    def mean_gpu_util(self) -> float | None:
        """Mean GPU utilisation % over the samples that had one."""
        return self.gpu_util_sum / self.gpu_util_n if self.gpu_util_n else None


@dataclass(frozen=True)
class TelemetryTotals(Event):
    """The sampler stopped: per-rank totals over every sample, live ones included, so that a
    replayed journal (which holds only every 10 s's sample) gives the same end summary."""

    kind: ClassVar[str] = "telemetry_totals"
    totals: tuple[RankTotals, ...]


EVENT_TYPES[TelemetrySample.kind] = TelemetrySample
EVENT_TYPES[TelemetryRecord.kind] = TelemetryRecord
EVENT_TYPES[TelemetryTotals.kind] = TelemetryTotals
_NESTED[(TelemetryTotals.kind, "totals")] = RankTotals
for _kind in (TelemetrySample.kind, TelemetryRecord.kind):
    _NESTED[(_kind, "gpus")] = GpuReading
    _NESTED[(_kind, "ranks")] = RankReading


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


EVENT_TYPES[Injected.kind] = Injected


@dataclass(frozen=True)
class LogMark(Event):
    """How far rank log files had been written, in whole lines, at this event's time.

    Posted by the log tailer at most once a second while files grow (and when an attempt's
    files close), with only the streams that moved: ``(attempt, local_rank, stream, offset)``.
    A replay cuts each rank's log at the last mark before its cursor. The snapshot ignores it.
    """

    kind: ClassVar[str] = "log_mark"
    offsets: tuple[tuple[int, int, str, int], ...]


EVENT_TYPES[LogMark.kind] = LogMark
# ----------------------------------------------------------------- progress (issue 15)


@dataclass(frozen=True)
class RankProgress:
    """One printing rank's progress at one watcher tick (from its log lines, no code change).

    ``rate`` is ours (steps/s from arrival times over a window), ``claimed_rate`` what the
    line says (an EMA or a lifetime mean); ``eta`` seconds to ``total`` at our rate;
    ``step_time`` seconds per step (claimed, else 1/rate); ``last_step_ago`` seconds since the
    training counter last moved; ``stalled_for`` seconds since any counter (train or eval)
    moved. ``slow``: the rate has stayed below 80 % of the best sustained rate for a minute;
    ``stalled``: the counters stopped for longer than the stall threshold.
    """

    global_rank: int
    local_rank: int
    stream: str
    step: int | None
    total: int | None
    epoch: float | None = None
    rate: float | None = None
    claimed_rate: float | None = None
    eta: float | None = None
    loss: float | None = None
    step_time: float | None = None
    last_step_ago: float | None = None
    best_rate: float | None = None
    slow: bool = False
    stalled: bool = False
    stalled_for: float | None = None
    fmt: str | None = None
    finished: bool = False


@dataclass(frozen=True)
class ProgressSample(Event):
    """A progress-watcher tick (about 1 Hz; a sample: not journaled).

    ``leader`` is the global rank whose training bar is the job's progress (the most advanced
    printing rank). The goodput facts are the attempt's so far: the first step counter it
    printed (``first_step``: what it resumed from), seconds from the workers' start to the
    first step (``time_to_first_step``), the highest step reached, and the seconds the job
    was making progress.
    """

    kind: ClassVar[str] = "progress_sample"
    journaled: ClassVar[bool] = False
    attempt: int
    leader: int | None
    ranks: tuple[RankProgress, ...]
    first_step: int | None = None
    time_to_first_step: float | None = None
    steps_reached: int | None = None
    progress_time: float = 0.0


@dataclass(frozen=True)
class ProgressRecord(ProgressSample):
    """The same reading at the journal's low rate (every 10 s, and the last one of each
    attempt), so that a replayed journal gives the same goodput summary."""

    kind: ClassVar[str] = "progress"
    journaled: ClassVar[bool] = True


@dataclass(frozen=True)
class Slowdown(Event):
    """A rank's progress slowed down or stopped (``active``), or recovered (not ``active``).

    ``what`` is ``slow`` (rate below 80 % of the best sustained rate for a minute) or
    ``stalled`` (the step counter stopped); ``rate``/``best_rate`` in steps/s.
    """

    kind: ClassVar[str] = "slowdown"
    attempt: int
    global_rank: int
    what: str
    active: bool
    rate: float | None
    best_rate: float | None
    stalled_for: float | None = None


EVENT_TYPES[ProgressSample.kind] = ProgressSample
EVENT_TYPES[ProgressRecord.kind] = ProgressRecord
EVENT_TYPES[Slowdown.kind] = Slowdown
for _kind in (ProgressSample.kind, ProgressRecord.kind):
    _NESTED[(_kind, "ranks")] = RankProgress

# ----------------------------------------------------------------- stack dumps (issue 14)


@dataclass(frozen=True)
class StacksDumped(Event):
    """Every local rank's stacks were dumped and kept in the run directory.

    ``reason`` is why (``key``, ``api``, ``hang``, ``hang-confirm``, ``before-kill``, ...);
    ``ranks`` the global ranks dumped; ``verdict`` the one-line verdict ("rank 1 is not in a
    collective: ..."); ``odd_ranks`` the ranks it names; ``path`` the dump's directory
    (``stacks.txt`` and ``stacks.json``). ``note`` says why the dump is incomplete when there
    is a fix (ptrace not permitted, no py-spy).
    """

    kind: ClassVar[str] = "stacks_dumped"
    reason: str
    attempt: int
    ranks: tuple[int, ...]
    verdict: str
    odd_ranks: tuple[int, ...]
    path: str
    method: str = "py-spy"
    duration: float = 0.0
    note: str = ""
    # Where each rank is, one line each ("rank 0: all_reduce (train.py:12 in step)"): what the
    # root cause, the headless summary and the cluster view show without reading the files.
    places: tuple[str, ...] = ()
    source: str = ""  # who asked (dashboard, api, hang, before-kill)


EVENT_TYPES[StacksDumped.kind] = StacksDumped


@dataclass(frozen=True)
class HangDetected(Event):
    """No rank wrote output for ``silence`` seconds and two dumps ``interval`` seconds apart
    showed main-thread stacks that did not move (``still_ranks``): the job is hung.

    ``confirmation`` says it in one line ("hung: no main-thread stack moved in 10 s ..."),
    ``verdict`` is the second dump's verdict and ``odd_ranks`` the ranks it names; the two
    dumps are kept at ``first_path`` and ``second_path``. ``action`` is what ``--on-hang``
    does about it (``dump``, ``restart`` or ``stop``).
    """

    kind: ClassVar[str] = "hang"
    attempt: int
    silence: float
    interval: float
    still_ranks: tuple[int, ...]
    confirmation: str
    verdict: str
    odd_ranks: tuple[int, ...]
    first_path: str
    second_path: str
    action: str = "dump"


EVENT_TYPES[HangDetected.kind] = HangDetected


@dataclass(frozen=True)
class Straggler(Event):
    """The straggler inferred from stack samples changed (issue 15): ``global_rank`` is the
    rank almost never found inside a collective while every other rank almost always is (None:
    no straggler any more). ``shares``: per global rank, the share of its recent samples inside
    a collective; ``samples``: the fewest samples of any rank; ``cpu``: each rank's CPU % from
    the telemetry at that moment (evidence, None when unknown)."""

    kind: ClassVar[str] = "straggler"
    attempt: int
    global_rank: int | None
    shares: tuple[tuple[int, float], ...]
    samples: int
    cpu: tuple[tuple[int, float | None], ...] = ()


EVENT_TYPES[Straggler.kind] = Straggler
