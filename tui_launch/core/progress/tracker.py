"""Progress of one (rank, stream): the training bar, our own rate, ETA, slowdowns, stalls.

Fed ``(text, t)`` where ``t`` is the monotonic time the text arrived; nothing here reads a
clock, so every behaviour is testable by passing times in. The rate is ours: Δstep/Δt over a
window of arrival times, because the rate a line claims is an EMA (tqdm), a lifetime mean
(Lightning) or a per-iteration figure (Megatron) and says nothing about *now*. The claimed
rate is kept as a second value.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tui_launch.core.model.goodput import AttemptProgress
from tui_launch.core.progress.parse import ProgressReading, family_anchor, family_of, parse_line
from tui_launch.core.progress.reading import global_steps

__all__ = ["ProgressState", "ProgressTracker"]


@dataclass(slots=True)
class _Bar:
    """One counter: the training bar, or the eval/other bar interleaved with it."""

    step: int
    total: int | None
    moved_at: float


@dataclass(frozen=True, slots=True)
class ProgressState:
    """A snapshot of a tracker at time ``now`` (see :meth:`ProgressTracker.snapshot`).

    ``step``/``total``/``percent``/``eta`` describe the current training bar (a bar restarts
    each epoch in Lightning or torchtune); ``steps_done`` counts training steps seen advancing
    in this tracker across bar restarts. ``rate`` is ours (steps/s), ``claimed_rate`` the
    line's. ``stalled_for`` is the seconds since any counter (training or eval) last moved.
    """

    fmt: str | None
    locked: bool
    step: int | None
    total: int | None
    epoch: float | None
    epoch_total: int | None
    percent: float | None
    rate: float | None
    claimed_rate: float | None
    eta: float | None
    step_time: float | None
    last_step_at: float | None
    best_rate: float | None
    slowdown: bool
    stalled_for: float | None
    steps_done: int
    loss: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    tflops: float | None
    eval_step: int | None
    eval_total: int | None
    finished: bool


class ProgressTracker:
    """Progress of one rank's stream, from its lines and their arrival times.

    Rules:

    * lock onto a format family after ``lock_after`` consecutive step readings of it; then
      other families' step lines are ignored, but step-less lines (the Trainer's loss dicts,
      ``Epoch N/M``) still count. If another family matches ``relock_after`` times in a row
      while the locked one is silent, the program changed its output and the lock moves.
    * a falling counter with the training bar's total starts the next bar (next epoch);
      a bar flagged eval/other by its text, or one with another total while training is
      mid-way, is an eval bar: tracked apart, never the job's progress.
    * the rate is Δsteps/Δt over ``window`` seconds of arrival times, kept per step move, so a
      program that logs every 10 steps gives a steady rate rather than a sawtooth.
    * ``slowdown``: our rate has stayed below ``slow_ratio`` x the best full-window rate for
      ``slow_for`` seconds.
    * lines arriving within ``min_interval`` of the last parse are coalesced: only the newest
      is parsed (it supersedes the others, which arrived at nearly the same time), so the cost
      per stream is bounded however fast a program prints. Coalescing is per kind of line, so
      that one kind never hides another: lines of the locked family, the Trainer's ``{...}``
      dicts (the loss, written right before a bar redraw), and other lines that pass the
      pre-filter (parsed only to notice that the program changed its output).
    """

    def __init__(
        self,
        *,
        window: float = 30.0,
        lock_after: int = 3,
        relock_after: int = 50,
        slow_ratio: float = 0.8,
        slow_for: float = 60.0,
        progress_gap: float = 60.0,
        min_interval: float = 0.05,
    ) -> None:
        self.window = window
        self.lock_after = lock_after
        self.relock_after = relock_after
        self.slow_ratio = slow_ratio
        self.slow_for = slow_for
        self.progress_gap = progress_gap
        self.min_interval = min_interval

        self.family: str | None = None  # the locked family
        self.fmt: str | None = None  # the format of the last accepted step reading
        self._streak_family: str | None = None
        self._streak = 0

        self._train: _Bar | None = None
        self._other: _Bar | None = None
        self.epoch: float | None = None
        self.epoch_total: int | None = None
        self.declared_total: int | None = None  # a step total the program declared
        self.per_epoch: int | None = None  # steps per epoch, where a line states it
        # What the training counter counts: "step", or "epoch" while the stream has printed
        # epoch lines and no step line (a step line takes over, see _count_steps).
        self.unit: str | None = None
        self.loss: float | None = None
        self.claimed_rate: float | None = None
        self.step_time_claimed: float | None = None
        self.samples_per_s: float | None = None
        self.tokens_per_s: float | None = None
        self.tflops: float | None = None
        self.finished = False

        # (t, cumulative steps) at each move of the training counter; pruned to the window.
        self._samples: deque[tuple[float, int]] = deque()
        self.steps_done = 0
        self.best_rate: float | None = None
        self._slow_since: float | None = None
        self._last_move: float | None = None  # any counter, training or eval
        self.first_seen: float | None = None  # first step reading
        self.first_step: int | None = None
        self.first_move_at: float | None = None  # first time the training counter rose
        self.max_step: int | None = None
        self.progress_time = 0.0  # seconds between moves no more than progress_gap apart
        # The latest moves of the training counter (the hang rule's rhythm).
        self.moves: deque[float] = deque(maxlen=_MOVES_KEPT)

        # per kind of line ("fam", "dict", "other", or "any" before the lock): the last parse
        # time and the newest line waiting to be parsed
        self._last_parse: dict[str, float] = {}
        self._pending: dict[str, tuple[str, float]] = {}
        self._anchor: Callable[[str], bool] | None = None

    # --- input ---------------------------------------------------------------------------

    def feed(self, text: str, t: float) -> None:
        """Take a line (or a block of lines, or an unterminated ``\\r`` line) seen at ``t``."""
        if "\n" in text:
            for line in text.split("\n"):
                if line:
                    self.feed(line, t)
            return
        # This runs for every line every rank prints: the cheapest tests first, inline.
        if "{" in text:
            kind = "dict"
        else:
            anchor = self._anchor
            if anchor is not None and anchor(text):
                kind = "fam"
            elif not (
                # maybe_progress(text), inlined: a call costs as much as two of these tests
                "/" in text or "tep" in text or "ter" in text or "poch" in text
            ):
                return
            else:
                kind = "any" if anchor is None else "other"
        self._feed_kind(text, t, kind)

    def feed_lines(self, lines: list[str], t: float) -> None:
        """Take whole lines (no ``\n`` in them) that arrived together at ``t`` (one read of
        the log tailer), with the same result as feeding them one by one.

        Fed one by one, lines of one kind that share an arrival time are coalesced: the
        first is parsed (the step a restart resumed from), the newest supersedes the ones
        between. So only those two of each kind are looked for: from the oldest line
        forward and from the newest back, with the pre-filter's tests inline, each scan
        stopping once it has found every kind. A read of a thousand bar updates costs a
        few tests, not a thousand calls.
        """
        if self.unit != "step":
            # Before the first step every line counts, in order (the first step is where a
            # restart resumed from), up to a bound: a stream may print no step at all.
            start = 0
            for i, line in enumerate(lines[:_FIRST_STEP_SCAN]):
                start = i + 1
                if _kind(line, self._anchor) is not None:
                    self.feed(line, t)
                    if self.unit == "step":
                        break
            lines = lines[start:]
        anchor = self._anchor
        kinds = 2 if anchor is None else 3  # dict and any | dict, fam and other
        last: dict[str, int] = {}  # kind -> its newest line
        first: dict[str, int] = {}  # kind -> its oldest line (known once scanned to the start)
        n = len(lines)
        whole = True
        for i in range(n - 1, -1, -1):  # from the newest back
            kind = _kind(lines[i], anchor)
            if kind is None:
                continue
            first[kind] = i
            if kind not in last:
                last[kind] = i
                if len(last) == kinds and i > 0:
                    whole = False  # every kind is in: their oldest lines are found forward
                    break
        if not whole:
            first = {}
            for i in range(n):
                kind = _kind(lines[i], anchor)
                if kind is None:
                    continue
                if kind not in first:
                    first[kind] = i
                    if len(first) == kinds:
                        break
        for i in sorted(set(first.values()) | set(last.values())):  # in arrival order
            self.feed(lines[i], t)

    def _feed_kind(self, text: str, t: float, kind: str) -> None:
        """Parse ``text`` of ``kind`` now, or keep it as its kind's newest (coalescing)."""
        last = self._last_parse.get(kind)
        # Nothing is coalesced before the first step: the first step line of an attempt is
        # where a restart resumed from, and the line just before it (a "Resuming from
        # snapshot at Epoch 4" of the same kind) must not take its place.
        if last is not None and t - last < self.min_interval and self.unit == "step":
            self._pending[kind] = (text, t)  # a newer line of this kind supersedes it
            return
        pending = self._pending
        if pending:
            pending.pop(kind, None)  # older than this line, of the same kind: superseded
            self.flush()  # other kinds' waiting lines are older: they go first
        self._last_parse[kind] = t
        self._parse(text, t, kind)

    def flush(self) -> None:
        """Parse the coalesced lines still waiting, oldest first (a snapshot does this)."""
        if self._pending:
            waiting = sorted(self._pending.items(), key=lambda kv: kv[1][1])
            self._pending.clear()
            for kind, (text, t) in waiting:
                self._parse(text, t, kind)

    def _parse(self, text: str, t: float, kind: str) -> None:
        # "other" lines are not the locked family's: parse them unlocked, for the relock count
        reading = parse_line(text, None if kind == "other" else self.family)
        if reading is not None:
            self.apply(reading, t)

    def apply(self, reading: ProgressReading, t: float) -> bool:
        """Fold one reading seen at ``t`` into the state; False if the lock rejected it."""
        counted = global_steps(reading)
        if counted is not reading:
            bar = self._train
            assert counted.step is not None
            if bar is not None and counted.step < bar.step and counted.epoch == self.epoch:
                # Lightning resets its bar to 0 before it names the next epoch ("Epoch 0: 0/32",
                # then "Epoch 1: 0/32"): a redraw, not a step back
                return True
            reading = counted
        self._merge_metadata(reading)
        if reading.step is None:
            if reading.phase == "summary":
                self.finished = True
            elif reading.fmt == "epoch" and reading.epoch is not None and reading.phase == "train":
                self._count_epoch(int(reading.epoch), t)
            return True
        if not self._admit(family_of(reading.fmt)):
            return False
        if reading.phase != "train":
            self._move_other(reading, t)
            return True
        if self.unit == "epoch":
            self._count_steps()
        bar = self._train
        if bar is None:
            self._start_train(reading, t)
            return True
        if reading.total == bar.total:
            if reading.step >= bar.step:
                delta, bar.step = reading.step - bar.step, reading.step
            else:
                # falling counter, same bar shape: the next epoch's bar, counted from 0
                if reading.epoch is None and self.epoch is not None and self.fmt == reading.fmt:
                    self.epoch += 1
                delta, bar.step = reading.step, reading.step
            self._advance(delta, t)
        elif self._takes_over(bar, reading):
            self._start_train(reading, t)
        else:
            self._move_other(reading, t)
            return True
        self.fmt = reading.fmt
        if reading.rate is not None:
            self.claimed_rate = reading.rate
        self.step_time_claimed = reading.step_time
        return True

    # --- rules ---------------------------------------------------------------------------

    def _admit(self, family: str) -> bool:
        if family == self._streak_family:
            self._streak += 1
        else:
            self._streak_family, self._streak = family, 1
        if self.family is None:
            if self._streak >= self.lock_after:
                self.family = family
                self._anchor = family_anchor(family)
                if self.fmt is not None and family_of(self.fmt) != family:
                    # the bar so far came from a line of another shape: the locked family's
                    # counter is the one to follow from here
                    self._train = None
            return True
        if family == self.family:
            return True
        if self._streak >= self.relock_after:
            # the program's output changed (another phase, another logger): follow it
            self.family = family
            self._anchor = family_anchor(family)
            self._train = None
            return True
        return False

    def _count_epoch(self, epoch: int, t: float) -> None:
        """An epoch line: the training counter in epochs, while no step line was seen."""
        if self.unit == "step":
            return  # the epoch is metadata of the step counter
        bar = self._train
        if bar is None:
            self._start_train(ProgressReading(fmt="epoch", step=epoch), t)
        elif epoch > bar.step:
            delta, bar.step = epoch - bar.step, epoch
            self._advance(delta, t)

    def _count_steps(self) -> None:
        """The first step line after epoch lines: count in steps from here, as if the epoch
        lines had not been counted (their first and last value are in another unit)."""
        self._train = None
        self._samples.clear()
        self.steps_done = 0
        self.best_rate = self._slow_since = self._last_move = None
        self.first_seen = self.first_step = self.first_move_at = self.max_step = None
        self.progress_time = 0.0
        self.moves.clear()
        self.fmt = self.unit = None

    @staticmethod
    def _takes_over(bar: _Bar, reading: ProgressReading) -> bool:
        """A bar with another total replaces the training bar only once that bar is done and
        the new one is longer (a data-preparation bar that preceded training); otherwise it is
        an eval bar (the Trainer's evaluation bar has no description to tell it apart)."""
        if bar.total is None or reading.total is None:
            return bar.total is None and reading.total is not None and bar.step == 0
        return bar.step >= bar.total and reading.total > bar.total

    def _merge_metadata(self, r: ProgressReading) -> None:
        if r.phase in ("eval", "other"):
            return  # an eval loss or epoch is not the training one
        if r.epoch is not None:
            self.epoch = r.epoch
        if r.epoch_total is not None:
            self.epoch_total = r.epoch_total
        if r.step is None and r.total:
            self.declared_total = r.total
        if r.per_epoch:
            self.per_epoch = r.per_epoch
        if r.loss is not None:
            self.loss = r.loss
        if r.samples_per_s is not None:
            self.samples_per_s = r.samples_per_s
        if r.tokens_per_s is not None:
            self.tokens_per_s = r.tokens_per_s
        if r.tflops is not None:
            self.tflops = r.tflops
        if r.phase == "summary" and r.rate is not None:
            self.claimed_rate = r.rate

    def _start_train(self, r: ProgressReading, t: float) -> None:
        assert r.step is not None
        self._train = _Bar(step=r.step, total=r.total, moved_at=t)
        self.unit = "epoch" if r.fmt == "epoch" else "step"
        if self.first_seen is None:
            self.first_seen, self.first_step = t, r.step
            # A log line reports a finished step; tqdm's first draw ("0/30", or "80/1000" on
            # resume, at "?it/s") reports none, so there the first step is the first move.
            if r.step > 0 and not (family_of(r.fmt) == "tqdm" and r.rate is None):
                self.first_move_at = t
        self.max_step = r.step if self.max_step is None else max(self.max_step, r.step)
        if not self._samples:
            self._samples.append((t, self.steps_done))
        self._last_move = t if self._last_move is None else self._last_move
        self.fmt = r.fmt
        if r.rate is not None:
            self.claimed_rate = r.rate

    def _move_other(self, r: ProgressReading, t: float) -> None:
        assert r.step is not None
        other = self._other
        if other is None or other.total != r.total or other.step != r.step:
            self._note_move(t)
            self._other = _Bar(step=r.step, total=r.total, moved_at=t)

    def _note_move(self, t: float) -> None:
        if self._last_move is not None and 0 < t - self._last_move <= self.progress_gap:
            self.progress_time += t - self._last_move
        self._last_move = t

    def _advance(self, delta: int, t: float) -> None:
        bar = self._train
        assert bar is not None
        if self.max_step is None or bar.step > self.max_step:
            self.max_step = bar.step
        if delta <= 0:
            return
        self.steps_done += delta
        self.moves.append(t)
        if self.first_move_at is None:
            self.first_move_at = t
        bar.moved_at = t
        self._note_move(t)
        samples = self._samples
        samples.append((t, self.steps_done))
        # keep one sample at or before the window's start, so the span covers the window
        while len(samples) >= 3 and samples[1][0] <= t - self.window:
            samples.popleft()
        rate = self._window_rate()
        if rate is None:
            return
        span = t - samples[0][0]
        if span >= self.window and (self.best_rate is None or rate > self.best_rate):
            self.best_rate = rate
        if self.best_rate is not None and rate < self.slow_ratio * self.best_rate:
            if self._slow_since is None:
                self._slow_since = t
        else:
            self._slow_since = None

    def _window_rate(self) -> float | None:
        samples = self._samples
        if len(samples) < 2:
            return None
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None

    # --- output --------------------------------------------------------------------------

    @property
    def step(self) -> int | None:
        """The training bar's counter."""
        return self._train.step if self._train else None

    @property
    def total(self) -> int | None:
        """The training bar's total, when it states one."""
        return self._train.total if self._train else None

    def run_total(self) -> int | None:
        """The training counter's total: the bar's, else one inferred from what the stream
        declared (``max_iters = 5000``; epochs x steps per epoch; epochs, when the counter
        counts epochs). None when nothing states it."""
        bar = self._train
        if bar is None:
            return None
        if bar.total:
            return bar.total
        if self.unit == "epoch":
            return self.epoch_total
        if self.declared_total:
            return self.declared_total
        if self.epoch_total and self.per_epoch:
            return self.epoch_total * self.per_epoch
        return None

    @property
    def last_move(self) -> float | None:
        """When a counter (training or eval) last moved."""
        return self._last_move

    def rate(self) -> float | None:
        """Our rate in steps/s over the window (None before two moves)."""
        return self._window_rate()

    def snapshot(self, now: float) -> ProgressState:
        """Everything known at ``now`` (flushes a coalesced line first)."""
        self.flush()
        bar = self._train
        rate = self._window_rate()
        step = bar.step if bar else None
        total = self.run_total()
        percent = 100.0 * step / total if step is not None and total else None
        eta = None
        if step is not None and total and rate:
            eta = max(total - step, 0) / rate
        step_time = self.step_time_claimed or (1.0 / rate if rate else None)
        other = self._other
        show_other = other is not None and (bar is None or other.moved_at >= bar.moved_at)
        return ProgressState(
            fmt=self.fmt,
            locked=self.family is not None,
            step=step,
            total=total,
            epoch=self.epoch,
            epoch_total=self.epoch_total,
            percent=percent,
            rate=rate,
            claimed_rate=self.claimed_rate,
            eta=eta,
            step_time=step_time,
            last_step_at=bar.moved_at if bar else None,
            best_rate=self.best_rate,
            slowdown=self._slow_since is not None and now - self._slow_since >= self.slow_for,
            stalled_for=now - self._last_move if self._last_move is not None else None,
            steps_done=self.steps_done,
            loss=self.loss,
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            tflops=self.tflops,
            eval_step=other.step if show_other and other else None,
            eval_total=other.total if show_other and other else None,
            finished=self.finished,
        )

    def attempt_progress(self, start: float, end: float | None = None) -> AttemptProgress:
        """This tracker's share of the goodput bookkeeping for an attempt started at ``start``."""
        self.flush()
        return AttemptProgress(
            start=start,
            end=end,
            first_step=self.first_step,
            first_step_at=self.first_move_at if self.first_move_at is not None else None,
            steps_reached=self.max_step,
            progress_time=self.progress_time,
        )


# Training-counter moves kept for the hang rule (it reads them every half second).
_MOVES_KEPT = 64
# Lines parsed one by one, in order, per read before the first step (feed_lines).
_FIRST_STEP_SCAN = 256


def _kind(text: str, anchor: Callable[[str], bool] | None) -> str | None:
    """What :meth:`ProgressTracker.feed` classifies ``text`` as (None: no progress can be in
    it): ``dict``, ``fam`` (the locked family's anchor), ``any`` or ``other``. ``feed`` keeps
    these tests inline, since it runs for every line; the batch scans call this."""
    if "{" in text:
        return "dict"
    if anchor is not None and anchor(text):
        return "fam"
    if not ("/" in text or "tep" in text or "ter" in text or "poch" in text):
        return None
    return "any" if anchor is None else "other"
