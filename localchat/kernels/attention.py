"""Paged attention over a mixed batch: decodes and (chunked) prefills, keys read from the block pool.

Every query attends causally to its own sequence's keys, all of which (cached prefix, earlier chunks and
this step's tokens) are already in the pool: the layer stores this step's keys before attending.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localchat.engine.forward_context import AttentionMetadata
from localchat.kernels.dispatch import use_triton


@dataclass
class _RefPlan:
    decode_slots: torch.Tensor | None       # [num_decodes, max_len] pool slots of each decode's keys
    decode_mask: torch.Tensor | None        # [num_decodes, 1, 1, max_len] True where a key exists
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor | None]]  # (q_start, q_end, slots, mask)


def _slots_of(block_table_rows: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    offsets = torch.arange(block_size, device=block_table_rows.device)
    slots = block_table_rows.to(torch.int64).unsqueeze(-1) * block_size + offsets
    return slots.flatten(-2)[..., :length]


def _plan(md: AttentionMetadata, block_size: int) -> _RefPlan:
    plan = md.scratch.get("ref_attention_plan")
    if plan is not None:
        return plan
    seq_lens, starts = md.seq_lens_cpu, md.query_start_loc_cpu
    nd = md.num_decodes
    decode_slots = decode_mask = None
    if nd:
        max_len = max(seq_lens[:nd])
        num_blocks = -(-max_len // block_size)
        decode_slots = _slots_of(md.block_tables[:nd, :num_blocks].clamp_min(0), block_size, max_len)
        if min(seq_lens[:nd]) != max_len:
            lens = md.seq_lens[:nd].to(decode_slots.device).unsqueeze(1)
            decode_mask = (torch.arange(max_len, device=decode_slots.device) < lens)[:, None, None, :]
    prefills = []
    for i in range(nd, md.num_seqs):
        q_start, q_end, length = starts[i], starts[i + 1], seq_lens[i]
        slots = _slots_of(md.block_tables[i, : -(-length // block_size)], block_size, length)
        q_len = q_end - q_start
        mask = None
        if q_len != length:  # queries sit at the end of the sequence: allow keys up to each one's position
            q_pos = torch.arange(length - q_len, length, device=slots.device).unsqueeze(1)
            mask = torch.arange(length, device=slots.device).unsqueeze(0) <= q_pos
        prefills.append((q_start, q_end, slots, mask))
    plan = _RefPlan(decode_slots, decode_mask, prefills)
    md.scratch["ref_attention_plan"] = plan
    return plan


def paged_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, md: AttentionMetadata, scale: float
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [num_blocks, block_size, Hkv, D] -> out [T, Hq, D]. GQA when Hq > Hkv."""
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    plan = _plan(md, block_size)
    nd = md.num_decodes
    out = torch.empty_like(q) if nd < q.shape[0] else None  # an all-decode batch needs no extra copy
    if nd:
        shape = (*plan.decode_slots.shape, num_kv_heads, head_dim)
        flat_slots = plan.decode_slots.flatten()  # index_select: advanced indexing scans the whole pool
        keys = k_flat.index_select(0, flat_slots).view(shape).transpose(1, 2).to(q.dtype)  # [nd, Hkv, L, D]
        values = v_flat.index_select(0, flat_slots).view(shape).transpose(1, 2).to(q.dtype)
        queries = q[:nd].unsqueeze(2)  # [nd, Hq, 1, D]
        decoded = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=plan.decode_mask, scale=scale, enable_gqa=True
        ).squeeze(2)
        if out is None:
            return decoded
        out[:nd] = decoded
    for q_start, q_end, slots, mask in plan.prefills:
        keys = k_flat.index_select(0, slots).transpose(0, 1).to(q.dtype)  # [Hkv, L, D]
        values = v_flat.index_select(0, slots).transpose(0, 1).to(q.dtype)
        queries = q[q_start:q_end].transpose(0, 1)  # [Hq, q_len, D]
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
        out[q_start:q_end] = attended.transpose(0, 1)
    return out


def paged_attention(q, k_cache, v_cache, md: AttentionMetadata, scale: float) -> torch.Tensor:
    if use_triton(q):
        from localchat.kernels.triton_attention import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, md, scale)
    return paged_attention_ref(q, k_cache, v_cache, md, scale)
