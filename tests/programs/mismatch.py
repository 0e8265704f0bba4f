"""Mismatched collectives: at step --at, rank --odd calls ``all_gather`` (4x the bytes) while
every other rank calls ``all_reduce``.

  --seconds S   exit on its own after S seconds
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def _watchdog(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="Ranks that disagree on the collective.")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--odd", type=int, default=2)
    parser.add_argument("--at", type=int, default=5)
    args = parser.parse_args()
    threading.Thread(target=_watchdog, args=(args.seconds,), daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(256 * 1024)  # 1 MB
    for step in range(1_000_000):
        if step >= args.at and rank == args.odd:
            out = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(out, t)
        else:
            dist.all_reduce(t)
            t.fill_(1.0)
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
