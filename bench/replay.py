"""Benchmark: ``tuilaunch replay`` on a synthetic 24-hour journal.

The journal (written once, to ``--path``) is a 24-hour run of 8 ranks on 8 (fake) GPUs:
telemetry records every 10 s (8,640), a failure and a restart every 2 hours, and log marks,
``--marks-per-s`` a second with all 16 streams' offsets. tuilaunch itself writes at most one
log mark a second (``--marks-per-s 1``: a real 24-hour journal at these rates is ~100,000
events); the default of 10 a second makes the ~1,000,000 events the issue asks for, so the
index and the log-cut path carry ten times what a real day gives them.

Measured, in this process (the numbers a replay's UI thread sees):

- ``open``: :class:`~tui_launch.core.replay.Timeline` indexes the file (no JSON parsed);
- ``rss``: the process's peak RSS after the open, and after every checkpoint was computed;
- ``precompute``: computing the snapshots every 1,000 events (``Timeline.precompute``, which a
  replay runs on a background thread while the dashboard is already up);
- ``cold``: the first move of the cursor to the end before any checkpoint exists;
- ``move``: moving the cursor to 200 random positions once the checkpoints exist
  (``ReplaySource.move``: the snapshot and the log cut); reported: median, p99, max.

Targets (issue 16): open ≤ 3 s, ≤ 300 MB RSS, a cursor move ≤ 200 ms.

Usage::

    .venv/bin/python bench/replay.py [--marks-per-s 10] [--path /tmp/replay-24h.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import statistics
import threading
import time

from tui_launch.core.events import LogMark, Restart, TelemetryRecord, to_dict
from tui_launch.core.replay import Timeline
from tui_launch.testing import builders
from tui_launch.tui.replay import ReplaySource

DAY = 86400
NPROC = 8


def _line(seq: int, data: dict) -> str:
    return json.dumps({"seq": seq, **data}, default=str) + "\n"


def write_journal(path: str, marks_per_s: int) -> int:
    """Write the synthetic journal; return its number of events."""
    samples = [
        TelemetryRecord(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
        for s in builders.telemetry(0, NPROC, 1000, 0.0, 30, gpus=NPROC)
    ]
    seq = 0
    attempt = 0
    offsets = dict.fromkeys(((r, s) for r in range(NPROC) for s in ("stdout", "stderr")), 0)
    with open(path, "w") as fp:

        def put(event_dict: dict) -> None:
            nonlocal seq
            fp.write(_line(seq, event_dict))
            seq += 1

        put(to_dict(builders.run_started(NPROC, max_restarts=20)))
        for e in builders.attempt(0, NPROC, 0.0, 1000):
            if e.journaled:
                put(to_dict(e))
        step = 1.0 / marks_per_s
        for second in range(1, DAY):
            t = float(second)
            if second % 7200 == 0:  # a failure and a restart every 2 hours
                pid0 = 1000 + 100 * attempt
                put(to_dict(builders.exited(attempt, 1, pid0 + 1, -9, at=t)))
                put(to_dict(builders.failed_attempt(attempt, t)))
                put(
                    to_dict(
                        Restart(
                            cause="failure",
                            from_attempt=attempt,
                            to_attempt=attempt + 1,
                            restarts_used=attempt + 1,
                            budget_left=20 - attempt - 1,
                            **builders.at(t + 0.3),
                        )
                    )
                )
                attempt += 1
                for e in builders.attempt(attempt, NPROC, t + 0.5, 1000 + 100 * attempt):
                    if e.journaled:
                        put(to_dict(e))
            if second % 10 == 0:
                s = samples[(second // 10) % len(samples)]
                put(to_dict(dataclasses.replace(s, attempt=attempt, **builders.at(t))))
            for k in range(marks_per_s):
                for key in offsets:
                    offsets[key] += 80 if key[1] == "stdout" else 0
                # Formatted directly (as Journal.write would write it): asdict is slow to
                # write a million of.
                marks = ", ".join(
                    f'[{attempt}, {r}, "{st}", {off}]' for (r, st), off in offsets.items()
                )
                when = builders.at(t + k * step)
                fp.write(
                    f'{{"seq": {seq}, "kind": "{LogMark.kind}", "mono": {when["mono"]!r}, '
                    f'"wall": {when["wall"]!r}, "offsets": [{marks}]}}\n'
                )
                seq += 1
        put(to_dict(builders.failed_attempt(attempt, DAY - 1.0)))
    return seq


def rss_mb() -> float:
    """Peak RSS of this process, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    """Write the journal if needed, then measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--marks-per-s", type=int, default=10)
    parser.add_argument("--path", default=None)
    parser.add_argument("--moves", type=int, default=200)
    a = parser.parse_args()
    path = a.path or f"/tmp/tuilaunch-replay-24h-{a.marks_per_s}.jsonl"
    if not os.path.exists(path):
        t = time.perf_counter()
        n = write_journal(path, a.marks_per_s)
        print(
            f"wrote {path}: {n} events, {os.path.getsize(path) / 1e6:.0f} MB "
            f"in {time.perf_counter() - t:.0f} s"
        )
    base = rss_mb()
    t = time.perf_counter()
    tl = Timeline(path)
    open_s = time.perf_counter() - t
    print(
        f"open (index {len(tl)} events): {open_s:.2f} s; peak RSS {rss_mb():.0f} MB "
        f"(before: {base:.0f} MB)"
    )

    t = time.perf_counter()
    src = ReplaySource(tl, cursor=0)
    print(f"first frame's source at the start: {time.perf_counter() - t:.3f} s")

    done = threading.Event()
    t = time.perf_counter()
    tl.precompute(done)
    pre_s = time.perf_counter() - t
    print(
        f"precompute (every checkpoint, background in a replay): {pre_s:.1f} s; "
        f"peak RSS {rss_mb():.0f} MB"
    )

    rng = random.Random(16)
    times = []
    for _ in range(a.moves):
        n = rng.randrange(len(tl) + 1)
        t = time.perf_counter()
        src.move(n)
        times.append(time.perf_counter() - t)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(
        f"cursor move x{a.moves} (random, checkpoints ready): median "
        f"{statistics.median(times) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
        f"max {times[-1] * 1e3:.0f} ms; peak RSS {rss_mb():.0f} MB"
    )
    tl2 = Timeline(path)
    t = time.perf_counter()
    tl2.snapshot(len(tl2))
    print(f"cold: the end before any checkpoint (a full reduce): {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
