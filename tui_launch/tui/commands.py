"""The dashboard's keys that act on the run: signal, inject, restart, dump, detach, quit.

:class:`RunCommands` is an object the :class:`~tui_launch.tui.app.Dashboard` holds; its
``action_<name>`` methods (the Dashboard runs them for the action table's keys) build a command
(:mod:`tui_launch.core.model.commands`) and send it through the Dashboard's
:class:`~tui_launch.tui.sources.live.Source` (``send``). Which of them are destructive, and so
ask y/n unless ``--no-confirm``, is the action table's to say (:mod:`tui_launch.tui.actions`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, Protocol

from textual.worker import get_current_worker

from tui_launch.core.model.commands import DumpStacks, Inject, Restart, SignalRank
from tui_launch.tui import actions
from tui_launch.tui.sources.live import Source
from tui_launch.tui.widgets.screens import ConfirmScreen, InjectScreen


class Host(Protocol):
    """What the acting keys need of the dashboard that holds them (the
    :class:`~tui_launch.tui.app.Dashboard`, which imports this module): its source and
    options, the selection, the Stacks tab, leaving, and the Textual app's screens, toasts
    and thread workers."""

    source: Source
    confirm: bool  # --no-confirm turns it off
    quitting: bool  # q stopped the job: its end leaves the dashboard
    detached: bool  # D was pressed: the job goes on without this dashboard

    def selected_rank(self) -> int | None: ...

    def show_tab(self, pane: str) -> None: ...

    def leave(self, code: int) -> None: ...

    def notify(self, message: str, **kwargs: Any) -> None: ...

    def push_screen(self, screen: Any, callback: Any = None) -> Any: ...

    def run_worker(
        self, work: Any, *, group: str = ..., exit_on_error: bool = ..., thread: bool = ...
    ) -> Any: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any) -> Any: ...


class RunCommands:
    """The acting keys of one dashboard (its ``action_<name>`` methods run them): what they
    send goes through its source, what they show (a toast, a question, the Stacks tab) on its
    screen."""

    def __init__(self, app: Host) -> None:
        self.app = app

    def _confirm_then(self, action: str, question: str, act: Callable[[], object]) -> None:
        # Destructive actions (the action table says which) ask y/n, unless --no-confirm.
        if not (self.app.confirm and actions.BY_NAME[action].destructive):
            act()
            return

        def done(yes: bool | None) -> None:
            if yes:
                act()

        self.app.push_screen(ConfirmScreen(question), done)

    def _signal_selected(self, action: str, sig: signal.Signals, verb: str) -> None:
        rank = self.app.selected_rank()
        if rank is None:
            return
        row = self.app.source.snapshot().rank(rank)
        who = (
            f"rank {row.global_rank} (local {rank}, pid {row.pid})" if row else f"local rank {rank}"
        )

        def act() -> None:
            ok = self.app.source.send(SignalRank(rank, sig, source="dashboard")).ok
            self.app.notify(
                f"{verb} {who}" if ok else f"could not {verb.lower()} {who}",
                severity="information" if ok else "error",
            )

        self._confirm_then(action, f"{verb} {who}?", act)

    def action_kill(self) -> None:
        """SIGKILL the selected rank."""
        self._signal_selected("kill", signal.SIGKILL, "Kill (SIGKILL)")

    def action_term(self) -> None:
        """SIGTERM the selected rank."""
        self._signal_selected("term", signal.SIGTERM, "Terminate (SIGTERM)")

    def action_stop_continue(self) -> None:
        """SIGSTOP the selected rank, or SIGCONT it when it is stopped."""
        rank = self.app.selected_rank()
        if rank is None:
            return
        if self.app.source.is_stopped(rank):
            self._signal_selected("stop_continue", signal.SIGCONT, "Continue (SIGCONT)")
        else:
            self._signal_selected("stop_continue", signal.SIGSTOP, "Stop (SIGSTOP)")

    def action_inject(self) -> None:
        """Open the inject menu for the selected rank."""
        rank = self.app.selected_rank()
        row = self.app.source.snapshot().rank(rank) if rank is not None else None
        if row is None:
            return
        who = f"rank {row.global_rank} (local {rank}, pid {row.pid})"

        def done(spec: str | None) -> None:
            if not spec:
                return
            outcome = self.app.source.send(Inject(spec, source="dashboard"))
            self.app.notify(outcome.detail, severity="information" if outcome.ok else "error")

        # Kinds this run can never do (exit, exception with --no-bootstrap) are shown
        # greyed out with the reason, not offered and then refused.
        from tui_launch.core.run.inject import KINDS

        source = self.app.source
        refusal: Callable[[str], str | None] | None = getattr(source, "inject_refusal", None)
        refusals: dict[str, str] = {}
        if refusal is not None:
            for kind in KINDS:
                why = refusal(kind)
                if why:
                    refusals[kind] = why
        self.app.push_screen(InjectScreen(who, row.global_rank, refusals), done)

    def action_restart(self) -> None:
        """Restart the whole local worker group without spending the failure budget."""

        def act() -> None:
            ok = self.app.source.send(Restart(source="dashboard")).ok
            self.app.notify(
                "restarting the worker group" if ok else "cannot restart now",
                severity="information" if ok else "error",
            )

        self._confirm_then(
            "restart", "Restart the whole worker group? (no failure budget spent)", act
        )

    def action_dump_stacks(self) -> None:
        """Dump every rank's stacks on this node, off the UI thread; show the Stacks tab."""
        # Briefly: the Stacks tab comes to the front with the result, and a toast that stays
        # covers half of it on 80x24.
        self.app.notify("dumping every rank's stacks...", timeout=2)
        self._dump_in_thread()

    def _dump_in_thread(self) -> None:
        def dump() -> None:
            event = self.app.source.send(DumpStacks("key", source="dashboard")).dump
            if not get_current_worker().is_cancelled:
                self.app.call_from_thread(self._dumped, event)

        self.app.run_worker(dump, thread=True, exit_on_error=False, group="stacks")

    def _dumped(self, event: object) -> None:
        if event is None:
            self.app.notify("no rank runs: nothing to dump", severity="error")
            return
        # The tab's first lines are the verdict: no toast repeating it over the stacks.
        self.app.show_tab("stacks-tab")

    def action_quit_job(self) -> None:
        """Quit; a running job is stopped first (SIGTERM, then SIGKILL after the timeout)."""
        if self.app.source.done:
            self.app.leave(self.app.source.wait(0) or 0)
            return

        def act() -> None:
            self.app.quitting = True
            self.app.notify("stopping the workers...")
            self.app.source.stop(signal.SIGTERM, "quit from the dashboard")
            self._wait_for_end()

        self._confirm_then("quit_job", "The job is running. Stop the workers and quit?", act)

    def action_detach(self) -> None:
        """Release the terminal and leave the job running (the launcher goes on headless,
        its console output in the run directory; an attached client just leaves)."""
        self.app.detached = True
        self.app.leave(0)

    def _wait_for_end(self) -> None:
        def wait() -> None:
            code = self.app.source.wait()
            self.app.call_from_thread(self.app.leave, code if code is not None else 1)

        self.app.run_worker(wait, thread=True, exit_on_error=False)
