"""Benchmark: ``tuilaunch replay`` on a synthetic 24-hour journal.

The journal (written once, to ``--path``, with its rank log files in ``PATH.logs/``) is a
24-hour run of 8 ranks on 8 (fake) GPUs: telemetry records every 10 s (8,640), a failure and a
restart every 2 hours (12 attempts, each with new log files), and log marks, ``--marks-per-s``
a second with all 16 streams' offsets, each mark an 80-byte line more in every rank's stdout.
tuilaunch itself writes at most one log mark a second (``--marks-per-s 1``: a real 24-hour
journal at these rates is ~100,000 events); the default of 10 a second makes the ~1,000,000
events the issue asks for, so the index and the log-cut path carry ten times what a real day
gives them. ``--hours`` makes a shorter run.

Measured, in this process (the numbers a replay's UI thread sees):

- ``index``: :class:`~tui_launch.core.journal.timeline.Timeline` indexes the whole file (no JSON
  parsed), as ``attach`` does; peak RSS;
- ``open``: what ``replay`` does before its first frame: the first 16 MB chunk indexed and the
  source at the first event;
- ``moves while precomputing``: 20 random cursor moves while the background thread indexes the
  rest and computes the checkpoints (a move past its frontier computes them itself);
- ``precompute``: the rest of the index, the snapshot checkpoints (every 8 state events) and
  the log cuts (every 1,024 events), as ``replay``'s background thread does; peak RSS;
- ``move``: moving the cursor to 200 random positions once the checkpoints exist
  (``ReplaySource.move``: the snapshot, the log cut, the rank logs read up to it); reported:
  median, p99, max;
- ``cold``: the first move of the cursor to the end before any checkpoint exists.

And in a real terminal (``--tmux S``, default 20; 0: not): ``tuilaunch replay PATH`` in a tmux
pane, from starting it to the first capture with the replay bar and the footer, and the
process's peak RSS (``VmHWM``) then and S seconds later.

Targets (issue 16): open ≤ 3 s, ≤ 300 MB RSS, a cursor move ≤ 200 ms.

Usage::

    .venv/bin/python bench/replay.py [--marks-per-s 10] [--hours 24] [--path PATH] [--tmux 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from tui_launch.apps.replay import precompute
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model import layout
from tui_launch.core.model.events import LogMark, Restart, TelemetryRecord, to_dict
from tui_launch.testing import builders
from tui_launch.tui.sources.replay import OPEN_AT_END, ReplaySource

DAY = 86400
NPROC = 8
STREAMS = ("stdout", "stderr")


def _line(seq: int, data: dict) -> str:
    return json.dumps({"seq": seq, **data}, default=str) + "\n"


def write_journal(path: str, marks_per_s: int, seconds: int = DAY) -> int:
    """Write the synthetic journal and its rank log files; return its number of events.

    The logs are ``PATH.logs/attempt_N/RANK/{stdout,stderr}.log`` (the workers_started events
    name them): each rank writes an 80-byte line to stdout per log mark, stderr stays empty,
    and each attempt starts new files (offsets from 0), as torch's log directories do.
    """
    samples = [
        TelemetryRecord(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
        for s in builders.telemetry(0, NPROC, 1000, 0.0, 30, gpus=NPROC)
    ]
    logs = path + ".logs"
    seq = 0
    attempt = 0
    offsets: dict[tuple[int, str], int] = {}
    files: list = []
    with open(path, "w") as fp:

        def put(event_dict: dict) -> None:
            nonlocal seq
            fp.write(_line(seq, event_dict))
            seq += 1

        def start(n: int, t: float) -> None:
            nonlocal files
            for f in files:
                f.close()
            files = []
            for r in range(NPROC):
                attempt_dir = os.path.join(logs, layout.attempt_name(n))
                os.makedirs(layout.rank_dir_in(attempt_dir, r), exist_ok=True)
                open(layout.rank_log_in(attempt_dir, r, layout.STDERR), "w").close()
                files.append(open(layout.rank_log_in(attempt_dir, r, layout.STDOUT), "w"))  # noqa: SIM115
            offsets.update(dict.fromkeys(((r, s) for r in range(NPROC) for s in STREAMS), 0))
            for e in builders.attempt(n, NPROC, t, 1000 + 100 * n):
                if e.journaled:
                    data = to_dict(e)
                    if e.kind == "workers_started":
                        data["log_dir"] = os.path.join(logs, layout.attempt_name(n))
                    put(data)

        put(to_dict(builders.run_started(NPROC, max_restarts=20)))
        start(0, 0.0)
        step = 1.0 / marks_per_s
        line = 0
        for second in range(1, seconds):
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
                start(attempt, t + 0.5)
            if second % 10 == 0:
                s = samples[(second // 10) % len(samples)]
                put(to_dict(dataclasses.replace(s, attempt=attempt, **builders.at(t))))
            for k in range(marks_per_s):
                line += 1
                for r, f in enumerate(files):
                    f.write(f"rank {r} step {line:012d} loss 0.{line % 999983:06d} ".ljust(79))
                    f.write("\n")
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
        put(to_dict(builders.failed_attempt(attempt, seconds - 1.0)))
    for f in files:
        f.close()
    return seq


def rss_mb() -> float:
    """Peak RSS of this process, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _moves(src: ReplaySource, count: int, seed: int) -> list[float]:
    """Move the cursor to ``count`` random places; the seconds each move took."""
    rng = random.Random(seed)
    times = []
    for _ in range(count):
        n = rng.randrange(len(src.timeline) + 1)
        t = time.perf_counter()
        src.move(n)
        times.append(time.perf_counter() - t)
    return times


