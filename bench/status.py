"""Benchmark: ``tuilaunch status --json`` on journals of one hour and one day (goal ≤ 0.5 s).

The synthetic journals of ``bench/replay.py`` (8 ranks, a failure and a restart every 2 hours,
a telemetry record every 10 s, ``--marks-per-s`` log marks a second), for ``--hours`` each.
For each: the wall time of the real command, ``python -m tui_launch status PATH --json`` in a
fresh interpreter (median and max of ``--repeat``; wall time, and its CPU time, which the
others' load on a shared machine disturbs far less), beside the floor (``python -c "import
tui_launch.core.remote.status"``: the interpreter and the imports), and, in this process, the CPU of
:func:`~tui_launch.core.remote.status.status` (``time.process_time``: the machine is shared).

Usage::

    .venv/bin/python bench/status.py [--hours 1 24] [--marks-per-s 1] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import write_journal

from tui_launch.core.remote.status import resolve, status

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system) of ``cmd``, ``repeat`` times."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, nargs="+", default=[1, 24])
    ap.add_argument("--marks-per-s", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    py = sys.executable
    floor, floor_cpu = wall([py, "-c", "import tui_launch.core.remote.status"], a.repeat)
    print(
        f"floor (interpreter + imports): wall median {statistics.median(floor):.3f} s, "
        f"CPU median {statistics.median(floor_cpu):.3f} s"
    )
    print(
        "| journal | events | size | `status --json` wall: median / max "
        "| its CPU: median / max | in-process CPU of status() |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for hours in a.hours:
            path = os.path.join(tmp, f"journal-{hours:g}h.jsonl")
            events = write_journal(path, a.marks_per_s, int(hours * 3600))
            size = os.path.getsize(path) / 1e6
            times, cpus = wall([py, "-m", "tui_launch", "status", path, "--json"], a.repeat)
            target = resolve(path)
            cpu = []
            for _ in range(a.repeat):
                t0 = time.process_time()
                status(target)
                cpu.append(time.process_time() - t0)
            print(
                f"| {hours:g} h | {events:,} | {size:.1f} MB | {statistics.median(times):.3f} / "
                f"{max(times):.3f} s | {statistics.median(cpus):.3f} / {max(cpus):.3f} s "
                f"| {statistics.median(cpu):.3f} s |"
            )


if __name__ == "__main__":
    main()
