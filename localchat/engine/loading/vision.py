"""The image encoder of a vision-language checkpoint, loaded beside its text model: from a Hugging
Face safetensors directory whose config.json names an architecture with an encoder we run
(engine/modeling/vision/registry.py). A GGUF file (llama.cpp keeps the encoder in a separate
mmproj file), random weights and tensor parallelism load none: such an engine takes no images."""

from __future__ import annotations

import torch

from localchat.engine.modeling.vision.registry import (
    ImageEncoder,
    encoder_class,
    load_image_encoder,
)


def load_vision_encoder(
    files, *, dtype: torch.dtype, device: torch.device, load_format: str, tensor_parallel_size: int
) -> ImageEncoder | None:
    """`files` (loader.ModelFiles)' image encoder on `device`, or None where it has none we run."""
    if files.source.kind == "gguf" or load_format == "dummy" or tensor_parallel_size > 1:
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(files.directory))
    except (OSError, ValueError):
        return None  # the text model's loading has said what is wrong
    if encoder_class(config) is None:
        return None
    weights = sorted(files.directory.glob("*.safetensors"))
    return load_image_encoder(config, weights, dtype=dtype, device=device)
