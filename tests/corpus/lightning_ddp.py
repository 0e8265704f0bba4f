"""A Lightning DDP job on CPU under torchrun's environment, with Lightning's default progress bar.

``Trainer(strategy="ddp", accelerator="cpu", devices=LOCAL_WORLD_SIZE, num_nodes=...)``:
Lightning sees torchrun's variables (its ``TorchElasticEnvironment``) and joins the group the
launcher set up, with gloo on CPU. The progress bar is Lightning's default, left as it is:
``RichProgressBar`` when ``rich`` imports (it does under tuilaunch, which depends on rich),
else the tqdm bar. A tiny regression model on random data made here; nothing is downloaded.
Importing Lightning takes a few seconds.

Environment: ``CORPUS_EPOCHS`` (default 8), ``CORPUS_STEPS`` (batches per epoch on each rank,
default 16); ``CORPUS_HANG_RANK/STEP`` and ``CORPUS_RAISE_RANK/STEP`` (``_hooks.py``) act
inside ``training_step`` at that global step. Logs and checkpoints go to a temp directory.
"""

import os
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from _hooks import env_int, misbehave
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = env_int("CORPUS_EPOCHS", 8)
STEPS = env_int("CORPUS_STEPS", 16)
BATCH = 8


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        misbehave(self.global_step)
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def main() -> None:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // local_world
    gen = torch.Generator().manual_seed(0)
    n = STEPS * BATCH * local_world * nodes
    x = torch.randn(n, 16, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=local_world,
        num_nodes=nodes,
        max_epochs=EPOCHS,
        default_root_dir=os.path.join(tempfile.gettempdir(), f"corpus-lightning-{run_id}"),
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=BATCH))


if __name__ == "__main__":
    main()
