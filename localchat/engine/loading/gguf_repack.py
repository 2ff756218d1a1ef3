"""Repack GGUF (ggml) quantized blocks into PackedWeight layouts, keeping the file's integer codes.

ggml stores a quantized [out, in] tensor as rows of blocks; each block interleaves its scales with
its codes. We split them into one code array and float16 scale/min arrays
(kernels/packed_weight.py):

| ggml type | block (weights, bytes) | layout | value |
|---|---|---|---|
| Q4_0 | 32, 18 | u4 (q4_0: kept) | d * (q - 8) |
| Q4_1 | 32, 20 | u4 (q4_1: kept) | d * q + m |
| Q5_0 | 32, 22 | u8 (q5_0: kept) | d * (q - 16) |
| Q5_1 | 32, 24 | u8 (q5_1: kept) | d * q + m |
| Q8_0 | 32, 34 | u8 (q8_0: kept) | d * (q + 128 - 128) |
| Q4_K | 256, 144 | u4 (q4k: kept) | (d * sc) * q - dmin * mn, per 32 |
| Q5_K | 256, 176 | u8 (q5k: kept) | (d * sc) * q - dmin * mn, per 32 |
| Q6_K | 256, 210 | u6, group 16 (q6k: kept) | (d * sc) * (q - 32), per 16 |
| MXFP4 | 32, 17 | u8 (mxfp4: kept) | 2^(e - 128) * (v - 12), v = 2 * e2m1(q) + 12 |

Q4_0, Q4_1, Q5_x and Q8_0 repack exactly, and so do Q4_K and Q5_K, whose 6-bit sub-scales and
(d, dmin) pairs are kept as the file has them (the sub-scales in the file's 12 bits a group, packed
otherwise: packed_weight.py). For Q6_K, the product of the super-block scale and its 8-bit
sub-block scale is rounded to float16 (a relative error below 2^-11 on each group's scale). MXFP4's
E8M0 scale 2^(e - 128) is exact in float16 for e in 104-143 (real weights' range; outside it the
repack's scale rounds to 0 or inf, where the C++ kernels, which read the blocks, keep it exact).
Where the C++ kernels run (any ISA's, or the generic ones), no type is repacked: each stays in the
file's memory map as its own blocks (layouts q6k, q4k, q5k, q8_0, q4_0, q4_1, q5_0, q5_1 and mxfp4;
the one-group types only in rows of GROUP_BLOCKS_MIN_INPUTS inputs or more), and the kernels form
their scales as they form the repacked weights' (Q6_K's rounded the same way).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from localchat.engine.core.memory import huge_pages_wanted
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.packed_weight import (
    BLOCK_GROUPS,
    PackedWeight,
    k_blocks_repacked,
    mxfp4_blocks_to_u8,
    q4_blocks_to_u4,
    q5_blocks_to_u8,
    q6k_blocks_to_u6,
    q8_0_blocks_to_u8,
)
from localchat.kernels.quant_types import QUANT_TYPES

DENSE_TYPES = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}
# the quantized GGUF types, one record each in kernels/quant_types.py (kernels/csrc/quant/types.def)
QUANTIZED_TYPES = tuple(sorted((T(t.ggml_id) for t in QUANT_TYPES), key=int))
_TYPES = {T(t.ggml_id): t for t in QUANT_TYPES}


def byte_tensor(data: np.ndarray) -> torch.Tensor:
    """A uint8 tensor sharing `data`'s (read-only, memory-mapped) buffer; we never write to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(data).view(np.uint8))


# the types the C++ kernels read in the file's own blocks, and their layouts
FILE_BLOCK_TYPES = {qtype: t.layout for qtype, t in _TYPES.items()}
# The types of one group a block are read in their blocks from this many inputs a row on (a 1B
# model's and up). Shorter rows (a small model's, whose weights cost nothing to copy) keep the
# interleaved layout: measured on the Zen 5 EPYC (2026-12-05, two engines in one process,
# alternating), the default model's Q8_0 LM head (576 inputs) in its blocks made its decode 3%
# slower (332.9 against 343.6 tok/s), where an 8B-shaped Q8_0 GEMV read 5-9% faster on two threads.
GROUP_BLOCK_TYPES = tuple(q for q, t in _TYPES.items() if t.block_weights == t.group_size)
GROUP_BLOCKS_MIN_INPUTS = 2048


