"""A fault-tolerant DDP trainer that prints one line per epoch and no step line, as many do.

Options:
  --epochs N          epochs in all (default 6)
  --epoch-seconds S   each epoch lasts about S seconds (default 0.5), steps of 20 ms
  --shape rank|of     ``epoch E rank R`` on every rank (0-based), or ``Epoch [E/N], Loss: L``
                      on rank 0 (1-based, with the number of epochs)
  --snapshot PATH     the epochs run, saved after each epoch; a restart resumes from it
                      (``resuming from epoch E``)
  --exit-rank R --exit-epoch E
                      rank R exits with ``os._exit(1)`` as epoch E starts, on attempt 0 only
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--epoch-seconds", type=float, default=0.5)
    p.add_argument("--shape", choices=("rank", "of"), default="rank")
    p.add_argument("--snapshot", default=None)
    p.add_argument("--exit-rank", type=int, default=None)
    p.add_argument("--exit-epoch", type=int, default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if args.snapshot and os.path.exists(args.snapshot):
        with open(args.snapshot) as f:
            start = int(f.read().strip() or 0)
        print(f"resuming from epoch {start}", flush=True)
    steps = max(1, round(args.epoch_seconds / 0.02))
    for epoch in range(start, args.epochs):
        if attempt == 0 and (rank, epoch) == (args.exit_rank, args.exit_epoch):
            os._exit(1)
        loss = torch.zeros(())
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.02)
        if args.shape == "rank":
            print(f"epoch {epoch} rank {rank}", flush=True)
        elif rank == 0:
            print(f"Epoch [{epoch + 1}/{args.epochs}], Loss: {loss.item():.4f}", flush=True)
        if rank == 0 and args.snapshot:
            with open(args.snapshot, "w") as f:
                f.write(str(epoch + 1))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
