"""The dashboard's modes over a recorded or attached run: replay, attach, attach --control.

Each is a :class:`~tui_launch.tui.mode.Mode` handed to the one
:class:`~tui_launch.tui.app.Dashboard`: :class:`ReplayMode` adds the replay bar under the header
and the cursor keys (the action table's ``Needs.REPLAY`` rows: its ``action_<name>`` methods),
:class:`AttachMode` follows a live journal, :class:`ControlMode` says why the control socket
refused and lets go of its waiting thread on exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widget import Widget

from tui_launch.tui.mode import Mode
from tui_launch.tui.sources.attach import WATCH_EVERY, AttachSource
from tui_launch.tui.sources.control import ControlSource
from tui_launch.tui.sources.replay import END, SPEEDS, ReplaySource
from tui_launch.tui.widgets.cached import CachedPanel

if TYPE_CHECKING:
    from tui_launch.tui.app import Dashboard


def cursor_line(src: ReplaySource, label: str) -> Text:
    """The replay bar: the mode's label, the cursor's wall clock, its event, play state and
    speed."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.wall))
    frac = f"{src.wall % 1:.1f}"[1:]
    state = "playing" if src.playing else "paused"
    kind = src.timeline.kinds[src.cursor - 1] if src.cursor else "(start)"
    if src.pending is not None:
        to = "the end" if src.pending == END else f"event {src.pending}"
        state = f"going to {to}: computed up to event {src.timeline.frontier()}"
    return Text(
        f" {label}  {when}{frac}   event {src.cursor}/{len(src.timeline)} ({kind})"
        f"   {state} x{src.speed:g}   space play  ,/. step  [/] failures  g/G start/end"
    )


class ReplayMode(Mode):
    """A :class:`ReplaySource` under the dashboard: the cursor's line and keys (``tuilaunch
    replay``). Nothing acts on the run, and a recorded end is shown, never acted on."""

    replay = True
    acts_on_finish = False
    app: Dashboard

    def __init__(self, source: ReplaySource, background: threading.Thread | None = None) -> None:
        self.source = source
        self._rebuilt = source.rebuilt
        # The thread indexing the journal and computing its checkpoints (apps.replay.main's). While
        # it runs, a jump past what it has reached waits for it instead of computing the
        # checkpoints on this thread: the screen keeps answering, the bar says how far it is.
        self._background = background

    def label(self) -> str:
        """The bar's first word(s): what the dashboard shows."""
        return "REPLAY"

    def compose(self) -> Iterator[Widget]:
        self._bar = CachedPanel(id="replaybar", measure=False)
        yield self._bar

    def tick(self) -> None:
        src = self.source
        if src.pending is not None:
            self.go(src.pending)
        elif src.playing:
            src.advance(1.0 / self.app.refresh_hz)
        self._moved()

    def _moved(self) -> None:
        src = self.source
        if self._rebuilt != src.rebuilt:
            self._rebuilt = src.rebuilt
            self.app.log_pane.rerender()
        self.app.refresh_view()
        tl = src.timeline
        frontier = tl.frontier() if src.pending is not None else None
        key = (src.cursor, len(tl), src.playing, src.speed, src.pending, frontier)
        self._bar.show(key, cursor_line, src, self.label())

    def _busy(self) -> bool:
        """Whether the background thread is still to start or running."""
        bg = self._background
        return bg is not None and (bg.ident is None or bg.is_alive())

    def go(self, cursor: int) -> None:
        """Move the cursor to ``cursor`` (:data:`END`: the journal's end), or, where the
        background thread has not computed it yet, have the next ticks try again."""
        src, tl = self.source, self.source.timeline
        busy = self._busy()
        target = len(tl) if cursor == END and tl.indexed else cursor
        if busy and (target == END or not tl.ready(target)):
            src.pending = cursor  # the next ticks try again
        else:
            src.pending = None
            src.move(len(tl) if target == END else target)
        self._moved()

    # ------------------------------------------------- the cursor's keys (Needs.REPLAY)

    def action_replay_play(self) -> None:
        """Play / pause (from the start again once at the end)."""
        src = self.source
        if src.cursor >= len(src.timeline):
            src.move(0)
        src.playing = not src.playing
        self._moved()

    def action_replay_faster(self) -> None:
        """Play faster (the next speed of :data:`SPEEDS`)."""
        self.source.speed = next((s for s in SPEEDS if s > self.source.speed), SPEEDS[-1])
        self._moved()

    def action_replay_slower(self) -> None:
        """Play slower (the previous speed of :data:`SPEEDS`)."""
        lower = [s for s in SPEEDS if s < self.source.speed]
        self.source.speed = lower[-1] if lower else SPEEDS[0]
        self._moved()

    def action_replay_step(self) -> None:
        """One event forward."""
        self.go(self.source.cursor + 1)

    def action_replay_back(self) -> None:
        """One event back."""
        self.go(self.source.cursor - 1)

    def action_replay_next(self) -> None:
        """The next failure, restart or injection."""
        self.go(self.source.timeline.next_moment(self.source.cursor))

    def action_replay_previous(self) -> None:
        """The previous failure, restart or injection."""
        self.go(self.source.timeline.next_moment(self.source.cursor, forward=False))

    def action_replay_start(self) -> None:
        """The start."""
        self.go(0)

    def action_replay_end(self) -> None:
        """The end (once the background thread has indexed it)."""
        if self._busy():
            self.go(END)
            return
        self.source.timeline.refresh()  # a run still writing: its newest events too
        self.go(len(self.source.timeline))


