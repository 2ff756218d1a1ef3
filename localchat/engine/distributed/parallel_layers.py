"""Turn a loaded model into one rank's shard, the Megatron way.

q/k/v and gate/up are column-parallel (each rank keeps its heads' and its MLP columns' output
rows), o and down are row-parallel (the matching input columns) and end in one all-reduce each
(forward hooks on the attention and MLP modules). The embedding and LM head are vocab-parallel:
a token's embedding comes from the rank holding its row (the others add zeros), and the logits of
the shards are gathered to rank 0, which samples. The fused C++ decode stack runs whole layers, so a
shard runs op by op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.shard_plan import ShardPlan, plan_shards
from localchat.engine.distributed.sharded_weights import Weight, take_columns, take_rows
from localchat.engine.models.decoder import MLP, Attention, DecoderForCausalLM


class TensorParallelDecoder(DecoderForCausalLM):
    """A DecoderForCausalLM holding one rank's shard (made by `shard_model`)."""

    plan: ShardPlan
    # set on rank 0: tells the other ranks to compute logits of these hidden rows too
    announce_logits: Callable[[torch.Tensor], None] | None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        vocab = self.plan.vocab
        inside = (input_ids >= vocab.start) & (input_ids < vocab.stop)
        hidden = super().embed(torch.where(inside, input_ids - vocab.start, 0))
        return parallel_state.all_reduce(hidden.masked_fill_(~inside.unsqueeze(-1), 0.0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.announce_logits is not None:
            self.announce_logits(hidden)
        local = super().compute_logits(hidden)
        return parallel_state.gather_columns(local, self.plan.vocab_shard, self.spec.vocab_size)

    def pack_weights(self) -> bool:
        packed = super().pack_weights()
        self.cpu_decode = None  # the C++ stack runs whole layers; a shard runs op by op
        return packed


def _rows(ranges: list[range]) -> torch.Tensor:
    return torch.cat([torch.arange(r.start, r.stop) for r in ranges])


def _set(module: nn.Module, name: str, value: Weight | None) -> None:
    """Replace a weight, as a parameter when dense, as a plain attribute when quantized."""
    if isinstance(value, torch.Tensor):
        module._parameters[name] = nn.Parameter(value, requires_grad=False)
        return
    module._parameters.pop(name, None)
    setattr(module, name, value)


def _all_reduce_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return parallel_state.all_reduce(output)


def _shard_attention(attn: Attention, plan: ShardPlan) -> None:
    d = attn.head_dim
    q, kv = attn.q_size, attn.kv_size
    qh, kh = plan.q_heads, plan.kv_heads
    rows = _rows(
        [
            range(qh.start * d, qh.stop * d),
            range(q + kh.start * d, q + kh.stop * d),
            range(q + kv + kh.start * d, q + kv + kh.stop * d),
        ]
    )
    _set(attn, "qkv_weight", take_rows(attn.qkv_weight, rows))
    if attn.qkv_bias is not None:
        _set(attn, "qkv_bias", take_rows(attn.qkv_bias, rows))
    _set(attn, "o_weight", take_columns(attn.o_weight, qh.start * d, qh.stop * d))
    attn.num_heads, attn.num_kv_heads = len(qh), len(kh)
    attn.q_size, attn.kv_size = len(qh) * d, len(kh) * d
    attn.register_forward_hook(_all_reduce_output)


def shard_model(model: DecoderForCausalLM, rank: int, world_size: int) -> TensorParallelDecoder:
    """Cut the (unpacked, just loaded) model down to rank `rank`'s shard, in place."""
    spec = model.spec
    plan = plan_shards(spec, rank, world_size)
    width = spec.intermediate_size
    cols = plan.intermediate
    gate_up_rows = _rows([cols, range(width + cols.start, width + cols.stop)])
    for layer in model.layers:
        assert isinstance(layer.self_attn, Attention)
        _shard_attention(layer.self_attn, plan)
        mlp = layer.mlp
        assert isinstance(mlp, MLP)
        _set(mlp, "gate_up_weight", take_rows(mlp.gate_up_weight, gate_up_rows))
        _set(mlp, "down_weight", take_columns(mlp.down_weight, cols.start, cols.stop))
        mlp.register_forward_hook(_all_reduce_output)
    vocab_rows = _rows([plan.vocab])
    _set(model, "embed_tokens", take_rows(model.embed_tokens, vocab_rows))
    if model.lm_head is not None:
        _set(model, "lm_head", take_rows(model.lm_head, vocab_rows))
    model.spec = dataclasses.replace(
        spec,
        num_heads=len(plan.q_heads),
        num_kv_heads=len(plan.kv_heads),
        intermediate_size=len(cols),
    )  # this shard's shape; vocab_size stays the whole vocabulary, which sampling sees
    model.__class__ = TensorParallelDecoder  # same module, vocab-parallel embed and LM head
    assert isinstance(model, TensorParallelDecoder)
    model.plan = plan
    model.announce_logits = None
    return model
