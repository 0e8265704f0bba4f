"""A replayed rank's step, as its log at the cursor shows it.

The journal holds a progress record every 10 s (the watcher's 1 Hz samples are not
journaled), and even a sample is posted up to a second after the lines it read, so a replay
that showed the journal's step alone would lag its log. :func:`progress_at` takes each rank's
step from its log lines up to the cursor instead; the replay source calls it on the
:class:`~tui_launch.core.journal.timeline.Timeline`'s snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tui_launch.core.model.events import ProgressSample, RankProgress
from tui_launch.core.model.layout import STREAMS
from tui_launch.core.model.progress import ProgressView
from tui_launch.core.model.store import Snapshot
from tui_launch.core.progress.parse import ProgressReading, family_of, maybe_progress, parse_line

# Lines of a rank looked back through for its latest step (a rank printing no progress costs
# one pre-filter test a line, this many at most).
STEP_LOOKBACK = 400


def progress_at(snap: Snapshot, lines: Callable[[int, str], list[str]]) -> Snapshot:
    """``snap`` with each rank's step as its log at the cursor shows it.

    The journal holds a progress record every 10 s (the watcher's 1 Hz samples are not
    journaled), and even a sample is posted up to a second after the lines it read: the
    journal's step alone would lag the replayed log by up to 10 s, and show nothing in an
    attempt's first 10 s. Here each rank's step (and total) is the last training reading among
    ``lines(local_rank, stream)`` (this attempt's lines up to the cursor, oldest first), in
    the format the record names; a rank with no record yet in this attempt gets one from its
    lines. The rest of the record (rates, ETA, goodput) stays the journal's.
    """
    view = snap.progress
    if snap.finished is not None or not snap.ranks:
        return snap
    current = view.latest if view is not None and view.latest.attempt == snap.attempt else None
    ranks: list[RankProgress] = []
    changed = False
    if current is not None:
        for rp in current.ranks:
            family = family_of(rp.fmt) if rp.fmt else None
            r = _last_step(lines(rp.local_rank, rp.stream), family, rp.total)
            if r is not None and (r.step, r.total or rp.total) != (rp.step, rp.total):
                rp = replace(rp, step=r.step, total=r.total or rp.total)
                changed = True
            ranks.append(rp)
    else:
        for row in snap.ranks:
            for stream in STREAMS:
                r = _last_step(lines(row.local_rank, stream), None, None)
                if r is not None:
                    ranks.append(
                        RankProgress(
                            row.global_rank, row.local_rank, stream, r.step, r.total, fmt=r.fmt
                        )
                    )
                    changed = True
                    break
    if not changed:
        return snap
    leader = current.leader if current is not None else None
    if leader is None or all(rp.global_rank != leader for rp in ranks):
        leader = max(ranks, key=lambda rp: rp.step or 0).global_rank
    if current is not None:
        latest = replace(current, ranks=tuple(ranks), leader=leader)
    else:
        latest = ProgressSample(attempt=snap.attempt, leader=leader, ranks=tuple(ranks))
    shown = ProgressView(latest=latest) if view is None else replace(view, latest=latest)
    return replace(snap, progress=shown)


def _last_step(lines: list[str], family: str | None, total: int | None) -> ProgressReading | None:
    """The newest training reading with a step among ``lines`` (of ``family``, and of the
    training bar's ``total`` when known: another total is an eval bar)."""
    for text in reversed(lines[-STEP_LOOKBACK:]):
        if not maybe_progress(text):
            continue
        r = parse_line(text, family)
        if r is None or r.step is None or r.phase != "train":
            continue
        if total is not None and r.total is not None and r.total != total:
            continue
        return r
    return None


__all__ = ["STEP_LOOKBACK", "progress_at"]
