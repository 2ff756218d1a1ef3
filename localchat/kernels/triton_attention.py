"""Triton kernels: paged attention over a mixed batch of decodes and (chunked) prefills.

Keys and values are read from the block pool through each sequence's block table, one token row at a
time, so the key tile size (BLOCK_N) is independent of the pool's block size. Scores are kept in the
log2 domain (scaled by scale * log2(e)) so the online softmax can use exp2.

- Decodes (the first md.num_decodes sequences, one query each): one program per (sequence, kv head,
  split). All GROUP = Hq / Hkv query heads of a kv head are packed as the rows of one tile, so each
  K/V tile is read once. With a small batch, each sequence's keys are cut into NUM_SPLITS contiguous
  ranges (flash-decoding); a second kernel merges the partial (acc, max, sum) results. The grid
  depends only on num_decodes, Hkv and the split count, never on the context lengths (read from
  md.seq_lens on the device): CUDA-graph friendly.
- Prefills (the remaining sequences): one program per (query tile, sequence, kv head); the rows of a
  tile are (query token, head of the group) pairs. Key tiles wholly below the tile's first query
  position need no mask; only the tiles on the diagonal apply the causal mask.

Options (constexpr flags, so a kernel without them is what it was; see kernels/attention.py for the
semantics): a sliding window starts the decode's key range at the window's first key and the
prefill's key loop at the first tile its first query sees (the tiles the window cuts through for
some rows are masked, the rest of the band is not); softcap caps every score with a tanh; sinks
join each row's softmax sum at the end (the decode's reduce merges them once, after the splits).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from localchat.kernels.attention_metadata import AttentionMetadata, DecodePartials
from localchat.kernels.attention_options import check_options
from localchat.kernels.triton_attention_tiles import (
    fold_sinks,
    load_kv_tiles,
    online_softmax_step,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    sinks_ptr,
    qk_scale,
    softcap,
    window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)  # decodes come first, so sequence i's query is token i
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # This split's keys: a contiguous, BLOCK_N-long range of the keys the query sees (empty for the
    # splits past a short context).
    first = 0
    if USE_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    block_table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        k, v = load_kv_tiles(
            k_cache_ptr,
            v_cache_ptr,
            block_table_row,
            offs_n,
            n_mask,
            kv_head,
            offs_d,
            stride_cb,
            stride_cs,
            stride_ch,
            q.dtype,
            BLOCK_SIZE,
            HEAD_DIM,
            BLOCK_D,
            True,
        )
        acc, m_i, l_i = online_softmax_step(
            acc, m_i, l_i, q, k, v, qk_scale, softcap, n_mask[None, :], True, SOFTCAP, DOT_PRECISION
        )

    store_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        if USE_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=g_mask, other=0.0).to(tl.float32)
            acc, m_i, l_i = fold_sinks(acc, m_i, l_i, sink)
        out = acc / tl.maximum(l_i, 1e-30)[:, None]  # l_i == 0 only for an empty (padding) sequence
        tl.store(
            out_ptr + seq.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
    else:
        # Partials are [num_decodes, Hq, NUM_SPLITS] (+ [HEAD_DIM] for acc), contiguous float32.
        part = (seq.to(tl.int64) * NUM_Q_HEADS + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=store_mask)
        tl.store(part_m_ptr + part, m_i, mask=g_mask)
        tl.store(part_l_ptr + part, l_i, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    seq_lens_ptr,
    sinks_ptr,
    out_ptr,
    window,
    stride_ot,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    if USE_WINDOW:
        seq_len = tl.minimum(seq_len, window)  # the keys the query sees
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    offs_s = tl.arange(0, BLOCK_S)
    # splits that saw at least one key
    s_mask = (offs_s < NUM_SPLITS) & (offs_s * split_len < seq_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    part = (seq.to(tl.int64) * NUM_Q_HEADS + head) * NUM_SPLITS + offs_s
    m = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
    l_part = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_max = tl.max(m, 0)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634  # log2 domain
        m_max = tl.maximum(m_max, sink)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.math.exp2(m - m_max)  # rescale every split to the common max
    total = tl.sum(l_part * w, 0)
    if USE_SINKS:
        total += tl.math.exp2(sink - m_max)
    out = tl.sum(acc * w[:, None], 0) / tl.maximum(total, 1e-30)
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    sinks_ptr,
    first_seq,
    qk_scale,
    softcap,
    window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    q_block = tl.program_id(0)
    seq = first_seq + tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_first = q_block * BLOCK_Q
    if q_first >= q_len:  # the grid is sized for the longest query; shorter ones end here
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # keys before this step's queries (cached prefix, earlier chunks)

    # Row r of the tile is query q_first + r // GROUP of head kv_head * GROUP + r % GROUP.
    offs_m = tl.arange(0, BLOCK_M)
    q_idx = q_first + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_mask = (offs_m // GROUP < BLOCK_Q) & (q_idx < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = context + q_idx

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    block_table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt

    # Keys before the tile's first query position are visible to every row: no mask at all.
    diagonal_start = (context + q_first) // BLOCK_N * BLOCK_N
    free_start = 0
    if USE_WINDOW:
        # No row sees a key before `lo` (where the first query's window starts): none is read. The
        # tiles before free_start are cut by some row's window; from there every row sees them.
        lo = tl.maximum(context + q_first - window + 1, 0)
        q_last = context + tl.minimum(q_first + BLOCK_Q, q_len) - 1
        free_start = tl.cdiv(tl.maximum(q_last - window + 1, 0), BLOCK_N) * BLOCK_N
        free_start = tl.minimum(free_start, diagonal_start)
        for n0 in range(lo // BLOCK_N * BLOCK_N, free_start, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n >= lo
            k, v = load_kv_tiles(
                k_cache_ptr,
                v_cache_ptr,
                block_table_row,
                offs_n,
                n_mask,
                kv_head,
                offs_d,
                stride_cb,
                stride_cs,
                stride_ch,
                q.dtype,
                BLOCK_SIZE,
                HEAD_DIM,
                BLOCK_D,
                True,
            )
            in_window = (offs_n[None, :] > q_pos[:, None] - window) & n_mask[None, :]
            acc, m_i, l_i = online_softmax_step(
                acc, m_i, l_i, q, k, v, qk_scale, softcap, in_window, True, SOFTCAP, DOT_PRECISION
            )
    for n0 in range(free_start, diagonal_start, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k, v = load_kv_tiles(
            k_cache_ptr,
            v_cache_ptr,
            block_table_row,
            offs_n,
            None,
            kv_head,
            offs_d,
            stride_cb,
            stride_cs,
            stride_ch,
            q.dtype,
            BLOCK_SIZE,
            HEAD_DIM,
            BLOCK_D,
            False,
        )
        acc, m_i, l_i = online_softmax_step(
            acc, m_i, l_i, q, k, v, qk_scale, softcap, None, False, SOFTCAP, DOT_PRECISION
        )

    # Diagonal tiles: up to the tile's last query position, causal mask per row.
    end = context + tl.minimum(q_first + BLOCK_Q, q_len)
    for n0 in range(diagonal_start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        if USE_WINDOW:
            n_mask = n_mask & (offs_n >= lo)
        k, v = load_kv_tiles(
            k_cache_ptr,
            v_cache_ptr,
            block_table_row,
            offs_n,
            n_mask,
            kv_head,
            offs_d,
            stride_cb,
            stride_cs,
            stride_ch,
            q.dtype,
            BLOCK_SIZE,
            HEAD_DIM,
            BLOCK_D,
            True,
        )
        causal = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        if USE_WINDOW:
            causal = causal & (offs_n[None, :] > q_pos[:, None] - window)
        acc, m_i, l_i = online_softmax_step(
            acc, m_i, l_i, q, k, v, qk_scale, softcap, causal, True, SOFTCAP, DOT_PRECISION
        )

    if USE_SINKS:
        acc, m_i, l_i = fold_sinks(acc, m_i, l_i, tl.load(sinks_ptr + heads).to(tl.float32))
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _decode_num_splits(num_decodes: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough (sequence, kv head, split) programs to fill the GPU twice over; at most 16 splits.

    Depends only on the batch shape, so a CUDA graph captured for a batch size stays valid for any
    lengths.
    """
    num_sms = (
        _num_sms(device.index if device.index is not None else torch.cuda.current_device())
        if device.type == "cuda"
        else 4
    )  # the CPU interpreter: a few splits, to exercise the reduction
    return max(1, min(16, triton.cdiv(2 * num_sms, num_decodes * num_kv_heads)))


