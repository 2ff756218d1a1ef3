"""Our forward pass for decoder-only transformers: every family we run (modeling/families.py) is a
Llama layer with some of DecoderSpec's variations switched on (norm placement, activation, scales,
soft-capping, sliding windows, sinks, mixture-of-experts MLPs)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from localchat.engine.loading.gguf_rows import GgufRows
from localchat.engine.modeling import cpu_decode
from localchat.engine.modeling.forward_context import get_forward_context
from localchat.engine.modeling.layers import MLP, Attention, RMSNorm
from localchat.engine.modeling.moe import SparseMoE
from localchat.engine.modeling.spec import DecoderSpec
from localchat.kernels.dispatch import use_triton
from localchat.kernels.linear import can_pack, linear, pack_weight
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import (
    embedding_rows,
    interleave_for_kernel,
    warn_dense_fallback,
)

__all__ = [
    "MLP",
    "PROJECTIONS",
    "Attention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderSpec",
    "RMSNorm",
    "projection_slots",
]

# A dense layer's projection weights: (submodule, attribute)
PROJECTIONS = (
    ("self_attn", "qkv_weight"),
    ("self_attn", "o_weight"),
    ("mlp", "gate_up_weight"),
    ("mlp", "down_weight"),
)
_MODULE_PROJECTIONS = {
    Attention: ("qkv_weight", "o_weight"),
    MLP: ("gate_up_weight", "down_weight"),
}


def projection_slots(model: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    """(module, attribute) of every projection weight in the model: attention's, the dense MLPs'
    and every expert's."""
    for module in model.modules():
        for attr in _MODULE_PROJECTIONS.get(type(module), ()):
            yield module, attr


class DecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, index: int):
        super().__init__()
        layer = spec.layer(index)
        self.norms = spec.norms
        self.residual_scale = spec.residual_scale
        norm = lambda: RMSNorm(spec.hidden_size, spec.rms_norm_eps)  # noqa: E731
        # Hugging Face's names: input_layernorm before attention, post_attention_layernorm before
        # the MLP (Llama) or after attention (Gemma, OLMo 2), pre/post_feedforward_layernorm around
        # the MLP
        if spec.norms != "post":
            self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        if spec.norms == "sandwich":
            self.pre_feedforward_layernorm = norm()
        if spec.norms != "pre":
            self.post_feedforward_layernorm = norm()
        self.self_attn = Attention(spec, layer)
        self.mlp: nn.Module = SparseMoE(spec) if layer.moe else MLP(spec)

    def forward(self, hidden, residual):
        """(hidden, residual) -> (hidden, residual): the residual stream is residual + hidden (or
        hidden alone where residual is None); the add is fused into the next norm."""
        if self.norms == "post":  # OLMo 2: x + norm(attn(x)), then x + norm(mlp(x))
            stream = hidden if residual is None else residual + hidden
            attended = self.post_attention_layernorm(self.self_attn(stream))
            stream = stream + attended
            return self.post_feedforward_layernorm(self.mlp(stream)), stream
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden)
        if self.norms == "sandwich":
            hidden = self.post_attention_layernorm(hidden)
            hidden, residual = self.pre_feedforward_layernorm(self._scaled(hidden), residual)
            return self.post_feedforward_layernorm(self.mlp(hidden)), residual
        hidden, residual = self.post_attention_layernorm(self._scaled(hidden), residual)
        return self._scaled(self.mlp(hidden)), residual

    def _scaled(self, hidden: torch.Tensor) -> torch.Tensor:
        """A block's output as it joins the residual stream (Granite scales it)."""
        return hidden if self.residual_scale == 1.0 else hidden * self.residual_scale


class DecoderForCausalLM(nn.Module):
    """Embeddings, decoder layers, final norm and LM head; `forward` returns hidden states of all
    tokens, `compute_logits` projects only the rows that sample."""

    def __init__(self, spec: DecoderSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = (
            None
            if spec.tie_word_embeddings
            else nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))
        )
        self.packed_head: torch.Tensor | None = None
        # all layers of a forward pass of a few tokens as one C++ call (modeling/cpu_decode.py)
        self.cpu_decode: cpu_decode.CpuDecodeStack | None = None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        dtype = self.norm.weight.dtype
        if isinstance(self.embed_tokens, GgufRows):
            hidden = self.embed_tokens.rows(input_ids, dtype)
        elif isinstance(self.embed_tokens, PackedWeight):
            hidden = embedding_rows(self.embed_tokens, input_ids, dtype)
        else:
            hidden = F.embedding(input_ids, self.embed_tokens)
        if self.spec.embed_scale != 1.0:
            # in the model's dtype, as transformers scales (Gemma's sqrt(hidden), Granite's factor)
            hidden = hidden * torch.tensor(self.spec.embed_scale, dtype=hidden.dtype)
        return hidden

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed(input_ids), None
        ctx = get_forward_context()
        if ctx.images is not None:  # image placeholders take the image encoder's embeddings
            hidden = hidden.index_copy(0, ctx.images.rows, ctx.images.embeddings.to(hidden.dtype))
        if self.cpu_decode is not None and self.cpu_decode.applies(input_ids, ctx):
            return self.cpu_decode.forward(hidden, ctx)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            logits = linear(hidden, self.packed_head)
        else:
            logits = linear(hidden, self.embed_tokens if self.lm_head is None else self.lm_head)
        spec = self.spec
        if spec.logits_divisor != 1.0:
            logits = logits / spec.logits_divisor
        if spec.final_softcap is not None:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits

    @torch.no_grad()
    def pack_weights(self) -> bool:
        """Swap every dense projection weight for its oneDNN-packed copy, freeing the plain one (CPU
        only). The embedding stays plain for lookups; a dense LM head gets a packed copy. Quantized
        weights are left as they are. False if nothing could be packed.

        Where the Triton kernels run (CUDA), each MoE block's experts are stacked for the fused
        MoE here, at load, rather than in the first forward pass (the KV budget's profiling)."""
        if use_triton(self.norm.weight):
            for module in self.modules():
                if isinstance(module, SparseMoE):
                    module.stack_experts()
        if self.norm.weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            return False
        for module, name in projection_slots(self):
            dense = module._parameters.get(name)
            if dense is not None and can_pack(dense):
                del module._parameters[name]
                setattr(module, name, pack_weight(dense))
            elif isinstance(value := getattr(module, name), (PackedWeight, tuple)):
                setattr(module, name, interleave_for_kernel(value))
        if isinstance(self.lm_head, PackedWeight):
            self.lm_head = interleave_for_kernel(self.lm_head)
        elif self.lm_head is None and isinstance(self.embed_tokens, PackedWeight):
            self.embed_tokens = interleave_for_kernel(self.embed_tokens)  # tied: it is the head
        self.cpu_decode = cpu_decode.build_decode_stack(self)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        if not use_triton(self.norm.weight):
            warn_dense_fallback([*(getattr(m, n) for m, n in projection_slots(self)), head])
        if isinstance(head, torch.Tensor) and can_pack(head):
            self.packed_head = pack_weight(head)
            if self.lm_head is not None:
                del self._parameters["lm_head"]
                self.lm_head = None
        return True
