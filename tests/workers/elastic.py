"""Test worker for elastic runs: report the world this rank sees, step until told to stop.

Usage: ``elastic.py LOG STOP_FILE``. At start, appends
``<RANK> <WORLD_SIZE> <TORCHELASTIC_RESTART_COUNT> <GROUP_RANK> <pid>`` to LOG. Then runs small
all_reduce steps; every step also sums "has STOP_FILE appeared" over all ranks, so every rank of
the group stops at the same step (no rank leaves its peers in a broken collective) and exits 0.

With ``TL_FAIL_ONCE=PATH`` in the environment, rank 1 of a world of two or more fails by itself
once: after a few steps it writes ``time.time()`` to PATH and raises ``RuntimeError`` (not if
PATH exists, so the restarted group runs on). Its peers on other nodes then die of the broken
collective.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    log, stop_file = sys.argv[1], sys.argv[2]
    env = os.environ
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # Written after the group formed: a line means this rank really is in a world this size.
    with open(log, "a") as f:
        f.write(
            f"{env['RANK']} {env['WORLD_SIZE']} {env.get('TORCHELASTIC_RESTART_COUNT', '0')} "
            f"{env.get('GROUP_RANK', '')} {os.getpid()}\n"
        )
    fail_once = env.get("TL_FAIL_ONCE")
    step = 0
    while True:
        step += 1
        if fail_once and step == 10 and dist.get_rank() == 1 and not os.path.exists(fail_once):
            with open(fail_once, "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("rank 1 failed by itself (TL_FAIL_ONCE)")
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
