"""Dense projections. On the CPU, weights are repacked once for oneDNN, whose small-batch matmuls
read weights at close to memory speed; the default path (MKL sgemv/sgemm) runs at half that on some
CPUs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.kernels.activation import silu_and_mul
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import quant_linear


def can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN can repack this weight here: float32 anywhere it is built, bfloat16 only on
    CPUs with its bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; not AVX2-only ones)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """An opaque oneDNN copy of a [out, in] weight, laid out for its matmul."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, for a plain, a oneDNN-packed (pack_weight) or a quantized (PackedWeight)
    weight."""
    if isinstance(weight, (PackedWeight, tuple)):
        return quant_linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def linear_silu_and_mul(gate_up: torch.Tensor, weight) -> torch.Tensor:
    """silu(gate) * up @ weight.T for a fused [gate | up] input; fused into the quantized CPU
    kernel."""
    if isinstance(weight, (PackedWeight, tuple)):
        return quant_linear(gate_up, weight, silu_and_mul=True)
    return linear(silu_and_mul(gate_up), weight)
