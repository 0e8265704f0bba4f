"""Plain-text renderings of events and failures, shared by the headless output and the journal.

Everything here takes store data and returns strings: no terminal, no colour, no I/O.
:func:`describe` dispatches an event to its type's describer, registered with
:func:`describes` (as a reducer is with ``@reduces``); the types that print nothing are named
in :data:`SILENT`, so a new event type is either said or silent on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tui_launch.core.model import errors, failclass
from tui_launch.core.model.events import (
    AttemptFailed,
    ClusterSample,
    CollectiveSample,
    CollectiveVerdictFound,
    Connecting,
    ControlAction,
    Event,
    EventTable,
    ExitBarrier,
    Failure,
    FlightRecorderVerdict,
    GroupState,
    HangCleared,
    HangDetected,
    HangWatchSample,
    Injected,
    JobStacks,
    LogMark,
    NodeChange,
    NodeStatus,
    Notice,
    PolicyDecision,
    Preempted,
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
    WorkersSaved,
    WorkersStarted,
)
from tui_launch.core.model.progress import describe_slowdown, straggler_line
from tui_launch.core.model.redact import redact_args
from tui_launch.core.model.snapshot import Phase

STDERR_CONTEXT = 3  # plain trailing stderr lines shown for context when they hold no error
E = TypeVar("E", bound=Event)


def clock(seconds: float | None) -> str:
    """``1:02:03`` (or ``-`` for unknown)."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


# Binary multiples, in the names people read them by (each step 1024).
_BYTE_UNITS = (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10))


def fmt_bytes(n: float | None, words: bool = False, tenths: bool = False) -> str:
    """Bytes for people (``-`` for unknown), the one formatter of sizes.

    Compact, for a table's cell: ``512M``, ``12.3G``, ``3K``. In ``words``, for a sentence:
    ``4 MB``, ``1.5 GB``, ``24 B``, with a tenth only below 10 of a unit and only when it is
    not whole; with ``tenths`` always one (``2.0 MB, 512.0 kB free``: a file system's space).
    """
    if n is None:
        return "-"
    if not words:
        if n >= 1 << 30:
            return f"{n / (1 << 30):.1f}G"
        if n >= 1 << 20:
            return f"{n / (1 << 20):.0f}M"
        return f"{n / 1024:.0f}K"
    for unit, scale in _BYTE_UNITS:
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if tenths or (v < 10 and v != int(v)) else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


def describe(e: Event) -> str | None:
    """One line for an event, or None for events too fine-grained to print."""
    fn = DESCRIBERS.get(type(e))
    return None if fn is None else fn(e)


# An event type's line, registered with @describes as its reducer is with @reduces: every event
# type has a describer or is named in SILENT (tests/test_dispatch.py checks it).
Describer = Callable[[Any], str | None]
DESCRIBERS: EventTable[Describer] = EventTable("describer")


def describes(
    kind: type[E],
) -> Callable[[Callable[[E], str | None]], Callable[[E], str | None]]:
    """Register the decorated function as the line of ``kind`` (and of its subclasses that
    have none of their own)."""

    def register(fn: Callable[[E], str | None]) -> Callable[[E], str | None]:
        DESCRIBERS.add(kind, fn)
        return fn

    return register


def _silent(e: Event) -> None:
    return None


# Too fine-grained to print (samples, their journaled twins with them, log marks), or said by
# another event's line (a verdict by its dump's, a store retry by the launcher's stderr).
SILENT: tuple[type[Event], ...] = (
    ClusterSample,
    CollectiveSample,
    CollectiveVerdictFound,
    Connecting,
    HangWatchSample,
    LogMark,
    ProgressSample,
    RendezvousSample,
    StoreRetry,
    TelemetrySample,
    TelemetryTotals,
)
for _kind in SILENT:
    DESCRIBERS.add(_kind, _silent)


@describes(NodeChange)
def _node_change(e: NodeChange) -> str:
    parts = [f"+{n}" for n in e.joined] + [f"-{n}" for n in e.left]
    return f"nodes: attempt {e.attempt} has {e.group_world_size} node(s)" + (
        f" ({', '.join(parts)})" if parts else ""
    )


