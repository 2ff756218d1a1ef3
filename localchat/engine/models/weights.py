"""Route Hugging Face checkpoint tensors into our fused parameters."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from localchat.engine.models.decoder import DecoderForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _destination(model: DecoderForCausalLM, name: str) -> tuple[torch.Tensor, int] | None:
    """(parameter, row offset) for an HF tensor name, or None for tensors we do not use."""
    if name == "model.embed_tokens.weight":
        return model.embed_tokens, 0
    if name == "model.norm.weight":
        return model.norm.weight, 0
    if name == "lm_head.weight":
        return (model.lm_head, 0) if model.lm_head is not None else None
    match = _LAYER.match(name)
    if not match:
        return None
    layer = model.layers[int(match.group(1))]
    attn, mlp, rest = layer.self_attn, layer.mlp, match.group(2)
    q, kv = attn.q_size, attn.kv_size
    table = {
        "self_attn.q_proj.weight": (attn.qkv_weight, 0),
        "self_attn.k_proj.weight": (attn.qkv_weight, q),
        "self_attn.v_proj.weight": (attn.qkv_weight, q + kv),
        "self_attn.q_proj.bias": (attn.qkv_bias, 0),
        "self_attn.k_proj.bias": (attn.qkv_bias, q),
        "self_attn.v_proj.bias": (attn.qkv_bias, q + kv),
        "self_attn.o_proj.weight": (attn.o_weight, 0),
        "self_attn.q_norm.weight": (attn.q_norm.weight if attn.q_norm else None, 0),
        "self_attn.k_norm.weight": (attn.k_norm.weight if attn.k_norm else None, 0),
        "mlp.gate_proj.weight": (mlp.gate_up_weight, 0),
        "mlp.up_proj.weight": (mlp.gate_up_weight, mlp.down_weight.shape[1]),
        "mlp.down_proj.weight": (mlp.down_weight, 0),
        "input_layernorm.weight": (layer.input_layernorm.weight, 0),
        "post_attention_layernorm.weight": (layer.post_attention_layernorm.weight, 0),
    }
    found = table.get(rest)
    return found if found is not None and found[0] is not None else None


@torch.no_grad()
def load_hf_weights(model: DecoderForCausalLM, tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Copy each (HF name, tensor) into its place; return the names of parameters not fully written."""
    rows_written: dict[int, int] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for name, tensor in tensors:
        dest = _destination(model, name)
        if dest is None:
            continue
        param, offset = dest
        rows = tensor.shape[0]
        target = param.data[offset:offset + rows] if param.dim() and offset + rows <= param.shape[0] else None
        if target is None or target.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, "
                             f"which does not fit {names[id(param)]} {tuple(param.shape)} at row {offset}")
        target.copy_(tensor)
        rows_written[id(param)] = rows_written.get(id(param), 0) + rows
    params = dict(model.named_parameters())
    return {name for name, p in params.items() if rows_written.get(id(p), 0) < p.shape[0]}
