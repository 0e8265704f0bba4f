"""Training progress, suspected hangs and collectives as metric families.

Read from the snapshot's progress sample, hang flags and collective poll on every scrape, like
the run's other families (:mod:`tui_launch.metrics.families`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric

from tui_launch.core.model.store import Snapshot
from tui_launch.metrics.common import RANK, gauge

PROGRESS_STEP = "tuilaunch_progress_step"
PROGRESS_STEPS_PER_SECOND = "tuilaunch_progress_steps_per_second"
PROGRESS_LAST_STEP = "tuilaunch_last_step_timestamp_seconds"
HANG_SUSPECTED = "tuilaunch_hang_suspected"
COLLECTIVE_SEQ = "tuilaunch_rank_collective_seq"
COLLECTIVE_WAIT = "tuilaunch_rank_collective_wait_seconds"


@dataclass(frozen=True)
class RankProgress:
    """One rank's training progress, as exported (from the snapshot's progress sample)."""

    rank: int
    local_rank: int
    step: int | None = None
    steps_per_second: float | None = None
    last_step_wall: float | None = None


def progress_of(snap: Snapshot) -> list[RankProgress]:
    """Each printing rank's progress in the current attempt, from the snapshot's latest sample
    (the last step time is the sample's wall clock less how long ago the counter moved)."""
    view = snap.progress
    if view is None or view.latest.attempt != snap.attempt:
        return []
    sample = view.latest
    return [
        RankProgress(
            rank=r.global_rank,
            local_rank=r.local_rank,
            step=r.step,
            steps_per_second=r.rate,
            last_step_wall=(sample.wall - r.last_step_ago if r.last_step_ago is not None else None),
        )
        for r in sample.ranks
    ]


def progress_families(node: str, ranks: Iterable[RankProgress]) -> list[Metric]:
    """The progress families: step, steps per second, last step time, per printing rank."""
    step = gauge(PROGRESS_STEP, "The rank's last training step.", RANK)
    rate = gauge(PROGRESS_STEPS_PER_SECOND, "The rank's recent steps per second.", RANK)
    last = gauge(PROGRESS_LAST_STEP, "When the rank last finished a step.", RANK)
    for p in ranks:
        labels = [node, str(p.rank), str(p.local_rank)]
        for fam, value in ((step, p.step), (rate, p.steps_per_second), (last, p.last_step_wall)):
            if value is not None:
                fam.add_metric(labels, float(value))
    return [step, rate, last]


def hang_families(node: str, ranks: Iterable[tuple[int, int, bool]]) -> list[Metric]:
    """The hang family: ``(rank, local_rank, suspected)`` -> 0/1 per rank."""
    f = gauge(HANG_SUSPECTED, "1 while the rank is suspected to hang.", RANK)
    for rank, lr, suspected in ranks:
        f.add_metric([node, str(rank), str(lr)], float(suspected))
    return [f]


def collective_families(node: str, snap: Snapshot) -> list[Metric]:
    """The Flight Recorder (by default): each rank's newest collective sequence number and
    the seconds it has been at it (from the latest poll); none without a poll."""
    seq = gauge(COLLECTIVE_SEQ, "The rank's newest collective sequence number.", RANK)
    wait = gauge(COLLECTIVE_WAIT, "Seconds the rank has been at that collective.", RANK)
    sample = snap.collectives
    if sample is None:
        return []
    local = {r.global_rank: r.local_rank for r in snap.ranks}
    for rc in sample.ranks:
        if rc.seq < 0:
            continue
        labels = [node, str(rc.global_rank), str(local.get(rc.global_rank, ""))]
        seq.add_metric(labels, float(rc.seq))
        wait.add_metric(labels, rc.waiting)
    return [seq, wait]
