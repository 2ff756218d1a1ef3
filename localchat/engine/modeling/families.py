"""The model families we run: how each one's HF config becomes a DecoderSpec.

Each family is a Llama layer with some of DecoderSpec's variations switched on; the functions here
read them from the config with transformers' own field names. A config that asks for something we do
not run (an activation, a projection bias on a family without one) is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable

from localchat.engine.modeling.spec import Activation, DecoderSpec, LayerSpec, MoESpec
from localchat.errors import UnsupportedModelError

_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}


def _activation(config, name: str = "hidden_act") -> Activation:
    act = getattr(config, name, None) or "silu"
    if act not in _ACTIVATIONS:
        raise UnsupportedModelError(
            f"{name} {act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[act]


def _common(config, family: str, **fields) -> dict:
    num_heads = config.num_attention_heads
    fields = {
        "family": family,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": num_heads,
        "num_kv_heads": getattr(config, "num_key_value_heads", None) or num_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // num_heads,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "activation": _activation(config),
        **fields,
    }
    if getattr(config, "attention_bias", False):
        fields["qkv_bias"] = fields["o_bias"] = True
    if getattr(config, "mlp_bias", False):
        fields["mlp_bias"] = True
    return fields


def _rope_keys(config) -> list[str]:
    """Each layer's rotary table: its layer type where the config nests rotary parameters by layer
    type (Gemma 3), else the one table."""
    params = getattr(config, "rope_parameters", None) or {}
    types = getattr(config, "layer_types", None)
    if types and any(isinstance(params.get(t), dict) for t in set(types)):
        return list(types)
    return ["default"] * config.num_hidden_layers


def _windows(config, every_layer: bool = False) -> list[int | None]:
    """Each layer's sliding window: on the layers typed "sliding_attention", or on every layer
    where the family has no layer types (Mistral, Phi-3), unless use_sliding_window is off."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return [None] * n
    types = getattr(config, "layer_types", None)
    if types and not every_layer:
        return [window if t == "sliding_attention" else None for t in types]
    return [int(window)] * n


def _layers(config, *, moe: list[bool] | None = None, rope: list | None = None, **window_options):
    n = config.num_hidden_layers
    windows = _windows(config, **window_options)
    ropes = rope if rope is not None else _rope_keys(config)
    moes = moe or [False] * n
    layers = tuple(
        LayerSpec(sliding_window=windows[i], rope=ropes[i], moe=moes[i]) for i in range(n)
    )
    return () if all(layer == LayerSpec() for layer in layers) else layers


def llama(config) -> DecoderSpec:
    return DecoderSpec(**_common(config, "llama"), layers=_layers(config))


def mistral(config) -> DecoderSpec:
    return DecoderSpec(**_common(config, "mistral"), layers=_layers(config, every_layer=True))


def qwen2(config) -> DecoderSpec:
    return DecoderSpec(**_common(config, "qwen2", qkv_bias=True), layers=_layers(config))


def qwen3(config) -> DecoderSpec:
    return DecoderSpec(**_common(config, "qwen3", qk_norm=True), layers=_layers(config))


def _gemma(config, family: str, **fields) -> DecoderSpec:
    return DecoderSpec(
        **_common(config, family, norm_offset=1.0, embed_scale=config.hidden_size**0.5, **fields),
        layers=_layers(config),
    )


def gemma(config) -> DecoderSpec:
    # Gemma 1: pre-norms; transformers reads its activation from hidden_act
    return _gemma(config, "gemma")


def gemma2(config) -> DecoderSpec:
    return _gemma(
        config,
        "gemma2",
        activation=_activation(config, "hidden_activation"),
        norms="sandwich",
        attn_scale=config.query_pre_attn_scalar**-0.5,
        attn_softcap=getattr(config, "attn_logit_softcapping", None),
        final_softcap=getattr(config, "final_logit_softcapping", None),
    )


def gemma3(config) -> DecoderSpec:
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(
            "Gemma 3 with bidirectional attention (an encoder) is not a chat model"
        )
    return _gemma(
        config,
        "gemma3",
        activation=_activation(config, "hidden_activation"),
        norms="sandwich",
        qk_norm=True,
        attn_scale=config.query_pre_attn_scalar**-0.5,
        attn_softcap=getattr(config, "attn_logit_softcapping", None),
        final_softcap=getattr(config, "final_logit_softcapping", None),
    )


def phi3(config) -> DecoderSpec:
    return DecoderSpec(**_common(config, "phi3"), layers=_layers(config, every_layer=True))


def olmo2(config) -> DecoderSpec:
    return DecoderSpec(
        **_common(config, "olmo2", norms="post", qk_norm_full=True), layers=_layers(config)
    )