def _partials(
    md: AttentionMetadata, shape: tuple[int, int, int], head_dim: int, device: torch.device
) -> DecodePartials:
    """Split-K scratch (acc [*shape, D], max and sum [*shape]), float32, kept on md for the step's
    other layers.

    Layers run one after another on one stream, so one set of buffers serves them all.
    """
    cached = md.decode_partials
    if cached is None or cached.acc.shape != (*shape, head_dim) or cached.acc.device != device:
        cached = md.decode_partials = DecodePartials(
            torch.empty(*shape, head_dim, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device),
        )
    return cached


def _launch_config(dtype: torch.dtype, head_dim: int, on_gpu: bool) -> dict:
    """Tiles and warps: decode (BLOCK_N, warps), prefill (BLOCK_M, BLOCK_N, warps, stages).

    Untuned on hardware; chosen so that the sm_90 builds spill no (or, float32 with D > 128, few)
    registers.

    float32 uses 3xTF32 tensor-core dots (about float32 accuracy): Triton's exact float32 ("ieee")
    dot runs on FMA units with tiles too large for the register file. Prefill rows are (query, head)
    pairs. On the CPU interpreter, small tiles let short test sequences span several tiles.
    """
    if not on_gpu:
        return dict(precision="ieee", decode=(16, 4), prefill=(16, 16, 4, 1))
    if dtype == torch.float32:
        if head_dim <= 64:
            return dict(precision="tf32x3", decode=(16, 4), prefill=(64, 32, 4, 2))
        if head_dim <= 128:
            return dict(precision="tf32x3", decode=(32, 4), prefill=(32, 32, 8, 2))
        return dict(precision="tf32x3", decode=(32, 8), prefill=(16, 32, 8, 2))
    if head_dim > 128:
        return dict(precision="tf32", decode=(32, 4), prefill=(64, 32, 8, 2))
    return dict(precision="tf32", decode=(64, 4), prefill=(128, 64, 8 if head_dim > 64 else 4, 2))


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    scale: float,
    num_splits: int | None = None,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D]; caches [num_blocks, block_size, Hkv, D] -> out [T, Hq, D] in q.dtype (float32
    math). sliding_window, softcap and sinks [Hq] as in paged_attention_ref.

    Launch sizes come from host values in md only (no device sync); which kernels run depends only
    on which options are set, never on the lengths (CUDA graphs). num_splits overrides the decode
    split count (tests); by default it follows the batch shape (see _decode_num_splits). Rows of
    `out` past query_start_loc[-1] (padding tokens, if any) are left uninitialized.
    """
    check_options(sliding_window, softcap, sinks, q.shape[1])
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    assert group * num_kv_heads == num_q_heads and k_cache.stride() == v_cache.stride()
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    config = _launch_config(q.dtype, head_dim, q.is_cuda)
    block_d = triton.next_power_of_2(max(head_dim, 16))
    flags = dict(
        USE_WINDOW=sliding_window is not None,
        SOFTCAP=softcap is not None,
        USE_SINKS=sinks is not None,
    )
    window = sliding_window or 0
    sinks = sinks.contiguous() if sinks is not None else out  # out: a pointer never read
    common = (
        scale * _LOG2E,
        (softcap or 1.0) * _LOG2E,
        window,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        md.block_tables.stride(0),
    )

    nd = md.num_decodes
    if nd:
        splits = num_splits or _decode_num_splits(nd, num_kv_heads, q.device)
        block_n, decode_warps = config["decode"]
        if splits > 1:
            part_acc, part_m, part_l = _partials(md, (nd, num_q_heads, splits), head_dim, q.device)
        else:
            part_acc = part_m = part_l = out  # unused
        _decode_kernel[(nd, num_kv_heads, splits)](
            q,
            k_cache,
            v_cache,
            md.block_tables,
            md.seq_lens,
            out,
            part_acc,
            part_m,
            part_l,
            sinks,
            *common,
            NUM_Q_HEADS=num_q_heads,
            GROUP=group,
            NUM_SPLITS=splits,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            BLOCK_G=max(16, triton.next_power_of_2(group)),
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            DOT_PRECISION=config["precision"],
            **flags,
            num_warps=decode_warps,
            num_stages=2,
        )
        if splits > 1:
            _decode_reduce_kernel[(nd, num_q_heads)](
                part_acc,
                part_m,
                part_l,
                md.seq_lens,
                sinks,
                out,
                window,
                out.stride(0),
                out.stride(1),
                NUM_Q_HEADS=num_q_heads,
                NUM_SPLITS=splits,
                HEAD_DIM=head_dim,
                BLOCK_S=triton.next_power_of_2(splits),
                BLOCK_D=block_d,
                BLOCK_N=block_n,
                USE_WINDOW=flags["USE_WINDOW"],
                USE_SINKS=flags["USE_SINKS"],
            )

    num_prefills = md.num_seqs - nd
    if num_prefills:
        block_m, block_n, warps, stages = config["prefill"]
        block_m = max(block_m, triton.next_power_of_2(group))  # at least one query token per tile
        block_q = block_m // group
        _prefill_kernel[(triton.cdiv(md.max_query_len, block_q), num_prefills, num_kv_heads)](
            q,
            k_cache,
            v_cache,
            md.block_tables,
            md.seq_lens,
            md.query_start_loc,
            out,
            sinks,
            nd,
            *common,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            BLOCK_M=block_m,
            BLOCK_Q=block_q,
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            DOT_PRECISION=config["precision"],
            **flags,
            num_warps=warps,
            num_stages=stages,
        )
    return out
