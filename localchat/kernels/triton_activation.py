"""Triton kernel: SiLU-and-mul over a fused [gate | up] projection."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, stride_x, stride_y, d, BLOCK: tl.constexpr):
    # Grid: (rows, column tiles of the output). Rows are independent, so any d works with a masked
    # tile.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    # Round silu(gate) to the input dtype before the product, as the reference (F.silu(gate) * up)
    # does.
    act = (gate * tl.sigmoid(gate)).to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (act * up).to(y_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] where d is half the last dimension; returns a new [..., d]
    tensor."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if y.numel():
        block = min(triton.next_power_of_2(d), 1024)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, y, x2.stride(0), y.stride(0), d, BLOCK=block
        )
    return y.view(*x.shape[:-1], d)
