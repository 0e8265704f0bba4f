"""``tuilaunch attach --control``: the attached dashboard with the keys that act on the job.

:class:`ControlSource` is the read-only :class:`~tui_launch.tui.sources.attach.AttachSource` (what
it
shows comes from the run's journal and log files, following their end) whose control calls go
to the launcher over its control socket (:mod:`tui_launch.core.remote.controlsock`). Each attached
client is its own process with its own view (selection, filter, scroll, cursor). The keys that
act (kill, SIGTERM, stop/continue, restart, inject, dump) work as in the launcher's own
dashboard and the destructive ones still ask y/n (unless ``--no-confirm``); ``q`` stops the job
(asking first, as in the launcher's dashboard), ``D`` leaves it running and closes this view.
"""

from __future__ import annotations

import os
import signal
import time

from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model.commands import Command, Outcome, StopRun
from tui_launch.core.remote.controlsock import ControlClient, ControlError
from tui_launch.tui.sources.attach import AttachSource

GONE_GRACE = 3.0  # seconds a dead launcher's journal gets to show its end
USAGE = "usage: tuilaunch attach [RUN_DIR|PID|RUN_ID] --control [--no-confirm] [--refresh-hz HZ]"
HELP = """usage: tuilaunch attach [RUN_DIR|PID|RUN_ID] [--control [--no-confirm]] [--refresh-hz HZ]

The dashboard on a job that runs now (default: the only live run of yours on this node).
Read-only by default: it reads the run's journal and log files and acts on nothing.
--control adds the keys that act (kill, SIGTERM, stop, restart, inject, dump, q stops the
job, D leaves it running) through the run's control socket: the run must have been started
with --control-socket or --detach, or detached with D."""


class ControlSource(AttachSource):
    """A running job, followed through its journal and steered through its control socket."""

    def __init__(self, timeline: Timeline, client: ControlClient, pid: int | None = None) -> None:
        super().__init__(timeline)
        self.client = client
        self.pid = pid  # the launcher's
        self.error = ""  # the last refusal or lost connection, for the notification
        self.closed = False  # the dashboard is leaving: a waiting thread must not hold it

    def send(self, cmd: Command) -> Outcome:
        """Have the launcher execute ``cmd`` over the socket (it names the client itself, so
        ``cmd.source`` is not trusted); a refusal or a lost connection is kept in
        :attr:`error` for the notification. A dump takes seconds: off the UI thread."""
        try:
            outcome = self.client.send(cmd)
        except ControlError as e:
            self.error = str(e)
            return Outcome(False, str(e))
        self.error = "" if outcome.ok else outcome.detail
        return outcome

    def stop(self, sig: int = signal.SIGTERM, reason: str = "quit") -> None:
        """Ask the launcher to stop the job (SIGTERM to the workers, as its own ``q``)."""
        self.send(StopRun(sig, reason, source="attach"))

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait until the journal says the run finished; its exit code (None: timeout).
        The UI thread keeps following the journal meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        gone_since: float | None = None
        while True:
            fin = self._snap.finished
            if fin is not None:
                return fin.exit_code
            if self.closed:
                return None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            # A launcher that died without a last word (SIGKILL) never writes RunFinished:
            # once it has been gone a few seconds (time to read what it did write), stop.
            if not self._launcher_alive():
                gone_since = gone_since or now
                if now - gone_since > GONE_GRACE:
                    return 1
            time.sleep(0.1)

    def _launcher_alive(self) -> bool:
        if self.pid is None:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    @property
    def done(self) -> bool:
        """Whether the run has finished (as far as the journal read so far says)."""
        return self._snap.finished is not None
