"""Stopping a run: torch's own path first, then the workers' process groups directly.

A stop sets a flag that the agent thread turns into torch's ``SignalException`` at its next
monitor tick (:meth:`Stopper.check_stop`), which shuts the workers down the way a signal to
torchrun would. Where the agent cannot be reached (a rendezvous, the exit barrier, a slow
start), a watchdog gives it a few monitor ticks and then stops the workers itself, SIGKILLing
what outlives the shutdown timeout. A second stop kills every worker at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.model.events import Event, Preempted, Shutdown
from tui_launch.core.model.store import Phase
from tui_launch.core.periodic import Periodic
from tui_launch.core.run.state import RunState
from tui_launch.core.seam import agent
from tui_launch.core.workers.table import RankTable

RECEIVED = "a signal to the launcher"


def received(sig: signal.Signals) -> str:
    """The reason of a stop asked for by a signal to the launcher (the only stop that can
    be a preemption: a quit key or a control client is not). It does not name ``sig``: the
    stop carries its signal beside the reason (``shutting down: ... (SIGINT)``)."""
    return RECEIVED


def signal_exit_code(sig: int) -> int:
    """The conventional exit status of a process ended by ``sig`` (128 + number)."""
    return 128 + int(sig)


class Stopper:
    """Carries out the stop request of one run (the request itself is in the run's state).

    Args:
        torchrun: torchrun's arguments (monitor interval, shutdown timeout).
        ranks: the rank table (its process groups are killed when torch cannot be reached).
        post: the run store's ``post``.
        state: the run's state: the stop request, the phase (``stopping`` once the agent picks
            the stop up) and whether the run is over.
        finish: ends the run (``outcome, exit code, message``) when the agent cannot: the
            runner's last steps, which only the runner knows.
        preempt: the signals that mean preemption (``--preempt-signals``): a stop by one of
            them is announced as a :class:`Preempted` with the grace the workers have.
    """

    def __init__(
        self,
        torchrun: TorchrunArgs,
        ranks: RankTable,
        post: Callable[[Event], object],
        state: RunState,
        finish: Callable[[str, int, str], None],
        preempt: tuple[signal.Signals, ...] = (),
    ) -> None:
        self._preempt = preempt
        self.preempted = False  # a preemption signal to the launcher asked for the stop
        self._torchrun = torchrun
        self._ranks = ranks
        self._post = post
        self._state = state
        self._finish = finish
        self._watchdog: Periodic | None = None

    def stop(self, sig: int, reason: str) -> None:
        """Ask for a stop (nothing to do once the run has finished).

        The first call lets torch stop the workers (watched); a second kills them all.
        """
        sig = signal.Signals(sig)
        first = self._state.request_stop(sig, reason)
        if self._state.done.is_set():
            return
        if not first:
            self._ranks.kill_all(signal.SIGKILL)
            self._finish("stopped", signal_exit_code(self._state.stop_signal or sig), "killed")
            return
        self._post(Shutdown(reason=reason, signal=sig.name))
        if sig in self._preempt and reason.startswith(RECEIVED):
            self.preempted = True
            grace = self._torchrun.shutdown_timeout
            self._post(Preempted(signal=sig.name, grace=grace, deadline=time.time() + grace))
        self._start_watchdog(sig)

    def check_stop(self) -> None:
        """On the agent thread: leave through torch's own path once a stop was asked for."""
        sig = self._state.stop_signal
        if sig is not None:
            self._state.set_phase(Phase.STOPPING)
            raise agent.stop_exception(sig, self._state.stop_reason)

    def _start_watchdog(self, sig: signal.Signals) -> None:
        # Give the agent a few monitor ticks to pick the stop up through torch's own path.
        interval = self._torchrun.monitor_interval
        deadline = time.monotonic() + max(1.0, 5 * interval)

        def tick() -> None:
            if self._state.settled():
                loop.stop()
            elif time.monotonic() >= deadline:
                loop.stop()
                # The agent is stuck where torch cannot be interrupted (rendezvous, exit
                # barrier, a slow start): stop the workers ourselves and end the run.
                self._ranks.kill_all(sig, grace=self._torchrun.shutdown_timeout)
                self._finish("stopped", signal_exit_code(sig), f"stopped by {sig.name}")

        loop = Periodic("tuilaunch-stop", 0.02, tick)
        self._watchdog = loop
        loop.start()
