"""Wake a loop when files change: one thread blocked on Linux's inotify (``tuilaunch-fswatch``).

The log tailer and the NCCL dump watch look at files that are quiet most of a run (a training
loop prints a line a second or less; NCCL writes a dump only on a timeout). Polling them costs
the launcher CPU on every node all run long; with :class:`FsWatch` a loop may sleep long and
be woken (:meth:`~tui_launch.core.periodic.Periodic.wake`) the moment something is written in a
directory it watches.

- :meth:`FsWatch.watch` returns False where inotify cannot watch (not Linux, no libc symbol,
  the user's watch limit reached, a directory that does not exist yet): the caller keeps
  polling at its usual pace then. A watch is a safety net's complement, never the only way a
  change is seen: callers keep a slow poll (inotify misses writes made on other machines to a
  network file system).
- Events are coalesced: after a wake-up the thread lets further events gather for
  ``COALESCE`` seconds before reading again, so a flood of writes costs a few wake-ups a
  second, not one per ``write(2)``.
- Nothing here is torch's or textual's: ``ctypes`` and ``select`` only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable

__all__ = ["COALESCE", "FsWatch"]

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000
MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

# Seconds a woken thread waits before it reads the next events: writes in a flood are then
# merged into one wake-up of each loop (inotify also folds identical unread events).
COALESCE = 0.05


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


class FsWatch:
    """Call a function whenever something is written in a watched directory.

    One daemon thread blocks in ``select`` on an inotify descriptor and a wake-up pipe; it
    costs nothing while the directories are quiet. Callbacks run on that thread and must be
    quick (``Periodic.wake``); one that raises is logged and kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._libc: ctypes.CDLL | None = None
        self._wds: dict[int, tuple[str, list[Callable[[], object]]]] = {}
        self._by_dir: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._stopped = False
        self._broken = False  # inotify could not be opened here: every watch() says False
        self.wakeups = 0  # how many times the thread woke (the benchmark's and tests' figure)

    @property
    def available(self) -> bool:
        """Whether inotify works here (opened on the first :meth:`watch`)."""
        return self._open()

    def _open(self) -> bool:
        with self._lock:
            if self._fd >= 0:
                return True
            if self._stopped or self._broken:
                return False
            libc = _libc()
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC) if libc is not None else -1
            if fd < 0:
                self._broken = True
                return False
            self._libc, self._fd = libc, fd
            self._pipe = os.pipe()
            for end in self._pipe:
                os.set_blocking(end, False)
            self._thread = threading.Thread(target=self._run, name="tuilaunch-fswatch", daemon=True)
            self._thread.start()
            return True

    def watch(self, directory: str, callback: Callable[[], object]) -> bool:
        """Call ``callback()`` after files in ``directory`` (not below it) are created or
        written; False if it cannot be watched (poll it instead)."""
        if not self._open():
            return False
        path = os.path.abspath(directory)
        with self._lock:
            if self._libc is None or self._fd < 0:
                return False
            wd = self._by_dir.get(path)
            if wd is None:
                wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), MASK)
                if wd < 0:  # ENOENT, ENOSPC (the watch limit), EACCES: the caller polls
                    return False
                self._by_dir[path] = wd
                self._wds[wd] = (path, [])
            callbacks = self._wds[wd][1]
            if callback not in callbacks:
                callbacks.append(callback)
            return True

    def unwatch(self, directory: str, callback: Callable[[], object] | None = None) -> None:
        """Stop calling ``callback`` (None: every callback) for ``directory``."""
        path = os.path.abspath(directory)
        with self._lock:
            wd = self._by_dir.get(path)
            if wd is None:
                return
            callbacks = self._wds[wd][1]
            if callback is not None:
                with contextlib.suppress(ValueError):
                    callbacks.remove(callback)
            if callback is None or not callbacks:
                del self._by_dir[path], self._wds[wd]
                if self._libc is not None and self._fd >= 0:
                    self._libc.inotify_rm_watch(self._fd, wd)

    def stop(self) -> None:
        """End the thread and close the descriptors."""
        with self._lock:
            self._stopped = True
            pipe, thread = self._pipe, self._thread
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe[1], b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(2)
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._pipe is not None:
                for end in self._pipe:
                    os.close(end)
                self._pipe = None
            self._wds.clear()
            self._by_dir.clear()

    def _read(self) -> set[int] | None:
        """The watch descriptors with events (None: the queue overflowed, wake every one)."""
        wds: set[int] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return wds
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return wds
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, pos)
                pos += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    return None
                if not mask & IN_IGNORED:
                    wds.add(wd)

    def _run(self) -> None:
        fd, pipe = self._fd, self._pipe
        assert pipe is not None
        poller = select.poll()  # not select(): a launcher may hold descriptors past 1024
        poller.register(fd, select.POLLIN)
        poller.register(pipe[0], select.POLLIN)
        while not self._stopped:
            try:
                ready = {f for f, _ in poller.poll()}
            except OSError:
                return  # closed under us: stopping
            if self._stopped or pipe[0] in ready:
                return
            self.wakeups += 1
            wds = self._read()
            with self._lock:
                targets = [
                    cb
                    for wd, (_, cbs) in self._wds.items()
                    if wds is None or wd in wds
                    for cb in cbs
                ]
            for cb in dict.fromkeys(targets):
                try:
                    cb()
                except Exception:
                    logging.getLogger(__name__).exception("fswatch callback failed")
            time.sleep(COALESCE)  # let a flood's next writes gather into one event
