"""How llama.cpp names a GGUF file's tensors, and the Hugging Face name (and the converter's
transformation to undo) of each; the per-architecture differences are GgufArch's fields
(engine/loading/gguf_arches.py)."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.loading.gguf_arches import GgufArch
from localchat.errors import UnsupportedModelError

# llama.cpp's name inside a block -> Hugging Face's inside model.layers.N
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_sinks": "self_attn.sinks",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PARAMETERS = {"attn_sinks"}  # a parameter of its own in Hugging Face's model, not a .weight
_ROW_VECTORS = {"ffn_gate_inp_shexp"}  # 1-D in the file, [1, hidden] in Hugging Face's model
# read into the config's rotary parameters
CONFIG_TENSORS = {"rope_factors_long", "rope_factors_short", "rope_freqs"}


@dataclass(frozen=True)
class TensorTarget:
    """Where one GGUF tensor goes: its Hugging Face name (with "{expert}" for a 3-D stack of
    experts, split one per expert) and what llama.cpp's converter did to it."""

    name: str
    experts: bool = False
    permute: str | None = None  # "q" or "k": rows interleaved for llama.cpp's rope
    shift: float = 0.0  # stored as w + shift
    row_vector: bool = False


def tensor_target(arch: GgufArch, gguf_name: str) -> TensorTarget | None:
    """The target of a tensor, None for the config's tensors; UnsupportedModelError for a tensor
    we have no place for (so nothing in a file is silently left out)."""
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in CONFIG_TENSORS:
        return None
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        shift = arch.norm_shift if parts[0] == "output_norm" else 0.0
        return TensorTarget(f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}", shift=shift)
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit():
        _, layer, base, suffix = parts
        prefix = f"model.layers.{layer}."
        if base in _EXPERTS:
            return TensorTarget(
                f"{prefix}mlp.experts.{{expert}}.{_EXPERTS[base]}.{suffix}", experts=True
            )
        names = {**_LAYER_NAMES, "ffn_norm": arch.ffn_norm, **arch.names}
        if base in names:
            name = prefix + names[base]
            return TensorTarget(
                name if base in _PARAMETERS else f"{name}.{suffix}",
                permute={"attn_q": "q", "attn_k": "k"}.get(base) if arch.permuted else None,
                shift=arch.norm_shift if base.endswith("norm") else 0.0,
                row_vector=base in _ROW_VECTORS,
            )
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} is not supported")
