"""The dashboard's keys that act on the run: signal, inject, restart, dump, detach, quit.

:class:`RunCommands` is the half of :class:`~tui_launch.tui.app.Dashboard` (which inherits it)
whose actions build a command (:mod:`tui_launch.core.model.commands`) and send it through the
:class:`~tui_launch.tui.sources.live.Source` (``send``). Which
of them are destructive, and so ask y/n unless ``--no-confirm``, is the action table's to say
(:mod:`tui_launch.tui.actions`). The view the Dashboard builds (its Stacks tab, the selected
row) is reached through the methods declared at the top.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from textual import work
from textual.app import App
from textual.worker import get_current_worker

from tui_launch.core.model.commands import DumpStacks, Inject, Restart, SignalRank
from tui_launch.tui import actions
from tui_launch.tui.sources.live import Source
from tui_launch.tui.widgets.screens import ConfirmScreen, InjectScreen


class RunCommands(App[int]):
    """The acting actions; the :class:`~tui_launch.tui.app.Dashboard` supplies the view."""

    source: Source
    confirm: bool
    clean_exit: bool
    _quitting: bool
    detached: bool = False  # D was pressed: the job goes on without this dashboard

    def selected_rank(self) -> int | None:
        """The local rank of the highlighted row (the Dashboard's table)."""
        raise NotImplementedError

    def show_stacks_tab(self) -> None:
        """Bring the Stacks tab to the front, showing the latest dump."""
        raise NotImplementedError

    def _confirm_then(self, action: str, question: str, act: Callable[[], object]) -> None:
        # Destructive actions (the action table says which) ask y/n, unless --no-confirm.
        if not (self.confirm and actions.BY_NAME[action].destructive):
            act()
            return

        def done(yes: bool | None) -> None:
            if yes:
                act()

        self.push_screen(ConfirmScreen(question), done)

    def _signal_selected(self, action: str, sig: signal.Signals, verb: str) -> None:
        rank = self.selected_rank()
        if rank is None:
            return
        row = self.source.snapshot().rank(rank)
        who = (
            f"rank {row.global_rank} (local {rank}, pid {row.pid})" if row else f"local rank {rank}"
        )

        def act() -> None:
            ok = self.source.send(SignalRank(rank, sig, source="dashboard")).ok
            self.notify(
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
        rank = self.selected_rank()
        if rank is None:
            return
        if self.source.is_stopped(rank):
            self._signal_selected("stop_continue", signal.SIGCONT, "Continue (SIGCONT)")
        else:
            self._signal_selected("stop_continue", signal.SIGSTOP, "Stop (SIGSTOP)")

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
            outcome = self.source.send(Inject(spec, source="dashboard"))
            self.notify(outcome.detail, severity="information" if outcome.ok else "error")

        # Kinds this run can never do (exit, exception without --inject-ready) are shown
        # greyed out with the reason, not offered and then refused.
        from tui_launch.core.run.inject import KINDS

        refusal: Callable[[str], str | None] | None = getattr(self.source, "inject_refusal", None)
        refusals: dict[str, str] = {}
        if refusal is not None:
            for kind in KINDS:
                why = refusal(kind)
                if why:
                    refusals[kind] = why
        self.push_screen(InjectScreen(who, row.global_rank, refusals), done)

    def action_restart(self) -> None:
        """Restart the whole local worker group without spending the failure budget."""

        def act() -> None:
            ok = self.source.send(Restart(source="dashboard")).ok
            self.notify(
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
        self.notify("dumping every rank's stacks...", timeout=2)
        self._dump_in_thread()

    @work(thread=True, exit_on_error=False, group="stacks", exclusive=False)
    def _dump_in_thread(self) -> None:
        event = self.source.send(DumpStacks("key", source="dashboard")).dump
        if not get_current_worker().is_cancelled:
            self.call_from_thread(self._dumped, event)

    def _dumped(self, event: object) -> None:
        if event is None:
            self.notify("no rank runs: nothing to dump", severity="error")
            return
        # The tab's first lines are the verdict: no toast repeating it over the stacks.
        self.show_stacks_tab()

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

        self._confirm_then("quit_job", "The job is running. Stop the workers and quit?", act)

    async def action_quit(self) -> None:
        """Textual's own quit (ctrl+q, the palette's Quit) must stop the job cleanly too."""
        self.action_quit_job()

    def action_detach(self) -> None:
        """Release the terminal and leave the job running (the launcher goes on headless,
        its console output in the run directory; an attached client just leaves)."""
        self.detached = True
        self._leave(0)

    @work(thread=True, exit_on_error=False)
    def _wait_for_end(self) -> None:
        code = self.source.wait()
        self.call_from_thread(self._leave, code if code is not None else 1)

    def _leave(self, code: int) -> None:
        self.clean_exit = True
        self.exit(code)
