"""Rotary embedding tables: inverse frequencies (default or llama3-scaled) and a cos/sin cache by
position."""

from __future__ import annotations

import math

import torch

from localchat.errors import UnsupportedModelError


def rope_parameters(config) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from an HF config, old (`rope_scaling`) or new
    (`rope_parameters`)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling = params if params.get("rope_type", "default") != "default" else None
        return theta, scaling
    scaling = getattr(config, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return float(getattr(config, "rope_theta", 10000.0)), scaling


def inverse_frequencies(rotary_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Float32 inverse frequencies, computed with the same expression as Hugging Face so tables
    match."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float) / rotary_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    raise UnsupportedModelError(
        f"rope scaling {rope_type!r} is not supported (supported: llama3, linear)"
    )


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in
    # between.
    factor = scaling["factor"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTables:
    """cos/sin of position * inverse frequency for every position up to max_positions (float32)."""

    def __init__(
        self, rotary_dim: int, max_positions: int, theta: float, scaling: dict | None, device
    ):
        inv_freq = inverse_frequencies(rotary_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]
        self.cos = freqs.cos().to(device)
        self.sin = freqs.sin().to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]
