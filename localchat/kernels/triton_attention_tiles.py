"""The device functions both paged attention kernels (triton_attention.py) are made of: gathering
K/V tiles from the block pool, folding a key tile into the online softmax (with the optional score
softcap), and adding the sinks to the softmax sums. Scores are in the log2 domain (exp2)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_rows(
    ptrs, n_mask, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_N: tl.constexpr
):
    """A [BLOCK_N, BLOCK_D] tile of rows (zeros where masked)."""
    if MASK_N:
        tile = tl.load(ptrs, mask=n_mask[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    elif BLOCK_D != HEAD_DIM:
        tile = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def load_kv_tiles(
    k_cache_ptr,
    v_cache_ptr,
    block_table_row_ptr,
    offs_n,
    n_mask,
    kv_head,
    offs_d,
    stride_cb,
    stride_cs,
    stride_ch,
    dtype,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASK_N: tl.constexpr,
):
    """Gather the [BLOCK_N, BLOCK_D] K and V rows of tokens offs_n from their pages (zeros where
    masked), as `dtype`."""
    if MASK_N:
        page = tl.load(block_table_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
    else:
        page = tl.load(block_table_row_ptr + offs_n // BLOCK_SIZE)
    # int64: page * stride overflows int32 in large pools.
    rows = page.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
    offsets = rows[:, None] + offs_d[None, :]
    k = _load_rows(k_cache_ptr + offsets, n_mask, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
    v = _load_rows(v_cache_ptr + offsets, n_mask, offs_d, HEAD_DIM, BLOCK_D, MASK_N)
    return k.to(dtype), v.to(dtype)


@triton.jit
def tanh(x):
    """tanh for float32, a rational approximation (Eigen's, within 4e-7 relative): portable to
    every backend and to the interpreter, unlike libdevice's."""
    x = tl.minimum(tl.maximum(x, -7.90531110763549805), 7.90531110763549805)
    x2 = x * x
    p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13
    p = p * x2 + -8.60467152213735e-11
    p = p * x2 + 5.12229709037114e-08
    p = p * x2 + 1.48572235717979e-05
    p = p * x2 + 6.37261928875436e-04
    p = p * x2 + 4.89352455891786e-03
    q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04
    q = q * x2 + 2.26843463243900e-03
    q = q * x2 + 4.89352518554385e-03
    return x * p / q


@triton.jit
def fold_sinks(acc, m_i, l_i, sink):
    """Add each row's sink logit (natural log) to its softmax sum as a key with no value."""
    sink = sink * 1.4426950408889634  # the log2 domain
    m_new = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.math.exp2(sink - m_new)


@triton.jit
def online_softmax_step(
    acc,
    m_i,
    l_i,
    q,
    k,
    v,
    qk_scale,
    softcap,
    score_mask,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold one key tile into the running (acc, row max m_i, row sum l_i), all float32, log2
    domain. With SOFTCAP, softcap is the cap times log2(e): c tanh(s / c) in the log2 domain."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if SOFTCAP:
        s = softcap * tanh(s / softcap)
    if MASKED:
        s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with no visible key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i
