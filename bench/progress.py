"""Benchmark: what the progress parser costs (tui_launch.core.progress, issue 15).

Target: at 8 ranks x 2,000 lines/s, parsing takes at most 2 % of one core, i.e. at most
20 ms of CPU per second of output.

``lines``  — CPU microseconds per call of ``parse_line`` for each kind of line (noise that the
             pre-filter rejects, noise that gets past it, each format), unlocked and locked.
``load``   — one simulated second after another of 8 ranks x 2,000 lines/s fed through
             ``JobProgress.feed`` with their arrival times (a line every 0.5 ms per rank), for
             several mixes of lines; reported: CPU seconds per simulated second (= share of
             one core) and CPU microseconds per line, net of the benchmark's own loop (the
             same loop calling a no-op ``feed`` is measured and subtracted; "gross" keeps it).
             It runs twice: with the default coalescing, and with ``min_interval=0`` (every
             line parsed) to show what the coalescing saves. Then a third time as the
             progress watch really gets the lines: in batches, one per tailer read of a
             rank's stream (``--poll`` seconds apart, 0.5 by default: the tailer's
             ``view_interval`` for lossy sinks), through ``JobProgress.feed_lines``.

CPU time is ``time.thread_time`` (this thread only), so other load on the machine disturbs it
far less than wall time. Stdlib only::

    .venv/bin/python bench/progress.py lines
    .venv/bin/python bench/progress.py load [--seconds 5] [--ranks 8] [--rate 2000] [--poll 0.5]
    .venv/bin/python bench/progress.py all
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui_launch.core.progress import JobProgress, parse_line

NOISE_REJECTED = "INFO 2025-01-01 12:00:00 worker 3 loading batch 17 of 128, nothing to see here"
NOISE_PASSING = "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:560: warn"
SAMPLES = {
    "noise (rejected by pre-filter)": NOISE_REJECTED,
    "noise (a path: passes pre-filter)": NOISE_PASSING,
    "tqdm bar": " 37%|███▋      | 137/375 [00:05<00:09, 25.17it/s]",
    "lightning bar": "Epoch 0:  37%|███▋      | 137/375 [00:05<00:09, 25.17it/s, v_num=0, "
    "train_loss=0.512]",
    "hf dict": "{'loss': '4.321', 'grad_norm': '1.281', 'learning_rate': '4.333e-05', "
    "'epoch': '0.1'}",
    "torchtitan": "[titan] 2025-03-10 12:00:00,123 - root - INFO - \x1b[31mstep: 10  "
    "\x1b[32mloss:  9.8721  \x1b[34mtps: 5,321  \x1b[36mtflops: 34.59  \x1b[35mmfu: 3.95%\x1b[39m",
    "megatron": " iteration       10/    5000 | consumed samples:         1280 | elapsed time "
    "per iteration (ms): 1204.3 | learning rate: 6.976744E-07 | global batch size:   128 | "
    "lm loss: 9.812000E+00 | loss scale: 1.0 | grad norm: 26.203 |",
    "deepspeed timer": "[2023-11-07 01:55:23,711] [INFO] [timer.py:260:stop] epoch=0/"
    "micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.02, CurrSamplesPerSec=25.70, "
    "MemAllocated=4.32GB, MaxMemAllocated=38.49GB",
    "nanogpt": "iter 10: loss 9.4512, time 97.32ms, mfu 31.20%",
    "generic": "step 100 loss 2.345",
}
LOCK = {"tqdm bar": "tqdm", "lightning bar": "tqdm", "torchtitan": "torchtitan",
        "megatron": "megatron", "deepspeed timer": "deepspeed", "nanogpt": "nanogpt",
        "generic": "generic"}  # fmt: skip


def cpu_us(fn: Callable[[], object], n: int) -> float:
    gc.disable()
    try:
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        return (time.thread_time() - t0) / n * 1e6
    finally:
        gc.enable()


def bench_lines(n: int) -> None:
    print(f"parse_line, CPU us per call (median of 5 x {n}):")
    print(f"  {'line':36s} {'unlocked':>9s} {'locked':>9s}")
    for name, line in SAMPLES.items():
        fam = LOCK.get(name)

        def unlocked_call(s: str = line) -> object:
            return parse_line(s)

        def locked_call(s: str = line, f: str | None = fam) -> object:
            return parse_line(s, f)

        unlocked = statistics.median(cpu_us(unlocked_call, n) for _ in range(5))
        locked = (
            statistics.median(cpu_us(locked_call, n) for _ in range(5)) if fam else float("nan")
        )
        print(f"  {name:36s} {unlocked:9.2f} {locked:9.2f}")


def mix(name: str, i: int) -> str:
    """Line ``i`` of a rank's output in mix ``name``."""
    if name == "noise 90% + tqdm 10%":
        return SAMPLES["tqdm bar"] if i % 10 == 0 else (NOISE_REJECTED if i % 3 else NOISE_PASSING)
    if name == "tqdm bar only":
        n = i % 375
        return f"\rEpoch 0:  {100 * n // 375:3d}%|███▋      | {n}/375 [00:05<00:09, 25.17it/s]"
    if name == "megatron log lines only":
        return SAMPLES["megatron"].replace("      10/", f"{i:8d}/")
    if name == "hf dicts only":
        return SAMPLES["hf dict"]
    return NOISE_REJECTED


