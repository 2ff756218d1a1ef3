"""Triton kernels: the fused mixture-of-experts MLP of stacked experts (see kernels/moe.py).

Three launches and a few small torch ops, whatever the number of experts, with shapes that depend
only on (tokens, top_k, experts), so a decode step runs inside a CUDA graph:

1. ``moe_align_block_size`` (torch ops on the device, no host sync): the T * k (token, slot) pairs
   sorted by expert, each expert's run padded to a multiple of BLOCK_M with a sentinel pair, the
   expert of every BLOCK_M block, and the padded total. The buffers are sized for the worst case,
   T * k + min(E, T * k) * (BLOCK_M - 1) rows; blocks past the total exit at once.
2. ``_moe_gemm_kernel``, GATED: a grouped GEMM. A program takes one block of pairs (all one
   expert's) and BLOCK_N columns of the expert's width, gathers its tokens' rows of hidden, and
   multiplies them by the matching BLOCK_N gate rows and BLOCK_N up rows of w13[e] (two float32
   accumulators sharing each loaded activation tile), adds the bias, and applies act(gate) * up
   in registers, rounding where the reference (a projection, then act_and_mul) rounds. It writes
   the [T * k, W] activations in pair order, in hidden's dtype: the only intermediate in memory.
3. ``_moe_gemm_kernel``, not GATED: the same grouped GEMM over the activations and w2[e], plus the
   bias, times the pair's routing weight, into float32 [T * k, H].
4. ``_moe_sum_kernel``: each token's k rows added in slot order (deterministic: no atomics) and
   cast to hidden's dtype.

Quantized experts (PackedExperts, u4 or u8) are dequantized tile by tile inside the GEMMs.
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

from localchat.kernels.moe_experts import Experts, PackedExperts, check_moe_shapes
from localchat.kernels.triton_activation import _ACTIVATIONS, gated_activation
from localchat.kernels.triton_quant_linear import _dequant

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
def _k_step(kb, K, QUANT: tl.constexpr, BLOCK_K: tl.constexpr):
    """K step kb's activation columns (u4: those of the low nibbles, the high ones are 16 on), the
    byte of a weight row each reads, and which of them are inside K. A u4 byte holds weights j
    and j + 16 of its group of 32, so a step reads BLOCK_K // 2 bytes a row and runs two dots."""
    if QUANT == 2:
        p = kb * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        k = (p // 16) * 32 + p % 16
    else:
        k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        p = k
    return k, p, k < K


@triton.jit
def _load_activations(x_rows, k, inside, QUANT: tl.constexpr, EVEN_K: tl.constexpr):
    """A K step's tile of the rows x_rows [BLOCK_M, 1] point at, and (u4) that of the high
    nibbles' columns (else the same tile)."""
    if EVEN_K:
        xs = tl.load(x_rows + k[None, :])
    else:
        xs = tl.load(x_rows + k[None, :], mask=inside[None, :], other=0.0)
    xs_hi = xs
    if QUANT == 2:
        xs_hi = tl.load(x_rows + (k + 16)[None, :], mask=inside[None, :], other=0.0)
    return xs, xs_hi


@triton.jit
def _accumulate(
    acc,
    xs,
    xs_hi,
    w_cols,
    s_cols,
    m_cols,
    k,
    p,
    inside,
    zero_point,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_MINS: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """acc + a K step's product with one weight: w_cols [1, BLOCK_N] point at each output
    column's weight row (its codes where quantized: QUANT 1 u8, 2 u4), s_cols and m_cols at its
    group scales and mins. Quantized weights are dequantized in float32, then fed to tl.dot in
    the activations' dtype (as triton_quant_linear does)."""
    if QUANT == 0:
        if EVEN_K:
            w = tl.load(w_cols + k[:, None])
        else:
            w = tl.load(w_cols + k[:, None], mask=inside[:, None], other=0.0)
        result = tl.dot(xs, w, acc, input_precision=DOT_PRECISION)
    elif QUANT == 1:
        mask = inside[:, None]
        codes = tl.load(w_cols + p[:, None], mask=mask, other=0)
        g = (k // GROUP)[:, None]
        w = _dequant(codes, s_cols + g, m_cols + g, mask, zero_point, HAS_MINS)
        result = tl.dot(xs, w.to(xs.dtype), acc, input_precision=DOT_PRECISION)
    else:
        mask = inside[:, None]
        codes = tl.load(w_cols + p[:, None], mask=mask, other=0)
        g = (p // 16)[:, None]
        lo = _dequant(codes & 0x0F, s_cols + g, m_cols + g, mask, zero_point, HAS_MINS)
        hi = _dequant(codes >> 4, s_cols + g, m_cols + g, mask, zero_point, HAS_MINS)
        result = tl.dot(xs, lo.to(xs.dtype), acc, input_precision=DOT_PRECISION)
        result = tl.dot(xs_hi, hi.to(xs.dtype), result, input_precision=DOT_PRECISION)
    return result


@triton.jit
def _moe_gemm_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    mins_ptr,
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
    stride_se,
    stride_sn,
    stride_be,
    stride_om,
    zero_point,
    limit,
    alpha,
    GATED: tl.constexpr,
    PAIRS_PER_ROW: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_MINS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # GATED (gate/up): x [T, K], a row per token (pair // PAIRS_PER_ROW, PAIRS_PER_ROW = top_k);
    # w [E, 2N, K], gate rows then up rows; out [pairs, N] in x's dtype: act(gate) * up.
    # Else (down): x [pairs, K], a row per pair; w [E, N, K]; weights [pairs];
    # out [pairs, N] float32: weight * (x @ w[e].T + bias[e]).
    # A quantized w is its codes, with scales and mins [E, rows, K // GROUP].
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    # columns past N recompute column n % N and are not stored; padding pairs recompute row 0
    expert, pairs, valid, rows, offs_n, offs_w = _block_of_pairs(
        sorted_pairs_ptr, block_experts_ptr, pid_m, pid_n, num_pairs, N, PAIRS_PER_ROW, BLOCK_M,
        BLOCK_N
    )  # fmt: skip
    x_rows = x_ptr + rows[:, None] * stride_xm
    w_offs = expert * stride_we + offs_w[None, :] * stride_wn
    s_offs = expert * stride_se + offs_w[None, :] * stride_sn
    up_w_offs = expert * stride_we + (offs_w + N)[None, :] * stride_wn
    up_s_offs = expert * stride_se + (offs_w + N)[None, :] * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # GATED only
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k, p, inside = _k_step(kb, K, QUANT, BLOCK_K)
        xs, xs_hi = _load_activations(x_rows, k, inside, QUANT, EVEN_K)
        acc = _accumulate(
            acc, xs, xs_hi, w_ptr + w_offs, scales_ptr + s_offs, mins_ptr + s_offs, k, p, inside,
            zero_point, QUANT, GROUP, HAS_MINS, EVEN_K, DOT_PRECISION,
        )  # fmt: skip
        if GATED:  # the up rows share the loaded activations
            acc_up = _accumulate(
                acc_up, xs, xs_hi, w_ptr + up_w_offs, scales_ptr + up_s_offs,
                mins_ptr + up_s_offs, k, p, inside, zero_point, QUANT, GROUP, HAS_MINS, EVEN_K,
                DOT_PRECISION,
            )  # fmt: skip
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_w
        acc += tl.load(b_ptrs).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_ptrs + N).to(tl.float32)[None, :]
    # round as the reference does: each projection's output in the model's dtype, then act(gate)
    dtype = x_ptr.dtype.element_ty
    if GATED:
        act, up = gated_activation(
            acc.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32), limit, alpha, ACT
        )
        result = (act.to(dtype).to(tl.float32) * up).to(dtype)
    else:
        scale = tl.load(weights_ptr + rows).to(tl.float32)
        result = acc.to(dtype).to(tl.float32) * scale[:, None]
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, result, mask=valid[:, None] & (offs_n < N)[None, :])


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


def _weight_args(w: Experts) -> tuple[list, dict]:
    """The kernels' arguments for one stacked weight: (w, scales, mins, stride_we, stride_wn,
    stride_se, stride_sn, zero_point) and the constexprs QUANT, GROUP, HAS_MINS."""
    if isinstance(w, PackedExperts):
        q, scales = _last_dim_contiguous(w.qweight), w.scales.contiguous()
        mins = scales if w.mins is None else w.mins.contiguous()  # read only with HAS_MINS
        strides = [q.stride(0), q.stride(1), scales.stride(0), scales.stride(1)]
        quant = {"QUANT": 2 if w.layout == "u4" else 1, "GROUP": w.group_size}
        return [q, scales, mins, *strides, w.zero_point], quant | {"HAS_MINS": w.mins is not None}
    w = _last_dim_contiguous(w)
    return [w, w, w, w.stride(0), w.stride(1), 0, 0, 0], {"QUANT": 0, "GROUP": 1, "HAS_MINS": False}


def fused_moe_triton(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Experts,
    w2: Experts,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    activation: str = "silu",
    limit: float = 7.0,
    alpha: float = 1.702,
) -> torch.Tensor:
    """kernels/moe.fused_moe_ref's result, by the kernels above: hidden [T, H] (float16, bfloat16
    or float32), weights and ids [T, k], w13 [E, 2W, H] and w2 [E, H, W] (dense in hidden's dtype,
    or PackedExperts: u4 or u8 codes dequantized in the GEMMs), b13 [E, 2W], b2 [E, H]. Returns a
    new [T, H] tensor."""
    check_moe_shapes(hidden, weights, ids, w13, w2, b13, b2)
    dense = [w.dtype for w in (w13, w2) if isinstance(w, torch.Tensor)]
    if hidden.dtype not in DTYPES or any(dtype != hidden.dtype for dtype in dense):
        raise ValueError(
            f"hidden and the dense expert weights must share a float16, bfloat16 or float32 "
            f"dtype, got {hidden.dtype} and {', '.join(map(str, dense))}"
        )
    tokens, size = hidden.shape
    top_k, experts, width = ids.shape[1], w13.shape[0], w2.shape[2]
    out = torch.empty((tokens, size), dtype=hidden.dtype, device=hidden.device)
    if tokens == 0 or top_k == 0:
        return out.zero_()
    x = _last_dim_contiguous(hidden)
    pairs = tokens * top_k
    c = _launch_config(pairs, experts, hidden.dtype, hidden.device.type == "cuda")
    block_m = c["block_m"]
    sorted_pairs, block_experts, num_padded = moe_align_block_size(ids, experts, block_m)
    tiles_m = block_experts.numel()
    grouping = [sorted_pairs, block_experts, num_padded, pairs]
    common = dict(BLOCK_M=block_m, GROUP_M=8, DOT_PRECISION=c["precision"])

    activated = torch.empty((pairs, width), dtype=hidden.dtype, device=hidden.device)
    weighted = torch.empty((pairs, size), dtype=torch.float32, device=hidden.device)
    flat_weights = weights.reshape(-1).contiguous()
    # (gate/up: hidden -> activated, down: activated -> weighted)
    for name, gated, a, w, bias, product, n, k in (
        ("gate_up", True, x, w13, b13, activated, width, size),
        ("down", False, activated, w2, b2, weighted, size, width),
    ):
        (w_arg, scales, mins, *strides, zero_point), quant = _weight_args(w)
        block_n, block_k, warps, stages = c[name]
        _moe_gemm_kernel[(tiles_m * triton.cdiv(n, block_n),)](
            a,
            w_arg,
            scales,
            mins,
            a if bias is None else _last_dim_contiguous(bias),
            flat_weights,
            product,
            *grouping,
            n,
            k,
            a.stride(0),
            *strides,
            0 if bias is None else bias.stride(0),
            product.stride(0),
            zero_point,
            float(limit),
            float(alpha),
            GATED=gated,
            PAIRS_PER_ROW=top_k if gated else 1,
            ACT=_ACTIVATIONS[activation],
            HAS_BIAS=bias is not None,
            EVEN_K=k % block_k == 0,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            num_warps=warps,
            num_stages=stages,
            **quant,
            **common,
        )

    block = min(1024, triton.next_power_of_2(size))
    _moe_sum_kernel[(tokens, triton.cdiv(size, block))](
        weighted, out, size, weighted.stride(0), out.stride(0), TOP_K=top_k, BLOCK=block
    )
    return out
