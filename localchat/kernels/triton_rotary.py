"""Triton kernel: rotary position embedding in the neox layout (rotate the two halves of
rotary_dim)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    stride_st,
    stride_sh,
    num_heads,
    cos,
    sin,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # All heads of one token: [BLOCK_H, BLOCK_HALF] tiles of each half, rotated with the token's
    # cos/sin.
    heads = tl.arange(0, BLOCK_H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (offs < HALF)
    src = src_ptr + token * stride_st + heads * stride_sh
    dst = dst_ptr + token * num_heads * HEAD_DIM + heads * HEAD_DIM  # the output is contiguous
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst + offs, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
    tl.store(dst + HALF + offs, (x2 * cos + x1 * sin).to(out_ty), mask=mask)
    if BLOCK_PASS > 0:  # partial rotary: dims past rotary_dim are copied through
        rest = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        rest_mask = (heads < num_heads) & (rest < HEAD_DIM)
        tl.store(dst + rest, tl.load(src + rest, mask=rest_mask), mask=rest_mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ct,
    stride_st,
    num_q_heads,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # One program per token handles q and k, so cos/sin are loaded once for all heads.
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    # cos/sin are rounded to the activation dtype first, as the reference does, then math is in
    # float32.
    act_ty = q_out_ptr.dtype.element_ty
    cos = (
        tl.load(cos_ptr + token * stride_ct + offs, mask=offs < HALF, other=0.0)
        .to(act_ty)
        .to(tl.float32)
    )
    sin = (
        tl.load(sin_ptr + token * stride_st + offs, mask=offs < HALF, other=0.0)
        .to(act_ty)
        .to(tl.float32)
    )
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        stride_qt,
        stride_qh,
        num_q_heads,
        cos,
        sin,
        HEAD_DIM,
        HALF,
        BLOCK_HQ,
        BLOCK_HALF,
        BLOCK_PASS,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        stride_kt,
        stride_kh,
        num_kv_heads,
        cos,
        sin,
        HEAD_DIM,
        HALF,
        BLOCK_HK,
        BLOCK_HALF,
        BLOCK_PASS,
    )


def rotary_embedding_triton(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox rotary on q [T, Hq, D] and k [T, Hkv, D] with cos/sin [T, rotary_dim // 2] (float32).

    q and k may be strided views into a fused qkv output (last dim contiguous); the results are new
    contiguous tensors of the same dtype, and dims past rotary_dim pass through unchanged.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = cos.shape[-1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens:
        pass_dims = head_dim - 2 * half
        _rotary_kernel[(num_tokens,)](
            q,
            k,
            q_out,
            k_out,
            cos,
            sin,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            sin.stride(0),
            num_q_heads,
            num_kv_heads,
            HEAD_DIM=head_dim,
            HALF=half,
            BLOCK_HQ=triton.next_power_of_2(num_q_heads),
            BLOCK_HK=triton.next_power_of_2(num_kv_heads),
            BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_PASS=triton.next_power_of_2(pass_dims) if pass_dims else 0,
        )
    return q_out, k_out
