"""``tuilaunch attach [RUN_DIR | PID | RUN_ID]``: the replay dashboard following a live job.

:class:`AttachSource` is a :class:`~tui_launch.tui.sources.replay.ReplaySource` whose cursor follows
the journal's end; it reads the journal and the rank log files and acts on nothing (``attach
--control``'s :class:`~tui_launch.tui.sources.control.ControlSource` adds the acting keys). Its
first frame is the end's state without the telemetry records no panel shows
(:func:`~tui_launch.core.journal.recent.recent_snapshot`: a day-long journal's state without
replaying the whole day); the exact state follows from the checkpoints a background thread
computes (:func:`tui_launch.apps.attach.run_attached`), as ``replay`` does.
"""

from __future__ import annotations

import bisect
import time

from tui_launch.core.journal.recent import recent_snapshot
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model.store import Snapshot, reduce
from tui_launch.tui.sources.replay import ReplaySource

WATCH_EVERY = 0.05  # s between two looks at a followed journal's size (attach)
FOLLOW_STATES = 256  # state events an attach reduces onto its snapshot rather than recompute


class AttachSource(ReplaySource):
    """A running job, read-only: the replay of its journal with the cursor following the end.

    Nothing is signalled or written: the journal and the rank log files are only read. A
    replay key (step, jump, start) stops following; ``G`` follows again.
    """

    def __init__(self, timeline: Timeline) -> None:
        self.approx = False  # whether the snapshot's telemetry totals are not yet exact
        self._approx_at = 0  # the cursor of the last recent_snapshot
        super().__init__(timeline)
        self.following = True

    def _state_at(self, cursor: int) -> Snapshot:
        """From the checkpoints where the background pass has reached ``cursor``; else, a
        few events on from the current snapshot, those events reduced onto it (what
        following a live run does); else the state without the telemetry records no panel
        shows (:func:`recent_snapshot`: the first frame). Only the last's
        ``telemetry.totals`` is not exact, until :meth:`follow` sees the checkpoints."""
        tl = self.timeline
        if tl.ready(cursor):
            self.approx = False
            return tl.snapshot(cursor)
        if 0 <= self._snap_at <= cursor:
            states = tl.states
            behind = bisect.bisect_left(states, cursor) - bisect.bisect_left(states, self._snap_at)
            if behind <= FOLLOW_STATES:
                snap = self._snap
                for _, e in tl.events(self._snap_at, cursor):
                    snap = reduce(snap, e)
                return snap
        self.approx, self._approx_at = True, cursor
        return recent_snapshot(tl, cursor)

    def follow(self) -> None:
        """Read what the launcher appended; with the cursor at the end, keep it there."""
        if self.following:
            self.timeline.refresh()
            self.move(len(self.timeline))
        if self.approx and self.timeline.ready(self._approx_at):  # the background pass is
            self.approx = False  # past the first frame: the rest is a few events from it
            self._snap = self._with_log_steps(self.timeline.snapshot(self.cursor))

    def now(self) -> float:
        """The machine's clock while following a live run (the journal's is the same clock
        on the same node), else the cursor's."""
        if self.following and self._snap.finished is None:
            return time.monotonic()
        return super().now()
