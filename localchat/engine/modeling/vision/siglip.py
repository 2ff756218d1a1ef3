"""SigLIP's vision transformer (transformers' SiglipVisionModel without its pooling head): patch
embedding, learned positions, pre-norm encoder layers with full (non-causal) attention, a final
LayerNorm. Hugging Face's parameter names, so a checkpoint's state dict loads as it is. Idefics3's
tower (SmolVLM's too) is the same but for the rows of the position table its patches read."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class SiglipAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        shape = (batch, length, self.heads, hidden // self.heads)
        q, k, v = (
            p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class SiglipMLP(nn.Module):
    def __init__(self, hidden: int, width: int, activation: str):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, width), nn.Linear(width, hidden)
        self.act = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = SiglipAttention(hidden, config.num_attention_heads)
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = SiglipMLP(hidden, config.intermediate_size, config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    """Patches plus their learned positions: row `positions[i]` of the table for patch i (row i
    where `positions` is None)."""

    def __init__(self, config, positions: torch.Tensor | None = None):
        super().__init__()
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            config.hidden_size,
            kernel_size=config.patch_size,
            stride=config.patch_size,
        )
        self.num_patches = (config.image_size // config.patch_size) ** 2
        self.position_embedding = nn.Embedding(self.num_patches, config.hidden_size)
        self.positions: torch.Tensor | None
        self.register_buffer("positions", positions, persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixel_values.to(weight.device, weight.dtype))
        table = self.position_embedding.weight
        if self.positions is not None:
            table = table[self.positions]
        return patches.flatten(2).transpose(1, 2) + table


class SiglipEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers)
        )


class SiglipVisionTower(nn.Module):
    """pixel values [n, channels, size, size] -> last hidden states [n, patches, hidden]."""

    def __init__(self, config, positions: torch.Tensor | None = None):
        super().__init__()
        self.embeddings = SiglipEmbeddings(config, positions)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return self.post_layernorm(hidden)
