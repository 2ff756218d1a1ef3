"""The modules of a decoder layer: RMSNorm, attention over the paged KV cache, and the gated MLP.

Their weights are dense nn.Parameters, or quantized (a PackedWeight or a tuple of them), which
replace the parameter of the same name as a plain attribute. q/k/v and gate/up are fused into one
matmul each.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat.engine.modeling.forward_context import get_forward_context
from localchat.engine.modeling.image_attention import attend_image_spans
from localchat.engine.modeling.spec import DecoderSpec, LayerSpec
from localchat.kernels import paged_attention, rms_norm, rotary_embedding, store_kv_cache
from localchat.kernels.activation import act_and_mul
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.linear import linear, linear_silu_and_mul


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    """Self-attention of one layer: fused q/k/v projection, optional q/k norms (per head, or over
    the whole projection), rotary embedding from the layer's table, the KV store and paged
    attention (sliding window, logit soft-capping and attention sinks where the model has them)."""

    def __init__(self, spec: DecoderSpec, layer: LayerSpec | None = None):
        super().__init__()
        layer = layer or LayerSpec()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.scale = spec.scale
        self.rope = layer.rope
        self.sliding_window = layer.sliding_window
        self.softcap = spec.attn_softcap
        self.qkv_weight = nn.Parameter(
            torch.empty(self.q_size + 2 * self.kv_size, spec.hidden_size)
        )
        self.qkv_bias = (
            nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size)) if spec.qkv_bias else None
        )
        self.o_weight = nn.Parameter(torch.empty(spec.hidden_size, self.q_size))
        self.o_bias = nn.Parameter(torch.zeros(spec.hidden_size)) if spec.o_bias else None
        self.q_norm = self.k_norm = None
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        elif spec.qk_norm_full:
            self.q_norm = RMSNorm(self.q_size, spec.rms_norm_eps)
            self.k_norm = RMSNorm(self.kv_size, spec.rms_norm_eps)
        self.qk_norm_full = spec.qk_norm_full
        self.sinks = nn.Parameter(torch.zeros(spec.num_heads)) if spec.attention_sinks else None
        # views into the engine's KV pool, bound after allocation, and the KV group whose block
        # tables they are read through (engine/core/kv_groups.py)
        self.k_cache = self.v_cache = torch.empty(0)
        self.kv_group = 0

    def _features(self) -> dict:
        """The attention kernels' options this layer uses (absent ones are off)."""
        features = {
            "sliding_window": self.sliding_window,
            "softcap": self.softcap,
            "sinks": self.sinks,
        }
        return {name: value for name, value in features.items() if value is not None}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        md = ctx.attn.for_group(self.kv_group)
        qkv = linear(hidden, self.qkv_weight, self.qkv_bias)
        spans = ctx.images.spans if ctx.images is not None else None
        if self.q_norm is None and self.rope is not None and not spans:
            cos, sin = ctx.rope[self.rope]
            out = fused_decode_attention(
                qkv,
                self.k_cache,
                self.v_cache,
                cos,
                sin,
                md,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.scale,
                **self._features(),
            )
            if out is not None:
                return linear(out, self.o_weight, self.o_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm_full and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if not self.qk_norm_full and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = rotary_embedding(q, k, *ctx.rope[self.rope])
        store_kv_cache(k, v, self.k_cache, self.v_cache, md.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, md, self.scale, **self._features())
        if spans:  # image tokens that see their whole image (modeling/image_attention.py)
            out = attend_image_spans(
                out, q, self.k_cache, self.v_cache, md, spans, self.scale, **self._features()
            )
        return linear(out.reshape(-1, self.q_size), self.o_weight, self.o_bias)


class MLP(nn.Module):
    """The gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one projection."""

    def __init__(
        self, spec: DecoderSpec, intermediate_size: int | None = None, bias: bool | None = None
    ):
        """An MLP of `intermediate_size` (default: the model's), with biases on its projections
        if `bias` (default: the model's, spec.mlp_bias)."""
        super().__init__()
        width = spec.intermediate_size if intermediate_size is None else intermediate_size
        bias = spec.mlp_bias if bias is None else bias
        self.activation = spec.activation
        self.limit, self.alpha = spec.swiglu_limit, spec.swiglu_alpha
        self.gate_up_weight = nn.Parameter(torch.empty(2 * width, spec.hidden_size))
        self.down_weight = nn.Parameter(torch.empty(spec.hidden_size, width))
        self.gate_up_bias = nn.Parameter(torch.zeros(2 * width)) if bias else None
        self.down_bias = nn.Parameter(torch.zeros(spec.hidden_size)) if bias else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate_up = linear(hidden, self.gate_up_weight, self.gate_up_bias)
        if self.activation == "silu" and self.down_bias is None:
            return linear_silu_and_mul(gate_up, self.down_weight)  # fused on the CPU kernels
        activated = act_and_mul(gate_up, self.activation, self.limit, self.alpha)
        return linear(activated, self.down_weight, self.down_bias)
