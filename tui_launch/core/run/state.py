"""The run's shared state: its phase, the requests the agent thread acts on, its end.

:class:`RunState` is the one holder of what several threads of a run read and write: the phase
(the agent thread writes it, commands and watchers read it), the stop and restart requests
(commands set them, the agent thread takes them at its next monitor tick) and the claim to
finish the run (the agent thread, the stop watchdog and a second stop may race for it). The
parts get the state itself, not callbacks into the runner.

Lock order: the rank table's lock (:class:`~tui_launch.core.workers.table.RankTable`) before
this one (a ``slow`` injection asks :meth:`RunState.monitored` while it holds the table's);
nothing here calls out while holding it.
"""

from __future__ import annotations

import signal
import threading

from tui_launch.core.model.store import OUTCOMES, Phase
from tui_launch.core.run.wake import AgentWake


class RunState:
    """The phase, the stop and restart requests and the outcome of one run (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase = Phase.STARTING
        self._restart_requested = False
        self._stop_signal: signal.Signals | None = None
        self._stop_reason = ""
        self._finishing = False
        self.exit_code: int | None = None  # written once, by the one finisher
        self.error_message: str | None = None
        # Set once the run's last step is done: the front ends wait for it.
        self.done = threading.Event()
        # The agent thread's idle wait: every request below wakes it.
        self.wake = AgentWake()

    # ------------------------------------------------------------------ the phase

    @property
    def phase(self) -> Phase:
        """Where the agent thread is, in the snapshot's words (:class:`~.store.Phase`)."""
        with self._lock:
            return self._phase

    def set_phase(self, phase: Phase) -> None:
        """The agent thread moved on (a finished run's phase is its outcome, never changed)."""
        with self._lock:
            self._phase = phase

    def monitored(self) -> bool:
        """Whether the agent is watching a running group and no stop was asked for."""
        with self._lock:
            return self._phase == Phase.RUNNING and self._stop_signal is None

    def settled(self) -> bool:
        """Whether the agent picked a stop up (or the run is over)."""
        return self.done.is_set() or self.phase in (Phase.STOPPING, *OUTCOMES)

    # ------------------------------------------------------------------ requests

    def request_restart(self) -> str | None:
        """Ask the agent thread for a restart at its next tick; None if accepted, else why not
        ("agent is restarting")."""
        with self._lock:
            if self._phase == Phase.RUNNING and self._stop_signal is None:
                self._restart_requested = True
            else:
                return f"agent is {self._phase}"
        self.wake.notify()
        return None

    def take_restart(self) -> bool:
        """On the agent thread: whether a restart was asked for since the last look."""
        with self._lock:
            asked, self._restart_requested = self._restart_requested, False
        return asked

    def request_stop(self, sig: signal.Signals, reason: str) -> bool:
        """Record a stop request; True for the first one (later ones keep its signal)."""
        with self._lock:
            if self._stop_signal is not None:
                return False
            self._stop_signal, self._stop_reason = sig, reason
        self.wake.notify()
        return True

    @property
    def stop_signal(self) -> signal.Signals | None:
        """The signal of the first stop request (None: no stop asked for)."""
        return self._stop_signal

    @property
    def stop_reason(self) -> str:
        """Why the first stop was asked for."""
        return self._stop_reason

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was asked for."""
        return self._stop_signal is not None

    # ------------------------------------------------------------------ the end

    def claim_finish(self, outcome: str, code: int, message: str) -> bool:
        """Record the run's outcome; True for the one caller that goes on to finish it (two
        threads may finish at once: the agent thread and the stop watchdog or a second stop)."""
        with self._lock:
            if self._finishing:
                return False
            self._finishing = True
            self._phase = Phase(outcome)
            self.exit_code = code
            self.error_message = message if outcome == "error" else None
            return True
