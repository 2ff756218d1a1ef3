"""Gemma 3's image encoder: the SigLIP tower, then the multi-modal projector (an average pool of
the patch grid down to mm_tokens_per_image, an RMSNorm that multiplies by (1 + weight), a
projection into the text model's width), as transformers' Gemma3Model.get_image_features."""

from __future__ import annotations

import torch
from torch import nn

from localchat.engine.modeling.vision.base import ImageEncoder
from localchat.engine.modeling.vision.siglip import SiglipVisionTower


class _NormWeight(nn.Module):
    """Holds the soft-embedding norm's weight under its Hugging Face name."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))


class Gemma3Projector(nn.Module):
    def __init__(self, config):
        super().__init__()
        vision, text = config.vision_config, config.text_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(vision.hidden_size, text.hidden_size)
        )
        self.mm_soft_emb_norm = _NormWeight(vision.hidden_size)
        self.eps = vision.layer_norm_eps
        self.patches_per_side = vision.image_size // vision.patch_size
        tokens_per_side = int(config.mm_tokens_per_image**0.5)
        self.kernel = self.patches_per_side // tokens_per_side

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        batch, _, hidden = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(batch, hidden, side, side).contiguous()
        pooled = nn.functional.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.mm_soft_emb_norm.weight.float()
        normed = (normed * (1.0 + weight)).type_as(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(patches)


class Gemma3ImageEncoder(ImageEncoder):
    """pixel values [n, 3, size, size] -> image embeddings [n, mm_tokens_per_image, text hidden]."""

    # image tokens attend to each other both ways (transformers' token_type_ids mask)
    bidirectional = True

    def __init__(self, config):
        super().__init__()
        self.vision_tower = SiglipVisionTower(config.vision_config)
        self.multi_modal_projector = Gemma3Projector(config)
        self.image_token_id = int(config.image_token_id)
        self.tokens_per_image = int(config.mm_tokens_per_image)
        self.image_size = int(config.vision_config.image_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixel_values))
