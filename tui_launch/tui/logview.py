"""A log widget that is cheap to append to.

Textual's ``Log`` does two costly things on every write: its ``virtual_size`` is a reactive with
``layout=True``, so each new line makes the *whole screen* lay out and repaint (the workers
table, every panel), and it measures the new lines' width in a fresh thread worker. With
several ranks printing a few lines a second, that was most of the dashboard's CPU. Here the
virtual size changes without a layout (the log's own region does not move; only its scrollbar
needs to know, and is told directly) and the width is measured inline.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import Log

__all__ = ["LogView"]


class LogView(Log):
    """``Log`` whose writes repaint only itself."""

    # The log's region is fixed by the layout around it; its content size only moves the
    # scrollbar, which write_lines updates itself.
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def write_lines(self, lines: Iterable[str], scroll_end: bool | None = None) -> LogView:
        """Append lines; scroll to the end when following (see ``Log.write_lines``)."""
        super().write_lines(lines, scroll_end)
        self._scroll_update(self.virtual_size)
        return self

    def clear(self) -> LogView:
        """Remove every line."""
        super().clear()
        self._scroll_update(self.virtual_size)
        return self

    def _update_size(self, updates: int, lines: list[str]) -> None:  # type: ignore[override]
        # Inline, not a thread worker per write: measuring a screenful of lines is cheap.
        if lines:
            process = self._process_line
            self._update_maximum_width(updates, max(cell_len(process(line)) for line in lines))