@describes(RunStarted)
def _run_started(e: RunStarted) -> str:
    script = " ".join(redact_args((e.entrypoint, *e.args)))  # an older journal's too
    nodes = str(e.min_nodes) if e.min_nodes == e.max_nodes else f"{e.min_nodes}:{e.max_nodes}"
    slurm = f" | slurm job {e.slurm_job}" if e.slurm_job else ""
    return (
        f"launch {script} | {e.nproc_per_node} worker(s) x {nodes} node(s) | "
        f"{e.backend} {e.endpoint} run {e.run_id} | max restarts {e.max_restarts}{slurm}"
    )


@describes(RendezvousStarted)
def _rendezvous_started(e: RendezvousStarted) -> str:
    return f"rendezvous: joining ({e.backend} {e.endpoint})"


@describes(RendezvousCompleted)
def _rendezvous_completed(e: RendezvousCompleted) -> str:
    rnd = f"round {e.round}, " if e.round is not None else ""
    return (
        f"rendezvous complete: {rnd}node {e.group_rank} of {e.group_world_size}, "
        f"master {e.master_addr}:{e.master_port} ({e.duration:.2f}s)"
    )


@describes(WorkersStarted)
def _workers_started(e: WorkersStarted) -> str:
    ranks = ", ".join(f"rank {w.global_rank}=pid {w.pid}" for w in e.workers)
    world = e.workers[0].world_size if e.workers else 0
    return f"attempt {e.attempt}: started {ranks} (world size {world})"


@describes(RankExited)
def _rank_exited(e: RankExited) -> str | None:
    if e.exit_code == 0 or e.by_agent:
        return None
    return (
        f"rank {e.global_rank} (local {e.local_rank}, pid {e.pid}) exited: "
        f"{errors.describe_exit(e.exit_code)}"
    )


@describes(GroupState)
def _group_state(e: GroupState) -> str | None:
    if e.state == "HEALTHY":
        return None
    return f"attempt {e.attempt}: worker group {e.state}"


@describes(AttemptFailed)
def _attempt_failed(e: AttemptFailed) -> str:
    real = [f for f in e.failures if not f.collateral]
    first = min(real or e.failures, key=lambda f: f.time)
    # Ranks that failed by themselves are not "terminated by the agent": count each kind.
    failed = sum(1 for f in e.failures if f is not first and not f.collateral)
    terminated = sum(1 for f in e.failures if f is not first and f.collateral)
    extra = [f"+{failed} more failed"] if failed else []
    extra += [f"+{terminated} terminated by the agent"] if terminated else []
    more = f" ({', '.join(extra)})" if extra else ""
    return f"attempt {e.attempt} failed: {failure_headline(first)}{more}"


@describes(Restart)
def _restart(e: Restart) -> str:
    budget = f"{e.budget_left} failure restart(s) left"
    return f"restart ({e.cause}): attempt {e.from_attempt} -> {e.to_attempt}, {budget}"


@describes(ControlAction)
def _control(e: ControlAction) -> str:
    who = f"rank {e.global_rank}" if e.global_rank is not None else "group"
    status = "" if e.ok else f" failed: {e.detail}"
    sig = f" {e.signal}" if e.signal and e.action == "signal" else ""
    return f"{e.action}{sig} {who} (from {e.source}){status}"


@describes(ExitBarrier)
def _exit_barrier(e: ExitBarrier) -> str | None:
    return None if e.done else "workers done; waiting for the other nodes (exit barrier)"


@describes(Notice)
def _notice(e: Notice) -> str:
    return e.message


@describes(FlightRecorderVerdict)
def _flight_recorder(e: FlightRecorderVerdict) -> str:
    return f"flight recorder ({fr_source(e)}): {e.verdict}"


def fr_source(e: FlightRecorderVerdict) -> str:
    """What a Flight Recorder verdict judged, in words: ``64 NCCL dumps``."""
    what = "NCCL dump" if e.source == "nccl" else "dump"
    return f"{e.dumps} {what}{'s' if e.dumps != 1 else ''}"


