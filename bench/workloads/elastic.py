"""Benchmark workload for elastic runs: say when this rank is up, then step until told to stop.

Usage: ``elastic.py DIR STOP_FILE`` under a launcher. Once past ``init_process_group`` and one
``all_reduce``, the rank writes ``DIR/up_<pid>`` (JSON: ``time.time()``, ``WORLD_SIZE``,
``RANK``, ``GROUP_RANK``, ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``), then
does an ``all_reduce`` every ~50 ms, as training would, until ``STOP_FILE`` exists. The stop flag
is summed over the group at every step, so all ranks leave at the same step and exit 0. A peer
that dies mid-run breaks the collective: this rank then fails with gloo's error, as a real job
would.

Failure budget: torch sets ``TORCHELASTIC_RESTART_COUNT = spec.max_restarts - remaining``;
torchrun leaves ``max_restarts`` alone and counts only failure restarts, tuilaunch raises
``max_restarts`` by one for each restart it gives back (membership, manual). So for either
launcher ``--max-restarts`` - (MAX_RESTARTS - RESTART_COUNT) is the failure budget spent.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    out, stop_file = sys.argv[1], sys.argv[2]
    env = os.environ
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    record = {
        "t": time.time(),
        "world": int(env["WORLD_SIZE"]),
        "rank": int(env["RANK"]),
        "group_rank": int(env.get("GROUP_RANK", "0")),
        "restart": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "max_restarts": int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")),
        "pid": os.getpid(),
    }
    path = os.path.join(out, f"up_{os.getpid()}")
    with open(path + ".tmp", "w") as fp:
        json.dump(record, fp)
    os.replace(path + ".tmp", path)  # the harness never reads half a record
    while True:
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
