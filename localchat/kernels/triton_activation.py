"""Triton kernel: a gated activation over a fused [gate | up] projection (SiLU, tanh-approximated
GELU, or gpt-oss's clamped SwiGLU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}


@triton.jit
def gated_activation(gate, up, limit, alpha, ACT: tl.constexpr):
    """(act(gate), up as it multiplies) in float32, for ACT 0 (SiLU), 1 (tanh-approximated GELU)
    or 2 (gpt-oss's clamped SwiGLU: gate clamped above, up clamped both ways and plus one)."""
    if ACT == 0:
        act = gate * tl.sigmoid(gate)
    elif ACT == 1:
        # 0.5 g (1 + tanh(u)) with tanh(u) = 2 sigmoid(2u) - 1: g * sigmoid(2u)
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * inner)
    else:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit) + 1.0
        act = gate * tl.sigmoid(gate * alpha)
    return act, up


@triton.jit
def _act_and_mul_kernel(
    x_ptr, y_ptr, stride_x, stride_y, d, limit, alpha, ACT: tl.constexpr, BLOCK: tl.constexpr
):
    # Grid: (rows, column tiles of the output). Rows are independent, so any d works with a masked
    # tile.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    act, up = gated_activation(gate, up, limit, alpha, ACT)
    # Round act(gate) to the input dtype before the product, as the reference (act(gate) * up)
    # does.
    act = act.to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (act * up).to(y_ptr.dtype.element_ty), mask=mask)


def act_and_mul_triton(
    x: torch.Tensor, activation: str = "silu", limit: float = 7.0, alpha: float = 1.702
) -> torch.Tensor:
    """act(x[..., :d]) * x[..., d:] where d is half the last dimension; returns a new [..., d]
    tensor."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if y.numel():
        block = min(triton.next_power_of_2(d), 1024)
        _act_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2,
            y,
            x2.stride(0),
            y.stride(0),
            d,
            float(limit),
            float(alpha),
            ACT=_ACTIVATIONS[activation],
            BLOCK=block,
        )
    return y.view(*x.shape[:-1], d)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    return act_and_mul_triton(x, "silu")
