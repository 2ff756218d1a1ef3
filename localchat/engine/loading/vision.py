"""The image encoder of a vision-language model, loaded beside its text model: from a Hugging Face
safetensors directory whose config.json names an architecture with an encoder we run
(engine/modeling/vision/registry.py), or for a GGUF model from llama.cpp's image encoder file of it
(an mmproj GGUF, engine/loading/mmproj.py): the one named by the engine's `mmproj` option, else the
one found beside the model in its directory or pulled repo (models/source.py). Random weights load
none (an mmproj named for them is refused), nor does `mmproj='none'`: such an engine takes no
images. Under tensor parallelism the encoder loads whole on rank 0 (this process) alone, which
broadcasts each step's image embeddings to the other ranks (engine/distributed/step_transfer.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from localchat.engine.modeling.vision.registry import (
    ImageEncoder,
    encoder_class,
    load_image_encoder,
)
from localchat.errors import InvalidParameterError, ModelNotFoundError

logger = logging.getLogger("localchat.engine")
NO_MMPROJ = "none"  # the mmproj option's value that loads no image encoder


@dataclass(frozen=True)
class Vision:
    """A loaded image encoder, and where the image processor is read from: the model's own
    directory (None), or for a GGUF model the directory made with its mmproj file."""

    encoder: ImageEncoder
    processor_dir: Path | None = None


def load_vision_encoder(
    files,
    *,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str,
    mmproj: str | None = None,
    text_config=None,
    tokenizer=None,
    progress: Callable[[str], None] | None = None,
) -> Vision | None:
    """`files` (loader.ModelFiles)' image encoder on `device`, or None where it has none we run;
    `mmproj`, `text_config` and `tokenizer` (the engine's option, the text model's config and
    tokenizer) for a GGUF model's."""
    if mmproj == NO_MMPROJ:
        return None
    if files.source.kind == "gguf":
        return _from_mmproj(
            files,
            mmproj,
            text_config,
            tokenizer,
            dtype=dtype,
            device=device,
            unsupported=_no_encoder_with(load_format),
            progress=progress,
        )
    if mmproj is not None:
        raise InvalidParameterError(
            f"--mmproj goes with a GGUF model; {files.source.path.name} is a safetensors "
            "checkpoint, whose image encoder (if any) loads from its own weights",
            param="mmproj",
        )
    if _no_encoder_with(load_format):
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(files.directory))
    except (OSError, ValueError):
        return None  # the text model's loading has said what is wrong
    if encoder_class(config) is None:
        return None
    weights = sorted(files.directory.glob("*.safetensors"))
    encoder = load_image_encoder(config, weights, dtype=dtype, device=device)
    return None if encoder is None else Vision(encoder)


def _no_encoder_with(load_format: str) -> str | None:
    """Why an engine of these settings loads no image encoder, None where it does."""
    if load_format == "dummy":
        return "random weights (--load-format dummy)"
    return None


def _from_mmproj(
    files,
    mmproj: str | None,
    text_config,
    tokenizer,
    *,
    dtype: torch.dtype,
    device: torch.device,
    unsupported: str | None,
    progress: Callable[[str], None] | None,
) -> Vision | None:
    from localchat.engine.loading.mmproj import (
        image_directory,
        load_encoder,
        multimodal_config,
        read_mmproj,
    )

    path = files.source.mmproj if mmproj is None else Path(mmproj).expanduser()
    if path is None:
        return None
    if unsupported is not None:
        if mmproj is None:  # found beside the model: left out, as a safetensors VLM's encoder is
            return None
        raise InvalidParameterError(
            f"--mmproj: images are not supported with {unsupported}", param="mmproj"
        )
    if not path.is_file():
        raise ModelNotFoundError(f"--mmproj {mmproj}: no such file")
    if tokenizer is None:
        raise ModelNotFoundError(f"{path.name}: images need the model's tokenizer")
    where = " (found beside the model)" if mmproj is None else ""
    message = f"loading the image encoder {path.name}{where}"
    logger.info("%s", message)
    if progress is not None:
        progress(message)
    mm = read_mmproj(path)
    config = multimodal_config(mm, text_config, tokenizer, files.source.path.name)
    encoder = load_encoder(mm, config, dtype=dtype, device=device)
    return Vision(encoder, image_directory(mm, config, files.source.path, files.directory))
