"""Test worker: one rank fails in a chosen way, the others wait to be torn down.

Options:
  --rank R       the global rank that fails (default 1)
  --mode M       raise | exit | segv | abort | kill (default raise)
  --record       wrap main with torch's ``@record`` (writes the error file)
  --attempt A    only fail when TORCHELASTIC_RESTART_COUNT == A (default: always)
  --after S      seconds to wait before failing (default 0.5)

``raise`` raises ``RuntimeError("boom from rank R")`` from ``explode()``;
``exit`` calls ``sys.exit(3)``; ``segv``/``abort``/``kill`` die by SIGSEGV,
SIGABRT and SIGKILL.  Before failing the rank writes ``stderr line 1..5`` to
stderr.  The other ranks sleep (up to 60 s, no collectives) and then exit 0.
When the attempt does not match, every rank joins a gloo group, does one all_reduce and exits
0. torch is imported only then, or with ``--record``: a rank that only fails or waits has no
use for it (and the suite runs this worker dozens of times).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Crash one rank on purpose.")
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument(
        "--mode", choices=["raise", "exit", "segv", "abort", "kill"], default="raise"
    )
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--attempt", type=int, default=None)
    parser.add_argument("--after", type=float, default=0.5)
    return parser.parse_args()


def explode(rank: int) -> None:
    raise RuntimeError(f"boom from rank {rank}")


def fail(mode: str, rank: int) -> None:
    if mode == "raise":
        explode(rank)
    elif mode == "exit":
        sys.exit(3)
    elif mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "abort":
        os.abort()
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # a signal may take a moment to be delivered


def main() -> None:
    args = parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    sys.stdout.write(f"rank {rank} attempt {attempt} pid {os.getpid()}\n")
    sys.stdout.flush()

    if args.attempt is not None and attempt != args.attempt:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        # Keep the tensor alive until the group is gone: on torch 2.6, freeing it
        # from gloo's thread while destroy_process_group joins that thread deadlocks.
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return

    if rank == args.rank:
        time.sleep(args.after)
        for i in range(1, 6):
            sys.stderr.write(f"stderr line {i}\n")
        sys.stderr.flush()
        fail(args.mode, rank)
    else:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.1)


if __name__ == "__main__":
    if "--record" in sys.argv[1:]:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
