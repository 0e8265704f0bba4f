"""The hang watch: :class:`~tui_launch.core.diagnosis.stacks.HangDetector` on a periodic loop.

Output is movement under the fixed rule, and before the adaptive rule has seen a rhythm. The
watch hears of it from the log tailer: a (lossy) line sink records the time of each rank's
latest whole line, and a partial sink the time its unterminated text last changed (``\\r``
progress bars, a line still being written). The tailer reads a file when it grows (woken by
inotify where it can be), so the watch itself never looks at the files.

- ``--hang-timeout auto`` (the default): every half second the watch also reads each rank's
  step moves from the progress watch (``steps``) into a :class:`~.rhythm.Rhythm`, which says
  how long the job has stood still and may (see :mod:`~.rhythm`). Once a rank has a rhythm
  of steps, only a step is movement: a thread that keeps printing while the loop stands still
  does not hide the hang. The two dumps are :data:`~.rhythm.CONFIRM_AFTER` (3 s) apart.
- ``--hang-timeout N``: no rank has written anything for N seconds; the dumps are
  ``confirm_after`` (about 10 s) apart.

Either way the watch takes a dump when the limit is reached ("hang-suspected"), and a second
one later ("hang-confirm"): when no rank moved between them (its main-thread stack, the bytes
its main thread read and wrote, its CPU outside a collective, its collectives) the hang is
confirmed, :class:`~tui_launch.core.model.events.HangDetected` is posted (with both dumps'
paths, the verdict and how long the job stood still against its normal time) and ``on_hang``
is told, so that the runner can restart or stop as ``--on-hang`` says. Work whose stacks move
is not a hang. Every second the watch also posts what it expects
(:class:`~tui_launch.core.model.events.HangWatchSample`, for the dashboard).

A confirmed hang flags its ranks (``HUNG?`` in the Workers table) until they move again: the
watch posts :class:`~tui_launch.core.model.events.HangCleared` when a rank moves again (a step,
or output where output is the measure), or when a later dump (any: the ``d`` key, the control
API, another node's request, or the watch's own quiet look every 30 s while hung, every
``--hang-timeout`` seconds under the fixed rule) finds a main-thread stack that moved.

A suspicion that ends before it is confirmed (output came, or the second dump found ranks that
moved: a main-thread stack, or with the Flight Recorder a collective sequence number) posts a
:class:`~tui_launch.core.model.events.HangCleared` with ``suspected`` set once its first dump
was announced, so that the verdict that dump printed is not left standing.

The watch only runs while the workers are monitored (not during a restart or a stop). Its cost
is a few ``stat`` calls per tick and, adaptive, a read of the ranks' step moves: about 0.06 % of
a core for 8 ranks (``bench/hangwatch.py``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from tui_launch.core.diagnosis import rhythm
from tui_launch.core.diagnosis.dumps import Dumper, Taken
from tui_launch.core.diagnosis.rhythm import FIXED, Expectation, Rhythm
from tui_launch.core.diagnosis.stacks import (
    CONFIRM,
    DUMP,
    HangDetector,
    StackDump,
    confirm,
    hang_event,
)
from tui_launch.core.diagnosis.stacks.hang import (
    CONFIRMING,
    DEFAULT_CONFIRM_AFTER,
    HUNG,
    NOTHING,
    SUSPECTED,
    WATCHING,
)
from tui_launch.core.logs.tail import STDERR, LogSource
from tui_launch.core.model.events import (
    Event,
    HangCleared,
    HangDetected,
    HangWatchSample,
    StacksDumped,
)
from tui_launch.core.periodic import Periodic

ACTIONS = ("dump", "restart", "stop")
# --hang-timeout's default: the adaptive rule of rhythm.py.
AUTO = "auto"
# Hung under the adaptive rule: a quiet look for ranks that moved again this often (seconds).
RECHECK = 30.0
# Seconds between two HangWatchSample events (the dashboard's line).
SAMPLE_EVERY = 1.0
# The adaptive rule's tick: the floor is 6 s, so a second's granularity would be a sixth of it.
AUTO_TICK = 0.5
# The adaptive rule's tick while the limit is further off than two of these (seconds): the tick
# only compares times the movements carry, so ticking slower there delays nothing.
SLOW_TICK = 1.0
# Each rank's steps from the progress watch: (attempt, {global rank: (training-counter moves,
# oldest first; the latest move of any counter)}).
StepsRead = tuple[int | None, dict[int, tuple[tuple[float, ...], float | None]]]
StepsReader = Callable[[], StepsRead]
# The ranks' collectives from the live poll of the Flight Recorder: (attempt, {global rank:
# when its newest sequence number was first seen}, whether some rank waits in a collective).
CollectivesRead = tuple[int, dict[int, float], bool]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# What faulthandler writes to a rank's stderr (--dump-via-faulthandler): our own dump, not the
# rank's output, so it must not count as progress.
_FAULTHANDLER_LINE = re.compile(
    r'^((Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|  File ".*", line \d+ in .*'
    r"|  <no Python frame>|  Garbage-collecting|  \.\.\.|)$"
)
_FAULTHANDLER_HEADS = ("Current thread 0x", "Thread 0x")


def _faulthandler_partial(text: str) -> bool:
    """Whether an unended line may be a piece of a faulthandler dump: it writes each line in
    several ``write(2)`` calls, so the tailer reads ``  Fi`` or ``Thread 0x7f`` mid-dump. Its
    frame lines all start with a space; its headers with one of two words."""
    return text.startswith(" ") or any(
        h.startswith(text) or text.startswith(h) for h in _FAULTHANDLER_HEADS
    )


def confirm_window(timeout: float) -> float:
    """Seconds between the two dumps: about 10, shorter for a timeout under 10 s (tests,
    rehearsals), never under 2 (a stack must have time to move)."""
    return min(DEFAULT_CONFIRM_AFTER, max(2.0, timeout))


class HangWatch:
    """Watch every rank's output; dump, confirm and report a hang.

    Args:
        post: the run store's ``post``.
        dumper: takes the two dumps.
        active: whether the workers are being monitored now (no dump during a restart).
        timeout: ``--hang-timeout``: ``"auto"`` (the adaptive rule), seconds (the fixed
            rule), 0 (off).
        action: ``--on-hang``: dump, restart or stop.
        on_hang: called (on the watch's thread) with a confirmed hang.
        confirm_after: seconds between the dumps (default: :data:`~.rhythm.CONFIRM_AFTER`
            adaptive, :func:`confirm_window` fixed).
        steps: each rank's step moves (the progress watch's
            :meth:`~tui_launch.core.progress.watch.ProgressWatch.steps`); without it the
            adaptive rule knows only output.
        collectives: the ranks' collective moves (the live poll's
            :meth:`~.collectives.CollectivePoller.moves`), for a job without step lines.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        dumper: Dumper,
        active: Callable[[], bool],
        *,
        timeout: float | str,
        action: str = "dump",
        on_hang: Callable[[HangDetected], None] | None = None,
        confirm_after: float | None = None,
        steps: StepsReader | None = None,
        collectives: Callable[[], CollectivesRead] | None = None,
    ) -> None:
        self._post = post
        self._dumper = dumper
        self._active = active
        self.action = action
        self._on_hang = on_hang
        self.adaptive = timeout == AUTO
        fixed = 0.0 if self.adaptive else float(timeout)
        if confirm_after is not None:
            window = confirm_after
        else:
            window = rhythm.CONFIRM_AFTER if self.adaptive else confirm_window(fixed)
        self.detector = HangDetector(fixed, window, adaptive=self.adaptive)
        self.rhythm = Rhythm()
        self._steps = steps
        self._collectives = collectives
        # What the rule expects now (the dashboard's line), and at the suspicion.
        self.expectation: Expectation | None = None
        self._lock = threading.Lock()
        self._attempt = -1
        self._ending = False  # the attempt's ranks are being ended (--on-hang restart|stop)
        self._ranks: dict[int, int] = {}  # local -> global
        self._first_path = ""
        # The confirmed hang's second dump and flagged ranks: cleared once the ranks move.
        self._hung_dump: StackDump | None = None
        self._hung_ranks: tuple[int, ...] = ()
        self._recheck_every = RECHECK if self.adaptive else max(fixed, window)
        self._recheck_at = 0.0
        # A suspicion announced by its dump (until confirmed or cleared), and why one whose
        # dump was still being taken ended (output came meanwhile).
        self._suspicion: StacksDumped | None = None
        self._ended: tuple[str, str] | None = None
        self._cleared: list[HangCleared] = []  # to post, outside the lock
        self._io_before: dict[int, tuple[int, float]] = {}  # main threads' I/O, CPU then
        self._sampled_at = float("-inf")
        if self.detector.enabled:
            dumper.listeners.append(self._on_taken)
        # A tick every second is plenty for a timeout of minutes; short timeouts tick faster.
        interval = min(1.0, max(0.1, fixed / 10)) if fixed > 0 else 1.0
        if self.adaptive:
            interval = AUTO_TICK
        self._loop = Periodic("tuilaunch-hang", interval, self._tick, first_delay=interval)

    @property
    def enabled(self) -> bool:
        """False with ``--hang-timeout 0``."""
        return self.detector.enabled

    @property
    def cpu_seconds(self) -> float:
        """CPU time the watch's thread has spent (the benchmark's figure)."""
        return self._loop.cpu_seconds

    def start(self) -> None:
        """Start the loop (nothing when detection is off)."""
        if self.enabled:
            self._loop.start()

    def stop(self) -> None:
        """End the loop."""
        self._loop.stop(timeout=2)

    def attempt_started(self, attempt: int, ranks: dict[int, int]) -> None:
        """A worker group started: silence is counted from now; ``ranks`` local -> global."""
        with self._lock:
            self._attempt = attempt
            self._ending = False
            self._ranks = dict(ranks)
            self._hung_dump, self._hung_ranks = None, ()
            self._suspicion, self._ended = None, None
            now = time.monotonic()
            self.detector.start(now, ranks.values())
            self.rhythm.start(now)
            self.expectation = None

    def attempt_ending(self) -> None:
        """The runner ends this attempt's ranks (a confirmed hang acted on): nothing more to
        watch until the next attempt starts. A rank that left its hang for a SIGTERM handler
        (Lightning's calls a collective its peers never join) was suspected again otherwise."""
        with self._lock:
            self._ending = True

    def sink(self, src: LogSource, lines: list[str]) -> None:
        """A log-tailer sink: a rank wrote whole lines."""
        if self._dumper.via_faulthandler and all(_FAULTHANDLER_LINE.match(x) for x in lines):
            return
        if lines and src.attempt == self._attempt:
            with self._lock:
                self._wrote(src.global_rank, time.monotonic())
            self._post_cleared()

    def partial_sink(self, src: LogSource, text: str, t: float) -> None:
        """A log-tailer partial sink: a rank's unterminated text changed (a ``\\r`` progress
        bar drawn again, a line being written); "" (a newline ended it) is the line sink's."""
        if not text or src.attempt != self._attempt:
            return
        if self._dumper.via_faulthandler and src.stream == STDERR and _faulthandler_partial(text):
            return  # maybe a piece of our own dump's next line
        with self._lock:
            self._wrote(src.global_rank, t)
        self._post_cleared()

    def _wrote(self, rank: int, now: float) -> None:
        """Under the lock: ``rank`` wrote output. Movement, unless the adaptive rule follows
        the job's steps: then only a step is (a thread that prints is not the loop)."""
        self.rhythm.output(now)
        if not (self.adaptive and (self.rhythm.by_steps or self.rhythm.by_collectives)):
            self._output(rank, now, "wrote output again")

    def _output(self, rank: int, now: float, what: str = "wrote output again") -> None:
        """Under the lock: ``rank`` moved (output, or a step); a suspected or confirmed hang
        is over (its flags go)."""
        state = self.detector.state
        self.detector.output(rank, now)
        why = "output" if what.startswith("wrote") else "steps"
        if what.startswith("issued"):
            why = "collectives"
        if state == HUNG:
            self._clear(why, f"rank {rank} {what}")
        elif state in (SUSPECTED, CONFIRMING):
            self._suspicion_over(why, f"rank {rank} {what}")

    def _suspicion_over(self, why: str, detail: str) -> None:
        """Under the lock: a suspected hang ended before it was confirmed; once its dump was
        announced (with a verdict that may name a rank), say so."""
        if self._suspicion is None:
            self._ended = (why, detail)  # its dump is still being taken
            return
        odd = self._suspicion.odd_ranks
        self._cleared.append(HangCleared(self._attempt, odd, why, detail, suspected=True))
        self._suspicion, self._ended = None, None

    def _clear(self, why: str, detail: str) -> None:
        # Under the lock: queue the event that drops the HUNG? flags of this attempt.
        if self._hung_ranks:
            self._cleared.append(HangCleared(self._attempt, self._hung_ranks, why, detail))
        self._hung_dump, self._hung_ranks = None, ()

    def _post_cleared(self) -> None:
        with self._lock:
            cleared, self._cleared = self._cleared, []
        for e in cleared:
            self._post(e)

    def _moved(self, dump: StackDump) -> None:
        """Under the lock: a dump taken while hung; a main-thread stack that moved ends it."""
        if self.detector.state != HUNG or self._hung_dump is None:
            return
        result = confirm(self._hung_dump, dump)
        if result.moved:
            self.detector.start(time.monotonic(), self._ranks.values())
            self._clear("stacks", result.text)

    def _on_taken(self, taken: Taken) -> None:
        # A dumper listener (any thread): every dump, whoever asked for it.
        with self._lock:
            if taken.event.attempt == self._attempt:
                self._moved(taken.dump)
        self._post_cleared()

    def _read_steps(self, now: float, steps: StepsRead | None) -> None:
        """Under the lock: each rank's step moves from the progress watch (read before the
        lock was taken); a rank that advanced has moved."""
        if steps is None:
            return
        attempt, ranks = steps
        if attempt != self._attempt:
            return
        for rank, (moves, last_move) in sorted(ranks.items()):
            if self.rhythm.steps(rank, moves, last_move) and self.rhythm.by_steps:
                self._output(rank, now, "stepped again")

    def _read_collectives(self, now: float, moves: CollectivesRead | None) -> None:
        """Under the lock: the ranks' collective moves from the live poll (read before the
        lock was taken); without a rhythm of steps, a rank that moved has moved."""
        if moves is None:
            return
        attempt, moved, waiting = moves
        if attempt != self._attempt:
            return
        for rank in self.rhythm.collectives(moved, waiting):
            if not self.rhythm.by_steps:
                self._output(rank, now, "issued a collective again")

    def expect(self, now: float) -> Expectation:
        """Under the lock: what the rule expects at ``now``."""
        if self.adaptive:
            return self.rhythm.expect(now)
        return Expectation(FIXED, self.detector.timeout, self.detector.silence(now))

    def _sample(self, attempt: int, e: Expectation, now: float) -> HangWatchSample | None:
        """Under the lock: what the rule expects, for the dashboard, about once a second."""
        if now - self._sampled_at < SAMPLE_EVERY:
            return None
        self._sampled_at = now
        limit = max(e.limit, self.detector.backoff)
        expected = replace(e, limit=limit).expected()
        return HangWatchSample(
            attempt, e.basis, limit, e.still_for, e.typical, expected, self.detector.state
        )

    def _tick(self) -> float | None:
        """One look; returns the delay to the next (None: the loop's interval)."""
        if not self._active() or self._ending:
            return SLOW_TICK if self.adaptive else None
        # The progress watch's lock is taken apart from ours.
        steps = self._steps() if self.adaptive and self._steps is not None else None
        moves = self._collectives() if self.adaptive and self._collectives is not None else None
        with self._lock:
            attempt = self._attempt
            now = time.monotonic()
            self._read_steps(now, steps)
            self._read_collectives(now, moves)
            expected = self.expectation = self.expect(now)
            todo = self.detector.poll(now, expected.still_for, expected.limit)
            silence = expected.still_for
            recheck = self.detector.state == HUNG and now >= self._recheck_at
            sample = self._sample(attempt, expected, now)
            room = max(expected.limit, self.detector.backoff) - expected.still_for
            slow = self.adaptive and self.detector.state == WATCHING and room > 2 * SLOW_TICK
        self._post_cleared()
        if sample is not None:
            self._post(sample)
        if recheck:
            # Hung: a quiet look now and then (not kept, not announced) for ranks that moved.
            self._recheck_at = now + self._recheck_every
            peeked = self._dumper.peek("hang-recheck")
            with self._lock:
                if peeked is not None and attempt == self._attempt:
                    self._moved(peeked)
            self._post_cleared()
            return None
        if todo == DUMP:
            self._suspect(attempt)
        elif todo == CONFIRM:
            event = self._confirm(attempt, silence, expected)
            if event is not None and self._on_hang is not None:
                self._on_hang(event)
        self._post_cleared()
        return SLOW_TICK if slow and todo == NOTHING else None

    def _main_io(self) -> dict[int, tuple[int, float]]:
        """Bytes each live rank's main thread has read and written so far (``rchar`` +
        ``wchar`` of ``/proc/<pid>/task/<pid>/io``) and the CPU seconds it has spent (``stat``);
        a rank it cannot read is left out."""
        out: dict[int, tuple[int, float]] = {}
        for _, rank, pid in self._dumper.targets():
            try:
                with open(f"/proc/{pid}/task/{pid}/io") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                with open(f"/proc/{pid}/task/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                ticks = int(stat[11]) + int(stat[12])  # utime, stime
                out[rank] = (int(fields["rchar"]) + int(fields["wchar"]), ticks / _CLOCK_TICKS)
            except (OSError, KeyError, ValueError, IndexError):
                continue
        return out

    def _io_since(self) -> tuple[dict[int, int], dict[int, float]]:
        """Bytes each rank's main thread read and wrote, and the CPU seconds it spent, since
        the suspicion's dump."""
        now = self._main_io()
        before = self._io_before
        io = {g: n - before[g][0] for g, (n, _) in now.items() if g in before}
        cpu = {g: c - before[g][1] for g, (_, c) in now.items() if g in before}
        return io, cpu

    def _suspect(self, attempt: int) -> None:
        """The first dump of a suspected hang; output that came while it was taken ends the
        suspicion it announced."""
        taken = self._dumper.take("hang-suspected", "hang")
        # After the dump: a faulthandler dump is written by the rank's main thread.
        self._io_before = self._main_io()
        with self._lock:
            if attempt != self._attempt:
                return  # a new attempt: no longer suspected
            if taken is None:
                if self.detector.state == SUSPECTED:
                    self.detector.start(time.monotonic(), self._ranks.values())
                return
            self._suspicion = taken.event
            if self.detector.state != SUSPECTED:
                # Output came meanwhile: the suspicion this dump announced is over already.
                why, detail = self._ended or ("output", "output came during the dump")
                self._suspicion_over(why, detail)
                return
            self._first_path = taken.event.path
            self.detector.first(taken.dump, time.monotonic())

    def _confirm(self, attempt: int, silence: float, expected: Expectation) -> HangDetected | None:
        """The second dump: the confirmed hang (posted), or None (the suspicion cleared)."""
        io, cpu = self._io_since()  # before the dump, for the same reason
        taken = self._dumper.take("hang-confirm", "hang")
        with self._lock:
            if self.detector.state != CONFIRMING or attempt != self._attempt:
                return None  # output came meanwhile (its sink cleared it), or a new attempt
            if taken is None:
                self.detector.start(time.monotonic(), self._ranks.values())
                self._suspicion_over("gone", "no rank left to dump")
                return None
            result = self.detector.second(taken.dump, time.monotonic(), io, cpu)
            if not result.hung:
                self._suspicion_over("stacks", result.text)
                return None
            self._suspicion, self._ended = None, None
            event = hang_event(
                result,
                taken.dump,
                attempt=attempt,
                silence=silence,
                first_path=self._first_path,
                second_path=taken.event.path,
                action=self.action,
                stood_still=expected.said(silence),
            )
            self._hung_dump = taken.dump
            self._hung_ranks = event.odd_ranks or event.still_ranks
            self._recheck_at = time.monotonic() + self._recheck_every
            # Under the lock: a HangCleared for output that comes next is posted after it.
            self._post(event)
        # The confirming dump gets the native frames too, once the hang is said (they take a
        # second a rank, several on a loaded machine) and before --on-hang acts: the ranks are
        # hung, so the pause costs them nothing, and where a Python stack ends in torch's C++
        # they say what it waits in.
        self._dumper.add_native(taken)
        return event
