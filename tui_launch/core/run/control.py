"""The control API: what a front end, an injection or a test can do to a running job.

Every verb is a command (:mod:`tui_launch.core.model.commands`); :meth:`Control.execute` is
the one place a live run carries them out: signal, kill, stop or continue one rank; restart
the group; make a Python worker exit or raise (through the worker bootstrap's order files);
kill the whole node; schedule an injection; dump the ranks' stacks; stop the job. Every
command posts one :class:`~tui_launch.core.model.events.ControlAction` (or, for a dump, a
``StacksDumped``), whether it worked or not, so the dashboard, the headless lines and the
journal all say what was done and by whom.

Commands never wait for the agent: they signal processes or set a flag that the agent thread
acts on at its next monitor tick.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tui_launch.core.model.commands import (
    Command,
    DumpStacks,
    ExitRank,
    Inject,
    KillNode,
    Outcome,
    RaiseInRank,
    RankCommand,
    Restart,
    SignalRank,
    StopRun,
    allowed,
    control_event,
)
from tui_launch.core.model.events import Event, StacksDumped
from tui_launch.core.run.state import RunState
from tui_launch.core.workers.table import RankTable, signal_group

if TYPE_CHECKING:
    from tui_launch.core.model.store import Snapshot


class ShimDir:
    """The worker bootstrap's order directory (:mod:`tui_launch.core.workers.shim`), if the run has
    one.

    Args:
        wanted: whether Python workers start through the bootstrap (``--inject-ready`` or an
            ``exit``/``exception`` spec).
        no_python: ``--no-python``: there is no Python worker to bootstrap.
    """

    def __init__(self, wanted: bool, no_python: bool) -> None:
        self.wanted = wanted and not no_python
        self.no_python = no_python
        self.path: str | None = None

    def open(self) -> str | None:
        """Create the directory if the run wants one; returns it (None: no bootstrap)."""
        if self.wanted and self.path is None:
            self.path = tempfile.mkdtemp(prefix="tuilaunch-inject-")
        return self.path

    def close(self) -> None:
        """Remove the directory (the run is over)."""
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)

    def no_shim_reason(self, kind: str) -> str:
        """Why a ``kind`` order cannot be given in this run, in words."""
        if self.no_python:
            return f"{kind} injection needs a Python worker (this run uses --no-python)"
        return (
            f"{kind} injection needs tuilaunch's worker bootstrap: launch with "
            f"--inject-ready (or an --inject {kind}:... spec)"
        )


class Control:
    """The runner's control API over this node's ranks: :meth:`execute` runs a command.

    Args:
        post: the run store's ``post``.
        ranks: the rank table.
        shim: the bootstrap's order directory.
        state: the run's state (a restart is a request the agent thread takes at its next
            tick, refused unless the group is running).
        snapshot: the store's ``snapshot`` (what :func:`allowed` judges a command by).
        schedule: schedules an ``--inject`` spec: ``(text, source) -> (ok, message)``.
        dump: dumps every live rank's stacks: ``(reason, source) -> StacksDumped | None``.
        stop: stops the run: ``(sig, reason)``.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        ranks: RankTable,
        shim: ShimDir,
        state: RunState,
        snapshot: Callable[[], Snapshot],
        schedule: Callable[[str, str], tuple[bool, str]],
        dump: Callable[[str, str], StacksDumped | None],
        stop: Callable[[int, str], None],
    ) -> None:
        self._post = post
        self._ranks = ranks
        self._shim = shim
        self._state = state
        self._snapshot = snapshot
        self._schedule = schedule
        self._dump = dump
        self._stop = stop
        # Called just before `node` kills the launcher (the dashboard restores the terminal).
        self.before_exit: list[Callable[[], None]] = []

    def execute(self, cmd: Command) -> Outcome:
        """Carry out ``cmd`` if :func:`allowed` lets it act on the run as it stands (else
        journal the refusal); the outcome says what was done or why not."""
        reason = allowed(self._snapshot(), cmd)
        if reason is None:
            return self.perform(cmd)
        if isinstance(cmd, RankCommand):
            rank = self._ranks.info(cmd.local_rank)
            self._post(
                control_event(cmd, False, reason, global_rank=rank.global_rank, pid=rank.pid)
            )
        else:
            self._post(control_event(cmd, False, reason))
        return Outcome(False, reason)

    def perform(self, cmd: Command) -> Outcome:
        """Carry out ``cmd`` without asking :func:`allowed` (an injection firing: the
        injector has checked the rank table itself, which may be ahead of the snapshot).
        The one dispatch on the command's type."""
        if isinstance(cmd, SignalRank):
            return self._signal(cmd)
        if isinstance(cmd, ExitRank):
            return self._order(cmd, {"kind": "exit", "code": int(cmd.code)})
        if isinstance(cmd, RaiseInRank):
            return self._order(cmd, {"kind": "exception", "message": cmd.message})
        if isinstance(cmd, Restart):
            refused = self._state.request_restart()
            self._post(control_event(cmd, refused is None, refused or ""))
            return Outcome(refused is None, refused or "")
        if isinstance(cmd, Inject):
            # Scheduling posts nothing of its own: each firing is an Injected event later.
            return Outcome(*self._schedule(cmd.spec, cmd.source))
        if isinstance(cmd, DumpStacks):
            event = self._dump(cmd.reason, cmd.source)  # posts the dump, or why none
            return Outcome(event is not None, "" if event else "no running worker", event)
        if isinstance(cmd, StopRun):
            detail = f"{signal.Signals(cmd.sig).name} to the workers"
            self._post(control_event(cmd, True, detail))
            self._stop(cmd.sig, cmd.reason)
            return Outcome(True, detail)
        if isinstance(cmd, KillNode):
            self._kill_node(cmd)
            return Outcome(True)  # only where os.kill is faked: the launcher is gone
        raise TypeError(f"not a command: {cmd!r}")

    def _signal(self, cmd: SignalRank) -> Outcome:
        sig = signal.Signals(cmd.sig)
        local_rank, source = cmd.local_rank, cmd.source
        rank = self._ranks.info(local_rank)
        pid, grank = rank.pid, rank.global_rank
        ok, detail = False, "no running worker"
        if rank.alive and pid is not None and _exited(pid):
            # Dead but not reaped yet (torch notices at its next monitor tick): a signal would
            # "succeed" and do nothing, so a second kill said done.
            detail = f"local rank {local_rank} (pid {pid}) is already gone (exited, not reaped yet)"
        elif rank.alive and pid is not None:
            ok, detail = True, ""
            try:
                if sig in (signal.SIGSTOP, signal.SIGCONT):
                    # The whole rank: its data-loader children pause and resume with it.
                    signal_group(pid, sig)
                    self._ranks.set_stopped(local_rank, sig == signal.SIGSTOP)
                else:
                    os.kill(pid, sig)
                    if rank.stopped and sig != signal.SIGKILL:
                        signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on it
                    self._ranks.mark(pid, f"{sig.name} sent by tuilaunch ({source})")
            except ProcessLookupError:
                ok, detail = False, "process already gone"
            except PermissionError as e:
                ok, detail = False, str(e)
        self._post(control_event(cmd, ok, detail, global_rank=grank, pid=pid))
        return Outcome(ok, detail)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        return self._ranks.is_stopped(local_rank)

    def _order(self, cmd: RankCommand, order: dict[str, Any]) -> Outcome:
        from tui_launch.core.workers.shim import INJECT_SIGNAL

        kind = str(order["kind"])
        rank = self._ranks.info(cmd.local_rank)
        pid = rank.pid
        ok, detail = rank.alive, "" if rank.alive else "no running worker"
        directory = self._shim.path
        if ok and directory is None:
            ok, detail = False, self._shim.no_shim_reason(kind)
        if ok and pid is not None and directory is not None:
            path = os.path.join(directory, f"{pid}.json")
            try:
                with open(path + ".tmp", "w") as fp:
                    json.dump(order, fp)
                os.replace(path + ".tmp", path)  # the handler never reads half an order
                self._ranks.mark(pid, f"{kind} injected by tuilaunch ({cmd.source})")
                os.kill(pid, INJECT_SIGNAL)
                if rank.stopped:
                    signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on it
            except ProcessLookupError:
                ok, detail = False, "process already gone"
            except OSError as e:
                ok, detail = False, str(e)
        self._post(control_event(cmd, ok, detail, global_rank=rank.global_rank, pid=pid))
        return Outcome(ok, detail)

    def _kill_node(self, cmd: KillNode) -> None:
        # This node dies at once, as if the machine had gone: every worker's process group
        # and the launcher itself are SIGKILLed. The reaper makes sure nothing is left.
        self._post(control_event(cmd, True, pid=os.getpid()))
        for hook in list(self.before_exit):
            with contextlib.suppress(Exception):
                hook()
        for pid in self._ranks.pids():
            signal_group(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # cannot tell: let the signal say
    state = stat[stat.rfind(b")") + 2 :][:1]  # the field after "(comm)", which may hold ")"
    return state in (b"Z", b"X")
