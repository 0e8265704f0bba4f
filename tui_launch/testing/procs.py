"""Processes of a launch found by the token in their environment, and what they use.

Tests and benchmarks give each launch a unique ``VAR=token`` in its environment; every process
it starts inherits it, whatever became of its parents, so a scan of ``/proc`` finds what a
launch left behind. (The launcher's own reaper has its copy of the scan in
:mod:`tui_launch.core.workers.reaper`: it runs as source text in a bare interpreter.)
"""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def env_holders(var: str, value: str) -> list[int]:
    """Live (not zombie) processes, this one aside, whose environment holds ``var=value``."""
    needle = f"{var}={value}".encode() + b"\0"
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fp:
                if needle not in fp.read() + b"\0":
                    continue
            with open(f"/proc/{entry}/stat") as fp:
                if fp.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except (OSError, IndexError):
            continue
        found.append(int(entry))
    return found


def cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of ``pid`` (every thread); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            fields = fp.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fp:
            for line in fp:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None
