"""Paged attention over a mixed batch: decodes and (chunked) prefills, keys read from the block
pool.

Every query attends causally to its own sequence's keys, all of which (cached prefix, earlier chunks
and this step's tokens) are already in the pool: the layer stores this step's keys before attending.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.kernels.attention_metadata import AttentionMetadata, ReferencePlan
from localchat.kernels.dispatch import use_triton


def _slots_of(block_table_rows: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    offsets = torch.arange(block_size, device=block_table_rows.device)
    slots = block_table_rows.to(torch.int64).unsqueeze(-1) * block_size + offsets
    return slots.flatten(-2)[..., :length]


def _plan(md: AttentionMetadata, block_size: int) -> ReferencePlan:
    if md.reference_plan is not None:
        return md.reference_plan
    seq_lens, starts = md.seq_lens_cpu, md.query_start_loc_cpu
    nd = md.num_decodes
    decode_slots = decode_mask = None
    if nd:
        max_len = max(seq_lens[:nd])
        num_blocks = -(-max_len // block_size)
        decode_slots = _slots_of(
            md.block_tables[:nd, :num_blocks].clamp_min(0), block_size, max_len
        )
        if min(seq_lens[:nd]) != max_len:
            lens = md.seq_lens[:nd].to(decode_slots.device).unsqueeze(1)
            decode_mask = (torch.arange(max_len, device=decode_slots.device) < lens)[
                :, None, None, :
            ]
    prefills = []
    for i in range(nd, md.num_seqs):
        q_start, q_end, length = starts[i], starts[i + 1], seq_lens[i]
        slots = _slots_of(md.block_tables[i, : -(-length // block_size)], block_size, length)
        prefills.append((q_start, q_end, slots, length - (q_end - q_start)))
    md.reference_plan = ReferencePlan(decode_slots, decode_mask, prefills)
    return md.reference_plan


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [num_blocks, block_size, Hkv, D] -> out [T, Hq, D].
    GQA when Hq > Hkv."""
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    plan = _plan(md, block_size)
    nd = md.num_decodes
    # An all-decode batch needs no extra copy.
    out = torch.empty_like(q) if nd < q.shape[0] else None
    if nd:
        decode_slots = plan.decode_slots
        assert decode_slots is not None  # _plan sets it whenever there are decodes
        shape = (*decode_slots.shape, num_kv_heads, head_dim)
        # index_select: advanced indexing scans the whole pool
        flat_slots = decode_slots.flatten()
        # [nd, Hkv, L, D]
        keys = k_flat.index_select(0, flat_slots).view(shape).transpose(1, 2).to(q.dtype)
        values = v_flat.index_select(0, flat_slots).view(shape).transpose(1, 2).to(q.dtype)
        queries = q[:nd].unsqueeze(2)  # [nd, Hq, 1, D]
        decoded = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=plan.decode_mask, scale=scale, enable_gqa=True
        ).squeeze(2)
        if out is None:
            return decoded
        out[:nd] = decoded
    assert out is not None  # no decodes: every token is a prefill's
    for q_start, q_end, slots, prefix_len in plan.prefills:
        keys = k_flat.index_select(0, slots).transpose(0, 1).to(q.dtype)  # [Hkv, L, D]
        values = v_flat.index_select(0, slots).transpose(0, 1).to(q.dtype)
        queries = q[q_start:q_end].transpose(0, 1)  # [Hq, q_len, D]
        if prefix_len == 0:
            attended = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            attended = _attend_after_prefix(queries, keys, values, prefix_len, scale)
        out[q_start:q_end] = attended.transpose(0, 1)
    return out


_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend_after_prefix(queries, keys, values, prefix_len: int, scale: float) -> torch.Tensor:
    """Causal attention of the last q_len positions over L keys, the first prefix_len of them
    cached.

    Every query sees the whole prefix, so that part needs no mask: it runs as one unmasked flash
    attention (query heads grouped per KV head), the new part as a small causal one, and the two are
    merged by their log-sum-exps. That is several times faster on the CPU than one masked attention.
    """
    num_heads, q_len, head_dim = queries.shape
    num_kv_heads = keys.shape[0]
    if _flash_cpu is None or queries.device.type != "cpu":
        q_pos = torch.arange(prefix_len, prefix_len + q_len, device=queries.device).unsqueeze(1)
        mask = torch.arange(keys.shape[1], device=queries.device).unsqueeze(0) <= q_pos
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    group = num_heads // num_kv_heads
    grouped = queries.reshape(num_kv_heads, group * q_len, head_dim).unsqueeze(0)
    old_out, old_lse = _flash_cpu(
        grouped, keys[None, :, :prefix_len], values[None, :, :prefix_len], 0.0, False, scale=scale
    )
    old_out, old_lse = (
        old_out.reshape(num_heads, q_len, head_dim),
        old_lse.reshape(num_heads, q_len),
    )
    new_keys = keys[:, prefix_len:].repeat_interleave(group, dim=0)[None]
    new_values = values[:, prefix_len:].repeat_interleave(group, dim=0)[None]
    new_out, new_lse = _flash_cpu(queries[None], new_keys, new_values, 0.0, True, scale=scale)
    lse = torch.logaddexp(old_lse, new_lse[0])
    return (
        old_out * (old_lse - lse).exp().unsqueeze(-1)
        + new_out[0] * (new_lse[0] - lse).exp().unsqueeze(-1)
    ).to(queries.dtype)


def paged_attention(q, k_cache, v_cache, md: AttentionMetadata, scale: float) -> torch.Tensor:
    if use_triton(q):
        from localchat.kernels.triton_attention import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, md, scale)
    return paged_attention_ref(q, k_cache, v_cache, md, scale)