MIXES = (
    "noise 90% + tqdm 10%",
    "tqdm bar only",
    "megatron log lines only",
    "hf dicts only",
)


class _NoOp:
    """The harness alone: the same loops and calls, doing nothing (subtracted)."""

    def feed(self, rank: int, stream: str, text: str, t: float) -> None:
        pass

    def state(self, now: float) -> None:
        pass

    def feed_lines(self, rank: int, stream: str, lines: list[str], t: float) -> None:
        pass


def _drive_batched(
    job: JobProgress | _NoOp, lines: list[str], seconds: int, ranks: int, poll: float
) -> float:
    per_read = max(1, round(len(lines) * poll))
    reads = [lines[i : i + per_read] for i in range(0, len(lines), per_read)]
    gc.disable()
    t0 = time.thread_time()
    for sec in range(seconds):
        for k, batch in enumerate(reads):
            t = sec + (k + 1) * poll
            for rank in range(ranks):
                job.feed_lines(rank, "stdout", batch, t)
        job.state(sec + 1.0)
    cpu = time.thread_time() - t0
    gc.enable()
    return cpu


def bench_batched(seconds: int, ranks: int, rate: int, poll: float) -> None:
    print(
        f"load: {ranks} ranks x {rate} lines/s, {seconds} simulated s, as the progress watch "
        f"gets them: one batch per rank every {poll:g} s (JobProgress.feed_lines)"
    )
    print(f"  {'mix':34s} {'net share of a core':>20s} {'net us/line':>12s} {'gross':>8s}")
    for name in MIXES:
        lines = [mix(name, i) for i in range(rate)]
        base = min(_drive_batched(_NoOp(), lines, seconds, ranks, poll) for _ in range(2))
        cpu = _drive_batched(JobProgress(), lines, seconds, ranks, poll)
        net = max(cpu - base, 0.0) / seconds
        per_line = net / (rate * ranks) * 1e6
        print(f"  {name:34s} {net * 100:19.2f}% {per_line:12.2f} {cpu / seconds * 100:7.2f}%")


def _drive(job: JobProgress | _NoOp, lines: list[str], seconds: int, ranks: int) -> float:
    dt = 1.0 / len(lines)
    gc.disable()
    t0 = time.thread_time()
    for sec in range(seconds):
        base = float(sec)
        for i, line in enumerate(lines):
            t = base + i * dt
            for rank in range(ranks):
                job.feed(rank, "stdout", line, t)
        job.state(base + 1.0)  # the dashboard's tick reads the state once a second
    cpu = time.thread_time() - t0
    gc.enable()
    return cpu


def bench_load(seconds: int, ranks: int, rate: int, coalesce: bool) -> None:
    opts: dict[str, Any] = {} if coalesce else {"min_interval": 0.0}
    label = "coalescing on (default 50 ms)" if coalesce else "coalescing off (every line parsed)"
    print(f"load: {ranks} ranks x {rate} lines/s, {seconds} simulated s, {label}")
    print("  net = CPU of JobProgress.feed/state minus the same loop calling a no-op")
    print(f"  {'mix':34s} {'net share of a core':>20s} {'net us/line':>12s} {'gross':>8s}")
    for name in MIXES:
        lines = [mix(name, i) for i in range(rate)]
        base = min(_drive(_NoOp(), lines, seconds, ranks) for _ in range(2))
        cpu = _drive(JobProgress(**opts), lines, seconds, ranks)
        net = max(cpu - base, 0.0) / seconds
        per_line = net / (rate * ranks) * 1e6
        print(f"  {name:34s} {net * 100:19.2f}% {per_line:12.2f} {cpu / seconds * 100:7.2f}%")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=("lines", "load", "all"))
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--n", type=int, default=20000, help="calls per line kind (lines)")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between tailer reads")
    args = ap.parse_args(argv)
    if args.what in ("lines", "all"):
        bench_lines(args.n)
    if args.what in ("load", "all"):
        bench_load(args.seconds, args.ranks, args.rate, coalesce=True)
        bench_load(args.seconds, args.ranks, args.rate, coalesce=False)
        bench_batched(args.seconds, args.ranks, args.rate, args.poll)


if __name__ == "__main__":
    main()
