"""The progress watcher: worker log lines in, progress events out.

:class:`ProgressWatch` is a sink on the log tailer (whole lines, with their arrival time from
``time.monotonic()``) and a listener on the store (attempt starts and ends, rank exits). It
keeps one :class:`~.job.JobProgress` per attempt and, on a
:class:`~tui_launch.core.periodic.Periodic` about once a second, posts a
:class:`~tui_launch.core.model.events.ProgressSample` (every ``journal_every`` seconds, and the last
one of each attempt, a journaled :class:`~tui_launch.core.model.events.ProgressRecord`), plus a
:class:`~tui_launch.core.model.events.Slowdown` whenever a rank's slowdown or stall starts or ends.

Threads: :meth:`on_lines`/:meth:`on_partial` run on the tailer's thread, :meth:`on_event`
under the store's lock (it only notes what happened: posting from a listener would reorder
the journal), :meth:`tick` on the watcher's own loop. One lock guards the trackers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.model.events import (
    AttemptFailed,
    Event,
    EventTable,
    GroupState,
    ProgressRecord,
    ProgressSample,
    RankExited,
    RankProgress,
    Restart,
    RunFinished,
    Slowdown,
    WorkersStarted,
)
from tui_launch.core.periodic import Periodic
from tui_launch.core.progress.job import JobProgress
from tui_launch.core.progress.tracker import ProgressState

__all__ = ["ProgressWatch"]

# What the watcher notes of the store's events, by type (as the store reduces them): True when
# it noted something, so that the loop wakes to act on it.
_NOTES: EventTable[Callable[[ProgressWatch, Any], bool]] = EventTable("progress note")


@dataclass
class _Attempt:
    """One attempt's trackers and what the watcher knows of its life."""

    number: int
    start: float  # monotonic: the workers' start (or the first line, if that came first)
    job: JobProgress
    local: dict[int, int] = field(default_factory=dict)  # global rank -> local rank
    exited: set[int] = field(default_factory=set)  # global ranks
    end: float | None = None
    final_posted: bool = False
    flags: dict[tuple[int, str], bool] = field(default_factory=dict)


