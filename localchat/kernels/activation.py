"""The gated MLP's activation over a fused [gate | up] projection: act(gate) * up, for the
activations our families use (SiLU: Llama, Qwen, Phi; tanh-approximated GELU: Gemma; gpt-oss's
clamped SwiGLU, (up + 1) * gate * sigmoid(alpha * gate) with both halves clamped)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.kernels.dispatch import use_triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] where d is half the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def swiglu_oai_and_mul_ref(x: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """gpt-oss's gated activation (transformers' GptOssExperts._apply_gate), on [gate | up] halves
    (the checkpoint interleaves them; the loader splits them)."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from localchat.kernels.triton_activation import act_and_mul_triton

        return act_and_mul_triton(x, "silu")
    return silu_and_mul_ref(x)


def act_and_mul(
    x: torch.Tensor, activation: str, limit: float = 7.0, alpha: float = 1.702
) -> torch.Tensor:
    """act(gate) * up for `activation` "silu", "gelu_tanh" or "swiglu_oai"."""
    if use_triton(x):
        from localchat.kernels.triton_activation import act_and_mul_triton

        return act_and_mul_triton(x, activation, limit, alpha)
    return act_and_mul_ref(x, activation, limit, alpha)


def act_and_mul_ref(
    x: torch.Tensor, activation: str, limit: float = 7.0, alpha: float = 1.702
) -> torch.Tensor:
    """The torch reference of act_and_mul."""
    if activation == "silu":
        return silu_and_mul_ref(x)
    if activation == "gelu_tanh":
        return gelu_tanh_and_mul_ref(x)
    return swiglu_oai_and_mul_ref(x, limit, alpha)
