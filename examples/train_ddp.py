"""Fault-tolerant DDP training example (CPU / gloo).

This is the trainer from PyTorch's tutorial "Fault-tolerant Distributed
Training with torchrun", adapted to run on CPU with the ``gloo`` backend and a
tiny synthetic workload, so that restarts can be demonstrated on any machine.

The launcher (``tuilaunch`` or ``torchrun``) provides the rendezvous and the
``LOCAL_RANK`` / ``RANK`` / ``WORLD_SIZE`` environment variables.  Rank 0
writes a snapshot (model + optimizer state + epochs run) every
``--save-every`` epochs; when a worker fails, the launcher tears the group down
and restarts every worker, and each one resumes from the last snapshot.

A snapshot belongs to one run: it records the launcher's run id
(``TORCHELASTIC_RUN_ID``, the same in every restart of a run; ``--standalone``
draws a new one for each launch), and a worker resumes only from a snapshot of
its own run.  A snapshot left by an earlier run (stopped with ``q`` or Ctrl-C,
or killed, before it could delete it) is ignored: the new run trains from
scratch and overwrites it.  Where the run id says nothing (``none``, torch's
default without ``--standalone`` or ``--rdzv-id``), a snapshot that already
holds every epoch is ignored too.

Run it with::

    tuilaunch --standalone --nproc-per-node 2 --max-restarts 3 \\
        examples/train_ddp.py --epochs 5

It works identically under ``torchrun`` (same arguments).  To see a restart,
``kill -9`` one of the worker processes while it trains (each worker prints
its pid at start).  After a successful run rank 0 deletes the snapshot, unless
``--keep-snapshot`` is given, so rerunning the demo starts from scratch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NUM_SAMPLES = 1280
IN_FEATURES = 20
HIDDEN = 32
DATA_SEED = 1234


def log(msg: str) -> None:
    """Print one line with a single write, so lines from ranks sharing a pipe never interleave."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def ddp_setup() -> None:
    """Join the process group described by the launcher's env variables."""
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")


def build_dataset() -> Dataset:
    """A deterministic synthetic regression problem (same on every rank)."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(NUM_SAMPLES, IN_FEATURES, generator=gen)
    true_w = torch.randn(IN_FEATURES, 1, generator=gen)
    y = x @ true_w + 0.1 * torch.randn(NUM_SAMPLES, 1, generator=gen)
    return TensorDataset(x, y)


def build_model() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        step_delay: float,
        max_epochs: int | None = None,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.step_delay = step_delay
        self.epochs_run = 0
        self.module = model  # the bare model, whose state goes into snapshots
        self.run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path, max_epochs)
        # DDP broadcasts rank 0's parameters at construction time.
        self.model = DDP(model)

    def _load_snapshot(self, snapshot_path: str, max_epochs: int | None) -> None:
        snapshot = torch.load(snapshot_path, map_location="cpu")
        theirs = snapshot.get("RUN_ID")
        if self.run_id not in ("", "none"):
            # A restart of this run resumes; another run's snapshot is stale (a stopped
            # earlier launch left it): resuming it could train nothing and "succeed".
            if theirs != self.run_id:
                log(f"Ignoring the snapshot of another run ({theirs}): training from scratch")
                return
        elif max_epochs is not None and snapshot["EPOCHS_RUN"] >= max_epochs:
            log("Ignoring a snapshot that holds every epoch already: training from scratch")
            return
        self.module.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        log(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {
            "MODEL_STATE": self.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            # Epochs completed: a restart resumes with the next one.
            "EPOCHS_RUN": epoch + 1,
            # Whose snapshot this is: only a restart of the same run resumes from it.
            "RUN_ID": self.run_id,
        }
        # Write to a temporary file and rename it, so a crash mid-write never
        # leaves a truncated snapshot behind.
        tmp_path = f"{self.snapshot_path}.tmp.{os.getpid()}"
        torch.save(snapshot, tmp_path)
        os.replace(tmp_path, self.snapshot_path)
        log(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        sampler = self.train_data.sampler
        assert isinstance(sampler, DistributedSampler)
        sampler.set_epoch(epoch)
        total_loss = 0.0
        steps = 0
        batch_size = self.train_data.batch_size
        for source, targets in self.train_data:
            total_loss += self._run_batch(source, targets)
            steps += 1
            if self.step_delay > 0:
                time.sleep(self.step_delay)
        log(
            f"[RANK {self.global_rank}] Epoch {epoch} | Batchsize: {batch_size} "
            f"| Steps: {steps} | loss {total_loss / max(steps, 1):.4f}"
        )

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fault-tolerant DDP training example.")
    parser.add_argument("--epochs", type=int, default=5, help="total epochs")
    parser.add_argument("--save-every", type=int, default=1, help="snapshot every N epochs")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument(
        "--snapshot-path",
        default=os.environ.get("TUILAUNCH_SNAPSHOT", "snapshot.pt"),
        help="snapshot file (default: $TUILAUNCH_SNAPSHOT or snapshot.pt)",
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.05,
        help="seconds to sleep after each step, to make epochs observable",
    )
    parser.add_argument(
        "--keep-snapshot",
        action="store_true",
        help="do not delete the snapshot after a successful run",
    )
    args = parser.parse_args(argv)
    if args.save_every < 1:
        parser.error("--save-every must be >= 1")
    return args


@record
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    ddp_setup()
    rank = dist.get_rank()
    log(
        f"[RANK {rank}] start: "
        f"restart_count={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} "
        f"world_size={dist.get_world_size()} pid={os.getpid()} epochs={args.epochs}"
    )

    dataset = build_dataset()
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train_data = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )
    trainer = Trainer(
        model,
        train_data,
        optimizer,
        args.save_every,
        args.snapshot_path,
        args.step_delay,
        args.epochs,
    )
    trainer.train(args.epochs)

    # Every rank is done with the snapshot once all of them get here.
    dist.barrier()
    if rank == 0 and not args.keep_snapshot:
        with contextlib.suppress(FileNotFoundError):
            os.remove(args.snapshot_path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
