"""NCCL's dump-on-timeout files, read the moment they appear (``tuilaunch-ncclwatch``).

Unless ``--no-bootstrap``, every rank's NCCL watchdog writes its Flight Recorder to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank when a collective times out (the variable is the
attempt's stem in the run's Flight Recorder directory, ``<host>.attempt<A>.rank_``).
:class:`NcclDumpWatch` looks at the files of the running attempt's stem every second (where
inotify watches their directory, only when something is written there, and every
:data:`QUIET` seconds as a safety net); once
a set of them has stopped growing for one look, it reads and judges
them (:mod:`~tui_launch.core.diagnosis.frdump`, :mod:`~tui_launch.core.diagnosis.frjudge`,
``tuilaunch why``'s judge) and posts the verdict as a
:class:`~tui_launch.core.model.events.FlightRecorderVerdict` (journaled: the dashboard's Stacks
tab, the headless output, the report, a replay and an attach show it), again whenever more
files arrive. A look that finds nothing new costs one ``scandir``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from tui_launch.core.diagnosis import frdump, frjudge
from tui_launch.core.fswatch import FsWatch
from tui_launch.core.model.events import Event, Notice
from tui_launch.core.periodic import Periodic

__all__ = ["PREFIX", "QUIET", "NcclDumpWatch"]

# Seconds between two looks at a watched directory where nothing was written.
QUIET = 10.0

# torch's own default name of the dump files (TORCH_NCCL_DEBUG_INFO_TEMP_FILE unset: in /tmp),
# + rank; tuilaunch sets the variable to an attempt's stem (core/seam/flightrec.py).
PREFIX = "nccl_trace_rank_"


class NcclDumpWatch:
    """Judge the NCCL dumps of ``stem()`` (None: not armed) as soon as they are complete.

    Args:
        post: where the verdict goes (the store's ``post``).
        stem: the running attempt's dump stem (a directory and the start of the files'
            names, as ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), read at each look.
        attempt: the attempt whose files ``stem`` names, for the event.
        interval: seconds between looks (while files are being written, or unwatched).
        fswatch: wakes the watch when its directory is written (None: look every interval).
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        stem: Callable[[], str | None],
        attempt: Callable[[], int] = lambda: 0,
        interval: float = 1.0,
        fswatch: FsWatch | None = None,
    ) -> None:
        self._post = post
        self._interval = interval
        self._fswatch = fswatch
        self._watching: str | None = None  # the directory the file watch covers
        self._stem = stem
        self._attempt = attempt
        self._seen: dict[str, tuple[int, int]] = {}
        self._judged: dict[str, tuple[int, int]] = {}
        self.verdicts: list[str] = []
        self._loop = Periodic("tuilaunch-ncclwatch", interval, self._tick, nice=10)

    def start(self) -> None:
        """Start looking."""
        self._loop.start()

    def stop(self) -> None:
        """Stop, with a last look (dumps written just before the run's end are judged)."""
        self._loop.stop()
        self._watch(None)
        self.look()

    def _watch(self, directory: str | None) -> None:
        """Have the file watch wake the loop on writes to ``directory`` (None: none)."""
        if directory == self._watching or self._fswatch is None:
            return
        if self._watching is not None:
            self._fswatch.unwatch(self._watching, self._loop.wake)
            self._watching = None
        if directory is not None and self._fswatch.watch(directory, self._loop.wake):
            self._watching = directory

    def _tick(self) -> float:
        """A look; the next one in ``interval`` while files settle or nothing wakes the loop,
        else in :data:`QUIET` seconds (a write wakes it sooner)."""
        settling = self.look()
        return self._interval if settling or self._watching is None else QUIET

    def _files(self, directory: str, prefix: str) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    if entry.name.startswith(prefix):
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            out[entry.name] = (st.st_size, st.st_mtime_ns)
        except OSError:
            return {}
        return out

    def look(self) -> bool:
        """One look: judge the files when they are there, unchanged since the last look, and
        not judged as they are. True while some are still to be judged (they may grow)."""
        stem = self._stem()
        if not stem:
            return False
        directory, prefix = os.path.split(stem)
        if not self._loop.stopped:
            self._watch(directory)
        files = self._files(directory, prefix)
        stable = bool(files) and files == self._seen
        self._seen = files
        if not stable or files == self._judged:
            return bool(files) and files != self._judged
        self._judged = files
        try:
            found = frdump.load_dir(directory, prefix)
        except frdump.HostileDump as e:
            self._post(Notice("warning", f"flight recorder: {e}"))
            return False
        if not found.dumps:
            return False
        verdict = frjudge.judge(found)
        self.verdicts.append(verdict.text)
        self._post(verdict.event(self._attempt(), "nccl", stem))
        return False
