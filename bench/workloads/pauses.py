"""A healthy DDP job (gloo, CPU) with one of the pauses real training has, for
``bench/falsealarm.py``: none of them is a hang, so a hang watch must confirm none.

``--pause``:

* ``checkpoint``: after every 120 s of training every rank stops for a 120 s checkpoint save:
  rank 0 writes the model (slowly, silent), the others wait for it in a barrier; rank 0
  prints a line before and after, as trainers do.
* ``eval``: every 25 steps an evaluation pass 20 times as long as a step (no output until its
  result, all-reduced across ranks).
* ``warmup``: the first step takes 30 s, silent, busy: :func:`warm_up` passes over the model
  again and again as a compiler or an autotuner would (a sleep standing in for it would be a
  rank that does nothing, which is what a hang looks like to the rule).
* ``variable``: each step's time varies 10x, 0.1 s to 1 s (variable sequence lengths; drawn
  from the step number, so every rank agrees).
* ``quiet``: the job prints only every 60 s.

Steps are 0.2 s (``variable``: 0.1-1 s) of which a little is compute and the rest asleep (the
part a GPU would spend); rank 0 prints a line a step (``quiet``: every 60 s). The job ends on its
own after ``--seconds`` of planned time (steps and pauses) from its first step.

With ``PAUSES_MARK=path`` rank 0 writes the wall time (``time.time()``) its first step ended
there: the harness tells a suspicion during the launch's start-up from one during training.

``--scale s`` multiplies every duration (steps, pauses, the print interval, ``--seconds``):
the job's shape is kept, only its clock is faster; see ``bench/falsealarm.py`` for when that
is a valid stand-in.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

PAUSES = ("checkpoint", "eval", "warmup", "variable", "quiet")


def _trace(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.randn(64, 32)).sum()


def _lower(x: torch.Tensor) -> torch.Tensor:
    w = torch.randn(64, 64)
    for _ in range(20):
        w = torch.tanh(w @ w)
    return x + w.sum()


def _autotune(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x * k for k in range(50)]).mean()


def warm_up(model: torch.nn.Module, seconds: float) -> None:
    """A compiler's warm-up: pass after pass over the model, busy, for ``seconds``."""
    t0 = time.monotonic()
    with torch.no_grad():
        while time.monotonic() - t0 < seconds:
            _autotune(_lower(_trace(model)))


def main() -> None:
    parser = argparse.ArgumentParser(description="A healthy DDP job with a pause.")
    parser.add_argument("--pause", choices=PAUSES, required=True)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    s = args.scale
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Every decision every rank must agree on (when to evaluate, save, end) is taken from the
    # plan (planned seconds, the step number), never from a rank's own clock.
    planned = 0.0
    trained_since_save = 0.0
    printed = time.monotonic()
    step = 0
    while planned < args.seconds * s:
        t0 = time.monotonic()
        step_time = 0.2 * s
        if args.pause == "variable":
            step_time = 0.1 * s * 10 ** random.Random(step).random()  # 0.1-1 s, log-uniform
        if args.pause == "warmup" and step == 0:
            step_time = 30.0 * s
            warm_up(model.module, step_time)
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, step_time - (time.monotonic() - t0)))
        planned += step_time
        trained_since_save += step_time
        now = time.monotonic()
        if rank == 0 and step == 0 and os.environ.get("PAUSES_MARK"):
            with open(os.environ["PAUSES_MARK"], "w") as fp:
                fp.write(f"{time.time()}\n")
        if rank == 0 and (args.pause != "quiet" or now - printed >= 60.0 * s):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            printed = now
        if args.pause == "eval" and step % 25 == 24:
            t1 = time.monotonic()
            with torch.no_grad():
                total = torch.zeros(1)
                while time.monotonic() - t1 < 20 * 0.2 * s:
                    total += model(torch.randn(16, 32)).pow(2).mean()
                    time.sleep(0.05 * s)
            dist.all_reduce(total)
            planned += 20 * 0.2 * s
            if rank == 0:
                print(f"eval after step {step}: {total.item():.2f}", flush=True)
        if args.pause == "checkpoint" and trained_since_save >= 120.0 * s:
            if rank == 0:
                print(f"saving checkpoint at step {step}", flush=True)
                t1 = time.monotonic()
                path = os.path.join(tempfile.gettempdir(), f"pauses-{os.getpid()}.pt")
                while time.monotonic() - t1 < 120.0 * s:  # a slow file system, silent
                    torch.save(model.module.state_dict(), path)
                    time.sleep(0.5 * s)
                os.unlink(path)
                print(f"checkpoint saved at step {step}", flush=True)
            dist.barrier()
            trained_since_save = 0.0
            planned += 120.0 * s
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
