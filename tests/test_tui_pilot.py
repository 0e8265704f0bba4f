"""Pilot tests of the dashboard: every panel and every key, on the deterministic FakeSource.

No process is started: :class:`~tui_launch.testing.fake_source.FakeSource` records the control calls
(``.actions``) instead of signalling anything, and ``post()`` moves the fake run on. Each test
runs the real :class:`~tui_launch.tui.app.Dashboard` headless under ``App.run_test()``.
"""

from __future__ import annotations

import asyncio
import io
import signal
from collections.abc import Awaitable, Callable

import pytest
from rich.cells import cell_len
from rich.console import Console
from textual.command import CommandList
from textual.pilot import Pilot
from textual.widgets import Footer, Input, Log, Static
from textual.widgets._footer import FooterKey

from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.logs.tail import LogSource
from tui_launch.core.model.events import FlightRecorderVerdict, RankExited, RunFinished
from tui_launch.core.model.progress import fmt_duration
from tui_launch.testing import builders, scenarios
from tui_launch.testing.fake_source import FakeSource
from tui_launch.tui import actions
from tui_launch.tui.app import Dashboard
from tui_launch.tui.commands import RunCommands
from tui_launch.tui.modes import ReplayMode
from tui_launch.tui.widgets.logpane import LOG_LINES_SHOWN
from tui_launch.tui.widgets.screens import ConfirmScreen, HelpScreen
from tui_launch.tui.widgets.table import WorkersTable

SIZE = (150, 42)
Scenario = Callable[[Pilot, Dashboard, FakeSource], Awaitable[None]]


def drive(
    state: str | FakeSource,
    scenario: Scenario,
    *,
    confirm: bool = True,
    exit_on_finish: bool = False,
    refresh_hz: float = 20.0,
    size: tuple[int, int] = SIZE,
) -> Dashboard:
    """Run the dashboard on a fake state under ``run_test`` and play ``scenario`` on it."""
    src = scenarios.STATES[state]() if isinstance(state, str) else state
    app = Dashboard(src, refresh_hz=refresh_hz, confirm=confirm, exit_on_finish=exit_on_finish)

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await scenario(pilot, app, src)

    asyncio.run(main())
    return app


def logview(app: Dashboard) -> Log:
    """The worker log view (#log)."""
    return app.query_one("#log", Log)


def text_of(widget: Static) -> str:
    """A Static's content as plain text (rich tables and groups rendered at 100 columns)."""
    content = widget.content
    plain = getattr(content, "plain", None)
    if plain is not None:
        return plain
    if isinstance(content, str):
        return content
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, legacy_windows=False).print(content)
    return out.getvalue()


def squash(text: str) -> str:
    """Collapse runs of spaces, so ``on failure   1 / 3`` reads ``on failure 1 / 3``."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def row_texts(table: WorkersTable) -> list[list[str]]:
    return [
        [getattr(c, "plain", str(c)) for c in table.get_row_at(i)] for i in range(table.row_count)
    ]


def footer_labels(app: Dashboard) -> list[str]:
    footer = app.screen.query_one(Footer)
    return [k.description for k in footer.query(FooterKey)]


async def shown_keys(pilot: Pilot, app: Dashboard) -> list[str]:
    """The footer's keys once it has been (re)built: Quit is always among them."""
    await wait_until(pilot, lambda: "Quit" in footer_labels(app))
    return footer_labels(app)


