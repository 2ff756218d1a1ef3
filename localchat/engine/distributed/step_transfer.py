"""A forward pass's inputs as rank 0 sends them: a small header (over each worker's pipe) and one
int64 payload broadcast to all ranks (input ids, positions and the attention metadata; then, for a
step with image tokens, their flat rows and bidirectional spans), then for such a step one
broadcast of the image embeddings in the runner's dtype (rank 0's image encoder made them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localchat.engine.core.multimodal import StepImages
from localchat.engine.distributed import parallel_state
from localchat.kernels.attention_metadata import AttentionMetadata

SPAN_WIDTH = 4  # (q_start, q_end, seq_row, key_end)


@dataclass(frozen=True)
class BatchHeader:
    """The sizes the payload is cut by, and the metadata's scalars; the step's image rows and
    bidirectional spans (0 and 0 for a step without images)."""

    num_tokens: int
    num_seqs: int
    max_blocks: int
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    image_rows: int = 0
    image_spans: int = 0


def batch_payload(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    md: AttentionMetadata,
    images: StepImages | None = None,
) -> tuple[BatchHeader, torch.Tensor]:
    header = BatchHeader(
        input_ids.shape[0],
        md.seq_lens.shape[0],
        md.block_tables.shape[1],
        md.num_decodes,
        md.max_query_len,
        md.max_seq_len,
        0 if images is None else images.rows.shape[0],
        0 if images is None else len(images.spans),
    )
    parts = [input_ids, positions, md.slot_mapping, md.query_start_loc, md.seq_lens]
    parts.append(md.block_tables.flatten())
    if images is not None:
        spans = torch.tensor(images.spans, dtype=torch.int64).reshape(-1)
        parts += [images.rows, spans.to(input_ids.device)]
    payload = torch.cat([p.to(torch.int64) for p in parts])
    return header, payload


def receive_batch(
    header: BatchHeader, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, torch.Tensor]:
    """The inputs rank 0 broadcasts after sending `header` (called on the other ranks): input ids,
    positions, the metadata, and the image rows and spans [spans, 4] (empty without images)."""
    n, s = header.num_tokens, header.num_seqs
    sizes = [n, n, n, s + 1, s, s * header.max_blocks]
    sizes += [header.image_rows, header.image_spans * SPAN_WIDTH]
    payload = parallel_state.broadcast(torch.empty(sum(sizes), dtype=torch.int64, device=device))
    input_ids, positions, slots, starts, seq_lens, tables, rows, spans = payload.split(sizes)
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
    return input_ids, positions, md, rows, spans.view(header.image_spans, SPAN_WIDTH)


def broadcast_images(images: StepImages, dtype: torch.dtype) -> StepImages:
    """Rank 0: broadcast the step's image embeddings in `dtype` (after the payload); returns the
    StepImages the other ranks build, which rank 0 runs too, so every rank embeds the same rows."""
    embeddings = parallel_state.broadcast(images.embeddings.to(dtype).contiguous())
    return StepImages(images.rows, embeddings, images.spans)


def receive_images(
    header: BatchHeader,
    rows: torch.Tensor,
    spans: torch.Tensor,
    hidden_size: int,
    dtype: torch.dtype,
) -> StepImages | None:
    """The other ranks' side of broadcast_images: the step's StepImages (None without images)."""
    if header.image_rows == 0:
        return None
    embeddings = torch.empty(header.image_rows, hidden_size, dtype=dtype, device=rows.device)
    parallel_state.broadcast(embeddings)
    found = [(q_start, q_end, row, end) for q_start, q_end, row, end in spans.tolist()]
    return StepImages(rows, embeddings, found)
