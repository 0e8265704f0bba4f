"""Test worker: a lockstep data-parallel loop on gloo (CPU), like DDP's step.

Each step every rank computes for ``--work`` seconds (a busy Python loop), then all_reduces;
``--extra-rank R --extra S`` makes rank R compute S more seconds per step (a rank with more
work: the straggler). ``--waits``: the work is a sleep (a rank waiting for its data rather
than computing): the same stacks to a sampler, at no CPU, so the samplers and the rest of a
loaded machine keep theirs. Rank 0 prints ``step N/T``. ``--report PATH``: rank 0 writes its
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
    p.add_argument("--waits", action="store_true")
    args = p.parse_args()
    work = time.sleep if args.waits else busy
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1000)
    times = []
    for n in range(1, args.steps + 1):
        work(args.work + (args.extra if rank == args.extra_rank else 0.0))
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
