"""Benchmark workload: join the gloo group, one all_reduce, write ``up_<rank>``, leave.

Usage: ``up.py DIR`` under a launcher. ``DIR/up_<RANK>`` holds ``time.time()`` taken once the
rank is past ``init_process_group`` and one ``all_reduce``: the moment the job is ready.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.ones(1)  # alive until the group is gone (torch 2.6's gloo teardown deadlock)
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"up_{dist.get_rank()}"), "w") as fp:
        fp.write(repr(time.time()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
