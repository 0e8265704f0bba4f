"""A Megatron-LM style GPT pretraining script: tensor and pipeline parallel, on CPU with gloo.

megatron-core itself does not run here (``tests/corpus/README.md`` says why: 0.19.2 needs
Python 3.12; 0.16.1's ``parallel_state`` and ``ColumnParallelLinear``/``RowParallelLinear`` run
on gloo, but its pipeline send/recv allocates with ``torch.cuda.current_device()``). This
program writes out the parts of ``megatron.core`` a ``pretrain_gpt.py`` job runs, in its own
structure and names, so that its collectives are the ones a Megatron job issues:

* ``parallel_state.initialize_model_parallel``: the rank generator (order ``tp-cp-ep-dp-pp``)
  and the groups made with ``new_group`` in Megatron's order, each named by its
  ``group_desc`` (``DATA_PARALLEL_GROUP``, ``MODEL_PARALLEL_GROUP``,
  ``TENSOR_MODEL_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``, ``EMBEDDING_GROUP``...);
* ``tensor_parallel``: the mappings (copy/reduce to and from the model-parallel region, as
  autograd functions), ``broadcast_data``, ``VocabParallelEmbedding``,
  ``ColumnParallelLinear``, ``RowParallelLinear``, ``vocab_parallel_cross_entropy``;
* ``pipeline_parallel``: ``p2p_communication._communicate`` (``P2POp`` and
  ``batch_isend_irecv`` in the pipeline group) and the 1F1B schedule
  (``forward_backward_pipelining_without_interleaving``);
* ``finalize_model_grads`` (the data-parallel gradient all-reduce, the tied word embeddings'
  all-reduce in the embedding group), the gradient norm over the model-parallel group, and
  ``training_log``'s line, printed by the last rank (``print_rank_last``):
  `` iteration       10/      50 | consumed samples: ... | lm loss: 7.123456E+00 | ...``.

Run it as ``torchrun --standalone --nproc-per-node 4 tests/corpus/megatron_style.py`` (TP=2,
PP=2, DP=1; 8 ranks make DP=2). ``CORPUS_STEPS`` sets ``--train-iters`` (default 50);
``misbehave(step)`` (``_hooks.py``) runs at the top of every iteration.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from datetime import datetime

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _hooks import env_int, misbehave
from torch import nn

# --------------------------------------------------------------------------------------------
# megatron/core/parallel_state.py
# --------------------------------------------------------------------------------------------

_TENSOR_MODEL_PARALLEL_GROUP = None
_PIPELINE_MODEL_PARALLEL_GROUP = None
_MODEL_PARALLEL_GROUP = None
_EMBEDDING_GROUP = None
_DATA_PARALLEL_GROUP = None
_DATA_PARALLEL_GROUP_WITH_CP = None
_CONTEXT_PARALLEL_GROUP = None
_PIPELINE_GLOBAL_RANKS: list[int] = []
_EMBEDDING_GLOBAL_RANKS: list[int] = []
_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS: list[int] = []


def generate_masked_orthogonal_rank_groups(world_size, parallel_size, mask):
    """Megatron's: the groups of the masked parallelisms, orthogonal to the others."""

    def prefix_product(a, init=1):
        r = [init]
        for v in a:
            init = init * v
            r.append(init)
        return r

    def inner_product(a, b):
        return sum(x * y for x, y in zip(a, b, strict=False))

    def decompose(index, shape, stride=None):
        if stride is None:
            stride = prefix_product(shape)
        return [(index // d) % s for s, d in zip(shape, stride, strict=False)]

    masked_shape = [s for s, m in zip(parallel_size, mask, strict=True) if m]
    unmasked_shape = [s for s, m in zip(parallel_size, mask, strict=True) if not m]
    global_stride = prefix_product(parallel_size)
    masked_stride = [d for d, m in zip(global_stride, mask, strict=False) if m]
    unmasked_stride = [d for d, m in zip(global_stride, mask, strict=False) if not m]
    group_size = prefix_product(masked_shape)[-1]
    ranks = []
    for group_index in range(world_size // group_size):
        decomposed_group_idx = decompose(group_index, unmasked_shape)
        rank = []
        for rank_in_group in range(group_size):
            decomposed_rank_idx = decompose(rank_in_group, masked_shape)
            rank.append(
                inner_product(decomposed_rank_idx, masked_stride)
                + inner_product(decomposed_group_idx, unmasked_stride)
            )
        ranks.append(rank)
    return ranks


class RankGenerator:
    """Megatron's ``RankGenerator``: ranks of the ``tp-cp-ep-dp-pp`` grid by token."""

    def __init__(self, tp, ep, dp, pp, cp, order="tp-cp-ep-dp-pp"):
        self.world_size = tp * dp * pp * cp
        self.name_to_size = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        self.order = order

    def get_mask(self, order, token):
        ordered_token = order.split("-")
        token = token.split("-")
        return [t in token for t in ordered_token]

    def get_ranks(self, token):
        order = self.order.replace("-ep", "")  # ep is orthogonal to dp in the decoder grid
        parallel_size = [self.name_to_size[t] for t in order.split("-")]
        return generate_masked_orthogonal_rank_groups(
            self.world_size, parallel_size, self.get_mask(order, token)
        )


def create_group(ranks=None, timeout=None, backend=None, group_desc=None):
    """Creates a ProcessGroup (every rank calls it for every group, as ``new_group`` asks)."""
    return dist.new_group(ranks=ranks, timeout=timeout, backend=backend, group_desc=group_desc)


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1
) -> None:
    """Build the data-, context-, model-, tensor- and pipeline-parallel groups."""
    global _TENSOR_MODEL_PARALLEL_GROUP, _PIPELINE_MODEL_PARALLEL_GROUP, _MODEL_PARALLEL_GROUP
    global _EMBEDDING_GROUP, _DATA_PARALLEL_GROUP, _DATA_PARALLEL_GROUP_WITH_CP
    global _CONTEXT_PARALLEL_GROUP, _PIPELINE_GLOBAL_RANKS, _EMBEDDING_GLOBAL_RANKS
    global _TENSOR_MODEL_PARALLEL_GLOBAL_RANKS
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    model_size = tensor_model_parallel_size * pipeline_model_parallel_size
    if world_size % model_size != 0:
        raise RuntimeError(f"world_size ({world_size}) is not divisible by {model_size}")
    data_parallel_size = world_size // model_size
    gen = RankGenerator(
        tp=tensor_model_parallel_size,
        ep=1,
        dp=data_parallel_size,
        pp=pipeline_model_parallel_size,
        cp=1,
    )
    for ranks_with_cp in gen.get_ranks("dp-cp"):
        group = create_group(ranks_with_cp, group_desc="DATA_PARALLEL_GROUP_WITH_CP")
        if rank in ranks_with_cp:
            _DATA_PARALLEL_GROUP_WITH_CP = group
    for ranks in gen.get_ranks("dp"):
        group = create_group(ranks, group_desc="DATA_PARALLEL_GROUP")
        if rank in ranks:
            _DATA_PARALLEL_GROUP = group
    for ranks in gen.get_ranks("cp"):
        group = create_group(ranks, group_desc="CONTEXT_PARALLEL_GROUP")
        if rank in ranks:
            _CONTEXT_PARALLEL_GROUP = group
    for ranks in gen.get_ranks("tp-pp"):
        group = create_group(ranks, group_desc="MODEL_PARALLEL_GROUP")
        if rank in ranks:
            _MODEL_PARALLEL_GROUP = group
    for ranks in gen.get_ranks("tp"):
        group = create_group(ranks, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        if rank in ranks:
            _TENSOR_MODEL_PARALLEL_GROUP = group
            _TENSOR_MODEL_PARALLEL_GLOBAL_RANKS = ranks
    for ranks in gen.get_ranks("pp"):
        group = create_group(ranks, group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
        if rank in ranks:
            _PIPELINE_MODEL_PARALLEL_GROUP = group
            _PIPELINE_GLOBAL_RANKS = ranks
        # The first and last stages hold the word embeddings (tied with the output layer).
        embedding_ranks = [ranks[0], ranks[-1]] if len(ranks) > 1 else ranks
        group = create_group(embedding_ranks, group_desc="EMBEDDING_GROUP")
        if rank in embedding_ranks:
            _EMBEDDING_GROUP = group
            _EMBEDDING_GLOBAL_RANKS = embedding_ranks
    for ranks in gen.get_ranks("tp-dp"):
        create_group(ranks, group_desc="TENSOR_AND_DATA_PARALLEL_GROUP")


def get_tensor_model_parallel_group():
    return _TENSOR_MODEL_PARALLEL_GROUP


def get_pipeline_model_parallel_group():
    return _PIPELINE_MODEL_PARALLEL_GROUP


def get_tensor_model_parallel_world_size():
    return dist.get_world_size(group=_TENSOR_MODEL_PARALLEL_GROUP)


def get_tensor_model_parallel_rank():
    return dist.get_rank(group=_TENSOR_MODEL_PARALLEL_GROUP)


def get_pipeline_model_parallel_world_size():
    return dist.get_world_size(group=_PIPELINE_MODEL_PARALLEL_GROUP)


def get_pipeline_model_parallel_rank():
    return dist.get_rank(group=_PIPELINE_MODEL_PARALLEL_GROUP)


def get_data_parallel_world_size():
    return dist.get_world_size(group=_DATA_PARALLEL_GROUP)


def get_data_parallel_rank():
    return dist.get_rank(group=_DATA_PARALLEL_GROUP)


def is_pipeline_first_stage():
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage():
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def get_pipeline_model_parallel_next_rank():
    rank_in_pipeline = get_pipeline_model_parallel_rank()
    world_size = get_pipeline_model_parallel_world_size()
    return _PIPELINE_GLOBAL_RANKS[(rank_in_pipeline + 1) % world_size]


def get_pipeline_model_parallel_prev_rank():
    rank_in_pipeline = get_pipeline_model_parallel_rank()
    world_size = get_pipeline_model_parallel_world_size()
    return _PIPELINE_GLOBAL_RANKS[(rank_in_pipeline - 1) % world_size]


def get_tensor_model_parallel_src_rank():
    return _TENSOR_MODEL_PARALLEL_GLOBAL_RANKS[0]


# --------------------------------------------------------------------------------------------
# megatron/core/tensor_parallel/mappings.py, data.py, layers.py, cross_entropy.py
# --------------------------------------------------------------------------------------------


def _reduce(input_):
    """All-reduce the input tensor across the model-parallel group."""
    if get_tensor_model_parallel_world_size() == 1:
        return input_
    dist.all_reduce(input_.contiguous(), group=get_tensor_model_parallel_group())
    return input_


class _CopyToModelParallelRegion(torch.autograd.Function):
    """Pass the input to the model-parallel region (backward: all-reduce the gradient)."""

    @staticmethod
    def forward(ctx, input_):
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        return _reduce(grad_output)


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """All-reduce the input from the model-parallel region."""

    @staticmethod
    def forward(ctx, input_):
        return _reduce(input_.clone())

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def copy_to_tensor_model_parallel_region(input_):
    return _CopyToModelParallelRegion.apply(input_)


def reduce_from_tensor_model_parallel_region(input_):
    return _ReduceFromModelParallelRegion.apply(input_)


def broadcast_data(keys, data, datatype):
    """Broadcast data from rank zero of each model-parallel group to its members."""
    if get_tensor_model_parallel_rank() == 0:
        flatten_data = torch.cat([data[key].contiguous().view(-1) for key in keys]).to(datatype)
    else:
        flatten_data = torch.empty(sum(data_size(keys)), dtype=datatype)
    dist.broadcast(
        flatten_data, get_tensor_model_parallel_src_rank(), group=get_tensor_model_parallel_group()
    )
    output = {}
    offset = 0
    for key, shape in zip(keys, _SHAPES, strict=True):
        numel = math.prod(shape)
        output[key] = flatten_data.narrow(0, offset, numel).view(shape)
        offset += numel
    return output


_SHAPES: list[tuple[int, ...]] = []


def data_size(keys):
    return [math.prod(shape) for shape in _SHAPES[: len(keys)]]


def _initialize_affine_weight_cpu(weight, output_size, input_size, per_partition_size, dim, init):
    """Initialize the master weight on every rank, keep this rank's slice (CPU init)."""
    master_weight = torch.empty(output_size, input_size, dtype=torch.float32)
    init(master_weight)
    weight_list = torch.split(master_weight, per_partition_size, dim=dim)
    with torch.no_grad():
        weight.copy_(weight_list[get_tensor_model_parallel_rank()])


def init_method_normal(sigma):
    def init_(tensor):
        return nn.init.normal_(tensor, mean=0.0, std=sigma)

    return init_


class VocabParallelEmbedding(nn.Module):
    """Embedding parallelized in the vocabulary dimension."""

    def __init__(self, num_embeddings, embedding_dim, init_method):
        super().__init__()
        world_size = get_tensor_model_parallel_world_size()
        per_partition = num_embeddings // world_size
        self.vocab_start_index = get_tensor_model_parallel_rank() * per_partition
        self.vocab_end_index = self.vocab_start_index + per_partition
        self.weight = nn.Parameter(torch.empty(per_partition, embedding_dim))
        _initialize_affine_weight_cpu(
            self.weight, num_embeddings, embedding_dim, per_partition, 0, init_method
        )

    def forward(self, input_):
        input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        masked_input = input_.clone() - self.vocab_start_index
        masked_input[input_mask] = 0
        output_parallel = F.embedding(masked_input, self.weight)
        output_parallel[input_mask, :] = 0.0
        return reduce_from_tensor_model_parallel_region(output_parallel)


class ColumnParallelLinear(nn.Module):
    """Y = XA + b with A split by columns: each rank computes its slice of Y."""

    def __init__(self, input_size, output_size, init_method, bias=True, gather_output=False):
        super().__init__()
        self.output_size_per_partition = output_size // get_tensor_model_parallel_world_size()
        self.weight = nn.Parameter(torch.empty(self.output_size_per_partition, input_size))
        _initialize_affine_weight_cpu(
            self.weight, output_size, input_size, self.output_size_per_partition, 0, init_method
        )
        self.bias = nn.Parameter(torch.zeros(self.output_size_per_partition)) if bias else None
        assert not gather_output

    def forward(self, input_, weight=None):
        weight = self.weight if weight is None else weight
        input_parallel = copy_to_tensor_model_parallel_region(input_)
        return F.linear(input_parallel, weight, self.bias), None


class RowParallelLinear(nn.Module):
    """Y = XA + b with A split by rows: each rank's partial product is all-reduced."""

    def __init__(self, input_size, output_size, init_method, bias=True, input_is_parallel=True):
        super().__init__()
        self.input_size_per_partition = input_size // get_tensor_model_parallel_world_size()
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_partition))
        _initialize_affine_weight_cpu(
            self.weight, output_size, input_size, self.input_size_per_partition, 1, init_method
        )
        self.bias = nn.Parameter(torch.zeros(output_size)) if bias else None
        assert input_is_parallel

    def forward(self, input_):
        output_parallel = F.linear(input_, self.weight)
        output_ = reduce_from_tensor_model_parallel_region(output_parallel)
        return (output_ + self.bias if self.bias is not None else output_), None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        group = get_tensor_model_parallel_group()
        logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        vocab_parallel_logits = vocab_parallel_logits - logits_max.unsqueeze(dim=-1)
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        vocab_start_index = get_tensor_model_parallel_rank() * partition_vocab_size
        vocab_end_index = vocab_start_index + partition_vocab_size
        target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
        masked_target = target.clone() - vocab_start_index
        masked_target[target_mask] = 0
        logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size()[0])
        predicted_logits = logits_2d[arange_1d, masked_target_1d].clone().contiguous()
        predicted_logits = predicted_logits.view_as(target)
        predicted_logits[target_mask] = 0.0
        dist.all_reduce(predicted_logits, op=dist.ReduceOp.SUM, group=group)
        exp_logits = torch.exp(vocab_parallel_logits)
        sum_exp_logits = exp_logits.sum(dim=-1)
        dist.all_reduce(sum_exp_logits, op=dist.ReduceOp.SUM, group=group)
        loss = torch.log(sum_exp_logits) - predicted_logits
        exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = softmax
        partition_vocab_size = softmax.size()[-1]
        grad_2d = grad_input.view(-1, partition_vocab_size)
        arange_1d = torch.arange(start=0, end=grad_2d.size()[0])
        softmax_update = 1.0 - target_mask.view(-1).float()
        grad_2d[arange_1d, masked_target_1d] -= softmax_update
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None


def vocab_parallel_cross_entropy(vocab_parallel_logits, target):
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target)


