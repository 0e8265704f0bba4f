"""Diagnosis: progress read from the logs, stack dumps, hangs and stragglers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tui_launch.core.model.events.base import Event, register


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


@dataclass(frozen=True)
class HangDetected(Event):
    """No rank wrote output for ``silence`` seconds and two dumps ``interval`` seconds apart
    showed main-thread stacks that did not move (``still_ranks``): the job is hung.

    ``confirmation`` says it in one line ("hung: no main-thread stack moved in 10 s ..."),
    ``verdict`` is the second dump's verdict and ``odd_ranks`` the ranks it names; the two
    dumps are kept at ``first_path`` and ``second_path``. ``action`` is what ``--on-hang``
    does about it (``dump``, ``restart`` or ``stop``). ``stood_still`` says how long the job
    stood still against its normal time ("no step for 41 s; steps took 0.8 s"; "no
    output for 300 s" under a fixed ``--hang-timeout``); empty in journals written before it.
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
    stood_still: str = ""


@dataclass(frozen=True)
class HangWatchSample(Event):
    """What the hang rule expects now (the hang watch, every second while it watches; a
    sample: not journaled): the job has stood still ``still_for`` seconds and may ``limit``;
    ``basis`` ``steps`` (``typical``: its recent step time), ``collectives`` (``typical``:
    the time between the ranks' collectives, 0 while they wait in one), ``output`` or
    ``fixed``;
    ``expected`` in words ("a step every 0.8 s: suspected after 5.0 s without"); ``state``
    the detector's (``watching``, ``suspected``, ``confirming``, ``hung``)."""

    kind: ClassVar[str] = "hang_watch_sample"
    journaled: ClassVar[bool] = False
    attempt: int
    basis: str
    limit: float
    still_for: float
    typical: float
    expected: str
    state: str = "watching"


@dataclass(frozen=True)
class HangCleared(Event):
    """The ranks a confirmed hang flagged (``ranks``) move again: ``why`` is ``output`` (a rank
    wrote again) or ``stacks`` (a later dump found a main-thread stack that moved). The
    Workers table drops its ``HUNG?`` marks; the hang itself stays in the history.
    ``suspected``: it was only a suspicion (the hang watch's first dump, announced with its
    verdict), cleared before it was confirmed; ``ranks`` are the ones that dump named."""

    kind: ClassVar[str] = "hang_cleared"
    attempt: int
    ranks: tuple[int, ...]
    why: str
    detail: str = ""
    suspected: bool = False


@dataclass(frozen=True)
class JobRank:
    """Where one rank of the job was at a job-wide dump: ``node`` that ran it, ``place`` in
    words (as in :class:`StacksDumped`'s places), the collective it waits in (None: none),
    ``known`` False when no stack was taken, ``frames`` its innermost main-thread frames
    (``file:line in function``, innermost first, a few at most); with the Flight Recorder
    its newest collective from its Flight Recorder (``coll_op`` number ``coll_seq`` of
    ``coll_bytes`` bytes; ``coll_seq`` -1: no record)."""

    node: str
    global_rank: int
    local_rank: int
    pid: int
    place: str
    collective: str | None = None
    known: bool = True
    frames: tuple[str, ...] = ()
    coll_op: str = ""
    coll_seq: int = -1
    coll_bytes: int = 0


@dataclass(frozen=True)
class JobNode:
    """One node's answer to a job-wide dump: its own verdict and where its files are (on
    that node's disk); ``error`` when it had nothing to dump (no running worker)."""

    node: str
    host: str
    group_rank: int | None
    verdict: str
    path: str = ""
    method: str = ""
    duration: float = 0.0
    note: str = ""
    error: str = ""


@dataclass(frozen=True)
class JobStacks(Event):
    """A dump of every rank of the job, on every node (many nodes).

    A dump asked for on one node (``requested_by``: the ``d`` key, the control API, a hang
    suspicion) reached every node through the job's own store; each answered with
    :class:`JobNode` and the :class:`JobRank` of each of its ranks. ``verdict`` judges all
    of them together; ``missing`` lists the nodes that did not answer in time; ``path`` is the
    requesting node's dump directory (on that node), which also holds ``job.json`` and
    ``job.txt``. Posted on the requesting node, and on every node that answered once it reads
    the gathered record back from the store.
    """

    kind: ClassVar[str] = "job_stacks"
    request: int
    reason: str
    source: str
    requested_by: str
    verdict: str
    odd_ranks: tuple[int, ...]
    nodes: tuple[JobNode, ...]
    ranks: tuple[JobRank, ...]
    missing: tuple[str, ...] = ()
    path: str = ""


@dataclass(frozen=True)
class Straggler(Event):
    """The straggler inferred from stack samples changed: ``global_rank`` is the
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


@dataclass(frozen=True)
class RankCollective:
    """One rank's newest collective from its Flight Recorder: ``op`` number ``seq`` of
    process group ``pg``, ``size`` bytes, and ``waiting``: seconds since this sequence number
    was first seen (how long the rank has been at it); ``error`` when the rank did not answer."""

    global_rank: int
    op: str = ""
    seq: int = -1
    pg: str = "0"
    size: int = 0
    waiting: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class CollectiveSample(Event):
    """A poll of every rank's Flight Recorder through its responder (on by default,
    every couple of seconds; a sample: not journaled). ``verdict`` is the collective-level
    verdict when some rank has been at its collective for a while (empty otherwise)."""

    kind: ClassVar[str] = "collective_sample"
    journaled: ClassVar[bool] = False
    attempt: int
    ranks: tuple[RankCollective, ...]
    verdict: str = ""


@dataclass(frozen=True)
class FrGroup:
    """One process group's part of a :class:`FlightRecorderVerdict`: ``label``
    (``EXPERT_MODEL_PARALLEL_GROUP pg 74``), its ranks in words (``0-7``), ``kind`` (frjudge's:
    ``never_issued``, ``stalled``, ``no_dump``, ``mismatch``, ``p2p``, ``same``) and its verdict."""

    label: str
    ranks: str
    kind: str
    text: str


@dataclass(frozen=True)
class CollectiveVerdictFound(Event):
    """A dump with the ranks' Flight Recorder records judged them at the collective level
    (the Flight Recorder): ``verdict`` in one line, ``verdict_kind`` ``behind`` (a rank never
    issued the collective the others wait in), ``mismatch`` (ranks disagree on it) or ``same``
    (every rank at one collective: no culprit) or ``left`` (the stacks show some ranks went
    on past it) or ``held`` (ranks behind in several groups, the stacks tell the one that holds
    the others up), ``odd_ranks`` the ranks it names, ``ranks``
    each rank's newest collective, ``path`` the dump's directory; ``groups`` each process group
    that waits, as ``tuilaunch why``'s judge sees the same records (worst first, at most
    :data:`FR_GROUPS_KEPT`; empty when the records carry no group)."""

    kind: ClassVar[str] = "collective_verdict"
    attempt: int
    verdict: str
    verdict_kind: str
    odd_ranks: tuple[int, ...]
    ranks: tuple[RankCollective, ...]
    path: str = ""
    groups: tuple[FrGroup, ...] = ()


@dataclass(frozen=True)
class FlightRecorderVerdict(Event):
    """The verdict on Flight Recorder dumps of a live run (``tuilaunch why``'s judge,
    :mod:`~tui_launch.core.diagnosis.frjudge`): ``verdict`` the one line a person reads first,
    ``verdict_kind`` (``culprit``, ``mismatch``, ``same``, ``idle``), ``culprits`` the ranks it
    names, ``groups`` each process group that waits, worst first (at most
    :data:`FR_GROUPS_KEPT`; ``groups_waiting`` how many there are, ``groups_total`` of how
    many), ``dumps`` how many ranks' dumps were read, ``source`` (``nccl``: NCCL's
    dump-on-timeout files), ``path`` their directory and name prefix."""

    kind: ClassVar[str] = "flight_recorder_verdict"
    attempt: int
    verdict: str
    verdict_kind: str
    culprits: tuple[int, ...]
    groups: tuple[FrGroup, ...]
    dumps: int
    groups_waiting: int = 0
    groups_total: int = 0
    source: str = "nccl"
    path: str = ""


# The groups a FlightRecorderVerdict carries (a 4,096-rank job can have thousands waiting; the
# rest are in ``tuilaunch why``).
FR_GROUPS_KEPT = 32


register(Slowdown, StacksDumped, HangDetected, HangCleared, HangWatchSample, Straggler)
register(CollectiveSample, CollectiveVerdictFound, nested={"ranks": RankCollective})
register(FlightRecorderVerdict, CollectiveVerdictFound, nested={"groups": FrGroup})
register(JobStacks, nested={"nodes": JobNode, "ranks": JobRank})
register(ProgressSample, ProgressRecord, nested={"ranks": RankProgress})
