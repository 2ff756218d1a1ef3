"""The CPU fast path for a single decode token: all decoder layers and the final norm as one C++
call (kernels/csrc/decode_layer.h), in one OpenMP parallel region whose threads meet at barriers
between steps.

It applies when the model runs float32 on a CPU with the vector kernels (AVX-512 VNNI or AVX2) and
every projection is quantized (one PackedWeight, or several whose rows stack, as a Q4_K_M file's
Q4_K q/k and Q6_K v do); otherwise the layers run op by op. Qwen3's per-head q/k norms run inside
the layer, and so does a mixture-of-experts MLP (Qwen3-MoE, Mixtral: the router, top-k, and each
chosen expert's projections).
"""

from __future__ import annotations

import dataclasses

import torch

from localchat.engine.models.moe import SparseMoE
from localchat.engine.models.spec import DecoderSpec, LayerSpec
from localchat.kernels.attention_metadata import AttentionMetadata
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import precise_activations


def _parts(weight: PackedWeight | tuple[PackedWeight, ...]) -> list[PackedWeight]:
    """A projection's PackedWeights: one, or several whose rows stack (q, k, v stored in different
    types)."""
    return list(weight) if isinstance(weight, tuple) else [weight]


def _or_empty(t: torch.Tensor | None) -> torch.Tensor:
    """The C++ layer takes four tensors per part; an absent one is empty."""
    return torch.empty(0) if t is None else t


def _is_packed(weight: object) -> bool:
    parts = weight if isinstance(weight, tuple) else (weight,)
    return all(type(p) is PackedWeight for p in parts)


class CpuDecodeStack:
    """The C++ DecodeStack of a model, bound to the model's KV pool views (rebound when they
    change)."""

    def __init__(self, model, stack) -> None:
        self.model = model
        self.stack = stack
        self.num_layers = len(model.layers)
        self._bound: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor, ctx) -> torch.Tensor:
        """The final-normed hidden state of one decode token, from its embedding [1, hidden]."""
        if self._bound is not self.model.layers[0].self_attn.k_cache:
            attns = [layer.self_attn for layer in self.model.layers]
            self.stack.bind_caches([a.k_cache for a in attns], [a.v_cache for a in attns])
            self._bound = attns[0].k_cache
        md = ctx.attn
        return self.stack.forward(
            hidden, ctx.cos, ctx.sin, md.slot_mapping, md.block_tables, md.seq_lens
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


def _tensors(parts: list[PackedWeight]) -> tuple[list[list[torch.Tensor]], list[int]]:
    """The C++ layer's description of PackedWeights: four tensors and four format fields each."""
    tensors = [[p.qweight, p.scales, _or_empty(p.mins), _or_empty(p.super_scales)] for p in parts]
    formats = [f for p in parts for f in (p.bits, p.group_size, p.zero_point, p.arrangement)]
    return tensors, formats


def _moe_mlp(ext, moe, spec: DecoderSpec):
    """The C++ MoeMlp of a SparseMoE whose experts are all quantized; None otherwise."""
    weights = [(e.gate_up_weight, e.down_weight) for e in moe.experts]
    if not all(_is_packed(w) for pair in weights for w in pair):
        return None
    projections = [_parts(w) for pair in weights for w in pair]
    tensors, formats = _tensors([p for projection in projections for p in projection])
    routing = spec.moe
    assert routing is not None  # a SparseMoE's spec has its MoESpec
    width = routing.intermediate_size
    return ext.MoeMlp(
        moe.router_weight.float(),
        tensors,
        [len(projection) for projection in projections],
        formats,
        routing.top_k,
        routing.normalize_topk,
        [precise_activations(spec.hidden_size), precise_activations(width)],
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
        if not all(_is_packed(w) for w in weights):
            return None
        projections = [_parts(w) for w in weights]
        tensors, formats = _tensors([p for projection in projections for p in projection])
        decode_layer = ext.DecodeLayer(
            layer.input_layernorm.weight,
            layer.post_attention_layernorm.weight,
            layer.input_layernorm.eps,
            tensors,
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
            experts = _moe_mlp(ext, moe, model.spec)
            if experts is None:
                return None
            decode_layer.set_moe(experts)
        layers.append(decode_layer)
    return CpuDecodeStack(model, ext.DecodeStack(layers, model.norm.weight, model.norm.eps))


def applies(input_ids: torch.Tensor, md: AttentionMetadata) -> bool:
    return input_ids.shape[0] == 1 and md.num_decodes == 1 and input_ids.device.type == "cpu"
