"""The control API: what a front end, an injection or a test can do to a running job.

Signal, kill, stop or continue one rank; ask for a restart of the group; make a Python worker
exit or raise (through the worker bootstrap's order files); kill the whole node. Every call
posts one :class:`~tui_launch.core.model.events.ControlAction`, whether it worked or not, so the
dashboard, the headless lines and the journal all say what was done and by whom.

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
from typing import Any

from tui_launch.core.model.events import ControlAction, Event
from tui_launch.core.workers.table import RankTable, signal_group


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
    """The runner's control API over this node's ranks.

    Args:
        post: the run store's ``post``.
        ranks: the rank table.
        shim: the bootstrap's order directory.
        request_restart: asks the agent thread for a restart at its next tick; returns None
            if accepted, else why not ("agent is restarting").
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        ranks: RankTable,
        shim: ShimDir,
        request_restart: Callable[[], str | None],
    ) -> None:
        self._post = post
        self._ranks = ranks
        self._shim = shim
        self._request_restart = request_restart
        # Called just before `node` kills the launcher (the dashboard restores the terminal).
        self.before_exit: list[Callable[[], None]] = []

    def _post_control(
        self,
        action: str,
        *,
        local_rank: int | None = None,
        global_rank: int | None = None,
        pid: int | None = None,
        signal: str | None = None,
        source: str,
        ok: bool,
        detail: str = "",
    ) -> None:
        self._post(
            ControlAction(
                action=action,
                local_rank=local_rank,
                global_rank=global_rank,
                pid=pid,
                signal=signal,
                source=source,
                ok=ok,
                detail=detail,
            )
        )

    def signal_rank(self, local_rank: int, sig: int, source: str = "api") -> bool:
        """Send ``sig`` to one local rank's worker process. Returns whether it was sent."""
        sig = signal.Signals(sig)
        action = {signal.SIGSTOP: "stop", signal.SIGCONT: "continue"}.get(sig, "signal")
        if sig == signal.SIGKILL:
            action = "kill"
        rank = self._ranks.info(local_rank)
        pid, grank = rank.pid, rank.global_rank
        ok, detail = False, "no running worker"
        if rank.alive and pid is not None:
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
        self._post_control(
            action,
            local_rank=local_rank,
            global_rank=grank,
            pid=pid,
            signal=sig.name,
            source=source,
            ok=ok,
            detail=detail,
        )
        return ok

    def kill_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGKILL one rank, as the OOM killer would."""
        return self.signal_rank(local_rank, signal.SIGKILL, source)

    def stop_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGSTOP one rank (and its children): it hangs until continued."""
        return self.signal_rank(local_rank, signal.SIGSTOP, source)

    def continue_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGCONT a stopped rank."""
        return self.signal_rank(local_rank, signal.SIGCONT, source)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        return self._ranks.is_stopped(local_rank)

    def restart(self, source: str = "api") -> bool:
        """Ask for a restart of the whole local worker group (no failure budget spent)."""
        refused = self._request_restart()
        self._post_control("restart", source=source, ok=refused is None, detail=refused or "")
        return refused is None

    def exit_rank(self, local_rank: int, code: int, source: str = "api") -> bool:
        """Make a Python worker exit with ``code`` (needs the worker bootstrap)."""
        return self._order(local_rank, {"kind": "exit", "code": int(code)}, source)

    def raise_in_rank(self, local_rank: int, message: str, source: str = "api") -> bool:
        """Raise an exception with ``message`` in a Python worker's main thread (bootstrap)."""
        return self._order(local_rank, {"kind": "exception", "message": message}, source)

    def _order(self, local_rank: int, order: dict[str, Any], source: str) -> bool:
        from tui_launch.core.workers.shim import INJECT_SIGNAL

        kind = str(order["kind"])
        rank = self._ranks.info(local_rank)
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
                self._ranks.mark(pid, f"{kind} injected by tuilaunch ({source})")
                os.kill(pid, INJECT_SIGNAL)
                if rank.stopped:
                    signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on it
            except ProcessLookupError:
                ok, detail = False, "process already gone"
            except OSError as e:
                ok, detail = False, str(e)
        self._post_control(
            kind,
            local_rank=local_rank,
            global_rank=rank.global_rank,
            pid=pid,
            source=source,
            ok=ok,
            detail=detail,
        )
        return ok

    def kill_node(self, source: str = "api") -> None:
        """This node dies at once, as if the machine had gone: every worker's process group
        and the launcher itself are SIGKILLed. The reaper makes sure nothing is left."""
        self._post_control("node", pid=os.getpid(), signal="SIGKILL", source=source, ok=True)
        for hook in list(self.before_exit):
            with contextlib.suppress(Exception):
                hook()
        for pid in self._ranks.pids():
            signal_group(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
