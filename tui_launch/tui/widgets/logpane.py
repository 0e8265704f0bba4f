"""The Logs tab: one rank's output or all ranks merged, with its bar, filter and follow mode.

:class:`LogPane` owns everything about showing worker output: which rank (or all), which
streams, the text filter (its input box and Esc), following new lines or pausing when the user
scrolls up (counting what arrives meanwhile), and the bar that says all of this. The app tells
it what to show (:meth:`LogPane.show_rank`, :meth:`LogPane.show_all`, ...) and calls
:meth:`LogPane.write_new` on each tick; lines come from the source's
:class:`~tui_launch.core.logs.sinks.LogBuffer`.

A line rewritten with ``\r`` (a tqdm bar) is one line showing its last state: while it is
being written it sits at the bottom and changes in place (the view's tail); once a newline ends
it, it is a line like the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.cells import cell_len, set_cell_size
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Static

from tui_launch.core.logs.sinks import LogBuffer, LogLine
from tui_launch.core.logs.tail import last_segment
from tui_launch.tui.widgets.logview import LogView

LOG_LINES_SHOWN = 5000
FLOOD_LINES_PER_TICK = 200
# New log lines are appended once a second, in the frame that redraws the clocks anyway (the
# header's elapsed time, the table's ages and telemetry). Each append scrolls the view, and a
# scrolled view is repainted whole; a frame of its own for it cost as much as the clock frame.
LOG_WRITES_HZ = 1.0
STREAMS = ("both", "stdout", "stderr")


class LogPane(Vertical):
    """The log bar, the filter box and the log view, with the state they show.

    ``logs`` returns the buffer to read (the source's); ``on_close`` is called when the filter
    box hands the keys back (Enter or Esc), to put the focus where the app wants it.
    """

    def __init__(
        self,
        logs: Callable[[], LogBuffer],
        *,
        on_close: Callable[[], object] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._logs = logs
        self._on_close = on_close
        self._view_rank: int | None = None  # None: merged view
        self._stream = "both"
        self._filter = ""
        self._follow = True
        self._shown_seq = 0
        self._shown_partials = -1  # the buffer's partial_version last shown
        self._pending = 0
        self._written_at = 0.0
        self._bar_text = ""
        self._bar = Static(id="logbar")
        self._box = Input(placeholder="filter log lines (Esc to close)", id="filter-input")
        self._box.display = False
        self.view = LogView(id="log", max_lines=LOG_LINES_SHOWN, highlight=False)

    def compose(self) -> ComposeResult:
        yield self._bar
        yield self._box
        yield self.view

    def on_mount(self) -> None:
        """Say what is shown from the first frame."""
        self._update_bar()

    # ------------------------------------------------------------ what is shown

    @property
    def rank(self) -> int | None:
        """The local rank whose log is shown; None when all ranks are, merged."""
        return self._view_rank

    @property
    def stream(self) -> str:
        """The streams shown: ``both``, ``stdout`` or ``stderr``."""
        return self._stream

    @property
    def filter_text(self) -> str:
        """The text every shown line contains (case-insensitive); empty: no filter."""
        return self._filter

    @property
    def following(self) -> bool:
        """Whether new lines are written as they come (False: paused, counting them)."""
        return self._follow

    @property
    def pending(self) -> int:
        """Lines that arrived while paused and are not written yet."""
        return self._pending

    @property
    def bar_text(self) -> str:
        """The log bar as shown: rank, streams, filter, following or paused."""
        return self._bar_text

    def show_rank(self, rank: int) -> None:
        """Show one local rank's log, untagged."""
        self._view_rank = rank
        self.rerender()

    def show_all(self) -> None:
        """Show every rank's log, merged, each line tagged with its rank."""
        self._view_rank = None
        self.rerender()

    def follow(self) -> None:
        """Resume following new lines (writes what arrived while paused)."""
        self._follow = True
        self._pending = 0
        self.rerender()

    def cycle_streams(self) -> None:
        """Cycle both streams / stdout only / stderr only."""
        self._stream = STREAMS[(STREAMS.index(self._stream) + 1) % len(STREAMS)]
        self.rerender()

    def open_filter(self) -> None:
        """Show the filter box, with the current filter, and give it the keys."""
        box = self._box
        box.display = True
        box.value = self._filter
        box.focus()

    # ------------------------------------------------------------ the filter box

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter as the user types."""
        if event.input is self._box:
            event.stop()
            self._filter = event.value
            self.rerender()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter keeps the filter, closes the box (the bar shows the filter; Esc clears it)
        and hands the keys back."""
        if event.input is self._box:
            event.stop()
            self._box.display = False
            self._close()
            self.app.refresh_bindings()

    def clear_filter(self) -> None:
        """Drop the filter (every line shows again) and close the box if it is open."""
        box = self._box
        had_focus = box.has_focus
        self._filter = ""
        box.value = ""
        box.display = False
        if had_focus:
            self._close()
        self.rerender()

    def on_key(self, event: events.Key) -> None:
        """Esc in the filter box clears the filter and closes the box."""
        if event.key == "escape" and self._box.has_focus:
            self.clear_filter()
            event.stop()

    def _close(self) -> None:
        if self._on_close is not None:
            self._on_close()

    # ------------------------------------------------------------ writing lines

    def _keep(self, line: LogLine) -> bool:
        _, _, stream, text = line
        if stream != "marker" and self._stream != "both" and stream != self._stream:
            return False
        return not self._filter or self._filter.lower() in text.lower()

    def _format(self, line: LogLine) -> str:
        _, rank, stream, text = line
        text = last_segment(text)  # what a terminal shows of a \r-rewritten line
        if self._view_rank is None and stream != "marker":
            tag = f"[{rank}]" if stream == "stdout" else f"[{rank} err]"
            return f"{tag} {text}"
        return text

    def rerender(self) -> None:
        """Write the shown lines anew (after the rank, streams or filter changed)."""
        log = self.view
        logs = self._logs()
        log.clear()
        seq = logs.seq  # first: a line that comes while this reads is shown next time
        lines = [ln for ln in logs.since(0, self._view_rank) if ln[0] <= seq and self._keep(ln)]
        lines = lines[-LOG_LINES_SHOWN:]
        log.write_lines([self._format(ln) for ln in lines], scroll_end=True)
        self._shown_seq = seq
        self._write_tail(logs)
        self._pending = 0
        self._follow = True
        self._update_bar()

    def _write_tail(self, logs: LogBuffer) -> None:
        """Show the lines still being written (progress bars) at the bottom, as they are now."""
        self._shown_partials = logs.partial_version
        tail = [ln for ln in logs.partial_lines(self._view_rank) if self._keep(ln)]
        self.view.set_tail([self._format(ln) for ln in tail], scroll_end=True)

    def write_new(self, due: bool = False) -> None:
        """Append what arrived; ``due``: this tick draws the clocks, so it is time anyway."""
        logs = self._logs()
        partials = logs.partial_version != self._shown_partials
        if logs.seq == self._shown_seq and not self._pending and not partials:
            return
        now = time.monotonic()
        # A tick that is not due writes only when the clock frame is late (1.25 periods).
        if not due and now - self._written_at < 1.25 / LOG_WRITES_HZ:
            return
        self._written_at = now
        log = self.view
        if self._follow and log.line_count and not log.pinned:
            self._follow = False  # the user scrolled up: pause, count what arrives
        seq = logs.seq  # first: a line that comes while this reads is shown next time
        new = [
            ln
            for ln in logs.since(self._shown_seq, self._view_rank)
            if ln[0] <= seq and self._keep(ln)
        ]
        if self._follow:
            # In a flood, a tick writes at most what a screen can show, so keys stay
            # responsive; every line is still in the files (and the buffer, for the filter).
            if len(new) > FLOOD_LINES_PER_TICK:
                skipped = len(new) - FLOOD_LINES_PER_TICK
                new = new[-FLOOD_LINES_PER_TICK:]
                log.write_line(f"... {skipped} lines not shown (all are in the log files) ...")
            if new:
                log.write_lines([self._format(ln) for ln in new], scroll_end=True)
            self._shown_seq = seq
            if partials:
                self._write_tail(logs)
            self._pending = 0
        else:
            self._pending = len(new)
        self._update_bar()

    def on_resize(self, event: events.Resize) -> None:
        """Fit the bar to the new width."""
        self._update_bar()

    def _update_bar(self) -> None:
        text = fit_bar(self._bar_parts(), self._bar.content_size.width)
        if text != self._bar_text:
            self._bar_text = text
            self._bar.update(text)

    def _bar_parts(self) -> list[tuple[str, str]]:
        """The bar's parts, each in its long and its short words; the follow state last."""
        rank = self._view_rank
        if rank is None:
            parts = [("log: all ranks, merged", "all ranks")]
        else:
            parts = [(f"log: local rank {rank} (follows the selection)", f"rank {rank}")]
        streams = f"streams: {self._stream}"
        parts.append((streams, streams))
        if self._filter:
            parts.append((f"filter: {self._filter!r} (Esc clears)", f"filter: {self._filter!r}"))
        if self._follow:
            parts.append(("following", "following"))
        else:
            n = self._pending
            parts.append(
                (f"paused, {n} new line(s) — f to follow", f"paused, {n} new — f to follow")
            )
        return parts


def fit_bar(parts: list[tuple[str, str]], width: int) -> str:
    """The log bar in ``width`` cells: the long words when they fit, else the short ones, else
    the short ones with the first parts cut, so that the last part (following, or paused and
    the key that resumes) is always whole. ``width`` 0 (not laid out yet): the long words."""
    text = "  |  ".join(long for long, _ in parts)
    if not width or cell_len(text) <= width:
        return text
    text = " | ".join(short for _, short in parts)
    if cell_len(text) <= width:
        return text
    last = parts[-1][1]
    head = " | ".join(short for _, short in parts[:-1])
    room = width - cell_len(last) - len(" | ")
    if room < 2:
        return set_cell_size(last, width).rstrip()
    return f"{set_cell_size(head, room - 1)}… | {last}"
