"""GGUF block types the kernels do not read, rewritten at load into blocks of a type they do.

llama.cpp's Q3_K, IQ4_NL, IQ4_XS and Q2_K files (the Q3_K_S/M/L, IQ4_* and Q2_K mixes) load this
way, each tensor's blocks rewritten in memory (not read from the file's map):

- Q3_K -> Q6_K, exactly: both are 16 groups of 16 with a signed sub-scale each and one float16
  d a block (Q3_K's 3-bit values -4..3 are Q6_K codes 28..35), so every weight dequantizes to the
  same float. 6.56 bits a weight instead of 3.44.
- IQ4_NL -> Q8_0, exactly: its codes index a table of int8 values under one float16 scale per
  32, which is a Q8_0 block. 8.5 bits instead of 4.5.
- IQ4_XS -> Q8_0: the table's values under d * (6-bit sub-scale - 32) per 32, that product
  rounded to float16 (at most 2^-11 of a group's scale). 8.5 bits instead of 4.25.
- Q2_K -> Q8_0: its groups of 16 carry their own minimum, which no kept type has, so each block is
  dequantized and quantized again as Q8_0 (an error of about half a step, 1/127 of each 32
  weights' largest, the step itself rounded to float16; Q2_K's own steps are a third of its
  groups' range). 8.5 bits instead of 2.625.

Layouts as ggml's (ggml-common.h): Q3_K is hmask[32] qs[64] scales[12] d, Q6_K ql[128] qh[64]
scales[16] d, IQ4_NL d qs[16], IQ4_XS d scales_h scales_l[4] qs[128], Q8_0 d qs[32].
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import IQ4_NL

from localchat.engine.loading.gguf_repack import byte_tensor
from localchat.kernels.cpu_extension import cpu_kernels

IQ4_VALUES = np.array(IQ4_NL.kvalues, dtype=np.int8)  # IQ4_NL's and IQ4_XS's code values
TRANSCODED = {T.Q3_K: T.Q6_K, T.IQ4_NL: T.Q8_0, T.IQ4_XS: T.Q8_0, T.Q2_K: T.Q8_0}


def transcode(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, T]:
    """raw (uint8 [rows, row bytes] of qtype's blocks) as uint8 [rows, row bytes] of
    TRANSCODED[qtype]'s blocks, and that type: the C++ version (kernels/csrc/gguf_transcode.h,
    the blocks shared between threads) where the CPU kernels are built, else numpy's below."""
    ext = cpu_kernels()
    if ext is not None:
        return ext.transcode_gguf(byte_tensor(raw), int(qtype)).numpy(), TRANSCODED[qtype]
    return transcode_reference(raw, qtype)


def transcode_reference(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, T]:
    """`transcode` in numpy."""
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, GGML_QUANT_SIZES[qtype][1])
    if qtype == T.Q3_K:
        out = _q3_k_as_q6_k(blocks)
    elif qtype == T.IQ4_NL:
        out = _q8_0_blocks(blocks[:, :2].copy().view(np.float16)[:, 0], _iq4_values(blocks[:, 2:]))
    elif qtype == T.IQ4_XS:
        out = _iq4_xs_as_q8_0(blocks)
    elif qtype == T.Q2_K:
        out = _requantized_q8_0(blocks, qtype)
    else:
        raise ValueError(f"no transcoding for {qtype.name}")
    return out.reshape(rows, -1), TRANSCODED[qtype]


def _q3_k_as_q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q3_K blocks [n, 110] as Q6_K blocks [n, 210] of the same values."""
    # (each field is copied out of the rows, and every operation below runs on whole contiguous
    # arrays: numpy's broadcasts over strided views and short inner axes ran ten times slower)
    hmask, qs, packed, d = (
        np.ascontiguousarray(blocks[:, a:b]) for a, b in ((0, 32), (32, 96), (96, 108), (108, 110))
    )
    n = blocks.shape[0]
    # weight 128 h + 32 j + i (i < 32) has low bits (qs[32 h + i] >> 2 j) & 3 and its high bit in
    # bit 4 h + j of hmask[i]; set, it counts as is, clear, 4 below. As a Q6_K code (value + 32):
    # low + 4 * high + 28, codes[j][:, h, i]
    codes = []
    for j in range(4):
        low = ((qs >> (2 * j)) & 3).reshape(n, 2, 32)
        high = np.stack([(hmask >> j) & 1, (hmask >> (4 + j)) & 1], axis=1)
        codes.append(low | (high << 2) + 28)
    # Q6_K: ql[64 h + l] holds code j = 0 (low nibble) and 2 (high), ql[64 h + 32 + l] j = 1 and
    # 3; qh[32 h + l] the top two bits of j = 0, 1, 2, 3 from bit 0 up
    ql = np.stack(
        [(codes[0] & 0xF) | (codes[2] << 4), (codes[1] & 0xF) | (codes[3] << 4)], axis=2
    ).reshape(n, 128)
    qh = (codes[0] >> 4) | (codes[1] >> 4 << 2) | (codes[2] >> 4 << 4) | (codes[3] >> 4 << 6)
    # sub-scale k: the low nibbles of bytes 0-7 for k < 8, their high nibbles after, with two top
    # bits each from bytes 8-11 (byte 8 + k % 4, bits 2 (k // 4) and up); Q6_K's are int8
    low4 = np.concatenate([packed[:, :8] & 0xF, packed[:, :8] >> 4], axis=1)
    top = packed[:, 8:12]
    top2 = np.concatenate([(top >> (2 * q)) & 3 for q in range(4)], axis=1)
    scales = (low4 | (top2 << 4)) - np.uint8(32)  # int8's bytes (wrapping as two's complement)
    return np.concatenate([ql, qh.reshape(n, 64), scales, d], axis=1)


def _iq4_values(qs: np.ndarray) -> np.ndarray:
    """The int8 values of IQ4 code bytes [n, 16] (weights j and j + 16 in byte j's low and high
    nibbles), [n, 32]."""
    return IQ4_VALUES[np.concatenate([qs & 0xF, qs >> 4], axis=1)]


def _q8_0_blocks(scales: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of int8 values [n, 32] under float16 scales [n]."""
    return np.concatenate(
        [scales.astype(np.float16).reshape(-1, 1).view(np.uint8), values.view(np.uint8)], axis=1
    )


def _iq4_xs_as_q8_0(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks [n, 136] as Q8_0 blocks [n * 8, 34]."""
    d = blocks[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
    high = blocks[:, 2:4].copy().view(np.uint16)[:, 0]
    low = blocks[:, 4:8]
    group = np.arange(8)
    sub = ((low[:, group // 2] >> (4 * (group % 2))) & 0xF) | (
        ((high[:, None] >> (2 * group)) & 3) << 4
    ).astype(np.uint8)
    scales = d[:, None] * (sub.astype(np.float32) - 32)  # as ggml forms each group's scale
    values = _iq4_values(blocks[:, 8:].reshape(-1, 16))
    return _q8_0_blocks(scales.reshape(-1), values)


def _requantized_q8_0(blocks: np.ndarray, qtype: T) -> np.ndarray:
    """qtype's blocks dequantized (gguf-py) and quantized again as Q8_0 blocks."""
    from gguf.quants import dequantize, quantize

    weights = dequantize(blocks.reshape(1, -1), qtype).reshape(-1, 32)
    return np.asarray(quantize(weights, T.Q8_0)).reshape(-1, 34)
