"""The store's progress view: the latest progress sample, rate histories, per-attempt facts.

:func:`fold` turns the progress watcher's :class:`~tui_launch.core.model.events.ProgressSample`
events (and :class:`~tui_launch.core.model.events.Slowdown` events, through :func:`fold_slowdown`)
into a :class:`ProgressView`; the store's pure reducer calls them. :func:`goodput` turns the
view and the snapshot's attempts into the summary's goodput figures, the same for a live run
and a replayed journal (which holds a record every 10 s and the last one of each attempt).
Plain data: nothing here reads a clock or a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from tui_launch.core.model.events import ProgressSample, RankProgress, Slowdown, Straggler
from tui_launch.core.model.goodput import AttemptProgress, GoodputSummary, summarize_goodput

HISTORY = 60  # rate samples kept per rank for sparklines
SLOWDOWNS_KEPT = 100


@dataclass(frozen=True)
class ProgressView:
    """The store's progress: the latest sample of the current attempt, short rate histories
    (``(global_rank, rates)`` pairs, steps/s), the last sample of every attempt (goodput and
    the restarts timeline), the slowdowns flagged now (``(global_rank, what)``) and every
    :class:`Slowdown` event so far (the last :data:`SLOWDOWNS_KEPT`)."""

    latest: ProgressSample
    rates: tuple[tuple[int, tuple[float, ...]], ...] = ()
    attempts: tuple[ProgressSample, ...] = ()
    active: tuple[tuple[int, str], ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()

    def rank(self, global_rank: int, attempt: int | None = None) -> RankProgress | None:
        """The latest progress of ``global_rank`` (of ``attempt``, when given)."""
        if attempt is not None and self.latest.attempt != attempt:
            return None
        for r in self.latest.ranks:
            if r.global_rank == global_rank:
                return r
        return None

    @property
    def job(self) -> RankProgress | None:
        """The job's progress: that of the leading rank (``latest.leader``)."""
        leader = self.latest.leader
        return self.rank(leader) if leader is not None else None

    def history(self, global_rank: int) -> tuple[float, ...]:
        """The rate history (steps/s) of ``global_rank`` in the current attempt."""
        for gr, h in self.rates:
            if gr == global_rank:
                return h
        return ()

    def attempt(self, number: int) -> ProgressSample | None:
        """The last sample of attempt ``number``, if it printed any progress."""
        for a in self.attempts:
            if a.attempt == number:
                return a
        return None

    def flagged(self, global_rank: int) -> str | None:
        """``stalled`` or ``slow`` when that is flagged for the rank now, else None."""
        whats = {w for gr, w in self.active if gr == global_rank}
        return "stalled" if "stalled" in whats else ("slow" if "slow" in whats else None)


def fold(view: ProgressView | None, s: ProgressSample) -> ProgressView:
    """The view after sample ``s`` (pure; the store's reducer calls it)."""
    if view is None:
        return ProgressView(latest=s, rates=_rates((), s), attempts=(s,))
    attempts = tuple(a for a in view.attempts if a.attempt != s.attempt)
    attempts = tuple(sorted((*attempts, s), key=lambda a: a.attempt))
    if s.attempt < view.latest.attempt:
        # an ended attempt's last record, arriving after the next attempt began
        return replace(view, attempts=attempts)
    old = view.rates if s.attempt == view.latest.attempt else ()
    active = view.active if s.attempt == view.latest.attempt else ()
    return replace(view, latest=s, rates=_rates(old, s), attempts=attempts, active=active)


def fold_slowdown(view: ProgressView | None, e: Slowdown) -> ProgressView | None:
    """The view after a slowdown started or ended."""
    if view is None:
        return None
    key = (e.global_rank, e.what)
    active = tuple(k for k in view.active if k != key)
    if e.active:
        active = (*active, key)
    return replace(view, active=active, slowdowns=(*view.slowdowns, e)[-SLOWDOWNS_KEPT:])


def _rates(
    old: tuple[tuple[int, tuple[float, ...]], ...], s: ProgressSample
) -> tuple[tuple[int, tuple[float, ...]], ...]:
    hist = dict(old)
    for r in s.ranks:
        h = hist.get(r.global_rank, ())
        hist[r.global_rank] = (*h[-(HISTORY - 1) :], r.rate or 0.0)
    return tuple(sorted(hist.items()))


class _Attempt(Protocol):
    """An attempt as the snapshot has it (:class:`~tui_launch.core.model.store.AttemptView`)."""

    @property
    def number(self) -> int: ...
    @property
    def started(self) -> float: ...
    @property
    def ended(self) -> float | None: ...


def goodput(
    view: ProgressView | None, attempts: Sequence[_Attempt], now_wall: float
) -> GoodputSummary | None:
    """Goodput over ``attempts`` (the snapshot's, wall-clock times; ``now_wall`` closes one
    still running), from the last progress sample of each; None if nothing printed a step."""
    if view is None or not view.attempts:
        return None
    facts = []
    for a in attempts:
        p = view.attempt(a.number)
        end = (a.ended if a.ended is not None else now_wall) - a.started
        if p is None:
            facts.append(AttemptProgress(0.0, end, None, None, None, 0.0))
        else:
            facts.append(
                AttemptProgress(
                    0.0,
                    end,
                    p.first_step,
                    p.time_to_first_step,
                    p.steps_reached,
                    p.progress_time,
                )
            )
    return summarize_goodput(facts, now_wall)


