"""Reducers of the diagnosis events: progress, slowdowns, stragglers, stack dumps, hangs."""

from __future__ import annotations

from dataclasses import replace

from tui_launch.core.model.events import (
    CollectiveSample,
    CollectiveVerdictFound,
    FlightRecorderVerdict,
    HangCleared,
    HangDetected,
    HangWatchSample,
    JobStacks,
    ProgressSample,
    Slowdown,
    StacksDumped,
    Straggler,
)
from tui_launch.core.model.history import History
from tui_launch.core.model.progress import fold as fold_progress
from tui_launch.core.model.progress import fold_slowdown
from tui_launch.core.model.reducers.base import reduces
from tui_launch.core.model.snapshot import Snapshot

# A long run dumps stacks again and again: the snapshot keeps the latest ones.
DUMPS_KEPT = 100
JOB_DUMPS_KEPT = 20


@reduces(ProgressSample)  # and ProgressRecord, its journaled twin
def _progress(s: Snapshot, e: ProgressSample) -> Snapshot:
    return replace(s, progress=fold_progress(s.progress, e))


@reduces(Slowdown)
def _slowdown(s: Snapshot, e: Slowdown) -> Snapshot:
    return replace(s, progress=fold_slowdown(s.progress, e))


@reduces(Straggler)
def _straggler(s: Snapshot, e: Straggler) -> Snapshot:
    return replace(s, straggler=e)


@reduces(StacksDumped)
def _stacks_dumped(s: Snapshot, e: StacksDumped) -> Snapshot:
    return replace(s, dumps=History.of(s.dumps).appended(e, DUMPS_KEPT))


@reduces(HangDetected)
def _hang(s: Snapshot, e: HangDetected) -> Snapshot:
    # The odd ranks out are the suspects; when every rank waits alike, all of them.
    return replace(s, hang=e, hung_ranks=e.odd_ranks or e.still_ranks, hang_cleared=None)


@reduces(HangCleared)
def _hang_cleared(s: Snapshot, e: HangCleared) -> Snapshot:
    if e.attempt != s.attempt:
        return s
    return replace(s, hung_ranks=(), hang_cleared=e)


@reduces(HangWatchSample)
def _hang_watch(s: Snapshot, e: HangWatchSample) -> Snapshot:
    return replace(s, hang_watch=e)


@reduces(JobStacks)
def _job_stacks(s: Snapshot, e: JobStacks) -> Snapshot:
    return replace(s, job_stacks=History.of(s.job_stacks).appended(e, JOB_DUMPS_KEPT))


@reduces(CollectiveSample)
def _collectives(s: Snapshot, e: CollectiveSample) -> Snapshot:
    return replace(s, collectives=e)


@reduces(CollectiveVerdictFound)
def _collective_verdict(s: Snapshot, e: CollectiveVerdictFound) -> Snapshot:
    return replace(s, collective_verdict=e)


@reduces(FlightRecorderVerdict)
def _flight_recorder(s: Snapshot, e: FlightRecorderVerdict) -> Snapshot:
    return replace(s, flight_recorder=e)
