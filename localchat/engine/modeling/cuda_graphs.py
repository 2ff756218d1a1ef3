"""CUDA graphs for decode steps: one captured forward per padded batch size, replayed with new
inputs.

A decode step launches a few hundred small kernels; replaying a graph costs one launch. Inputs live
in static buffers the graphs were captured on; a step copies its tensors into them, pads the batch
up to the next captured size (padding rows store no KV, slot -1, and attend to one key) and replays.
A model with several KV groups (engine/core/kv_groups.py) has a slot mapping and block tables buffer
per group; the kernels find a sliding window's first key from the sequence lengths on the device, so
a graph serves any lengths.
"""

from __future__ import annotations

import bisect

import torch

from localchat.engine.modeling.forward_context import ForwardContext, forward_context
from localchat.kernels.attention_metadata import AttentionMetadata


def capture_sizes(max_batch_size: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch_size] + list(
        range(16, max_batch_size + 1, 16)
    )
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return sizes


class DecodeGraphs:
    """Captured decode forwards of `runner.model` for batch sizes up to `max_batch_size`."""

    def __init__(self, runner, max_batch_size: int, max_blocks_per_seq: int):
        device = runner.device
        self.runner = runner
        self.sizes = capture_sizes(max_batch_size)
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        num_groups = len(runner.kv_layout.groups)
        # per KV group
        self.slot_mappings = [
            torch.full((max_batch_size,), -1, dtype=torch.int64, device=device)
            for _ in range(num_groups)
        ]
        self.seq_lens = torch.ones(max_batch_size, dtype=torch.int32, device=device)
        self.block_tables = [
            torch.zeros(max_batch_size, max_blocks_per_seq, dtype=torch.int32, device=device)
            for _ in range(num_groups)
        ]
        self.query_start_loc = torch.arange(max_batch_size + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._capture_all(runner.max_model_len)

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def _metadata(self, size: int, max_seq_len: int) -> AttentionMetadata:
        md = AttentionMetadata(
            slot_mapping=self.slot_mappings[0][:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[0][:size],
            num_decodes=size,
            max_query_len=1,
            max_seq_len=max_seq_len,
            seq_lens_cpu=[1] * size,
            query_start_loc_cpu=list(range(size + 1)),
        )
        md.group_views = tuple(
            md.with_tables(slots[:size], tables[:size])
            for slots, tables in zip(self.slot_mappings[1:], self.block_tables[1:], strict=True)
        )
        return md

    def _forward(self, size: int, md: AttentionMetadata) -> torch.Tensor:
        rope = self.runner.rotary.lookup(self.positions[:size])
        with forward_context(ForwardContext(md, rope)):
            return self.runner.model(self.input_ids[:size])

    @torch.inference_mode()
    def _capture_all(self, max_seq_len: int) -> None:
        pool = None
        # largest first, so the smaller graphs fit in its memory pool
        for size in reversed(self.sizes):
            md = self._metadata(size, max_seq_len)
            self._forward(size, md)  # warm up: compiles the Triton kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size, md)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of an all-decode batch of n <= max_batch_size sequences."""
        n = input_ids.shape[0]
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.seq_lens[:n].copy_(md.seq_lens, non_blocking=True)
        for group, (slots, tables) in enumerate(
            zip(self.slot_mappings, self.block_tables, strict=True)
        ):
            view = md.for_group(group)
            slots[:n].copy_(view.slot_mapping, non_blocking=True)
            tables[:n, : view.block_tables.shape[1]].copy_(view.block_tables, non_blocking=True)
            if size > n:  # padding rows: store nothing, attend to one (harmless) key
                slots[n:size].fill_(-1)
                tables[n:size, 0].fill_(0)
        if size > n:
            self.seq_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]
