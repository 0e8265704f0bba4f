"""Benchmark workload for many real agents: step in a gloo group, and hang on the rank asked to.

Usage: ``hangable.py DIR STOP_FILE HANG_FILE`` under a launcher, one rank per node.

Once past ``init_process_group`` and one ``all_reduce``, the rank writes ``DIR/up_<pid>``
(JSON: ``time.time()``, ``WORLD_SIZE``, ``RANK``, ``GROUP_RANK``, ``TORCHELASTIC_RESTART_COUNT``,
pid), then steps: an ``all_reduce`` of the "STOP_FILE exists" flag every 0.2 s (all ranks leave
at the same step and exit 0), and a line on stdout every 5 s, as a training loop's progress
would (the launcher's hang watch hears the job is alive).

The hang: when HANG_FILE holds this rank's global rank and this attempt's restart count
(``RANK RESTART``), the rank writes ``DIR/hung_<pid>`` and waits in :func:`load_batch`, a
function of its own, forever; every other rank then waits for it in ``all_reduce``: the
textbook odd rank out, which a job-wide dump must name. A peer that dies breaks the collective:
this rank then fails with gloo's error, as a real job would.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch() -> None:
    """The hung rank's own wait: it never comes back to the collective."""
    while True:
        time.sleep(0.5)


def wants_hang(hang_file: str, rank: int, restart: int) -> bool:
    """Whether HANG_FILE names this rank in this attempt."""
    try:
        with open(hang_file) as fp:
            words = fp.read().split()
    except OSError:
        return False
    return words == [str(rank), str(restart)]


def write_json(path: str, record: dict[str, object]) -> None:
    """Write ``record`` whole: the harness never reads half of one."""
    with open(path + ".tmp", "w") as fp:
        json.dump(record, fp)
    os.replace(path + ".tmp", path)


def main() -> None:
    out, stop_file, hang_file = sys.argv[1], sys.argv[2], sys.argv[3]
    env = os.environ
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    rank = int(env["RANK"])
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    record = {
        "t": time.time(),
        "world": int(env["WORLD_SIZE"]),
        "rank": rank,
        "group_rank": int(env.get("GROUP_RANK", "0")),
        "restart": restart,
        "pid": os.getpid(),
    }
    write_json(os.path.join(out, f"up_{os.getpid()}"), record)
    step, said = 0, time.monotonic()
    while True:
        if wants_hang(hang_file, rank, restart):
            write_json(os.path.join(out, f"hung_{os.getpid()}"), {**record, "t": time.time()})
            load_batch()
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        step += 1
        if time.monotonic() - said >= 5.0:
            said = time.monotonic()
            print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