class ProgressWatch:
    """Follow every rank's progress from its logs and post it to the store.

    Args:
        post: the store's ``post``.
        interval: seconds between two samples.
        journal_every: every this many seconds a sample is journaled (0: only the last ones).
        stall_after: a rank whose counters have not moved for this long (at least 10 step
            times) is flagged ``stalled``.
        clock: the monotonic clock (tests pass their own).
        tracker_options: passed to every :class:`~.tracker.ProgressTracker` (``slow_for``...).
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        *,
        interval: float = 1.0,
        journal_every: float = 10.0,
        stall_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        **tracker_options: Any,
    ) -> None:
        self.post = post
        self.interval = interval
        self.journal_every = journal_every
        self.stall_after = stall_after
        self.clock = clock
        self._options = tracker_options
        self._lock = threading.Lock()
        self._attempts: dict[int, _Attempt] = {}
        self._current: int | None = None
        self._last_journal: float | None = None
        self._loop: Periodic | None = None
        self._stopped = False

    # ------------------------------------------------------------------ input

    def _attempt(self, number: int, t: float) -> _Attempt:
        a = self._attempts.get(number)
        if a is None:
            a = self._attempts[number] = _Attempt(number, t, JobProgress(**self._options))
            # Only the current attempt and the one before it are kept: an ended attempt's
            # last lines may still arrive (the tailer reads its files to the end).
            for old in sorted(self._attempts)[:-2]:
                del self._attempts[old]
        if self._current is None or number > self._current:
            self._current = number
        return a

    def on_lines(self, src: object, lines: list[str]) -> None:
        """A log-tailer line sink: ``src`` is a :class:`~tui_launch.core.logs.tail.LogSource`."""
        t = self.clock()
        attempt, rank, stream = _source(src)
        with self._lock:
            a = self._attempt(attempt, t)
            a.local.setdefault(rank, int(getattr(src, "local_rank", rank)))
            # One read of the tailer: the newest line of each kind counts (the parser stays
            # off the hot path however many lines a read holds).
            a.job.feed_lines(rank, stream, lines, t)

    def on_partial(self, src: object, text: str, t: float) -> None:
        """The unterminated text after a stream's last newline (a ``\\r`` progress bar), seen
        at ``t``; an empty ``text`` means the partial line was completed (it arrives again,
        whole, through :meth:`on_lines`)."""
        if not text:
            return
        attempt, rank, stream = _source(src)
        with self._lock:
            a = self._attempt(attempt, t)
            a.local.setdefault(rank, int(getattr(src, "local_rank", rank)))
            a.job.feed(rank, stream, text, t)

    def on_event(self, e: Event) -> None:
        """A store listener: attempt starts and ends, rank exits (notes only, no posting)."""
        note = _NOTES.get(type(e))
        if note is None or not note(self, e):
            return
        if self._loop is not None:
            self._loop.wake()

    @_NOTES.on(WorkersStarted)
    def _started(self, e: WorkersStarted) -> bool:
        with self._lock:
            a = self._attempt(e.attempt, e.mono)
            a.start = min(a.start, e.mono)
            a.local.update({w.global_rank: w.local_rank for w in e.workers})
        return True

    @_NOTES.on(RankExited)
    def _exited(self, e: RankExited) -> bool:
        with self._lock:
            gone = self._attempts.get(e.attempt)
            if gone is not None:
                gone.exited.add(e.global_rank)
        return True

    @_NOTES.on(GroupState)
    def _group_state(self, e: GroupState) -> bool:
        return e.state in ("SUCCEEDED", "FAILED") and self._ended(e)

    @_NOTES.on(AttemptFailed, Restart, RunFinished)
    def _ended(self, e: Event) -> bool:
        number = getattr(e, "attempt", getattr(e, "from_attempt", self._current))
        with self._lock:
            ended = self._attempts.get(number) if number is not None else None
            if ended is not None and ended.end is None:
                ended.end = e.mono
        return True

    def steps(self) -> tuple[int | None, dict[int, tuple[tuple[float, ...], float | None]]]:
        """The current attempt and each of its ranks' step moves (see
        :meth:`~.job.JobProgress.steps`): the hang rule reads them on its own thread."""
        with self._lock:
            a = self._attempts.get(self._current) if self._current is not None else None
            return (None, {}) if a is None else (a.number, a.job.steps())

    # ------------------------------------------------------------------ output

    def start(self) -> ProgressWatch:
        """Start the sampling loop (once)."""
        if self._loop is None:
            self._loop = Periodic(
                "tuilaunch-progress", self.interval, self._tick, first_delay=self.interval, nice=10
            ).start()
        return self

    def _tick(self) -> None:
        self.tick()

    def stop(self) -> None:
        """Stop the loop and journal the last record of every attempt not yet closed."""
        if self._loop is not None:
            self._loop.stop(timeout=2.0)
        with self._lock:
            self._stopped = True
        self.tick(final=True)

    def tick(self, final: bool = False) -> list[Event]:
        """Post the current sample (and the last records of ended attempts); returns what was
        posted. ``final``: the run is over, every attempt's last record is posted now."""
        now = self.clock()
        out: list[Event] = []
        with self._lock:
            if self._stopped and not final:
                return out
            for number in sorted(self._attempts):
                a = self._attempts[number]
                if a.final_posted:
                    continue
                # An attempt's last record waits for the next attempt (or the run's end): the
                # tailer reads an ended attempt's files to the end after torch stopped it.
                ended = final or number != self._current
                if a.end is not None and not ended:
                    continue
                at = a.end if a.end is not None else now
                sample = self._sample(a, at, journal=ended)
                if sample is None:
                    if ended:
                        a.final_posted = True
                    continue
                out.extend(self._slowdowns(a, sample, ended))
                out.append(sample)
                if ended:
                    a.final_posted = True
        for e in out:
            self.post(e)
        return out

    def _sample(self, a: _Attempt, now: float, journal: bool) -> ProgressSample | None:
        job = a.job.state(now)
        if job.progress is None:
            return None
        # One row per rank: the stream whose training bar has moved most (tqdm on stderr
        # beats the loss lines on stdout).
        best: dict[int, tuple[str, ProgressState]] = {}
        for (rank, stream), st in job.streams.items():
            cur = best.get(rank)
            if cur is None or (st.steps_done, st.step or 0) > (cur[1].steps_done, cur[1].step or 0):
                best[rank] = (stream, st)
        if job.rank is not None and job.stream is not None:
            best[job.rank] = (job.stream, job.progress)
        ranks = tuple(
            self._rank(a, rank, stream, st, now) for rank, (stream, st) in sorted(best.items())
        )
        facts = a.job.attempt_progress(a.start, a.end, now)
        if not journal:
            journal = self.journal_every > 0 and (
                self._last_journal is None or now - self._last_journal >= self.journal_every
            )
        if journal:
            self._last_journal = now
        cls = ProgressRecord if journal else ProgressSample
        return cls(
            mono=now,
            attempt=a.number,
            leader=job.rank,
            ranks=ranks,
            first_step=facts.first_step,
            time_to_first_step=(
                facts.first_step_at - a.start if facts.first_step_at is not None else None
            ),
            steps_reached=facts.steps_reached,
            progress_time=facts.progress_time,
        )

    def _rank(
        self, a: _Attempt, rank: int, stream: str, st: ProgressState, now: float
    ) -> RankProgress:
        done = rank in a.exited or a.end is not None or st.finished
        stall_at = max(self.stall_after, 10 * (st.step_time or 0.0))
        stalled = not done and st.stalled_for is not None and st.stalled_for >= stall_at
        last = now - st.last_step_at if st.last_step_at is not None else None
        return RankProgress(
            global_rank=rank,
            local_rank=a.local.get(rank, rank),
            stream=stream,
            step=st.step,
            total=st.total,
            epoch=st.epoch,
            rate=st.rate,
            claimed_rate=st.claimed_rate,
            eta=st.eta if not done else None,
            loss=st.loss,
            step_time=st.step_time,
            last_step_ago=last,
            best_rate=st.best_rate,
            slow=st.slowdown and not done and not stalled,
            stalled=stalled,
            stalled_for=None if done else st.stalled_for,
            fmt=st.fmt,
            finished=st.finished,
        )

    def _slowdowns(self, a: _Attempt, s: ProgressSample, ended: bool) -> list[Slowdown]:
        """A Slowdown for every flag that changed since the last sample (all end with the
        attempt)."""
        out = []
        for r in s.ranks:
            for what, on in (("slow", r.slow), ("stalled", r.stalled)):
                on = on and not ended
                key = (r.global_rank, what)
                if a.flags.get(key, False) != on:
                    a.flags[key] = on
                    out.append(
                        Slowdown(
                            mono=s.mono,
                            attempt=a.number,
                            global_rank=r.global_rank,
                            what=what,
                            active=on,
                            rate=r.rate,
                            best_rate=r.best_rate,
                            stalled_for=r.stalled_for,
                        )
                    )
        return out


def _source(src: object) -> tuple[int, int, str]:
    """(attempt, global rank, stream) of a log source."""
    return (
        int(getattr(src, "attempt", 0)),
        int(getattr(src, "global_rank", 0)),
        str(getattr(src, "stream", "stdout")),
    )
