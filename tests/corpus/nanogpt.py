"""A nanoGPT-style raw training loop under DDP: a tiny GPT, synthetic tokens, nanoGPT's prints.

Like nanoGPT's ``train.py``: DDP when ``RANK`` is set, the master process prints
``iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%`` every
``log_interval`` iterations and ``step {iter_num}: train loss ..., val loss ...`` at each
``eval_interval``. The model is one transformer block with a 64-token vocabulary; the data is
random tokens made here. CPU and gloo only; nothing is downloaded.

Arguments as nanoGPT's ``configurator.py`` takes them, on every rank: a config file
(``Overriding config with FILE:`` and the file printed) or ``--key=value``
(``Overriding: max_iters = 60``). Environment: ``CORPUS_STEPS`` (``max_iters``, default 100,
unless an argument overrides it); ``CORPUS_HANG_RANK/STEP`` and ``CORPUS_RAISE_RANK/STEP``
(``_hooks.py``) act inside the loop body, before the forward pass.
"""

import os
import sys
import time
from ast import literal_eval

import torch
import torch.nn.functional as F
from _hooks import env_int, misbehave
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

vocab_size = 64
block_size = 32
n_embd = 32
n_head = 2
batch_size = 8
learning_rate = 1e-3
max_iters = env_int("CORPUS_STEPS", 100)
log_interval = 1
eval_interval = 50
eval_iters = 2

# nanoGPT's configurator.py, as it is (exec'd by its train.py on every rank)
for arg in sys.argv[1:]:
    if "=" not in arg:
        # assume it's the name of a config file
        assert not arg.startswith("--")
        config_file = arg
        print(f"Overriding config with {config_file}:")
        with open(config_file) as f:
            config = f.read()
        print(config)
        exec(config)
    else:
        # assume it's a --key=value argument
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        if key in globals():
            try:
                # attempt to eval it it (e.g. if bool, number, or etc)
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                # if that goes wrong, just use it as a string
                attempt = val
            # ensure the types match ok
            assert type(attempt) is type(globals()[key])
            # cross fingers
            print(f"Overriding: {key} = {attempt}")
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0
torch.manual_seed(1337 + seed_offset)

data = torch.randint(vocab_size, (20000,), generator=torch.Generator().manual_seed(0))


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


torch.manual_seed(0)
model: nn.Module = GPT()
torch.manual_seed(1337 + seed_offset)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        x, y = get_batch()
        losses[k] = model(x, y)[1].item()
    model.train()
    return losses.mean()


X, Y = get_batch()
t0 = time.time()
iter_num = 0
running_mfu = -1.0
while True:
    if iter_num % eval_interval == 0 and master_process:
        val = estimate_loss()
        print(f"step {iter_num}: train loss {val:.4f}, val loss {val:.4f}")
    misbehave(iter_num)
    logits, loss = model(X, Y)
    X, Y = get_batch()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        lossf = loss.item()
        mfu = running_mfu * 100
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {mfu:.2f}%")
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
