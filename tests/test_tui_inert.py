"""Issue 23: a worker's terminal escapes reach the dashboard's terminal inert.

A worker (tests/workers/escapes.py) prints an OSC title change, a cursor move, a clear screen,
a bell and an SGR colour on both streams, then fails with an escape in its exception's
message. The dashboard (a real run under :class:`~tui_launch.tui.sources.live.LiveSource`) must show
every one of them as visible text (``^[``, ``^G``) in the log view, the root cause and the agent
log, and write no control character to the terminal: every segment the compositor paints is
checked. The end-to-end check in a real terminal (the pane's title unchanged) is in
tests/test_tui_tmux.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest
from conftest import TOKEN_VAR, WORKERS, wait_gone
from rich.console import Console
from rich.table import Table
from rich.text import Text
from test_tui_pilot import text_of, wait_until
from textual._compositor import LayoutUpdate

from tui_launch.core.launch.args import parse
from tui_launch.core.model.store import RunStore
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner
from tui_launch.testing import scenarios
from tui_launch.tui.app import Dashboard
from tui_launch.tui.panels.inert import Inert, inert, inert_text
from tui_launch.tui.sources.live import LiveSource

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_inert_shows_escapes_and_drops_colours() -> None:
    assert inert("plain text\twith a tab") == "plain text\twith a tab"
    assert inert("a\x1b]0;title\x07b") == "a^[]0;title^Gb"
    assert inert("\x1b[2J\x1b[Hx\x1b[5;5H") == "^[[2J^[[Hx^[[5;5H"
    assert inert("\x1b[1;31mred\x1b[0m, \x1b[38;5;196mmore\x1b[m") == "red, more"
    assert inert("bell\a, del\x7f, csi\x9b2J, cr\r\n") == "bell^G, del^?, csi^[[2J, cr\n"
    styled = Text.assemble(("left ", "bold"), ("\x1b]2;t\x1b\\", "red"), " right")
    out = inert_text(styled)
    assert out.plain == "left ^[]2;t^[\\ right"
    assert out.spans[0].style == "bold" and out.plain[: out.spans[0].end] == "left "
    table = Table.grid()
    table.add_row("node", "\x1b]0;x\x1b\\err")  # (rich itself drops a BEL from a table cell)
    console = Console(width=40, record=True, color_system=None)
    console.print(Inert(table))
    painted = console.export_text()
    assert "^[]0;x^[\\err" in painted and not CONTROL.search(painted.replace("\n", ""))


def painted(app: Dashboard) -> str:
    """Every character the compositor paints for the whole screen, line by line."""
    update = app.screen._compositor.render_update(full=True)
    assert isinstance(update, LayoutUpdate)
    return "\n".join("".join(seg.text for seg in strip) for strip in update.strips)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_workers_escapes_are_shown_inert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    monkeypatch.setenv(SHARE_STORE_ENV, "x")
    monkeypatch.delenv(SHARE_STORE_ENV)
    args, _ = parse(
        [
            "--standalone",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            str(WORKERS / "escapes.py"),
        ]
    )
    store = RunStore()
    runner = Runner(args, store, RunConfig(echo=False, journal_path=str(tmp_path / "j.jsonl")))
    app = Dashboard(LiveSource(runner), refresh_hz=20.0)

    async def main() -> None:
        async with app.run_test(size=(150, 42)) as pilot:
            runner.start()
            log = app.log_pane.view
            await wait_until(pilot, lambda: store.snapshot().finished is not None, 240)
            await wait_until(pilot, lambda: sum("escapes 0" in ln for ln in log.lines) >= 2, 30)
            shown = "\n".join(log.lines)
            assert "[0] escapes 0: ^[]0;pwned-title^G^[]2;pwned-st^[\\ ^[[5;5Hmoved" in shown
            assert "^[[2J^[[H^G red end" in shown  # the bell visible, the colour dropped
            assert "[0 err] err escapes 0" in shown
            await pilot.pause(0.2)  # painted
            screens = [painted(app)]
            await pilot.press("c")  # the root cause: the exception's message and stderr
            await wait_until(pilot, lambda: "boom" in text_of(app.panel("rootcause")))
            await pilot.pause()
            cause = text_of(app.panel("rootcause"))
            # (rich drops a BEL from a panel's text itself: stripped there, visible in the logs)
            assert "boom ^[]0;pwned-title^[[2J^[[H after escapes" in cause, cause
            screens.append(painted(app))
            await pilot.press("o")  # the agent log
            await pilot.pause(0.2)
            screens.append(painted(app))
            app.notify("toast \x1b]0;pwned-toast\x07 [bold]")  # a toast: inert, not markup
            await pilot.pause(0.2)
            assert any("^[]0;pwned-toast^G [bold]" in str(n.message) for n in app._notifications)
            for screen in screens:
                bad = sorted({hex(ord(c)) for c in CONTROL.findall(screen.replace("\n", ""))})
                assert not bad, f"control characters painted: {bad}\n{screen}"
            assert "^[]0;pwned-title^G^[]2;pwned-st^[\\ ^[[5;5Hmoved" in screens[0], screens[0]
            assert "boom ^[]0;pwned-title^[[2J^[[H" in screens[1], screens[1]

    try:
        asyncio.run(main())
    finally:
        if not runner.done:
            runner.stop()
            runner.wait(30)
    assert wait_gone(token, 10) == []


def test_eta_hidden_while_stalled_or_hung() -> None:
    """Issue 23: an ETA from the last rate while nothing moves is a promise that will not be
    kept: the header and the rank's cell show a dash instead."""
    from test_tui_pilot import drive

    from tui_launch.core.model.events import Slowdown
    from tui_launch.testing.builders import at

    def header(app: Dashboard) -> str:
        return text_of(app.panel("header"))

    async def healthy(pilot, app: Dashboard, src) -> None:
        assert re.search(r"ETA \d+m", header(app)), header(app)
        assert eta_cell(app) == "6m"
        src.post(Slowdown(attempt=0, global_rank=0, what="stalled", active=True, rate=0.0,
                          best_rate=4.2, stalled_for=40.0, **at(95.0)))  # fmt: skip
        src.clock += 1.0  # the next second's frame
        await wait_until(pilot, lambda: "STALLED" in header(app))
        assert "ETA —" in header(app) and not re.search(r"ETA \d", header(app)), header(app)
        await wait_until(pilot, lambda: eta_cell(app) != "6m")
        assert eta_cell(app) == "—"

    def eta_cell(app: Dashboard) -> str:
        eta = list(app._table.column_labels).index("ETA")
        return getattr(app._table.get_row_at(0)[eta], "plain", "")

    async def hung(pilot, app: Dashboard, src) -> None:
        assert "ETA —" in header(app), header(app)

    drive("healthy", healthy)
    drive("hung", hung)
    assert "hung" in scenarios.STATES


