"""A watchdog process that kills the workers if the launcher dies without cleaning up.

torch starts each worker in a new session and sets no parent-death signal, so when torchrun is
SIGKILLed its workers train on as orphans. tuilaunch starts one small reaper process at launch
and tells it, over a pipe, the pid and process group of every worker it spawns. When the pipe
reaches end-of-file without a goodbye, the launcher is gone: the reaper SIGCONTs and SIGKILLs
every registered process group (data-loader children included) and exits. A normal shutdown
says goodbye first, so nothing is killed twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

# Runs in a bare interpreter (-I -S): stdlib only, no imports from this package.
_REAPER = r"""
import os, signal, sys
groups = {}
for line in sys.stdin.buffer:
    parts = line.split()
    if not parts:
        continue
    if parts[0] == b"bye":
        sys.exit(0)
    if parts[0] == b"add" and len(parts) == 3:
        groups[int(parts[1])] = int(parts[2])
    elif parts[0] == b"del" and len(parts) == 2:
        groups.pop(int(parts[1]), None)
for pid, pgid in groups.items():
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            if pgid == pid:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass
"""


class Reaper:
    """Handle on the reaper process. All methods are safe to call from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a ^C on the terminal or a signal to our group must not take
            # the watchdog down before the workers.
            start_new_session=True,
        )

    @property
    def pid(self) -> int | None:
        """The reaper's pid (None once it has been told goodbye)."""
        return self._proc.pid if self._proc else None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def watch(self, pid: int) -> None:
        """Kill ``pid`` (and its process group when it leads one) if the launcher dies."""
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return
        if pgid == os.getpgid(0):
            pgid = -1  # never our own group: that would kill the launcher's terminal peers
        self._send(f"add {pid} {pgid}")

    def forget(self, pid: int) -> None:
        """``pid`` has exited and was reaped: do not kill its (possibly reused) id later."""
        self._send(f"del {pid}")

    def close(self) -> None:
        """Say goodbye: the launcher cleaned up itself, the reaper exits killing nothing."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"bye\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
