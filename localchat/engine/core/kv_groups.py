"""KV groups: how a model's layers share the one KV pool when some attend within a sliding window.

Layers that keep the same keys form a kind: every full-attention layer, or the sliding-window
layers of one window. Each kind is cut into groups of `slots` layers (the same size for every
group), and a block of the pool holds `block_size` tokens of one group's layers, the group's j-th
layer in slot j (a group smaller than `slots` leaves its last slots unused). So every group draws
its blocks from the same pool and nothing is split between the kinds up front; each sequence has
one block table per group, and each layer reads its group's table (AttentionMetadata.for_group). A
full group keeps all of a sequence's blocks; a sliding group gives back those its window has left
(BlockManager).

A model without windows, or whose layers all share one window (Mistral v0.1, Phi-3), is one group
of all its layers, slot i for layer i: the pool the engine always had. With two kinds, the group
size is that of the smaller kind (Gemma 3's 5 local : 1 global layers make one full group and five
sliding ones), or the larger's where the two are close (gpt-oss-20b's 12 and 12), so few slots go
unused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVGroup:
    window: int | None  # the layers' sliding window; None: full attention, every block kept
    layers: tuple[int, ...]  # model layer indices, in slot order

    def first_needed_block(self, num_computed_tokens: int, block_size: int) -> int:
        """The first block a query after `num_computed_tokens` tokens still reads: every block
        before it can be given back (0 for a full group)."""
        if self.window is None:
            return 0
        return max(num_computed_tokens - self.window + 1, 0) // block_size

    def max_blocks(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """The most blocks one sequence of `num_tokens` tokens holds in this group, prefilled in
        chunks of at most `chunk` tokens: a window's keys before the chunk, the chunk's own, and a
        block the window cuts at each end."""
        blocks = cdiv(num_tokens, block_size)
        if self.window is None:
            return blocks
        return min(blocks, cdiv(self.window - 1 + chunk, block_size) + 1)


@dataclass(frozen=True)
class KVLayout:
    groups: tuple[KVGroup, ...]
    slots: int  # layers per block

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(group.window for group in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1

    def placement(self) -> dict[int, tuple[int, int]]:
        """layer index -> (group, slot)."""
        return {
            layer: (g, slot)
            for g, group in enumerate(self.groups)
            for slot, layer in enumerate(group.layers)
        }

    def blocks_per_sequence(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """The most blocks one sequence of `num_tokens` tokens holds, over all groups."""
        return sum(group.max_blocks(num_tokens, block_size, chunk) for group in self.groups)

    def longest_sequence(self, num_blocks: int, block_size: int, chunk: int, limit: int) -> int:
        """The most tokens of one sequence, at most `limit`, that `num_blocks` blocks hold: `limit`
        if they hold it, else a multiple of block_size (0 if not even one block's worth)."""
        if self.blocks_per_sequence(limit, block_size, chunk) <= num_blocks:
            return limit
        low, high = 0, limit // block_size  # in blocks of tokens: low fits, high may not
        while low < high:
            mid = (low + high + 1) // 2
            if self.blocks_per_sequence(mid * block_size, block_size, chunk) <= num_blocks:
                low = mid
            else:
                high = mid - 1
        return low * block_size


def kv_layout(windows: Sequence[int | None], hybrid: bool = True) -> KVLayout:
    """The KV groups of a model whose layer i has sliding window `windows[i]` (None: full
    attention). `hybrid=False` keeps one group of every layer (nothing given back, as under
    tensor parallelism, whose ranks receive one block table per sequence)."""
    num_layers = len(windows)
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(windows):
        kinds.setdefault(window, []).append(layer)
    if len(kinds) == 1 or not hybrid:
        window = windows[0] if len(kinds) == 1 else None
        return KVLayout((KVGroup(window, tuple(range(num_layers))),), num_layers)
    counts = [len(layers) for layers in kinds.values()]
    size = min(counts)
    if max(counts) < 1.5 * size:  # close counts: one group each, the smaller padded
        size = max(counts)
    # full attention first (group 0: a sequence's `block_table`), then windows small to large
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    groups = tuple(
        KVGroup(window, tuple(kinds[window][start : start + size]))
        for window in order
        for start in range(0, len(kinds[window]), size)
    )
    return KVLayout(groups, size)
