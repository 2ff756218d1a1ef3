"""Which heads, MLP columns and vocabulary rows each rank holds, and which sizes are refused.

Query heads and the MLP split evenly. KV heads split too when there are at least as many as ranks;
otherwise each KV head is replicated on the ranks whose query heads read it (as vLLM does). The
vocabulary splits into equal shards (the last one shorter when it does not divide).
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.models.decoder import DecoderSpec
from localchat.errors import InvalidParameterError


@dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `world_size`: its query heads, KV heads, MLP columns and vocabulary rows."""

    rank: int
    world_size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab: range
    vocab_shard: int  # rows of every shard but possibly the last (what the gather pads to)


def check_tensor_parallel(spec: DecoderSpec, world_size: int) -> None:
    """Refuse a size that does not split the model, naming its head counts, and the features a
    shard does not run yet."""
    unsplit = [
        name
        for name, used in (
            ("mixture-of-experts MLPs", spec.moe is not None),
            ("q/k norms over the whole projection", spec.qk_norm_full),
            ("attention sinks", spec.attention_sinks),
            ("attention output and MLP biases", spec.o_bias or spec.mlp_bias),
        )
        if used
    ]
    if unsplit and world_size > 1:
        raise InvalidParameterError(
            f"--tensor-parallel-size {world_size}: {spec.family} models have "
            f"{', '.join(unsplit)}, which tensor parallelism does not split yet "
            "(use --data-parallel-size for several copies)",
            param="tensor_parallel_size",
        )
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
    if spec.intermediate_size % world_size:
        raise InvalidParameterError(
            f"{flag} does not divide the MLP width {spec.intermediate_size}",
            param="tensor_parallel_size",
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
    )
