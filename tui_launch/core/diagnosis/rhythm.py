"""The adaptive hang rule (``--hang-timeout auto``, the default): how long a job may stand still.

Pure and clock-free (every time is an argument), so that the rule can be checked with numbers.
The hang watch feeds it two things: the monotonic times at which each rank's step counter
moved (from the progress watch, which reads the step lines of the logs), and the times at
which any rank wrote output. :meth:`Rhythm.expect` then says how long the job has stood still
and how long it may, as an :class:`Expectation`:

- **Steps** (a rank has shown at least :data:`MIN_INTERVALS` intervals between step moves
  after its first step): a rank is overdue when its counter (the training bar, or an eval bar
  it prints) has not moved for ``max(FLOOR, MULTIPLE x p90 of its last RECENT intervals,
  PAUSE_MARGIN x the longest interval of the last PAUSE_MEMORY seconds, counted once the
  rhythm was established)``. The job is
  suspected when every rank with a rhythm is overdue. Output alone is not movement here: a
  logging thread, a heartbeat or a SIGTERM handler that keeps printing while the loop stands
  still is a (partial) hang.
- **Collectives** (no step rhythm; the Flight Recorder on, the default): the live poll reads
  each rank's collective sequence number every :data:`COLLECTIVE_RESOLUTION` seconds. A rank
  whose number moved at :data:`MIN_INTERVALS` polls after its first has a rhythm, judged as
  steps are, with the p90 less the poll's interval (an interval read by polls is up to one
  poll longer than it was: a job that moved at every poll gets the floor). Before that, a job
  in which some rank waits in a collective the others have not finished (or the ranks are at
  different numbers) is suspected when no rank's number moved for :data:`WAIT_FLOOR`: a
  program that prints no step lines (PyTorch's DDP tutorial, a Trainer without a bar), or one
  that hangs in its first seconds, is not left to the output's minute and a half. Output is no
  movement here either.
- **Output** (none of these: before the first collective, or a job without the Flight
  Recorder that prints no step lines): the job is suspected when no rank has written anything
  for ``max(QUIET_FLOOR, MULTIPLE x p90 of the gaps between outputs, PAUSE_MARGIN x the
  longest gap remembered)``. The floor covers the first step (imports, compilation, the first
  data load), which is never part of a rhythm.

A suspicion is confirmed or cleared by the stacks (see :mod:`.stacks.hang`); one cleared by
movement is not raised again before the stillness has doubled (the detector's back-off), and
any step clears the back-off.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# Seconds a job with a rhythm may stand still whatever its steps take: sub-second steps are
# judged against this, so that a garbage collection, a slow batch or a short evaluation (20
# steps of 0.2 s) is not a suspicion, and a hang is suspected 6 s after its last step,
# confirmed about 4 s later (docs/hangs.md).
FLOOR = 6.0
# The stillness allowed, as a multiple of the 90th percentile of the recent step intervals.
MULTIPLE = 5.0
PERCENTILE = 0.9
RECENT = 64  # intervals kept for the percentile
MIN_INTERVALS = 3  # intervals after the first step before a rank has a rhythm
# A pause the job already made and recovered from (a checkpoint save, an evaluation without a
# bar) is not suspected again: the longest interval of the last half hour, with a margin.
PAUSE_MEMORY = 1800.0
PAUSE_MARGIN = 1.5
# Without a rhythm: output silence, never judged against less than 90 s: the first step
# (imports, compilation, the first data load), and a job that prints once a minute, whose
# first line comes a minute after it started, are not suspected.
QUIET_FLOOR = 90.0
# Seconds between the suspicion's dump and the confirming one under this rule.
CONFIRM_AFTER = 3.0
# Seconds between two reads of the ranks' collective sequence numbers (the live poll's).
COLLECTIVE_RESOLUTION = 2.0
# Without a rhythm, ranks waiting in a collective for this long with no number moving: a
# suspicion (its confirmation then looks at the stacks, the CPU and the I/O of the rank the
# others wait for: a rank still compiling or loading is busy, and clears it).
WAIT_FLOOR = 8.0

STEPS = "steps"
COLLECTIVES = "collectives"
OUTPUT = "output"
FIXED = "fixed"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; 0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _fmt(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s"


@dataclass(frozen=True)
class Expectation:
    """What the rule expects now: the job has stood still for ``still_for`` seconds and may for
    ``limit``. ``basis`` is :data:`STEPS` (``typical``: the p90 interval between ``rank``'s
    step moves), :data:`OUTPUT` (``typical``: the p90 gap between outputs, 0 before two) or
    :data:`FIXED` (``--hang-timeout N``: output silence against N)."""

    basis: str
    limit: float
    still_for: float
    typical: float = 0.0
    rank: int | None = None

    @property
    def overdue(self) -> bool:
        """The job has stood still for its limit: a hang is suspected."""
        return self.still_for >= self.limit

    def said(self, still_for: float | None = None) -> str:
        """How long the job stood still against its normal time, in a line: ``no step for 41 s;
        steps took 0.8 s`` (the 90th percentile of the recent intervals); ``no output for 70
        s`` (``still_for``: another length to say)."""
        still = self.still_for if still_for is None else still_for
        if self.basis == STEPS:
            return f"no step for {_fmt(still)}; steps took {_fmt(self.typical)}"
        if self.basis == COLLECTIVES:
            if self.typical > 0:
                return f"no collective for {_fmt(still)}; one came every {_fmt(self.typical)}"
            return f"no collective for {_fmt(still)}; ranks wait in one"
        if self.basis == OUTPUT and self.typical > 0:
            return f"no output for {_fmt(still)}; output came every {_fmt(self.typical)}"
        return f"no output for {_fmt(still)}"

    def expected(self) -> str:
        """What the rule waits for, for the dashboard: ``a step every 0.8 s: a hang is
        suspected after 6.0 s without one``."""
        if self.basis == STEPS:
            what = f"a step every {_fmt(self.typical)}"
        elif self.basis == COLLECTIVES:
            what = (
                f"a collective every {_fmt(self.typical)}"
                if self.typical > 0
                else "the collective ranks wait in"
            )
        elif self.basis == OUTPUT:
            what = "output" if self.typical <= 0 else f"output every {_fmt(self.typical)}"
        else:
            what = "output (--hang-timeout)"
        return f"{what}: suspected after {_fmt(self.limit)} without"


@dataclass
class _Series:
    """The intervals between one series of events: recent ones and long pauses remembered."""

    last: float | None = None
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    pauses: deque[tuple[float, float]] = field(default_factory=deque)  # (at, interval)

    def add(self, t: float, floor: float) -> None:
        if self.last is not None and t > self.last:
            gap = t - self.last
            self.recent.append(gap)
            # A pause is remembered once the rhythm is established: the second step's
            # recompilation is warm-up, not a pause the job makes.
            if gap > floor and len(self.recent) > MIN_INTERVALS:
                self.pauses.append((t, gap))
        self.last = t if self.last is None else max(self.last, t)

    def limit(self, now: float, floor: float, resolution: float = 0.0) -> tuple[float, float]:
        """(limit, typical) from what this series has shown; ``resolution``: the seconds
        between the looks that saw its moves (an interval is up to that much too long)."""
        while self.pauses and self.pauses[0][0] < now - PAUSE_MEMORY:
            self.pauses.popleft()
        typical = percentile(list(self.recent), PERCENTILE)
        longest = max((g for _, g in self.pauses), default=0.0)
        paced = max(0.0, typical - resolution)
        return max(floor, MULTIPLE * paced, PAUSE_MARGIN * longest), typical


class Rhythm:
    """One attempt's rhythm: each rank's step moves and the job's output (see the module)."""

    def __init__(self, floor: float = FLOOR, quiet_floor: float = QUIET_FLOOR) -> None:
        self.floor = floor
        self.quiet_floor = quiet_floor
        self._start = 0.0
        self._steps: dict[int, _Series] = {}
        self._moved: dict[int, float] = {}  # rank -> latest move of any counter it prints
        self._output = _Series()
        self._collectives: dict[int, _Series] = {}  # rank -> its sequence number's moves
        self._waiting = False  # some rank waits in a collective the others have not finished

    def start(self, now: float) -> None:
        """A new attempt: nothing is known."""
        self._start = now
        self._steps = {}
        self._moved = {}
        self._output = _Series()
        self._collectives = {}
        self._waiting = False

    def output(self, now: float) -> None:
        """Some rank wrote at ``now``."""
        self._output.add(now, self.quiet_floor)

    def steps(self, rank: int, moves: tuple[float, ...], last_move: float | None) -> bool:
        """``rank``'s latest training-counter moves (oldest first) and the latest move of any
        of its counters; True when the rank advanced since the last call."""
        series = self._steps.get(rank)
        if series is None:
            series = self._steps[rank] = _Series()
        before = self._moved.get(rank)
        for t in moves:
            if series.last is None or t > series.last:
                series.add(t, self.floor)
        latest = max([x for x in (last_move, series.last) if x is not None], default=None)
        if latest is not None:
            self._moved[rank] = latest
        return latest is not None and (before is None or latest > before)

    def collectives(self, moved: dict[int, float], waiting: bool) -> list[int]:
        """Each rank's latest collective move (when the live poll first saw its newest
        sequence number), and whether some rank waits in a collective the others have not
        finished; returns the ranks that moved since the last call."""
        self._waiting = waiting
        out = []
        for rank, t in sorted(moved.items()):
            series = self._collectives.get(rank)
            if series is None:
                series = self._collectives[rank] = _Series()
            if series.last is None or t > series.last:
                before = series.last
                series.add(t, self.floor)
                if before is not None:
                    out.append(rank)
        return out

    @property
    def by_collectives(self) -> bool:
        """The ranks' collectives are the measure (a rhythm of them, or ranks waiting in one)
        and no rank has a rhythm of steps."""
        if self.by_steps or not self._collectives:
            return False
        return self._waiting or any(
            len(s.recent) >= MIN_INTERVALS for s in self._collectives.values()
        )

    @property
    def by_steps(self) -> bool:
        """Some rank has shown a rhythm of steps: output alone is no longer movement."""
        return any(len(s.recent) >= MIN_INTERVALS for s in self._steps.values())

    def expect(self, now: float) -> Expectation:
        """How long the job has stood still, and may (see the module)."""
        best: Expectation | None = None
        for rank, series in sorted(self._steps.items()):
            if len(series.recent) < MIN_INTERVALS:
                continue
            limit, typical = series.limit(now, self.floor)
            still = max(0.0, now - self._moved.get(rank, series.last or self._start))
            e = Expectation(STEPS, limit, still, typical, rank)
            # The job stands still only when every rank with a rhythm is overdue: the one
            # furthest from its limit speaks for it.
            if best is None or e.still_for - e.limit < best.still_for - best.limit:
                best = e
        if best is not None:
            return best
        collective = self._expect_collectives(now)
        if collective is not None:
            return collective
        limit, typical = self._output.limit(now, self.quiet_floor)
        if len(self._output.recent) < MIN_INTERVALS:
            limit = max(self.quiet_floor, PAUSE_MARGIN * max(self._output.recent, default=0.0))
            typical = 0.0
        last = max(self._start, self._output.last or self._start)
        return Expectation(OUTPUT, limit, max(0.0, now - last), typical)

    def _expect_collectives(self, now: float) -> Expectation | None:
        """The collectives' expectation (see the module), or None when they say nothing."""
        if not self.by_collectives:
            return None
        best: Expectation | None = None
        for rank, series in sorted(self._collectives.items()):
            if len(series.recent) < MIN_INTERVALS:
                continue
            limit, typical = series.limit(now, self.floor, COLLECTIVE_RESOLUTION)
            e = Expectation(COLLECTIVES, limit, max(0.0, now - (series.last or now)), typical, rank)
            if best is None or e.still_for - e.limit < best.still_for - best.limit:
                best = e
        if best is not None:
            return best
        # Ranks wait in a collective, no rhythm yet: stood still since the latest move of any.
        last = max((s.last for s in self._collectives.values() if s.last is not None), default=now)
        return Expectation(COLLECTIVES, WAIT_FLOOR, max(0.0, now - max(last, self._start)))
