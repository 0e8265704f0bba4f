"""A plain DDP training loop on CPU with gloo, as people write it (no tuilaunch hooks).

Options:
  --steps N         steps to run (default 1000000: until a hang or --seconds)
  --seconds S       exit on its own after S seconds (a test that dies leaves nothing behind)
  --wander-rank R   from step --wander-at on, rank R goes off into ``wandered_off`` (a sleep
                    loop inside ``training_step``) and never comes back to the all-reduce
  --wander-at K     the step at which it does (default 5)
  --print-every N   print a progress line every N steps (default 1)

DDP's gradient all-reduce runs from autograd's threads, so the ranks that wait for the one that
wandered off sit in ``loss.backward()`` on their main thread.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def wandered_off(rank: int) -> None:
    """The rank's own business: it never returns to the collective."""
    while True:
        time.sleep(0.2)


def training_step(
    model: DDP, opt: torch.optim.Optimizer, step: int, args: argparse.Namespace
) -> float:
    rank = dist.get_rank()
    x = torch.randn(16, 32)
    loss = model(x).pow(2).mean()
    if rank == args.wander_rank and step >= args.wander_at:
        wandered_off(rank)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.item())


def _watchdog(seconds: float) -> None:
    time.sleep(seconds)
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description="A plain DDP loop on CPU.")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--wander-rank", type=int, default=-1)
    parser.add_argument("--wander-at", type=int, default=5)
    parser.add_argument("--print-every", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.05)
    args = parser.parse_args()
    threading.Thread(target=_watchdog, args=(args.seconds,), daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        loss = training_step(model, opt, step, args)
        if step % args.print_every == 0:
            print(f"rank {rank} step {step} loss {loss:.4f}", flush=True)
        time.sleep(args.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
