"""Test worker: a two-rank gloo job that hangs because rank 1 stops calling collectives.

Started by tests/test_stacks.py as plain processes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` in the environment), or through tuilaunch's worker bootstrap.

Options:
  --children N   start N child processes first (stand-ins for data-loader workers; they sleep
                 in ``loader_worker``)
  --seconds S    exit on its own after S seconds (default 120), so that a test that dies leaves
                 nothing behind for long
  --hang-attempts N  hang only in attempts below N (TORCHELASTIC_RESTART_COUNT); later
                 attempts do one more all_reduce on every rank, print ``done`` and exit 0
  --resume-after S   rank 1 leaves ``load_batch`` after S seconds: with ``--quiet-for Q`` it
                 first waits Q seconds in ``elsewhere`` (its stack moves, it prints nothing),
                 then prints ``rank 1 resumed``, joins the all_reduce, every rank prints
                 ``done`` and exits 0 (a hang that ends)

Every rank does one ``all_reduce`` to prove the group works and prints ``ready``. Then rank 0
(and any rank but 1) blocks in ``dist.all_reduce`` forever, waiting for rank 1, while rank 1
waits in a function of its own, ``load_batch``, sleeping: the textbook odd rank out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def loader_worker(parent: int) -> None:
    """A child process that sleeps, as an idle data-loader worker would, until its rank dies
    (a rank killed by SIGKILL cannot take its children along)."""
    while os.getppid() == parent:
        time.sleep(0.2)


def load_batch(until: float = float("inf")) -> None:
    """Rank 1's own wait: it never comes back to the collective (before ``until``)."""
    while time.monotonic() < until:
        time.sleep(0.2)


def elsewhere(until: float) -> None:
    """Rank 1, moved on but still silent: a different stack, no output."""
    while time.monotonic() < until:
        time.sleep(0.2)


def _watchdog(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="A gloo job where rank 1 never joins.")
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--hang-attempts", type=int, default=1 << 30)
    parser.add_argument("--resume-after", type=float, default=None)
    parser.add_argument("--quiet-for", type=float, default=0.0)
    args = parser.parse_args()

    # A second, named thread: dumps must show every thread, the main one first.
    threading.Thread(target=_watchdog, args=(args.seconds,), name="watchdog", daemon=True).start()
    children = []
    for _ in range(args.children):
        # fork: the child needs nothing but this module's function, and starts at once.
        proc = multiprocessing.get_context("fork").Process(
            target=loader_worker, args=(os.getpid(),), daemon=True
        )
        proc.start()
        children.append(proc)

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    sys.stdout.write(f"rank {rank} ready\n")
    sys.stdout.flush()
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) >= args.hang_attempts:
        dist.all_reduce(t)
        sys.stdout.write(f"rank {rank} done\n")
        sys.stdout.flush()
        dist.destroy_process_group()
        return
    if args.resume_after is not None:
        if rank == 1:
            load_batch(time.monotonic() + args.resume_after)
            elsewhere(time.monotonic() + args.quiet_for)
            sys.stdout.write("rank 1 resumed\n")
            sys.stdout.flush()
        dist.all_reduce(t)
        sys.stdout.write(f"rank {rank} done\n")
        sys.stdout.flush()
        dist.destroy_process_group()
        return
    if rank == 1:
        load_batch()
    else:
        dist.all_reduce(t)  # waits for rank 1 forever


if __name__ == "__main__":
    main()
