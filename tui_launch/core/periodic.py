"""One background loop: a named daemon thread, one stop event, a schedule that does not drift.

Every sampler and watcher of the core (telemetry, the rendezvous sampler, the cluster
publisher, the log tailer, the stop watchdog, the hang detector) runs on a :class:`Periodic`,
so that each has the same stop, wake and error conventions:

- ``setup`` (optional) runs once on the loop's own thread before anything else (opening a
  library whose handles belong to the thread that uses them); the grid starts after it.
- ``fn`` is called on the loop's own thread, first at ``start() + first_delay``, then every
  ``interval`` seconds on a fixed grid (tick k is due at ``t0 + k * interval``). A tick that
  could not be kept (a suspended process, a slow call) is skipped, not bunched.
- ``fn`` may return a number: the delay to the next call instead of the grid (back-off loops
  such as the log tailer's). The grid restarts from that call.
- ``wake()`` runs the next call now; ``stop()`` ends the loop (after an optional last call).
- An exception from ``fn`` never ends the loop: it is handed to ``on_error`` (default: kept
  in :attr:`Periodic.error`) and the loop goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Periodic:
    """Call ``fn`` every ``interval`` seconds on one daemon thread until :meth:`stop`.

    Args:
        name: the thread's name (``tuilaunch-...``), as seen in py-spy and thread dumps.
        interval: seconds between calls; may be changed while running.
        fn: the work of one tick. Returns None (keep the grid) or the seconds to wait next.
        first_delay: seconds before the first call (default 0: at once).
        on_error: called with an exception ``fn`` raised (default: stored in ``error``).
        final_call: call ``fn`` once more when stopped (a last publish, a last drain).
        nice: lower the thread's scheduling priority by this much (the observer must not slow
            the observed); 0 leaves it.
        setup: called once on the thread before the first delay; its CPU time counts in
            ``cpu_seconds`` and is kept in ``setup_cpu_seconds``. An exception from it goes to
            ``on_error`` and the loop goes on.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        fn: Callable[[], float | None],
        *,
        first_delay: float = 0.0,
        on_error: Callable[[BaseException], None] | None = None,
        final_call: bool = False,
        nice: int = 0,
        setup: Callable[[], object] | None = None,
    ) -> None:
        self.name = name
        self.interval = float(interval)
        self._fn = fn
        self._first_delay = max(0.0, float(first_delay))
        self._on_error = on_error
        self._final_call = final_call
        self._nice = nice
        self._setup = setup
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.ticks = 0
        self.cpu_seconds = 0.0  # thread CPU spent in setup and fn: what the loop costs
        self.setup_cpu_seconds = 0.0

    @property
    def running(self) -> bool:
        """Whether the loop's thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def start(self) -> Periodic:
        """Start the thread (once); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        """Run the next call now instead of at its time."""
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """End the loop; wait up to ``timeout`` seconds for its thread (None: do not wait)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if timeout is not None and t is not None and t is not threading.current_thread():
            t.join(timeout)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` on this loop's stop event; True once stopped.

        For code running inside ``fn`` that must pause (a confirmation window) and still
        leave promptly on :meth:`stop`.
        """
        return self._stop.wait(seconds)

    def _failed(self, e: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(e)
        else:
            self.error = e

    def _call(self) -> float | None:
        c0 = time.thread_time()
        try:
            return self._fn()
        except Exception as e:  # a loop never takes anything down
            self._failed(e)
            return None
        finally:
            self.cpu_seconds += time.thread_time() - c0
            self.ticks += 1

    def _run_setup(self) -> None:
        if self._setup is None:
            return
        c0 = time.thread_time()
        try:
            self._setup()
        except Exception as e:
            self._failed(e)
        finally:
            self.setup_cpu_seconds = time.thread_time() - c0
            self.cpu_seconds += self.setup_cpu_seconds

    def _sleep(self, seconds: float) -> bool:
        """Wait for the next tick; True when the loop must end."""
        if seconds > 0 and not self._wake.is_set():
            self._wake.wait(seconds)
        self._wake.clear()
        return self._stop.is_set()

    def _run(self) -> None:
        if self._nice:
            import contextlib
            import os

            # Relative to the thread that started the loop, as nice(1) is: a launcher run
            # under `nice` keeps its background loops below itself, never above.
            with contextlib.suppress(OSError, AttributeError):
                tid = threading.get_native_id()
                current = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(current + self._nice, 19))
        self._run_setup()
        if self._sleep(self._first_delay):
            if self._final_call:
                self._call()
            return
        t0 = time.monotonic()
        k = 0
        while True:
            delay = self._call()
            now = time.monotonic()
            if delay is not None:
                t0, k = now + max(0.0, delay), 0
                due = t0
            else:
                k += 1
                due = t0 + k * self.interval
                if due < now:  # missed ticks are skipped, never bunched
                    k = int((now - t0) / self.interval) + 1 if self.interval > 0 else k
                    due = t0 + k * self.interval
            if self._sleep(due - now):
                break
        if self._final_call:
            self._call()
