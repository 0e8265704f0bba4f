"""Asynchronous collectives: gradients all-reduced with ``async_op=True``, waited on later.

The pattern of NCCL programs (a collective returns at once, the rank blocks at the next sync
point, in its own code), made with gloo's ``async_op=True`` on CPU: each step launches one
``all_reduce`` per parameter, runs a little more work, then calls :func:`sync_point`, which
waits on each ``Work``. A rank whose peer has wandered off blocks in ``work.wait()`` inside
``sync_point``, not inside ``dist.all_reduce``.

Rank 0 prints ``step {i}/{total} | loss {loss:.4f}`` each step.

Environment: ``CORPUS_STEPS`` (default 300); ``CORPUS_HANG_RANK/STEP`` and
``CORPUS_RAISE_RANK/STEP`` (``_hooks.py``) act after the backward pass, before the step's
collectives are issued; ``CORPUS_MISMATCH_RANK=r CORPUS_MISMATCH_STEP=k`` makes rank ``r``
issue an ``all_gather`` of another size at step ``k`` where the others issue ``all_reduce``.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _hooks import RANK, env_int, misbehave
from torch import nn

STEPS = env_int("CORPUS_STEPS", 300)
MISMATCH = (
    (int(os.environ["CORPUS_MISMATCH_RANK"]), int(os.environ["CORPUS_MISMATCH_STEP"]))
    if os.environ.get("CORPUS_MISMATCH_RANK") and os.environ.get("CORPUS_MISMATCH_STEP")
    else None
)


def sync_point(works: list[dist.Work]) -> None:
    """Wait for the step's collectives: where a rank blocks when a peer is missing."""
    for work in works:
        work.wait()


def main() -> None:
    dist.init_process_group(backend="gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(RANK)
    for step in range(STEPS):
        x = torch.randn(64, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        misbehave(step)
        works: list[dist.Work] = []
        if (RANK, step) == MISMATCH:
            grad = next(model.parameters()).grad
            assert grad is not None
            out = [torch.empty(2 * grad.numel()) for _ in range(world)]
            works.append(dist.all_gather(out, torch.zeros(2 * grad.numel()), async_op=True))
        else:
            for p in model.parameters():
                assert p.grad is not None
                works.append(dist.all_reduce(p.grad, async_op=True))
        # work that overlaps the collectives, as a program would do before its sync point
        with torch.no_grad():
            _ = model(torch.randn(64, 32, generator=gen))
        sync_point(works)
        for p in model.parameters():
            assert p.grad is not None
            p.grad /= world
        opt.step()
        if RANK == 0:
            print(f"step {step + 1}/{STEPS} | loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
