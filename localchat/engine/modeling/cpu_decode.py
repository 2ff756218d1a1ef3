"""The CPU fast path for a forward pass of a few tokens (a single decode, a small batch of decodes,
or a sequence's last few tokens, as speculative decoding verifies them): all decoder layers and the
final norm as one C++ call (kernels/csrc/decode_layer.h), in one OpenMP parallel region whose
threads meet at barriers between steps, each projection's weights read once for all the tokens.

It applies when the model runs float32 on a CPU with the vector kernels (AVX-512 VNNI or AVX2) and
every projection is quantized (one PackedWeight, or several whose rows stack, as a Q4_K_M file's
Q4_K q/k and Q6_K v do); otherwise the layers run op by op. Qwen3's per-head q/k norms run inside
the layer, and so does a mixture-of-experts MLP (Qwen3-MoE, Mixtral: the router, top-k, and each
chosen expert's projections).
"""

from __future__ import annotations

import dataclasses

import torch

from localchat.engine.modeling.cpu_parts import is_packed, parts, tensors
from localchat.engine.modeling.moe import SparseMoE
from localchat.engine.modeling.spec import DecoderSpec, LayerSpec
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.quant_linear import precise_activations

MOE_MAX_TOKENS = 16  # the most tokens the stack takes where a layer's MLP is a mixture of experts


class CpuDecodeStack:
    """The C++ DecodeStack of a model, bound to the model's KV pool views (rebound when they
    change)."""

    def __init__(self, model, stack) -> None:
        self.model = model
        self.stack = stack
        self.num_layers = len(model.layers)
        self.max_tokens: int = stack.max_rows()
        if model.spec.moe is not None:
            # the stack runs each token through its own experts, where the per-op MoE groups the
            # tokens by expert: on a 12-layer Qwen3-30B-A3B cut the stack was 1.11x as fast at 9
            # tokens and even at 16 (docs/benchmarks-history.md, 2026-12-06)
            self.max_tokens = min(self.max_tokens, MOE_MAX_TOKENS)
        self._bound: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor, ctx) -> torch.Tensor:
        """The final-normed hidden states of the batch's tokens (at most max_tokens), from their
        embeddings [tokens, hidden]."""
        if self._bound is not self.model.layers[0].self_attn.k_cache:
            attns = [layer.self_attn for layer in self.model.layers]
            self.stack.bind_caches([a.k_cache for a in attns], [a.v_cache for a in attns])
            self._bound = attns[0].k_cache
        md = ctx.attn
        return self.stack.forward(
            hidden,
            ctx.cos,
            ctx.sin,
            md.slot_mapping,
            md.block_tables,
            md.seq_lens,
            md.query_start_loc,
        )

    def applies(self, input_ids: torch.Tensor, ctx) -> bool:
        """Whether the stack runs this batch: a CPU batch of at most max_tokens tokens, decodes
        and short multi-token queries alike (the supported models' layers have no windows,
        softcaps or sinks, so every token attends to all its sequence's keys up to its own),
        without image spans (whose tokens attend both ways)."""
        return (
            input_ids.device.type == "cpu"
            and 1 <= input_ids.shape[0] <= self.max_tokens
            and ctx.images is None
        )


def supports(spec: DecoderSpec) -> bool:
    """Whether the C++ stack runs this model's layers: Llama/Qwen layers (DecoderSpec.is_plain),
    whose MLP may be a mixture of experts routed by a softmax over all experts (Qwen3-MoE, Mixtral)
    without biases or a shared expert."""
    if spec.moe is None:
        return spec.is_plain
    moe = spec.moe
    dense = dataclasses.replace(spec, moe=None, layers=())
    return (
        dense.is_plain
        and all(dataclasses.replace(layer, moe=False) == LayerSpec() for layer in spec.layers)
        and moe.routing == "softmax_topk"
        and not (moe.router_bias or moe.expert_bias or moe.shared_expert_size)
    )


def build_decode_stack(model) -> CpuDecodeStack | None:
    """The C++ decode stack of the model, or None when the fast path does not apply to this
    model."""
    ext = cpu_kernels()
    if (
        ext is None
        or not hasattr(ext, "DecodeLayer")
        or model.norm.weight.device.type != "cpu"
        or model.norm.weight.dtype != torch.float32
        or use_triton(model.norm.weight)
        or not supports(model.spec)
    ):
        return None
    layers = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights = [attn.qkv_weight, attn.o_weight]
        moe = mlp if isinstance(mlp, SparseMoE) else None
        if moe is None:
            weights += [mlp.gate_up_weight, mlp.down_weight]
        if not all(is_packed(w) for w in weights):
            return None
        projections = [parts(w) for w in weights]
        described, formats = tensors([p for projection in projections for p in projection])
        decode_layer = ext.DecodeLayer(
            layer.input_layernorm.weight,
            layer.post_attention_layernorm.weight,
            layer.input_layernorm.eps,
            described,
            [len(projection) for projection in projections],
            formats,
            attn.qkv_bias,
            None if attn.q_norm is None else attn.q_norm.weight,
            None if attn.k_norm is None else attn.k_norm.weight,
            attn.num_heads,
            attn.num_kv_heads,
            attn.head_dim,
            [precise_activations(projection[0].shape[1]) for projection in projections],
        )
        if moe is not None:
            experts = moe.cpu_experts()
            if experts is None:
                return None
            decode_layer.set_moe(experts)
        layers.append(decode_layer)
    return CpuDecodeStack(model, ext.DecodeStack(layers, model.norm.weight, model.norm.eps))
