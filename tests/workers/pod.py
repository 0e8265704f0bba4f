"""Test worker for a pod: join the gloo group, say so on stdout, step until told to stop.

Usage: ``pod.py STOP_FILE``. Once the process group has formed, prints
``rank R of W ready on group rank G`` (flushed, as a program logging for ``kubectl logs``
would). Then every step all-reduces "has STOP_FILE appeared", so every rank stops at the same
step, prints ``rank R done`` and exits 0.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    stop_file = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} ready on group rank {os.environ['GROUP_RANK']}", flush=True)
    while True:
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        time.sleep(0.05)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
