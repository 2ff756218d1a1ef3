"""Kernels: each op has a torch reference (CPU) and a Triton kernel (CUDA) with the same
signature."""

from localchat.kernels.activation import silu_and_mul
from localchat.kernels.attention import paged_attention
from localchat.kernels.kv_cache import store_kv_cache
from localchat.kernels.norm import rms_norm
from localchat.kernels.rotary import rotary_embedding

__all__ = ["paged_attention", "rms_norm", "rotary_embedding", "silu_and_mul", "store_kv_cache"]
