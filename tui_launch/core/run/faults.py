"""Fault execution: what an injection does to a rank, once the scheduler fires it.

:class:`~tui_launch.core.run.inject.Injector` decides *when* (per attempt, after a delay, a seeded
random rank); :class:`FaultExecutor` is its :class:`~tui_launch.core.run.inject.Target` and does
it, through the control API's :class:`~tui_launch.core.run.control.Actions` (built before it;
the injector is built on it, the command front on the injector), so that every injection is an
``Injected`` event followed by the ``ControlAction`` it caused. ``hang`` ends on a timer;
``slow`` runs a stop/continue loop per firing on a :class:`~tui_launch.core.periodic.Periodic`.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from tui_launch.core.model.commands import ExitRank, KillNode, RaiseInRank, SignalRank
from tui_launch.core.model.events import Event, Injected
from tui_launch.core.periodic import Periodic
from tui_launch.core.run import inject
from tui_launch.core.run.control import Actions, ShimDir
from tui_launch.core.run.inject import Fired, InjectSpec
from tui_launch.core.run.state import RunState
from tui_launch.core.workers.table import RankTable


class FaultExecutor:
    """Carries out fired injections on this node's ranks (implements ``inject.Target``).

    Args:
        actions: the control API's actions, that signals and orders go through.
        ranks: the rank table.
        shim: the worker bootstrap's order directory (``exit``/``exception`` need it).
        post: the run store's ``post``.
        state: the run's state: whether the agent is monitoring the current attempt and no
            stop was asked for (faults of an attempt that is ending are dropped).
    """

    def __init__(
        self,
        actions: Actions,
        ranks: RankTable,
        shim: ShimDir,
        post: Callable[[Event], object],
        state: RunState,
    ) -> None:
        self._actions = actions
        self._ranks = ranks
        self._shim = shim
        self._post = post
        self._state = state
        self._lock = threading.Lock()
        self._slow: list[Periodic] = []
        self._closed = False

    def attempt_alive(self, attempt: int) -> bool:
        """Whether ``attempt`` is the current one and still being monitored (not ending)."""
        return self._ranks.current(attempt) and self._state.monitored()

    def inject_fault(self, spec: InjectSpec, local_rank: int, fired: Fired) -> bool:
        """Do one firing of ``spec`` on ``local_rank`` (called by the :class:`Injector`)."""
        rank = self._ranks.info(local_rank)
        pid, alive = rank.pid, rank.alive
        detail = "" if alive else "the rank is not running"
        refused = self._shim.refusal(spec.kind) if alive else None
        if refused is not None:
            alive, detail = False, refused
        self._post(
            Injected(
                spec=spec.canonical(),
                fault=spec.kind,
                attempt=fired.attempt,
                global_rank=fired.global_rank,
                local_rank=local_rank,
                pid=pid,
                count=fired.count,
                times=spec.times,
                source=fired.source,
                ok=alive,
                detail=detail,
            )
        )
        if not alive or pid is None:
            return False
        source = "inject" if fired.source == "--inject" else f"inject, {fired.source}"
        if spec.kind == "kill":
            sig = inject.parse_signal(spec.signal)
            return self._actions.perform(SignalRank(local_rank, sig, source=source)).ok
        if spec.kind == "hang":
            stop = SignalRank(local_rank, signal.SIGSTOP, source=source)
            ok = self._actions.perform(stop).ok
            if ok and spec.duration is not None:
                t = threading.Timer(
                    spec.duration, self._end_hang, (local_rank, pid, fired.attempt, source)
                )
                t.daemon = True
                t.start()
            return ok
        if spec.kind == "slow":
            self._start_slow(local_rank, pid, fired.attempt, spec)
            return True
        if spec.kind == "exit":
            return self._actions.perform(ExitRank(local_rank, spec.code, source=source)).ok
        if spec.kind == "exception":
            return self._actions.perform(RaiseInRank(local_rank, spec.message, source=source)).ok
        if spec.kind == "node":
            self._actions.perform(KillNode(source=source))
        return False

    def _end_hang(self, local_rank: int, pid: int, attempt: int, source: str) -> None:
        if self._ranks.still_hung(local_rank, pid, attempt):
            self._actions.perform(SignalRank(local_rank, signal.SIGCONT, source=source))

    def _start_slow(self, local_rank: int, pid: int, attempt: int, spec: InjectSpec) -> None:
        # A straggler: stopped duty % of every period. The toggles are not events (two a
        # second would flood the journal); the Injected event says what is going on.
        stopped_for = spec.period * spec.duty / 100.0
        running_for = spec.period - stopped_for
        end = time.monotonic() + spec.duration if spec.duration is not None else float("inf")
        state = {"stopped": False}

        def pause(stop: bool) -> bool:
            return self._ranks.pause(local_rank, pid, attempt, stop, self._state.monitored)

        def tick() -> float | None:
            if state["stopped"]:  # due to run again, or the loop is ending: let it go
                pause(False)
                state["stopped"] = False
                return running_for
            if loop.stopped or time.monotonic() >= end or not pause(True):
                loop.stop()
                return None
            state["stopped"] = True
            return stopped_for

        loop = Periodic("tuilaunch-slow", spec.period, tick, final_call=True)
        with self._lock:
            if self._closed:
                return
            self._slow.append(loop)
        loop.start()

    def close(self) -> None:
        """The run is over (the injector is closed: nothing fires any more): stopped ``slow``
        ranks are let go, and the bootstrap's order directory is removed."""
        with self._lock:
            self._closed = True
            loops, self._slow = self._slow, []
        for loop in loops:
            loop.stop()
        self._shim.close()
