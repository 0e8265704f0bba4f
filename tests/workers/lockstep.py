"""Test worker: a lockstep data-parallel loop on gloo (CPU), like DDP's step.

Each step every rank computes for ``--work`` seconds (a busy Python loop), then all_reduces;
``--extra-rank R --extra S`` makes rank R compute S more seconds per step (a rank with more
work: the straggler). Rank 0 prints ``step N/T``. ``--report PATH``: rank 0 writes its
steps/s (first to last step) there at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def busy(seconds: float) -> None:
    """Compute (hold a core) for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--work", type=float, default=0.02)
    p.add_argument("--extra-rank", type=int, default=-1)
    p.add_argument("--extra", type=float, default=0.0)
    p.add_argument("--report", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1000)
    times = []
    for n in range(1, args.steps + 1):
        busy(args.work + (args.extra if rank == args.extra_rank else 0.0))
        dist.all_reduce(t)
        times.append(time.monotonic())
        if rank == 0:
            print(f"step {n}/{args.steps} loss {1.0 / n:.4f}", flush=True)
    if rank == 0 and args.report and len(times) > 1:
        with open(args.report, "w") as fp:
            fp.write(str((len(times) - 1) / (times[-1] - times[0])))
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
