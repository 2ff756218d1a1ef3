"""Which multimodal architectures have an image encoder we run, and how it is built and loaded
from a safetensors checkpoint (the tensors under the tower's and projector's names)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch

from localchat.engine.modeling.vision.base import ImageEncoder
from localchat.engine.modeling.vision.gemma3_vision import Gemma3ImageEncoder
from localchat.engine.modeling.vision.idefics3_vision import Idefics3ImageEncoder
from localchat.errors import ModelNotFoundError

ENCODERS: dict[str, type[ImageEncoder]] = {
    "Gemma3ForConditionalGeneration": Gemma3ImageEncoder,
    "Idefics3ForConditionalGeneration": Idefics3ImageEncoder,  # SmolVLM (v1) too
    "SmolVLMForConditionalGeneration": Idefics3ImageEncoder,  # SmolVLM2
}
# a checkpoint's other spellings of the encoder's names (transformers 4's and 5's)
_RENAMES = (
    (re.compile(r"^(model\.)?vision_tower\.(vision_model\.)?"), "vision_tower."),
    (re.compile(r"^(model\.)?multi_modal_projector\."), "multi_modal_projector."),
    (re.compile(r"^(model\.)?vision_model\."), "vision_model."),
    (re.compile(r"^(model\.)?connector\."), "connector."),
)


def encoder_class(config) -> type[ImageEncoder] | None:
    """The image encoder of `config` (the checkpoint's outer config), or None for a text model."""
    for name in getattr(config, "architectures", None) or []:
        if name in ENCODERS and getattr(config, "vision_config", None) is not None:
            return ENCODERS[name]
    return None


def encoder_names(names: Iterable[str]) -> dict[str, str]:
    """checkpoint name -> the encoder's parameter name, for the checkpoint's encoder tensors."""
    found = {}
    for name in names:
        for pattern, prefix in _RENAMES:
            if pattern.match(name):
                found[name] = pattern.sub(prefix, name, count=1)
    return found


def load_image_encoder(
    config, files: list[Path], *, dtype: torch.dtype, device: torch.device
) -> ImageEncoder | None:
    """The checkpoint's image encoder with its weights, or None where the model has none or the
    checkpoint holds only its text model."""
    cls = encoder_class(config)
    if cls is None:
        return None
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name, ours in encoder_names(handle.keys()).items():
                state[ours] = handle.get_tensor(name)
    if not state:
        return None
    encoder = cls(config)
    wanted = set(encoder.state_dict())
    state = {k: v for k, v in state.items() if k in wanted}  # SigLIP's unused pooling head
    missing = sorted(wanted - set(state))
    if missing:
        raise ModelNotFoundError(f"checkpoint lacks image encoder weights {', '.join(missing[:5])}")
    encoder.load_state_dict(state)
    return encoder.to(device, dtype).eval().requires_grad_(False)
