"""Paged attention over a mixed batch: decodes and (chunked) prefills, keys read from the block
pool.

Every query attends causally to its own sequence's keys, all of which (cached prefix, earlier chunks
and this step's tokens) are already in the pool: the layer stores this step's keys before attending.

Three options, each off when None, follow Hugging Face's eager attention:
- sliding_window=W: the query at position p sees only the keys at positions j with p - W < j <= p
  (Mistral, Gemma 2/3, gpt-oss); only those keys are gathered.
- softcap=c: scores s = scale * q.k become c * tanh(s / c) before the mask and softmax (Gemma 2).
- sinks [Hq]: one logit per query head joins the softmax's denominator as a key without a value
  (gpt-oss): out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^sink), which is the plain output times
  sigmoid(lse - sink), lse the log-sum-exp of the scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.kernels.attention_metadata import AttentionMetadata, ReferencePlan
from localchat.kernels.attention_options import check_options
from localchat.kernels.dispatch import use_triton
from localchat.kernels.kv_quant import FP8, dequantize_q8_0, is_q8_0


def _slots_of(block_table_rows: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    offsets = torch.arange(block_size, device=block_table_rows.device)
    slots = block_table_rows.to(torch.int64).unsqueeze(-1) * block_size + offsets
    return slots.flatten(-2)[..., :length]


def _slots_between(block_table_row: torch.Tensor, block_size: int, start: int, end: int):
    """Pool slots of a sequence's keys at positions [start, end)."""
    first = start // block_size
    slots = _slots_of(
        block_table_row[first : -(-end // block_size)], block_size, end - first * block_size
    )
    return slots[start - first * block_size :]


def _plan(md: AttentionMetadata, block_size: int, window: int | None = None) -> ReferencePlan:
    if window is not None and window < max(md.seq_lens_cpu, default=0):
        plan = md.window_plans.get(window)
        if plan is None:
            plan = md.window_plans[window] = _window_plan(md, block_size, window)
        return plan
    # a window that holds every sequence whole changes nothing
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


def _window_plan(md: AttentionMetadata, block_size: int, window: int) -> ReferencePlan:
    """The gather plan under a sliding window: a decode's last min(len, window) keys (right-aligned
    in its row, the row's head masked for a shorter sequence), a prefill's keys from the first one
    its first query sees."""
    seq_lens, starts = md.seq_lens_cpu, md.query_start_loc_cpu
    nd = md.num_decodes
    decode_slots = decode_mask = None
    if nd:
        width = min(max(seq_lens[:nd]), window)
        tables = md.block_tables[:nd]
        lens = md.seq_lens[:nd].to(device=tables.device, dtype=torch.int64).unsqueeze(1)
        positions = lens - width + torch.arange(width, device=tables.device)
        if min(seq_lens[:nd]) < width:
            decode_mask = (positions >= 0)[:, None, None, :]
            positions = positions.clamp_min(0)
        pages = tables.gather(1, positions // block_size).to(torch.int64)
        decode_slots = pages * block_size + positions % block_size
    prefills = []
    for i in range(nd, md.num_seqs):
        q_start, q_end, length = starts[i], starts[i + 1], seq_lens[i]
        context = length - (q_end - q_start)
        first = max(0, context - window + 1)
        slots = _slots_between(md.block_tables[i], block_size, first, length)
        prefills.append((q_start, q_end, slots, context - first))
    return ReferencePlan(decode_slots, decode_mask, prefills)


def _gather(flat: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The pool rows [slots, Hkv, row] at `slots` as values [n, Hkv, D] of `dtype`: only these
    rows are read (a q8_0 pool's dequantized, kernels/kv_quant.py)."""
    if flat.dtype == FP8:  # index_select takes no float8 on the CPU: its bytes instead
        return flat.view(torch.uint8).index_select(0, slots).view(FP8).to(dtype)
    rows = flat.index_select(0, slots)
    return dequantize_q8_0(rows, dtype) if is_q8_0(flat) else rows.to(dtype)


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [num_blocks, block_size, Hkv, D] (or a q8_0 pool's rows,
    kernels/kv_quant.py) -> out [T, Hq, D]. GQA when Hq > Hkv. sliding_window, softcap, sinks
    [Hq]: see the module's docstring."""
    check_options(sliding_window, softcap, sinks, q.shape[1])
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], q.shape[2]
    k_flat = k_cache.view(-1, num_kv_heads, k_cache.shape[3])
    v_flat = v_cache.view(-1, num_kv_heads, v_cache.shape[3])
    plan = _plan(md, block_size, sliding_window)
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
        keys = _gather(k_flat, flat_slots, q.dtype).view(shape).transpose(1, 2)
        values = _gather(v_flat, flat_slots, q.dtype).view(shape).transpose(1, 2)
        queries = q[:nd].unsqueeze(2)  # [nd, Hq, 1, D]
        if softcap is None and sinks is None:
            decoded = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=plan.decode_mask, scale=scale, enable_gqa=True
            )
        else:
            decoded = _attend_explicit(
                queries, keys, values, plan.decode_mask, scale, softcap, sinks
            )
        decoded = decoded.squeeze(2)
        if out is None:
            return decoded
        out[:nd] = decoded
    assert out is not None  # no decodes: every token is a prefill's
    for q_start, q_end, slots, prefix_len in plan.prefills:
        keys = _gather(k_flat, slots, q.dtype).transpose(0, 1)  # [Hkv, L, D]
        values = _gather(v_flat, slots, q.dtype).transpose(0, 1)
        queries = q[q_start:q_end].transpose(0, 1)  # [Hq, q_len, D]
        # the window, where it hides some of the keys gathered from a query
        window = sliding_window
        if window is not None and prefix_len + q_end - q_start <= window:
            window = None
        if softcap is not None:
            attended = _attend_explicit_rows(
                queries, keys, values, prefix_len, window, scale, softcap, sinks
            )
        elif prefix_len == 0 and window is None and sinks is None:
            attended = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            attended = _attend_after_prefix(queries, keys, values, prefix_len, scale, window, sinks)
        out[q_start:q_end] = attended.transpose(0, 1)
    return out


def _visible(
    q_len: int, prefix_len: int, num_keys: int, window: int | None, device
) -> torch.Tensor:
    """[q_len, num_keys] bool: which keys each query sees, the queries being the keys
    [prefix_len, prefix_len + q_len)."""
    q_pos = torch.arange(prefix_len, prefix_len + q_len, device=device).unsqueeze(1)
    k_pos = torch.arange(num_keys, device=device).unsqueeze(0)
    visible = k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    return visible


def _attend_explicit(queries, keys, values, visible, scale: float, softcap, sinks) -> torch.Tensor:
    """Attention with the scores written out in float32, for what SDPA cannot do (softcap, sinks).

    queries [..., Hq, n, D], keys and values [..., Hkv, L, D], visible: None (all) or bool,
    [..., 1, n, L] or [n, L] -> [..., Hq, n, D]. Every row must see a key or have a sink.
    """
    *batch, num_heads, q_len, head_dim = queries.shape
    num_kv_heads = keys.shape[-3]
    group = num_heads // num_kv_heads
    grouped = queries.reshape(*batch, num_kv_heads, group, q_len, head_dim).float()
    scores = grouped @ keys.float().unsqueeze(-3).transpose(-1, -2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(-3), float("-inf"))
    top = scores.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float().reshape(num_kv_heads, group, 1, 1)
        top = torch.maximum(top, sink)
    weights = (scores - top).exp()
    total = weights.sum(-1, keepdim=True)
    if sinks is not None:
        total = total + (sink - top).exp()
    out = (weights @ values.float().unsqueeze(-3)) / total
    return out.reshape(queries.shape).to(queries.dtype)


# the most scores one _attend_explicit call of a prefill holds (64 MiB of float32)
_EXPLICIT_SCORES = 1 << 24


def _attend_explicit_rows(
    queries, keys, values, prefix_len: int, window, scale: float, softcap, sinks
) -> torch.Tensor:
    """_attend_explicit for a prefill's queries [Hq, q_len, D] over keys [Hkv, L, D], the first
    prefix_len before them, a band of queries at a time over only the keys the band sees."""
    num_heads, q_len, _ = queries.shape
    rows = max(1, _EXPLICIT_SCORES // (num_heads * keys.shape[1]))
    parts = []
    for r0 in range(0, q_len, rows):
        r1 = min(q_len, r0 + rows)
        k0 = 0 if window is None else max(0, prefix_len + r0 - window + 1)
        k1 = prefix_len + r1
        visible = _visible(r1 - r0, prefix_len + r0 - k0, k1 - k0, window, queries.device)
        parts.append(
            _attend_explicit(
                queries[:, r0:r1],
                keys[:, k0:k1],
                values[:, k0:k1],
                visible,
                scale,
                softcap,
                sinks,
            )
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _masking(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask the CPU flash attention takes (of the queries' dtype) for `visible`."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, float("-inf")
    )


def _attend_after_prefix(
    queries, keys, values, prefix_len: int, scale: float, window=None, sinks=None
) -> torch.Tensor:
    """Causal attention of the last q_len positions over L keys, the first prefix_len of them
    cached (or none), under a sliding window and with sinks if given.

    Every query sees the whole prefix (without a window), so that part needs no mask: it runs as one
    unmasked flash attention (query heads grouped per KV head), the new part as a small causal one,
    and the two are merged by their log-sum-exps. That is several times faster on the CPU than one
    masked attention. A window masks only what it cuts off; the sinks scale the merged output.
    """
    num_heads, q_len, head_dim = queries.shape
    num_kv_heads = keys.shape[0]
    if _flash_cpu is None or queries.device.type != "cpu":
        mask = _visible(q_len, prefix_len, keys.shape[1], window, queries.device)
        if sinks is not None:
            return _attend_explicit(queries, keys, values, mask, scale, None, sinks)
        return F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
    group = num_heads // num_kv_heads
    new_keys = keys[:, prefix_len:].repeat_interleave(group, dim=0)[None]
    new_values = values[:, prefix_len:].repeat_interleave(group, dim=0)[None]
    new_mask = None
    if window is not None and q_len > window:
        new_mask = _masking(_visible(q_len, 0, q_len, window, queries.device), queries.dtype)
    new_out, new_lse = _flash_cpu(
        queries[None], new_keys, new_values, 0.0, new_mask is None, attn_mask=new_mask, scale=scale
    )
    if prefix_len == 0:
        out, lse = new_out[0], new_lse[0]
    else:
        grouped = queries.reshape(num_kv_heads, group * q_len, head_dim).unsqueeze(0)
        old_mask = seen = None
        if window is not None:
            visible = _visible(q_len, prefix_len, prefix_len, window, queries.device)
            if not bool(visible.all()):
                old_mask, seen = _masking(visible.repeat(group, 1), queries.dtype), visible.any(1)
        old_out, old_lse = _flash_cpu(
            grouped,
            keys[None, :, :prefix_len],
            values[None, :, :prefix_len],
            0.0,
            False,
            attn_mask=old_mask,
            scale=scale,
        )
        old_out, old_lse = (
            old_out.reshape(num_heads, q_len, head_dim),
            old_lse.reshape(num_heads, q_len),
        )
        if seen is not None:  # flash gives a row that sees no key a log-sum-exp of 0
            old_lse = old_lse.masked_fill(~seen, float("-inf"))
        lse = torch.logaddexp(old_lse, new_lse[0])
        out = old_out * (old_lse - lse).exp().unsqueeze(-1) + new_out[0] * (
            new_lse[0] - lse
        ).exp().unsqueeze(-1)
    if sinks is not None:
        out = out * torch.sigmoid(lse - sinks.float().unsqueeze(1)).unsqueeze(-1)
    return out.to(queries.dtype)


def paged_attention(
    q,
    k_cache,
    v_cache,
    md: AttentionMetadata,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    if use_triton(q) and not is_q8_0(k_cache):  # q8_0 is the CPU's (runtime.check_kv_cache_dtype)
        from localchat.kernels.triton_attention import paged_attention_triton

        return paged_attention_triton(
            q,
            k_cache,
            v_cache,
            md,
            scale,
            sliding_window=sliding_window,
            softcap=softcap,
            sinks=sinks,
        )
    return paged_attention_ref(
        q, k_cache, v_cache, md, scale, sliding_window=sliding_window, softcap=softcap, sinks=sinks
    )
