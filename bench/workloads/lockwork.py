"""Benchmark workload: a lockstep gloo loop with a FIXED amount of work per step.

Usage: ``lockwork.py DIR [--steps N | --seconds S] --iters K`` under a launcher.

Each step every rank runs ``K`` iterations of a pure-Python loop (fixed work, unlike
``tests/workers/lockstep.py``, whose step is a fixed *time* and so cannot be slowed by CPU
taken from it) and then all_reduces 1000 floats, like DDP's step. With ``--seconds`` the loop
runs until rank 0's clock says so (the ranks agree through the all_reduce, so all leave at the
same step). Rank 0 prints ``step n/N`` (flushed) and writes, at the end, the
``time.monotonic()`` of every step, one per line, to ``DIR/steps``; every rank writes its pid
to ``DIR/pid_<rank>`` at the start, so a harness can read its CPU from ``/proc``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def work(iters: int) -> int:
    """A fixed amount of Python compute."""
    x = 0
    for i in range(iters):
        x += i & 7
    return x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--iters", type=int, default=200_000)
    p.add_argument("--seconds", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(os.path.join(args.out, f"pid_{rank}"), "w") as fp:
        fp.write(str(os.getpid()))
    t = torch.ones(1000)
    dist.barrier()
    times: list[float] = []
    start = time.monotonic()
    steps = 10**9 if args.seconds > 0 else args.steps
    for n in range(1, steps + 1):
        work(args.iters)
        t.zero_()
        if rank == 0 and args.seconds > 0 and time.monotonic() - start >= args.seconds:
            t[0] = 1.0  # the last step: every rank sees it in the sum
        dist.all_reduce(t)
        times.append(time.monotonic())
        if rank == 0:
            print(f"step {n}/{steps}", flush=True)
        if t[0] > 0:
            break
    if rank == 0:
        with open(os.path.join(args.out, "steps"), "w") as fp:
            fp.write("\n".join(repr(x) for x in times) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
