"""Rotary position embedding in the neox layout (halves rotated), applied to q and k in place of a
copy."""

from __future__ import annotations

import torch

from localchat.kernels.dispatch import use_triton


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary_dim = cos.shape[-1] * 2
    x_rot = x[..., :rotary_dim]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def rotary_embedding_ref(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D]; cos/sin: [T, rotary_dim // 2] for each token's position.

    Returns the rotated (q, k); dims past rotary_dim pass through unchanged.
    """
    cos = cos.unsqueeze(1).to(q.dtype)
    sin = sin.unsqueeze(1).to(q.dtype)
    # Rotating q and k as one tensor halves the number of small ops (this runs in every layer).
    rotated = _rotate(torch.cat((q, k), dim=1), cos, sin)
    return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]


def rotary_embedding(q, k, cos, sin):
    if use_triton(q):
        from localchat.kernels.triton_rotary import rotary_embedding_triton

        return rotary_embedding_triton(q, k, cos, sin)
    return rotary_embedding_ref(q, k, cos, sin)
