"""Write this step's keys and values into their slots of the paged KV pool."""

from __future__ import annotations

import torch

from localchat.kernels.dispatch import use_triton


def store_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]; slot -1 = skip
    (padding)."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_flat.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_flat.index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def store_kv_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    if use_triton(key):
        from localchat.kernels.triton_kv_cache import store_kv_cache_triton

        store_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_cache_ref(key, value, k_cache, v_cache, slot_mapping)
