"""Test worker: a gloo job that steps a few times a second, then one rank hangs one way.

Options:
  --kind K       how rank ``--rank`` hangs at step ``--at`` (the others block in all_reduce):
                 sigstop     it stops itself (SIGSTOP)
                 sleep       it sleeps forever before the collective
                 mismatch    it calls broadcast while the others call all_reduce
                 gil         it holds the GIL in a C call (libc ``sleep`` through ctypes.PyDLL)
                 dataloader  its DataLoader worker deadlocks on a lock; it waits for the batch
                 heartbeat   it is stuck in its own code while a thread prints every 0.3 s
                 lock        it waits on a lock another thread holds
                 none        nobody hangs: the job runs ``--steps`` steps and exits 0
  --rank R       the rank that hangs (default 1)
  --at N         the step at which it hangs (default 20)
  --step S       seconds a step takes (default 0.2)
  --steps N      steps of a job that does not hang (default 60)
  --pause S      with ``--kind none``: at step ``--at`` every rank works S seconds without a
                 step line, as ``--pause-kind`` says: ``eval`` (computes; its stack moves),
                 ``save`` (rank 0 writes a file in one Python line while the others wait in
                 a barrier)

Every rank prints ``rank R step N`` each step; the hanging rank prints ``rank R hangs (K)``
first, with the monotonic time, so that a test can time the detection.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist


class _Stuck(torch.utils.data.Dataset):
    """A dataset whose worker deadlocks at item ``at``: a lock it already holds."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= self.at:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # the worker deadlocks on its own lock
        return torch.zeros(4)


def _heartbeat(rank: str) -> None:
    n = 0
    while True:
        n += 1
        print(f"rank {rank} heartbeat {n}", flush=True)
        time.sleep(0.3)


def wait_for_flag(flag: list[bool]) -> None:
    """The program's own code, stuck: it waits for a flag nobody sets."""
    while not flag[0]:
        time.sleep(0.05)


def _hold(lock: threading.Lock) -> None:
    with lock:
        time.sleep(1e6)


def hang(kind: str, rank: str, t: torch.Tensor, loader: object) -> None:
    """Rank ``rank`` hangs as ``kind`` says."""
    print(f"rank {rank} hangs ({kind}) at {time.monotonic():.3f}", flush=True)
    if kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "sleep":
        time.sleep(1e6)
    elif kind == "mismatch":
        dist.broadcast(t, src=int(rank))
    elif kind == "gil":
        ctypes.PyDLL(None).sleep(1000000)
    elif kind == "dataloader":
        next(iter(loader))  # type: ignore[call-overload]
    elif kind == "heartbeat":
        threading.Thread(target=_heartbeat, args=(rank,), daemon=True).start()
        wait_for_flag([False])
    elif kind == "lock":
        lock = threading.Lock()
        threading.Thread(target=_hold, args=(lock,), daemon=True).start()
        time.sleep(0.1)
        with lock:
            pass


def pause(kind: str, rank: str, seconds: float) -> None:
    """Work for ``seconds`` without a step line: an evaluation or a checkpoint save."""
    end = time.monotonic() + seconds
    if kind == "eval":
        x = torch.randn(64, 64)
        while time.monotonic() < end:
            x = torch.tanh(x @ x.T / 64)
    elif rank == "0":
        chunk = os.urandom(1 << 16)
        with tempfile.TemporaryFile() as f:
            # One line: the stack sits still while the bytes move, which is what the test
            # tells apart (a loop over three lines showed a moving stack now and then).
            while time.monotonic() < end: f.write(chunk); f.flush()  # noqa: E701, E702  # fmt: skip
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description="A gloo job where one rank hangs.")
    parser.add_argument("--kind", default="sleep")
    parser.add_argument("--rank", default="1")
    parser.add_argument("--at", type=int, default=20)
    parser.add_argument("--step", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--pause-kind", default="eval")
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    loader = None
    if args.kind == "dataloader" and rank == args.rank:
        loader = torch.utils.data.DataLoader(_Stuck(0), batch_size=1, num_workers=1)
    t = torch.ones(4)
    for step in range(1, 1 << 30):
        if args.kind != "none" and step == args.at and rank == args.rank:
            hang(args.kind, rank, t, loader)
        if args.kind == "none" and args.pause and step == args.at:
            pause(args.pause_kind, rank, args.pause)
        dist.all_reduce(t)
        sys.stdout.write(f"rank {rank} step {step}\n")
        sys.stdout.flush()
        if args.kind == "none" and step >= args.steps:
            break
        time.sleep(args.step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