def repack(
    data: np.ndarray,
    qtype: T,
    shape: tuple[int, int],
    order: torch.Tensor | None = None,
    interleave: bool = False,
) -> PackedWeight:
    """A PackedWeight from one GGUF tensor's raw blocks; `shape` is (out, in) (numpy order). With
    `order`, output row r is the file's row order[r]; with `interleave`, it comes in the CPU
    kernel's interleaved layout when that kernel runs here. Runs the C++ repack
    (kernels/csrc/gguf_repack.h) when the CPU kernels are built, else the torch reference below; the
    two are equal bit for bit."""
    rows = shape[0]
    raw = byte_tensor(data).reshape(rows, -1)
    ext = cpu_kernels()
    if ext is None:
        weight = repack_reference(raw, qtype, rows)
        return weight if order is None else weight.select_rows(order)
    if qtype not in QUANTIZED_TYPES:
        raise NotImplementedError(f"GGUF tensor type {qtype.name} is not supported")
    # the C++ kernels read these types in the file's blocks (the one-group types in long rows)
    in_blocks = qtype not in GROUP_BLOCK_TYPES or shape[1] >= GROUP_BLOCKS_MIN_INPUTS
    if qtype in FILE_BLOCK_TYPES and interleave and in_blocks:
        return file_blocks_weight(raw if order is None else raw[order], qtype)
    parts = ext.repack_gguf(raw, int(qtype), order, interleave, huge_pages_wanted())
    kind = _TYPES[qtype]
    return PackedWeight(
        kind.repacked,
        parts[0],
        parts[1],
        parts[2] if len(parts) >= 3 else None,
        kind.group_size,
        zero_point=kind.zero_point,
        source_type=qtype.name,
        super_scales=parts[3] if len(parts) == 4 else None,
        interleaved=interleave,
    )


def file_blocks_weight(blocks: torch.Tensor, qtype: T) -> PackedWeight:
    """Q6_K, Q4_K, Q5_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or MXFP4 blocks [rows, row bytes] as a
    PackedWeight that keeps them (FILE_BLOCK_TYPES' layout): what the C++ kernels read
    (kernels/csrc/quant/: each type's block functions in generic/blocks.h). With the file's memory
    map as `blocks`, loading neither copies nor repacks the tensor."""
    scales = torch.empty((blocks.shape[0], 0), dtype=torch.float16)
    layout = FILE_BLOCK_TYPES[qtype]
    group, zero_point = BLOCK_GROUPS[layout]
    return PackedWeight(layout, blocks, scales, None, group, zero_point, source_type=qtype.name)


def repack_reference(raw: torch.Tensor, qtype: T, rows: int) -> PackedWeight:
    """The torch version of `repack`: raw is the tensor's blocks as uint8 [rows, row bytes]."""
    if qtype in (T.Q4_0, T.Q4_1):
        codes, scales, mins = q4_blocks_to_u4(raw, qtype == T.Q4_1)
        zero_point = 8 if mins is None else 0
        return PackedWeight("u4", codes, scales, mins, 32, zero_point, source_type=qtype.name)
    if qtype == T.Q8_0:
        codes, scales = q8_0_blocks_to_u8(raw)  # int8 q + 128 as an unsigned byte
        return PackedWeight("u8", codes, scales, None, 32, zero_point=128, source_type="Q8_0")
    if qtype in (T.Q5_0, T.Q5_1):
        codes, scales, mins = q5_blocks_to_u8(raw, qtype == T.Q5_1)
        zero_point = 16 if mins is None else 0
        return PackedWeight("u8", codes, scales, mins, 32, zero_point, source_type=qtype.name)
    if qtype in (T.Q4_K, T.Q5_K):
        five = qtype == T.Q5_K
        codes, scales, mins, supers = k_blocks_repacked(raw, five)
        layout = "u8" if five else "u4"
        return PackedWeight(
            layout, codes, scales, mins, 32, source_type=qtype.name, super_scales=supers
        )
    if qtype == T.Q6_K:
        qweight, scales = q6k_blocks_to_u6(raw)
        return PackedWeight("u6", qweight, scales, None, 16, zero_point=32, source_type="Q6_K")
    if qtype == T.MXFP4:
        codes, scales = mxfp4_blocks_to_u8(raw)  # doubled E2M1 values + 12
        return PackedWeight("u8", codes, scales, None, 32, zero_point=12, source_type="MXFP4")
    raise NotImplementedError(f"GGUF tensor type {qtype.name} is not supported")


def dense(data: np.ndarray, qtype: T, shape: tuple[int, ...]) -> torch.Tensor:
    """An F32/F16/BF16 tensor as a torch tensor of its own dtype (a copy: the mapped file is
    read-only)."""
    dtype = DENSE_TYPES[qtype]
    return byte_tensor(data).view(dtype).reshape(shape).clone()
