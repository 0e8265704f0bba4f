"""Running without a terminal: ``D`` in the dashboard, and ``--detach`` from the start.

A detached launcher's own output (the headless event lines, the workers' console copy, the
summary, torch's C++ messages on fd 2) goes to ``console.log`` in the run directory: its
stdout and stderr are that file (``os.dup2``), its stdin is ``/dev/null``, and SIGHUP is
ignored, so that closing the terminal it came from (an SSH connection dropping, a tmux session
killed) does not stop the job. Until torch has made the run directory, the file is a private
one in the run index directory, moved into the run directory once it exists
(:meth:`Console.move_to`).

``--detach`` forks twice before anything starts (no thread runs yet): the grandchild, in a
session of its own (``setsid``), is the launcher; the original process prints how to attach
and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading

from tui_launch.core.model.layout import CONSOLE_NAME, RunDirLayout

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW


def redirect_stdio(path: str) -> None:
    """Point fd 1 and fd 2 at ``path`` (appending; created 0600) and fd 0 at /dev/null."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fd = os.open(path, _FLAGS, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)


def ignore_hangup() -> None:
    """From now on a hang-up stops nothing (call from the main thread, before the user is
    told the terminal may be closed)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Textual leaves its suspend/resume handlers behind after App.exit: a SIGCONT (tmux sends
    # one with the SIGHUP when its session is killed) would try to redraw the dashboard from
    # the headless loop and raise there. Back to the defaults.
    for sig in (signal.SIGCONT, signal.SIGTSTP, signal.SIGWINCH):
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)  # no terminal I/O from here on


class Console:
    """The launcher's console once it has no terminal.

    Args:
        spare_dir: a private directory (the run index's) for the file while the run directory
            does not exist yet; None: the temp directory.
    """

    def __init__(self, spare_dir: str | None = None) -> None:
        self.spare_dir = spare_dir
        self.path: str | None = None
        self._lock = threading.Lock()
        self._spare = False

    def detach(self, run_dir: str | None) -> str:
        """Leave the terminal: stdio to the console file, SIGHUP ignored from now on; returns
        the file's path (call from the main thread)."""
        ignore_hangup()
        with self._lock:
            if run_dir:
                self.path = RunDirLayout(run_dir).console_log
            else:
                fd, self.path = tempfile.mkstemp(
                    prefix=f"console-{os.getpid()}-", suffix=".log", dir=self.spare_dir
                )
                os.close(fd)
                self._spare = True
            redirect_stdio(self.path)
            return self.path

    def move_to(self, run_dir: str) -> None:
        """The run directory exists now: carry on in its ``console.log`` (any thread).

        Every descriptor of this process open on the spare file is pointed at the new one,
        not only 1 and 2: the headless stderr filter (``core/stderrpipe.py``) writes to a
        private copy of fd 2.
        """
        with self._lock:
            if not self._spare or self.path is None:
                return
            old, new = self.path, RunDirLayout(run_dir).console_log
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            try:
                spare = os.stat(old)
                with open(old, "rb") as src:
                    fd = os.open(new, _FLAGS, 0o600)
                    try:
                        os.write(fd, src.read())
                        for other in _fds_on(spare.st_dev, spare.st_ino):
                            if other != src.fileno():
                                os.dup2(fd, other, inheritable=other <= 2)
                        os.write(fd, src.read())  # what was written in between
                    finally:
                        os.close(fd)
                os.unlink(old)
            except OSError:
                return  # the spare file stays the console: nothing is lost
            self.path, self._spare = new, False


def _fds_on(dev: int, ino: int) -> list[int]:
    """This process's descriptors open on the file (dev, ino)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            st = os.fstat(int(name))
            if (st.st_dev, st.st_ino) == (dev, ino):
                found.append(int(name))
    return found


def daemonize() -> int | None:
    """Fork twice. In the launcher (the grandchild, in a new session) return None; in the
    original process return the launcher's pid once it called :func:`ready` (the
    intermediate child exits at once)."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as fp:
            data = fp.read()
        os.waitpid(first, 0)
        return int(data or b"0")
    # The intermediate child: a new session (no controlling terminal), then fork again so
    # that the launcher is no session leader and can never acquire a terminal.
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.write(write_end, str(os.getpid()).encode())
    # Kept open until the run is in the index (ready()): the original process returns once
    # `tuilaunch attach PID` can find it (or once this process has exited, whatever happened).
    _READY.append(write_end)
    return None


_READY: list[int] = []


def ready() -> None:
    """The detached launcher is registered in the run index: let ``--detach`` return."""
    while _READY:
        with contextlib.suppress(OSError):
            os.close(_READY.pop())


def attach_hint(pid: int) -> str:
    """What ``--detach`` prints: how to find and attach to the job."""
    return (
        f"tuilaunch: running in the background as pid {pid}; console output goes to "
        f"{CONSOLE_NAME} in its run directory (tuilaunch ls shows it).\n"
        f"  watch it:  tuilaunch attach {pid}\n"
        f"  steer it:  tuilaunch attach {pid} --control\n"
        f"  stop it:   kill {pid}"
    )


def detach_message(pid: int, run_dir: str | None) -> str:
    """What ``D`` leaves on the terminal it releases."""
    where = RunDirLayout(run_dir).console_log if run_dir else f"{CONSOLE_NAME} in the run dir"
    return (
        f"tuilaunch: detached; the job goes on (pid {pid}) and this terminal may be closed.\n"
        f"  console output: {where}\n"
        f"  the cockpit again: tuilaunch attach {pid} --control   (read-only: without --control)\n"
        "  your prompt back here: ctrl+z, then bg"
    )
