"""Idefics3's image encoder (SmolVLM's is the same): the SigLIP tower, then the connector, a pixel
shuffle (each scale_factor x scale_factor block of patches into one token of scale_factor**2 times
the width) and a linear projection into the text model's width, as transformers'
Idefics3Model.get_image_features.

The image processor cuts a picture into tiles of the tower's image_size plus the whole picture
scaled to one tile; each tile is an image here, its tokens a run of their own in the prompt. Every
tile is whole (the processor pads none), so the patch attention mask is all ones and the tower is
SigLIP's but for the position ids, which transformers buckets from each patch's fractional place
on the grid: `patch_positions` computes them as it does, in float32, which for some grid sizes
puts two patches in one bucket.
"""

from __future__ import annotations

import torch
from torch import nn

from localchat.engine.modeling.vision.base import ImageEncoder
from localchat.engine.modeling.vision.siglip import SiglipVisionTower
from localchat.errors import UnsupportedModelError


def patch_positions(side: int) -> torch.Tensor:
    """The position ids of a whole tile's side x side patches, in row-major order (transformers'
    Idefics3VisionEmbeddings with an all-ones patch mask)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    step = 1.0 / torch.tensor([side])
    fractions = torch.arange(side, dtype=torch.float32)[None, :] * step[:, None]
    buckets = torch.bucketize(torch.clamp(fractions, max=1.0 - 1e-6), boundaries, right=True)[0]
    return (buckets[:, None] * side + buckets[None, :]).flatten()


class _Projection(nn.Module):
    """Holds the connector's projection under its Hugging Face name (modality_projection.proj)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(width, hidden, bias=False)


class Idefics3Connector(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scale = int(config.scale_factor)
        width = config.vision_config.hidden_size * self.scale**2
        self.modality_projection = _Projection(width, config.text_config.hidden_size)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = patches.shape
        side, scale = int(length**0.5), self.scale
        x = patches.reshape(batch, side, side // scale, hidden * scale).permute(0, 2, 1, 3)
        x = x.reshape(batch, side // scale, side // scale, hidden * scale**2).permute(0, 2, 1, 3)
        x = x.reshape(batch, length // scale**2, hidden * scale**2)
        return self.modality_projection.proj(x)


class Idefics3ImageEncoder(ImageEncoder):
    """pixel values [n, 3, size, size] (tiles) -> embeddings [n, image_seq_len, text hidden]."""

    def __init__(self, config):
        super().__init__()
        vision = config.vision_config
        side = vision.image_size // vision.patch_size
        scale = int(config.scale_factor)
        if side % scale:
            raise UnsupportedModelError(
                f"the vision tower's {side} x {side} patch grid does not pixel-shuffle by "
                f"scale_factor {scale}"
            )
        self.vision_model = SiglipVisionTower(vision, patch_positions(side))
        self.connector = Idefics3Connector(config)
        self.image_token_id = int(config.image_token_id)
        self.tokens_per_image = (side // scale) ** 2
        self.image_size = int(vision.image_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.connector(self.vision_model(pixel_values))