async def wait_until(pilot: Pilot, predicate: Callable[[], object], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting in the pilot")
        await pilot.pause(0.02)


def add_lines(src: FakeSource, rank: int, lines: list[str], stream: str = "stdout") -> None:
    """What the log tailer does for a live run: hand new lines to the LogBuffer sink."""
    src.logs(
        LogSource(
            attempt=0,
            local_rank=rank,
            global_rank=rank,
            stream=stream,
            path="",
            console=False,
            prefix=None,
        ),
        lines,
    )


# ------------------------------------------------------------------------------------ panels


def test_healthy_panels_show_the_run() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        header = text_of(app.query_one("#header", Static))
        assert "RUNNING" in header
        assert "examples/train_ddp.py --epochs 20" in header
        assert "run demo-run-42" in header
        assert "c10d node0.cluster:29400" in header
        assert "0:01:35" in header  # fixed clock: 95 s after the start

        rdzv = squash(text_of(app.query_one("#rendezvous", Static)))
        assert "backend c10d node0.cluster:29400" in rdzv
        assert "run id demo-run-42" in rdzv
        assert "state complete (round 0)" in rdzv
        assert "this node group rank 0 of 1" in rdzv
        assert "master node0.cluster:41000" in rdzv
        assert "*node 0 node0.cluster:4242 hb" in rdzv  # this node, with its heartbeat age
        assert app.query_one("#rendezvous").border_title == "Rendezvous"

        restarts = squash(text_of(app.query_one("#restarts", Static)))
        assert "on failure 0 / 3" in restarts
        assert "budget left 3" in restarts
        assert "manual 0" in restarts
        # With progress, the attempt's steps take the start offset's column (issue 15).
        assert "# took world steps ended by" in restarts
        assert "0 - 4 388 running" in restarts
        assert "step 388/2000 19%" in header and "from rank 0" in header

        gpus = text_of(app.query_one("#gpus", Static))
        assert app.query_one("#gpus").border_title == "GPUs (simulated: fake NVML)"
        for i in range(4):  # one fake GPU per rank, each rank's pid on its own GPU
            assert f"{i} H100 80GB HBM3" in gpus and f"rank {i}" in gpus
        assert "18/80G" in gpus and "700W" in gpus

        table = app.query_one("#workers", WorkersTable)
        assert table.row_count == 4
        rows = row_texts(table)
        # Rank 3 is in uninterruptible sleep (D) in this state: flagged.
        assert [r[:5] for r in rows] == [
            [str(i), str(i), str(5100 + i), "running" if i < 3 else "running D", "-"]
            for i in range(4)
        ]
        labels = list(table.column_labels)
        col = {name: labels.index(name) for name in labels}
        # Telemetry columns: RSS, GPU (mapped by pid), GPU memory (the fake's 18 + 3i GiB).
        assert [r[col["GPU"]] for r in rows] == ["0", "1", "2", "3"]
        assert [r[col["GPU mem"]] for r in rows] == ["18.0G", "21.0G", "24.0G", "27.0G"]
        assert all(
            r[col["RSS"]].endswith("G") and r[col["CPU %"]].split()[-1].isdigit() for r in rows
        )
        # Uptime: workers started 0.6 s into the run, the fake clock is at 95 s.
        assert rows[0][col["uptime"]] == fmt_duration(95.0 - 0.6, floor=True)
        assert [r[col["last log"]] for r in rows] == ["1s", "2s", "3s", "4s"]  # settled
        assert labels[:5] == ["rank", "local", "pid", "state", "exit"]
        # Progress (issue 15): rank 0 prints a tqdm bar; the others print no step.
        assert labels[5:8] == ["step", "steps/s", "ETA"]
        assert [r[col["step"]] for r in rows] == ["388/2000", "-", "-", "-"]
        assert rows[0][col["steps/s"]].endswith(" 4.20") and rows[0][col["ETA"]] == "6m"

        log = logview(app)
        assert len(log.lines) == 4 * 7
        assert log.lines[0] == "[0] [RANK 0] start: restart_count=0 world_size=4 pid=5100"
        assert "[3] [RANK 3] Epoch 5 | Batchsize: 32 | Steps: 20 | loss 0.1500" in log.lines
        bar = text_of(app.query_one("#logbar", Static))
        assert bar == "log: all ranks, merged  |  streams: both  |  following"

        assert text_of(app.query_one("#rootcause", Static)) == "No failure so far."
        assert app.query_one("#agentlog", Log).lines == [
            "2026-11-21 12:00:00 I torch.distributed.elastic: rendezvous complete"
        ]
        assert app.selected_rank() == 0
        labels = await shown_keys(pilot, app)
        for label in ("Kill", "SIGTERM", "Stop/Cont", "Restart", "Rank log", "Quit", "Help"):
            assert label in labels

    drive("healthy", check)


def test_waiting_panels() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert "WAITING FOR NODES" in text_of(app.query_one("#header", Static))
        rdzv = squash(text_of(app.query_one("#rendezvous", Static)))
        assert "nodes 2:4" in rdzv
        assert "state waiting" in rdzv
        assert "joined 1 of min 2" in rdzv
        assert "deadline 0:09:18 left" in rdzv  # 600 s join timeout, 42 s in, started at 0.1
        assert app.query_one("#workers", WorkersTable).row_count == 0
        assert logview(app).lines == []
        assert app.selected_rank() is None

    drive("waiting", check)


def test_failure_panels_show_the_root_cause() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        header = text_of(app.query_one("#header", Static))
        assert "FAILED" in header and "exit code 1" in header and "0:01:10" in header
        restarts = squash(text_of(app.query_one("#restarts", Static)))
        assert "on failure 1 / 1" in restarts
        assert "budget left 0" in restarts
        rows = row_texts(app.query_one("#workers", WorkersTable))
        assert [r[:5] for r in rows] == [
            ["0", "0", "5200", "exited", "SIGTERM (-15)"],
            ["1", "1", "5201", "failed", "exit 1"],
        ]
        cause = text_of(app.query_one("#rootcause", Static))
        assert cause.startswith("root cause  (attempt 1)")
        assert "rank       : 1 (local rank 1) on node0, pid 5101" in cause
        assert "Traceback (most recent call last):" in cause
        assert '    File "examples/train_ddp.py", line 87, in _run_batch' in cause  # indentation
        assert "RuntimeError: CUDA error: an illegal memory access was encountered" in cause
        assert "other failures" in cause and "attempt 0:" in cause
        # The fake NVML failed to open: nothing simulated is shown, so the title says nothing.
        assert "NVML not found" in text_of(app.query_one("#gpus", Static))
        assert app.query_one("#gpus").border_title == "GPUs"
        # The logs carry both attempts, separated by a marker.
        assert "---- attempt 1 ----" in logview(app).lines

    drive("failure", check)


def test_restarting_and_finished_panels() -> None:
    async def restarting(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert "RESTARTING" in text_of(app.query_one("#header", Static))
        restarts = squash(text_of(app.query_one("#restarts", Static)))
        assert "on failure 1 / 3" in restarts and "budget left 2" in restarts
        assert "failure" in restarts  # attempt 0 ended by a failure
        cause = text_of(app.query_one("#rootcause", Static))
        assert "SIGKILL (-9)" in cause and "OOM killer" in cause
        states = [r[3] for r in row_texts(app.query_one("#workers", WorkersTable))]
        assert states == ["exited", "failed"]

    async def finished(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        header = text_of(app.query_one("#header", Static))
        assert "SUCCEEDED" in header and "exit code 0" in header
        rows = row_texts(app.query_one("#workers", WorkersTable))
        assert [r[:5] for r in rows] == [
            ["0", "0", "5200", "exited", "exit 0"],
            ["1", "1", "5201", "exited", "exit 0"],
        ]
        restarts = squash(text_of(app.query_one("#restarts", Static)))
        assert "on failure 1 / 3" in restarts and "succeeded" in restarts

    drive("restarting", restarting)
    drive("finished", finished)


def test_screenshot_text_contains_the_panels() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        svg = app.export_screenshot()
        for text in ("Rendezvous", "Restarts", "GPUs", "Logs", "Root", "Agent"):
            assert text in svg

    drive("healthy", check)


# ------------------------------------------------------------------------------------ signals


@pytest.mark.parametrize(
    ("key", "sig"), [("k", signal.SIGKILL), ("t", signal.SIGTERM), ("s", signal.SIGSTOP)]
)
def test_signal_keys_ask_then_signal_the_selected_rank(key: str, sig: int) -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down")
        assert app.selected_rank() == 1
        await pilot.press(key)
        assert isinstance(app.screen, ConfirmScreen)
        assert "rank 1 (local 1, pid 5101)" in app.screen.question
        assert src.actions == []  # nothing before the answer
        await pilot.press("y")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert src.actions == [("signal", 1, int(sig))]

    drive("healthy", check)


def test_kill_answered_no_does_nothing() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        await pilot.press("t", "escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert src.actions == []
        assert app.is_running

    drive("healthy", check)


def test_confirm_dialog_buttons_work_with_the_mouse() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.click("#no")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert src.actions == []
        await pilot.press("k")
        await pilot.click("#yes")
        await wait_until(pilot, lambda: src.actions)
        assert src.actions == [("signal", 0, 9)]

    drive("healthy", check)


def test_stop_then_continue() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "down", "s", "y")
        await wait_until(pilot, lambda: src.actions)
        assert src.actions == [("signal", 2, int(signal.SIGSTOP))]
        # A refresh shows the new state.
        await wait_until(pilot, lambda: row_texts(app._table)[2][3] == "stopped")
        assert app.check_action("kill", ())  # a stopped rank can still be killed
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question.startswith("Continue (SIGCONT)")
        await pilot.press("y")
        await wait_until(pilot, lambda: len(src.actions) == 2)
        assert src.actions[1] == ("signal", 2, int(signal.SIGCONT))
        await wait_until(pilot, lambda: row_texts(app._table)[2][3] == "running")

    drive("healthy", check)


def test_restart_key() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        assert "no failure budget spent" in app.screen.question
        await pilot.press("y")
        await wait_until(pilot, lambda: src.actions)
        assert src.actions == [("restart", None, None)]

    drive("healthy", check)


def test_no_confirm_acts_at_once() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "k")
        assert not isinstance(app.screen, ConfirmScreen)
        assert src.actions == [("signal", 1, 9)]
        await pilot.press("t", "s", "r")
        assert not isinstance(app.screen, ConfirmScreen)
        assert src.actions[1:] == [
            ("signal", 1, 15),
            ("signal", 1, 19),
            ("restart", None, None),
        ]

    drive("healthy", check, confirm=False)


# ------------------------------------------------------------------------------------ logs


def test_rank_log_and_merged_log() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("down", "down", "l")
        assert "log: local rank 2" in app.log_pane.bar_text
        assert logview(app).lines == src.logs.lines(2)  # untagged, this rank only
        assert logview(app).lines[0] == "[RANK 2] start: restart_count=0 world_size=4 pid=5102"
        await pilot.press("a")
        assert "log: all ranks" in app.log_pane.bar_text
        assert len(logview(app).lines) == 28
        assert {ln.split()[0] for ln in logview(app).lines} == {"[0]", "[1]", "[2]", "[3]"}
        await pilot.press("up", "enter")  # enter on a row: that rank's log
        assert "log: local rank 1" in app.log_pane.bar_text
        assert all(ln.startswith("[RANK 1]") for ln in logview(app).lines)

    drive("healthy", check)


def test_clicking_a_row_selects_its_rank() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        # The table has a round border and a header row: row i is at y = 2 + i inside it.
        await pilot.click("#workers", offset=(5, 2 + 3))
        await pilot.pause()
        assert app.selected_rank() == 3

    drive("healthy", check)


def test_filter_input() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        box = app.query_one("#filter-input", Input)
        assert not box.display
        await pilot.press("slash")
        assert box.display and box.has_focus
        await pilot.press(*"epoch 3")
        assert box.value == "epoch 3"
        assert "filter: 'epoch 3'" in app.log_pane.bar_text
        assert len(logview(app).lines) == 4
        assert all("Epoch 3" in ln for ln in logview(app).lines)
        # While typing, letters go to the input, not to the dashboard's keys.
        assert src.actions == [] and not isinstance(app.screen, ConfirmScreen)
        # Enter keeps the filter (the bar shows it) and closes the box: focus back on the table.
        await pilot.press("enter")
        assert app._table.has_focus and not box.display
        assert len(logview(app).lines) == 4
        await pilot.press("slash")
        assert box.has_focus and box.value == "epoch 3"
        await pilot.press("escape")  # clears and closes
        assert not box.display
        assert app._table.has_focus
        assert "filter" not in app.log_pane.bar_text
        assert len(logview(app).lines) == 28

    drive("healthy", check)


def test_streams_cycle() -> None:
    src = scenarios.healthy()
    add_lines(src, 0, ["a warning on stderr"], stream="stderr")
    src.settle_logs()

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert "[0 err] a warning on stderr" in logview(app).lines
        assert len(logview(app).lines) == 29
        await pilot.press("e")
        assert "streams: stdout" in app.log_pane.bar_text
        assert len(logview(app).lines) == 28
        await pilot.press("e")
        assert "streams: stderr" in app.log_pane.bar_text
        assert logview(app).lines == ["[0 err] a warning on stderr"]
        await pilot.press("e")
        assert "streams: both" in app.log_pane.bar_text
        assert len(logview(app).lines) == 29

    drive(src, check)


@pytest.mark.slow
def test_follow_pauses_when_scrolled_up_and_f_resumes() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        add_lines(src, 0, [f"filler {i}" for i in range(60)])
        await wait_until(pilot, lambda: len(logview(app).lines) == 88)
        assert logview(app).is_vertical_scroll_end
        assert app.log_pane.bar_text.endswith("following")

        logview(app).scroll_home(animate=False)
        await pilot.pause()
        add_lines(src, 1, [f"late line {i}" for i in range(7)])
        await wait_until(pilot, lambda: "paused" in app.log_pane.bar_text)
        assert "paused, 7 new line(s)" in app.log_pane.bar_text
        assert len(logview(app).lines) == 88  # nothing written while paused
        add_lines(src, 2, ["later still"])
        await wait_until(pilot, lambda: "paused, 8 new line(s)" in app.log_pane.bar_text)

        await pilot.press("f")
        assert app.log_pane.bar_text.endswith("following")
        assert len(logview(app).lines) == 96
        assert logview(app).lines[-1] == "[2] later still"
        await pilot.pause()
        assert logview(app).is_vertical_scroll_end

    drive("healthy", check)


def bar_fits(app: Dashboard) -> bool:
    """The log bar's text fits its width, whole (no cell of it cut)."""
    bar = app.query_one("#logbar", Static)
    return 0 < cell_len(app.log_pane.bar_text) <= bar.content_size.width


def last_line_is(app: Dashboard, line: str) -> Callable[[], bool]:
    return lambda: logview(app).lines[-1:] == [line]


def size_is(app: Dashboard, size: tuple[int, int]) -> Callable[[], bool]:
    return lambda: tuple(app.size) == size


async def still_following(pilot: Pilot, app: Dashboard, src: FakeSource, tag: str) -> None:
    """Lines that arrive over several of the log's writes are all shown, at the bottom."""
    for tick in range(3):
        last = f"{tag} {tick} " + "x" * 150  # wider than the view
        add_lines(src, tick % 2, [f"{tag} {tick}.{i}" for i in range(40)] + [last])
        await wait_until(pilot, last_line_is(app, f"[{tick % 2}] {last}"))
        await pilot.pause()
        assert app.log_pane.following, app.log_pane.bar_text
        assert logview(app).is_vertical_scroll_end
        assert app.log_pane.bar_text.endswith("following")
        assert bar_fits(app), app.log_pane.bar_text


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
def test_a_narrow_dashboard_follows_the_log_and_its_bar_fits(size: tuple[int, int]) -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await still_following(pilot, app, src, "narrow")

        logview(app).scroll_home(animate=False)
        await pilot.pause()
        add_lines(src, 1, [f"late line {i}" for i in range(603)])
        await wait_until(pilot, lambda: "paused" in app.log_pane.bar_text)
        bar = app.log_pane.bar_text
        assert "paused, 603 new" in bar and bar.endswith("— f to follow"), bar
        assert bar_fits(app), bar
        await pilot.press("f")
        assert app.log_pane.following
        await pilot.pause()
        assert logview(app).is_vertical_scroll_end

    drive("healthy", check, size=size)


@pytest.mark.slow
def test_shrinking_a_running_dashboard_keeps_following_the_log() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await still_following(pilot, app, src, "wide")
        for size in [(100, 30), (80, 24), (150, 42), (80, 24)]:
            await pilot.resize_terminal(*size)
            await wait_until(pilot, size_is(app, size))
            await pilot.pause()
            await still_following(pilot, app, src, f"at {size}")

    drive("healthy", check)


def test_the_log_view_and_buffer_stay_bounded() -> None:
    buf = LogBuffer(per_rank=1000, merged=3000)
    src = LogSource(0, 0, 0, "stdout", "", False, None)
    for i in range(100):
        buf(src, [f"line {i}-{j}" for j in range(1000)])
    assert buf.seq == 100_000
    assert len(buf.since(0)) <= 3000
    assert len(buf.since(0, 0)) <= 1000
    assert buf.since(0)[-1][3] == "line 99-999"

    default = LogBuffer()
    for i in range(100):
        default(src, [f"line {i}-{j}" for j in range(1000)])
    assert len(default.since(0)) == 20_000
    assert len(default.since(0, 0)) == 5000

    async def check(pilot: Pilot, app: Dashboard, fsrc: FakeSource) -> None:
        for i in range(20):
            add_lines(fsrc, i % 4, [f"flood {i}-{j}" for j in range(5000)])
        await wait_until(pilot, lambda: logview(app).lines[-1:] == ["[3] flood 19-4999"])
        # The view prunes in batches (see LogView._prune_max_lines): a tenth over at most.
        assert len(logview(app).lines) <= LOG_LINES_SHOWN * 1.1
        view = logview(app)
        for i in range(300):  # written 100 at a time, as the dashboard does
            view.write_lines([f"steady {i}-{j}" for j in range(100)], scroll_end=True)
            assert len(view.lines) <= LOG_LINES_SHOWN * 1.1
        assert view.lines[-1] == "steady 299-99"
        await pilot.pause()
        assert view.is_vertical_scroll_end
        assert len(fsrc.logs.since(0)) <= 20_000

    drive("healthy", check)


# ------------------------------------------------------------------------------------ tabs, help


def test_root_cause_key_and_tabs() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert app._tabs.active == "logs-tab"
        await pilot.press("c")
        assert app._tabs.active == "cause-tab"
        await pilot.pause()
        assert app.query_one("#rootcause").region.height > 0  # visible now
        await pilot.press("a")  # back to the logs
        assert app._tabs.active == "logs-tab"
        await pilot.press("c", "slash")  # the filter brings the logs tab back too
        assert app._tabs.active == "logs-tab"

    drive("failure", check)


def test_tab_bar_mouse_and_keys() -> None:
    """Every tab by mouse (a click on its label) and by keys (Tab to the bar, then
    left/right); exactly one pane is shown at a time."""

    def shown(app: Dashboard) -> list[str]:
        return [t for t in app._tabs.tab_ids if app.query_one(f"#{t}").display]

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        bar = app._tabs
        assert shown(app) == ["logs-tab"]
        x = 1
        for tab_id, label in zip(
            bar.tab_ids, ("Logs", "Root cause", "Agent log", "Cluster", "Stacks"), strict=True
        ):
            await pilot.click("#tabs", offset=(x + len(label) // 2, 0))
            await pilot.pause()
            assert bar.active == tab_id and shown(app) == [tab_id]
            x += len(label) + 2
        # the stacks tab draws when shown
        assert "No stack dump yet" in text_of(app.panel("stacks"))
        await pilot.click("#tabs", offset=(x + 30, 0))  # past the labels: nothing changes
        assert bar.active == "stacks-tab"
        bar.focus()
        await pilot.press("right")  # wraps round to the first
        assert bar.active == "logs-tab" and shown(app) == ["logs-tab"]
        await pilot.press("left", "left", "left")
        assert bar.active == "agent-tab"
        assert app.query_one("#agentlog").region.height > 0

    drive("multinode", check)


def test_d_dumps_every_rank_off_the_ui_thread_and_shows_the_stacks_tab() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("d")
        await wait_until(pilot, lambda: app._tabs.active == "stacks-tab")
        assert src.actions == [("dump", None, None)]
        await wait_until(pilot, lambda: "load_batch" in text_of(app.panel("stacks")))
        text = text_of(app.panel("stacks"))
        assert "stacks (key)" in text
        assert "rank 1 is not in a collective: data.py:41 in load_batch" in text
        assert "ranks 0, 2, 3  \u00d7 3 ranks" in text
        assert "rank 1  <- odd one out" in text
        assert text.index("rank 1  <- odd one out") < text.index("\u00d7 3 ranks")  # odd first
        await pilot.press("d")  # a second dump: the first is listed as an earlier one
        await wait_until(pilot, lambda: "earlier dumps" in text_of(app.panel("stacks")))
        assert "/runs/demo/stacks/000-key" in text_of(app.panel("stacks"))

    drive("healthy", check)


def _fr_verdict(tmp: str, world: int, culprits: tuple[int, ...]) -> FlightRecorderVerdict:
    """The event the live watch posts for NCCL-format dumps of ``world`` ranks (``tmp``: where
    :mod:`tui_launch.testing.frgen` writes them), judged by ``tuilaunch why``'s judge."""
    from tui_launch.core.diagnosis import frdump, frjudge
    from tui_launch.testing import frgen

    frgen.generate(tmp, world, culprits, tp=2, pp=2, ep=2)
    return frjudge.judge(frdump.load_dir(tmp)).event(0, "nccl", f"{tmp}/nccl_trace_rank_")


def test_the_stacks_tab_shows_the_flight_recorder_verdict_first_and_follows_new_dumps(
    tmp_path,
) -> None:
    """Issue 34: NCCL's dumps judged while the run runs: the Stacks tab's first line is the
    verdict (before the hang rule and the stacks), the groups that name the rank below it;
    a later set of dumps (a second timeout, another culprit) replaces it while the tab shows."""
    first = _fr_verdict(str(tmp_path / "a"), 4, (1,))
    second = _fr_verdict(str(tmp_path / "b"), 8, (6,))

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        app._tabs.active = "stacks-tab"
        await wait_until(pilot, lambda: "load_batch" in text_of(app.panel("stacks")))
        assert "flight recorder" not in text_of(app.panel("stacks"))
        src.post(first)
        await wait_until(pilot, lambda: "flight recorder" in text_of(app.panel("stacks")))
        lines = text_of(app.panel("stacks")).splitlines()
        assert lines[0].startswith("flight recorder  (4 NCCL dumps, attempt 0;"), lines[0]
        assert lines[1] == first.verdict and lines[1].startswith("rank 1 never issued ")
        assert lines[2] == "10 of 13 process groups wait:", lines[2]
        assert lines[3] == (
            "  TENSOR_MODEL_PARALLEL_GROUP pg 1 (ranks 0, 1): rank 1 never issued "
            "_all_gather_base #1001; rank 0 waits in it"
        ), lines[3]
        text = "\n".join(lines)
        assert "8 more groups wait, 8 with no member out of step" in text
        assert text.index(first.verdict) < text.index("stacks (hang-confirm)")
        src.post(second)
        await wait_until(pilot, lambda: "(8 NCCL dumps" in text_of(app.panel("stacks")))
        text = text_of(app.panel("stacks"))
        assert second.verdict.startswith("rank 6 never issued ") and second.verdict in text
        assert first.verdict not in text

    drive("hung", check)


def test_the_stacks_tab_lists_the_process_groups_of_a_dumps_records() -> None:
    """Issue 34: a dump with the ranks' records: under its verdict and each rank's last
    collective, every process group that names a rank, as tuilaunch why's judge sees them."""
    from tui_launch.core.model.events import CollectiveVerdictFound, FrGroup, RankCollective

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        app._tabs.active = "stacks-tab"
        await wait_until(pilot, lambda: "load_batch" in text_of(app.panel("stacks")))
        path = src.snapshot().dumps[-1].path
        tp = FrGroup(
            "TENSOR_MODEL_PARALLEL_GROUP pg 1",
            "0, 1",
            "never_issued",
            "rank 1 never issued all_reduce #41; rank 0 waits in it",
        )
        dp = FrGroup(
            "DATA_PARALLEL_GROUP pg 3",
            "2, 3",
            "same",
            "both members wait in all_reduce #41: no member out of step",
        )
        ranks = tuple(RankCollective(r, "all_reduce", 41 if r != 1 else 40) for r in range(4))
        verdict = (
            "rank 1 never issued all_reduce #41 (it is in data.py:41 in load_batch); "
            "ranks 0, 2, 3 wait in it"
        )
        src.post(CollectiveVerdictFound(0, verdict, "behind", (1,), ranks, path, (tp, dp)))
        await wait_until(pilot, lambda: "TENSOR_MODEL" in text_of(app.panel("stacks")))
        lines = text_of(app.panel("stacks")).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("last collective: "))
        assert lines[at + 1] == f"  {tp.label} (ranks 0, 1): {tp.text}", lines[at : at + 3]
        assert (
            lines[at + 2]
            == "  ... 1 more groups wait, 1 with no member out of step (tuilaunch why)"
        )

    drive("hung", check)


def test_the_workers_table_shows_each_ranks_last_collective_while_polled() -> None:
    # --flight-recorder: the live poll's sample adds the `collective` column, the newest
    # collective and how long the rank has been at it; yellow from 10 s; "-" without a record.
    from tui_launch.core.model.events import CollectiveSample, RankCollective

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert "collective" not in app._table.column_labels  # no poll, no column
        src.post(
            CollectiveSample(
                attempt=0,
                ranks=(
                    RankCollective(0, "all_reduce", 41, waiting=12.0),
                    RankCollective(1, "all_reduce", 40, waiting=0.2),
                    RankCollective(2, "all_reduce", 41, waiting=12.0),
                    RankCollective(3, error="no answer"),
                ),
            )
        )
        src.clock += 1.0  # the table is redrawn with the clock's second
        # Shown at the width of a laptop's terminal: the GPU detail gives way first.
        await wait_until(pilot, lambda: "collective" in app._table.shown_columns)
        col = list(app._table.column_labels).index("collective")
        cells = {i: app._table.get_row_at(i)[col] for i in range(app._table.row_count)}
        assert [c.plain for c in cells.values()] == [
            "all_reduce #41 12s",
            "all_reduce #40",
            "all_reduce #41 12s",
            "-",
        ]
        assert str(cells[0].style) == "yellow" and str(cells[1].style) == ""

    drive("healthy", check)


def test_hang_flags_the_rank_and_is_the_root_cause() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        rows = {r[0]: r[3] for r in row_texts(app._table)}
        assert rows["1"] == "running HUNG?" and rows["0"] == "running"
        await pilot.press("c")
        cause = text_of(app.panel("rootcause"))
        assert "hang" in cause and "hung: no main-thread stack moved in 10 s" in cause
        assert "rank 1 is not in a collective" in cause

    drive("hung", check)


def test_hung_flag_goes_when_the_ranks_move_again() -> None:
    from tui_launch.core.model.events import HangCleared

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert {r[0]: r[3] for r in row_texts(app._table)}["1"] == "running HUNG?"
        src.post(HangCleared(attempt=0, ranks=(1,), why="output", detail="rank 1 wrote again"))
        await wait_until(
            pilot, lambda: {r[0]: r[3] for r in row_texts(app._table)}["1"] == "running"
        )
        await pilot.press("c")
        cause = text_of(app.panel("rootcause"))
        assert "over: the ranks move again (rank 1 wrote again)" in cause

    drive("hung", check)


def test_d_is_hidden_when_no_rank_runs() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert "Stacks" not in await shown_keys(pilot, app)
        await pilot.press("d")
        await pilot.pause()
        assert src.actions == [] and app._tabs.active == "logs-tab"

    drive("finished", check)


def test_help_screen() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = text_of(app.screen.query_one("#help-text", Static))
        keys = ("up/down", "k ", "t ", "s ", "r ", "i ", "l, enter", "a ", "/ ", "f ", "e ", "c ")
        for key in (*keys, "n ", "ctrl+p", "q ", "?"):
            assert key in help_text, key
        first = app.screen
        assert "SIGKILL" in help_text and "no failure budget" in help_text
        await pilot.press("k")  # keys of the dashboard do nothing under the help
        assert isinstance(app.screen, HelpScreen) and src.actions == []
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")  # the same screen again, not built anew
        assert app.screen is first and "SIGKILL" in text_of(first.query_one("#help-text", Static))
        await pilot.press("question_mark")
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running

    drive("healthy", check)


# ------------------------------------------------------------------------------------ quit


def test_quit_running_job_asks_stops_and_exits_with_its_code() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert app.is_running and src.actions == []
        await pilot.press("q", "y")
        await wait_until(pilot, lambda: not app.is_running)

    app = drive("healthy", check)
    src = app.source
    assert isinstance(src, FakeSource)
    assert src.actions == [("stop", None, int(signal.SIGTERM))]
    assert app.return_value == 143
    assert app.clean_exit


def test_quit_without_confirm() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running)

    app = drive("healthy", check, confirm=False)
    assert app.source.actions == [("stop", None, 15)]  # type: ignore[attr-defined]
    assert app.return_value == 143


@pytest.mark.parametrize(("state", "code"), [("finished", 0), ("failure", 1)])
def test_quit_finished_job_exits_at_once_with_its_code(state: str, code: int) -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running)

    app = drive(state, check)
    assert not app.source.actions  # type: ignore[attr-defined]
    assert app.return_value == code
    assert app.clean_exit


def test_exit_on_finish() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.pause(0.2)
        assert app.is_running
        src.post(
            RunFinished(outcome="failed", exit_code=1, message="rank 1 failed", mono=1096.0, wall=0)
        )
        await wait_until(pilot, lambda: not app.is_running)

    app = drive("healthy", check, exit_on_finish=True)
    assert app.return_value == 1
    assert app.clean_exit


def test_the_end_of_the_run_is_acted_on_at_once_not_at_the_next_tick() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.pause(0.2)
        for timer in list(app._timers):  # no more ticks: only the notification is left
            timer.pause()
        loop = asyncio.get_running_loop()
        posted = loop.time()
        # From another thread, as the agent's thread posts it.
        await asyncio.to_thread(
            src.post,
            RunFinished(outcome="succeeded", exit_code=0, message="ok", mono=1096.0, wall=0),
        )
        await wait_until(pilot, lambda: not app.is_running)
        assert loop.time() - posted < 2.0

    app = drive("healthy", check, exit_on_finish=True)
    assert app.return_value == 0


def test_without_exit_on_finish_the_dashboard_stays() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        src.post(RunFinished(outcome="succeeded", exit_code=0, message="ok", mono=1096.0, wall=0))
        await pilot.pause(0.3)
        assert app.is_running
        assert "SUCCEEDED" in text_of(app.panel("header"))
        assert not app.check_action("kill", ())
        assert "Kill" not in await shown_keys(pilot, app)

    drive("healthy", check)


# ------------------------------------------------------------------------------------ hiding


def test_keys_hidden_when_the_job_is_finished() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        for action in ("kill", "term", "stop_continue", "restart"):
            assert app.check_action(action, ()) is False, action
        labels = await shown_keys(pilot, app)
        for hidden in ("Kill", "SIGTERM", "Stop/Cont", "Restart"):
            assert hidden not in labels
        assert "Quit" in labels and "Rank log" in labels
        await pilot.press("k", "t", "s", "r")  # hidden keys do nothing
        assert not isinstance(app.screen, ConfirmScreen)
        assert src.actions == []

    drive("finished", check)


def test_keys_hidden_with_no_ranks() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        for action in ("kill", "term", "stop_continue", "restart", "rank_log"):
            assert app.check_action(action, ()) is False, action
        labels = await shown_keys(pilot, app)
        for hidden in ("Kill", "SIGTERM", "Stop/Cont", "Restart", "Rank log"):
            assert hidden not in labels
        assert "Quit" in labels and "All logs" in labels
        await pilot.press("k", "l")
        assert not isinstance(app.screen, ConfirmScreen)
        assert src.actions == []
        assert "all ranks" in app.log_pane.bar_text

    drive("waiting", check)


def test_keys_hidden_for_an_exited_rank() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        # Restarting: the ranks of attempt 0 are gone; no signal, no manual restart.
        assert app.selected_rank() == 0
        for action in ("kill", "term", "stop_continue", "restart"):
            assert app.check_action(action, ()) is False, action
        assert app.check_action("rank_log", ())
        assert "Kill" not in await shown_keys(pilot, app)

    drive("restarting", check)


# ------------------------------------------------------------------------------ action table

# The live dashboard's keys (the replay keys are checked in test_replay.py).
BOUND = [
    a for a in actions.ACTIONS if a.name and a.bound_keys and a.needs is not actions.Needs.REPLAY
]


def test_the_app_is_built_from_the_action_table() -> None:
    """Bindings (the footer's order), help rows and palette entries all come from the table."""
    bound_all = [a.name for a in actions.ACTIONS if a.name and a.bound_keys]
    assert [b.action for b in Dashboard.BINDINGS] == bound_all  # type: ignore[union-attr]
    # Every action has its method: the view's on the app, the acting keys' on the
    # RunCommands the app holds, the replay cursor's on the replay's mode only (a live
    # dashboard carries none of them).
    for a in actions.ACTIONS:
        if a.name and a.needs is actions.Needs.REPLAY:
            assert callable(getattr(ReplayMode, f"action_{a.name}", None)), a.name
            assert not hasattr(Dashboard, f"action_{a.name}"), a.name
        elif a.name:
            owners = (Dashboard, RunCommands)
            assert any(callable(getattr(o, f"action_{a.name}", None)) for o in owners), a.name
    rows = actions.help_rows()
    assert rows[0] == ("up/down", "select a rank (mouse works too)")
    assert rows[-1] == ("?", "this help")  # the help's own key last
    assert ("l, enter", "show the selected rank's log") in rows
    replay_only = [a for a in actions.ACTIONS if a.needs is actions.Needs.REPLAY]
    assert len(rows) == len(actions.ACTIONS) - len(replay_only)
    assert len(actions.help_rows(replay=True)) == len(actions.ACTIONS)


def _recording_dashboard(calls: list[str]) -> type[Dashboard]:
    """A Dashboard whose every table action only records that it ran."""

    def recorder(name: str) -> Callable[[Dashboard], None]:
        return lambda self: calls.append(name)

    methods = {f"action_{a.name}": recorder(a.name) for a in actions.ACTIONS if a.name}
    return type("RecordingDashboard", (Dashboard,), methods)


@pytest.mark.slow
def test_every_action_is_reachable_by_its_keys_and_the_palette() -> None:
    calls: list[str] = []
    app = _recording_dashboard(calls)(scenarios.healthy(), refresh_hz=20.0)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()

            async def apply_filter() -> None:
                # Esc clears a filter: it applies (and is offered) only while there is one.
                app.log_pane.open_filter()
                await pilot.press("x", "enter")
                app._table.focus()

            for action in BOUND:
                for key in action.bound_keys:
                    if action.needs is actions.Needs.FILTER:
                        await apply_filter()
                    calls.clear()
                    await pilot.press(key)
                    await wait_until(pilot, lambda: calls)
                    assert calls == [action.name], (key, calls)
            calls.clear()
            await pilot.press("enter")  # enter on a row: the rank's log, through the table
            await wait_until(pilot, lambda: calls)
            assert calls == ["rank_log"]
            await apply_filter()
            commands = {str(c.title): c for c in app.get_system_commands(app.screen)}
            for action in actions.palette():
                calls.clear()
                app.call_later(commands[action.palette].callback)  # as the palette runs it
                await wait_until(pilot, lambda: calls)
                assert calls == [action.name], action.palette

    asyncio.run(main())


@pytest.mark.slow
def test_destructive_actions_ask_first_and_the_others_do_not() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        main = app.screen
        for action in BOUND:
            if action.name == "detach":
                continue  # D leaves the dashboard by design (test_d_detaches)
            await pilot.press(action.bound_keys[0])
            await pilot.pause()
            asked = isinstance(app.screen, ConfirmScreen)
            assert asked == action.destructive, action.name
            await pilot.press("n" if asked else "escape")  # no / close what opened
            await wait_until(pilot, lambda: app.screen is main)
            if not asked:
                app._table.focus()  # the filter box, say, keeps the keys otherwise
        # Nothing was done without a yes (a stack dump reads the ranks, it changes nothing).
        assert [a for a in src.actions if a[0] != "dump"] == []
        assert app.is_running

    drive("healthy", check)


def test_d_detaches() -> None:
    """D leaves at once (nothing is stopped: it is not destructive) and says it detached."""

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert app.check_action("detach", ())
        await pilot.press("D")
        await wait_until(pilot, lambda: not app.is_running)
        assert app.detached and app.clean_exit and src.actions == []

    drive("healthy", check)


def test_rank_actions_are_hidden_with_no_rank_selected() -> None:
    needs_rank = (actions.Needs.RANK, actions.Needs.LIVE_RANK)
    rank_actions = [a for a in actions.ACTIONS if a.name and a.needs in needs_rank]
    assert {a.name for a in rank_actions} >= {"kill", "term", "stop_continue", "inject"}

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        assert app.selected_rank() is None
        labels = await shown_keys(pilot, app)
        titles = _palette_titles(app)
        for a in rank_actions:
            assert app.check_action(a.name, ()) is False, a.name
            assert a.label not in labels, a.name
            assert not a.palette or a.palette not in titles, a.name
        for a in actions.ACTIONS:
            if a.name and a.needs is actions.Needs.NOTHING and a.footer:
                assert a.label in labels, a.name
        await pilot.press(*(a.bound_keys[0] for a in rank_actions))
        assert app.screen is app.screen_stack[0] and src.actions == []

    drive("waiting", check)


# ------------------------------------------------------------------------------------ palette


def _palette_titles(app: Dashboard) -> list[str]:
    return [str(cmd.title) for cmd in app.get_system_commands(app.screen)]


def test_command_palette_entries() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        titles = _palette_titles(app)
        for title in (
            "Kill the selected rank",
            "Terminate the selected rank",
            "Stop / continue the selected rank",
            "Restart the worker group",
            "Show the selected rank's log",
            "Show all ranks' logs, merged",
            "Show the root cause",
            "Show the cluster tab",
            "Show the agent log",
            "Stop the job and quit",
        ):
            assert title in titles
        # Running an entry is the same as its key.
        entry = next(c for c in app.get_system_commands(app.screen) if c.title.startswith("Kill"))
        app.call_later(entry.callback)  # as the palette runs it
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: src.actions)
        assert src.actions == [("signal", 0, 9)]

    async def finished(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        titles = _palette_titles(app)
        assert "Kill the selected rank" not in titles
        assert "Restart the worker group" not in titles
        assert "Show the root cause" in titles

    drive("healthy", check)
    drive("finished", finished)


def test_command_palette_has_no_duplicates_and_real_descriptions() -> None:
    """Issue 23: Textual's "Quit" (ours stops the job first) and "Keys" (the help is ?) are
    gone; no entry repeats its title as its description."""

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        commands = list(app.get_system_commands(app.screen))
        titles = [str(c.title) for c in commands]
        assert "Quit" not in titles and "Keys" not in titles, titles
        assert titles.count("Stop the job and quit") == 1
        assert "Theme" in titles  # Textual's entries that make sense stay
        for c in commands:
            assert c.help != c.title, c.title
        ours = {a.palette for a in actions.palette()}
        described = [c for c in commands if c.title in ours]
        assert described and all(c.help for c in described), [c.title for c in described]

    drive("healthy", check)


def test_command_palette_opens_and_finds_kill() -> None:
    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "CommandPalette")
        await pilot.press(*"kill")
        commands = app.screen.query_one(CommandList)

        def prompts() -> list[str]:
            return [
                str(commands.get_option_at_index(i).prompt) for i in range(commands.option_count)
            ]

        await wait_until(pilot, lambda: any("Kill the selected rank" in p for p in prompts()))
        await pilot.press("escape")
        await wait_until(pilot, lambda: type(app.screen).__name__ != "CommandPalette")
        assert src.actions == []

    drive("healthy", check)


