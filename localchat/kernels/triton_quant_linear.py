"""Triton kernel: x @ W.T (+ bias) for a PackedWeight (W4A16 / W8A16), dequantizing inside the GEMM.

The dense weight is never materialised: each tile loads the uint8 codes, unpacks them, applies the
group's float16 scale and min (or zero point) in float32 and feeds the result, in x's dtype, to
tl.dot with a float32 accumulator. Device memory per parameter, as the weight is stored
(PackedWeight.nbytes):

- ``u4`` (Q4_0, Q4_1, Q4_K, int4): 0.5 byte of code + 4 bytes of scale and min per 32 weights =
  0.625 B (0.5625 B when symmetric). A 70B Llama in u4 is about 44 GB; Q4_K_M, whose Q6_K tensors
  (about a sixth of the weights) reach the GPU as ``u8``, about 50 GB: either fits on one 141 GB
  H200 with room for the KV cache.
- ``u8`` (Q8_0, Q5_*, int8, and Q6_K, whose 6-bit ``u6`` codes move to the GPU a byte each): 1 byte
  + 2 (symmetric) or 4 bytes per group = 1.0625 to 1.125 B.

Packed u4 bytes hold weights j and j + 16 of a 32-group. Rather than interleaving the nibbles back
into order, the kernel splits the reduction: low nibbles meet the x columns g*32 + j, high nibbles
g*32 + 16 + j, so one K step is two dots over half as many columns, and no register shuffle is
needed.

Small M (decode) uses 16-row tiles and split-K so the GPU has enough programs to read the weight at
memory speed; the float32 partial sums are added, the bias applied and the result cast by a second
small kernel.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from localchat.kernels.packed_weight import PackedWeight

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _dequant(q, s_ptrs, m_ptrs, mask, zero_point, HAS_MINS: tl.constexpr):
    """Float32 weights from integer codes and the (gathered) group scale and min of each element."""
    scale = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        return q.to(tl.float32) * scale + tl.load(m_ptrs, mask=mask, other=0.0).to(tl.float32)
    return (q.to(tl.int32) - zero_point).to(tl.float32) * scale


@triton.jit
def _quant_linear_kernel(
    x_ptr,
    q_ptr,
    scales_ptr,
    mins_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_om,
    stride_os,
    zero_point,
    blocks_per_split,
    U4: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_MINS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Programs that run together share weight tiles (GROUP_M row tiles per column tile) for L2
    # reuse.
    pid, split = tl.program_id(0), tl.program_id(1)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    q_rows = q_ptr + offs_n.to(tl.int64)[:, None] * stride_qn
    s_rows = scales_ptr + offs_n.to(tl.int64)[:, None] * stride_sn
    m_rows = mins_ptr + offs_n.to(tl.int64)[:, None] * stride_sn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_blocks = tl.cdiv(K, BLOCK_K)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, k_blocks)
    for kb in range(first, last):
        if U4:
            # Byte p of the row holds weights k_lo = (p // 16) * 32 + p % 16 (low nibble)
            # and k_lo + 16 (high).
            p = kb * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
            k_lo = (p // 16) * 32 + p % 16
            valid = k_lo < K  # K is a multiple of 32: a group is wholly in or out
            w_mask = mask_n[:, None] & valid[None, :]
            x_mask = mask_m[:, None] & valid[None, :]
            packed = tl.load(q_rows + p[None, :], mask=w_mask, other=0)
            g = (p // 16)[None, :]
            lo = _dequant(packed & 0x0F, s_rows + g, m_rows + g, w_mask, zero_point, HAS_MINS)
            hi = _dequant(packed >> 4, s_rows + g, m_rows + g, w_mask, zero_point, HAS_MINS)
            x_lo = tl.load(x_rows + k_lo[None, :], mask=x_mask, other=0.0)
            x_hi = tl.load(x_rows + (k_lo + 16)[None, :], mask=x_mask, other=0.0)
            acc = tl.dot(x_lo, tl.trans(lo.to(x_lo.dtype)), acc, input_precision=DOT_PRECISION)
            acc = tl.dot(x_hi, tl.trans(hi.to(x_hi.dtype)), acc, input_precision=DOT_PRECISION)
        else:
            k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            valid = k < K
            w_mask = mask_n[:, None] & valid[None, :]
            codes = tl.load(q_rows + k[None, :], mask=w_mask, other=0)
            g = (k // GROUP)[None, :]
            w = _dequant(codes, s_rows + g, m_rows + g, w_mask, zero_point, HAS_MINS)
            xs = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & valid[None, :], other=0.0)
            acc = tl.dot(xs, tl.trans(w.to(xs.dtype)), acc, input_precision=DOT_PRECISION)

    out_mask = mask_m[:, None] & mask_n[None, :]
    out_ptrs = (
        out_ptr
        + split.to(tl.int64) * stride_os
        + offs_m.to(tl.int64)[:, None] * stride_om
        + offs_n[None, :]
    )
    if PARTIAL:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_splits_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    N,
    stride_pm,
    stride_ps,
    stride_om,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Sums the split-K partials in a fixed order (deterministic, unlike atomics), adds the bias,
    # casts.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + s * stride_ps + row * stride_pm + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _tiles(m: int, on_gpu: bool, u4: bool, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) for m rows. Untuned on hardware; chosen so that
    the sm_90 builds spill no registers for 16-bit activations (the test builds them).

    A K step reads the same bytes of code in both layouts (twice the weights in u4); float32 halves
    it. On the CPU interpreter, small tiles make short test shapes cross tile boundaries.
    """
    if not on_gpu:
        return 16, 32, 64, 4, 1
    block_k = (128 if u4 else 64) // (2 if dtype == torch.float32 else 1)
    if m <= 16:  # decode: a 16-row tile (tl.dot's minimum), many programs via split-K
        return 16, 64, block_k, 4, 4
    if m <= 64:
        return 64, 64, block_k, 4, 4
    return 128, 128, block_k // 2 if u4 else block_k, 8, 3  # prefill: a compute-bound GEMM tile