def test_the_dump_leaves_the_stacks_tab_uncovered_at_80x24() -> None:
    """Issue 23: after d, a toast repeating the verdict covered half the Stacks tab on 80x24:
    the tab now says it alone, and the "dumping" toast goes after 2 s."""
    app = Dashboard(scenarios.STATES["hung"](), refresh_hz=20.0)

    async def main() -> None:
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await pilot.pause()
            await pilot.press("d")
            toasts = list(app._notifications)
            assert [(str(n.message), n.timeout) for n in toasts] == [
                ("dumping every rank's stacks...", 2)
            ]
            await wait_until(pilot, lambda: app._tabs.active == "stacks-tab")
            await wait_until(pilot, lambda: "load_batch" in text_of(app.panel("stacks")))
            await pilot.pause(0.3)
            # Only the short-lived "dumping" toast, if still there on a loaded machine.
            toasts = list(app._notifications)
            assert {str(n.message) for n in toasts} <= {"dumping every rank's stacks..."}
            assert all(n.timeout <= 2 for n in toasts)
            assert "rank 1 is not in a collective" in painted(app)  # the verdict, in the tab

    asyncio.run(main())


def test_a_line_longer_than_the_log_ends_with_a_marker() -> None:
    """Issue 23: a log line cut at the view's right edge ends with "…" (it was cut mute)."""
    from test_tui_pilot import add_lines, drive

    long = "start " + "x" * 300 + " END"

    async def check(pilot, app: Dashboard, src) -> None:
        add_lines(src, 0, [long, "short line"])
        src.clock += 1.0
        await wait_until(pilot, lambda: any("short line" in ln for ln in app.log_pane.view.lines))
        await pilot.pause(0.2)
        rows = painted(app).splitlines()
        cut = next(r for r in rows if "[0] start xxx" in r)
        assert cut.rstrip().endswith("x…") and "END" not in cut, cut
        short = next(r for r in rows if "short line" in r)
        assert "…" not in short

    drive("healthy", check)


def test_the_help_scrolls_at_80x24() -> None:
    """Issue 23: on 80x24 the help's last rows were cut off; now its rows scroll (the keys
    reach them) and the title and the foot stay on the screen."""
    from textual.containers import VerticalScroll

    from tui_launch.tui.widgets.screens import HelpScreen

    app = Dashboard(scenarios.STATES["healthy"]())

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
            await pilot.pause()
            rows = app.screen.query_one("#help-rows", VerticalScroll)
            assert rows.max_scroll_y > 0  # more rows than the screen holds
            assert "this help" not in painted(app)
            assert "tuilaunch keys" in painted(app) and "Esc closes" in painted(app)
            await pilot.press("end")
            await wait_until(pilot, lambda: rows.scroll_y == rows.max_scroll_y)
            await pilot.pause()
            screen = painted(app)
            assert "this help" in screen and "quit (stops the job" in screen, screen
            assert "tuilaunch keys" in screen and "Esc closes" in screen

    asyncio.run(main())
