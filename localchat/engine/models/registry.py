"""Which architectures we run, and how an HF config becomes a DecoderSpec."""

from __future__ import annotations

from localchat.engine.models.decoder import DecoderForCausalLM, DecoderSpec
from localchat.errors import UnsupportedModelError

# architecture -> flags that differ from plain Llama
ARCHITECTURES: dict[str, dict] = {
    "LlamaForCausalLM": {},
    "MistralForCausalLM": {},
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
}


_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def architecture_of(config) -> str:
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            return name
    if not names and getattr(config, "model_type", None) in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[config.model_type]
    raise UnsupportedModelError(
        f"unsupported architecture {', '.join(names) or '(none given in config.json)'}; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def spec_from_config(config) -> DecoderSpec:
    arch = architecture_of(config)
    flags = ARCHITECTURES[arch]
    if arch == "LlamaForCausalLM" and (
        getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    ):
        raise UnsupportedModelError(
            "Llama models with attention_bias or mlp_bias are not supported"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only silu)")
    num_heads = config.num_attention_heads
    return DecoderSpec(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=flags.get("qkv_bias", False),
        qk_norm=flags.get("qk_norm", False),
    )


def build_model(config) -> DecoderForCausalLM:
    return DecoderForCausalLM(spec_from_config(config))
