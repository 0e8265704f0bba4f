"""Test worker: a tqdm-style progress bar, in tqdm's exact bytes, without tqdm.

tqdm rewrites one line: each update is ``"\\r" + "desc:  37%|███▋      | 37/100 [00:01<00:02,
25.17it/s]"`` (no newline), flushed, and ``"\\n"`` comes only when the bar closes. Written to
stderr, as tqdm does (``--stdout`` for stdout). ``--copy PATH`` also writes every byte this rank
wrote to ``PATH.<rank>`` (for byte comparisons with the launcher's log file); ``--hold PATH``
waits after update ``--hold-at`` until ``PATH`` exists, so a test can look at a bar that is
mid-way without timing anything.

``--no-leave`` ends as tqdm's ``leave=False`` does: the bar is cleared with ``"\\r"`` + spaces +
``"\\r"`` and no newline follows (the rank's output ends with that ``\\r``).

Usage: ``bar.py [--total N] [--desc D] [--interval S] [--hold PATH --hold-at K] [--copy PATH]
[--no-leave]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

BLOCKS = " ▏▎▍▌▋▊▉"


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


def bar_text(desc: str, n: int, total: int, elapsed: float, width: int = 10) -> str:
    """One tqdm update, as tqdm formats it (``{l_bar}{bar}{r_bar}``)."""
    frac = n / total
    cells = frac * width
    full = int(cells)
    bar = "█" * full
    if full < width:
        bar += BLOCKS[int((cells - full) * 8)]
        bar = bar.ljust(width)
    rate = n / elapsed if elapsed > 0 else 0.0
    remaining = (total - n) / rate if rate else 0.0
    return (
        f"{desc}: {frac * 100:3.0f}%|{bar}| {n}/{total} "
        f"[{clock(elapsed)}<{clock(remaining)}, {rate:.2f}it/s]"
    )


def main() -> None:
    p = argparse.ArgumentParser(description="Draw a tqdm-style bar with \\r updates.")
    p.add_argument("--total", type=int, default=100)
    p.add_argument("--desc", default="train")
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--hold", default=None)
    p.add_argument("--hold-at", type=int, default=-1)
    p.add_argument("--copy", default=None)
    p.add_argument("--stdout", action="store_true")
    p.add_argument("--no-leave", action="store_true")
    args = p.parse_args()
    rank = os.environ.get("RANK", "0")
    stream = sys.stdout if args.stdout else sys.stderr
    copy = open(f"{args.copy}.{rank}", "wb") if args.copy else None  # noqa: SIM115

    def write(text: str) -> None:
        stream.write(text)
        stream.flush()
        if copy is not None:
            copy.write(text.encode())
            copy.flush()

    write(f"rank {rank} starting\n")
    t0 = time.monotonic()
    text = ""
    for n in range(args.total + 1):
        text = bar_text(args.desc, n, args.total, time.monotonic() - t0)
        write("\r" + text)
        if n == args.hold_at and args.hold:
            while not os.path.exists(args.hold):
                time.sleep(0.02)
        elif args.interval:
            time.sleep(args.interval)
    if args.no_leave:
        write("\r" + " " * len(text) + "\r")
    else:
        write("\n")
        write(f"rank {rank} done\n")
    if copy is not None:
        copy.close()


if __name__ == "__main__":
    main()
