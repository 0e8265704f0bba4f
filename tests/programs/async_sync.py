"""Asynchronous collectives on gloo: ``all_reduce(async_op=True)``, waited for later in the
program's own ``sync_point()``, as NCCL programs do at their next sync point.

  --wander-rank R  from step --wander-at on, rank R goes off into ``wandered_off``
  --seconds S      exit on its own after S seconds
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def wandered_off() -> None:
    """The rank's own business: it never issues the next all_reduce."""
    while True:
        time.sleep(0.2)


def sync_point(work: dist.Work) -> None:
    """Where the program waits for its asynchronous all_reduce."""
    work.wait()


def _watchdog(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="Asynchronous all_reduce on gloo.")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--wander-rank", type=int, default=-1)
    parser.add_argument("--wander-at", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    threading.Thread(target=_watchdog, args=(args.seconds,), daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1024)
    for step in range(args.steps):
        if rank == args.wander_rank and step >= args.wander_at:
            wandered_off()
        work = dist.all_reduce(t, async_op=True)
        t.mul_(0.5)  # something to overlap with
        sync_point(work)
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