# ------------------------------------------------------------------------------ regressions


@pytest.mark.parametrize("how", ["ctrl+q", "palette"])
def test_every_quit_path_goes_through_quit_job(how: str) -> None:
    """ctrl+q (Textual's priority quit) and the palette's quit confirm and stop like q."""

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        if how == "ctrl+q":
            await pilot.press("ctrl+q")
        else:
            commands = app.get_system_commands(app.screen)
            quit_cmd = next(c for c in commands if c.title == "Stop the job and quit")
            app.call_later(quit_cmd.callback)  # as the palette runs it
        await pilot.pause(0.2)
        # Like q: a running job is not left behind without asking.
        assert app.is_running and isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: not app.is_running)

    app = drive("healthy", check)
    assert app.source.actions == [("stop", None, 15)]  # type: ignore[attr-defined]
    assert app.return_value == 143 and app.clean_exit


def shown_rows(table: WorkersTable) -> list[str]:
    """The workers table's body as drawn on screen (what the user reads)."""
    return [table.render_line(y).text for y in range(1, table.row_count + 1)]


@pytest.mark.parametrize("change", ["exit", "pid"])
def test_updated_cells_are_shown_whole(change: str) -> None:
    """A cell that grows (an exit, a longer pid in the next attempt) widens its column."""

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        table = app._table
        assert "5101" in shown_rows(table)[1]
        src.post(
            RankExited(
                attempt=0,
                local_rank=1,
                global_rank=1,
                pid=5101,
                exit_code=-9,
                signal="SIGKILL",
                by_agent=False,
                **builders.at(94),
            )
        )
        if change == "pid":
            for event in builders.attempt(1, 2, 94.5, 123456):  # the next attempt, longer pids
                src.post(event)
        expected = "SIGKILL (-9)" if change == "exit" else "123457"
        await wait_until(pilot, lambda: expected in row_texts(table)[1])
        # The column widens on the table's next repaint.
        await wait_until(pilot, lambda: expected in shown_rows(table)[1])
        shown = shown_rows(table)[1]
        if change == "exit":
            assert row_texts(table)[1][4] == "SIGKILL (-9)"  # the cell holds it...
            assert "SIGKILL (-9)" in shown  # ...and the screen shows it
        else:
            assert row_texts(table)[1][2] == "123457"
            assert "123457" in shown

    drive(scenarios.healthy(2), check)


