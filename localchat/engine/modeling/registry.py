"""Which architectures we run (modeling/families.py), and how an HF config becomes our model."""

from __future__ import annotations

import copy

from localchat.engine.modeling.decoder import DecoderForCausalLM
from localchat.engine.modeling.families import BY_MODEL_TYPE, FAMILIES, TEXT_MODELS
from localchat.engine.modeling.spec import DecoderSpec
from localchat.errors import UnsupportedModelError
from localchat.models.family_names import family_of_model_type

ARCHITECTURES = tuple(FAMILIES)


def architecture_of(config) -> str:
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in FAMILIES:
            return name
    if not names and getattr(config, "model_type", None) in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[config.model_type]
    raise UnsupportedModelError(
        f"unsupported architecture {', '.join(names) or '(none given in config.json)'}; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def family_name(config) -> str:
    """The family's name ("Gemma 3", "Qwen3-MoE"), or "" where we do not run it."""
    try:
        architecture_of(text_config(config))
    except UnsupportedModelError:
        return ""
    return family_of_model_type(getattr(text_config(config), "model_type", None)) or ""


def text_config(config):
    """The config of the model we run: the text model inside a multimodal checkpoint we run the text
    part of (Gemma 3 4B and up), with the outer config's token ids; else the config itself."""
    names = list(getattr(config, "architectures", None) or [])
    inner = getattr(config, "text_config", None)
    wrapped = next((TEXT_MODELS[n] for n in names if n in TEXT_MODELS), None)
    if wrapped is None or inner is None:
        return config
    inner = copy.deepcopy(inner)
    inner.architectures = [wrapped]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(inner, key, None) is None and getattr(config, key, None) is not None:
            setattr(inner, key, getattr(config, key))
    inner.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", True))
    return inner


def spec_from_config(config) -> DecoderSpec:
    return FAMILIES[architecture_of(config)](config)


def build_model(config) -> DecoderForCausalLM:
    return DecoderForCausalLM(spec_from_config(config))
