"""A Hugging Face ``Trainer`` job: a tiny causal LM built from a config, under torchrun's env.

A one-layer ``GPT2Config`` with a 64-token vocabulary, random token sequences made here, and
``Trainer`` as people use it: it sees torchrun's variables and wraps the model in DDP itself
(gloo, CPU). ``logging_steps=1`` so each step prints the Trainer's ``{'loss': ...}`` dict next
to its tqdm bar. Nothing is downloaded (no tokenizer, no hub). Importing transformers takes a
few seconds.

Environment: ``CORPUS_STEPS`` (``max_steps``, default 60); ``CORPUS_HANG_RANK/STEP`` and
``CORPUS_RAISE_RANK/STEP`` (``_hooks.py``) act inside ``training_step`` at that global step.
Output goes to a temp directory.
"""

import os
import tempfile

import torch
from _hooks import env_int, misbehave
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

STEPS = env_int("CORPUS_STEPS", 60)
SEQ = 32


class RandomTokens(Dataset):
    """Random token sequences; the labels are the inputs (the model shifts them)."""

    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(64, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class CorpusTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        misbehave(self.state.global_step)
        return super().training_step(model, inputs, num_items_in_batch)


def main() -> None:
    config = GPT2Config(
        vocab_size=64,
        n_positions=SEQ,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), f"corpus-hf-{run_id}"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
    )
    trainer = CorpusTrainer(model=model, args=args, train_dataset=RandomTokens(1024))
    trainer.train()


if __name__ == "__main__":
    main()
