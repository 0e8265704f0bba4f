"""``tuilaunch attach [RUN_DIR | PID | RUN_ID]``: the replay dashboard following a live job.

:class:`AttachSource` is a :class:`~tui_launch.tui.replay.ReplaySource` whose cursor follows
the journal's end; it reads the journal and the rank log files and acts on nothing (``attach
--control``'s :mod:`.attachctl` adds the acting keys). Its first frame is the end's state
without the telemetry records no panel shows (:func:`~tui_launch.core.recent.recent_snapshot`:
a day-long journal's state costs ~30 ms, not seconds); the exact state follows from the
checkpoints a background thread computes (:func:`run_attached`), as ``replay`` does.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
from typing import Any

from tui_launch.core.recent import recent_snapshot
from tui_launch.core.replay import Timeline
from tui_launch.core.store import Snapshot, reduce
from tui_launch.tui.replay import (
    END,
    ReplayDashboard,
    ReplaySource,
    journal_of,
    precompute,
    view_args,
)

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


class AttachDashboard(ReplayDashboard):
    """The replay dashboard following a live journal (``tuilaunch attach``).

    Besides the refresh (``--refresh-hz``), the journal's size is looked at every
    :data:`WATCH_EVERY` s (one ``fstat``) and a refresh runs as soon as it grew: an event the
    launcher journals shows within about that, not up to a whole refresh period later.
    """

    source: AttachSource

    def on_mount(self) -> None:
        # (No super().on_mount(): Textual calls every class's own on_mount along the MRO, so
        # Dashboard's runs anyway; called here too, it set up a second refresh interval and
        # called on_ready twice.)
        self._journal_size = self.source.timeline.size()
        self.set_interval(WATCH_EVERY, self._watch_journal)

    def _watch_journal(self) -> None:
        size = self.source.timeline.size()
        src = self.source
        if size != self._journal_size and src.following and not src.playing:
            self._tick()  # (never while playing: a tick also advances the cursor)

    def _tick(self) -> None:
        size = self.source.timeline.size()  # before reading: what comes after is seen next
        self.source.follow()
        self._journal_size = size
        super()._tick()

    def _go(self, cursor: int) -> None:
        self.source.following = cursor == END or cursor >= len(self.source.timeline)
        super()._go(cursor)

    def action_replay_end(self) -> None:
        src = self.source  # following again at once: the end's state needs no checkpoint
        src.following, src.pending = True, None
        self._tick()


def resolve_attach(target: str | None) -> str:
    """The journal of the run ``target`` names (run dir, pid, run id; default: the only live
    run of this user on this node); ValueError with a one-line reason."""
    from tui_launch.core import runindex

    found = runindex.sweep(runindex.entries())  # stale runs go, whatever is asked
    if target is not None and os.path.isdir(target):
        return journal_of(target)
    live = [e for e in found if runindex.state(e) == runindex.LIVE]
    if target is not None:
        # The pid, or the run id the launcher shows (--standalone: torch's random one).
        live = [e for e in live if target in (str(e.pid), e.run_id)]
    if not live:
        raise ValueError(f"no live run{'' if target is None else ' ' + repr(target)} here")
    if len(live) > 1:
        pids = ", ".join(str(e.pid) for e in live)
        raise ValueError(f"{len(live)} live runs (pids {pids}): name one (tuilaunch ls)")
    if not live[0].journal or not os.path.isfile(live[0].journal):
        raise ValueError(f"run {live[0].pid} has no journal yet: try again in a moment")
    return live[0].journal


def attach_main(argv: list[str]) -> int:
    """``tuilaunch attach [RUN_DIR | PID | RUN_ID]``: read-only dashboard on a running job."""
    usage = "usage: tuilaunch attach [RUN_DIR|PID|RUN_ID] [--refresh-hz HZ]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    try:
        # --no-confirm is taken and changes nothing: a read-only attach acts on nothing.
        target, refresh_hz, _ = view_args(argv)
        timeline = Timeline(resolve_attach(target))
    except (ValueError, OSError) as e:
        print(f"tuilaunch attach: error: {e} ({usage})", file=sys.stderr)
        return 2
    run_attached(AttachDashboard, AttachSource(timeline), refresh_hz=refresh_hz)
    return 0


def run_attached(dashboard: type[AttachDashboard], source: AttachSource, **kwargs: Any) -> None:
    """Run an attach's dashboard: its first frame is the end's state without the old
    telemetry (:class:`AttachSource`); the checkpoints (the exact state, and any cursor move
    back) are computed by a background thread started once that frame is up."""
    stop = threading.Event()
    worker = threading.Thread(
        target=precompute, args=(source.timeline, stop), name="tuilaunch-attach", daemon=True
    )

    def start() -> None:
        if worker.ident is None:  # once, though a dashboard may call on_ready again
            worker.start()

    app = dashboard(source, worker, on_ready=start, **kwargs)
    try:
        app.run()
    finally:
        stop.set()
