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
    model_type = getattr(config, "model_type", None)
    if not names and model_type in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[model_type]
    given = ", ".join(names) or (
        f"(config.json names none; its model_type is {model_type or 'unset'})"
    )
    raise UnsupportedModelError(
        f"unsupported architecture {given}; supported: {', '.join(ARCHITECTURES)}"
    )


def family_name(config) -> str:
    """The family's name ("Gemma 3", "Qwen3-MoE"), or "" where we do not run it."""
    try:
        inner = text_config(config)
        architecture_of(inner)
    except UnsupportedModelError:
        return ""
    return family_of_model_type(getattr(inner, "model_type", None)) or ""


def text_config(config):
    """The config of the model we run: the text model inside a multimodal checkpoint we run the text
    part of (Gemma 3 4B and up, SmolVLM, Idefics3), with the outer config's token ids; else the
    config itself. UnsupportedModelError where we do not run the checkpoint's text model."""
    names = list(getattr(config, "architectures", None) or [])
    inner = getattr(config, "text_config", None)
    outer = next((n for n in names if n in TEXT_MODELS), None)
    if outer is None or inner is None:
        return config
    model_type = getattr(inner, "model_type", None)
    wrapped = TEXT_MODELS[outer] or BY_MODEL_TYPE.get(model_type or "")
    if wrapped is None or wrapped not in FAMILIES:
        raise UnsupportedModelError(
            f"{outer}'s text model ({model_type or 'no model_type in its text_config'}) is not "
            f"supported; supported text models: {', '.join(sorted(BY_MODEL_TYPE))}"
        )
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
