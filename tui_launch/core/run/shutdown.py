"""Stopping a run: torch's own path first, then the workers' process groups directly.

A stop sets a flag that the agent thread turns into torch's ``SignalException`` at its next
monitor tick (:meth:`Stopper.check_stop`), which shuts the workers down the way a signal to
torchrun would. Where the agent cannot be reached (a rendezvous, the exit barrier, a slow
start), a watchdog gives it a few monitor ticks and then stops the workers itself, SIGKILLing
what outlives the shutdown timeout. A second stop kills every worker at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from tui_launch.core.model.events import Event, Shutdown
from tui_launch.core.periodic import Periodic
from tui_launch.core.seam import agent
from tui_launch.core.workers.table import RankTable


def shutdown_timeout(args: argparse.Namespace) -> float:
    """Seconds between torch's SIGTERM and its SIGKILL (``--shutdown-timeout`` where torch has
    it, else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30)."""
    t: Any = getattr(args, "shutdown_timeout", None)
    if t is None:
        t = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    try:
        return float(t)
    except ValueError:
        return 30.0


def signal_exit_code(sig: int) -> int:
    """The conventional exit status of a process ended by ``sig`` (128 + number)."""
    return 128 + int(sig)


class Stopper:
    """Owns the stop request of one run.

    Args:
        args: torchrun's arguments (monitor interval, shutdown timeout).
        ranks: the rank table (its process groups are killed when torch cannot be reached).
        post: the run store's ``post``.
        finish: ends the run (``outcome, exit code, message``) when the agent cannot.
        settled: whether the agent has picked the stop up (or the run is over).
        stopping: called on the agent thread just before it leaves through torch's path.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        ranks: RankTable,
        post: Callable[[Event], object],
        finish: Callable[[str, int, str], None],
        settled: Callable[[], bool],
        stopping: Callable[[], None],
    ) -> None:
        self._args = args
        self._ranks = ranks
        self._post = post
        self._finish = finish
        self._settled = settled
        self._stopping = stopping
        self._lock = threading.Lock()
        self._signal: signal.Signals | None = None
        self._reason = ""
        self._watchdog: Periodic | None = None

    @property
    def stop_signal(self) -> signal.Signals | None:
        """The signal of the first stop request (None: no stop asked for)."""
        return self._signal

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self._signal is not None

    def stop(self, sig: int, reason: str, done: bool) -> None:
        """Ask for a stop (``done``: the run has already finished, nothing to do).

        The first call lets torch stop the workers (watched); a second kills them all.
        """
        sig = signal.Signals(sig)
        with self._lock:
            first = self._signal is None
            if first:
                self._signal = sig
                self._reason = reason
        if done:
            return
        if not first:
            self._ranks.kill_all(signal.SIGKILL)
            self._finish("stopped", signal_exit_code(self._signal or sig), "killed")
            return
        self._post(Shutdown(reason=reason, signal=sig.name))
        self._start_watchdog(sig)

    def check_stop(self) -> None:
        """On the agent thread: leave through torch's own path once a stop was asked for."""
        sig = self._signal
        if sig is not None:
            self._stopping()
            raise agent.stop_exception(sig, self._reason)

    def _start_watchdog(self, sig: signal.Signals) -> None:
        # Give the agent a few monitor ticks to pick the stop up through torch's own path.
        interval = float(getattr(self._args, "monitor_interval", 0.1) or 0.1)
        deadline = time.monotonic() + max(1.0, 5 * interval)

        def tick() -> None:
            if self._settled():
                loop.stop()
            elif time.monotonic() >= deadline:
                loop.stop()
                # The agent is stuck where torch cannot be interrupted (rendezvous, exit
                # barrier, a slow start): stop the workers ourselves and end the run.
                self._ranks.kill_all(sig, grace=shutdown_timeout(self._args))
                self._finish("stopped", signal_exit_code(sig), f"stopped by {sig.name}")

        loop = Periodic("tuilaunch-stop", 0.02, tick)
        self._watchdog = loop
        loop.start()
