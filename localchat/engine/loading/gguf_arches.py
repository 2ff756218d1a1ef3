"""llama.cpp's GGUF architectures we run: for each, the Hugging Face config the file stands for and
how its tensor names become Hugging Face's.

The config is read from the file's `{arch}.*` metadata as llama.cpp reads it, including what
llama.cpp fixes per architecture instead of storing (Gemma 3's five local layers to one global and
its local rope base of 10000, Gemma 2's and gpt-oss's alternating windows, SmolLM3's rope-less
every fourth layer, the 27B Gemmas' query scale, Qwen3-MoE's renormalized top-k), so a file runs
as llama.cpp runs it. What a file says that we do not run is refused by name.

Tensor conventions of llama.cpp's converter that loading undoes (engine/loading/gguf_checkpoint.py):
Q/K rows interleaved for its "normal" rope (`permuted`: the Llama-style architectures only), Gemma's
norm weights stored as 1 + w (`norm_shift`), experts stacked in one 3-D tensor per projection,
Phi-3's fused qkv and gate_up kept fused, 1-D tensors where Hugging Face has a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
from gguf import GGMLQuantizationType

from localchat.errors import UnsupportedModelError
from localchat.models.gguf_header import GGUFHeader


class GgufMeta:
    """A GGUF file's metadata and tensor table, as the config builders read them."""

    def __init__(self, header: GGUFHeader, arch: str, path: Path):
        self.header = header
        self.arch = arch
        self.path = path
        self.file_name = path.name
        self.tensors = {t.name: t for t in header.tensors}

    def field(self, key: str, default: Any = None) -> Any:
        return self.header.metadata.get(key, default)

    def get(self, key: str, default: Any = None) -> Any:
        """`{arch}.{key}`; a per-layer array whose layers all agree counts as one value."""
        value = self.field(f"{self.arch}.{key}", default)
        if isinstance(value, list) and value and not isinstance(value[0], str):
            if len(set(value)) != 1:
                self.refuse(f"{self.arch}.{key} differs between layers ({value})")
            value = value[0]
        return value

    def shape(self, name: str) -> tuple[int, ...] | None:
        """A tensor's numpy shape (rows first), None where the file has no such tensor."""
        tensor = self.tensors.get(name)
        return None if tensor is None else tuple(reversed(tensor.dims))

    def values(self, name: str) -> list[float]:
        """A float32 or float16 tensor's values, read from the file (rope factors)."""
        tensor = self.tensors[name]
        dtype = {GGMLQuantizationType.F32: "<f4", GGMLQuantizationType.F16: "<f2"}.get(
            GGMLQuantizationType(tensor.type_id)
        )
        if dtype is None:
            self.refuse(f"tensor {name} of ggml type {tensor.type_id} (not float32 or float16)")
        count = tensor.nbytes // np.dtype(dtype).itemsize
        return np.fromfile(self.path, dtype, count, offset=tensor.offset).astype(float).tolist()

    def layers_with(self, base: str) -> set[int]:
        """The blocks that hold tensor `blk.N.{base}.weight`."""
        return {
            i for i in range(self.get("block_count")) if f"blk.{i}.{base}.weight" in self.tensors
        }

    def refuse(self, what: str) -> NoReturn:
        raise UnsupportedModelError(f"{self.file_name}: {what} is not supported")


class HfConfig(NamedTuple):
    """The transformers config class, architecture and fields a file stands for."""

    config_class: str
    architecture: str
    fields: dict


@dataclass(frozen=True)
class GgufArch:
    build: Callable[[GgufMeta, dict], HfConfig]  # (file, the fields every family has) -> config
    permuted: bool = False  # llama.cpp's converter interleaved Q/K rows for its "normal" rope
    norm_shift: float = 0.0  # norm weights stored as w + norm_shift (Gemma's 1 + w)
    ffn_norm: str = "post_attention_layernorm"  # the norm before the MLP, in Hugging Face's name
    names: dict[str, str] = field(default_factory=dict)  # this architecture's own block names


# --- Hugging Face configs ------------------------------------------------------------------------


