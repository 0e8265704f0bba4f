"""A plain DDP training loop on CPU with gloo, the way the DDP docs write one: a small MLP,
random batches, ``loss.backward()`` (DDP all-reduces the gradients), ``opt.step()``, a progress
line from rank 0 every step.

Each step lasts ``CORPUS_STEP_SECONDS`` (default 0.2 s: step time well under a second) and
calls ``misbehave(step)`` (``_hooks.py``) first, so ``CORPUS_HANG_KIND`` and the others apply.
``CORPUS_STEPS`` (default 1,000,000: until a hang or a stop) sizes it.
"""

import os
import time

import torch
import torch.distributed as dist
from _hooks import env_int, misbehave
from torch.nn.parallel import DistributedDataParallel as DDP

# Without CORPUS_STEP_SECONDS (which _hooks applies) the loop paces itself the same way.
PACE = 0.0 if os.environ.get("CORPUS_STEP_SECONDS") else 0.2


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(env_int("CORPUS_STEPS", 1_000_000)):
        misbehave(step)
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(PACE)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
