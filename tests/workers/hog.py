"""Test worker: hold a known amount of memory and spin a known share of one CPU.

Options:
  --mb N          allocate and touch N MiB (default 200)
  --duty F        busy fraction of each 100 ms period, 0..1 (default 0.5)
  --seconds S     how long to run (default 5)
  --child-mb N    also start one child process (like a data-loader worker) holding N MiB
  --ready PATH    write "ready" to PATH once the memory is allocated

No torch: it starts fast. Exits 0.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time


def hold(mb: int, seconds: float) -> None:
    """Allocate ``mb`` MiB, touch every page, and keep it for ``seconds``."""
    block = bytearray(mb << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
    del block


def main() -> None:
    parser = argparse.ArgumentParser(description="Memory and CPU hog.")
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--duty", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--child-mb", type=int, default=0)
    parser.add_argument("--ready", default=None)
    args = parser.parse_args()

    child = None
    if args.child_mb:
        # Forked before the big allocation, so that the child shares none of it.
        child = mp.get_context("fork").Process(target=hold, args=(args.child_mb, args.seconds))
        child.start()
    block = bytearray(args.mb << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touched pages count in RSS; untouched ones would not
    if args.ready:
        with open(args.ready, "w") as fp:
            fp.write("ready")
    period = 0.1
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        while time.monotonic() - t0 < period * args.duty:
            pass
        time.sleep(max(0.0, period * (1 - args.duty)))
    if child is not None:
        child.join()
    print(f"hog done ({len(block) >> 20} MiB)", flush=True)


if __name__ == "__main__":
    main()
