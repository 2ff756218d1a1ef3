"""Image tokens that attend to each other both ways (Gemma 3, as transformers masks them when
token_type_ids mark the image tokens): a query inside an image sees every key of its image, the
later ones too, and, under a sliding window, only keys after position - W.

The step's attention runs causally for every token first; then the rows of each span of image
queries (ForwardContext.images.spans) are computed again here over their sequence's keys up to
the image's end, all of which the layer has stored (a chunk never ends inside such an image:
engine/core/multimodal.whole_images), by the reference path's explicit attention (scores in
float32)."""

from __future__ import annotations

import torch

from localchat.kernels.attention import _attend_explicit, _gather
from localchat.kernels.attention_metadata import AttentionMetadata


def _keys(cache: torch.Tensor, table: torch.Tensor, start: int, end: int, dtype) -> torch.Tensor:
    """The pool's rows of positions [start, end) through a block table: [end - start, Hkv, D]
    (read as the reference attention reads them: float8 by its bytes, q8_0 dequantized)."""
    block_size = cache.shape[1]
    positions = torch.arange(start, end, device=table.device)
    slots = table[positions // block_size].to(torch.int64) * block_size + positions % block_size
    flat = cache.view(-1, *cache.shape[2:])
    return _gather(flat, slots.to(flat.device), dtype)


def attend_image_spans(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttentionMetadata,
    spans: list[tuple[int, int, int, int]],
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """`out` [T, Hq, D] with the rows of each (q_start, q_end, seq_row, key_end) span computed
    again for bidirectional attention within the image; q [T, Hq, D] after rotary."""
    for q_start, q_end, seq_row, key_end in spans:
        first = key_end - (q_end - q_start)  # the first query's position
        k_start = 0 if sliding_window is None else max(0, first - sliding_window + 1)
        table = md.block_tables[seq_row]
        keys = _keys(k_cache, table, k_start, key_end, q.dtype).transpose(0, 1)  # [Hkv, L, D]
        values = _keys(v_cache, table, k_start, key_end, q.dtype).transpose(0, 1)
        visible = None
        if sliding_window is not None:
            q_pos = torch.arange(first, key_end, device=q.device)[:, None]
            k_pos = torch.arange(k_start, key_end, device=q.device)[None, :]
            visible = k_pos > q_pos - sliding_window
        queries = q[q_start:q_end].transpose(0, 1)  # [Hq, n, D]
        attended = _attend_explicit(queries, keys, values, visible, scale, softcap, sinks)
        out[q_start:q_end] = attended.transpose(0, 1).to(out.dtype)
    return out
