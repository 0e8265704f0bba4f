"""The agent thread's idle wait: between two monitor ticks that find nothing to do, sleep until
something needs the agent, not ten times a second.

torch's agent loop sleeps ``--monitor-interval`` (0.1 s) and looks at its workers, over and over;
at idle that loop is most of what a launcher spends (``bench/bootstrap.py idle``). While a tick
finds nothing to act on (no worker can have exited, the group is healthy, nothing asked for),
the monitor waits here up to :data:`IDLE_PERIOD` before the next one, and is woken at once by
what it would have found: a worker's exit (one pidfd per worker, readable when it exits) or a
request the agent thread acts on (stop, restart, a confirmed hang: a byte on a pipe).

What a tick does besides is seen no later: torch's ``num_nodes_waiting`` (the c10d backend)
reads the rendezvous state at most once a second anyway (its state cache), and a lost node is
believed only after seconds (``docs/differences.md`` item 17 says what differs). Where pidfds
are missing (Linux before 5.3), the wait does not happen and the loop runs at torch's pace.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterable

# The longest idle wait between two monitor ticks, in seconds (torch's sleep included).
IDLE_PERIOD = 1.0


class AgentWake:
    """Pidfds of the current attempt's workers and a wake-up pipe, for :meth:`wait`.

    ``notify`` is safe from any thread; the rest is called on the agent thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pidfds: dict[int, int] = {}  # pid -> pidfd
        self._complete = False  # every watched worker has a pidfd
        self._pipe: tuple[int, int] | None = None  # opened with the first workers watched
        self._closed = False

    def notify(self) -> None:
        """Wake the agent thread's wait (now, or the next one if none is under way)."""
        with self._lock:
            if self._pipe is None:
                return  # no worker watched yet: no wait to end
            # A full pipe already holds a wake-up.
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._pipe[1], b"!")

    def watch(self, pids: Iterable[int]) -> None:
        """The workers of a new attempt: wait on these (the previous attempt's are dropped)."""
        opened: dict[int, int] = {}
        complete = hasattr(os, "pidfd_open")
        for pid in pids if complete else ():
            try:
                opened[pid] = os.pidfd_open(pid)
            except OSError:
                complete = False  # gone already, or no pidfds here: no idle wait
        with self._lock:
            if complete and opened and not self._closed and self._pipe is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                self._pipe = (r, w)
            complete = complete and bool(opened) and self._pipe is not None
            old, self._pidfds = self._pidfds, opened if complete else {}
            self._complete = complete
        for fd in [*old.values(), *(() if complete else opened.values())]:
            os.close(fd)

    def forget(self, pid: int) -> None:
        """``pid`` exited and was recorded: its pidfd would wake every wait from now on."""
        with self._lock:
            fd = self._pidfds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, less if a watched worker exits or :meth:`notify` is
        called. Returns at once (False) where the workers cannot be watched; True once it
        waited (woken or not)."""
        with self._lock:
            if not self._complete or self._pipe is None or timeout <= 0:
                return False
            r = self._pipe[0]
            poller = select.poll()
            poller.register(r, select.POLLIN)
            for fd in self._pidfds.values():
                poller.register(fd, select.POLLIN)
        with contextlib.suppress(InterruptedError):
            poller.poll(int(timeout * 1000))
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(r, 512):
                pass
        return True

    def close(self) -> None:
        """Close every descriptor (the agent thread is done)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            fds = [*self._pidfds.values(), *(self._pipe or ())]
            self._pidfds, self._pipe = {}, None
            self._complete = False
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
