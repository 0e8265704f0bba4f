"""Goodput bookkeeping across attempts (restarts): pure functions over per-attempt facts.

Per attempt: the step counter it reached, the step it resumed from (the first counter value
it printed: exact for a tqdm bar drawn with ``initial=``, within one log interval for log
lines), the time from the attempt's start to its first step, and the seconds it was making
progress. From those: the work redone after each restart (reached before - resumed from) and
the share of wall time the job was making progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AttemptGoodput", "AttemptProgress", "GoodputSummary", "summarize_goodput"]


@dataclass(frozen=True, slots=True)
class AttemptProgress:
    """What one attempt's progress tracker saw (times are monotonic seconds).

    ``end`` is None while the attempt runs (pass ``now`` to :func:`summarize_goodput`).
    ``progress_time`` is the time spent between step moves no more than a stall apart.
    """

    start: float
    end: float | None
    first_step: int | None
    first_step_at: float | None
    steps_reached: int | None
    progress_time: float = 0.0


@dataclass(frozen=True, slots=True)
class AttemptGoodput:
    """One attempt's line in the summary."""

    index: int
    wall: float
    steps_reached: int | None
    resumed_from: int | None
    redone: int
    time_to_first_step: float | None
    progress_time: float


@dataclass(frozen=True, slots=True)
class GoodputSummary:
    """Per-attempt lines and the job's totals."""

    attempts: tuple[AttemptGoodput, ...]
    wall: float
    progress_time: float
    steps_redone: int

    @property
    def progress_share(self) -> float | None:
        """Share of wall time the job was making progress (None before any wall time)."""
        return self.progress_time / self.wall if self.wall > 0 else None


def summarize_goodput(attempts: Sequence[AttemptProgress], now: float) -> GoodputSummary:
    """Goodput of a job from its attempts in order; ``now`` closes a still-running one.

    Work redone by attempt *k* is the highest step any earlier attempt reached minus the step
    attempt *k* resumed from (0 when it resumed at or past it). An attempt that printed no step
    resumed from nothing known and redoes nothing known.
    """
    lines: list[AttemptGoodput] = []
    best_before: int | None = None
    wall_total = progress_total = redone_total = 0.0
    for index, a in enumerate(attempts):
        end = a.end if a.end is not None else now
        wall = max(end - a.start, 0.0)
        resumed = a.first_step if index > 0 else None
        redone = 0
        if resumed is not None and best_before is not None:
            redone = max(best_before - resumed, 0)
        ttfs = a.first_step_at - a.start if a.first_step_at is not None else None
        lines.append(
            AttemptGoodput(
                index=index,
                wall=wall,
                steps_reached=a.steps_reached,
                resumed_from=resumed,
                redone=redone,
                time_to_first_step=ttfs,
                progress_time=min(a.progress_time, wall),
            )
        )
        wall_total += wall
        progress_total += min(a.progress_time, wall)
        redone_total += redone
        if a.steps_reached is not None:
            best_before = max(best_before or 0, a.steps_reached)
    return GoodputSummary(
        attempts=tuple(lines),
        wall=wall_total,
        progress_time=progress_total,
        steps_redone=int(redone_total),
    )
