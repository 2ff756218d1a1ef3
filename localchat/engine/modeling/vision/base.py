"""What the engine reads of every image encoder (engine/core/llm_engine.py, core/multimodal.py):
pixel values in, one embedding per placeholder token out."""

from __future__ import annotations

from torch import nn


class ImageEncoder(nn.Module):
    """pixel values [n, 3, image_size, image_size] -> embeddings [n, tokens_per_image, text
    hidden]: each row an image (or a tile of one) whose embeddings replace a run of
    `tokens_per_image` placeholder tokens (`image_token_id`) in the prompt."""

    # image tokens attend to each other both ways (Gemma 3); else causally, as text does
    bidirectional = False
    image_token_id: int
    tokens_per_image: int
    image_size: int  # pixels on a side