def _stats(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return (
        f"median {statistics.median(times) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
        f"max {times[-1] * 1e3:.0f} ms"
    )


def in_process(path: str, moves: int) -> None:
    """The replay's own steps, timed in this process (what its UI thread waits for)."""
    base = rss_mb()
    t = time.perf_counter()
    whole = Timeline(path)
    print(
        f"index the whole file (Timeline(path), as attach does): {time.perf_counter() - t:.2f} s "
        f"for {len(whole)} events; peak RSS {rss_mb():.0f} MB (before: {base:.0f} MB)"
    )
    whole.close()
    t = time.perf_counter()
    tl = Timeline(path, index=False)  # as apps.replay.main does: the first chunk only
    cursor = len(tl) if tl.indexed and len(tl) <= OPEN_AT_END else 0
    src = ReplaySource(tl, cursor)
    print(
        f"open for the first frame (first chunk: {len(tl)} events, and the source at cursor "
        f"{cursor}): {time.perf_counter() - t:.3f} s"
    )
    # As apps.replay.main does: the rest of the index and the checkpoints on a background thread,
    # the UI moving meanwhile.
    done = threading.Event()
    t0 = time.perf_counter()
    worker = threading.Thread(target=precompute, args=(tl, done), name="tuilaunch-replay")
    worker.start()
    early = _moves(src, min(20, moves), 1)
    print(
        f"cursor move x{len(early)} (random, while the index and checkpoints are computed): "
        f"{_stats(early)}"
    )
    worker.join()
    pre_s = time.perf_counter() - t0
    print(
        f"precompute (rest of the index, every checkpoint; background in a replay): "
        f"{pre_s:.1f} s; peak RSS {rss_mb():.0f} MB"
    )
    times = _moves(src, moves, 16)
    print(
        f"cursor move x{moves} (random, checkpoints ready): {_stats(times)}; "
        f"peak RSS {rss_mb():.0f} MB"
    )
    tl.close()
    tl2 = Timeline(path)
    t = time.perf_counter()
    ReplaySource(tl2, 0).move(len(tl2))
    print(
        f"cold: to the end before any checkpoint (a full reduce and log fold): "
        f"{time.perf_counter() - t:.2f} s"
    )
    tl2.close()


def in_tmux(path: str, precompute_wait: float) -> None:
    """``tuilaunch replay PATH`` in a real terminal: the first full frame, and its RSS."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dashboard import Tmux

    tmp = Path(tempfile.mkdtemp(prefix="tlbench_replay_"))
    tmux = Tmux(tmp)
    cmd = shlex.join([sys.executable, "-m", "tui_launch", "replay", path])
    t0 = time.time()
    tmux.start(cmd, dict(os.environ))
    try:
        deadline = time.monotonic() + 120
        t1 = None
        while time.monotonic() < deadline:
            t = time.time()
            text = tmux.capture()
            if "REPLAY" in text and " event " in text and "^p palette" in text:
                t1 = t
                break
            time.sleep(0.01)
        if t1 is None:
            raise RuntimeError(f"no replay frame within 120 s:\n{text}")
        print(f"tuilaunch replay in tmux: first full frame {t1 - t0:.2f} s after the start")
        pane_pid = tmux._run("display-message", "-p", "-t", tmux.name, "#{pane_pid}").stdout
        status = Path(f"/proc/{pane_pid.strip()}/status")
        hwm = [ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM")]
        print(f"  its peak RSS then: {hwm[0].split(':')[1].strip()}")
        time.sleep(precompute_wait)
        hwm = [ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM")]
        print(f"  its peak RSS {precompute_wait:.0f} s later: {hwm[0].split(':')[1].strip()}")
    finally:
        tmux.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Write the journal if needed, then measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--marks-per-s", type=int, default=10)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--path", default=None)
    parser.add_argument("--moves", type=int, default=200)
    parser.add_argument(
        "--tmux",
        type=float,
        default=20.0,
        metavar="S",
        help="also run tuilaunch replay in tmux, RSS read S s after the frame (0: not)",
    )
    a = parser.parse_args()
    suffix = "" if a.hours == 24 else f"-{a.hours:g}h"
    path = a.path or f"/tmp/tuilaunch-replay-24h-{a.marks_per_s}{suffix}.jsonl"
    # Written when missing (the default path: also when written without its logs, as before);
    # a journal named with --path that exists is only read.
    if not os.path.exists(path) or (a.path is None and not os.path.isdir(path + ".logs")):
        t = time.perf_counter()
        n = write_journal(path, a.marks_per_s, int(a.hours * 3600))
        print(
            f"wrote {path}: {n} events, {os.path.getsize(path) / 1e6:.0f} MB "
            f"in {time.perf_counter() - t:.0f} s"
        )
    print(f"load average: {os.getloadavg()[0]:.2f}")
    in_process(path, a.moves)
    if a.tmux:
        in_tmux(path, a.tmux)
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
