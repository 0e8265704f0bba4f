"""The panel table (``tui/panels/board.py``): the one list the dashboard composes, titles and
redraws from, so that a new panel is its renderer and a row there (docs/ARCHITECTURE.md,
"Where to add a panel or tab").
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from test_tui_pilot import drive, text_of, wait_until
from textual.pilot import Pilot
from textual.widgets import Static

from tui_launch.testing import scenarios
from tui_launch.testing.fake_source import FakeSource
from tui_launch.tui import app as app_module
from tui_launch.tui.app import Dashboard
from tui_launch.tui.panels.base import Frame, Panel, Where
from tui_launch.tui.panels.board import PANELS


def test_every_panel_has_one_id_and_one_place() -> None:
    ids = [p.id for p in PANELS]
    panes = [p.pane for p in PANELS if p.where is Where.TAB]
    assert len(set(ids)) == len(ids) and len(set(panes)) == len(panes)
    assert [p.where for p in PANELS[:1]] == [Where.HEADER]  # the header's line comes first
    for p in PANELS:
        # A side panel has a border title, a tab its label; the header has neither.
        assert bool(p.title) == (p.where is not Where.HEADER), p
        # Only a tab may be the app's own widget (the Logs, the Agent log), and only a tab
        # is left undrawn while hidden.
        assert p.render is not None or p.where is Where.TAB, p
        assert not p.while_shown or p.where is Where.TAB, p


def _frame(src: FakeSource, *, narrow: bool = False) -> Frame:
    now = src.now()
    return Frame(src.snapshot(), now, int(now), True, narrow, src.stack_dump)


@pytest.mark.parametrize("state", sorted(scenarios.STATES))
def test_every_panel_keys_and_renders_every_scenario(state: str) -> None:
    """Keys compare equal for the same frame (else a panel would redraw on every refresh), and
    every renderer draws every pictured state."""
    src = scenarios.STATES[state]()
    console = Console(file=io.StringIO(), width=100, color_system=None, legacy_windows=False)
    for narrow in (False, True):
        frame, again = _frame(src, narrow=narrow), _frame(src, narrow=narrow)
        for p in PANELS:
            if p.render is None:
                continue
            assert p.key(frame) == p.key(again), p.id
            console.print(p.render(frame))
            if p.retitle is not None:
                assert p.retitle(frame).startswith(p.title), p.id


def test_the_dashboard_is_composed_from_the_table() -> None:
    """Places, order, border titles and tab labels all come from the table."""

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        side = [w.id for w in app.query_one("#side").children]
        assert side == [p.id for p in PANELS if p.where is Where.SIDE]
        for p in PANELS:
            if p.where is Where.SIDE:
                title = app.panel(p.id).border_title  # "GPUs (simulated: fake NVML)"
                assert title is not None and title.startswith(p.title), p.id
        tabs = [p for p in PANELS if p.where is Where.TAB]
        assert app._tabs.tab_ids == tuple(p.pane for p in tabs)
        assert app._tabs._tabs == tuple((p.pane, p.title) for p in tabs)
        # A drawn tab's scroller is styled by its class (dashboard.tcss), not by its id.
        assert all(app.query_one(f"#{p.pane}").has_class("tab-panel") for p in tabs if p.render)
        assert app.screen.children[0] is app.panel("header")

    drive("healthy", check)


def test_a_new_panel_is_one_row_of_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A side panel and a tab added to the table only: composed, titled, drawn when their key
    changes, and the tab only while shown."""
    drawn: list[str] = []

    def side(f: Frame) -> str:
        drawn.append("side")
        return f"phase {f.snap.phase}"

    def tab(f: Frame) -> str:
        drawn.append("tab")
        return f"{len(f.snap.ranks)} ranks"

    extra = (
        Panel("extra", Where.SIDE, "Extra", key=lambda f: f.snap.phase, render=side),
        Panel(
            "extratab",
            Where.TAB,
            "Extra tab",
            tab="extra-tab",
            while_shown=True,
            key=lambda f: f.second,
            render=tab,
        ),
    )
    monkeypatch.setattr(app_module, "PANELS", (*PANELS, *extra))

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert app.panel("extra").border_title == "Extra"
        assert "phase running" in text_of(app.query_one("#extra", Static))
        assert drawn == ["side"]  # drawn once: its key did not change; the tab is hidden
        assert app._tabs.tab_ids[-1] == "extra-tab"
        app.show_tab("extra-tab")
        await wait_until(pilot, lambda: "4 ranks" in text_of(app.panel("extratab")))
        assert app.query_one("#extra-tab").display

    drive("healthy", check)
