"""Our forward pass for decoder-only transformers of the Llama family (Llama, Mistral, Qwen2,
Qwen3).

The variants differ only in flags: q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), an explicit
head_dim, tied embeddings and rope scaling. q/k/v and gate/up are fused into one matmul each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from localchat.engine.forward_context import get_forward_context
from localchat.engine.gguf_rows import GgufRows
from localchat.engine.models import cpu_decode
from localchat.kernels import (
    paged_attention,
    rms_norm,
    rotary_embedding,
    store_kv_cache,
)
from localchat.kernels.decode_attention import fused_decode_attention
from localchat.kernels.linear import can_pack, linear, linear_silu_and_mul, pack_weight
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import embedding_rows, interleave_for_kernel

# The projection weights: dense nn.Parameters, or quantized (a PackedWeight or a tuple of them),
# which replace the parameter of the same name as a plain attribute.
PROJECTIONS = (
    ("self_attn", "qkv_weight"),
    ("self_attn", "o_weight"),
    ("mlp", "gate_up_weight"),
    ("mlp", "down_weight"),
)


@dataclass(frozen=True)
class DecoderSpec:
    """The shape of a model, read from its HF config (see models/registry.py)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
        )
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.scale = spec.head_dim**-0.5
        self.qkv_weight = nn.Parameter(
            torch.empty(self.q_size + 2 * self.kv_size, spec.hidden_size)
        )
        self.qkv_bias = (
            nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size)) if spec.qkv_bias else None
        )
        self.o_weight = nn.Parameter(torch.empty(spec.hidden_size, self.q_size))
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_cache = self.v_cache = torch.empty(
            0
        )  # views into the engine's KV pool, bound after allocation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        qkv = linear(hidden, self.qkv_weight, self.qkv_bias)
        if self.q_norm is None:
            out = fused_decode_attention(
                qkv,
                self.k_cache,
                self.v_cache,
                ctx.cos,
                ctx.sin,
                ctx.attn,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.scale,
            )
            if out is not None:
                return linear(out, self.o_weight)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary_embedding(q, k, ctx.cos, ctx.sin)
        store_kv_cache(k, v, self.k_cache, self.v_cache, ctx.attn.slot_mapping)
        out = paged_attention(q, self.k_cache, self.v_cache, ctx.attn, self.scale)
        return linear(out.reshape(-1, self.q_size), self.o_weight)


class MLP(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.gate_up_weight = nn.Parameter(
            torch.empty(2 * spec.intermediate_size, spec.hidden_size)
        )
        self.down_weight = nn.Parameter(torch.empty(spec.hidden_size, spec.intermediate_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear_silu_and_mul(linear(hidden, self.gate_up_weight), self.down_weight)


class DecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderForCausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head; `forward` returns hidden states of all
    tokens, `compute_logits` projects only the rows that sample."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = (
            None
            if spec.tie_word_embeddings
            else nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        )
        self.packed_head: torch.Tensor | None = None
        # all layers of a single decode as one C++ call (models/cpu_decode.py)
        self.cpu_decode: cpu_decode.CpuDecodeStack | None = None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed_tokens, GgufRows):
            return self.embed_tokens.rows(input_ids, self.norm.weight.dtype)
        if isinstance(self.embed_tokens, PackedWeight):
            return embedding_rows(self.embed_tokens, input_ids, self.norm.weight.dtype)
        return F.embedding(input_ids, self.embed_tokens)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed(input_ids), None
        ctx = get_forward_context()
        if self.cpu_decode is not None and cpu_decode.applies(input_ids, ctx.attn):
            return self.cpu_decode.forward(hidden, ctx)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            return linear(hidden, self.packed_head)
        return linear(hidden, self.embed_tokens if self.lm_head is None else self.lm_head)

    @torch.no_grad()
    def pack_weights(self) -> bool:
        """Swap every dense projection weight for its oneDNN-packed copy, freeing the plain one (CPU
        only). The embedding stays plain for lookups; a dense LM head gets a packed copy. Quantized
        weights are left as they are. False if nothing could be packed."""
        if self.norm.weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            return False
        for layer in self.layers:
            for module_name, name in PROJECTIONS:
                module = getattr(layer, module_name)
                if name in module._parameters and can_pack(module._parameters[name]):
                    setattr(module, name, pack_weight(module._parameters.pop(name)))
                elif isinstance(value := getattr(module, name), (PackedWeight, tuple)):
                    setattr(module, name, interleave_for_kernel(value))
        if isinstance(self.lm_head, PackedWeight):
            self.lm_head = interleave_for_kernel(self.lm_head)
        elif self.lm_head is None and isinstance(self.embed_tokens, PackedWeight):
            self.embed_tokens = interleave_for_kernel(self.embed_tokens)  # tied: it is the head
        self.cpu_decode = cpu_decode.build_decode_stack(self)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        if isinstance(head, torch.Tensor) and can_pack(head):
            self.packed_head = pack_weight(head)
            if self.lm_head is not None:
                del self._parameters["lm_head"]
                self.lm_head = None
        return True
