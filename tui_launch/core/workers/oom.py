"""Was it the kernel's OOM killer? The cgroup's own count, else the kernel log.

A rank killed by SIGKILL may have been killed by anyone; the kernel's OOM killer leaves two
traces this reads, where readable: the ``oom_kill`` count of the memory cgroup the workers run
in (cgroup v2 ``memory.events``; v1 ``memory.oom_control``), and a ``Killed process <pid>`` /
``oom-kill:...pid=<pid>`` line in the kernel log (``/dev/kmsg``). :class:`OomWatch` keeps the
count at an attempt's start, so a failure can ask whether it went up since.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

_KILLED = re.compile(r"(?:Killed process |oom-kill:.*?\bpid=)(\d+)")


def _read_count(path: str, key: str) -> int | None:
    try:
        with open(path) as fp:
            for line in fp:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def memory_cgroups(containment: str | None = None, proc: str = "/proc/self/cgroup") -> list[str]:
    """The files that count OOM kills for this process's workers: the run's cgroup (v2) and
    this process's own memory cgroup (v2 or v1)."""
    out: list[str] = []
    if containment:
        out.append(os.path.join(containment, "memory.events"))
    try:
        with open(proc) as fp:
            lines = fp.read().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2 (unified)
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                f = os.path.join(root, rel, "memory.events")
                if os.path.exists(f):
                    out.append(f)
                    break
        elif "memory" in controllers.split(","):
            out.append(os.path.join("/sys/fs/cgroup/memory", rel, "memory.oom_control"))
    return out


def oom_kills(files: list[str]) -> dict[str, int]:
    """The ``oom_kill`` count of each readable file."""
    out = {}
    for f in files:
        n = _read_count(f, "oom_kill")
        if n is not None:
            out[f] = n
    return out


def kernel_log_kills(path: str = "/dev/kmsg", limit: int = 1 << 20) -> set[int]:
    """Pids the kernel log says the OOM killer killed (empty where the log is unreadable)."""
    pids: set[int] = set()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return pids
    try:
        seen = 0
        while seen < limit:
            try:
                rec = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # a record was overwritten: go on
                    continue
                break  # EAGAIN: the end of the log
            if not rec:
                break
            seen += len(rec)
            m = _KILLED.search(rec.decode(errors="replace"))
            if m:
                pids.add(int(m.group(1)))
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return pids


class OomWatch:
    """The OOM-kill counts at an attempt's start, and where they went up since."""

    def __init__(self, containment: str | None = None) -> None:
        self._files = memory_cgroups(containment)
        self._start: dict[str, int] = {}

    def attempt_started(self) -> None:
        """Note the counts now."""
        self._start = oom_kills(self._files)

    def since_start(self, pid: int) -> str | None:
        """Where an OOM kill since the attempt's start shows (None: nowhere readable)."""
        for f, n in oom_kills(self._files).items():
            if n > self._start.get(f, n):
                return f"the run's cgroup ({os.path.basename(f)} oom_kill +{n - self._start[f]})"
        if pid in kernel_log_kills():
            return f"the kernel log: Killed process {pid}"
        return None
