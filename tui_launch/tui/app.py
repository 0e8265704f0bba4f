"""The dashboard: a Textual cockpit onto a running job.

It reads store snapshots at a bounded rate (``--refresh-hz``, 4 Hz by default) and redraws only
what changed on a new store version; it never blocks the agent, and workers never wait on it.
Commands go through the runner's control API. Quitting stops the workers cleanly; the CLI then
prints the headless summary and exits with the job's exit code.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.console import RenderableType
from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from tui_launch.core.logs import LogLine
from tui_launch.core.store import Snapshot
from tui_launch.tui import render
from tui_launch.tui.logview import LogView
from tui_launch.tui.screens import ConfirmScreen, HelpScreen, InjectScreen
from tui_launch.tui.source import Source
from tui_launch.tui.table import WorkersTable
from tui_launch.tui.tabs import TabBar

HELP_ROWS = [
    ("up/down", "select a rank (mouse works too)"),
    ("k", "kill the selected rank (SIGKILL)"),
    ("t", "terminate the selected rank (SIGTERM)"),
    ("s", "stop / continue the selected rank (SIGSTOP / SIGCONT)"),
    ("r", "restart the whole worker group (spends no failure budget)"),
    ("i", "inject a failure: kill, hang, slow, exit, exception, node"),
    ("l, enter", "show the selected rank's log"),
    ("a", "show all ranks' logs, merged"),
    ("/", "filter log lines by text"),
    ("f", "follow new log lines"),
    ("e", "cycle streams: both / stdout / stderr"),
    ("c", "show the root cause"),
    ("n", "show every node of the job (the cluster tab)"),
    ("ctrl+p", "command palette"),
    ("q", "quit (stops the job if it runs)"),
    ("?", "this help"),
]

LOG_LINES_SHOWN = 5000
FLOOD_LINES_PER_TICK = 200
# New log lines are appended once a second, in the frame that redraws the clocks anyway (the
# header's elapsed time, the table's ages and telemetry). Each append scrolls the view, and a
# scrolled view is repainted whole; a frame of its own for it cost as much as the clock frame.
LOG_WRITES_HZ = 1.0
STREAMS = ("both", "stdout", "stderr")


class KeyFooter(Footer):
    """Textual's footer, rebuilt only when the keys it would show change.

    The footer rebuilds every key widget whenever its screen's bindings are refreshed,
    including when a dialog or the help closes and the dashboard resumes with the very keys it
    had: that rebuild was most of what closing a dialog cost.
    """

    _shown: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen) -> None:
        """Recompose (as Footer does) unless the same keys would be shown again."""
        keys = tuple(
            (binding.key, binding.description, enabled, tooltip)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show
        )
        if keys == self._shown and self.children:
            return
        self._shown = keys
        super().bindings_changed(screen)


class RunEnded(Message):
    """The run has finished (posted from the agent's thread)."""


class Dashboard(App[int]):
    """tuilaunch's dashboard. ``App.run()`` returns the job's exit code.

    ``on_ready`` is called once, after the first frame is on the screen.
    """

    # Absolute, so that subclasses defined elsewhere find it too.
    CSS_PATH = Path(__file__).with_name("dashboard.tcss")
    TITLE = "tuilaunch"

    BINDINGS = [
        Binding("k", "kill", "Kill", tooltip="SIGKILL the selected rank", id="kill"),
        Binding("t", "term", "SIGTERM", tooltip="SIGTERM the selected rank", id="term"),
        Binding(
            "s", "stop_continue", "Stop/Cont", tooltip="SIGSTOP or SIGCONT the rank", id="stop"
        ),
        Binding(
            "r",
            "restart",
            "Restart",
            tooltip="Restart the worker group (no budget spent)",
            id="restart",
        ),
        Binding(
            "i", "inject", "Inject", tooltip="Inject a failure into the selected rank", id="inject"
        ),
        Binding("l", "rank_log", "Rank log", tooltip="Show the selected rank's log", id="log"),
        Binding("a", "merged_log", "All logs", tooltip="All ranks' logs, merged", id="merged"),
        Binding("slash", "filter", "Filter", tooltip="Filter log lines by text", id="filter"),
        Binding("f", "follow", "Follow", tooltip="Follow new log lines", id="follow"),
        Binding("e", "streams", "Streams", tooltip="stdout+stderr / stdout / stderr", id="streams"),
        Binding("c", "root_cause", "Root cause", tooltip="Show the root-cause tab", id="cause"),
        Binding("n", "cluster", "Cluster", tooltip="Every node of the job", id="cluster"),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("q,ctrl+c", "quit_job", "Quit", tooltip="Stop the job and quit", id="quit"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        refresh_hz: float = 4.0,
        confirm: bool = True,
        exit_on_finish: bool = False,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self._on_ready = on_ready
        self.refresh_hz = max(0.5, refresh_hz)
        self.confirm = confirm
        self.exit_on_finish = exit_on_finish
        self.clean_exit = False
        self._version = -1
        self._second = -1
        self._logbar_text = ""
        self._panel_keys: dict[str | None, object] = {}
        self._panel_heights: dict[str | None, int] = {}
        self._panel_texts: dict[str | None, Text | None] = {}
        self._workers_key: tuple[object, ...] = ()
        self._keys_state: tuple[object, ...] = ()
        self._view_rank: int | None = None  # None: merged view
        self._stream = "both"
        self._filter = ""
        self._follow = True
        self._shown_seq = 0
        self._pending = 0
        self._log_written_at = 0.0
        self._agent_key: tuple[int, str | None] = (-1, None)
        self._quitting = False
        self._finished_seen = False
        self._gpu_shape: tuple[object, ...] | None = None

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        # Widgets are kept as attributes: a modal screen on top must not break the refresh.
        self._header = Static(id="header")
        self._rdzv = Static(id="rendezvous", classes="panel")
        self._restarts = Static(id="restarts", classes="panel")
        self._gpus = Static(id="gpus", classes="panel")
        self._table = WorkersTable(id="workers")
        self._logbar = Static(id="logbar")
        self._filter_box = Input(placeholder="filter log lines (Esc to close)", id="filter-input")
        self._log_view = LogView(id="log", max_lines=LOG_LINES_SHOWN, highlight=False)
        self._cause = Static(id="rootcause")
        self._agent_view = LogView(id="agentlog", max_lines=2000, highlight=False)
        self._cluster = Static(id="cluster")
        yield self._header
        with Horizontal(id="top"):
            with Vertical(id="side"):
                yield self._rdzv
                yield self._restarts
                yield self._gpus
            with Vertical(id="main"):
                yield self._table
                logs = Vertical(self._logbar, self._filter_box, self._log_view, id="logs-tab")
                cause = VerticalScroll(self._cause, id="cause-tab")
                agent = Vertical(self._agent_view, id="agent-tab")
                cluster = VerticalScroll(self._cluster, id="cluster-tab")
                panes = (logs, cause, agent, cluster)
                labels = ("Logs", "Root cause", "Agent log", "Cluster")
                self._tabs = TabBar(
                    [(pane.id or "", label) for pane, label in zip(panes, labels, strict=True)],
                    panes,
                    id="tabs",
                )
                yield self._tabs
                yield from panes
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self._rdzv.border_title = "Rendezvous"
        self._restarts.border_title = "Restarts"
        self._gpus.border_title = "GPUs"
        self._table.set_columns(render.WORKER_COLUMNS)
        self._filter_box.display = False
        self._table.focus()
        self._update_logbar()
        self._tick()
        self.set_interval(1.0 / self.refresh_hz, self._tick)
        if self._on_ready is not None:
            self.call_after_refresh(self._on_ready)

        # The end of the run is shown (and, with --exit-on-finish, acted on) at once, not at
        # the next tick. post_message is safe from the agent's thread.
        def finished() -> None:
            self.post_message(RunEnded())

        self.source.on_finished(finished)

    def on_run_ended(self, _: RunEnded) -> None:
        self._tick()

    # ---------------------------------------------------------------- refresh

    def _tick(self) -> None:
        snap = self.source.snapshot()
        now = self.source.now()
        second = int(now)
        if snap.version == self._version and second == self._second:
            self._update_log(due=False)  # nothing else can have changed within the same second
            return
        clock = second != self._second
        self._second = second
        self._version = snap.version
        # Each panel is redrawn only when what it shows changed: a Textual refresh costs far
        # more than comparing a few fields.
        self._set(
            self._header, (snap.phase, snap.run, snap.finished, second), render.header, snap, now
        )
        rdzv_key = (
            snap.run,
            snap.rendezvous,
            snap.rendezvous_live,
            second if _waiting(snap) else 0,
        )
        self._set(self._rdzv, rdzv_key, render.rendezvous_panel, snap, now)
        # GPU figures arrive mid-second: they wait for the clock's frame, as the table's do,
        # unless what the panel shows changes shape (GPUs appear, go, or are lost).
        tel = snap.telemetry
        shape = None if tel is None else (tel.latest.gpu_state, len(tel.latest.gpus))
        if clock or shape != self._gpu_shape:
            self._gpu_shape = shape
            self._set(self._gpus, (tel,), render.gpu_panel, snap)
        # "Simulated" labels readings; a fake NVML that failed to open has none to label.
        simulated = tel is not None and tel.latest.simulated and bool(tel.latest.gpus)
        title = "GPUs (simulated: fake NVML)" if simulated else "GPUs"
        if self._gpus.border_title != title:
            self._gpus.border_title = title
        self._set(self._cause, (snap.root_cause, len(snap.failures)), render.root_cause_panel, snap)
        if self._tabs.active == "cluster-tab":  # every node's row: only drawn when shown
            self._set(self._cluster, (snap.cluster,), render.cluster_panel, snap, now)
        restarts_key = (snap.attempts, snap.budget_left, snap.restarts_used, snap.finished)
        self._set(self._restarts, restarts_key, render.restarts_panel, snap, now)
        self._refresh_keys(snap)
        # The table's ages ("last log 0s/1s") would flicker on every tick that brings log
        # lines, and a repaint of the table is among the dashboard's costliest: once a
        # second, with the clock (telemetry samples arrive mid-second and wait for it), or at
        # once when a rank changes.
        workers_key = (second, snap.ranks)
        if workers_key != self._workers_key:
            self._workers_key = workers_key
            self._update_workers(snap, now)
        self._update_log(due=clock)
        self._update_agent_log()
        if snap.finished is not None and not self._finished_seen:
            self._finished_seen = True
            # A run stopped from outside (SIGTERM, ^C, SIGHUP when the terminal went away)
            # ends tuilaunch too: nobody may be left to press q, and a dashboard on a closed
            # terminal would otherwise linger.
            if self.exit_on_finish or self._quitting or snap.finished.outcome == "stopped":
                self._leave(snap.finished.exit_code)

    def _update_workers(self, snap: Snapshot, now: float) -> None:
        last_line_at = self.source.logs.last_line_at
        self._table.set_rows(
            [
                (
                    str(r.local_rank),
                    render.rank_cells(r, now, last_line_at.get(r.local_rank), snap.telemetry),
                )
                for r in snap.ranks
            ]
        )

    def _set(
        self, widget: Static, key: object, make: Callable[..., RenderableType], *args: object
    ) -> None:
        if self._panel_keys.get(widget.id) == key:
            return
        self._panel_keys[widget.id] = key
        content = make(*args)
        if isinstance(content, Text) and content == self._panel_texts.get(widget.id):
            return  # a new key, the same words (the GPU panel's "no GPU" line, every sample)
        self._panel_texts[widget.id] = content if isinstance(content, Text) else None
        # A Static's update lays out (and so repaints) the whole screen by default, in case
        # its height changed. Panels change every second (GPU figures, the clock) but rarely
        # change height: measure the new content and lay out only when it did.
        widget.update(content, layout=False)
        if widget is self._header:
            return
        width = widget.content_region.width
        if not width:
            widget.refresh(layout=True)
            return
        height = widget.get_content_height(self.screen.size, self.screen.size, width)
        if self._panel_heights.get(widget.id) != height:
            self._panel_heights[widget.id] = height
            widget.refresh(layout=True)

    def _refresh_keys(self, snap: Snapshot) -> None:
        # Re-checking bindings rebuilds the footer (costly): only when the answer can change.
        rank = self.selected_rank()
        row = snap.rank(rank) if rank is not None else None
        key = (snap.finished is not None, snap.phase, rank, row.state if row else None)
        if key != self._keys_state:
            self._keys_state = key
            self.refresh_bindings()

    def on_workers_table_row_highlighted(self, event: WorkersTable.RowHighlighted) -> None:
        self._refresh_keys(self.source.snapshot())

    def selected_rank(self) -> int | None:
        """Local rank of the row under the cursor, if any."""
        key = self._table.selected_key
        return int(key) if key is not None else None

    # ---------------------------------------------------------------- logs

    def _keep(self, line: LogLine) -> bool:
        _, _, stream, text = line
        if stream != "marker" and self._stream != "both" and stream != self._stream:
            return False
        return not self._filter or self._filter.lower() in text.lower()

    def _format(self, line: LogLine) -> str:
        _, rank, stream, text = line
        if self._view_rank is None and stream != "marker":
            tag = f"[{rank}]" if stream == "stdout" else f"[{rank} err]"
            return f"{tag} {text}"
        return text

    def _rerender_log(self) -> None:
        log = self._log_view
        log.clear()
        lines = [ln for ln in self.source.logs.since(0, self._view_rank) if self._keep(ln)]
        lines = lines[-LOG_LINES_SHOWN:]
        log.write_lines([self._format(ln) for ln in lines], scroll_end=True)
        self._shown_seq = self.source.logs.seq
        self._pending = 0
        self._follow = True
        self._update_logbar()

    def _update_log(self, due: bool = False) -> None:
        """Append what arrived; ``due``: this tick draws the clocks, so it is time anyway."""
        logs = self.source.logs
        if logs.seq == self._shown_seq and not self._pending:
            return
        now = time.monotonic()
        # A tick that is not due writes only when the clock frame is late (1.25 periods).
        if not due and now - self._log_written_at < 1.25 / LOG_WRITES_HZ:
            return
        self._log_written_at = now
        log = self._log_view
        if self._follow and log.line_count and not log.is_vertical_scroll_end:
            self._follow = False  # the user scrolled up: pause, count what arrives
        new = [ln for ln in logs.since(self._shown_seq, self._view_rank) if self._keep(ln)]
        if self._follow:
            # In a flood, a tick writes at most what a screen can show, so keys stay
            # responsive; every line is still in the files (and the buffer, for the filter).
            if len(new) > FLOOD_LINES_PER_TICK:
                skipped = len(new) - FLOOD_LINES_PER_TICK
                new = new[-FLOOD_LINES_PER_TICK:]
                log.write_line(f"... {skipped} lines not shown (all are in the log files) ...")
            if new:
                log.write_lines([self._format(ln) for ln in new], scroll_end=True)
            self._shown_seq = logs.seq
            self._pending = 0
        else:
            self._pending = len(new)
        self._update_logbar()

    def _update_logbar(self) -> None:
        who = "all ranks" if self._view_rank is None else f"local rank {self._view_rank}"
        parts = [f"log: {who}", f"streams: {self._stream}"]
        if self._filter:
            parts.append(f"filter: {self._filter!r}")
        parts.append(
            "following" if self._follow else f"paused, {self._pending} new line(s) — f to follow"
        )
        text = "  |  ".join(parts)
        if text != self._logbar_text:
            self._logbar_text = text
            self._logbar.update(text)

    def _update_agent_log(self) -> None:
        lines = self.source.agent_lines()
        key = (len(lines), lines[-1] if lines else None)  # lines carry timestamps
        if key == self._agent_key:
            return
        log = self._agent_view
        log.clear()
        log.write_lines(lines)
        self._agent_key = key

    # ---------------------------------------------------------------- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide keys that do not apply now (no rank selected, job finished)."""
        snap = self.source.snapshot()
        finished = snap.finished is not None
        if action in ("kill", "term", "stop_continue", "inject"):
            rank = self.selected_rank()
            row = snap.rank(rank) if rank is not None else None
            return not finished and row is not None and row.state in ("running", "stopped")
        if action == "restart":
            return not finished and snap.phase == "running"
        if action == "rank_log":
            return self.selected_rank() is not None
        return True

    def _confirm_then(self, question: str, act: Callable[[], object]) -> None:
        if not self.confirm:
            act()
            return

        def done(yes: bool | None) -> None:
            if yes:
                act()

        self.push_screen(ConfirmScreen(question), done)

    def _signal_selected(self, sig: signal.Signals, verb: str) -> None:
        rank = self.selected_rank()
        if rank is None:
            return
        row = self.source.snapshot().rank(rank)
        who = (
            f"rank {row.global_rank} (local {rank}, pid {row.pid})" if row else f"local rank {rank}"
        )

        def act() -> None:
            ok = self.source.signal_rank(rank, sig, "dashboard")
            self.notify(
                f"{verb} {who}" if ok else f"could not {verb.lower()} {who}",
                severity="information" if ok else "error",
            )

        self._confirm_then(f"{verb} {who}?", act)

    def action_kill(self) -> None:
        """SIGKILL the selected rank."""
        self._signal_selected(signal.SIGKILL, "Kill (SIGKILL)")

    def action_term(self) -> None:
        """SIGTERM the selected rank."""
        self._signal_selected(signal.SIGTERM, "Terminate (SIGTERM)")

    def action_stop_continue(self) -> None:
        """SIGSTOP the selected rank, or SIGCONT it when it is stopped."""
        rank = self.selected_rank()
        if rank is None:
            return
        if self.source.is_stopped(rank):
            self._signal_selected(signal.SIGCONT, "Continue (SIGCONT)")
        else:
            self._signal_selected(signal.SIGSTOP, "Stop (SIGSTOP)")

    def action_inject(self) -> None:
        """Open the inject menu for the selected rank."""
        rank = self.selected_rank()
        row = self.source.snapshot().rank(rank) if rank is not None else None
        if row is None:
            return
        who = f"rank {row.global_rank} (local {rank}, pid {row.pid})"

        def done(spec: str | None) -> None:
            if not spec:
                return
            ok, message = self.source.inject(spec, "dashboard")
            self.notify(message, severity="information" if ok else "error")

        self.push_screen(InjectScreen(who, row.global_rank), done)

    def action_restart(self) -> None:
        """Restart the whole local worker group without spending the failure budget."""

        def act() -> None:
            ok = self.source.restart("dashboard")
            self.notify(
                "restarting the worker group" if ok else "cannot restart now",
                severity="information" if ok else "error",
            )

        self._confirm_then("Restart the whole worker group? (no failure budget spent)", act)

    def action_rank_log(self) -> None:
        """Show the selected rank's log."""
        rank = self.selected_rank()
        if rank is None:
            return
        self._view_rank = rank
        self._tabs.active = "logs-tab"
        self._rerender_log()

    def on_workers_table_row_selected(self, event: WorkersTable.RowSelected) -> None:
        self.action_rank_log()

    def action_merged_log(self) -> None:
        """Show every rank's log, merged, with rank tags."""
        self._view_rank = None
        self._tabs.active = "logs-tab"
        self._rerender_log()

    def action_follow(self) -> None:
        """Resume following new lines (writes what arrived while paused)."""
        self._follow = True
        self._pending = 0
        self._rerender_log()

    def action_streams(self) -> None:
        """Cycle both streams / stdout only / stderr only."""
        self._stream = STREAMS[(STREAMS.index(self._stream) + 1) % len(STREAMS)]
        self._rerender_log()

    def action_filter(self) -> None:
        """Open the log filter."""
        self._tabs.active = "logs-tab"
        box = self._filter_box
        box.display = True
        box.value = self._filter
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter-input":
            self._filter = event.value
            self._rerender_log()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter-input":
            self._table.focus()

    def on_key(self, event: events.Key) -> None:
        box = self._filter_box
        if event.key == "escape" and box.has_focus:
            self._filter = ""
            box.value = ""
            box.display = False
            self._table.focus()
            self._rerender_log()
            event.stop()

    def action_root_cause(self) -> None:
        """Show the root-cause tab."""
        self._tabs.active = "cause-tab"

    def action_cluster(self) -> None:
        """Show the cluster tab: every node of the job."""
        self._tabs.active = "cluster-tab"
        self._tick_cluster()

    def _tick_cluster(self) -> None:
        snap = self.source.snapshot()
        self._set(self._cluster, (snap.cluster,), render.cluster_panel, snap, self.source.now())

    def on_tab_bar_activated(self, event: TabBar.Activated) -> None:
        if event.tab_id == "cluster-tab":
            self._tick_cluster()

    def action_help(self) -> None:
        """Show every key."""
        # One help screen for the whole run, built on first use: pushing an installed screen
        # skips compose and styling, 15-20 ms of CPU instead of ~50 (what a key costs to
        # answer in a log flood, where this thread gets a fraction of a core).
        if not self.is_screen_installed("help"):
            self.install_screen(HelpScreen(HELP_ROWS), "help")
        self.push_screen("help")

    def action_quit_job(self) -> None:
        """Quit; a running job is stopped first (SIGTERM, then SIGKILL after the timeout)."""
        if self.source.done:
            self._leave(self.source.wait(0) or 0)
            return

        def act() -> None:
            self._quitting = True
            self.notify("stopping the workers...")
            self.source.stop(signal.SIGTERM, "quit from the dashboard")
            self._wait_for_end()

        self._confirm_then("The job is running. Stop the workers and quit?", act)

    async def action_quit(self) -> None:
        """Textual's own quit (ctrl+q, the palette's Quit) must stop the job cleanly too."""
        self.action_quit_job()

    @work(thread=True, exit_on_error=False)
    def _wait_for_end(self) -> None:
        code = self.source.wait()
        self.call_from_thread(self._leave, code if code is not None else 1)

    def _leave(self, code: int) -> None:
        self.clean_exit = True
        self.exit(code)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Command palette entries for the dashboard's actions."""
        yield from super().get_system_commands(screen)
        entries = [
            ("kill", "Kill the selected rank", "SIGKILL the selected rank", self.action_kill),
            ("term", "Terminate the selected rank", "SIGTERM the selected rank", self.action_term),
            (
                "stop_continue",
                "Stop / continue the selected rank",
                "SIGSTOP or SIGCONT",
                self.action_stop_continue,
            ),
            ("restart", "Restart the worker group", "no failure budget spent", self.action_restart),
            (
                "inject",
                "Inject a failure into the selected rank",
                "kill, hang, slow, exit, exception, node",
                self.action_inject,
            ),
            ("rank_log", "Show the selected rank's log", "", self.action_rank_log),
            ("merged_log", "Show all logs merged", "", self.action_merged_log),
            ("root_cause", "Show the root cause", "", self.action_root_cause),
            ("quit_job", "Stop the job and quit", "", self.action_quit_job),
        ]
        for action, title, help_text, callback in entries:
            if self.check_action(action, ()):
                yield SystemCommand(title, help_text or title, callback)


def _waiting(snap: Snapshot) -> bool:
    # The join deadline counts down every second only while the rendezvous waits.
    return snap.rendezvous is not None and snap.rendezvous.state == "waiting"