@describes(Shutdown)
def _shutdown(e: Shutdown) -> str:
    sig = f" ({e.signal})" if e.signal else ""
    return f"shutting down: {e.reason}{sig}"


@describes(RunFinished)
def _run_finished(e: RunFinished) -> str:
    return f"run {e.outcome} (exit code {e.exit_code}): {e.message}"


@describes(PolicyDecision)
def _policy(e: PolicyDecision) -> str:
    saved = f"; saved {e.saved} restart(s) of --max-restarts" if e.saved else ""
    what = failclass.describe(e.failure_class, "")
    return f"restart policy: {e.action} after attempt {e.attempt} ({what}): {e.reason}{saved}"


@describes(Preempted)
def _preempted(e: Preempted) -> str:
    return (
        f"PREEMPTED ({e.signal}): the workers got {e.signal} and have {e.grace:g}s "
        f"(--shutdown-timeout) to save before SIGKILL"
    )


@describes(WorkersSaved)
def _workers_saved(e: WorkersSaved) -> str:
    ok = "all exited in time" if e.in_time else "not all in time: SIGKILLed"
    return f"preempted: the workers took {e.seconds:.1f}s to save and exit ({ok})"


@describes(StacksDumped)
def _stacks_dumped(e: StacksDumped) -> str:
    note = f" ({e.note})" if e.note else ""
    asked = ", asked by another node" if e.source == "remote" else ""
    return (
        f"stacks ({e.reason}{asked}) of ranks {_ranks(e.ranks)} in {e.duration:.2f}s: "
        f"{e.verdict}{note} -> {e.path}"
    )


def stood_still(e: HangDetected) -> str:
    """How long a hung job stood still against its normal time ("no step for 41 s; steps took
    0.8 s"); a journal from before the adaptive rule says its silence."""
    return e.stood_still or f"no output for {e.silence:.0f}s"


@describes(HangDetected)
def _hang(e: HangDetected) -> str:
    then = {"dump": "keeps running", "restart": "restarting", "stop": "stopping"}
    return (
        f"HANG attempt {e.attempt}: {stood_still(e)}, {e.confirmation}; "
        f"{e.verdict} (--on-hang {e.action}: {then.get(e.action, e.action)})"
    )


@describes(HangCleared)
def _hang_cleared(e: HangCleared) -> str:
    if e.suspected:
        named = f", ranks {_ranks(e.ranks)}" if e.ranks else ""
        return f"hang suspicion cleared (attempt {e.attempt}{named}): {e.detail or e.why}"
    return f"hang over (attempt {e.attempt}, ranks {_ranks(e.ranks)}): {e.detail or e.why}"


@describes(JobStacks)
def _job_stacks(e: JobStacks) -> str:
    where = f" -> {e.path}" if e.path else ""
    return (
        f"stacks of the job ({e.reason}, asked by {e.requested_by}): {len(e.ranks)} ranks "
        f"on {len(e.nodes)} node(s): {e.verdict}{where}"
    )


describes(Slowdown)(describe_slowdown)
describes(Straggler)(straggler_line)


def _ranks(ranks: tuple[int, ...]) -> str:
    return rank_list(ranks)


@describes(Injected)
def describe_injection(e: Injected) -> str:
    """``inject kill:rank=1,after=2s (1 of 3): rank 1 (local 1, pid 42), attempt 0``."""
    n = f" ({e.count} of {e.times})" if e.times > 1 else ""
    if e.fault == "node":
        where = f"node of rank {e.global_rank}, with its agent"
    else:
        where = f"rank {e.global_rank} (local {e.local_rank}, pid {e.pid})"
    status = "" if e.ok else f" failed: {e.detail}"
    via = "" if e.source == "--inject" else f" from {e.source}"
    return f"inject {e.spec}{n}{via}: {where}, attempt {e.attempt}{status}"


def failure_headline(f: Failure) -> str:
    """``rank 1 (local 1, pid 123): SIGKILL (-9)`` plus the message's first line."""
    if f.hung:
        return f"rank {f.global_rank} (local {f.local_rank}, pid {f.pid}) {f.message}"
    what = errors.describe_exit(f.exit_code)
    msg = f.message.splitlines()[0] if f.message else ""
    tail = f": {msg}" if msg and not msg.startswith(("Signal ", "SIG")) else ""
    return f"rank {f.global_rank} (local {f.local_rank}, pid {f.pid}) {what}{tail}"


