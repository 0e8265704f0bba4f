"""Hang detection as a pure state machine: silence on every rank, then two dumps that match.

The caller (a periodic helper in the runner) feeds it the time of each rank's latest output
(any bytes, unterminated ``\\r`` progress output included) and the clock, and asks :meth:`poll`
what to do:

1. ``--hang-timeout`` seconds without output from any rank: a hang is *suspected*; poll says
   :data:`DUMP` and the caller takes a dump and hands it to :meth:`HangDetector.first`.
2. ``confirm_after`` seconds later (about 10) poll says :data:`CONFIRM`; the caller takes a
   second dump and hands it to :meth:`HangDetector.second`, which returns a
   :class:`Confirmation`: hung when no rank's main-thread stack moved between the two dumps.
   Work that prints nothing for longer than the timeout but whose stacks move is not a hang:
   the detector goes back to watching and waits another full timeout before dumping again.

Any output cancels a suspicion. Adaptive (``--hang-timeout auto``), the caller says in each
:meth:`~HangDetector.poll` how long the job has stood still and may
(:class:`~tui_launch.core.diagnosis.rhythm.Rhythm`), calls :meth:`~HangDetector.output` for a
step (or for output, before the job has a rhythm), and a suspicion cleared by movement is not
raised again before the stillness has doubled. Nothing here sleeps or reads a clock: every
time is passed in, so tests drive it with plain numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tui_launch.core.diagnosis.stacks.model import StackDump
from tui_launch.core.diagnosis.stacks.verdict import main_signature, place_of, verdict
from tui_launch.core.model.events import HangDetected
from tui_launch.core.model.text import rank_list

# What poll() asks of the caller.
NOTHING = "nothing"
DUMP = "dump"  # take the first dump: a hang is suspected
CONFIRM = "confirm"  # take the second dump

# The detector's states.
WATCHING = "watching"
SUSPECTED = "suspected"  # asked for the first dump, not given it yet
CONFIRMING = "confirming"  # has the first dump, waits to ask for the second
HUNG = "hung"  # confirmed; quiet until some rank writes again

DEFAULT_TIMEOUT = 300.0
DEFAULT_CONFIRM_AFTER = 10.0


@dataclass(frozen=True)
class Confirmation:
    """The comparison of two dumps: ``still`` ranks whose main-thread stack did not move,
    ``moved`` those whose stack did, ``unknown`` those without a stack in either dump."""

    hung: bool
    still: tuple[int, ...]
    moved: tuple[int, ...]
    unknown: tuple[int, ...]
    interval: float
    text: str


def _sequence_numbers(dump: StackDump) -> dict[int, int]:
    """Each rank's last enqueued collective in the dump's Flight Recorder records (if any)."""
    return {r.global_rank: r.last_enqueued for r in dump.records if r.last_enqueued >= 0}


# Bytes a rank's main thread must read or write between the two dumps (the dumps' own
# writes left out) to have moved: a checkpoint save or a data load can sit in one Python line
# (``torch.save``'s loop over the storages, one ``f.read``, a retry loop that sleeps between
# saves) for minutes while it works; a hung main thread does no I/O, and one that prints a
# status line now and then writes far less than this.
IO_MOVED = 16 << 10
# Seconds of CPU a rank's main thread must spend between the two dumps (about 3 s apart under
# the adaptive rule: 5 %) to have moved, when it is not waiting in a collective: a compute loop
# in one Python line (an evaluation written as one expression) shows the same stack twice; a
# hung main thread sleeps or blocks. Ranks that wait in a collective are left out: NCCL's
# waits spin.
CPU_MOVED = 0.15


def confirm(
    first: StackDump,
    second: StackDump,
    io: Mapping[int, int] | None = None,
    cpu: Mapping[int, float] | None = None,
) -> Confirmation:
    """Compare two dumps of the same ranks: hung when no rank moved, neither its main-thread
    stack nor, with Flight Recorder records, its collectives (a loop whose stack is always
    caught at the same all-reduce still moves on), nor the bytes its main thread read and
    wrote between them (``io``: global rank -> bytes; :data:`IO_MOVED` or more is movement),
    nor, outside a collective, the CPU its main thread spent (``cpu``: global rank -> seconds;
    :data:`CPU_MOVED` or more is movement).

    Ranks without a stack in one of the dumps are left out of the judgement; when no rank can
    be compared, it is not confirmed (nothing proves a hang).
    """
    before = {r.global_rank: main_signature(r) for r in first.ranks}
    # A rank stopped by a signal in both dumps (SIGSTOP before its interpreter had a Python
    # frame to read) has not moved, whatever could be read of it.
    stopped_before = {r.global_rank for r in first.ranks if r.process.state in ("T", "t")}
    seq_before, seq_after = _sequence_numbers(first), _sequence_numbers(second)
    advanced = {
        g
        for g in seq_after
        if (g in seq_before and seq_before[g] != seq_after[g])
        or any(r.global_rank == g and r.moved for r in (*first.records, *second.records))
    }
    busy = {g for g, n in (io or {}).items() if n >= IO_MOVED}
    computing = {
        r.global_rank
        for r in second.ranks
        if (cpu or {}).get(r.global_rank, 0.0) >= CPU_MOVED and place_of(r).collective is None
    }
    still: list[int] = []
    moved: list[int] = []
    by_records: list[int] = []
    by_io: list[int] = []
    by_cpu: list[int] = []
    unknown: list[int] = []
    for r in second.ranks:
        a, b = before.get(r.global_rank), main_signature(r)
        if a and b and a != b:
            moved.append(r.global_rank)
        elif r.global_rank in busy:
            moved.append(r.global_rank)
            by_io.append(r.global_rank)
        elif r.global_rank in computing:
            moved.append(r.global_rank)
            by_cpu.append(r.global_rank)
        elif r.global_rank in advanced:
            moved.append(r.global_rank)
            by_records.append(r.global_rank)
        elif r.global_rank in stopped_before and r.process.state in ("T", "t"):
            still.append(r.global_rank)
        elif not a or not b:
            unknown.append(r.global_rank)
        else:
            still.append(r.global_rank)
    interval = max(0.0, second.wall - first.wall)
    hung = bool(still) and not moved
    if hung:
        text = f"hung: no main-thread stack moved in {interval:.0f} s (ranks {rank_list(still)})"
    elif moved:
        parts = []
        stacks = [g for g in moved if g not in (*by_records, *by_io, *by_cpu)]
        if stacks:
            parts.append(f"the stacks of ranks {rank_list(stacks)} moved")
        if by_io:
            kb = sum((io or {}).get(g, 0) for g in by_io) / 1e3
            parts.append(f"the main threads of ranks {rank_list(by_io)} did {kb:.0f} kB of I/O")
        if by_cpu:
            s = sum((cpu or {}).get(g, 0.0) for g in by_cpu)
            parts.append(f"the main threads of ranks {rank_list(by_cpu)} computed {s:.1f} s")
        if by_records:
            parts.append(f"the collectives of ranks {rank_list(by_records)} advanced")
        text = f"not hung: {' and '.join(parts)} in {interval:.0f} s"
    else:
        text = "not confirmed: no rank has a stack in both dumps"
    if unknown and still:
        text += f"; no stack for ranks {rank_list(unknown)}"
    return Confirmation(hung, tuple(still), tuple(moved), tuple(unknown), interval, text)


class HangDetector:
    """Suspects a hang after ``timeout`` s of silence on every rank; confirms it with two dumps.

    ``timeout`` 0 (or less) turns detection off: :meth:`poll` then always says nothing.
    """

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        confirm_after: float = DEFAULT_CONFIRM_AFTER,
        *,
        adaptive: bool = False,
    ) -> None:
        self.timeout = timeout
        self.confirm_after = confirm_after
        self.adaptive = adaptive
        self.state = WATCHING
        # Adaptive: a suspicion cleared by movement is not raised again before the stillness
        # has doubled; progress ends the back-off.
        self._backoff = 0.0
        self._suspected_still = 0.0
        self._suspected_at = 0.0
        self._last: dict[int, float] = {}
        self._since = 0.0  # silence is counted from here at the earliest (start, re-arm)
        self._first: StackDump | None = None
        self._first_at = 0.0

    @property
    def enabled(self) -> bool:
        """False when ``--hang-timeout 0`` turned detection off."""
        return self.adaptive or self.timeout > 0

    def start(self, now: float, ranks: Iterable[int] = ()) -> None:
        """A new worker group started (first start or restart): forget everything."""
        self.state = WATCHING
        self._last = dict.fromkeys(ranks, now)
        self._since = now
        self._first = None
        self._backoff = 0.0

    def output(self, rank: int, now: float) -> None:
        """``rank`` wrote something (a line, or ``\\r`` progress without a newline) at ``now``."""
        self._last[rank] = max(now, self._last.get(rank, now))
        self._backoff = 0.0
        if self.state != WATCHING:
            # Output is progress: whatever was suspected or confirmed is over.
            self.state = WATCHING
            self._first = None
            self._since = now

    def silence(self, now: float) -> float:
        """Seconds since the latest output of any rank (or since start/re-arm)."""
        latest = max([self._since, *self._last.values()])
        return max(0.0, now - latest)

    def poll(self, now: float, still_for: float | None = None, limit: float | None = None) -> str:
        """What the caller should do now: :data:`NOTHING`, :data:`DUMP` or :data:`CONFIRM`.

        Adaptive, the caller says how long the job has stood still (``still_for``) and may
        (``limit``, from :class:`~tui_launch.core.diagnosis.rhythm.Rhythm`); otherwise the
        silence of every rank is held against ``timeout``."""
        if not self.enabled:
            return NOTHING
        if self.state == WATCHING:
            if self.adaptive and still_for is not None and limit is not None:
                still, allowed = still_for, max(limit, self._backoff)
            else:
                still, allowed = self.silence(now), self.timeout
            if still >= allowed:
                self.state = SUSPECTED
                self._suspected_still, self._suspected_at = still, now
                return DUMP
        if self.state == CONFIRMING and now - self._first_at >= self.confirm_after:
            return CONFIRM
        return NOTHING

    def first(self, dump: StackDump, now: float) -> None:
        """The first dump, taken because :meth:`poll` said :data:`DUMP`."""
        self._first = dump
        self._first_at = now
        self.state = CONFIRMING

    def second(
        self,
        dump: StackDump,
        now: float,
        io: Mapping[int, int] | None = None,
        cpu: Mapping[int, float] | None = None,
    ) -> Confirmation:
        """The second dump: returns the comparison. Hung: the detector stays quiet until a rank
        writes again. Not hung: it watches again, and dumps no sooner than ``timeout`` from now
        (adaptive: not before the stillness has doubled).
        """
        if self._first is None:
            raise RuntimeError("second() without first(): poll() did not ask for it")
        result = confirm(self._first, dump, io, cpu)
        self._first = None
        if result.hung:
            self.state = HUNG
        else:
            self.state = WATCHING
            self._since = now
            if self.adaptive:
                self._backoff = 2 * (self._suspected_still + now - self._suspected_at)
        return result

    @property
    def backoff(self) -> float:
        """Adaptive: the stillness the next suspicion waits for after cleared ones (0: none)."""
        return self._backoff


def hang_event(
    confirmation: Confirmation,
    second: StackDump,
    *,
    attempt: int,
    silence: float,
    first_path: str,
    second_path: str,
    action: str = "dump",
    stood_still: str = "",
) -> HangDetected:
    """The journal's record of a confirmed hang, with its evidence (both dumps' paths) and how
    long the job stood still against its normal time (``stood_still``)."""
    v = verdict(second)
    return HangDetected(
        attempt=attempt,
        silence=silence,
        interval=confirmation.interval,
        still_ranks=confirmation.still,
        confirmation=confirmation.text,
        verdict=v.text,
        odd_ranks=v.odd,
        first_path=first_path,
        second_path=second_path,
        action=action,
        stood_still=stood_still or f"no output for {silence:.0f} s",
    )
