"""Progress of a job: one tracker per (rank, stream), and which rank the job's progress is.

Most frameworks print progress from one rank: rank 0 (Lightning, DeepSpeed, timm, torchtitan
by default), local rank 0 of every node (the Hugging Face Trainer) or the last rank
(Megatron's ``print_rank_last``). So the job's progress is the progress of the rank with the
most advanced training bar, labelled with that rank, never presented as a per-rank rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tui_launch.core.model.goodput import AttemptProgress
from tui_launch.core.progress.tracker import ProgressState, ProgressTracker

__all__ = ["JobProgress", "JobProgressState"]


@dataclass(frozen=True, slots=True)
class JobProgressState:
    """The job's progress (that of ``rank``/``stream``) and every printing stream's state."""

    rank: int | None
    stream: str | None
    progress: ProgressState | None
    streams: dict[tuple[int, str], ProgressState]


class JobProgress:
    """Trackers for every (rank, stream) of one attempt, and the rank that leads.

    The leader is sticky: in lockstep the printing ranks are within a step of each other, and
    a label that flips between them every tick says nothing. Another rank takes over only when
    it is ahead by ``lead_margin`` steps or an epoch, or when the leader stopped printing.
    """

    def __init__(self, lead_margin: int = 2, **tracker_options: Any) -> None:
        self.lead_margin = lead_margin
        self._options = tracker_options
        self._trackers: dict[tuple[int, str], ProgressTracker] = {}
        self._leader: tuple[int, str] | None = None

    def tracker(self, rank: int, stream: str = "stdout") -> ProgressTracker:
        """The tracker of one rank's stream (created on first use)."""
        key = (rank, stream)
        tr = self._trackers.get(key)
        if tr is None:
            tr = self._trackers[key] = ProgressTracker(**self._options)
        return tr

    def feed(self, rank: int, stream: str, text: str, t: float) -> None:
        """Text a rank wrote on ``stream`` ("stdout"/"stderr"), seen at monotonic ``t``."""
        tr = self._trackers.get((rank, stream))
        (tr if tr is not None else self.tracker(rank, stream)).feed(text, t)

    def feed_lines(self, rank: int, stream: str, lines: list[str], t: float) -> None:
        """Whole lines a rank wrote on ``stream`` that arrived together at monotonic ``t``
        (see :meth:`ProgressTracker.feed_lines`: the newest of each kind counts)."""
        tr = self._trackers.get((rank, stream))
        (tr if tr is not None else self.tracker(rank, stream)).feed_lines(lines, t)

    @staticmethod
    def _position(state: ProgressState) -> tuple[float, int]:
        return (state.epoch if state.epoch is not None else -1.0, state.step or 0)

    def leader(self, now: float) -> tuple[int, str] | None:
        """The (rank, stream) whose training bar is the most advanced (see the class doc)."""
        job = self.state(now)
        return None if job.rank is None or job.stream is None else (job.rank, job.stream)

    def state(self, now: float) -> JobProgressState:
        """The job's progress at ``now``: the leading rank's state, labelled with its rank,
        and the state of every stream that printed a step."""
        states = {
            key: tr.snapshot(now) for key, tr in self._trackers.items() if tr.step is not None
        }
        if not states:
            return JobProgressState(None, None, None, {})
        best = max(states, key=lambda k: (self._position(states[k]), -k[0]))
        cur = self._leader
        if cur in states and cur != best:
            cur_state, best_state = states[cur], states[best]
            cur_pos, best_pos = self._position(cur_state), self._position(best_state)
            ahead = best_pos[0] > cur_pos[0] or best_pos[1] - cur_pos[1] >= self.lead_margin
            quiet = (cur_state.stalled_for or 0.0) > 2 * max(best_state.stalled_for or 0.0, 1.0)
            if not (ahead or quiet):
                best = cur
        self._leader = best
        return JobProgressState(best[0], best[1], states[best], states)

    def steps(self) -> dict[int, tuple[tuple[float, ...], float | None]]:
        """Each rank's latest training-counter moves (oldest first) and the latest move of
        any of its counters, from its stream that has counted the most steps (the hang
        rule's rhythm)."""
        best: dict[int, ProgressTracker] = {}
        for (rank, _), tr in self._trackers.items():
            tr.flush()
            if tr.step is None:
                continue
            cur = best.get(rank)
            if cur is None or tr.steps_done > cur.steps_done:
                best[rank] = tr
        return {rank: (tuple(tr.moves), tr.last_move) for rank, tr in best.items()}

    def attempt_progress(self, start: float, end: float | None, now: float) -> AttemptProgress:
        """The leader's goodput facts for this attempt (an empty record if nobody printed)."""
        key = self.leader(now)
        if key is None:
            return AttemptProgress(start, end, None, None, None, 0.0)
        return self._trackers[key].attempt_progress(start, end)
