"""The dashboard: a Textual cockpit onto a running job.

It reads store snapshots at a bounded rate (``--refresh-hz``, 4 Hz by default) and redraws only
what changed on a new store version; it never blocks the agent, and workers never wait on it.
Commands go through the runner's control API. Quitting stops the workers cleanly; the CLI then
prints the headless summary and exits with the job's exit code.

Every key, footer label, help row and palette entry, and when each applies, comes from the
action table (:mod:`tui_launch.tui.actions`). The keys that act on the run are the methods of a
:class:`~tui_launch.tui.commands.RunCommands` the Dashboard holds; what a replay or an attach adds
(the replay bar and cursor keys, following a live journal, the control client's errors) is the
methods of its :class:`~tui_launch.tui.mode.Mode` (:mod:`tui_launch.tui.modes`). Every panel,
where it sits, its title and when it redraws, comes from the panel table
(:data:`~tui_launch.tui.panels.board.PANELS`): the app composes, titles and redraws by looping
over it, each panel in a :class:`CachedPanel` that draws only when the panel's key changed. The
Logs tab is a widget of its own (:mod:`tui_launch.tui.widgets.logpane`), as is the agent log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from textual.actions import ActionParseResult
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.dom import DOMNode
from textual.message import Message
from textual.screen import Screen

from tui_launch.core.model.store import Snapshot
from tui_launch.tui import actions
from tui_launch.tui.commands import RunCommands
from tui_launch.tui.mode import Mode
from tui_launch.tui.panels import ranks as render_ranks
from tui_launch.tui.panels.base import Frame, Panel, Where
from tui_launch.tui.panels.board import PANELS
from tui_launch.tui.panels.inert import inert
from tui_launch.tui.panels.progress import straggler_of
from tui_launch.tui.sources.live import Source
from tui_launch.tui.widgets.cached import CachedPanel, KeyFooter
from tui_launch.tui.widgets.logpane import LogPane
from tui_launch.tui.widgets.logview import LogView
from tui_launch.tui.widgets.screens import HelpScreen
from tui_launch.tui.widgets.table import WorkersTable
from tui_launch.tui.widgets.tabs import TabBar

NARROW_BELOW = 120  # columns: below this the side panels stack (see HORIZONTAL_BREAKPOINTS)
PALETTE_HINT_FROM = 110  # columns: the footer's "^p palette" hint needs this much room
# Textual's own palette entries that the dashboard has better: q (and its palette entry) stops
# the job first, and ? lists every key.
TEXTUAL_COMMANDS_LEFT_OUT = frozenset({"Quit", "Keys", "Hide keys and help panel"})


class RunEnded(Message):
    """The run has finished (posted from the agent's thread)."""


class Dashboard(App[int]):
    """tuilaunch's dashboard. ``App.run()`` returns the job's exit code.

    ``on_ready`` is called once, after the first frame is on the screen; ``mode`` is what a
    replay or an attach adds (default: the live run's, nothing).
    """

    CSS_PATH = Path(__file__).with_name("dashboard.tcss")
    TITLE = "tuilaunch"

    BINDINGS = actions.bindings()
    # The screen gets -narrow below 120 columns: the side panels stack above the table (see
    # dashboard.tcss), and the table drops the columns that matter least (render_ranks.WORKER_KEEP).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]

    def __init__(
        self,
        source: Source,
        *,
        refresh_hz: float = 4.0,
        confirm: bool = True,
        exit_on_finish: bool = False,
        on_ready: Callable[[], None] | None = None,
        mode: Mode | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.mode = mode if mode is not None else Mode()
        self.mode.bind(self)
        self.run_commands = RunCommands(self)
        self._on_ready = on_ready
        self.refresh_hz = max(0.5, refresh_hz)
        self.confirm = confirm
        self.exit_on_finish = exit_on_finish
        self.clean_exit = False
        self.quitting = False  # q stopped the job: its end leaves the dashboard
        self.detached = False  # D was pressed: the job goes on without this dashboard
        self._version = -1
        self._second = -1
        self._workers_key: tuple[object, ...] = ()
        self._keys_state: tuple[object, ...] = ()
        self._agent_key: tuple[int, str | None] = (-1, None)
        self._finished_seen = not self.mode.acts_on_finish
        self._shapes: dict[str, object] = {}  # what each paced panel last drew (Panel.shape)

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        # Every panel of the table (tui/panels/board.py) where it sits. Widgets are kept as
        # attributes: a modal screen on top must not break the refresh.
        self._panels = {
            p.id: CachedPanel(
                id=p.id,
                classes="panel" if p.where is Where.SIDE else None,
                measure=p.where is not Where.HEADER,  # the header's height is the CSS's
            )
            for p in PANELS
            if p.render is not None
        }
        self._table = WorkersTable(id="workers")
        self.log_pane = LogPane(lambda: self.source.logs, on_close=self._table.focus, id="logs-tab")
        self._agent_view = LogView(id="agentlog", max_lines=2000, highlight=False)
        own = {"logs-tab": self.log_pane, "agent-tab": Vertical(self._agent_view, id="agent-tab")}
        yield from self._placed(Where.HEADER)
        yield from self.mode.compose()
        with Horizontal(id="top"):
            with Vertical(id="side"):
                yield from self._placed(Where.SIDE)
            with Vertical(id="main"):
                yield self._table
                tabs = [p for p in PANELS if p.where is Where.TAB]
                panes = [
                    own[p.id]
                    if p.render is None
                    else VerticalScroll(self.panel(p.id), id=p.pane, classes="tab-panel")
                    for p in tabs
                ]
                self._tabs = TabBar([(p.pane, p.title) for p in tabs], panes, id="tabs")
                yield self._tabs
                yield from panes
        self._footer = KeyFooter(compact=True)
        yield self._footer

    def _placed(self, where: Where) -> Iterator[CachedPanel]:
        return (self.panel(p.id) for p in PANELS if p.where is where)

    def panel(self, id: str) -> CachedPanel:
        """The widget of the panel ``id`` (:data:`~tui_launch.tui.panels.board.PANELS`)."""
        return self._panels[id]

    def on_mount(self) -> None:
        self.mode.on_mount()
        for p in PANELS:
            if p.where is Where.SIDE:
                self.panel(p.id).border_title = p.title
        self._table.border_title = "Workers"
        self._table.set_columns(render_ranks.WORKER_COLUMNS, render_ranks.WORKER_KEEP)
        self._table.focus()
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

    def on_resize(self, event: object) -> None:
        # The footer's palette hint is docked over its right end: on a narrow screen it hid
        # the last keys ("a All log▏^p palette"). The help lists ctrl+p either way.
        self._footer.show_command_palette = self.size.width >= PALETTE_HINT_FROM

    # ---------------------------------------------------------------- refresh

    def _tick(self) -> None:
        self.mode.tick()

    def refresh_view(self) -> None:
        """Redraw what changed since the last refresh (each panel only when what it shows
        did); the mode's tick calls it."""
        snap = self.source.snapshot()
        now = self.source.now()
        if snap.finished is not None:
            now = min(now, snap.finished.mono)  # the job's clocks stop when it ends
        second = int(now)
        if snap.version == self._version and second == self._second:
            # Nothing else can have changed within the same second.
            self.log_pane.write_new(due=False)
            return
        clock = second != self._second
        self._second = second
        self._version = snap.version
        # Each panel is redrawn only when its key (what it shows) changed.
        frame = self._frame(snap, now, clock)
        for panel in PANELS:
            self._draw(panel, frame)
        self._refresh_keys(snap)
        # The table's ages ("last log 0s/1s") would flicker on every tick that brings log
        # lines, and a repaint of the table is among the dashboard's costliest: once a
        # second, with the clock (telemetry samples arrive mid-second and wait for it), or at
        # once when a rank changes.
        workers_key = (second, snap.ranks, snap.hung_ranks)
        if workers_key != self._workers_key:
            self._workers_key = workers_key
            self._update_workers(snap, now)
        self.log_pane.write_new(due=clock)
        self._update_agent_log()
        if snap.finished is not None and not self._finished_seen:
            self._finished_seen = True
            if snap.finished.outcome == "error" and not snap.ranks:
                # Nothing ran, so the logs are empty: the reason is what there is to read.
                self._tabs.active = "cause-tab"
            # A run stopped from outside (SIGTERM, ^C, SIGHUP when the terminal went away)
            # ends tuilaunch too: nobody may be left to press q, and a dashboard on a closed
            # terminal would otherwise linger.
            if (
                self.exit_on_finish
                or self.quitting
                or snap.finished.outcome
                in (
                    "stopped",
                    "preempted",
                )
            ):
                self.leave(snap.finished.exit_code)

    def _frame(self, snap: Snapshot, now: float, clock: bool = True) -> Frame:
        narrow = self.size.width < NARROW_BELOW
        return Frame(snap, now, int(now), clock, narrow, self.source.stack_dump)

    def _draw(self, panel: Panel, frame: Frame) -> None:
        """Draw ``panel`` if what it shows changed (its key) and it is due."""
        render = panel.render
        if render is None:
            return  # the app's own widget (the Logs, the Agent log): drawn below
        widget = self.panel(panel.id)
        if panel.retitle is not None:
            title = panel.retitle(frame)
            if widget.border_title != title:
                widget.border_title = title
        if panel.while_shown and self._tabs.active != panel.pane:
            return
        if panel.shape is not None:
            shape = panel.shape(frame.snap)
            if not frame.clock and shape == self._shapes.get(panel.id):
                return
            self._shapes[panel.id] = shape
        widget.show(panel.key(frame), render, frame)

    def _update_workers(self, snap: Snapshot, now: float) -> None:
        last_line_at = self.source.logs.last_line_at
        progress = snap.progress
        coll = snap.collectives if snap.collectives is not None and snap.collectives.ranks else None
        columns = render_ranks.worker_columns(progress is not None, coll is not None)
        if columns != self._table.column_labels:
            self._table.set_columns(columns, render_ranks.WORKER_KEEP)
        self._table.set_rows(
            [
                (
                    str(r.local_rank),
                    render_ranks.rank_cells(
                        r,
                        now,
                        last_line_at.get(r.local_rank),
                        snap.telemetry,
                        progress,
                        straggler_of(snap),
                        hung=r.global_rank in snap.hung_ranks,
                        collectives=coll,
                    ),
                )
                for r in snap.ranks
            ]
        )

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
        # A rank's log (l) follows the selection: the log shown is always the selected rank's.
        rank = self.selected_rank()
        if self.log_pane.rank is not None and rank is not None and rank != self.log_pane.rank:
            self.log_pane.show_rank(rank)

    def selected_rank(self) -> int | None:
        """Local rank of the row under the cursor, if any."""
        key = self._table.selected_key
        return int(key) if key is not None else None

    # ---------------------------------------------------------------- logs

    def _update_agent_log(self) -> None:
        lines = self.source.agent_lines()
        key = (len(lines), lines[-1] if lines else None)  # lines carry timestamps
        if key == self._agent_key:
            return
        log = self._agent_view
        log.clear()
        log.write_lines(lines)
        self._agent_key = key

    def notify(self, message: str, **kwargs: Any) -> None:
        """A toast, made inert and not read as markup: its words may come from a worker or
        a journal (a stack verdict, an injection's message, a refusal)."""
        message = self.mode.notice(message, kwargs.get("severity"))
        kwargs.setdefault("markup", False)
        if "title" in kwargs:
            kwargs["title"] = inert(kwargs["title"])
        super().notify(inert(message), **kwargs)

    # ---------------------------------------------------------------- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide keys that do not apply now (no rank selected, job finished): see actions.py."""
        spec = actions.BY_NAME.get(action)
        if spec is None or spec.needs is actions.Needs.NOTHING:
            return True
        if spec.needs is actions.Needs.FILTER:
            return bool(self.log_pane.filter_text)
        snap = self.source.snapshot()
        mode = self.mode
        return actions.applies(spec.needs, snap, self.selected_rank(), mode.replay, mode.controls)

    def action_method(self, name: str) -> Callable[[], object] | None:
        """The method the action table's ``name`` runs: the app's own (the view's keys), else
        the run commands' (the keys that act on the run), else the mode's (the replay
        cursor's); None where none has it (the replay keys on a live run)."""
        for owner in (self, self.run_commands, self.mode):
            method = getattr(owner, f"action_{name}", None)
            if callable(method):
                return method
        return None

    async def run_action(
        self,
        action: str | ActionParseResult,
        default_namespace: DOMNode | None = None,
        namespaces: Mapping[str, DOMNode] | None = None,
    ) -> bool:
        """Run an action. Textual looks for the method on the app; the action table's keys
        that belong to the run commands or the mode are run on those (after check_action)."""
        if (
            isinstance(action, str)
            and action in actions.BY_NAME
            and default_namespace in (None, self)
            and not hasattr(self, f"action_{action}")
        ):
            method = self.action_method(action)
            if method is not None:
                if not self.check_action(action, ()):
                    return False
                method()
                return True
        return await super().run_action(action, default_namespace, namespaces)

    def show_tab(self, pane: str) -> None:
        """Bring the tab ``pane`` (its pane's id) to the front, drawn at once."""
        self._tabs.active = pane
        self._draw_tab(pane)

    def _draw_tab(self, pane: str) -> None:
        # A panel drawn only while shown is drawn as its tab comes to the front, not at the
        # next refresh (on the source's clock: a frame out of the refresh).
        for panel in PANELS:
            if panel.while_shown and panel.pane == pane:
                self._draw(panel, self._frame(self.source.snapshot(), self.source.now()))

    def on_tab_bar_activated(self, event: TabBar.Activated) -> None:
        self._draw_tab(event.tab_id)

    def action_rank_log(self) -> None:
        """Show the selected rank's log."""
        rank = self.selected_rank()
        if rank is None:
            return
        self.show_tab("logs-tab")
        self.log_pane.show_rank(rank)

    def on_workers_table_row_selected(self, event: WorkersTable.RowSelected) -> None:
        self.action_rank_log()

    def action_merged_log(self) -> None:
        """Show every rank's log, merged, with rank tags."""
        self.show_tab("logs-tab")
        self.log_pane.show_all()

    def action_clear_filter(self) -> None:
        """Clear an applied log filter (the filter box may be closed)."""
        self.log_pane.clear_filter()
        self.refresh_bindings()

    def action_agent_log(self) -> None:
        """Show the agent log tab: torch's own messages."""
        self.show_tab("agent-tab")

    def action_follow(self) -> None:
        """Resume following new lines (writes what arrived while paused)."""
        self.log_pane.follow()

    def action_streams(self) -> None:
        """Cycle both streams / stdout only / stderr only."""
        self.log_pane.cycle_streams()

    def action_filter(self) -> None:
        """Open the log filter."""
        self.show_tab("logs-tab")
        self.log_pane.open_filter()

    def action_root_cause(self) -> None:
        """Show the root-cause tab."""
        self.show_tab("cause-tab")

    def action_cluster(self) -> None:
        """Show the cluster tab: every node of the job."""
        self.show_tab("cluster-tab")

    def action_help(self) -> None:
        """Show every key."""
        # One help screen for the whole run, built on first use: pushing an installed screen
        # skips compose and styling, 15-20 ms of CPU instead of ~50 (what a key costs to
        # answer in a log flood, where this thread gets a fraction of a core).
        if not self.is_screen_installed("help"):
            rows = actions.help_rows(self.mode.replay)
            self.install_screen(HelpScreen(rows), "help")
        self.push_screen("help")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Command palette entries for the dashboard's actions, after Textual's own that
        still make sense here (theme, screenshot, maximize): its "Quit" duplicated ours, and
        its "Keys" panel the help (?)."""
        for command in super().get_system_commands(screen):
            if command.title not in TEXTUAL_COMMANDS_LEFT_OUT:
                yield command
        for action in actions.palette():
            callback = self.action_method(action.name)
            if callback is not None and self.check_action(action.name, ()):
                yield SystemCommand(action.palette, action.palette_help, callback)

    # ---------------------------------------------------------------- leaving

    async def action_quit(self) -> None:
        """Textual's own quit (ctrl+q, the palette's Quit) must stop the job cleanly too."""
        self.run_commands.action_quit_job()

    def leave(self, code: int) -> None:
        """Leave the dashboard cleanly with ``code`` (``App.run()`` returns it)."""
        self.clean_exit = True
        self.exit(code)

    def exit(self, *args: Any, **kwargs: Any) -> None:
        """Exit, once the mode has let go of what would keep the process alive."""
        self.mode.leaving()
        super().exit(*args, **kwargs)
