"""Turn a loaded model into one rank's shard, the Megatron way.

q/k/v and gate/up are column-parallel (each rank keeps its heads' and its MLP columns' output
rows), o and down are row-parallel (the matching input columns) and end in one all-reduce each
(forward hooks on the attention and MLP modules). A mixture-of-experts MLP splits every expert, and
its shared expert, as a dense MLP (each rank keeps every expert's share of the width) and keeps
the router and the shared expert's gate whole: the routing is the same on every rank, each
expert's partial outputs are weighted as the whole ones would be, and one all-reduce ends the
block. Column-parallel biases and attention sinks split with their rows and heads; a row-parallel
projection's bias is added by rank 0 only. A q/k norm over the whole projection (OLMo 2, OLMoE)
adds its squares across the ranks (ShardedRMSNorm). The embedding and LM head are vocab-parallel:
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
from localchat.engine.modeling.decoder import MLP, Attention, DecoderForCausalLM, RMSNorm
from localchat.engine.modeling.moe import SparseMoE
from localchat.engine.modeling.spec import MoESpec


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


class ShardedRMSNorm(RMSNorm):
    """An RMSNorm over a projection split across the ranks (OLMo 2's and OLMoE's q/k norms over
    all heads): each rank holds its heads' part of the weight, and the sum of squares is
    all-reduced. Where a KV head is on several ranks, its squares are counted that many times, so
    the sum is divided by `replicas`."""

    def __init__(self, norm: RMSNorm, columns: range, size: int, replicas: int):
        super().__init__(len(columns), norm.eps)
        self.weight = nn.Parameter(norm.weight.detach()[columns.start : columns.stop].clone())
        self.size, self.replicas = size, replicas

    def forward(self, x, residual=None):
        assert residual is None
        x32 = x.to(torch.float32)
        squares = parallel_state.all_reduce(x32.pow(2).sum(-1, keepdim=True))
        if self.replicas > 1:
            squares = squares / self.replicas
        normed = (x32 * torch.rsqrt(squares / self.size + self.eps)).to(x.dtype)
        return self.weight * normed


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
    if attn.o_bias is not None and plan.rank != 0:
        _set(attn, "o_bias", None)
    if attn.sinks is not None:
        _set(attn, "sinks", attn.sinks.detach()[qh.start : qh.stop].contiguous())
    if attn.qk_norm_full and attn.q_norm is not None and attn.k_norm is not None:
        q_cols, k_cols = range(qh.start * d, qh.stop * d), range(kh.start * d, kh.stop * d)
        attn.q_norm = ShardedRMSNorm(attn.q_norm, q_cols, q, 1)
        attn.k_norm = ShardedRMSNorm(attn.k_norm, k_cols, kv, plan.kv_replicas)
    attn.num_heads, attn.num_kv_heads = len(qh), len(kh)
    attn.q_size, attn.kv_size = len(qh) * d, len(kh) * d
    attn.register_forward_hook(_all_reduce_output)


def _shard_mlp(mlp: MLP, width: int, cols: range, rank: int) -> None:
    """Cut a gated MLP (dense, an expert or a shared expert) of `width` to columns `cols`; its
    down bias stays on rank 0. Registers no all-reduce."""
    gate_up_rows = _rows([cols, range(width + cols.start, width + cols.stop)])
    _set(mlp, "gate_up_weight", take_rows(mlp.gate_up_weight, gate_up_rows))
    if mlp.gate_up_bias is not None:
        _set(mlp, "gate_up_bias", take_rows(mlp.gate_up_bias, gate_up_rows))
    _set(mlp, "down_weight", take_columns(mlp.down_weight, cols.start, cols.stop))
    if mlp.down_bias is not None and rank != 0:
        _set(mlp, "down_bias", None)


def _shard_moe(moe: SparseMoE, plan: ShardPlan, shard_spec: MoESpec) -> None:
    """Cut every expert and the shared expert; the router and the shared expert's gate stay
    whole."""
    spec = moe.moe
    for expert in moe.experts:
        assert isinstance(expert, MLP)
        _shard_mlp(expert, spec.intermediate_size, plan.expert_intermediate, plan.rank)
    if moe.shared_expert is not None:
        cols = plan.shared_expert_intermediate
        _shard_mlp(moe.shared_expert, spec.shared_expert_size, cols, plan.rank)
    moe.moe = shard_spec


def shard_model(model: DecoderForCausalLM, rank: int, world_size: int) -> TensorParallelDecoder:
    """Cut the (unpacked, just loaded) model down to rank `rank`'s shard, in place."""
    spec = model.spec
    plan = plan_shards(spec, rank, world_size)
    moe = spec.moe and dataclasses.replace(
        spec.moe,
        intermediate_size=len(plan.expert_intermediate),
        shared_expert_size=len(plan.shared_expert_intermediate),
    )
    for layer in model.layers:
        assert isinstance(layer.self_attn, Attention)
        _shard_attention(layer.self_attn, plan)
        mlp = layer.mlp
        if isinstance(mlp, SparseMoE):
            assert moe is not None
            _shard_moe(mlp, plan, moe)
        else:
            assert isinstance(mlp, MLP)
            _shard_mlp(mlp, spec.intermediate_size, plan.intermediate, rank)
        mlp.register_forward_hook(_all_reduce_output)  # one for the whole MLP or MoE block
    vocab_rows = _rows([plan.vocab])
    _set(model, "embed_tokens", take_rows(model.embed_tokens, vocab_rows))
    if model.lm_head is not None:
        _set(model, "lm_head", take_rows(model.lm_head, vocab_rows))
    model.spec = dataclasses.replace(
        spec,
        num_heads=len(plan.q_heads),
        num_kv_heads=len(plan.kv_heads),
        intermediate_size=len(plan.intermediate),
        moe=moe,
    )  # this shard's shape; vocab_size stays the whole vocabulary, which sampling sees
    model.__class__ = TensorParallelDecoder  # same module, vocab-parallel embed and LM head
    assert isinstance(model, TensorParallelDecoder)
    model.plan = plan
    model.announce_logits = None
    return model
