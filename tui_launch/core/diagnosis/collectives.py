"""The live poll of every rank's Flight Recorder (on by default): last collective, wait.

Every :data:`INTERVAL` seconds the poller asks each live rank's responder (in parallel, half a
second each at most) for its records and stacks, and posts a
:class:`~tui_launch.core.model.events.CollectiveSample`: each rank's newest collective (op and
sequence number) and for how long it has been at that number, which the Workers table shows.
Once some rank has been at its collective for :data:`VERDICT_AFTER` seconds the sample also
carries the collective-level verdict.

It keeps each rank's latest answer too: when a rank dies, its peers often leave Python within
milliseconds (gloo raises in the survivors), too fast for a dump taken when the exit is seen;
the before-teardown dump then shows what each survivor was doing at the last poll.

The cost: one short request per rank per poll, answered by a thread of the rank; a rank that
has not moved since the previous poll answers "same" in a few bytes (``poll-since``), so the
poll of ranks that sit still (a hang, a long wait) reads almost nothing (``bench/bootstrap.py
idle``, ``bench/flightrec.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tui_launch.core.diagnosis.records import Answer, gather
from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.diagnosis.stacks.model import RankRecord
from tui_launch.core.model.events import CollectiveSample, Event, RankCollective
from tui_launch.core.periodic import Periodic

INTERVAL = 2.0
VERDICT_AFTER = 10.0


def rank_collective(record: RankRecord, waiting: float = 0.0) -> RankCollective:
    """A record's newest collective as the event's record."""
    last = record.last
    # Several groups: last_enqueued counts them all, and is no sequence number of one.
    stale = last is not None and record.groups <= 1 and last.seq < record.last_enqueued
    if last is None or stale:
        # A poll of a rank that moves on carries only the sequence number (no entry, no op).
        if record.last_enqueued >= 0:
            return RankCollective(record.global_rank, seq=record.last_enqueued, waiting=waiting)
        return RankCollective(record.global_rank, error=record.error or "no collective yet")
    size = max(last.in_bytes, last.out_bytes)
    return RankCollective(record.global_rank, last.op, last.seq, last.pg, size, waiting)


class CollectivePoller:
    """Polls the ranks' responders on its own loop and posts what they are at.

    Args:
        post: the run store's ``post``.
        targets: ``(local, global, pid)`` of every live rank of the current attempt.
        attempt: the current attempt.
        directory: the responders' directory (None: nothing to poll).
        interval: seconds between two polls.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        targets: Callable[[], list[tuple[int, int, int]]],
        attempt: Callable[[], int],
        directory: Callable[[], str | None],
        interval: float = INTERVAL,
    ) -> None:
        self._post = post
        self._targets = targets
        self._attempt = attempt
        self._directory = directory
        self._lock = threading.Lock()
        self._since: dict[int, tuple[int, float]] = {}  # rank -> (sequence number, since)
        self._latest: dict[int, tuple[float, Answer]] = {}
        self._waiting = False  # at the last poll, some rank waited in a collective
        self._seen_attempt = -1
        self._loop = Periodic("tuilaunch-collectives", interval, self._tick, first_delay=interval)

    @property
    def cpu_seconds(self) -> float:
        """CPU time the poller's thread has spent."""
        return self._loop.cpu_seconds

    def start(self) -> None:
        """Start the loop."""
        self._loop.start()

    def stop(self) -> None:
        """End the loop."""
        self._loop.stop(timeout=2)

    def latest(self) -> dict[int, tuple[float, Answer]]:
        """Each rank's latest answer with its monotonic time (this attempt's)."""
        with self._lock:
            return dict(self._latest)

    def moves(self) -> tuple[int, dict[int, float], bool]:
        """For the hang rule: the attempt polled, when the poll first saw each rank's newest
        sequence number (monotonic), and whether some rank then waited in a collective that
        was not finished (enqueued past completed, or the ranks at different numbers)."""
        with self._lock:
            return (
                self._seen_attempt,
                {g: since for g, (_, since) in self._since.items()},
                self._waiting,
            )

    def _tick(self) -> None:
        self.poll()  # the loop keeps its grid (a value returned would be the next delay)

    def poll(self) -> CollectiveSample | None:
        """One poll: ask every live rank, post and return the sample (None: nothing asked)."""
        directory = self._directory()
        targets = self._targets()
        if not directory or not targets:
            return None
        attempt = self._attempt()
        ranks = [g for _, g, _ in targets]
        with self._lock:
            if attempt != self._seen_attempt:
                self._since.clear()
                self._latest.clear()
                self._seen_attempt = attempt
            # A rank whose answer we hold is asked only whether it moved (poll-since): one
            # that sits still answers in a few bytes, and its previous answer stands.
            asks = {g: "poll-since" for g in ranks if g in self._latest}
        answers = gather(directory, ranks, "poll", 0.5, asks)
        now = time.monotonic()
        ranks_out = []
        with self._lock:
            for g in sorted(answers):
                a = answers[g]
                if a.raw is not None and a.raw.get("same") and g in self._latest:
                    a = answers[g] = self._latest[g][1]
                if a.raw is not None:
                    self._latest[g] = (now, a)
                seq = a.record.last_enqueued
                if seq < 0:
                    ranks_out.append(rank_collective(a.record))
                    continue
                seen = self._since.get(g)
                if seen is None or seen[0] != seq:
                    self._since[g] = (seq, now)
                    seen = self._since[g]
                ranks_out.append(rank_collective(a.record, now - seen[1]))
            records = [a.record for a in answers.values() if a.record.last_enqueued >= 0]
            # Ranks at different numbers wait for each other, in a job of one group; in one
            # of several (Megatron's), each rank counts the groups it is in, which differ.
            self._waiting = any(r.last_enqueued > r.last_completed for r in records) or (
                len({r.last_enqueued for r in records}) > 1 and all(r.groups <= 1 for r in records)
            )
        text = ""
        if ranks_out and max(r.waiting for r in ranks_out) >= VERDICT_AFTER:
            where = {}
            for g, a in answers.items():
                main = next((t for t in a.threads or () if t.main), None)
                if main is not None and main.frames:
                    where[g] = main.frames[0].where
            cv = collective_verdict([a.record for a in answers.values()], where)
            text = cv.text if cv is not None else ""
        sample = CollectiveSample(attempt, tuple(ranks_out), text)
        self._post(sample)
        return sample
