"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch

from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """y = weight * x / rms(x), computed in float32 as Hugging Face does.

    With `residual`, first x = x + residual, and return (y, x) so the sum becomes the next residual.
    """
    if residual is not None:
        x = residual + x
        residual = x
    if x.dtype == torch.float32:  # one fused op, bitwise equal to the formula below in float32
        normed = torch.rms_norm(x, (x.shape[-1],), weight, eps)
        return normed if residual is None else (normed, residual)
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    normed = weight * (x32 * torch.rsqrt(variance + eps)).to(dtype)
    return normed if residual is None else (normed, residual)


def rms_norm(x, weight, eps, residual=None):
    if use_triton(x):
        from localchat.kernels.triton_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    if (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous()
        and (residual is None or residual.is_contiguous())
        and (ext := cpu_kernels())
    ):
        # one C++ pass; the residual is updated in place (the caller hands over its old residual)
        normed, summed = ext.add_rms_norm(x, residual, weight, eps)
        return normed if residual is None else (normed, summed)
    return rms_norm_ref(x, weight, eps, residual)