def rope_parameters(meta: GgufMeta, head_dim: int) -> dict:
    """The rotary parameters llama.cpp reads: base, scaling type and factor, yarn's original context
    and betas, longrope's factor tensors (Phi-3), a partial rotary dimension."""
    params: dict = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base", 1e4))}
    kind = meta.get("rope.scaling.type")
    factor = float(meta.get("rope.scaling.factor") or 0.0)
    # llama.cpp's default original context: the one the model was trained with
    original = meta.get("rope.scaling.original_context_length") or meta.get("context_length", 4096)
    if meta.get("rope.scaling.yarn_log_multiplier"):
        meta.refuse("rope.scaling.yarn_log_multiplier (DeepSeek's yarn)")
    if "rope_freqs.weight" in meta.tensors:  # Llama 3.1+: llama3 scaling as per-pair divisors
        params.update(llama3_from_freq_factors(meta, params["rope_theta"], head_dim))
    elif "rope_factors_long.weight" in meta.tensors:
        params.update(
            rope_type="longrope",
            long_factor=meta.values("rope_factors_long.weight"),
            short_factor=meta.values("rope_factors_short.weight"),
            original_max_position_embeddings=original,
        )
        if (attention := meta.get("rope.scaling.attn_factor")) is not None:
            params["attention_factor"] = float(attention)
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=factor, original_max_position_embeddings=original)
        for key, name in (
            ("yarn_beta_fast", "beta_fast"),
            ("yarn_beta_slow", "beta_slow"),
            ("yarn_attn_factor", "attention_factor"),
        ):
            if (value := meta.get(f"rope.scaling.{key}")) is not None:
                params[name] = float(value)
    elif kind == "linear" and factor not in (0.0, 1.0):
        params.update(rope_type="linear", factor=factor)
    elif kind not in (None, "none", "linear"):
        meta.refuse(f"rope scaling {kind!r}")
    dims = meta.get("rope.dimension_count")
    if dims and dims != head_dim:
        params["partial_rotary_factor"] = dims / head_dim
    return params


# The llama3 rope scalings Meta's models use (low_freq_factor, high_freq_factor, original context);
# the factor is the largest divisor in the file
_LLAMA3_SHAPES = [
    (low, high, original)
    for original in (8192, 4096, 16384, 2048, 32768)
    for low, high in ((1.0, 4.0), (1.0, 2.0), (0.5, 4.0), (2.0, 8.0))
]


def llama3_from_freq_factors(meta: GgufMeta, theta: float, head_dim: int) -> dict:
    """llama3 rope parameters from the `rope_freqs` tensor llama.cpp's converter writes for Llama
    3.1 and later (each rotary pair's frequency divisor): the parameters whose divisors the file's
    equal, so the model runs on transformers' own llama3 table."""
    import torch

    from localchat.engine.modeling.rotary import llama3_divisors

    divisors = torch.tensor(meta.values("rope_freqs.weight"), dtype=torch.float32)
    factor = float(divisors.max())
    dims = int(meta.get("rope.dimension_count") or head_dim)
    for low, high, original in _LLAMA3_SHAPES:
        params = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
        }
        expected = llama3_divisors(dims, theta, params)
        if expected.shape == divisors.shape and torch.allclose(expected, divisors, rtol=1e-4):
            return params
    meta.refuse("a rope_freqs tensor that no llama3 rope scaling gives")


def _sliding(meta: GgufMeta, period: int, default: int | None = None) -> dict:
    """A window on every layer but each `period`-th (llama.cpp's fixed patterns: Gemma 2 and
    gpt-oss alternate, Gemma 3 has five local layers to one global); none without a window."""
    window = meta.get("attention.sliding_window", default)
    n = meta.get("block_count")
    if not window:
        return {"sliding_window": None, "layer_types": ["full_attention"] * n}
    types = [
        "full_attention" if i % period == period - 1 else "sliding_attention" for i in range(n)
    ]
    return {"sliding_window": int(window), "layer_types": types}


def _biases(meta: GgufMeta) -> dict:
    """Projection biases, as the file has them (Llama-style configs switch them on as a whole)."""
    return {
        "attention_bias": "blk.0.attn_q.bias" in meta.tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in meta.tensors,
    }


