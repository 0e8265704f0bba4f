"""Stale run cgroups: what a launcher SIGKILLed together with its reaper left behind.

The reaper removes the run's cgroup when the launcher dies; when both die at once (one
``kill -9`` of the whole session, an OOM kill of both), the workers train on in the run's
cgroup and nobody is left to end them. Every run's cgroup is named after its launcher's pid
and that pid's start time (:data:`~tui_launch.core.workers.reaper.CGROUP_NAME`), so the next
tuilaunch of this user (``ls``, ``attach``, ``status``, a launch) can tell a dead launcher's
cgroup from a live one's: :func:`sweep_stale` kills what is in it (``cgroup.kill``) and
removes it. A cgroup whose launcher is still there (same pid, same start time) is never
touched, nor one of another user, nor one whose name does not carry a start time.
"""

from __future__ import annotations

import contextlib
import os
import re
import time

from tui_launch.core.workers.env import start_time
from tui_launch.core.workers.reaper import cgroup2_dir
from tui_launch.core.workers.table import process_alive

# tuilaunch-<launcher pid>-<its start time in clock ticks since boot>-<tag>
_NAME = re.compile(r"tuilaunch-(\d+)-(\d+)-[0-9a-f]{8}")


def _alive(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (a zombie is not)."""
    began = start_time(pid)
    if began is None:
        # Gone; or there but unreadable, and then never killed on a doubt.
        return os.path.exists(f"/proc/{pid}")
    return began == start and process_alive(pid)


def stale_cgroups(parent: str | None = None) -> list[str]:
    """This user's run cgroups in ``parent`` (default: where this process would make one)
    whose launcher is gone."""
    parent = parent or cgroup2_dir()[0]
    if parent is None:
        return []
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    out = []
    for name in names:
        m = _NAME.fullmatch(name)
        path = os.path.join(parent, name)
        if m is None or _alive(int(m[1]), int(m[2])):
            continue
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == os.getuid():
                out.append(path)
    return out


def sweep_stale(parent: str | None = None, timeout: float = 5.0) -> list[str]:
    """Kill everything in each stale run cgroup and remove it; the cgroups removed."""
    removed = []
    for path in stale_cgroups(parent):
        with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.kill"), "w") as fp:
            fp.write("1")
        deadline = time.monotonic() + timeout
        while True:  # rmdir succeeds once the killed processes have left the cgroup
            try:
                os.rmdir(path)
            except FileNotFoundError:
                break  # its reaper (or another sweep) got there first
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                break
            removed.append(path)
            break
    return removed
