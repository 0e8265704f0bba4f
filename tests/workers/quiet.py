"""Test worker: busy and silent. Prints ``start``, then nothing for ``--seconds`` while its
main thread keeps moving (the recursion depth changes every 0.5 s), then ``done``; exits 0.

A job like this must not be declared hung however long its silence: its stacks move.
"""

from __future__ import annotations

import argparse
import sys
import time


def work(depth: int, until: float) -> None:
    """Spin at recursion depth ``depth`` until ``until`` (a different stack at each depth)."""
    if depth > 0:
        work(depth - 1, until)
        return
    while time.monotonic() < until:
        sum(range(2000))


def main() -> None:
    parser = argparse.ArgumentParser(description="Silent work whose stack moves.")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print("start", flush=True)
    end = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < end:
        step += 1
        work(step % 7, min(end, time.monotonic() + 0.5))
    sys.stdout.write("done\n")


if __name__ == "__main__":
    main()
