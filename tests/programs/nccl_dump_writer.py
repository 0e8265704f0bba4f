"""Writes what NCCL's watchdog writes on a collective timeout, then lingers, then exits 0.

Each rank writes its Flight Recorder dump to ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank, in
torch 2.13's pickle format, as NCCL's dump-on-timeout does on a GPU (this machine has none):
every rank completed all_reduce #7, rank 1 never issued #8, the others wait in it. It then
stays alive ``--linger`` seconds (the launcher judges the files while the job still runs) and
exits.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time


def dump(rank: int, world: int) -> dict:
    issued = 7 if rank == 1 else 8
    group = ("0", "default_pg")
    entries = [
        {
            "record_id": seq,
            "pg_id": 0,
            "process_group": group,
            "collective_seq_id": seq,
            "p2p_seq_id": 0,
            "op_id": seq,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": time.time_ns(),
            "input_sizes": [[1024]],
            "input_dtypes": ["Float"],
            "output_sizes": [[1024]],
            "output_dtypes": ["Float"],
            "state": "scheduled",
            "is_p2p": False,
            "retired": False,
            "timeout_ms": 600000,
        }
        for seq in range(8, issued + 1)
    ]
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": issued,
                "last_started_collective": -1,
                "last_completed_collective": 7,
            }
        },
        "entries": entries,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--linger", type=float, default=15.0)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    prefix = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    # Written in place, as torch's DebugInfoWriter does: a reader may see half a dump.
    with open(f"{prefix}{rank}", "wb") as fp:
        pickle.dump(dump(rank, world), fp)
    print(f"rank {rank}: dumped", flush=True)
    time.sleep(a.linger)


if __name__ == "__main__":
    main()
