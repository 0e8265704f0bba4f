"""Test worker: run small all_reduce steps for a while, printing progress.

Options:
  --seconds S         how long to run (default 10)
  --restart-log PATH  append "<RANK> <TORCHELASTIC_RESTART_COUNT> <pid>" to
                      PATH at start (lets restart tests count attempts)

Prints ``rank R step N`` about every 0.5 s and exits 0 (all ranks after the same step).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description="Steady all_reduce loop.")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--restart-log", default=None)
    args = parser.parse_args()

    rank = os.environ.get("RANK", "0")
    if args.restart_log:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        with open(args.restart_log, "a") as f:
            f.write(f"{rank} {restart} {os.getpid()}\n")

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.zeros(4)
    start = time.monotonic()
    next_print = start
    step = 0
    while True:
        # Rank 0 alone decides when to stop and says so through the all_reduce, so that every
        # rank leaves after the same step (a rank that left early would reset its peers).
        t[0] = 1.0 if rank == "0" and time.monotonic() - start >= args.seconds else 0.0
        dist.all_reduce(t)
        if t[0] > 0:
            break
        step += 1
        now = time.monotonic()
        if now >= next_print:
            sys.stdout.write(f"rank {rank} step {step}\n")
            sys.stdout.flush()
            next_print = now + 0.5
        time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
