"""The dashboard's modes over a recorded or attached run: replay, attach, attach --control."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult

from tui_launch.tui.app import Dashboard
from tui_launch.tui.widgets.cached import CachedPanel

if TYPE_CHECKING:
    pass
from typing import Any

from tui_launch.tui.sources.attach import WATCH_EVERY, AttachSource
from tui_launch.tui.sources.control import ControlSource
from tui_launch.tui.sources.replay import END, SPEEDS, ReplaySource


def cursor_line(src: ReplaySource) -> Text:
    """The replay bar: the cursor's wall clock, its event, play state and speed."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.wall))
    frac = f"{src.wall % 1:.1f}"[1:]
    state = "playing" if src.playing else "paused"
    kind = src.timeline.kinds[src.cursor - 1] if src.cursor else "(start)"
    following = getattr(src, "following", None)
    mode = getattr(src, "mode_label", "read-only")  # an attach --control says so
    label = "REPLAY" if following is None else f"ATTACHED {mode}" + (" (following)" * following)
    if src.pending is not None:
        to = "the end" if src.pending == END else f"event {src.pending}"
        state = f"going to {to}: computed up to event {src.timeline.frontier()}"
    return Text(
        f" {label}  {when}{frac}   event {src.cursor}/{len(src.timeline)} ({kind})"
        f"   {state} x{src.speed:g}   space play  ,/. step  [/] failures  g/G start/end"
    )


class ReplayDashboard(Dashboard):
    """The dashboard over a :class:`ReplaySource`, with the cursor's line and keys."""

    source: ReplaySource
    CSS = "#replaybar { height: 1; background: $boost; color: $text; }"

    def __init__(
        self,
        source: ReplaySource,
        background: threading.Thread | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(source, **kwargs)  # type: ignore[arg-type]
        self._finished_seen = True  # a recorded end is shown, never acted on
        self._rebuilt = source.rebuilt
        # The thread indexing the journal and computing its checkpoints (apps.replay.main's). While
        # it runs, a jump past what it has reached waits for it instead of computing the
        # checkpoints on this thread: the screen keeps answering, the bar says how far it is.
        self._background = background

    def compose(self) -> ComposeResult:
        self._replay_bar = CachedPanel(id="replaybar", measure=False)
        first = True
        for widget in super().compose():
            yield widget
            if first:  # right under the header
                first = False
                yield self._replay_bar

    def _tick(self) -> None:
        src = self.source
        if src.pending is not None:
            self._go(src.pending)
        elif src.playing:
            src.advance(1.0 / self.refresh_hz)
        self._moved()

    def _moved(self) -> None:
        src = self.source
        if self._rebuilt != src.rebuilt:
            self._rebuilt = src.rebuilt
            self.log_pane.rerender()
        super()._tick()
        tl = src.timeline
        frontier = tl.frontier() if src.pending is not None else None
        key = (src.cursor, len(tl), src.playing, src.speed, src.pending, frontier)
        self._replay_bar.show(key, cursor_line, src)

    def _busy(self) -> bool:
        """Whether the background thread is still to start or running."""
        bg = self._background
        return bg is not None and (bg.ident is None or bg.is_alive())

    def _go(self, cursor: int) -> None:
        src, tl = self.source, self.source.timeline
        busy = self._busy()
        target = len(tl) if cursor == END and tl.indexed else cursor
        if busy and (target == END or not tl.ready(target)):
            src.pending = cursor  # the next ticks try again
        else:
            src.pending = None
            src.move(len(tl) if target == END else target)
        self._moved()

    def action_replay_play(self) -> None:
        src = self.source
        if src.cursor >= len(src.timeline):
            src.move(0)
        src.playing = not src.playing
        self._moved()

    def action_replay_faster(self) -> None:
        self.source.speed = next((s for s in SPEEDS if s > self.source.speed), SPEEDS[-1])
        self._moved()

    def action_replay_slower(self) -> None:
        lower = [s for s in SPEEDS if s < self.source.speed]
        self.source.speed = lower[-1] if lower else SPEEDS[0]
        self._moved()

    def action_replay_step(self) -> None:
        self._go(self.source.cursor + 1)

    def action_replay_back(self) -> None:
        self._go(self.source.cursor - 1)

    def action_replay_next(self) -> None:
        self._go(self.source.timeline.next_moment(self.source.cursor))

    def action_replay_previous(self) -> None:
        self._go(self.source.timeline.next_moment(self.source.cursor, forward=False))

    def action_replay_start(self) -> None:
        self._go(0)

    def action_replay_end(self) -> None:
        if self._busy():
            self._go(END)  # the end once the background thread has indexed it
            return
        self.source.timeline.refresh()  # a run still writing: its newest events too
        self._go(len(self.source.timeline))


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


class ControlDashboard(AttachDashboard):
    """The attached dashboard with the control keys (``tuilaunch attach --control``)."""

    source: ControlSource

    def exit(self, *args: Any, **kwargs: Any) -> None:
        # Thread workers run on asyncio's default executor, which the app's shutdown waits
        # for: a worker still in source.wait() would keep the process alive after the UI.
        self.source.closed = True
        super().exit(*args, **kwargs)

    def notify(self, message: str, **kwargs: Any) -> None:
        # "could not kill rank 1": say why when the socket said (refused, connection lost).
        if kwargs.get("severity") == "error" and self.source.error:
            message = f"{message}: {self.source.error}"
        super().notify(message, **kwargs)
