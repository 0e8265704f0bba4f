"""Test worker for the restart policy, without torch: one way to end per ``--mode``.

Every rank prints ``step N/T`` lines (the progress watcher reads them) every ``--interval``
seconds and resumes from ``--ckpt`` (the step reached, saved each step) when given.

Modes:
  raise-at K     rank 1 raises ``ValueError("bad batch")`` at step K, in every attempt
  teardown       every rank returns from main; rank 1 then aborts (SIGABRT) in an atexit
                 handler, after the others have exited
  run            step until ``--steps`` (a SIGKILL from outside is the test's business)
  save-on-signal step until SIGTERM or SIGUSR1 arrives, then write ``--saved`` (``rank R
                 SIGNAME`` lines), take ``--save-seconds`` to "save", and exit 0
  oom            rank 1 allocates memory until the kernel kills it
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="run")
    p.add_argument("--at", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--ckpt", default="")
    p.add_argument("--saved", default="")
    p.add_argument("--save-seconds", type=float, default=0.5)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    start = 0
    ckpt = f"{a.ckpt}.{rank}" if a.ckpt else ""
    if ckpt and os.path.exists(ckpt):
        with open(ckpt) as fp:
            start = int(fp.read() or 0)
    got: list[int] = []
    if a.mode == "save-on-signal":
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, lambda s, f: got.append(s))
    if a.mode == "oom" and rank == 1:
        hog = []
        while True:
            hog.append(bytearray(32 << 20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])
    for step in range(start, a.steps):
        if got:
            time.sleep(a.save_seconds)
            with open(a.saved, "a") as fp:
                fp.write(f"rank {rank} {signal.Signals(got[0]).name} step {step}\n")
            sys.exit(0)
        if a.mode == "raise-at" and rank == 1 and step == a.at:
            raise ValueError("bad batch")
        print(f"step {step + 1}/{a.steps} loss 0.5", flush=True)
        if ckpt:
            # Atomically, as a real checkpoint is: a SIGKILL between a truncate and the write
            # left an empty file, and the next attempt started over from step 1.
            with open(f"{ckpt}.tmp", "w") as fp:
                fp.write(str(step + 1))
            os.replace(f"{ckpt}.tmp", ckpt)
        time.sleep(a.interval)
    if a.mode == "teardown" and rank == 1:

        def crash() -> None:
            time.sleep(1.0)  # the other ranks exit 0 first
            sys.stderr.flush()
            os.abort()

        atexit.register(crash)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
