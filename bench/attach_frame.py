"""Benchmark: the CPU an attach spends on its first frame's state, before and after.

On a journal (e.g. ``bench/replay.py``'s synthetic 24-hour one, written with
``write_journal``), in this process, CPU time (``time.process_time``: the machine is shared,
wall clock would measure the others' load):

- ``index``: :class:`~tui_launch.core.journal.timeline.Timeline` indexes the whole file, as
``attach``
  does before anything else;
- ``full``: the state at the end by the full reduce (``Timeline.snapshot``: every state event
  parsed and folded), what ``attach`` computed before its first frame until now;
- ``recent``: :func:`~tui_launch.core.journal.recent.recent_snapshot`, what it computes now (the old
  telemetry records skipped); the two snapshots are checked equal but for the telemetry
  totals;
- ``source``: ``AttachSource(timeline)`` (the recent state and the rank logs cut at the end),
  on a freshly indexed timeline.

Usage::

    .venv/bin/python bench/attach_frame.py [--write] [--marks-per-s 1] [--path PATH] [--repeat 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay import write_journal

from tui_launch.core.journal.recent import recent_snapshot
from tui_launch.core.journal.timeline import Timeline
from tui_launch.tui.sources.attach import AttachSource


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of this process spent in ``fn()``, and its result."""
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/tuilaunch-attach-day.jsonl")
    ap.add_argument("--write", action="store_true", help="write the journal first")
    ap.add_argument("--marks-per-s", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.write:
        print("events written:", write_journal(a.path, a.marks_per_s))
    rows: dict[str, list[float]] = {"index": [], "full": [], "recent": [], "source": []}
    for _ in range(a.repeat):
        t, tl = cpu(lambda: Timeline(a.path))
        rows["index"].append(t)
        t, full = cpu(lambda: tl.snapshot(len(tl)))  # noqa: B023
        rows["full"].append(t)
        tl2 = Timeline(a.path)
        t, fast = cpu(lambda: recent_snapshot(tl2, len(tl2)))  # noqa: B023
        rows["recent"].append(t)
        assert fast.telemetry is not None and full.telemetry is not None
        strip = dataclasses.replace(fast.telemetry, totals=full.telemetry.totals)
        assert dataclasses.replace(fast, telemetry=strip) == full, "first frame differs"
        tl3 = Timeline(a.path)
        t, _ = cpu(lambda: AttachSource(tl3))  # noqa: B023
        rows["source"].append(t)
        for x in (tl, tl2, tl3):
            x.close()
    print(f"journal {a.path}: {len(Timeline(a.path))} events")
    for k, v in rows.items():
        print(
            f"{k:>7}: CPU median {statistics.median(v):.3f} s  (runs: "
            + ", ".join(f"{x:.3f}" for x in v)
            + ")"
        )


if __name__ == "__main__":
    main()
