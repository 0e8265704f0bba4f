"""DDP over a module with buffers (BatchNorm's running statistics) on CPU with gloo.

With ``broadcast_buffers=True`` (DDP's default) every forward first broadcasts rank 0's
buffers: a rank whose peer went elsewhere waits there, in DDP's ``_sync_buffers``, whose
innermost Python frame calls the native ``dist._broadcast_coalesced`` (as accelerate's
``nlp_example`` does with a BERT).

Options:
  --seconds S       exit on its own after S seconds (a test that dies leaves nothing behind)
  --sleep-rank R    from step --sleep-at on, rank R sleeps in ``asleep`` before its forward
  --sleep-at K      the step at which it does (default 5)
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def asleep() -> None:
    """The rank's own business: it never comes back to the next forward."""
    while True:
        time.sleep(0.2)


def _watchdog(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="DDP with buffers on CPU.")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--sleep-rank", type=int, default=-1)
    parser.add_argument("--sleep-at", type=int, default=5)
    args = parser.parse_args()
    threading.Thread(target=_watchdog, args=(args.seconds,), daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 1)
    )
    model = DDP(net)  # broadcast_buffers: DDP's default, True
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        if rank == args.sleep_rank and step >= args.sleep_at:
            asleep()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        step += 1
        time.sleep(0.05)


if __name__ == "__main__":
    main()
