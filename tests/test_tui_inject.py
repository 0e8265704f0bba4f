"""The dashboard's inject menu (``i``, and the command palette) on the deterministic FakeSource.

The fake records the specs it is given (``.injected``) after checking them with the same
parser as ``--inject``; a hang is performed as the runner does it (a SIGSTOP through the
control API), so the row shows the rank stopped and ``s`` continues it.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import pytest
from conftest import TOKEN_VAR, WORKERS, wait_for, wait_gone
from test_tui_pilot import drive, row_texts, wait_until
from textual.pilot import Pilot
from textual.widgets import Input, OptionList, Static

from tui_launch.core.launch.args import parse
from tui_launch.core.model.commands import Inject
from tui_launch.core.model.store import RunStore
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.inject import KINDS
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner
from tui_launch.testing import scenarios
from tui_launch.testing.fake_source import FakeSource
from tui_launch.tui.app import Dashboard
from tui_launch.tui.sources.live import LiveSource
from tui_launch.tui.widgets.screens import ConfirmScreen, InjectScreen


def test_i_opens_the_menu_for_the_selected_rank_with_every_kind() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "i")
        await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))
        screen = app.screen
        assert isinstance(screen, InjectScreen)
        title = str(screen.query_one("#inject-title", Static).content)
        assert title.startswith("Inject a failure into rank 1 (local 1, pid")
        kinds = screen.query_one("#inject-kinds", OptionList)
        assert [kinds.get_option_at_index(i).id for i in range(kinds.option_count)] == list(KINDS)
        keys = screen.query_one("#inject-keys", Input)
        assert keys.value == "signal=SIGKILL"
        assert "signal (SIGKILL)" in str(screen.query_one("#inject-keys-help", Static).content)
        # Every kind shows its own keys when highlighted.
        for kind in KINDS[1:]:
            await pilot.press("down")
            await pilot.pause()
            assert screen.kind == kind
            assert keys.value == InjectScreen.PRESETS[kind]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, InjectScreen) and src.injected == []

    drive("healthy", check)


def test_menu_injects_the_spec_it_shows() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "down", "i")
        await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))
        await pilot.press("down", "down", "down", "down", "enter")  # exception; focus keys
        screen = app.screen
        assert isinstance(screen, InjectScreen) and screen.kind == "exception"
        keys = screen.query_one("#inject-keys", Input)
        keys.value = "after=2s,message=boom"
        await pilot.press("enter")
        await wait_until(pilot, lambda: src.injected)
        assert src.injected == ["exception:rank=2,after=2s,message=boom"]
        assert not isinstance(app.screen, InjectScreen)

    drive("healthy", check)


def test_menu_keeps_a_bad_spec_and_says_why() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("i")
        await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))
        screen = app.screen
        assert isinstance(screen, InjectScreen)
        screen.query_one("#inject-keys", Input).value = "signal=SIGNOPE"
        await pilot.click("#inject-go")
        await pilot.pause()
        assert isinstance(app.screen, InjectScreen) and src.injected == []
        error = str(screen.query_one("#inject-error", Static).content)
        assert "bad signal 'SIGNOPE'" in error

    drive("healthy", check)


def test_hung_rank_shows_stopped_and_s_continues_it() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "i", "down", "enter")  # hang, focus keys
        screen = app.screen
        assert isinstance(screen, InjectScreen) and screen.kind == "hang"
        await pilot.press("enter")
        await wait_until(pilot, lambda: src.injected)
        assert src.injected == ["hang:rank=1,for=10s"]
        await wait_until(pilot, lambda: row_texts(app._table)[1][3] == "stopped")
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith("Continue (SIGCONT)")
        await pilot.press("y")
        await wait_until(pilot, lambda: len(src.actions) == 2)
        assert src.actions[-1] == ("signal", 1, int(signal.SIGCONT))
        await wait_until(pilot, lambda: row_texts(app._table)[1][3] == "running")

    drive("healthy", check)


def test_inject_is_in_the_palette_and_hidden_when_finished() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        titles = [str(c.title) for c in app.get_system_commands(app.screen)]
        assert "Inject a failure into the selected rank" in titles
        entry = next(c for c in app.get_system_commands(app.screen) if c.title.startswith("Inj"))
        app.call_later(entry.callback)
        await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))

    drive("healthy", check)

    async def finished(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert not app.check_action("inject", ())
        titles = [str(c.title) for c in app.get_system_commands(app.screen)]
        assert "Inject a failure into the selected rank" not in titles

    drive("finished", finished)


def _live_runner(tmp_path: Path, *extra: str) -> tuple[Runner, RunStore]:
    args, opts = parse(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            *extra,
            str(WORKERS / "steady.py"),
            "--seconds",
            "120",
        ]
    )
    store = RunStore()
    journal = str(tmp_path / f"j{len(extra)}.jsonl")
    config = RunConfig(
        echo=False,
        journal_path=journal,
        inject_ready=opts.inject_ready,
        no_bootstrap=opts.no_bootstrap,
    )
    runner = Runner(args, store, config)
    return runner, store


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_exit_and_exception_greyed_out_without_the_bootstrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a run started with --no-bootstrap cannot do exit or exception (its workers
    have no bootstrap): the menu no longer offers them and then refuses; they are greyed out
    (not selectable) with the reason. By default (the bootstrap) they are offered."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    monkeypatch.setenv(SHARE_STORE_ENV, "x")
    monkeypatch.delenv(SHARE_STORE_ENV)
    runner, store = _live_runner(tmp_path, "--no-bootstrap")
    source = LiveSource(runner)
    app = Dashboard(source, refresh_hz=20.0)

    async def main() -> None:
        async with app.run_test(size=(150, 42)) as pilot:
            runner.start()

            def running() -> bool:
                s = store.snapshot()
                return s.phase == "running" and [r.state for r in s.ranks] == ["running"] * 2

            await wait_until(pilot, running, 240)
            await pilot.pause(0.3)
            await pilot.press("i")
            await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))
            screen = app.screen
            assert isinstance(screen, InjectScreen)
            kinds = screen.query_one("#inject-kinds", OptionList)
            options = [kinds.get_option_at_index(i) for i in range(kinds.option_count)]
            disabled = [o.id for o in options if o.disabled]
            assert disabled == ["exit", "exception"]
            refused = screen.query_one("#inject-refused", Static)
            assert refused.display
            assert "exit/exception injection needs" in str(refused.content)
            assert "--no-bootstrap" in str(refused.content)
            seen = [screen.kind]
            for _ in range(5):  # the arrows pass over the greyed kinds
                await pilot.press("down")
                await pilot.pause()
                seen.append(screen.kind)
            assert "exit" not in seen and "exception" not in seen and "node" in seen, seen
            await pilot.press("escape")

    try:
        asyncio.run(main())
        assert source.inject_refusal("kill") is None
        out = source.send(Inject("exit:rank=0", source="test"))  # refused as before, for the API
        assert not out.ok and "--no-bootstrap" in out.detail
    finally:
        runner.stop()
        runner.wait(30)
    assert wait_gone(token, 10) == []

    ready, _ = _live_runner(tmp_path)
    try:
        ready.start()
        wait_for(lambda: ready.store.snapshot().phase == "running", 240, what="running")
        assert LiveSource(ready).inject_refusal("exit") is None
        assert LiveSource(ready).inject_refusal("exception") is None
    finally:
        ready.stop()
        ready.wait(30)
    assert wait_gone(token, 10) == []


def test_the_fake_refuses_like_the_runner() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("i")
        await wait_until(pilot, lambda: isinstance(app.screen, InjectScreen))
        kinds = app.screen.query_one("#inject-kinds", OptionList)
        assert not any(kinds.get_option_at_index(i).disabled for i in range(kinds.option_count))
        assert not app.screen.query_one("#inject-refused", Static).display

    drive("healthy", check)  # the fake's runs have the bootstrap unless told otherwise
    src = scenarios.STATES["healthy"]()
    src.inject_ready = False
    assert src.send(Inject("exception:rank=0", source="test")).ok is False
    assert src.send(Inject("kill:rank=0", source="test")).ok is True


class TestInjectSnapshots:
    def test_inject_menu(self, snap_compare) -> None:
        """Rank 1 selected, i pressed, hang highlighted: the menu with hang's keys."""
        app = Dashboard(scenarios.STATES["healthy"]())
        assert snap_compare(app, terminal_size=(150, 42), press=["down", "i", "down"])
