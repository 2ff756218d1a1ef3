"""The per-step state the model layers read: the batch's attention metadata and the rotary cos/sin
of its positions, set by the ModelRunner around each forward pass."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from localchat.kernels.attention_metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    cos: torch.Tensor  # [num_tokens, rotary_dim // 2], gathered once per step for all layers
    sin: torch.Tensor


_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    assert _context is not None, "layers ran outside ModelRunner.run (no forward context set)"
    return _context


@contextmanager
def forward_context(context: ForwardContext):
    global _context
    previous, _context = _context, context
    try:
        yield context
    finally:
        _context = previous