def test_textual_logging_still_works() -> None:
    """``textual.log`` reaches Textual's logger (``App._log``) and a connected devtools client.

    The dashboard once kept its log widget in ``self._log``, shadowing ``App._log``: every
    ``textual.log`` call then failed while devtools was attached. Here a stand-in client is
    attached (``App.devtools``, and a stand-in ``textual_dev.client`` where it is not
    installed) and the message must arrive at it.
    """
    import sys
    import types
    from unittest import mock

    from textual import log

    received: list[object] = []

    class Client:
        is_connected = True
        verbose = False

        def log(self, message: object, *_: object) -> None:
            received.append(message)

    class DevtoolsLog:
        def __init__(self, objects: object, caller: object = None) -> None:
            self.objects = objects

    stub = types.ModuleType("textual_dev.client")
    stub.DevtoolsLog = DevtoolsLog  # type: ignore[attr-defined]
    modules = {"textual_dev": types.ModuleType("textual_dev"), "textual_dev.client": stub}

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        with mock.patch.object(app, "devtools", Client()), mock.patch.dict(sys.modules, modules):
            log("hello from a test")
        assert [getattr(m, "objects", None) for m in received] == [("hello from a test",)]

    drive("healthy", check)


@pytest.mark.parametrize("outcome", ["stopped", "failed"])
def test_a_run_stopped_from_outside_closes_the_dashboard(outcome: str) -> None:
    """SIGTERM/^C/SIGHUP to tuilaunch (outcome stopped) ends it: the terminal may be gone, and
    nobody left to press q. A failed run keeps the dashboard open on its root cause."""
    code = 129 if outcome == "stopped" else 1

    async def check(pilot: Pilot, app: Dashboard, src: FakeSource) -> None:
        src.post(RunFinished(outcome=outcome, exit_code=code, message="", **builders.at(120)))
        if outcome == "stopped":
            await wait_until(pilot, lambda: not app.is_running)
        else:
            await pilot.pause(0.5)
            assert app.is_running
            await pilot.press("q")
            await wait_until(pilot, lambda: not app.is_running)

    app = drive("healthy", check)
    assert app.return_value == code


def test_on_ready_runs_once_after_the_first_frame() -> None:
    """``on_ready`` (run_dashboard passes gc.freeze) comes once, with the panels on screen."""
    calls: list[int] = []
    src = scenarios.STATES["healthy"]()

    def ready() -> None:
        calls.append(app.query_one("#header", Static).region.height)  # laid out: > 0

    app = Dashboard(src, refresh_hz=20.0, on_ready=ready)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.pause(0.2)

    asyncio.run(main())
    assert len(calls) == 1 and calls[0] > 0, calls
