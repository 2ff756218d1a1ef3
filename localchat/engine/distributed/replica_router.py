"""Prefix-aware routing of requests over data-parallel replicas.

A prompt is cut into full blocks of `block_size` tokens (the engine's KV block size, the unit its
prefix cache reuses), each identified by a hash chained over the blocks before it, as the engine's
block manager and vLLM's router do. The router remembers which replicas it sent each block hash to
(an LRU table of bounded size) and sends a request to the replica holding the longest run of its
leading blocks, so a conversation's next turn finds its history in that replica's cache. With no
block matched, or when the matching replica has too many more requests in flight than the least
loaded one (both thresholds exceeded, as in SGLang's cache-aware router), the least loaded replica
takes it. Replicas with equal loads take turns, so light traffic fills every replica's cache.

The table is the router's own view, corrected by the replicas: each reports, about once a second,
the cached blocks its engine has evicted since its last report (in the router's hashes:
`chain_hash` is also the engine's hash of a block), and `evict` drops them, so a prefix a replica
no longer holds stops drawing requests to it. A block evicted since the last report costs a
prefill there, never a wrong answer.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from localchat.engine.core.block_manager import chain_hash


class PrefixRouter:
    def __init__(
        self,
        block_size: int = 16,
        *,
        max_blocks: int = 1 << 20,
        balance_abs: int = 8,
        balance_rel: float = 1.5,
    ):
        """A matching replica is passed over when it has more than `balance_abs` requests in flight
        beyond the least loaded one and more than `balance_rel` times its count."""
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.table: OrderedDict[int, int] = OrderedDict()  # block hash -> bit mask of replicas
        self._turns = itertools.count()  # equal loads: the replicas take turns

    def block_hashes(self, tokens: Sequence[int]) -> list[int]:
        """One hash per full block, each covering every token before it too."""
        size = self.block_size
        hashes = []
        parent = 0
        for start in range(0, len(tokens) - size + 1, size):
            parent = chain_hash(parent, tuple(tokens[start : start + size]))
            hashes.append(parent)
        return hashes

    def blocks_held(self, replica: int) -> int:
        """How many blocks the router counts `replica` as holding (sent there, not reported
        evicted)."""
        bit = 1 << replica
        return sum(1 for holders in self.table.values() if holders & bit)

    def matched_blocks(self, hashes: list[int], replica: int) -> int:
        """How many leading blocks of `hashes` the router has sent to `replica`."""
        bit = 1 << replica
        count = 0
        for block in hashes:
            if not self.table.get(block, 0) & bit:
                break
            count += 1
        return count

    def choose(self, hashes: list[int], loads: Sequence[int | None]) -> tuple[int, bool]:
        """(replica, whether a cached prefix chose it) for a prompt's block hashes, given each
        replica's requests in flight (None: it cannot take one). At least one must be usable."""
        usable = [i for i, load in enumerate(loads) if load is not None]
        if not usable:
            raise ValueError("no replica can take a request")

        turn = next(self._turns) % len(loads)

        def load_of(index: int) -> tuple[int, int]:
            load = loads[index]
            assert load is not None
            return load, (index - turn) % len(loads)

        least = min(usable, key=load_of)
        mask = sum(1 << i for i in usable)
        depth = 0
        for block in hashes:
            holders = self.table.get(block, 0) & mask
            if not holders:
                break
            mask, depth = holders, depth + 1
        if depth == 0:
            return least, False
        best = min((i for i in usable if mask >> i & 1), key=load_of)
        best_load, least_load = load_of(best)[0], load_of(least)[0]
        if best_load - least_load > self.balance_abs and best_load > least_load * self.balance_rel:
            return least, False
        return best, True

    def record(self, hashes: list[int], replica: int) -> None:
        """`replica` now holds (or is computing) these blocks."""
        bit = 1 << replica
        table = self.table
        for block in hashes:
            table[block] = table.get(block, 0) | bit
            table.move_to_end(block)
        while len(table) > self.max_blocks:
            table.popitem(last=False)

    def evict(self, hashes: Sequence[int], replica: int) -> None:
        """`replica` no longer holds these blocks (its engine evicted them)."""
        bit = 1 << replica
        table = self.table
        for block in hashes:
            holders = table.get(block, 0) & ~bit
            if holders:
                table[block] = holders
            else:
                table.pop(block, None)

    def forget(self, replica: int) -> None:
        """Drop a replica that is gone from every entry."""
        bit = 1 << replica
        self.evict([block for block, holders in self.table.items() if holders & bit], replica)
