"""The per-step state the model layers read: the batch's attention metadata and the rotary cos/sin
of its positions, set by the ModelRunner around each forward pass."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from localchat.kernels.attention_metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    cos: torch.Tensor  # [num_tokens, rotary_dim // 2], gathered once per step for all layers
    sin: torch.Tensor


# a context variable, not a global: each engine steps in a thread of its own, and a server with
# several models loaded runs their forward passes at the same time
_context: ContextVar[ForwardContext | None] = ContextVar("forward_context", default=None)


def get_forward_context() -> ForwardContext:
    context = _context.get()
    assert context is not None, "layers ran outside ModelRunner.run (no forward context set)"
    return context


@contextmanager
def forward_context(context: ForwardContext):
    token = _context.set(context)
    try:
        yield context
    finally:
        _context.reset(token)
