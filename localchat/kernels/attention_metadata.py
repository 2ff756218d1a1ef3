"""Where one step's tokens go in the KV pool: the batch description the attention kernels read, and
the per-step memos they keep on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch


@dataclass
class ReferencePlan:
    """The torch reference attention's gather plan for one step, shared by all its layers."""

    decode_slots: torch.Tensor | None  # [num_decodes, max_len] pool slots of each decode's keys
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_len] True where a key exists
    # (q_start, q_end, key slots, prefix length): the slots of the keys gathered (under a sliding
    # window, from the first one the first query sees), the keys among them before the queries
    prefills: list[tuple[int, int, torch.Tensor, int]]


class DecodePartials(NamedTuple):
    """The Triton split-K decode's float32 partial results, shared by a step's layers (they run one
    after another on one stream): acc [decodes, heads, splits, D], max and sum [decodes, heads,
    splits]."""

    acc: torch.Tensor
    max: torch.Tensor
    sum: torch.Tensor


@dataclass
class AttentionMetadata:
    """Flat description of one mixed batch, built once per step by the ModelRunner.

    The batch is ordered with single-token queries (decodes) first: sequences [0, num_decodes) have
    one query token each. Sequence i's queries are tokens query_start_loc[i]:query_start_loc[i+1];
    they are the last ones of its seq_lens[i] tokens, whose keys live in the blocks block_tables[i]
    (-1 pads the rows). slot_mapping[t] is the pool slot (block * block_size + offset) where token
    t's key/value is stored; -1 marks a padding token whose key/value is not stored.

    A model with sliding-window layers has several KV groups (engine/core/kv_groups.py), each with
    its own blocks: this is the first group's view of the batch, and `group_views` the others' (the
    same sequences and queries, their own slot mapping and block tables, in which a sliding group's
    blocks before its window are -1: no kernel reads a key before a query's window).
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
    # Made by the first layer that needs them, reused by the step's other layers.
    reference_plan: ReferencePlan | None = field(default=None, repr=False, compare=False)
    # the same for a sliding window, one per window size (only the window's keys are gathered)
    window_plans: dict[int, ReferencePlan] = field(default_factory=dict, repr=False, compare=False)
    decode_partials: DecodePartials | None = field(default=None, repr=False, compare=False)
    # the other KV groups' views of this batch, groups 1.. (empty for a model of one group)
    group_views: tuple[AttentionMetadata, ...] = field(default=(), repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    def for_group(self, group: int) -> AttentionMetadata:
        """KV group `group`'s view of the batch (a layer reads its group's)."""
        return self if group == 0 else self.group_views[group - 1]

    def with_tables(
        self, slot_mapping: torch.Tensor, block_tables: torch.Tensor
    ) -> AttentionMetadata:
        """The same batch over another group's blocks (memos of its own, made by its layers)."""
        return AttentionMetadata(
            slot_mapping=slot_mapping,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_tables=block_tables,
            num_decodes=self.num_decodes,
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            seq_lens_cpu=self.seq_lens_cpu,
            query_start_loc_cpu=self.query_start_loc_cpu,
        )