def _experts(meta: GgufMeta, width_field: str, dense_layers: bool = False) -> dict:
    """A mixture of experts' counts and width (the experts' own length, else the MLP's), and where
    the family has them (`dense_layers`: Qwen's mlp_only_layers) the layers without experts."""
    width = meta.get("expert_feed_forward_length") or meta.get("feed_forward_length")
    fields = {"num_experts_per_tok": meta.get("expert_used_count"), width_field: width}
    dense = sorted(set(range(meta.get("block_count"))) - meta.layers_with("ffn_gate_inp"))
    if dense and not dense_layers:
        meta.refuse(f"a {meta.arch} file with layers {dense} without experts")
    if dense:  # llama.cpp runs experts on every layer; a file may still leave some dense
        fields["mlp_only_layers"] = dense
    return fields


def _norm_topk(meta: GgufMeta, default: bool) -> bool:
    value = meta.get("expert_weights_norm")
    return default if value is None else bool(value)


def _llama(meta: GgufMeta, common: dict) -> HfConfig:
    fields = {**common, **_biases(meta)}
    if meta.get("expert_count"):  # Mixtral's files say "llama"
        fields.update(num_local_experts=meta.get("expert_count"))
        fields.update(_experts(meta, "intermediate_size"))
        return HfConfig("MixtralConfig", "MixtralForCausalLM", fields)
    return HfConfig("LlamaConfig", "LlamaForCausalLM", fields)


def _plain(config_class: str, architecture: str) -> Callable[[GgufMeta, dict], HfConfig]:
    return lambda meta, common: HfConfig(config_class, architecture, common)


def _query_scalar(common: dict, layers_27b: int) -> int:
    """Gemma 2 and 3 scale queries by head_dim ** -0.5, the 27B models by (hidden / heads) ** -0.5
    (llama.cpp tells the 27B by its layer count; the file stores neither)."""
    if common["num_hidden_layers"] == layers_27b:
        return common["hidden_size"] // common["num_attention_heads"]
    return common["head_dim"]


def _gemma2(meta: GgufMeta, common: dict) -> HfConfig:
    fields = {
        **common,
        **_sliding(meta, 2, default=4096),
        "query_pre_attn_scalar": _query_scalar(common, 46),
        "attn_logit_softcapping": meta.get("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": meta.get("final_logit_softcapping", 30.0),
    }
    return HfConfig("Gemma2Config", "Gemma2ForCausalLM", fields)


def _gemma3(meta: GgufMeta, common: dict) -> HfConfig:
    full = common.pop("rope_parameters")
    local = {"rope_type": "default", "rope_theta": float(meta.get("rope.freq_base_swa", 10000.0))}
    fields = {
        **common,
        **_sliding(meta, 6),
        "rope_parameters": {"full_attention": full, "sliding_attention": local},
        "query_pre_attn_scalar": _query_scalar(common, 62),
        "final_logit_softcapping": meta.get("final_logit_softcapping"),
        "attn_logit_softcapping": None,
    }
    return HfConfig("Gemma3TextConfig", "Gemma3ForCausalLM", fields)


def _phi3(meta: GgufMeta, common: dict) -> HfConfig:
    original = meta.get("rope.scaling.original_context_length")
    fields = {
        **common,
        # llama.cpp runs Phi-3 without its window; we keep Hugging Face's semantics
        "sliding_window": meta.get("attention.sliding_window") or None,
        "original_max_position_embeddings": original or common["max_position_embeddings"],
        "partial_rotary_factor": common["rope_parameters"].get("partial_rotary_factor", 1.0),
    }
    return HfConfig("Phi3Config", "Phi3ForCausalLM", fields)


def _olmo2(meta: GgufMeta, common: dict) -> HfConfig:
    if meta.get("attention.sliding_window"):
        meta.refuse("olmo2 with a sliding window (OLMo 3)")
    return HfConfig("Olmo2Config", "Olmo2ForCausalLM", common)


def _granite(meta: GgufMeta, common: dict) -> HfConfig:
    fields = {
        **common,
        **_biases(meta),
        "embedding_multiplier": meta.get("embedding_scale", 1.0),
        "residual_multiplier": meta.get("residual_scale", 1.0),
        "attention_multiplier": meta.get("attention.scale", 1.0),
        "logits_scaling": meta.get("logit_scale", 1.0),
    }
    return HfConfig("GraniteConfig", "GraniteForCausalLM", fields)


def _smollm3(meta: GgufMeta, common: dict) -> HfConfig:
    n = common["num_hidden_layers"]
    fields = {
        **common,
        **_biases(meta),
        "no_rope_layer_interval": 4,  # llama.cpp: every fourth layer has no rope
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(n)],
    }
    return HfConfig("SmolLM3Config", "SmolLM3ForCausalLM", fields)


