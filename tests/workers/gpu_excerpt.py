"""Test worker without torch: rank 1 ends as a GPU job's rank did in a posted excerpt.

    gpu_excerpt.py EXCERPT [--steps N]

Every rank prints ``step N/T`` lines first (the progress watcher reads them). Rank 1 then
writes the excerpt's lines (``tests/gpu_failures/*.txt``, after its header) to its stderr and
ends the way the header's ``exit`` says: that exit code, or that signal sent to itself. The
other ranks wait to be stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("excerpt")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    with open(a.excerpt) as fp:
        head, _, body = fp.read().partition("\n---\n")
    how = next(ln.split(":", 1)[1].strip() for ln in head.splitlines() if ln.startswith("exit:"))
    rank = int(os.environ.get("RANK", "0"))
    for step in range(1, a.steps + 1):
        print(f"step {step}/{a.steps}", flush=True)
        time.sleep(0.05)
    if rank != 1:
        time.sleep(120)
        return
    sys.stderr.write(body)
    sys.stderr.flush()
    if how.startswith("SIG"):
        sig = signal.Signals[how]
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(10)
    sys.exit(int(how))


if __name__ == "__main__":
    main()