# What a rank's progress says to a script (``tuilaunch status``, the control socket's status).
PROGRESS_FIELDS = ("step", "total", "rate", "eta", "loss", "stalled", "slow")


def progress_rows(view: ProgressView | None, attempt: int) -> list[dict[str, object]]:
    """Each rank's latest progress in ``attempt``, JSON-ready (``global_rank`` and
    :data:`PROGRESS_FIELDS`); empty when the view's latest sample is of another attempt."""
    if view is None or view.latest.attempt != attempt:
        return []
    return [
        {"global_rank": r.global_rank, **{k: getattr(r, k) for k in PROGRESS_FIELDS}}
        for r in view.latest.ranks
    ]


def fmt_rate(rate: float | None) -> str:
    """Steps per second in three significant figures or so (``-`` when unknown)."""
    if rate is None:
        return "-"
    if rate >= 100:
        return f"{rate:.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    return f"{rate:.2f}"


def fmt_duration(seconds: float | None, *, floor: bool = False) -> str:
    """A duration for people (``-`` for unknown), the one formatter of durations: ``45s``,
    ``12m``, ``3.5h``. Minutes are rounded (an ETA, a stall), or with ``floor`` cut down (time
    since: ``1m`` until two minutes have passed, so that a table of long-running ranks does not
    redraw every second)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m" if floor else f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def unit_of(r: RankProgress | None) -> str:
    """What a rank's counter counts: ``epoch`` for a program that prints epoch lines and no
    step line (the tracker's ``epoch`` format), else ``step``."""
    return "epoch" if r is not None and r.fmt == "epoch" else "step"


def fmt_step(r: RankProgress) -> str:
    """``120/500`` (or ``120``, or ``-``); ``epoch 3/10`` when the counter counts epochs."""
    if r.step is None:
        return "-"
    count = f"{r.step}/{r.total}" if r.total else str(r.step)
    return f"epoch {count}" if unit_of(r) == "epoch" else count


def fmt_eta(r: RankProgress) -> str:
    """The time left (``39s``), or why there is none: ``? no total`` (no line states how far
    the run goes), ``? no rate yet`` (the counter has not moved twice)."""
    if r.eta is not None:
        return fmt_duration(r.eta)
    if not r.total:
        return "? no total"
    return "? no rate yet"


def describe_slowdown(e: Slowdown) -> str:
    """One line for a slowdown starting or ending (headless and the journal's reader)."""
    who = f"rank {e.global_rank}"
    if e.what == "stalled":
        if e.active:
            return f"progress: {who} stalled: no step for {fmt_duration(e.stalled_for)}"
        return f"progress: {who} steps again"
    rates = f"{fmt_rate(e.rate)} steps/s, best {fmt_rate(e.best_rate)}"
    if e.active:
        return f"progress: {who} slowed down ({rates})"
    return f"progress: {who} back to speed ({rates})"


def straggler_line(e: Straggler) -> str:
    """``straggler (inferred): rank 1, in a collective in 4% of 24 stack samples (others
    92-100%); CPU 99% vs 61%`` (or that none is inferred any more)."""
    if e.global_rank is None:
        return f"straggler: none inferred (attempt {e.attempt}, {e.samples} stack samples)"
    shares = dict(e.shares)
    own = shares.get(e.global_rank, 0.0)
    others = [v for r, v in shares.items() if r != e.global_rank]
    line = (
        f"straggler (inferred from stack samples): rank {e.global_rank}, inside a collective "
        f"in {100 * own:.0f}% of {e.samples} samples"
    )
    if others:
        line += f" (the others {100 * min(others):.0f}-{100 * max(others):.0f}%)"
    cpu = dict(e.cpu)
    mine, rest = cpu.get(e.global_rank), [v for r, v in cpu.items() if r != e.global_rank]
    known = [v for v in rest if v is not None]
    if mine is not None and known:
        line += f"; CPU {mine:.0f}% vs {sum(known) / len(known):.0f}% for the others"
    return line


def goodput_lines(summary: GoodputSummary, unit: str = "step") -> list[str]:
    """The summary's goodput: one line per attempt, then the totals (``unit``: what the
    counter counts, :func:`unit_of` the job's progress)."""
    lines = []
    for a in summary.attempts:
        parts = [f"attempt {a.index}: reached {unit} {a.steps_reached}"]
        if a.steps_reached is None:
            parts = [f"attempt {a.index}: no step seen"]
        if a.resumed_from is not None:
            parts.append(f"resumed from {a.resumed_from}")
        if a.redone:
            parts.append(f"{a.redone} {unit}s redone")
        if a.time_to_first_step is not None:
            parts.append(f"first step after {a.time_to_first_step:.1f}s")
        parts.append(f"progressing {a.progress_time:.1f}s of {a.wall:.1f}s")
        lines.append(", ".join(parts))
    share = summary.progress_share
    total = f"goodput: making progress {100 * share:.0f}% of wall time" if share is not None else ""
    if total:
        total += f" ({summary.progress_time:.1f}s of {summary.wall:.1f}s)"
        total += f", {summary.steps_redone} {unit}s redone after restarts"
        lines.append(total)
    return lines


__all__ = [
    "HISTORY",
    "PROGRESS_FIELDS",
    "ProgressView",
    "describe_slowdown",
    "fmt_duration",
    "fmt_eta",
    "fmt_rate",
    "fmt_step",
    "fold",
    "fold_slowdown",
    "goodput",
    "goodput_lines",
    "progress_rows",
    "straggler_line",
    "unit_of",
]
