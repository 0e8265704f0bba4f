"""A log widget that is cheap to append to.

Textual's ``Log`` does two costly things on every write: its ``virtual_size`` is a reactive with
``layout=True``, so each new line makes the *whole screen* lay out and repaint (the workers
table, every panel), and it measures the new lines' width in a fresh thread worker. With
several ranks printing a few lines a second, that was most of the dashboard's CPU. Here the
virtual size changes without a layout (the log's own region does not move; only its scrollbar
needs to know, and is told directly) and the width is measured inline. And ``Log`` (Textual 8)
stores a rendered line in its cache only when text is *selected*, so every repaint re-renders
every visible line through Rich; here lines are cached when nothing is selected, as intended.
Its ``rich_style`` (a walk up the DOM) is also taken once per repaint rather than once per line,
and a line's final strip (cropped to the view, with the offsets text selection needs) is kept,
so a scroll costs a dictionary lookup per line already shown and one small strip per new line.

The view is *pinned* to its bottom until the user scrolls away (:attr:`LogView.pinned`): a
write, a resize of the terminal, or a neighbour that grows and takes rows from the log, keeps a
pinned view on its last line, so that only the user's own scrolling can pause following.

The last lines may be a *tail* (:meth:`LogView.set_tail`): lines still being written (a
progress bar rewritten with ``\r``), replaced in place at each update and kept below whatever
is appended after them.

Textual internals used here; checked against the pinned range (``textual>=8.2,<9``):

- ``Log`` methods overridden or called: ``_render_line``, ``_render_line_strip``,
  ``_prune_max_lines``, ``_update_size``, ``_update_maximum_width``, ``_process_line``;
  ``Widget._scroll_update`` (overridden: every size change of the view or its content goes
  through it); ``Widget.render_lines`` (overridden for the plain path).
- ``Log`` attributes read: ``_lines`` (the tail is removed from its end), ``_width``,
  ``_render_line_cache``.
- ``Log.virtual_size`` redeclared as a reactive without ``layout=True``; the vertical
  scrollbar's ``position`` reactive set silently (``set_reactive``).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.reactive import Reactive
from textual.scrollbar import ScrollBar
from textual.strip import Strip
from textual.widgets import Log

from tui_launch.tui.panels.inert import inert_lines

__all__ = ["LogView"]


class LogView(Log):
    """``Log`` whose writes repaint only itself."""

    # The log's region is fixed by the layout around it; its content size only moves the
    # scrollbar, which write_lines updates itself.
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)
    _cached_style: Style | None = None
    _paint_style: Style | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # Line number -> ((scroll_x, width, style), the line as painted). Emptied whenever
        # Log empties its own cache (and on pruning, which renumbers the lines).
        self._painted: dict[int, tuple[tuple[int, int, Style], Strip]] = {}
        self._tail: list[str] = []  # the last len(_tail) lines of _lines: lines in progress
        self._pinned = True

    @property
    def pinned(self) -> bool:
        """Whether the view stays on its last line: True until the user scrolls away from the
        bottom, True again once a scroll reaches it.

        Unlike ``is_vertical_scroll_end``, a change of size does not unpin the view: when rows
        are taken from it (a smaller terminal, a panel above it that grows), the position it
        had is no longer the end, but the user did not move it, so it is moved to the new end.
        """
        return self._pinned

    @property
    def tail(self) -> list[str]:
        """The lines in progress shown at the bottom (see :meth:`set_tail`)."""
        return list(self._tail)

    def _take_tail(self) -> list[str]:
        """Remove the tail from the end of the lines; return it."""
        tail, n = self._tail, len(self._tail)
        if n:
            del self._lines[-n:]
            self._tail = []
        return tail

    def write_lines(self, lines: Iterable[str], scroll_end: bool | None = None) -> LogView:
        """Append lines (above the tail); scroll to the end when following.

        Every line is made inert first (:mod:`tui_launch.tui.panels.inert`): a worker's escape
        sequences must not reach the terminal."""
        tail = self._take_tail()
        lines = inert_lines(lines)
        super().write_lines([*lines, *tail], scroll_end)
        self._tail = tail
        self._scroll_update(self.virtual_size)
        return self

    def set_tail(self, tail: list[str], scroll_end: bool | None = None) -> LogView:
        """Show ``tail`` as the last lines, in place of the previous tail (one line each)."""
        tail = inert_lines(tail)
        if tail == self._tail:
            return self
        old = len(self._take_tail())
        if tail:
            super().write_lines(tail, scroll_end)
            self._tail = list(tail)
        if len(tail) < old:  # lines went away: their rows must be painted blank
            self.virtual_size = Size(self._width, len(self._lines))
            self.refresh_lines(len(self._lines), old - len(tail))
        self._scroll_update(self.virtual_size)
        return self

    def clear(self) -> LogView:
        """Remove every line."""
        super().clear()
        self._tail = []
        self._painted.clear()
        self._scroll_update(self.virtual_size)
        return self

    def notify_style_update(self) -> None:
        """Styles changed: every painted line is stale."""
        super().notify_style_update()
        self._painted.clear()

    def selection_updated(self, selection: object) -> None:
        """Selected lines paint differently."""
        self._painted.clear()
        super().selection_updated(selection)  # type: ignore[arg-type]

    def refresh_lines(self, y_start: int, line_count: int = 1) -> None:
        """Repaint these lines from their text."""
        for y in range(y_start, y_start + line_count):
            self._painted.pop(y, None)
        super().refresh_lines(y_start, line_count)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        """Scroll; a scrollbar that is not drawn (size 0) takes its position silently.

        Told its new position the usual way, a hidden scrollbar becomes a dirty widget that
        the compositor does not show, and that makes it rebuild the whole screen's map on
        every frame in which the log scrolled.
        """
        if self.show_vertical_scrollbar and not self.styles.scrollbar_size_vertical:
            self.vertical_scrollbar.set_reactive(ScrollBar.position, new_value)
        # Only a scroll moves scroll_y (a size change keeps it, clamped to the new end): a
        # position short of the end is the user's, at the end the view follows again.
        self._pinned = new_value >= self.max_scroll_y
        super().watch_scroll_y(old_value, new_value)

    def _scroll_update(self, virtual_size: Size) -> None:
        """The view or its content changed size: a pinned view moves to its new last line."""
        super()._scroll_update(virtual_size)
        if self._pinned and self.scroll_y < self.max_scroll_y:
            self.scroll_target_y = self.scroll_y = self.max_scroll_y

    def render_lines(self, crop: Region) -> list[Strip]:
        """Render the visible lines (one ``rich_style`` lookup for all of them).

        Without a border, padding or scrollbars (the dashboard's log has none) the lines go
        straight to the compositor: Textual's generic per-line styling pass would only copy
        them, and it cost more than rendering them.
        """
        self._paint_style = self.rich_style
        try:
            if self.gutter or self.scrollbar_gutter or self.styles.has_rule("tint"):
                return super().render_lines(crop)
            scroll_x, scroll_y = self.scroll_offset
            width, height = self.size
            if len(self._painted) > 4 * max(height, 64):
                self._painted.clear()  # lines scrolled far out of view
            if self.text_selection is not None or self.highlight:
                render = self._render_line
            else:
                render = self._render_plain_line
            lines = [render(scroll_y + y, scroll_x, width) for y in crop.line_range]
            if crop.x or crop.width != width:
                lines = [line.crop(crop.x, crop.right) for line in lines]
            return lines
        finally:
            self._paint_style = None

    def _render_plain_line(self, y: int, scroll_x: int, width: int) -> Strip:
        """Line ``y`` as painted, when no text is selected and nothing is highlighted."""
        rich_style = self._paint_style or self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, rich_style)
        key = (scroll_x, width, rich_style)
        painted = self._painted.get(y)
        if painted is not None and painted[0] == key:
            return painted[1]
        text = self._process_line(self._lines[y])
        length = cell_len(text)
        if scroll_x == 0 and length <= width:
            # What the generic path makes of a plain line that fits, in one strip instead of
            # four: the text, then the padding, each carrying its offset for text selection.
            segments = [Segment(text, rich_style + Style.from_meta({"offset": (0, y)}))]
            if length < width:
                pad = rich_style + Style.from_meta({"offset": (len(text), y)})
                segments.append(Segment(" " * (width - length), pad))
            strip = Strip(segments if text else segments[1:], width)
        else:
            strip = self._render_line(y, scroll_x, width)
        self._painted[y] = (key, strip)
        return strip

    def _render_line(self, y: int, scroll_x: int, width: int) -> Strip:
        rich_style = self._paint_style or self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, rich_style)
        # Both steps are cached on the strip (by crop, and by line number for the offsets text
        # selection needs), so a scroll re-uses every line already rendered - as long as line
        # numbers stay put (see _prune_max_lines).
        line = self._render_line_strip(y, rich_style)
        shown = line.crop_extend(scroll_x, scroll_x + width, rich_style)
        if line.cell_length > scroll_x + width and width > 1:
            # The line goes on past the right edge: say so with a "…" in its last cell, rather
            # than cut it where a word, a number or a path happens to end.
            more = Segment("…", rich_style + Style(dim=True))
            shown = Strip([*shown.crop(0, width - 1), more], width)
        return shown.apply_offsets(scroll_x, y)

    def _render_line_strip(self, y: int, rich_style: Style) -> Strip:
        if self.text_selection is not None:
            return super()._render_line_strip(y, rich_style)
        if rich_style != self._cached_style:  # a theme or focus change restyles every line
            self._render_line_cache.clear()
            self._cached_style = rich_style
        strip = self._render_line_cache.get(y)
        if strip is None:
            strip = super()._render_line_strip(y, rich_style)
            self._render_line_cache[y] = strip
        return strip

    def _prune_max_lines(self) -> None:
        # Pruning renumbers every line, and a line's rendered strip carries its number (for
        # text selection): pruning on every write made every visible line render again. Let
        # the log run a tenth over max_lines, then prune back to it in one go.
        if self.max_lines is not None and len(self._lines) > self.max_lines * 1.1:
            super()._prune_max_lines()
            self._painted.clear()

    def _update_size(self, updates: int, lines: list[str]) -> None:  # type: ignore[override]
        # Inline, not a thread worker per write: measuring a screenful of lines is cheap.
        if lines:
            process = self._process_line
            self._update_maximum_width(updates, max(cell_len(process(line)) for line in lines))