# --------------------------------------------------------------------------------------------
# megatron/core/transformer: a GPT layer (attention and MLP, tensor parallel), GPTModel
# --------------------------------------------------------------------------------------------


class ParallelAttention(nn.Module):
    def __init__(self, args, init_method, output_layer_init_method):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.num_attention_heads_per_partition = args.num_attention_heads // tp
        self.hidden_size_per_attention_head = args.hidden_size // args.num_attention_heads
        self.query_key_value = ColumnParallelLinear(
            args.hidden_size, 3 * args.hidden_size, init_method
        )
        self.dense = RowParallelLinear(args.hidden_size, args.hidden_size, output_layer_init_method)

    def forward(self, hidden_states):
        # [s, b, h] as Megatron keeps activations
        mixed_x_layer, _ = self.query_key_value(hidden_states)
        s, b, _ = mixed_x_layer.size()
        new_shape = (
            s,
            b,
            self.num_attention_heads_per_partition,
            3 * self.hidden_size_per_attention_head,
        )
        mixed_x_layer = mixed_x_layer.view(*new_shape)
        query, key, value = torch.split(mixed_x_layer, self.hidden_size_per_attention_head, dim=3)
        query, key, value = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        context = context.permute(2, 0, 1, 3).contiguous().view(s, b, -1)
        output, _ = self.dense(context)
        return output