def failure_details(f: Failure) -> list[str]:
    """Every line worth showing about one failure, traceback or stderr tail included."""
    exit_text = errors.describe_exit(f.exit_code)
    if f.hung:
        # A hung rank's exit is the signal tuilaunch ended it with (0: it had not exited).
        ended = "hung, ended by tuilaunch (--on-hang)"
        exit_text = f"{exit_text}: {ended}" if f.exit_code else f"none: {ended}"
    lines = [
        f"rank       : {f.global_rank} (local rank {f.local_rank}) on {f.host}, pid {f.pid}",
        f"exit       : {exit_text}",
    ]
    if f.hint:
        lines.append(f"hint       : {f.hint}")
    if f.caused_by:
        lines.append(f"cause      : {f.caused_by}")
    if f.failure_class:
        lines.append(f"class      : {failclass.describe(f.failure_class, f.failure_detail)}")
    lines.append(f"attempt    : {f.attempt}")
    if f.message:
        lines.append(f"error      : {f.message.splitlines()[0]}")
    if f.error_file:
        lines.append(f"error file : {f.error_file}")
    if f.stacks:
        lines.append(f"stacks     : {f.stacks}")
    if f.peers:
        lines.append("other ranks, before torch terminated them:" if not f.hung else "ranks:")
        lines.extend("  " + p for p in f.peers)
    if f.traceback:
        lines.append("traceback  :")
        lines.extend("  " + ln for ln in f.traceback.rstrip().splitlines())
    elif f.stderr_tail and errors.has_error_signature(f.stderr_tail):
        lines.append(f"stderr (last {len(f.stderr_tail)} lines, no @record traceback):")
        lines.extend("  " + ln for ln in f.stderr_tail)
    elif f.stderr_tail:
        # Not evidence: what the rank happened to print last before it ended.
        n = len(f.stderr_tail[-STDERR_CONTEXT:])
        lines.append(f"last {n} stderr line(s), no traceback or error in them:")
        lines.extend("  " + ln for ln in f.stderr_tail[-STDERR_CONTEXT:])
    return lines


def cluster_lines(nodes: tuple[NodeStatus, ...], stale_after: float) -> dict[str, str]:
    """One plain line per node for the headless output (keyed by node id)."""
    out = {}
    for n in nodes:
        by_state: dict[str, list[str]] = {}
        for g, _lr, _p, st in n.ranks:
            by_state.setdefault(st, []).append(str(g))
        ranks = "; ".join(f"{','.join(gs)} {st}" for st, gs in by_state.items()) or "none"
        where = f"node {n.group_rank} of {n.group_world_size}" if n.group_rank is not None else ""
        where += f" on {n.host}" if not n.node.startswith(n.host + ":") else ""
        where = f" ({where.strip()})" if where.strip() else ""
        f, m, mb = (*n.restarts, 0, 0, 0)[:3]
        lost = n.age is not None and n.age > stale_after
        kinds = ((f, "after a failure"), (m, "manual"), (mb, "for a membership change"))
        restarts = ", ".join(f"{k} {what}" for k, what in kinds if k)
        line = (
            f"{n.node}{where}: {'LOST, ' if lost else ''}{n.state}, attempt {n.attempt}, "
            f"ranks {ranks}, " + (f"restarts: {restarts}" if restarts else "no restarts")
        )
        if n.gpu:
            line += f", gpu {n.gpu}"
        # A node that succeeded may still publish an error it recovered from: not current.
        if n.error and n.state != Phase.SUCCEEDED:
            line += f", error: {n.error}"
        out[n.node] = " ".join(line.split())
    return out


def rank_list(ranks: Iterable[int]) -> str:
    """``0, 2-7``: sorted ranks with runs of three or more folded into ranges."""
    nums = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{nums[i]}-{nums[j]}")
        else:
            parts.extend(str(n) for n in nums[i : j + 1])
        i = j + 1
    return ", ".join(parts)
