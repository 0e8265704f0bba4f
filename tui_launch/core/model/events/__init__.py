"""Typed, immutable records of every transition of a run.

Producers (the agent thread, the runner, log tailers) create events and post them to the
:class:`~tui_launch.core.model.store.RunStore`; the store folds them into snapshots and the journal
writes each one as a JSON line. Events are plain frozen dataclasses made of str, int, float,
bool, None and tuples of those (or of other frozen records), so that they serialise to JSON and
back without a schema of their own (:func:`to_dict`, :func:`from_dict`). A field that holds a
word of a vocabulary (:class:`~tui_launch.core.model.words.Word`) is a ``str`` all the same: a
member is written as its value and read back as the plain word, equal to it.

The package is split by family (``base``: the base class, the registry, and
:class:`~tui_launch.core.model.events.base.EventTable`, the dispatch on an event's type;
``run``: the lifecycle; ``telemetry``; ``diagnosis``: progress, stacks, hangs, stragglers);
every name is importable from here, and importing this package registers every kind for
:func:`from_dict`.
A new event: a frozen dataclass with a unique ``kind`` in the family's module, registered there
with :func:`~tui_launch.core.model.events.base.register`, and added to the imports below.
"""

from __future__ import annotations

from tui_launch.core.model.events.base import (
    EVENT_TYPES,
    Event,
    EventTable,
    from_dict,
    register,
    to_dict,
)
from tui_launch.core.model.events.diagnosis import (
    CollectiveSample,
    CollectiveVerdictFound,
    FlightRecorderVerdict,
    FrGroup,
    HangCleared,
    HangDetected,
    HangWatchSample,
    JobNode,
    JobRank,
    JobStacks,
    ProgressRecord,
    ProgressSample,
    RankCollective,
    RankProgress,
    Slowdown,
    StacksDumped,
    Straggler,
)
from tui_launch.core.model.events.run import (
    AttemptFailed,
    ClusterSample,
    Connecting,
    ControlAction,
    ExitBarrier,
    Failure,
    GroupState,
    Injected,
    LogMark,
    NodeChange,
    NodeStatus,
    Notice,
    Participant,
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
    WorkerInfo,
    WorkersSaved,
    WorkersStarted,
)
from tui_launch.core.model.events.telemetry import (
    GpuReading,
    GpuState,
    RankReading,
    RankTotals,
    TelemetryRecord,
    TelemetrySample,
    TelemetryTotals,
)

__all__ = [
    "EVENT_TYPES",
    "AttemptFailed",
    "ClusterSample",
    "CollectiveSample",
    "CollectiveVerdictFound",
    "Connecting",
    "ControlAction",
    "Event",
    "EventTable",
    "ExitBarrier",
    "Failure",
    "FlightRecorderVerdict",
    "FrGroup",
    "GpuReading",
    "GpuState",
    "GroupState",
    "HangCleared",
    "HangDetected",
    "HangWatchSample",
    "Injected",
    "JobNode",
    "JobRank",
    "JobStacks",
    "LogMark",
    "NodeChange",
    "NodeStatus",
    "Notice",
    "Participant",
    "PolicyDecision",
    "Preempted",
    "ProgressRecord",
    "ProgressSample",
    "RankCollective",
    "RankExited",
    "RankProgress",
    "RankReading",
    "RankTotals",
    "RendezvousCompleted",
    "RendezvousSample",
    "RendezvousStarted",
    "Restart",
    "RunFinished",
    "RunStarted",
    "Shutdown",
    "Slowdown",
    "StacksDumped",
    "StoreRetry",
    "Straggler",
    "TelemetryRecord",
    "TelemetrySample",
    "TelemetryTotals",
    "WorkerInfo",
    "WorkersSaved",
    "WorkersStarted",
    "from_dict",
    "register",
    "to_dict",
]
