"""The CPU fast path for a batch of decodes: rotary, KV store and paged attention in one C++ call
per layer (kernels/csrc/decode_attention.h). It applies only to all-decode float32 batches on the
CPU over a float32, float16, bfloat16 or q8_0 KV pool (kernels/kv_quant.py: the int8 codes read as
they are); everything else takes the per-op path
(kernels/rotary.py, kv_cache.py, attention.py), which it must equal, options included (a sliding
window, whose keys alone are read; a softcap on the scores; sinks)."""

from __future__ import annotations

import torch

from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.attention_options import check_options
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.kv_quant import Q8_0


def fused_decode_attention(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    md: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Attention output [T, num_heads * head_dim] for an all-decode batch, or None when the fast
    path does not apply (the caller then runs the per-op path). `qkv` is rotated in place.
    sliding_window, softcap and sinks [num_heads] as paged_attention takes them."""
    check_options(sliding_window, softcap, sinks, num_heads)
    if (
        qkv.device.type != "cpu"
        or qkv.dtype != torch.float32
        or k_cache.dtype not in (torch.float32, torch.float16, torch.bfloat16, Q8_0)
        or md.num_decodes != qkv.shape[0]
        or use_triton(qkv)
    ):
        return None
    ext = cpu_kernels()
    if ext is None:
        return None
    return ext.decode_attention(
        qkv,
        k_cache,
        v_cache,
        cos,
        sin,
        md.slot_mapping,
        md.block_tables,
        md.seq_lens,
        num_heads,
        num_kv_heads,
        head_dim,
        scale,
        sliding_window or 0,
        softcap or 0.0,
        None if sinks is None else sinks.to(torch.float32).contiguous(),
    )
