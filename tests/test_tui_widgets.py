"""The dashboard's own widgets paint what Textual's would.

``LogView`` and ``WorkersTable`` take shortcuts for speed (cached, pre-styled strips); these
tests hold them to the output of the generic paths they replace, strip by strip, including the
offsets that mouse text selection reads.
"""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Log

from tui_launch.tui.panels.inert import inert_lines
from tui_launch.tui.widgets.cached import CachedPanel
from tui_launch.tui.widgets.logview import LogView
from tui_launch.tui.widgets.table import WorkersTable

LINES = [
    "[0] rank 0 step   1103 loss 1.1492 elapsed   82.5s",
    "",
    "\ttab\tseparated",
    "wide: 训练 进度 ✓",
    "control \x1b[31mred\x1b[0m bytes",
    "x" * 130,  # wider than the view
    "trailing spaces   ",
]

CSS = "Log { scrollbar-size: 0 0; height: 20; width: 100; }"


def _segments(strip: Strip) -> list[tuple[str, object, object]]:
    return [(seg.text, seg.style, seg.style.meta if seg.style else None) for seg in strip]


def _paint(log: Log) -> list[list[tuple[str, object, object]]]:
    region = Region(0, 0, log.size.width, log.size.height)
    return [_segments(strip) for strip in log.render_lines(region)]


def _same_but_the_marker(fast: LogView, plain: Log) -> None:
    """``fast`` paints as ``plain`` does, but for the "…" that ends a line cut at the right
    edge (issue 23: Textual's Log cuts it mute): that row reads the same up to its last cell."""
    for row, (mine, theirs) in enumerate(zip(_paint(fast), _paint(plain), strict=True)):
        if mine == theirs:
            continue
        text = "".join(seg[0] for seg in mine)
        assert text == "".join(seg[0] for seg in theirs)[:-1] + "…", (row, text)
        assert "x" * 90 in text  # only the wide line is cut


class _Pair(App[None]):
    CSS = CSS

    def compose(self) -> ComposeResult:
        yield LogView(id="fast", max_lines=40, highlight=False)
        yield Log(id="plain", max_lines=40, highlight=False)


def test_logview_paints_lines_as_textual_log_does() -> None:
    async def main() -> None:
        app = _Pair()
        async with app.run_test(size=(110, 50)) as pilot:
            fast, plain = app.query_one("#fast", LogView), app.query_one("#plain", Log)
            app.set_focus(None)  # a focused log has another background
            # LogView makes every line inert (tui/inert.py): Log is given them inert already.
            fast.write_lines(LINES)
            plain.write_lines(inert_lines(LINES))
            await pilot.pause()
            _same_but_the_marker(fast, plain)
            assert _paint(fast) != _paint(plain)  # the wide line's marker
            _same_but_the_marker(fast, plain)  # from the cache, the same
            # Scrolled sideways: the long line is cropped, offsets start at the scroll.
            for log in (fast, plain):
                log.scroll_to(x=7, animate=False)
            await pilot.pause()
            assert fast.scroll_offset.x == plain.scroll_offset.x == 7
            _same_but_the_marker(fast, plain)
            for log in (fast, plain):
                log.scroll_to(x=0, animate=False)
            # Past max_lines both prune (LogView in batches), so compare from the same first
            # line: the offsets carry line numbers, which pruning changes.
            for i in range(60):
                for log in (fast, plain):
                    log.write_line(f"line {i}")
            await pilot.pause()
            fast._prune_max_lines()
            drop = len(fast.lines) - len(plain.lines)
            assert drop >= 0 and fast.lines[drop:] == plain.lines
            fast.clear()
            plain.clear()
            for log in (fast, plain):
                log.write_lines(LINES[:3])  # no escape, nothing wider than the view
            await pilot.pause()
            assert _paint(fast) == _paint(plain)
            assert any(seg[0].startswith("[0] rank 0") for seg in _paint(fast)[0])

    asyncio.run(main())


class _Table(App[None]):
    CSS = "WorkersTable { height: 6; }"

    def compose(self) -> ComposeResult:
        yield WorkersTable(id="workers")


def _row_text(table: WorkersTable, y: int) -> str:
    """Line ``y`` of the table as painted (line 0 is the header; no border here)."""
    region = Region(0, 0, table.size.width, table.size.height)
    return "".join(seg.text for seg in table.render_lines(region)[y])


def test_table_repaints_exactly_the_cells_that_changed() -> None:
    async def main() -> None:
        app = _Table()
        async with app.run_test(size=(80, 10)) as pilot:
            table = app.query_one(WorkersTable)
            table.set_columns(["rank", "CPU %", "last log"])
            table.set_rows(
                [("0", ["0", Text(" 12", style="green"), "0s"]), ("1", ["1", "7", "1s"])]
            )
            await pilot.pause()
            assert "12" in _row_text(table, 1) and "1s" in _row_text(table, 2)
            cached = table._cells[(0, 0)]
            table.set_rows(
                [("0", ["0", Text(" 13", style="green"), "0s"]), ("1", ["1", "7", "2s"])]
            )
            await pilot.pause()
            row0, row1 = _row_text(table, 1), _row_text(table, 2)
            assert "13" in row0 and "12" not in row0
            assert "2s" in row1 and "1s" not in row1
            assert table._cells[(0, 0)] is cached  # the unchanged cell was not rendered again
            # The cursor row is restyled: same words, other style.
            before = table.render_lines(Region(0, 1, table.size.width, 1))[0]
            table.move_cursor(1)
            await pilot.pause()
            after = table.render_lines(Region(0, 1, table.size.width, 1))[0]
            assert before.text == after.text and _segments(before) != _segments(after)
            # Fewer rows: the ones gone are blank, not stale.
            table.set_rows([("0", ["0", "1", "0s"])])
            await pilot.pause()
            assert _row_text(table, 2).strip() == ""

    asyncio.run(main())


class _Panels(App[None]):
    def compose(self) -> ComposeResult:
        yield CachedPanel(id="panel")


def test_cached_panel_makes_content_only_for_a_new_key_and_lays_out_only_on_a_new_height():
    made: list[str] = []

    def make(text: str) -> Text:
        made.append(text)
        return Text(text)

    async def main() -> None:
        app = _Panels()
        async with app.run_test(size=(60, 20)) as pilot:
            panel = app.query_one(CachedPanel)
            await pilot.pause()
            panel.show(("a",), make, "one line")
            await pilot.pause()
            assert made == ["one line"] and panel.region.height == 1
            panel.show(("a",), make, "not asked for")  # the same key: make is not called
            assert made == ["one line"]
            panel.show(("b",), make, "one line")  # a new key, the same words: no update
            assert made == ["one line", "one line"]
            panel.show(("c",), make, "two\nlines")  # taller: laid out again
            await pilot.pause()
            assert panel.region.height == 2
            assert str(panel.content) == "two\nlines"

    asyncio.run(main())
