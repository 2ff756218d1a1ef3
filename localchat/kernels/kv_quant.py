"""Quantized KV pools: what a pool's dtype means, its bytes per row, and the torch reference of the
q8_0 rows (the C++ kernels in csrc/kv_rows.h and quant/*/kv_q8.h equal it).

`--kv-cache-dtype q8_0` (the CPU) keeps each KV head's row of head_dim values as llama.cpp's Q8_0
blocks: per 32 values a float16 scale d = max|x| / 127 and 32 int8 codes round(x / d) (to nearest
even), 34 bytes, so a row is 34 / 64 = 0.53 of float16's. The pool is an int8 tensor
[..., kv_heads, head_dim / 32 * 34] of those bytes, so `torch.int8` as a KV pool dtype means q8_0.
`--kv-cache-dtype fp8` (CUDA) stores float8 e4m3 values with a scale of 1.0, as vLLM's default.
"""

from __future__ import annotations

import torch

from localchat.errors import InvalidParameterError

Q8_0 = torch.int8  # the pool dtype that stands for q8_0 blocks
FP8 = torch.float8_e4m3fn
Q8_GROUP = 32  # values per block
Q8_BLOCK_BYTES = 34  # a float16 scale, then 32 int8 codes


def is_q8_0(pool: torch.Tensor | torch.dtype) -> bool:
    """Whether a KV pool (or pool dtype) holds q8_0 blocks."""
    return (pool if isinstance(pool, torch.dtype) else pool.dtype) == Q8_0


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The --kv-cache-dtype name of a pool dtype (q8_0, fp8, float16, ...)."""
    if dtype == Q8_0:
        return "q8_0"
    if dtype == FP8:
        return "fp8"
    return str(dtype).removeprefix("torch.")


def kv_row_width(dtype: torch.dtype, head_dim: int) -> int:
    """Elements of `dtype` per KV head row of head_dim values in the pool (the pool's last dim)."""
    if dtype == Q8_0:
        if head_dim % Q8_GROUP:
            raise ValueError(f"q8_0 needs a head_dim that is a multiple of 32, not {head_dim}")
        return head_dim // Q8_GROUP * Q8_BLOCK_BYTES
    return head_dim


def kv_row_bytes(dtype: torch.dtype, head_dim: int) -> int:
    """Bytes per KV head row of head_dim values in a pool of `dtype`."""
    return kv_row_width(dtype, head_dim) * torch.empty(0, dtype=dtype).element_size()


def check_pool_dtype(dtype: torch.dtype, device: torch.device, head_dim: int) -> None:
    """Refuse a quantized KV pool where no kernel reads it: q8_0 off the CPU or with a head_dim
    that is not a multiple of 32, fp8 off a CUDA GPU with float8 (compute capability 8.9+)."""
    name = kv_dtype_name(dtype)
    if dtype == Q8_0 and device.type != "cpu":
        raise InvalidParameterError(
            f"kv_cache_dtype q8_0 runs on the CPU only, not on {device.type}; use fp8 there",
            param="kv_cache_dtype",
        )
    if dtype == Q8_0 and head_dim % Q8_GROUP:
        raise InvalidParameterError(
            f"kv_cache_dtype q8_0 needs a head_dim that is a multiple of 32, and this model's is "
            f"{head_dim}; use float16",
            param="kv_cache_dtype",
        )
    if dtype == FP8 and (
        device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)
    ):
        where = "this GPU" if device.type == "cuda" else device.type
        raise InvalidParameterError(
            f"kv_cache_dtype {name} needs a CUDA GPU with float8 (compute capability 8.9+: Ada, "
            f"Hopper), not {where}; use q8_0 on the CPU",
            param="kv_cache_dtype",
        )


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """[..., D] float -> [..., D / 32 * 34] int8 q8_0 blocks (scale bytes, then the codes)."""
    blocks = x.float().unflatten(-1, (-1, Q8_GROUP))
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1.0 / scale, 0.0)
    codes = torch.round(blocks * inverse).to(torch.int8)
    scale_bytes = scale.to(torch.float16).view(torch.int8)  # [..., blocks, 2]
    return torch.cat((scale_bytes, codes), dim=-1).flatten(-2)


def dequantize_q8_0(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., D / 32 * 34] int8 q8_0 blocks -> [..., D] values (exact in float32: a 7-bit code
    times an 11-bit scale)."""
    blocks = rows.unflatten(-1, (-1, Q8_BLOCK_BYTES))
    scale = blocks[..., :2].contiguous().view(torch.float16).float()
    values = blocks[..., 2:].float() * scale
    return values.flatten(-2).to(dtype)
