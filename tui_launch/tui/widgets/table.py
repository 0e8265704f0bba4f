"""The workers table: one row per local rank, a row cursor, cheap to update.

Textual's ``DataTable`` re-renders every cell of every row through Rich whenever any cell
changes (its caches are keyed on a global update counter), which made one repaint of eight
ranks cost tens of milliseconds: with telemetry, ages and sparklines changing every second it
was the dashboard's largest cost. This table keeps one rendered strip per row and rebuilds only
the rows whose cells changed; the layout is touched only when the number of rows or the column
widths change.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

__all__ = ["WorkersTable"]

PAD = 1  # spaces on each side of a cell


def _as_text(cell: RenderableType) -> Text:
    if isinstance(cell, Text):
        return cell
    return Text(str(cell))


class WorkersTable(ScrollView, can_focus=True):
    """Rows of cells with a sticky header and a row cursor (keys, mouse)."""

    DEFAULT_CSS = """
    WorkersTable {
        height: auto;
        background: $surface;
    }
    WorkersTable > .workers--header {
        text-style: bold;
        color: $text-accent;
    }
    WorkersTable > .workers--even-row {
        background: $surface-lighten-1 50%;
    }
    WorkersTable > .workers--cursor {
        background: $block-cursor-background;
        color: $block-cursor-foreground;
        text-style: bold;
    }
    WorkersTable:blur > .workers--cursor {
        background: $block-cursor-blurred-background;
        color: $block-cursor-blurred-foreground;
        text-style: none;
    }
    """
    COMPONENT_CLASSES = {"workers--header", "workers--even-row", "workers--cursor"}
    BINDINGS = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("home", "cursor_first", "First", show=False),
        Binding("end", "cursor_last", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, always_update=False, repaint=False)

    class RowHighlighted(Message):
        """The cursor moved to the row with this key."""

        def __init__(self, table: WorkersTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

    class RowSelected(Message):
        """Enter, or a click on the row under the cursor."""

        def __init__(self, table: WorkersTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._labels: tuple[Text, ...] = ()
        self._keys: list[str] = []
        self._rows: list[tuple[Text, ...]] = []
        self._widths: tuple[int, ...] = ()  # -1: a column hidden for want of width
        self._drop_order: tuple[int, ...] = ()
        # Row index -> (the styles and geometry it was built with, the strip); a row whose
        # cells change loses its entry in set_rows, so a cached strip is never compared cell
        # by cell again when painting.
        self._strips: dict[int, tuple[tuple[object, ...], Strip]] = {}
        # (row, column) -> (width, row style, the cell's padded, styled segments); dropped
        # by set_rows when the cell changes.
        self._cells: dict[tuple[int, int], tuple[int, Style, list[Segment]]] = {}
        self._paint_styles: tuple[object, dict[str, Style]] | None = None

    # ---------------------------------------------------------------- data

    @property
    def column_labels(self) -> tuple[str, ...]:
        """The column headers."""
        return tuple(label.plain for label in self._labels)

    @property
    def row_count(self) -> int:
        """Number of rows."""
        return len(self._rows)

    @property
    def row_keys(self) -> tuple[str, ...]:
        """Row keys, top to bottom."""
        return tuple(self._keys)

    def get_row_at(self, index: int) -> tuple[Text, ...]:
        """The cells of row ``index``."""
        return self._rows[index]

    @property
    def selected_key(self) -> str | None:
        """Key of the row under the cursor, if any."""
        if not self._rows:
            return None
        return self._keys[min(self.cursor_row, len(self._keys) - 1)]

    @property
    def shown_columns(self) -> tuple[str, ...]:
        """The headers of the columns that fit the table's width (all, before layout)."""
        return tuple(
            label.plain for label, w in zip(self._labels, self._widths, strict=False) if w >= 0
        )

    def set_columns(self, labels: Sequence[str], keep: Sequence[str] = ()) -> None:
        """Set the column headers (keeps no rows).

        ``keep`` lists the columns that matter most, most important first. When the table is
        narrower than its columns, the columns not in ``keep`` go first (rightmost first), then
        those in ``keep`` from its end: a column added later without a place in ``keep`` never
        pushes an essential one out.
        """
        self._labels = tuple(Text(label) for label in labels)
        rank = {name: i for i, name in enumerate(keep)}
        extra = [i for i in reversed(range(len(labels))) if labels[i] not in rank]
        kept = sorted(
            (i for i in range(len(labels)) if labels[i] in rank), key=lambda i: -rank[labels[i]]
        )
        self._drop_order = (*extra, *kept)
        self._keys, self._rows = [], []
        self._strips.clear()
        self._cells.clear()
        self._resize()

    def set_rows(self, rows: Sequence[tuple[str, Sequence[RenderableType]]]) -> None:
        """Replace every row with ``(key, cells)``; repaints only the rows that changed."""
        keys = [key for key, _ in rows]
        cells = [tuple(_as_text(c) for c in row) for _, row in rows]
        if keys == self._keys and cells == self._rows:
            return
        selected = self.selected_key
        changed = []
        for i, row in enumerate(cells):
            old = self._rows[i] if i < len(self._rows) else ()
            if row == old and keys[i] == self._keys[i]:
                continue
            changed.append(i)
            self._strips.pop(i, None)
            for column, cell in enumerate(row):
                if column >= len(old) or cell != old[column]:
                    self._cells.pop((i, column), None)
        count_changed = len(cells) != len(self._rows)
        if count_changed:
            self._cells = {k: v for k, v in self._cells.items() if k[0] < len(cells)}
            self._strips = {k: v for k, v in self._strips.items() if k < len(cells)}
        self._keys, self._rows = keys, cells
        if self._resize() or count_changed:
            self.refresh()
        elif changed:
            # One dirty region from the first changed row to the last: a second's update
            # changes most rows, and each refresh has its own cost.
            self.refresh_lines(changed[0] + 1, changed[-1] - changed[0] + 1)
        if selected in keys:
            self.move_cursor(keys.index(selected))
        elif self._rows:
            self.move_cursor(min(self.cursor_row, len(self._rows) - 1))

    def clear(self) -> None:
        """Remove every row."""
        self.set_rows([])

    def _resize(self) -> bool:
        """Recompute column widths and the virtual size; True if the widths changed."""
        natural = [
            max([label.cell_len, *(row[i].cell_len for row in self._rows if i < len(row))])
            for i, label in enumerate(self._labels)
        ]
        room = self.size.width
        if room > 0:
            total = sum(w + 2 * PAD for w in natural)
            for i in self._drop_order:
                if total <= room:
                    break
                if sum(w >= 0 for w in natural) <= 1:
                    break
                total -= natural[i] + 2 * PAD
                natural[i] = -1
        widths = tuple(natural)
        changed = widths != self._widths
        self._widths = widths
        total = sum(w + 2 * PAD for w in widths if w >= 0)
        size = Size(total, len(self._rows) + 1)
        if size != self.virtual_size:
            if size.height != self.virtual_size.height:
                self.refresh(layout=True)  # the table's height is auto
            self.virtual_size = size
        return changed

    def on_resize(self, event: events.Resize) -> None:
        """Columns come and go with the width (see :meth:`set_columns`)."""
        if self._resize():
            self._strips.clear()
            self.refresh()

    # ---------------------------------------------------------------- cursor

    def move_cursor(self, row: int) -> None:
        """Put the cursor on ``row`` (clamped) and scroll it into view."""
        if not self._rows:
            return
        self.cursor_row = max(0, min(row, len(self._rows) - 1))

    def watch_cursor_row(self, old: int, new: int) -> None:
        for i in (old, new):
            if 0 <= i < len(self._rows):
                self._repaint_row(i)
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_offset.y)
        if new < top:
            self.scroll_to(y=new, animate=False)
        elif new >= top + visible:
            self.scroll_to(y=new - visible + 1, animate=False)
        self.post_message(self.RowHighlighted(self, self.selected_key))

    def action_cursor_up(self) -> None:
        """Cursor one row up."""
        self.move_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        """Cursor one row down."""
        self.move_cursor(self.cursor_row + 1)

    def action_cursor_first(self) -> None:
        """Cursor to the first row."""
        self.move_cursor(0)

    def action_cursor_last(self) -> None:
        """Cursor to the last row."""
        self.move_cursor(len(self._rows) - 1)

    def action_select(self) -> None:
        """Select the row under the cursor."""
        if self._rows:
            self.post_message(self.RowSelected(self, self.selected_key))

    def on_click(self, event: events.Click) -> None:
        """A click moves the cursor; a click on the cursor's row selects it."""
        offset = event.get_content_offset(self)  # inside the border and padding
        if offset is None or offset.y < 1:
            return
        row = offset.y - 1 + int(self.scroll_offset.y)
        if not 0 <= row < len(self._rows):
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(row)

    # ---------------------------------------------------------------- rendering

    def _repaint_row(self, index: int) -> None:
        self.refresh_line(index + 1)  # virtual line: the header is line 0

    def notify_style_update(self) -> None:
        self._paint_styles = None
        super().notify_style_update()

    def _styles(self) -> dict[str, Style]:
        """The row styles, looked up again only when styles, focus or theme changed: each
        lookup walks the DOM (the background of every ancestor), and a paint needs four."""
        key = (self.has_focus, self.app.theme, self.app.ansi_color)
        if self._paint_styles is not None and self._paint_styles[0] == key:
            return self._paint_styles[1]
        base = self.rich_style
        styles = {
            "base": base,
            "header": base + self.get_component_rich_style("workers--header", partial=True),
            "even": self.get_component_rich_style("workers--even-row", partial=True),
            "cursor": self.get_component_rich_style("workers--cursor", partial=True),
        }
        self._paint_styles = (key, styles)
        return styles

    def render_line(self, y: int) -> Strip:
        """Line 0 is the header; the rows below it scroll."""
        styles = self._styles()
        width = self.size.width
        scroll_x = int(self.scroll_offset.x)
        if y == 0:
            return self._strip(-1, self._labels, styles["header"], width, scroll_x)
        index = y - 1 + int(self.scroll_offset.y)
        if not 0 <= index < len(self._rows):
            return Strip.blank(width, styles["base"])
        style = styles["base"]
        if index % 2:
            style += styles["even"]
        if index == self.cursor_row:
            style += styles["cursor"]
        return self._strip(index, self._rows[index], style, width, scroll_x)

    def _strip(
        self, index: int, cells: Sequence[Text], style: Style, width: int, scroll_x: int
    ) -> Strip:
        signature = (self._widths, style, width, scroll_x)
        cached = self._strips.get(index)
        if cached is not None and cached[0] == signature:
            return cached[1]
        segments: list[Segment] = []
        for column, (cell_width, cell) in enumerate(zip(self._widths, cells, strict=False)):
            if cell_width >= 0:
                segments.extend(self._cell_segments(index, column, cell, cell_width, style))
        total = sum(w + 2 * PAD for w in self._widths[: len(cells)] if w >= 0)
        # Cells in the row's style run together: fewer segments for every step after this
        # (the colour filter, the compositor's cuts, the terminal output).
        strip = Strip(Segment.simplify(segments), total).crop_extend(
            scroll_x, scroll_x + width, style
        )
        self._strips[index] = (signature, strip)
        return strip

    def _cell_segments(
        self, index: int, column: int, cell: Text, width: int, style: Style
    ) -> list[Segment]:
        """One padded cell through Rich, in the row's style, cached: a second's update
        changes few cells of a row (its CPU, its ages), and rendering every cell again was
        most of a row's cost."""
        key = (index, column)
        cached = self._cells.get(key)
        if cached is not None and cached[0] == width and cached[1] == style:
            return cached[2]
        line = Text(no_wrap=True, overflow="crop", end="")
        line.append(" " * PAD)
        line.append_text(cell)
        line.append(" " * (width - cell.cell_len + PAD))
        segments = [
            Segment(seg.text, style + seg.style if seg.style else style)
            for seg in line.render(self.app.console)
        ]
        self._cells[key] = (width, style, segments)
        return segments
