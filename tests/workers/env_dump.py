"""Test worker: dump this rank's environment and argv, then run a tiny gloo job.

Usage: ``env_dump.py OUT_DIR [ARGS...]``.  Writes ``OUT_DIR/env_<RANK>.json``
holding ``{"env": {...}, "argv": [...]}`` (keys sorted), then joins the process
group, does one all_reduce and leaves, so it behaves like a real (short) job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    payload = json.dumps({"env": dict(os.environ), "argv": sys.argv}, sort_keys=True)
    tmp = out_dir / f".env_{rank}.json.tmp"
    tmp.write_text(payload)
    tmp.replace(out_dir / f"env_{rank}.json")

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # Keep the tensor alive until the group is gone: on torch 2.6, freeing it
    # from gloo's thread while destroy_process_group joins that thread deadlocks.
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
