"""Benchmark: ``tuilaunch report`` of a day-long journal of about a million events.

The journal (written once, to ``--path``) is a 24-hour run of 8 ranks on 8 (fake) GPUs:
telemetry records and progress records every 10 s (8,640 each), a failure and a restart every
2 hours (12 attempts), and log marks, ``--marks-per-s`` a second with all 16 streams' offsets
(tuilaunch writes at most one a second; the default 12 makes the 1,000,000+ events issue 27
asks for). Each attempt's rank logs are small files (the report reads only their last 64 kB).

Measured: ``tuilaunch report PATH -o OUT`` (HTML, then ``--format md``) as a real process: its
wall time and peak RSS (``ru_maxrss`` of the child), and the page's size.

Targets (issue 27): ≤ 10 s, ≤ 500 MB RSS, a page ≤ 5 MB.

Usage::

    .venv/bin/python bench/report.py [--marks-per-s 12] [--hours 24] [--path PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from tui_launch.core.model import layout
from tui_launch.core.model.events import LogMark, Restart, TelemetryRecord, to_dict
from tui_launch.testing import builders

NPROC = 8
STREAMS = ("stdout", "stderr")


def _line(seq: int, data: dict) -> str:
    return json.dumps({"seq": seq, **data}, default=str) + "\n"


def progress_record(attempt: int, t: float, step: int) -> dict:
    """A journaled progress record: every rank's step, rate and loss."""
    ranks = [
        {
            "global_rank": r,
            "local_rank": r,
            "stream": "stdout",
            "step": step,
            "total": None,
            "rate": 10.0 + r * 0.1 + (step % 97) / 97,
            "loss": 2.0 / (1 + step / 5000) + r * 0.01,
            "fmt": "plain",
        }
        for r in range(NPROC)
    ]
    return {
        "kind": "progress",
        **builders.at(t),
        "attempt": attempt,
        "leader": 0,
        "ranks": ranks,
        "first_step": None,
        "time_to_first_step": 2.0,
        "steps_reached": step,
        "progress_time": 0.0,
    }


def write_journal(path: str, marks_per_s: int, seconds: int) -> int:
    """Write the synthetic run directory (journal and small rank logs); its event count."""
    samples = [
        TelemetryRecord(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
        for s in builders.telemetry(0, NPROC, 1000, 0.0, 30, gpus=NPROC)
    ]
    run_dir = os.path.dirname(path)
    seq = 0
    attempt = 0
    offsets = {(r, s): 0 for r in range(NPROC) for s in STREAMS}
    with open(path, "w") as fp:

        def put(data: dict) -> None:
            nonlocal seq
            fp.write(_line(seq, data))
            seq += 1

        def start(n: int, t: float) -> None:
            for r in range(NPROC):
                run = layout.RunDirLayout(run_dir)
                os.makedirs(run.rank_dir(n, r), exist_ok=True)
                with open(run.rank_log(n, r, layout.STDOUT), "w") as log:
                    log.writelines(f"rank {r} step {k} loss 0.5\n" for k in range(200))
                open(run.rank_log(n, r, layout.STDERR), "w").close()
            for e in builders.attempt(n, NPROC, t, 1000 + 100 * n):
                if e.journaled:
                    put(to_dict(e))

        put(to_dict(builders.run_started(NPROC, max_restarts=20)))
        start(0, 0.0)
        step_s = 1.0 / marks_per_s
        for second in range(1, seconds):
            t = float(second)
            if second % 7200 == 0:
                pid0 = 1000 + 100 * attempt
                put(to_dict(builders.exited(attempt, 1, pid0 + 1, -9, at=t)))
                put(to_dict(builders.failed_attempt(attempt, t)))
                restart = Restart(
                    cause="failure",
                    from_attempt=attempt,
                    to_attempt=attempt + 1,
                    restarts_used=attempt + 1,
                    budget_left=20 - attempt - 1,
                    **builders.at(t + 0.3),
                )
                put(to_dict(restart))
                attempt += 1
                start(attempt, t + 0.5)
            if second % 10 == 0:
                s = samples[(second // 10) % len(samples)]
                put(to_dict(dataclasses.replace(s, attempt=attempt, **builders.at(t))))
                put(progress_record(attempt, t + 0.1, 10 * (second % 7200)))
            for k in range(marks_per_s):
                for key in offsets:
                    offsets[key] += 80 if key[1] == "stdout" else 0
                marks = ", ".join(
                    f'[{attempt}, {r}, "{st}", {off}]' for (r, st), off in offsets.items()
                )
                when = builders.at(t + k * step_s)
                fp.write(
                    f'{{"seq": {seq}, "kind": "{LogMark.kind}", "mono": {when["mono"]!r}, '
                    f'"wall": {when["wall"]!r}, "offsets": [{marks}]}}\n'
                )
                seq += 1
        put(to_dict(builders.failed_attempt(attempt, seconds - 1.0)))
    return seq


def timed(cmd: list[str]) -> tuple[float, float, float, str]:
    """Run ``cmd``: its wall seconds, CPU seconds, the peak RSS (MB) of the largest child so
    far (run the largest first), and its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed ({out.returncode}): {out.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024, out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--marks-per-s", type=int, default=12)
    p.add_argument("--hours", type=float, default=24)
    p.add_argument("--path", default=None, help="the journal (written when missing)")
    p.add_argument("--repeat", type=int, default=3, help="HTML reports made (each timed)")
    args = p.parse_args()
    path = args.path or os.path.join(
        tempfile.gettempdir(),
        f"tuilaunch-report-{args.hours:g}h-{args.marks_per_s}",
        layout.JOURNAL_NAME,
    )
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t = time.perf_counter()
        n = write_journal(path, args.marks_per_s, int(args.hours * 3600))
        print(
            f"wrote {n:,} events ({os.path.getsize(path) / 1e6:.0f} MB) in "
            f"{time.perf_counter() - t:.1f}s: {path}"
        )
    with open(path, "rb") as fp:
        events = sum(chunk.count(b"\n") for chunk in iter(lambda: fp.read(1 << 24), b""))
    out_dir = tempfile.mkdtemp(prefix="tuilaunch-report-bench-")
    html_out = os.path.join(out_dir, "run.html")
    md_out = os.path.join(out_dir, "run.md")
    py = sys.executable
    print(f"journal: {events:,} events, {os.path.getsize(path) / 1e6:.0f} MB")
    for _ in range(args.repeat):
        wall, cpu, rss, said = timed([py, "-m", "tui_launch", "report", path, "-o", html_out])
        size = os.path.getsize(html_out) / 1e6
        print(
            f"html: {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss:.0f} MB, page {size:.2f} MB"
        )
    print(f"  ({said})")
    md = [py, "-m", "tui_launch", "report", path, "--format", "md", "-o", md_out]
    wall, cpu, _, said = timed(md)
    print(f"md: {wall:.2f} s wall, {cpu:.2f} s CPU, {os.path.getsize(md_out) / 1e3:.0f} kB")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
