"""Benchmark workload: fail once, then come back; timestamps say how long the restart took.

Usage: ``crash_once.py DIR`` under a launcher with ``--max-restarts 1``.

Attempt 0 (``TORCHELASTIC_RESTART_COUNT == 0``): every rank joins the gloo group and does one
all_reduce; then the failing rank (rank 1, or rank 0 when the world has one rank) writes
``time.time()`` to ``DIR/fail_0`` and leaves with ``os._exit(1)``; the other ranks sleep (as a
rank stuck in training would) until the launcher tears them down.

Attempt 1 and later: every rank joins the group, does one all_reduce, writes ``time.time()``
to ``DIR/up_<rank>`` and exits 0.

restart latency = max(up_*) - fail_0: failure noticed, survivors stopped, rendezvous again,
new workers started (interpreter, ``import torch``) and past ``init_process_group``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def write_time(path: str) -> None:
    with open(path, "w") as fp:
        fp.write(repr(time.time()))


def main() -> None:
    out = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(1))
    if attempt == 0:
        if rank == min(1, world - 1):
            # BENCH_FAIL_AFTER: a job that trained a while before failing (bench/run.py
            # --fail-after); the latency is measured from the failure itself.
            time.sleep(float(os.environ.get("BENCH_FAIL_AFTER") or 0))
            write_time(os.path.join(out, f"fail_{attempt}"))
            os._exit(1)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(2)  # never torn down: the launcher did not act on the failure
    write_time(os.path.join(out, f"up_{rank}"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