def _launch_config(
    m: int, n: int, k: int, u4: bool, dtype: torch.dtype, device: torch.device
) -> dict:
    """Tiles, dot precision and split-K for an [m, k] x [k, n] product.

    Depends only on the shapes, so a CUDA graph captured for a batch size stays valid. Splits K (at
    most 16 ways) until the GPU has enough programs; on the interpreter, until there are 4, to
    exercise the reduction.
    """
    on_gpu = device.type == "cuda"
    block_m, block_n, block_k, warps, stages = _tiles(m, on_gpu, u4, dtype)
    if on_gpu:
        precision = "tf32x3" if dtype == torch.float32 else "tf32"  # 3xTF32: about float32 accuracy
        # Small M is memory-bound: several programs per SM keep loads in flight. A prefill tile is
        # compute-bound, and splitting K would only add float32 traffic once every SM has a tile.
        per_sm = 4 if m <= 64 else 1
        target = per_sm * _num_sms(
            device.index if device.index is not None else torch.cuda.current_device()
        )
    else:
        precision, target = "ieee", 4
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, block_k)
    splits = max(1, min(16, k_blocks, target // tiles)) if tiles < target else 1
    blocks_per_split = triton.cdiv(k_blocks, splits)
    splits = triton.cdiv(k_blocks, blocks_per_split)  # no empty split
    return {
        "block_m": block_m,
        "block_n": block_n,
        "block_k": block_k,
        "warps": warps,
        "stages": stages,
        "precision": precision,
        "splits": splits,
        "blocks_per_split": blocks_per_split,
    }


def triton_quant_linear(
    x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] (float16, bfloat16 or float32) @ weight.dequantize().T (+ bias [N]) -> [..., N] in
    x.dtype.

    weight is a PackedWeight [N, K] on x's device; the product accumulates in float32. Any M
    (leading dims flattened), any N, K as the weight's.
    """
    out_features, in_features = weight.shape
    if x.dtype not in DTYPES:
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[-1] != in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {in_features}")
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError("x, the weight and the bias must be on one device")
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise ValueError(f"bias must have shape ({out_features},), got {tuple(bias.shape)}")
    x2 = x.reshape(-1, in_features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty((m, out_features), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*x.shape[:-1], out_features)
    qweight, scales = weight.qweight.contiguous(), weight.scales.contiguous()
    mins = scales if weight.mins is None else weight.mins.contiguous()  # unused when mins is None
    bias_arg = out if bias is None else bias.contiguous()  # unused when bias is None
    c = _launch_config(m, out_features, in_features, weight.layout == "u4", x.dtype, x.device)
    splits = c["splits"]
    target = (
        torch.empty((splits, m, out_features), dtype=torch.float32, device=x.device)
        if splits > 1
        else out
    )
    grid = (triton.cdiv(m, c["block_m"]) * triton.cdiv(out_features, c["block_n"]), splits)
    _quant_linear_kernel[grid](
        x2,
        qweight,
        scales,
        mins,
        bias_arg,
        target,
        m,
        out_features,
        in_features,
        x2.stride(0),
        qweight.stride(0),
        scales.stride(0),
        target.stride(-2),
        target.stride(0) if splits > 1 else 0,
        weight.zero_point,
        c["blocks_per_split"],
        U4=weight.layout == "u4",
        GROUP=weight.group_size,
        HAS_MINS=weight.mins is not None,
        HAS_BIAS=bias is not None,
        PARTIAL=splits > 1,
        BLOCK_M=c["block_m"],
        BLOCK_N=c["block_n"],
        BLOCK_K=c["block_k"],
        GROUP_M=8,
        DOT_PRECISION=c["precision"],
        num_warps=c["warps"],
        num_stages=c["stages"],
    )
    if splits > 1:
        block = min(1024, triton.next_power_of_2(out_features))
        _reduce_splits_kernel[(m, triton.cdiv(out_features, block))](
            target,
            bias_arg,
            out,
            out_features,
            target.stride(1),
            target.stride(0),
            out.stride(0),
            SPLITS=splits,
            HAS_BIAS=bias is not None,
            BLOCK=block,
            num_warps=4,
        )
    return out.view(*x.shape[:-1], out_features)
