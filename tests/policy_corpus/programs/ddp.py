"""A DDP loop over gloo that fails on request, the ways torch programs fail.

Every rank steps ``--steps`` times (an all_reduce each), rank 0 printing ``step N/T loss L``.
``--fail KIND`` on ``--rank`` at step ``--at``, on the attempts ``--attempts`` names (``all``,
or ``0,1``):

  peer      the rank SIGKILLs itself: its peers' all_reduce breaks (a peer's death)
  store     before the first step, a TCPStore client to a port nobody serves: the store blip
            torch reports (``DistNetworkError``/``DistStoreError``)
  timeout   the rank sleeps past the group's 3 s timeout: its peers' all_reduce times out
  shape     ``torch.cat`` of tensors whose shapes do not match (raised inside torch)
  oom       ``torch.empty`` of ``--gb`` gigabytes (the allocator's out of memory)
  nan       a check of the loss raises (the loss is NaN from that step on)

With ``--record`` the program's main is wrapped in torch's ``@record`` (an error file).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--fail", default="")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=4)
    p.add_argument("--attempts", default="all")
    p.add_argument("--gb", type=int, default=1 << 16)
    p.add_argument("--record", action="store_true")
    return p.parse_args()


def check_loss(loss: torch.Tensor, step: int) -> None:
    if torch.isnan(loss).any():
        raise FloatingPointError(f"loss is nan at step {step}")


def fail(a: argparse.Namespace, step: int) -> None:
    if a.fail == "peer":
        os.kill(os.getpid(), signal.SIGKILL)
    elif a.fail == "timeout":
        time.sleep(30)
    elif a.fail == "shape":
        torch.cat([torch.zeros(2, 3), torch.zeros(2, 4)], dim=0)
    elif a.fail == "oom":
        torch.empty(a.gb << 30, dtype=torch.uint8)
    elif a.fail == "nan":
        check_loss(torch.tensor(float("nan")), step)


def train(a: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    on_me = a.fail and rank == a.rank and (a.attempts == "all" or str(attempt) in a.attempts)
    torch.set_num_threads(1)
    if on_me and a.fail == "store":
        # A side store (a data service's, a second job's) that is not up yet.
        dist.TCPStore("127.0.0.1", 9, is_master=False, timeout=timedelta(seconds=2))
    dist.init_process_group("gloo", timeout=timedelta(seconds=3 if a.fail == "timeout" else 60))
    t = torch.ones(4)
    for step in range(a.steps):
        if on_me and step == a.at:
            fail(a, step)
        dist.all_reduce(t)
        if rank == 0:
            print(f"step {step + 1}/{a.steps} loss {1.0 / (step + 1):.4f}", flush=True)
        time.sleep(a.interval)
    dist.destroy_process_group()


def main() -> None:
    a = parse()
    (record(train) if a.record else train)(a)


if __name__ == "__main__":
    main()
