"""A torchtitan style Llama 3 pretraining loop: 2-D parallel (FSDP2 x tensor parallel) on CPU.

torchtitan itself does not run here (``tests/corpus/README.md`` says why: its ``Trainer`` picks
the device ``"cuda"`` on a CPU build and calls ``torch.cuda.set_device``; it also needs
``spmd_types``, ``torchdata``, ``tyro``...). This program is the same job written the way
torchtitan writes it (``torchtitan/models/llama3``, ``parallelize.py``, ``train.py``), so its
collectives are the ones a torchtitan job issues:

* ``init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))``: the world mesh, its
  ``dp`` and ``tp`` submeshes (each a process group of its own);
* the llama3 "debugmodel" shape, smaller: ``RMSNorm``, rotary attention (``wq``/``wk``/``wv``
  /``wo``, grouped KV heads), the SwiGLU ``FeedForward`` (``w1``/``w2``/``w3``);
* ``apply_tp``: ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel``,
  ``SequenceParallel`` norms and ``PrepareModuleInput``, as torchtitan's plan has them;
* ``apply_fsdp``: ``fully_shard`` of each block then the model, on the ``dp`` mesh;
* the train step: forward, cross-entropy, backward, ``clip_grad_norm_`` (a DTensor norm: its
  all-reduces), ``optimizer.step``, the loss averaged over ``dp`` on log steps, and
  torchtitan's log line from every rank (``run_train.sh`` filters ranks; ``torchrun
  --local-ranks-filter 0`` does): ``[titan] ... - root - INFO - step:  1  loss: 10.8  ...``.

The model is built on CPU from one seed on every rank (torchtitan builds it on the meta device
and initializes the shards; at this size the same result, with no DTensor RNG to set up).
Run it as ``torchrun --standalone --nproc-per-node 4 tests/corpus/torchtitan_style.py`` (dp=2,
tp=2; 2 ranks make dp=1). ``CORPUS_STEPS`` sets ``--training.steps`` (default 30);
``misbehave(step)`` (``_hooks.py``) runs at the top of every step.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _hooks import env_int, misbehave
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

logger = logging.getLogger()


def init_logger() -> None:
    """torchtitan's ``init_logger``: ``[titan] <time> - root - INFO - <message>``."""
    logger.setLevel(logging.INFO)
    ch = logging.StreamHandler()
    ch.setLevel(logging.INFO)
    ch.setFormatter(
        logging.Formatter("[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s")
    )
    logger.addHandler(ch)


# --------------------------------------------------------------------------------------------
# torchtitan/models/llama3/model.py (the debugmodel's shape)
# --------------------------------------------------------------------------------------------


@dataclass
class TransformerModelArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = 2
    vocab_size: int = 256
    multiple_of: int = 32
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000
    max_seq_len: int = 32


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ndim = x.ndim
    seqlen = x.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        torch.unsqueeze(x, dim=3)
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, model_args: TransformerModelArgs):
        super().__init__()
        self.n_heads = model_args.n_heads
        self.n_kv_heads = model_args.n_kv_heads or model_args.n_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = model_args.dim // model_args.n_heads
        self.wq = nn.Linear(model_args.dim, model_args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(model_args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(model_args.n_heads * self.head_dim, model_args.dim, bias=False)

    def init_weights(self, init_std: float):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor):
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1 for the heads: under tensor parallel each rank holds n_heads / tp of them.
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)
        xq, xk, xv = (t.transpose(1, 2) for t in (xq, keys, values))
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        output = output.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, model_args: TransformerModelArgs):
        super().__init__()
        self.attention = Attention(model_args)
        self.feed_forward = FeedForward(
            dim=model_args.dim,
            hidden_dim=4 * model_args.dim,
            multiple_of=model_args.multiple_of,
            ffn_dim_multiplier=model_args.ffn_dim_multiplier,
        )
        self.attention_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.ffn_norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self):
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class Transformer(nn.Module):
    def __init__(self, model_args: TransformerModelArgs):
        super().__init__()
        self.model_args = model_args
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        self.layers = torch.nn.ModuleDict()
        for layer_id in range(model_args.n_layers):
            self.layers[str(layer_id)] = TransformerBlock(layer_id, model_args)
        self.norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size, bias=False)
        self.init_weights()

    def _precompute_freqs_cis(self) -> torch.Tensor:
        return precompute_freqs_cis(
            self.model_args.dim // self.model_args.n_heads,
            self.model_args.max_seq_len * 2,
            self.model_args.rope_theta,
        )

    def init_weights(self):
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        final_out_std = self.model_args.dim**-0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=final_out_std)

    def forward(self, tokens: torch.Tensor):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h)
        return self.output(h)


