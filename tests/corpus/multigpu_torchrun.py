"""The PyTorch DDP tutorial's ``multigpu_torchrun.py`` ("Fault-tolerant Distributed Training
with torchrun"), adapted to CPU and gloo only where it has to be, its print lines kept as they are.

Changes from the tutorial, and why:

* ``gloo`` instead of ``nccl`` and no ``.to(gpu_id)`` / ``device_ids``: CPU only. ``gpu_id`` is
  still ``LOCAL_RANK``, so the lines read ``[GPU0] Epoch 152 | Batchsize: 32 | Steps: 32``.
* ``MyTrainDataset`` (the tutorial's ``datautils.py``) is inlined.
* ``total_epochs`` and ``save_every`` are optional (``CORPUS_EPOCHS``, default 10; 5), so
  ``tuilaunch ... multigpu_torchrun.py`` runs with no arguments; the tutorial's
  ``multigpu_torchrun.py 50 10`` works as well.
* The snapshot goes to the temp directory under the launch's run id
  (``TORCHELASTIC_RUN_ID``) instead of ``./snapshot.pt``: a restart resumes from it, a new
  launch (``--standalone`` draws a new id) does not pick up an old one, and parallel tests share
  no file.
* ``misbehave(step)`` (``_hooks.py``) before each batch: ``CORPUS_HANG_RANK/STEP`` and
  ``CORPUS_RAISE_RANK/STEP``; the step is the batch count across epochs, from 0.
"""

import os
import tempfile

import torch
import torch.nn.functional as F
from _hooks import env_int, misbehave
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.global_step = 0
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        self.global_step = self.epochs_run * len(self.train_data)
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}"
        )
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            misbehave(self.global_step)
            self._run_batch(source, targets)
            self.global_step += 1

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        shuffle=False,
        sampler=DistributedSampler(dataset),
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument(
        "total_epochs",
        type=int,
        nargs="?",
        default=env_int("CORPUS_EPOCHS", 10),
        help="Total epochs to train the model",
    )
    parser.add_argument(
        "save_every", type=int, nargs="?", default=5, help="How often to save a snapshot"
    )
    parser.add_argument(
        "--batch_size",
        default=32,
        type=int,
        help="Input batch size on each device (default: 32)",
    )
    args = parser.parse_args()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    snapshot = os.path.join(tempfile.gettempdir(), f"corpus-ddp-tutorial-{run_id}.pt")
    main(args.save_every, args.total_epochs, args.batch_size, snapshot)
