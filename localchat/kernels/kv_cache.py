"""Write this step's keys and values into their slots of the paged KV pool."""

from __future__ import annotations

import torch

from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.kv_quant import FP8, is_q8_0, quantize_q8_0


def store_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D] (a q8_0 pool: int8 rows of
    D / 32 blocks, kernels/kv_quant.py); slot -1 = skip (padding)."""
    num_kv_heads, row = key.shape[1], k_cache.shape[-1]
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    if is_q8_0(k_cache):
        key, value = quantize_q8_0(key), quantize_q8_0(value)
    else:
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    if k_cache.dtype == FP8:  # index_copy_ takes no float8: its bytes instead
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        key, value = key.view(torch.uint8), value.view(torch.uint8)
    k_cache.view(-1, num_kv_heads, row).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, row).index_copy_(0, slot_mapping, value)


def store_kv_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    if is_q8_0(k_cache):  # the CPU's: quantized in C++ where the kernels are built
        ext = cpu_kernels() if key.device.type == "cpu" else None
        if ext is not None:
            ext.store_kv_q8_0(key, value, k_cache, v_cache, slot_mapping)
        else:
            store_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)
    elif use_triton(key):
        from localchat.kernels.triton_kv_cache import store_kv_cache_triton

        store_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)