# --------------------------------------------------------------------------------------------
# torchtitan/models/llama3/parallelize.py
# --------------------------------------------------------------------------------------------


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Tensor parallel with sequence parallel norms, torchtitan's plan (no loss parallel)."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
            ),
        },
    )
    for transformer_block in model.layers.values():
        layer_plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        parallelize_module(transformer_block, tp_mesh, layer_plan)
    logger.info("Applied Sequence Parallel to the model")


def apply_fsdp(model: nn.Module, dp_mesh, reshard_after_forward: bool = True) -> None:
    """FSDP2: each block, then the root, sharded on the dp mesh."""
    for transformer_block in model.layers.values():
        fully_shard(transformer_block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    logger.info("Applied FSDP to the model")


# --------------------------------------------------------------------------------------------
# torchtitan/train.py
# --------------------------------------------------------------------------------------------


def dist_mean(x: torch.Tensor, mesh) -> float:
    """The loss averaged over the data-parallel ranks (torchtitan's ``dist_utils.dist_mean``)."""
    t = x.detach().clone()
    dist.all_reduce(t, group=mesh.get_group())
    return (t / mesh.size()).item()


def build_batch(step: int, dp_rank: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens (no tokenizer, no download): the same on the ranks of one dp shard."""
    g = torch.Generator().manual_seed(args.seed * 1000 + step * 16 + dp_rank)
    tokens = torch.randint(
        0, args.vocab_size, (args.local_batch_size, args.seq_len + 1), generator=g
    )
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def parse_args():
    parser = argparse.ArgumentParser(description="torchtitan style llama3 training (CPU, gloo)")
    parser.add_argument("--parallelism.tensor_parallel_degree", dest="tp", type=int, default=2)
    parser.add_argument(
        "--training.steps", dest="steps", type=int, default=env_int("CORPUS_STEPS", 30)
    )
    parser.add_argument("--training.local_batch_size", dest="local_batch_size", type=int, default=4)
    parser.add_argument("--training.seq_len", dest="seq_len", type=int, default=32)
    parser.add_argument("--training.max_norm", dest="max_norm", type=float, default=1.0)
    parser.add_argument("--optimizer.lr", dest="lr", type=float, default=8e-4)
    parser.add_argument("--metrics.log_freq", dest="log_freq", type=int, default=1)
    parser.add_argument("--debug.seed", dest="seed", type=int, default=42)
    parser.add_argument("--model.vocab_size", dest="vocab_size", type=int, default=256)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    init_logger()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world_size = dist.get_world_size()
    tp = args.tp if world_size % args.tp == 0 else 1
    dp = world_size // tp
    world_mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    logger.info(f"Building 2-D device mesh with ['dp', 'tp'], [{dp}, {tp}]")
    dp_mesh, tp_mesh = world_mesh["dp"], world_mesh["tp"]
    dp_rank = dp_mesh.get_local_rank()

    torch.manual_seed(args.seed)
    model_args = TransformerModelArgs(vocab_size=args.vocab_size, max_seq_len=args.seq_len)
    logger.info(f"Building llama3 debugmodel with {model_args}")
    model = Transformer(model_args)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(f"Model llama3 debugmodel size: {n_params:,} total parameters")
    if tp > 1:
        apply_tp(model, tp_mesh)
    apply_fsdp(model, dp_mesh)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, foreach=True
    )
    logger.info(f"Training starts at step 1, with local batch size {args.local_batch_size}")

    step = 0
    ntokens_since_last_log = 0
    time_last_log = time.perf_counter()
    while step < args.steps:
        step += 1
        misbehave(step - 1)
        inputs, labels = build_batch(step, dp_rank, args)
        ntokens_since_last_log += labels.numel()
        optimizer.zero_grad()
        pred = model(inputs)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        del pred
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm, foreach=True)
        optimizer.step()
        if step == 1 or step % args.log_freq == 0:
            global_avg_loss = dist_mean(loss, dp_mesh)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            time_delta = time.perf_counter() - time_last_log
            tps = ntokens_since_last_log / (time_delta * world_size)
            max_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
            logger.info(
                f"step: {step:2}  loss: {global_avg_loss:7.4f}  "
                f"grad_norm: {grad_norm.item():7.4f}  "
                f"memory: {max_rss_gib:5.2f}GiB({0:.2f}%)  tps: {round(tps):,}  "
                f"tflops: {0:,.2f}  mfu: {0:.2f}%"
            )
            ntokens_since_last_log = 0
            time_last_log = time.perf_counter()
    logger.info("Training completed")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
