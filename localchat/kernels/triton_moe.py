"""Triton kernels: the fused mixture-of-experts MLP of stacked experts (see kernels/moe.py).

Three launches and a few small torch ops, whatever the number of experts, with shapes that depend
only on (tokens, top_k, experts), so a decode step runs inside a CUDA graph:

1. ``moe_align_block_size`` (torch ops on the device, no host sync): the T * k (token, slot) pairs
   sorted by expert, each expert's run padded to a multiple of BLOCK_M with a sentinel pair, the
   expert of every BLOCK_M block, and the padded total. The buffers are sized for the worst case,
   T * k + min(E, T * k) * (BLOCK_M - 1) rows; blocks past the total exit at once.
2. ``_moe_gate_up_kernel``: a grouped GEMM. A program takes one block of pairs (all one expert's)
   and BLOCK_N columns of the expert's width, gathers its tokens' rows of hidden, and multiplies
   them by the matching BLOCK_N gate rows and BLOCK_N up rows of w13[e] (two float32
   accumulators sharing each loaded activation tile), adds the bias, and applies act(gate) * up
   in registers, rounding where the reference (a projection, then act_and_mul) rounds. It writes
   the [T * k, W] activations in pair order, in hidden's dtype: the only intermediate in memory.
3. ``_moe_down_kernel``: the same grouped GEMM over the activations and w2[e], plus the bias,
   times the pair's routing weight, into float32 [T * k, H].
4. ``_moe_sum_kernel``: each token's k rows added in slot order (deterministic: no atomics) and
   cast to hidden's dtype.

Programs are ordered GROUP_M blocks at a time per column tile, so consecutive programs of one
expert read the same weight tile from L2. Pointer offsets that multiply a row by a stride are
int64 (E * 2W * H passes 2^31 in large models). Columns past the width and the sentinel pairs read
valid rows (indices wrapped or clamped) and are masked when stored, so the inner loop masks only a
K tail.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from localchat.kernels.moe import check_moe_shapes
from localchat.kernels.triton_activation import _ACTIVATIONS, gated_activation

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _tile(pid, tiles_n, GROUP_M: tl.constexpr):
    """(block of pairs, column tile) of program `pid`: GROUP_M blocks per column tile in turn."""
    tiles_m = tl.num_programs(0) // tiles_n
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows_in_group, (pid % per_group) // rows_in_group


@triton.jit
def _block_of_pairs(
    sorted_pairs_ptr,
    block_experts_ptr,
    pid_m,
    pid_n,
    num_pairs,
    N,
    PAIRS_PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """A program's expert (int64), pairs, which of them are real (not padding), the input rows
    they read (pair // PAIRS_PER_ROW, row 0 for padding), its output columns and the weight rows
    those read (wrapped into [0, N))."""
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = tl.where(valid, pairs // PAIRS_PER_ROW, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return expert, pairs, valid, rows, offs_n, (offs_n % N).to(tl.int64)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_be,
    stride_om,
    limit,
    alpha,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # x [T, K]; w [E, 2N, K] (gate rows, then up rows); out [T * TOP_K, N]: act(gate) * up
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    # columns past N recompute column n % N and are not stored; padding pairs recompute row 0
    expert, pairs, valid, rows, offs_n, offs_w = _block_of_pairs(
        sorted_pairs_ptr, block_experts_ptr, pid_m, pid_n, num_pairs, N, TOP_K, BLOCK_M, BLOCK_N
    )
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    w_base = w_ptr + expert * stride_we
    g_ptrs = w_base + offs_w[None, :] * stride_wn + offs_k[:, None]
    u_ptrs = w_base + (offs_w + N)[None, :] * stride_wn + offs_k[:, None]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            xs = tl.load(x_ptrs)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:
            inside = offs_k < K - kb * BLOCK_K
            xs = tl.load(x_ptrs, mask=inside[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=inside[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=inside[:, None], other=0.0)
        acc_g = tl.dot(xs, g, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(xs, u, acc_u, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_w
        acc_g += tl.load(b_ptrs).to(tl.float32)[None, :]
        acc_u += tl.load(b_ptrs + N).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    # round as the reference does: the projection's output, then act(gate), in the model's dtype
    act, up = gated_activation(
        acc_g.to(dtype).to(tl.float32), acc_u.to(dtype).to(tl.float32), limit, alpha, ACT
    )
    out = act.to(dtype).to(tl.float32) * up
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, out.to(dtype), mask=valid[:, None] & (offs_n < N)[None, :])


@triton.jit
def _moe_down_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    weights_ptr,
    out_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_be,
    stride_om,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # x [T * TOP_K, K] (the activations, a row per pair); w [E, N, K]; weights [T * TOP_K];
    # out [T * TOP_K, N] float32: weight * (x @ w[e].T + bias[e])
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert, pairs, valid, rows, offs_n, offs_w = _block_of_pairs(
        sorted_pairs_ptr, block_experts_ptr, pid_m, pid_n, num_pairs, N, 1, BLOCK_M, BLOCK_N
    )
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_w[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            xs = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            inside = offs_k < K - kb * BLOCK_K
            xs = tl.load(x_ptrs, mask=inside[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=inside[:, None], other=0.0)
        acc = tl.dot(xs, w, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + offs_w).to(tl.float32)[None, :]
    # the expert's output in the model's dtype (as its down projection gives it), then weighted
    down = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    scale = tl.load(weights_ptr + rows).to(tl.float32)
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, down * scale[:, None], mask=valid[:, None] & (offs_n < N)[None, :])


@triton.jit
def _moe_sum_kernel(
    part_ptr, out_ptr, N, stride_pm, stride_om, TOP_K: tl.constexpr, BLOCK: tl.constexpr
):
    # out[t] = sum over j of part[t * TOP_K + j], in slot order, cast to out's dtype
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(part_ptr + (token * TOP_K + j) * stride_pm + cols, mask=mask, other=0.0)
    tl.store(out_ptr + token * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def moe_align_block_size(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, slot) pairs of ids [T, k] grouped by expert for blocks of `block_m` rows:
    (sorted_pairs int32 [blocks * block_m]: pair index t * k + j, each expert's in token order,
    padded with the sentinel T * k to a multiple of block_m; block_experts int32 [blocks]: the
    expert of each block; num_padded int64 [1]: the rows in use). `blocks` covers the worst case,
    so it depends only on the shapes; no value is read back to the host."""
    flat = ids.reshape(-1).to(torch.int64)
    pairs, device = flat.numel(), flat.device
    blocks = triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.sort(flat, stable=True).indices
    experts = flat[order]
    rank = torch.arange(pairs, device=device) - (counts.cumsum(0) - counts)[experts]
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs[(ends - padded)[experts] + rank] = order.to(torch.int32)
    starts = torch.arange(blocks, device=device) * block_m
    block_experts = torch.searchsorted(ends, starts, right=True).clamp_(max=num_experts - 1)
    return sorted_pairs, block_experts.to(torch.int32), ends[-1:]


def _launch_config(pairs: int, experts: int, dtype: torch.dtype, on_gpu: bool) -> dict:
    """BLOCK_M, each GEMM's (BLOCK_N, BLOCK_K, warps, stages) and the dot precision, from the
    shapes only (a CUDA graph's launches stay valid). Untuned on hardware: BLOCK_M follows the
    rows an expert gets on average (a decode's 16-row tile, tl.dot's least, up to 64 for a
    prefill); the gate/up kernel's BLOCK_N feeds two accumulators. On the interpreter, small
    tiles make the tests' shapes cross tile and K boundaries."""
    if not on_gpu:
        return {
            "block_m": 16,
            "gate_up": (16, 32, 4, 1),
            "down": (16, 32, 4, 1),
            "precision": "ieee",
        }
    narrow = 2 if dtype == torch.float32 else 1  # float32 tiles take half the K
    per_expert = pairs / experts
    if per_expert <= 16:  # decode: memory-bound, long K steps
        block_m, gate_up, down = 16, (64, 128, 4, 4), (64, 128, 4, 4)
    elif per_expert <= 64:
        block_m, gate_up, down = 32, (64, 64, 4, 4), (64, 64, 4, 4)
    else:  # prefill: compute-bound tiles
        block_m, gate_up, down = 64, (64, 64, 4, 3), (128, 64, 8, 3)
    return {
        "block_m": block_m,
        "gate_up": (gate_up[0], gate_up[1] // narrow, *gate_up[2:]),
        "down": (down[0], down[1] // narrow, *down[2:]),
        "precision": "tf32x3" if dtype == torch.float32 else "tf32",  # 3xTF32: float32 accuracy
    }


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def fused_moe_triton(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    activation: str = "silu",
    limit: float = 7.0,
    alpha: float = 1.702,
) -> torch.Tensor:
    """kernels/moe.fused_moe_ref's result, by the kernels above: hidden [T, H] (float16, bfloat16
    or float32; the weights in its dtype), weights and ids [T, k], w13 [E, 2W, H], w2 [E, H, W],
    b13 [E, 2W], b2 [E, H]. Returns a new [T, H] tensor."""
    check_moe_shapes(hidden, weights, ids, w13, w2, b13, b2)
    if hidden.dtype not in DTYPES or w13.dtype != hidden.dtype or w2.dtype != hidden.dtype:
        raise ValueError(
            f"hidden and the expert weights must share a float16, bfloat16 or float32 dtype, got "
            f"{hidden.dtype}, {w13.dtype} and {w2.dtype}"
        )
    tokens, size = hidden.shape
    top_k, experts, width = ids.shape[1], w13.shape[0], w2.shape[2]
    out = torch.empty((tokens, size), dtype=hidden.dtype, device=hidden.device)
    if tokens == 0 or top_k == 0:
        return out.zero_()
    x = _last_dim_contiguous(hidden)
    w13, w2 = _last_dim_contiguous(w13), _last_dim_contiguous(w2)
    pairs = tokens * top_k
    c = _launch_config(pairs, experts, hidden.dtype, hidden.device.type == "cuda")
    block_m = c["block_m"]
    sorted_pairs, block_experts, num_padded = moe_align_block_size(ids, experts, block_m)
    tiles_m = block_experts.numel()
    common = dict(BLOCK_M=block_m, GROUP_M=8, DOT_PRECISION=c["precision"])

    activated = torch.empty((pairs, width), dtype=hidden.dtype, device=hidden.device)
    block_n, block_k, warps, stages = c["gate_up"]
    _moe_gate_up_kernel[(tiles_m * triton.cdiv(width, block_n),)](
        x,
        w13,
        w13 if b13 is None else _last_dim_contiguous(b13),
        activated,
        sorted_pairs,
        block_experts,
        num_padded,
        pairs,
        width,
        size,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        0 if b13 is None else b13.stride(0),
        activated.stride(0),
        float(limit),
        float(alpha),
        TOP_K=top_k,
        ACT=_ACTIVATIONS[activation],
        HAS_BIAS=b13 is not None,
        EVEN_K=size % block_k == 0,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
        **common,
    )

    weighted = torch.empty((pairs, size), dtype=torch.float32, device=hidden.device)
    block_n, block_k, warps, stages = c["down"]
    _moe_down_kernel[(tiles_m * triton.cdiv(size, block_n),)](
        activated,
        w2,
        w2 if b2 is None else _last_dim_contiguous(b2),
        weights.reshape(-1).contiguous(),
        weighted,
        sorted_pairs,
        block_experts,
        num_padded,
        pairs,
        size,
        width,
        activated.stride(0),
        w2.stride(0),
        w2.stride(1),
        0 if b2 is None else b2.stride(0),
        weighted.stride(0),
        HAS_BIAS=b2 is not None,
        EVEN_K=width % block_k == 0,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
        **common,
    )

    block = min(1024, triton.next_power_of_2(size))
    _moe_sum_kernel[(tokens, triton.cdiv(size, block))](
        weighted, out, size, weighted.stride(0), out.stride(0), TOP_K=top_k, BLOCK=block
    )
    return out
