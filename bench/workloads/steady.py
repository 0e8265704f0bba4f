"""Benchmark workload: a steady, light training loop that prints a line every 0.5 s per rank.

Usage: ``steady.py DIR SECONDS [STEP_S]`` under a launcher.

Every rank joins a gloo group and waits at a barrier; then, for SECONDS (measured by the rank
of global rank 0 and agreed through the all_reduce itself, so every rank leaves at the same
step), each step all_reduces 1024 floats and sleeps STEP_S (0.05 s by default: about 20 steps
a second per rank, a small share of a core, so that what the launcher costs is not lost under
the workers' own load). Every 0.5 s each rank prints one flushed line (``step``, a fake loss,
the elapsed time), as a training script's progress output would.

Marks written to DIR: ``start_<rank>`` (``time.time()`` after the barrier, when the loop
begins) and ``end_<rank>`` (``time.time()`` and the step count when the loop is over).
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.distributed as dist


def mark(path: str, text: str) -> None:
    with open(path, "w") as fp:
        fp.write(text)


def main() -> None:
    out, seconds = sys.argv[1], float(sys.argv[2])
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buf = torch.ones(1024)
    dist.barrier()
    start = time.time()
    mark(os.path.join(out, f"start_{rank}"), repr(start))
    next_print = start
    step = 0
    while True:
        now = time.time()
        buf.fill_(1.0)
        buf[0] = 1.0 if rank == 0 and now - start >= seconds else 0.0  # rank 0 says stop
        dist.all_reduce(buf)
        if buf[0].item() > 0:
            break
        step += 1
        if now >= next_print:
            loss = 2.0 * math.exp(-step / 2000) + 0.01 * math.sin(step)
            print(
                f"rank {rank} step {step:6d} loss {loss:.4f} elapsed {now - start:6.1f}s",
                flush=True,
            )
            next_print += 0.5
        time.sleep(step_s)
    mark(os.path.join(out, f"end_{rank}"), f"{time.time()!r} {step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