class AttachMode(ReplayMode):
    """The replay following a live journal (``tuilaunch attach``).

    Besides the refresh (``--refresh-hz``), the journal's size is looked at every
    :data:`WATCH_EVERY` s (one ``fstat``) and a refresh runs as soon as it grew: an event the
    launcher journals shows within about that, not up to a whole refresh period later.
    """

    source: AttachSource

    def __init__(self, source: AttachSource, background: threading.Thread | None = None) -> None:
        super().__init__(source, background)
        self._journal_size = 0

    def label(self) -> str:
        return "ATTACHED read-only" + " (following)" * self.source.following

    def on_mount(self) -> None:
        self._journal_size = self.source.timeline.size()
        self.app.set_interval(WATCH_EVERY, self.watch_journal)

    def watch_journal(self) -> None:
        """Refresh now if the followed journal grew since the last refresh."""
        size = self.source.timeline.size()
        src = self.source
        if size != self._journal_size and src.following and not src.playing:
            self.tick()  # (never while playing: a tick also advances the cursor)

    def tick(self) -> None:
        size = self.source.timeline.size()  # before reading: what comes after is seen next
        self.source.follow()
        self._journal_size = size
        super().tick()

    def go(self, cursor: int) -> None:
        self.source.following = cursor == END or cursor >= len(self.source.timeline)
        super().go(cursor)

    def action_replay_end(self) -> None:
        """The end, following again at once: the end's state needs no checkpoint."""
        src = self.source
        src.following, src.pending = True, None
        self.tick()


class ControlMode(AttachMode):
    """The attached dashboard with the control keys (``tuilaunch attach --control``)."""

    source: ControlSource
    controls = True

    def __init__(self, source: ControlSource, background: threading.Thread | None = None) -> None:
        super().__init__(source, background)

    def label(self) -> str:
        return "ATTACHED control" + " (following)" * self.source.following

    def notice(self, message: str, severity: str | None) -> str:
        # "could not kill rank 1": say why when the socket said (refused, connection lost).
        if severity == "error" and self.source.error:
            return f"{message}: {self.source.error}"
        return message

    def leaving(self) -> None:
        # Thread workers run on asyncio's default executor, which the app's shutdown waits
        # for: a worker still in source.wait() would keep the process alive after the UI.
        self.source.closed = True