class ParallelMLP(nn.Module):
    def __init__(self, args, init_method, output_layer_init_method):
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(
            args.hidden_size, args.ffn_hidden_size, init_method
        )
        self.dense_4h_to_h = RowParallelLinear(
            args.ffn_hidden_size, args.hidden_size, output_layer_init_method
        )

    def forward(self, hidden_states):
        intermediate_parallel, _ = self.dense_h_to_4h(hidden_states)
        output, _ = self.dense_4h_to_h(F.gelu(intermediate_parallel))
        return output


class ParallelTransformerLayer(nn.Module):
    def __init__(self, args, init_method, output_layer_init_method):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(args.hidden_size)
        self.self_attention = ParallelAttention(args, init_method, output_layer_init_method)
        self.post_attention_layernorm = nn.LayerNorm(args.hidden_size)
        self.mlp = ParallelMLP(args, init_method, output_layer_init_method)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.self_attention(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class GPTModel(nn.Module):
    """This stage's part of the GPT: embeddings on the first, the head and loss on the last."""

    def __init__(self, args, pre_process=True, post_process=True):
        super().__init__()
        self.pre_process = pre_process
        self.post_process = post_process
        init_method = init_method_normal(args.init_method_std)
        output_layer_init_method = init_method_normal(
            args.init_method_std / math.sqrt(2.0 * args.num_layers)
        )
        if pre_process:
            self.word_embeddings = VocabParallelEmbedding(
                args.padded_vocab_size, args.hidden_size, init_method
            )
            self.position_embeddings = nn.Embedding(args.seq_length, args.hidden_size)
            init_method(self.position_embeddings.weight)
        layers = args.num_layers // get_pipeline_model_parallel_world_size()
        self.layers = nn.ModuleList(
            ParallelTransformerLayer(args, init_method, output_layer_init_method)
            for _ in range(layers)
        )
        if post_process:
            self.final_layernorm = nn.LayerNorm(args.hidden_size)
            if not pre_process:
                # The last stage's copy of the word embeddings, tied to the first stage's:
                # zeroed here, made equal by an all-reduce in the embedding group.
                self.word_embeddings = VocabParallelEmbedding(
                    args.padded_vocab_size, args.hidden_size, init_method
                )
                self.word_embeddings.weight.data.fill_(0)
                self.word_embeddings.weight.shared_embedding = True
            self.output_layer = ColumnParallelLinear(
                args.hidden_size, args.padded_vocab_size, init_method, bias=False
            )
        self.input_tensor = None

    def set_input_tensor(self, input_tensor):
        self.input_tensor = input_tensor

    def forward(self, tokens, position_ids, labels):
        if self.pre_process:
            words = self.word_embeddings(tokens)
            hidden_states = (
                (words + self.position_embeddings(position_ids)).transpose(0, 1).contiguous()
            )
        else:
            hidden_states = self.input_tensor
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        if not self.post_process:
            return hidden_states
        hidden_states = self.final_layernorm(hidden_states)
        logits, _ = self.output_layer(hidden_states, weight=self.word_embeddings.weight)
        return vocab_parallel_cross_entropy(logits.transpose(0, 1).contiguous(), labels)


def initialize_word_embeddings(model):
    """Make the last stage's word embeddings equal to the first stage's."""
    if get_pipeline_model_parallel_world_size() > 1 and (
        is_pipeline_first_stage() or is_pipeline_last_stage()
    ):
        dist.all_reduce(model.word_embeddings.weight.data, group=_EMBEDDING_GROUP)


# --------------------------------------------------------------------------------------------
# megatron/core/pipeline_parallel/p2p_communication.py and schedules.py
# --------------------------------------------------------------------------------------------


def _batched_p2p_ops(
    *, tensor_send_prev, tensor_recv_prev, tensor_send_next, tensor_recv_next, group
):
    ops = []
    if tensor_send_prev is not None:
        ops.append(
            dist.P2POp(dist.isend, tensor_send_prev, get_pipeline_model_parallel_prev_rank(), group)
        )
    if tensor_recv_prev is not None:
        ops.append(
            dist.P2POp(dist.irecv, tensor_recv_prev, get_pipeline_model_parallel_prev_rank(), group)
        )
    if tensor_send_next is not None:
        ops.append(
            dist.P2POp(dist.isend, tensor_send_next, get_pipeline_model_parallel_next_rank(), group)
        )
    if tensor_recv_next is not None:
        ops.append(
            dist.P2POp(dist.irecv, tensor_recv_next, get_pipeline_model_parallel_next_rank(), group)
        )
    return dist.batch_isend_irecv(ops) if ops else []


def _communicate(*, tensor_send_next, tensor_send_prev, recv_prev, recv_next, tensor_shape, config):
    """Send and receive activations or gradients between neighbouring pipeline stages."""
    tensor_recv_prev = None
    tensor_recv_next = None
    if recv_prev:
        tensor_recv_prev = torch.empty(
            tensor_shape, requires_grad=True, dtype=config.pipeline_dtype
        )
    if recv_next:
        tensor_recv_next = torch.empty(
            tensor_shape, requires_grad=True, dtype=config.pipeline_dtype
        )
    reqs = _batched_p2p_ops(
        tensor_send_prev=tensor_send_prev,
        tensor_recv_prev=tensor_recv_prev,
        tensor_send_next=tensor_send_next,
        tensor_recv_next=tensor_recv_next,
        group=get_pipeline_model_parallel_group(),
    )
    for req in reqs:
        req.wait()
    return tensor_recv_prev, tensor_recv_next


def recv_forward(tensor_shape, config):
    if is_pipeline_first_stage():
        return None
    input_tensor, _ = _communicate(
        tensor_send_next=None, tensor_send_prev=None, recv_prev=True, recv_next=False,
        tensor_shape=tensor_shape, config=config,
    )  # fmt: skip
    return input_tensor


def recv_backward(tensor_shape, config):
    if is_pipeline_last_stage():
        return None
    _, output_tensor_grad = _communicate(
        tensor_send_next=None, tensor_send_prev=None, recv_prev=False, recv_next=True,
        tensor_shape=tensor_shape, config=config,
    )  # fmt: skip
    return output_tensor_grad


def send_forward(output_tensor, config):
    if not is_pipeline_last_stage():
        _communicate(
            tensor_send_next=output_tensor, tensor_send_prev=None, recv_prev=False,
            recv_next=False, tensor_shape=None, config=config,
        )  # fmt: skip


def send_backward(input_tensor_grad, config):
    if not is_pipeline_first_stage():
        _communicate(
            tensor_send_next=None, tensor_send_prev=input_tensor_grad, recv_prev=False,
            recv_next=False, tensor_shape=None, config=config,
        )  # fmt: skip


def send_forward_recv_backward(output_tensor, tensor_shape, config):
    if is_pipeline_last_stage():
        return None
    _, output_tensor_grad = _communicate(
        tensor_send_next=output_tensor, tensor_send_prev=None, recv_prev=False, recv_next=True,
        tensor_shape=tensor_shape, config=config,
    )  # fmt: skip
    return output_tensor_grad


def send_backward_recv_forward(input_tensor_grad, tensor_shape, config):
    if is_pipeline_first_stage():
        return None
    input_tensor, _ = _communicate(
        tensor_send_next=None, tensor_send_prev=input_tensor_grad, recv_prev=True,
        recv_next=False, tensor_shape=tensor_shape, config=config,
    )  # fmt: skip
    return input_tensor


def forward_step_func(data_iterator, model, num_microbatches):
    """pretrain_gpt.py's forward_step: a batch, the model, the loss function."""
    tokens, labels, position_ids = get_batch(data_iterator)
    output_tensor = model(tokens, position_ids, labels)
    if is_pipeline_last_stage():
        loss = output_tensor.float().mean()
        return loss / num_microbatches, {"lm loss": loss.detach()}
    return output_tensor, None


def forward_backward_pipelining_without_interleaving(
    *,
    forward_step_func,
    data_iterator,
    model,
    num_microbatches,
    seq_length,
    micro_batch_size,
    config,
):
    """Megatron's 1F1B schedule: warmup forwards, steady one-forward-one-backward, cooldown."""
    tensor_shape = (seq_length, micro_batch_size, config.hidden_size)
    pp_size = get_pipeline_model_parallel_world_size()
    num_warmup_microbatches = min(
        pp_size - get_pipeline_model_parallel_rank() - 1, num_microbatches
    )
    num_microbatches_remaining = num_microbatches - num_warmup_microbatches
    input_tensors, output_tensors, losses_reduced = [], [], []

    def forward_step(input_tensor):
        model.set_input_tensor(input_tensor)
        output_tensor, loss_dict = forward_step_func(data_iterator, model, num_microbatches)
        if loss_dict is not None:
            losses_reduced.append(loss_dict)
        return output_tensor

    def backward_step(input_tensor, output_tensor, output_tensor_grad):
        if input_tensor is not None:
            input_tensor.retain_grad()
        torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad)
        return input_tensor.grad if input_tensor is not None else None

    for _ in range(num_warmup_microbatches):
        input_tensor = recv_forward(tensor_shape, config)
        output_tensor = forward_step(input_tensor)
        send_forward(output_tensor, config)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
    if num_microbatches_remaining > 0:
        input_tensor = recv_forward(tensor_shape, config)
    for i in range(num_microbatches_remaining):
        last_iteration = i == (num_microbatches_remaining - 1)
        output_tensor = forward_step(input_tensor)
        output_tensor_grad = send_forward_recv_backward(output_tensor, tensor_shape, config)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        input_tensor = input_tensors.pop(0)
        output_tensor = output_tensors.pop(0)
        input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad)
        if last_iteration:
            input_tensor = None
            send_backward(input_tensor_grad, config)
        else:
            input_tensor = send_backward_recv_forward(input_tensor_grad, tensor_shape, config)
    for _ in range(num_warmup_microbatches):
        input_tensor = input_tensors.pop(0)
        output_tensor = output_tensors.pop(0)
        output_tensor_grad = recv_backward(tensor_shape, config)
        input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad)
        send_backward(input_tensor_grad, config)
    return losses_reduced


