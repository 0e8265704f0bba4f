"""The hang detector's CPU: tuilaunch's HangWatch loop watching 8 ranks' log files.

Runs the real :class:`tui_launch.core.diagnosis.hangwatch.HangWatch` (its periodic thread, the
file-size
checks and the tailer sink) over 16 log files (8 ranks x stdout/stderr) that a writer thread
appends a line to every 0.5 s, as a training loop printing progress would, and reports the
watch thread's CPU time (``thread_time`` inside the loop) per second of wall time, for the
default ``--hang-timeout auto`` (the adaptive rule: a tick every 0.5 s that also reads each
rank's step moves from a real progress watch fed the same lines), a fixed 300 s (one tick a
second) and a short one (3 s: 0.3 s ticks). No dump is taken (the ranks keep writing).
Target: <= 0.1 % of one core.

Usage::

    .venv/bin/python bench/hangwatch.py --seconds 30
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from tui_launch.core.diagnosis.dumps import Dumper
from tui_launch.core.diagnosis.hangwatch import HangWatch
from tui_launch.core.logs.tail import LogSource
from tui_launch.core.progress.watch import ProgressWatch
from tui_launch.core.workers.table import RankTable

RANKS = 8


def measure(timeout: float | str, seconds: float, tmp: Path) -> float:
    """Percent of one core the watch's thread used over ``seconds``."""
    paths = {r: [str(tmp / f"{r}.out"), str(tmp / f"{r}.err")] for r in range(RANKS)}
    for files in paths.values():
        for p in files:
            Path(p).write_text("")
    ranks = RankTable()
    dumper = Dumper(lambda e: None, ranks, lambda: str(tmp), dict)
    progress = ProgressWatch(lambda e: None)
    watch = HangWatch(
        lambda e: None,
        dumper,
        lambda: True,
        timeout=timeout,
        steps=progress.steps,
    )
    watch.attempt_started(0, {r: r for r in range(RANKS)})
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.wait(0.5):
            n += 1
            for r, (out, _err) in paths.items():
                with open(out, "a") as fp:
                    fp.write(f"rank {r} step {n}\n")
                src = LogSource(0, r, r, "stdout", out, False, None)
                watch.sink(src, [f"rank {r} step {n}"])
                progress.on_lines(src, [f"rank {r} step {n}"])

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    watch.start()
    time.sleep(seconds)
    watch.stop()
    stop.set()
    t.join()
    return 100.0 * watch.cpu_seconds / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hangwatch-") as d:
        for timeout in ("auto", 300.0, 3.0):
            pct = measure(timeout, args.seconds, Path(d))
            named = timeout if isinstance(timeout, str) else f"{timeout:g}"
            verdict = "ok" if pct <= 0.1 else "OVER"
            print(
                f"--hang-timeout {named}: {pct:.4f} % of one core over {args.seconds:g} s "
                f"({RANKS} ranks, {2 * RANKS} files) <= 0.1 %: {verdict}"
            )


if __name__ == "__main__":
    main()
