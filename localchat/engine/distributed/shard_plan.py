"""Which heads, MLP columns and vocabulary rows each rank holds, and which sizes are refused.

Query heads and the MLP split evenly; so do each expert of a mixture-of-experts MLP (every rank
holds every expert's share of its width) and a shared expert. KV heads split too when there are at
least as many as ranks; otherwise each KV head is replicated on the ranks whose query heads read it
(as vLLM does). The vocabulary splits into equal shards (the last one shorter when it does not
divide).
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.modeling.decoder import DecoderSpec
from localchat.errors import InvalidParameterError


@dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `world_size`: its query heads, KV heads, MLP columns (of the dense MLP, of
    each expert, of the shared expert) and vocabulary rows."""

    rank: int
    world_size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab: range
    vocab_shard: int  # rows of every shard but possibly the last (what the gather pads to)
    kv_replicas: int = 1  # on how many ranks each KV head is (1 where they split)
    expert_intermediate: range = range(0)
    shared_expert_intermediate: range = range(0)


def check_tensor_parallel(spec: DecoderSpec, world_size: int) -> None:
    """Refuse a size that does not split the model, naming its head counts or the width it does
    not divide."""
    heads, kv_heads = spec.num_heads, spec.num_kv_heads
    counts = f"the model has {heads} query heads and {kv_heads} KV heads"
    flag = f"--tensor-parallel-size {world_size}"
    if heads % world_size:
        raise InvalidParameterError(
            f"{flag} does not divide the query heads: {counts}", param="tensor_parallel_size"
        )
    if (kv_heads % world_size) if kv_heads >= world_size else (world_size % kv_heads):
        raise InvalidParameterError(
            f"{flag} and the KV heads do not split evenly (one must divide the other): {counts}",
            param="tensor_parallel_size",
        )
    dense = spec.moe is None or not all(spec.layer(i).moe for i in range(spec.num_layers))
    widths = [("the MLP width", spec.intermediate_size)] if dense else []
    if spec.moe is not None:
        widths.append(("each expert's width", spec.moe.intermediate_size))
        widths.append(("the shared expert's width", spec.moe.shared_expert_size))
    for name, width in widths:
        if width % world_size:
            raise InvalidParameterError(
                f"{flag} does not divide {name} {width}", param="tensor_parallel_size"
            )


def plan_shards(spec: DecoderSpec, rank: int, world_size: int) -> ShardPlan:
    check_tensor_parallel(spec, world_size)
    q_per_rank = spec.num_heads // world_size
    q_heads = range(rank * q_per_rank, (rank + 1) * q_per_rank)
    if spec.num_kv_heads >= world_size:
        kv_per_rank = spec.num_kv_heads // world_size
        kv_heads = range(rank * kv_per_rank, (rank + 1) * kv_per_rank)
    else:  # one KV head, shared by the ranks whose query heads it serves
        kv_head = q_heads.start // (spec.num_heads // spec.num_kv_heads)
        kv_heads = range(kv_head, kv_head + 1)
    width = spec.intermediate_size // world_size
    expert_width = spec.moe.intermediate_size // world_size if spec.moe else 0
    shared_width = spec.moe.shared_expert_size // world_size if spec.moe else 0
    vocab_shard = -(-spec.vocab_size // world_size)
    vocab = range(
        min(rank * vocab_shard, spec.vocab_size), min((rank + 1) * vocab_shard, spec.vocab_size)
    )
    return ShardPlan(
        rank,
        world_size,
        q_heads,
        kv_heads,
        range(rank * width, (rank + 1) * width),
        vocab,
        vocab_shard,
        max(1, world_size // spec.num_kv_heads),
        range(rank * expert_width, (rank + 1) * expert_width),
        range(rank * shared_width, (rank + 1) * shared_width),
    )
