"""Processes: each rank's process tree, its CPU %, RSS, threads and state.

:class:`ProcessSampler` reads ``/proc/<pid>/stat`` directly (one read per process; psutil reads
three files for the same figures) and falls back to psutil where there is no ``/proc``. A rank's
figures are summed over its whole tree (data-loader workers included). psutil is imported when
a sampler is made, not when this module is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Process states as psutil names them (``/proc/<pid>/stat``'s letters).
STATUS_ZOMBIE = "zombie"
STATUS_DISK_SLEEP = "disk-sleep"
_STATES = {
    b"R": "running",
    b"S": "sleeping",
    b"D": STATUS_DISK_SLEEP,
    b"Z": STATUS_ZOMBIE,
    b"T": "stopped",
    b"t": "tracing-stop",
    b"X": "dead",
    b"x": "dead",
    b"K": "wake-kill",
    b"W": "waking",
    b"P": "parked",
    b"I": "idle",
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class TreeReading:
    """A rank's process tree at one tick."""

    pids: tuple[int, ...]
    cpu: float | None
    rss: int | None
    threads: int | None
    status: str | None
    d_state: int


class ProcessSampler:
    """Per rank CPU %, RSS, threads and state over the rank's whole process tree.

    Each process is one read of ``/proc/<pid>/stat`` (psutil, where there is no ``/proc``, reads
    three files for the same figures). Children are found each tick through
    ``/proc/<pid>/task/<pid>/children`` (cheap: one small read per process). Both files stay
    open while their process lives and are read again from offset 0 (``pread``): opening
    them was most of a tick's cost. Every
    ``full_scan_every`` ticks a scan of every process's parent also catches children forked from
    other threads. RSS is summed over the tree, so pages shared between a rank and its forked
    data-loader workers count more than once, as in ``top``.
    """

    def __init__(self, full_scan_every: int = 30) -> None:
        import psutil

        self._psutil = psutil
        self.full_scan_every = max(1, full_scan_every)
        self._procs: dict[int, Any] = {}
        self._cpu: dict[int, tuple[float, float]] = {}
        self._ticks = 0
        self._fds: dict[tuple[int, str], int] = {}  # (pid, what) -> an open /proc file
        self._children_file = True
        self._proc_stat = os.path.exists(f"/proc/{os.getpid()}/stat")

    def sample(self, pids: Iterable[int]) -> dict[int, TreeReading]:
        """Read each root pid's tree; a pid that is gone gives a reading of Nones."""
        self._ticks += 1
        roots = list(pids)
        ppid_map: dict[int, int] | None = None
        if not self._children_file or (self._ticks - 1) % self.full_scan_every == 0:
            try:
                ppid_map = self._psutil._pslinux.ppid_map()  # one scan of /proc for all roots
            except Exception:
                ppid_map = None
        children_of: dict[int, list[int]] | None = None
        if ppid_map is not None:
            children_of = {}
            for child, parent in ppid_map.items():
                children_of.setdefault(parent, []).append(child)
        now = time.monotonic()
        out: dict[int, TreeReading] = {}
        seen: set[int] = set()
        for root in roots:
            tree = self._tree(root, children_of)
            seen.update(tree)
            out[root] = self._read_tree(root, tree, now)
        for pid in list(self._procs):
            if pid not in seen:
                self._procs.pop(pid, None)
        for pid in list(self._cpu):
            if pid not in seen:
                self._cpu.pop(pid, None)
        for key in [k for k in self._fds if k[0] not in seen]:
            self._close(key)
        return out

    def _read(self, pid: int, what: str, path: str) -> bytes:
        """``path`` (a ``/proc`` file of ``pid``) read whole, through a descriptor kept open;
        OSError once the process is gone (its descriptor is closed then)."""
        key = (pid, what)
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, 4096, 0)
            while len(data) % 4096 == 0 and data:  # a long children list: read it all
                more = os.pread(fd, 4096, len(data))
                if not more:
                    break
                data += more
        except OSError:
            self._close(key)
            raise
        if not data and what == "stat":  # a reaped process's file reads empty
            self._close(key)
            raise ProcessLookupError(pid)
        return data

    def _close(self, key: tuple[int, str]) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close the ``/proc`` files kept open."""
        for key in list(self._fds):
            self._close(key)

    def _tree(self, root: int, children_of: dict[int, list[int]] | None) -> list[int]:
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            if pid in tree:
                continue
            tree.append(pid)
            if children_of is not None:
                todo.extend(children_of.get(pid, ()))
                continue
            try:
                data = self._read(pid, "children", f"/proc/{pid}/task/{pid}/children")
                todo.extend(int(c) for c in data.split())
            except FileNotFoundError:
                if os.path.exists(f"/proc/{pid}"):
                    self._children_file = False  # kernel without it: scan every tick
            except (OSError, ValueError):
                pass
        return tree

    def _read_tree(self, root: int, tree: list[int], now: float) -> TreeReading:
        cpu_total: float | None = None
        rss_total: int | None = None
        threads: int | None = None
        status: str | None = None
        d_state = 0
        alive: list[int] = []
        for pid in tree:
            reading = self._read_proc(pid) if self._proc_stat else self._read_psutil(pid)
            if reading is None:  # gone (a dead process's children file still reads empty)
                self._close((pid, "children"))
                continue
            st, used, rss, nth = reading
            if st == STATUS_ZOMBIE:
                if pid == root:
                    status = st
                continue
            alive.append(pid)
            if pid == root:
                status = st
            if st == STATUS_DISK_SLEEP:
                d_state += 1
            last = self._cpu.get(pid)
            self._cpu[pid] = (used, now)
            if last is not None and now > last[1]:
                pct = max(0.0, (used - last[0]) / (now - last[1]) * 100.0)
                cpu_total = (cpu_total or 0.0) + pct
            rss_total = (rss_total or 0) + rss
            threads = (threads or 0) + nth
        return TreeReading(
            pids=tuple(alive) or (root,),
            cpu=round(cpu_total, 1) if cpu_total is not None else None,
            rss=rss_total,
            threads=threads,
            status=status,
            d_state=d_state,
        )

    def _read_proc(self, pid: int) -> tuple[str, float, int, int] | None:
        """(state, CPU seconds, RSS bytes, threads) from one read of ``/proc/<pid>/stat``:
        what psutil reads from three files, at a third of its cost."""
        try:
            data = self._read(pid, "stat", f"/proc/{pid}/stat")
            f = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and ")"
            used = (int(f[11]) + int(f[12])) / _CLOCK_TICKS  # utime, stime
            return _STATES.get(f[0], f[0].decode()), used, int(f[21]) * _PAGE_SIZE, int(f[17])
        except (OSError, ValueError, IndexError):
            return None

    def _read_psutil(self, pid: int) -> tuple[str, float, int, int] | None:
        """The same through psutil, where there is no ``/proc``."""
        psutil = self._psutil
        p = self._procs.get(pid)
        try:
            if p is None:
                p = self._procs[pid] = psutil.Process(pid)
            with p.oneshot():
                st = p.status()
                if st == STATUS_ZOMBIE:
                    return st, 0.0, 0, 0
                t = p.cpu_times()
                return st, t.user + t.system, int(p.memory_info().rss), int(p.num_threads())
        except psutil.ZombieProcess:
            return STATUS_ZOMBIE, 0.0, 0, 0
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            return None


__all__ = ["STATUS_DISK_SLEEP", "STATUS_ZOMBIE", "ProcessSampler", "TreeReading"]
