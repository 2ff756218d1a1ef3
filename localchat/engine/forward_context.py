"""The one piece of per-step state the model layers read: where this step's tokens go in the KV
pool."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Flat description of one mixed batch, built once per step by the ModelRunner.

    The batch is ordered with single-token queries (decodes) first: sequences [0, num_decodes) have
    one query token each. Sequence i's queries are tokens query_start_loc[i]:query_start_loc[i+1];
    they are the last ones of its seq_lens[i] tokens, whose keys live in the blocks block_tables[i]
    (-1 pads the rows). slot_mapping[t] is the pool slot (block * block_size + offset) where token
    t's key/value is stored; -1 marks a padding token whose key/value is not stored.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    # Host copies for code that plans on the CPU (the reference kernels), so no device sync is
    # needed.
    seq_lens_cpu: list[int] = field(default_factory=list)
    query_start_loc_cpu: list[int] = field(default_factory=list)
    scratch: dict = field(default_factory=dict)  # per-step memo for kernels (e.g. gather indices)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)


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
