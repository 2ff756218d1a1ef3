"""The CPU fast path for a single decode token: each decoder layer as one C++ call
(kernels/csrc/decode_layer.h), its threads meeting at barriers between the layer's steps.

It applies when the model runs float32 on a CPU with the VNNI kernels, every projection is one PackedWeight
(a q/k/v split across layouts is not), and the model has no q/k norm; otherwise the layers run op by op.
"""

from __future__ import annotations

import torch

from localchat.engine.forward_context import AttentionMetadata
from localchat.kernels.cpu_extension import cpu_kernels
from localchat.kernels.dispatch import use_triton
from localchat.kernels.packed_weight import PackedWeight
from localchat.kernels.quant_linear import PRECISE_ACTIVATIONS


def _parts(weight: PackedWeight) -> tuple[list[torch.Tensor], list[int]]:
    parts = [weight.qweight, weight.scales] + ([weight.mins] if weight.mins is not None else [])
    return parts, [weight.bits, weight.group_size, weight.zero_point]


def build_decode_layers(model) -> list | None:
    """One C++ DecodeLayer per decoder layer, or None when the fast path does not apply to this model."""
    ext = cpu_kernels()
    if (
        ext is None
        or not hasattr(ext, "DecodeLayer")
        or model.norm.weight.device.type != "cpu"
        or model.norm.weight.dtype != torch.float32
        or use_triton(model.norm.weight)
    ):
        return None
    layers = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights = (attn.qkv_weight, attn.o_weight, mlp.gate_up_weight, mlp.down_weight)
        if attn.q_norm is not None or not all(type(w) is PackedWeight for w in weights):
            return None
        parts, formats = zip(*(_parts(w) for w in weights))
        layers.append(
            ext.DecodeLayer(
                layer.input_layernorm.weight,
                layer.post_attention_layernorm.weight,
                layer.input_layernorm.eps,
                *parts,
                [f for fmt in formats for f in fmt],
                attn.qkv_bias,
                attn.num_heads,
                attn.num_kv_heads,
                attn.head_dim,
                PRECISE_ACTIVATIONS,
            )
        )
    return layers


def applies(input_ids: torch.Tensor, md: AttentionMetadata) -> bool:
    return input_ids.shape[0] == 1 and md.num_decodes == 1 and input_ids.device.type == "cpu"
