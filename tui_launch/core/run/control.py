"""The control API: what a front end, an injection or a test can do to a running job.

Every verb is a command (:mod:`tui_launch.core.model.commands`). Two layers, built in this
order, so that nothing refers to a part made after it:

- :class:`Actions` carries out what acts on the run: signal, kill, stop or continue one rank;
  restart the group; make a Python worker exit or raise (through the worker bootstrap's order
  files); kill the whole node; dump the ranks' stacks; stop the job. A fired injection acts
  through it (:class:`~tui_launch.core.run.faults.FaultExecutor`), so it asks nothing.
- :class:`Control` is the command front (:meth:`Control.execute`, behind
  ``RunHandle.execute``): it asks :func:`~tui_launch.core.model.commands.allowed`, journals a
  refusal, schedules an ``Inject`` on the :class:`~tui_launch.core.run.inject.Injector` (built
  on the fault executor, built on the actions) and hands every other command to the actions.

Every command posts one :class:`~tui_launch.core.model.events.ControlAction` (or, for a dump, a
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
from tui_launch.core.run import inject
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

    def refusal(self, kind: str) -> str | None:
        """Why this run cannot inject ``kind`` at all (None: it can). ``exit`` and
        ``exception`` need the worker bootstrap, which only a worker started through it has:
        the dashboard's menu greys them out with this reason instead of offering them."""
        if kind in inject.SHIM_KINDS and self.path is None:
            return self.no_shim_reason(kind)
        return None


class Actions:
    """What acts on this node's ranks and the run; :meth:`perform` carries out one action.

    Args:
        post: the run store's ``post``.
        ranks: the rank table.
        shim: the bootstrap's order directory.
        state: the run's state (a restart is a request the agent thread takes at its next
            tick, refused unless the group is running).
        dump: dumps every live rank's stacks: ``(reason, source) -> StacksDumped | None``.
        stop: stops the run: ``(sig, reason)``.
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        ranks: RankTable,
        shim: ShimDir,
        state: RunState,
        dump: Callable[[str, str], StacksDumped | None],
        stop: Callable[[int, str], None],
    ) -> None:
        self._post = post
        self._ranks = ranks
        self._shim = shim
        self._state = state
        self._dump = dump
        self._stop = stop
        # Called just before `node` kills the launcher (the dashboard restores the terminal).
        self.before_exit: list[Callable[[], None]] = []

    def perform(self, cmd: Command) -> Outcome:
        """Carry out ``cmd`` without asking :func:`allowed` (an injection firing: the
        injector has checked the rank table itself, which may be ahead of the snapshot).
        The one dispatch on the action's type; an ``Inject`` is no action (it schedules one:
        :meth:`Control.execute`)."""
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
        raise TypeError(f"not an action: {cmd!r}")

    def refuse(self, cmd: Command, reason: str) -> Outcome:
        """Journal that ``cmd`` was refused for ``reason`` (naming the rank it was for)."""
        if isinstance(cmd, RankCommand):
            rank = self._ranks.info(cmd.local_rank)
            self._post(
                control_event(cmd, False, reason, global_rank=rank.global_rank, pid=rank.pid)
            )
        else:
            self._post(control_event(cmd, False, reason))
        return Outcome(False, reason)

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


class Control:
    """The run's command front: :meth:`execute` runs a command if the run allows it.

    Args:
        actions: what carries the commands out.
        injector: the injection schedule (an ``Inject`` adds a spec to it).
        ranks: the rank table (a live spec's ranks are checked against its world size).
        shim: the bootstrap's order directory (why an ``exit``/``exception`` is refused).
        snapshot: the store's ``snapshot`` (what :func:`allowed` judges a command by).
    """

    def __init__(
        self,
        actions: Actions,
        injector: inject.Injector,
        ranks: RankTable,
        shim: ShimDir,
        snapshot: Callable[[], Snapshot],
    ) -> None:
        self._actions = actions
        self._injector = injector
        self._ranks = ranks
        self._shim = shim
        self._snapshot = snapshot

    def execute(self, cmd: Command) -> Outcome:
        """Carry out ``cmd`` if :func:`allowed` lets it act on the run as it stands (else
        journal the refusal); the outcome says what was done or why not."""
        reason = allowed(self._snapshot(), cmd)
        if reason is not None:
            return self._actions.refuse(cmd, reason)
        if isinstance(cmd, Inject):
            # Scheduling posts nothing of its own: each firing is an Injected event later.
            return Outcome(
                *self._injector.schedule(
                    cmd.spec, cmd.source, self._ranks.world_size, self._shim.refusal
                )
            )
        return self._actions.perform(cmd)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        return self._ranks.is_stopped(local_rank)


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
