"""Triton kernel: write this step's keys and values into their slots of the paged KV pool."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,  # key/value: token and head strides (dim stride 1)
    stride_cb,
    stride_cs,
    stride_ch,  # caches: block, slot-in-block and head strides
    HEAD_DIM: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per token copies all of its Hkv * D values; BLOCK is that width padded to a power
    # of two.
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < NUM_KV_HEADS * HEAD_DIM
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    src_k = token.to(tl.int64) * stride_kt + head * stride_kh + dim
    src_v = token.to(tl.int64) * stride_vt + head * stride_vh + dim
    dst = (
        (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + head * stride_ch + dim
    )
    k = tl.load(key_ptr + src_k, mask=mask)
    v = tl.load(value_ptr + src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value [T, Hkv, D] into caches [num_blocks, block_size, Hkv, D] at
    slot_mapping [T]; -1 = skip.

    key/value may be strided views (e.g. slices of a fused qkv output) as long as their last dim is
    contiguous.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    _store_kv_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HEAD_DIM=head_dim,
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK=triton.next_power_of_2(num_kv_heads * head_dim),
    )
