"""Triton kernel: RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    weight_ptr,
    y_ptr,
    residual_ptr,
    residual_out_ptr,
    stride_x,
    stride_r,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row; the whole row fits in registers (hidden sizes are at most a few
    # thousand).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # The sum is rounded to the activation dtype, as the reference's `residual + x` is; it is
        # the next residual.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * n_cols + cols, x, mask=mask)
    x_dtype = x.dtype
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / n_cols
    # Like Hugging Face: normalize in float32, round to the activation dtype, then scale by the
    # weight.
    normed = (x32 * tl.rsqrt(variance + eps)).to(x_dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (w * normed).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rms_norm_ref: y, or (y, x + residual) when residual is given; new output
    tensors."""
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if residual is not None:
        r2 = residual.reshape(-1, n_cols)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        sum_dtype = torch.promote_types(x.dtype, residual.dtype)
        residual_out = torch.empty(x2.shape, dtype=sum_dtype, device=x.device)
    else:
        r2 = residual_out = x2  # unused when HAS_RESIDUAL is False
        sum_dtype = x.dtype
    y = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, sum_dtype), device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(n_cols)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            weight,
            y,
            r2,
            residual_out,
            x2.stride(0),
            r2.stride(0),
            n_cols,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(max(block // 512, 4), 16),  # about 16 values a thread for wide rows
        )
    y = y.view(x.shape)
    return y if residual is None else (y, residual_out.view(x.shape))