def granite(config) -> DecoderSpec:
    return DecoderSpec(
        **_common(
            config,
            "granite",
            embed_scale=float(config.embedding_multiplier),
            residual_scale=float(config.residual_multiplier),
            attn_scale=float(config.attention_multiplier),
            logits_divisor=float(config.logits_scaling),
        ),
        layers=_layers(config),
    )


def smollm3(config) -> DecoderSpec:
    keys = _rope_keys(config)
    uses_rope = getattr(config, "no_rope_layers", None) or [1] * config.num_hidden_layers
    rope = [key if uses_rope[i] else None for i, key in enumerate(keys)]
    return DecoderSpec(**_common(config, "smollm3"), layers=_layers(config, rope=rope))


def _qwen_moe_layers(config) -> list[bool]:
    """Qwen's sparse layers: every decoder_sparse_step-th, except mlp_only_layers."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    return [
        config.num_experts > 0 and i not in dense and (i + 1) % step == 0
        for i in range(config.num_hidden_layers)
    ]


def _moe(config, num_experts: int, width: int, **fields) -> MoESpec:
    return MoESpec(
        num_experts=num_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=width,
        **fields,
    )


def qwen2_moe(config) -> DecoderSpec:
    moe = _moe(
        config,
        config.num_experts,
        config.moe_intermediate_size,
        normalize_topk=bool(getattr(config, "norm_topk_prob", False)),
        shared_expert_size=config.shared_expert_intermediate_size,
        shared_expert_gate=True,
    )
    return DecoderSpec(
        **_common(config, "qwen2_moe", qkv_bias=bool(getattr(config, "qkv_bias", True)), moe=moe),
        layers=_layers(config, moe=_qwen_moe_layers(config)),
    )


def qwen3_moe(config) -> DecoderSpec:
    moe = _moe(
        config,
        config.num_experts,
        config.moe_intermediate_size,
        normalize_topk=bool(getattr(config, "norm_topk_prob", True)),
    )
    return DecoderSpec(
        **_common(config, "qwen3_moe", qk_norm=True, moe=moe),
        layers=_layers(config, moe=_qwen_moe_layers(config)),
    )


def mixtral(config) -> DecoderSpec:
    moe = _moe(config, config.num_local_experts, config.intermediate_size, normalize_topk=True)
    n = config.num_hidden_layers
    return DecoderSpec(
        **_common(config, "mixtral", moe=moe),
        layers=_layers(config, moe=[True] * n, every_layer=True),
    )


def olmoe(config) -> DecoderSpec:
    moe = _moe(
        config,
        config.num_experts,
        config.intermediate_size,
        normalize_topk=bool(getattr(config, "norm_topk_prob", False)),
    )
    n = config.num_hidden_layers
    return DecoderSpec(
        **_common(config, "olmoe", qk_norm_full=True, moe=moe),
        layers=_layers(config, moe=[True] * n),
    )


def gpt_oss(config) -> DecoderSpec:
    moe = _moe(
        config,
        config.num_local_experts,
        config.intermediate_size,
        routing="topk_softmax",
        router_bias=True,
        expert_bias=True,
    )
    n = config.num_hidden_layers
    return DecoderSpec(
        **_common(
            config,
            "gpt_oss",
            activation="swiglu_oai",
            swiglu_limit=float(getattr(config, "swiglu_limit", 7.0)),
            swiglu_alpha=float(getattr(config, "swiglu_alpha", 1.702)),
            attention_sinks=True,
            moe=moe,
        ),
        layers=_layers(config, moe=[True] * n),
    )


# architecture -> its family's spec from its config (names: localchat/models/family_names.py)
FAMILIES: dict[str, Callable[[object], DecoderSpec]] = {
    "LlamaForCausalLM": llama,
    "MistralForCausalLM": mistral,
    "Qwen2ForCausalLM": qwen2,
    "Qwen3ForCausalLM": qwen3,
    "GemmaForCausalLM": gemma,
    "Gemma2ForCausalLM": gemma2,
    "Gemma3ForCausalLM": gemma3,
    "Phi3ForCausalLM": phi3,
    "Olmo2ForCausalLM": olmo2,
    "GraniteForCausalLM": granite,
    "SmolLM3ForCausalLM": smollm3,
    "Qwen2MoeForCausalLM": qwen2_moe,
    "Qwen3MoeForCausalLM": qwen3_moe,
    "MixtralForCausalLM": mixtral,
    "OlmoeForCausalLM": olmoe,
    "GptOssForCausalLM": gpt_oss,
}

# model_type -> architecture, for configs that name no architecture
BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}

# multimodal checkpoints whose text model we run: architecture -> the text model's architecture,
# or None where its text_config's model_type names it (a Llama in SmolVLM's and Idefics3's)
TEXT_MODELS: dict[str, str | None] = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Idefics3ForConditionalGeneration": None,
    "SmolVLMForConditionalGeneration": None,
}
