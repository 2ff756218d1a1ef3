"""A forward pass's inputs as rank 0 sends them: a small header (over each worker's pipe) and one
int64 payload broadcast to all ranks (input ids, positions and the attention metadata)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localchat.engine.distributed import parallel_state
from localchat.kernels.attention_metadata import AttentionMetadata


@dataclass(frozen=True)
class BatchHeader:
    """The sizes the payload is cut by, and the metadata's scalars."""

    num_tokens: int
    num_seqs: int
    max_blocks: int
    num_decodes: int
    max_query_len: int
    max_seq_len: int


def batch_payload(
    input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata
) -> tuple[BatchHeader, torch.Tensor]:
    header = BatchHeader(
        input_ids.shape[0],
        md.seq_lens.shape[0],
        md.block_tables.shape[1],
        md.num_decodes,
        md.max_query_len,
        md.max_seq_len,
    )
    parts = (input_ids, positions, md.slot_mapping, md.query_start_loc, md.seq_lens)
    payload = torch.cat([p.to(torch.int64) for p in parts] + [md.block_tables.flatten().long()])
    return header, payload


def receive_batch(
    header: BatchHeader, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The inputs rank 0 broadcasts after sending `header` (called on the other ranks)."""
    n, s = header.num_tokens, header.num_seqs
    sizes = [n, n, n, s + 1, s, s * header.max_blocks]
    payload = parallel_state.broadcast(torch.empty(sum(sizes), dtype=torch.int64, device=device))
    input_ids, positions, slots, starts, seq_lens, tables = payload.split(sizes)
    seq_lens = seq_lens.to(torch.int32)
    starts = starts.to(torch.int32)
    md = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=starts,
        seq_lens=seq_lens,
        block_tables=tables.to(torch.int32).view(s, header.max_blocks),
        num_decodes=header.num_decodes,
        max_query_len=header.max_query_len,
        max_seq_len=header.max_seq_len,
        seq_lens_cpu=seq_lens.tolist(),
        query_start_loc_cpu=starts.tolist(),
    )
    return input_ids, positions, md
