"""The per-step state the model layers read: the batch's attention metadata and the rotary cos/sin
of its positions (one pair per rotary table), set by the ModelRunner around each forward pass."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from localchat.engine.core.multimodal import StepImages
from localchat.kernels.attention_metadata import AttentionMetadata


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    # cos/sin [num_tokens, rotary_dim // 2] of each rotary table (see engine/modeling/rotary.py),
    # gathered once per step for all layers; cos/sin: the "default" table's
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]
    # the step's image rows and bidirectional image spans (engine/core/multimodal.py), if any
    images: StepImages | None = None

    @property
    def cos(self) -> torch.Tensor:
        return self.rope["default"][0]

    @property
    def sin(self) -> torch.Tensor:
        return self.rope["default"][1]


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