def _qwen2moe(meta: GgufMeta, common: dict) -> HfConfig:
    shared = meta.get("expert_shared_feed_forward_length")
    if shared is None and (shape := meta.shape("blk.0.ffn_up_shexp.weight")) is not None:
        shared = shape[0]
    fields = {
        **common,
        **_experts(meta, "moe_intermediate_size", dense_layers=True),
        "num_experts": meta.get("expert_count"),
        "shared_expert_intermediate_size": shared or 0,
        "norm_topk_prob": _norm_topk(meta, False),
        "qkv_bias": "blk.0.attn_q.bias" in meta.tensors,
    }
    return HfConfig("Qwen2MoeConfig", "Qwen2MoeForCausalLM", fields)


def _qwen3moe(meta: GgufMeta, common: dict) -> HfConfig:
    fields = {
        **common,
        **_experts(meta, "moe_intermediate_size", dense_layers=True),
        "num_experts": meta.get("expert_count"),
        "norm_topk_prob": _norm_topk(meta, True),  # llama.cpp renormalizes Qwen3-MoE's top k
    }
    return HfConfig("Qwen3MoeConfig", "Qwen3MoeForCausalLM", fields)


def _olmoe(meta: GgufMeta, common: dict) -> HfConfig:
    if meta.get("attention.clamp_kqv"):
        meta.refuse("attention.clamp_kqv (OLMoE's clip_qkv)")
    fields = {
        **common,
        **_experts(meta, "intermediate_size"),
        "num_experts": meta.get("expert_count"),
        "norm_topk_prob": _norm_topk(meta, False),
    }
    return HfConfig("OlmoeConfig", "OlmoeForCausalLM", fields)


def _gpt_oss(meta: GgufMeta, common: dict) -> HfConfig:
    # yarn as llama.cpp runs it, its correction range rounded to whole dimensions (Hugging Face's
    # truncate=True), where gpt-oss's own config says truncate=False: no key tells the two apart
    fields = {
        **common,
        **_sliding(meta, 2),
        **_experts(meta, "intermediate_size"),
        "num_local_experts": meta.get("expert_count"),
        "attention_bias": True,
    }
    return HfConfig("GptOssConfig", "GptOssForCausalLM", fields)


# llama.cpp's architecture name -> how to read it
ARCHES: dict[str, GgufArch] = {
    "llama": GgufArch(_llama, permuted=True),
    "qwen2": GgufArch(_plain("Qwen2Config", "Qwen2ForCausalLM")),
    "qwen3": GgufArch(_plain("Qwen3Config", "Qwen3ForCausalLM")),
    "gemma": GgufArch(_plain("GemmaConfig", "GemmaForCausalLM"), norm_shift=1.0),
    "gemma2": GgufArch(_gemma2, ffn_norm="pre_feedforward_layernorm", norm_shift=1.0),
    "gemma3": GgufArch(_gemma3, ffn_norm="pre_feedforward_layernorm", norm_shift=1.0),
    "phi3": GgufArch(_phi3, names={"ffn_up": "mlp.gate_up_proj"}),  # gate and up, fused
    "olmo2": GgufArch(_olmo2),
    "granite": GgufArch(_granite, permuted=True),
    "smollm3": GgufArch(_smollm3, permuted=True),
    "qwen2moe": GgufArch(_qwen2moe),
    "qwen3moe": GgufArch(_qwen3moe),
    "olmoe": GgufArch(_olmoe),
    "gpt-oss": GgufArch(_gpt_oss),
}