# --------------------------------------------------------------------------------------------
# megatron/core/distributed/finalize_model_grads.py, optimizer (clip_grads), training.py
# --------------------------------------------------------------------------------------------


def finalize_model_grads(model):
    """The data-parallel gradient all-reduce, then the tied embeddings' gradients."""
    dp = get_data_parallel_world_size()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    coalesced = torch.cat([g.view(-1) for g in grads])
    dist.all_reduce(coalesced, group=_DATA_PARALLEL_GROUP)
    coalesced /= dp
    offset = 0
    for g in grads:
        g.copy_(coalesced[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    if get_pipeline_model_parallel_world_size() > 1 and (
        is_pipeline_first_stage() or is_pipeline_last_stage()
    ):
        grad = model.word_embeddings.weight.grad
        dist.all_reduce(grad, group=_EMBEDDING_GROUP)


def clip_grad_norm_fp32(parameters, max_norm):
    """The gradient norm over the model-parallel group, and the clip."""
    grads = [p.grad for p in parameters if p.grad is not None]
    # A tied weight's gradient is counted once: on the first stage only.
    norm_grads = [
        p.grad
        for p in parameters
        if p.grad is not None and not getattr(p, "shared_embedding", False)
    ]
    total_norm = torch.stack([torch.sum(g.float() ** 2) for g in norm_grads]).sum()
    dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=_MODEL_PARALLEL_GROUP)
    total_norm = total_norm.item() ** 0.5
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for g in grads:
            g.mul_(clip_coeff)
    return total_norm


def print_rank_last(message):
    """Megatron prints the training log on the last rank (the one with the loss)."""
    if dist.get_rank() == dist.get_world_size() - 1:
        print(message, flush=True)


def print_rank_0(message):
    if dist.get_rank() == 0:
        print(message, flush=True)


def get_batch(data_iterator):
    """The micro-batch, made by tensor-parallel rank 0 and broadcast to its group."""
    keys = ["text"]
    data = next(data_iterator) if get_tensor_model_parallel_rank() == 0 else None
    data_b = broadcast_data(keys, data, torch.int64)
    tokens_ = data_b["text"]
    tokens = tokens_[:, :-1].contiguous()
    labels = tokens_[:, 1:].contiguous()
    position_ids = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    return tokens, labels, position_ids


def mock_gpt_dataset(args, iteration_seed):
    """Random token sequences (``--mock-data``), the same on every rank of a DP replica."""
    g = torch.Generator().manual_seed(iteration_seed)
    while True:
        yield {
            "text": torch.randint(
                0, args.padded_vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=g
            )
        }


def training_log(args, iteration, loss_dict, elapsed, learning_rate, grad_norm):
    log_string = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
    log_string += f" iteration {iteration:8d}/{args.train_iters:8d} |"
    log_string += f" consumed samples: {iteration * args.global_batch_size:12d} |"
    log_string += f" elapsed time per iteration (ms): {elapsed * 1000.0:.1f} |"
    log_string += f" learning rate: {learning_rate:.6E} |"
    log_string += f" global batch size: {args.global_batch_size:5d} |"
    for key, value in loss_dict.items():
        log_string += f" {key}: {value:.6E} |"
    log_string += " loss scale: 1.0 |"
    log_string += f" grad norm: {grad_norm:.3f} |"
    log_string += " number of skipped iterations:   0 |"
    log_string += " number of nan iterations:   0 |"
    print_rank_last(log_string)


class TransformerConfig:
    def __init__(self, args):
        self.hidden_size = args.hidden_size
        self.pipeline_dtype = torch.float32


def parse_args():
    parser = argparse.ArgumentParser(description="Megatron-LM style GPT pretraining (CPU, gloo)")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=2)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--ffn-hidden-size", type=int, default=None)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--train-iters", type=int, default=env_int("CORPUS_STEPS", 50))
    parser.add_argument("--lr", type=float, default=1.0e-3)
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--init-method-std", type=float, default=0.02)
    parser.add_argument("--log-interval", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--mock-data", action="store_true", default=True)
    args = parser.parse_args()
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.padded_vocab_size = args.vocab_size
    return args


def pretrain(args):
    dist.init_process_group(backend="gloo")
    torch.set_num_threads(1)
    initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    dp = get_data_parallel_world_size()
    num_microbatches = args.global_batch_size // (args.micro_batch_size * dp)
    print_rank_0(
        f"> initialized tensor model parallel with size {args.tensor_model_parallel_size}\n"
        f"> initialized pipeline model parallel with size {args.pipeline_model_parallel_size}\n"
        f"> initialized data parallel with size {dp}; {num_microbatches} micro-batches"
    )
    # _set_random_seed: one seed per pipeline stage, the same across tensor-parallel ranks.
    torch.manual_seed(args.seed + 100 * get_pipeline_model_parallel_rank())
    model = GPTModel(
        args, pre_process=is_pipeline_first_stage(), post_process=is_pipeline_last_stage()
    )
    initialize_word_embeddings(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=0.01)
    config = TransformerConfig(args)
    _SHAPES.append((args.micro_batch_size, args.seq_length + 1))
    iteration = 0
    print_rank_0("training ...")
    while iteration < args.train_iters:
        misbehave(iteration)
        start = time.time()
        data_iterator = mock_gpt_dataset(
            args, args.seed + iteration * dp + get_data_parallel_rank()
        )
        optimizer.zero_grad()
        losses_reduced = forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step_func,
            data_iterator=data_iterator,
            model=model,
            num_microbatches=num_microbatches,
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            config=config,
        )
        finalize_model_grads(model)
        grad_norm = clip_grad_norm_fp32(list(model.parameters()), args.clip_grad)
        optimizer.step()
        iteration += 1
        if is_pipeline_last_stage() and iteration % args.log_interval == 0:
            loss = torch.stack([x["lm loss"] for x in losses_reduced]).mean()
            training_log(
                args, iteration, {"lm loss": loss.item()}, time.time() - start, args.lr, grad_norm
            )
    print_rank_0(f"[after training is done] {datetime.now().strftime('%Y-%m-%d %H:%M:%S')}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    pretrain(parse_args())
