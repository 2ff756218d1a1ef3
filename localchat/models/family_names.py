"""The model families localchat runs, by name: what `list`, `show`, the chat and the engine call a
model, from its config's model_type or its GGUF file's architecture. The engine's forward passes
(engine/modeling/families.py) run exactly these."""

from __future__ import annotations

# Hugging Face model_type -> family name
FAMILY_NAMES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",  # the multimodal checkpoint: its text model
    "gemma3_text": "Gemma 3",
    "smolvlm": "SmolVLM",  # the multimodal checkpoints: their Llama text model
    "idefics3": "Idefics3",
    "phi3": "Phi-3",
    "olmo2": "OLMo 2",
    "granite": "Granite",
    "smollm3": "SmolLM3",
    "qwen2_moe": "Qwen2-MoE",
    "qwen3_moe": "Qwen3-MoE",
    "mixtral": "Mixtral",
    "olmoe": "OLMoE",
    "gpt_oss": "gpt-oss",
}
# llama.cpp's GGUF architecture -> Hugging Face model_type (Mixtral's files say "llama")
GGUF_MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "olmo2": "olmo2",
    "granite": "granite",
    "smollm3": "smollm3",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "olmoe": "olmoe",
    "gpt-oss": "gpt_oss",
}


def family_of_model_type(model_type: str | None) -> str | None:
    return FAMILY_NAMES.get(model_type or "")


def family_of_gguf(architecture: str | None, expert_count: int | None = None) -> str | None:
    """The family of a GGUF file by its architecture (a "llama" file with experts is Mixtral)."""
    if architecture == "llama" and expert_count:
        return FAMILY_NAMES["mixtral"]
    return family_of_model_type(GGUF_MODEL_TYPES.get(architecture or ""))
