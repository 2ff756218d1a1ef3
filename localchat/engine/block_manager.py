"""BlockManager: the fixed pool of KV blocks, per-sequence block tables and automatic prefix
caching.

A full block is identified by a hash of (its parent block's hash, its token ids, a salt); unsalted,
it is `chain_hash`, the hash a data-parallel router computes over the same tokens. Blocks are
ref-counted: sequences with a common prefix share them. A block whose count drops to zero keeps its
hash and joins the free list behind the blocks with no content, so it is reused last (LRU) and a
later request with the same prefix (the next chat turn, a shared system prompt) finds it again.
Without prefix caching the salt is the request id, so only the samples of one request (n > 1) share
their prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from localchat.engine.sequence import Sequence


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """The hash of a block of `tokens` after the block hashed `parent` (0 for the first); the same
    in every process (a tuple of ints hashes without the per-process string seed)."""
    return hash((parent, tokens))


def _block_hash(key: tuple) -> int:
    salt, parent, tokens = key
    return chain_hash(parent or 0, tokens) if salt is None else hash(key)


class Block:
    __slots__ = ("block_id", "hash", "key", "ref_count")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.key: tuple | None = (
            None  # (salt, parent hash, token ids) behind `hash`, checked on a hit
        )

    def reset(self) -> None:
        self.hash = None
        self.key = None


class BlockManager:
    """Allocates KV blocks to sequences and finds cached prefixes."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        length_salt: Callable[[int], Hashable | None] | None = None,
        recompute_on_salt_change: bool = False,
    ):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # what a sequence's keys depend on beside its tokens, by its length (a length-dependent
        # rotary table: engine/layers/rotary.py); and whether a running sequence whose salt changes
        # is computed again (longrope)
        self.length_salt = length_salt
        self.recompute_on_salt_change = recompute_on_salt_change
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found in the cache
        # when a list, the hash of each unsalted block dropped from the prefix cache is appended (a
        # data-parallel replica reports them to its router, which then stops routing by them)
        self.evicted_hashes: list[int] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def _salt(self, seq: Sequence):
        # without prefix caching only a request's own samples share blocks: the salt is its first
        # sequence's id, never reused (a request id can be: a client's or a benchmark's)
        salt = None if self.enable_prefix_caching else seq.request.seqs[0].seq_id
        extra = self.length_salt(seq.num_tokens) if self.length_salt is not None else None
        return salt if extra is None else (salt, extra)

    def must_recompute(self, seq: Sequence) -> bool:
        """Whether a running sequence's keys were computed under another salt than its length now
        gives (it outgrew longrope's short factors): its blocks must be computed again."""
        return (
            self.recompute_on_salt_change
            and self.length_salt is not None
            and seq.num_computed_tokens > 0
            and self.length_salt(seq.num_tokens) != seq.kv_salt
        )

    def _key(self, seq: Sequence, index: int) -> tuple:
        parent = seq.block_hashes[index - 1] if index else None
        tokens = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
        return (self._salt(seq), parent, tokens)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of `seq` (a fresh sequence with no blocks yet).

        The last token is never taken from the cache: its logits are needed to sample. Nothing is
        taken for a sequence that still needs its prompt's logprobs: they need the logits of every
        position.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits: list[int] = []
        hashes: list[int] = []
        parent = None
        num_candidates = (
            0 if seq.prompt_logprobs is not None else (seq.num_tokens - 1) // self.block_size
        )
        for index in range(num_candidates):
            tokens = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
            key = (self._salt(seq), parent, tokens)
            block_hash = _block_hash(key)
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None or self.blocks[block_id].key != key:
                break
            hits.append(block_id)
            parent = block_hash
            hashes.append(parent)
        seq.block_hashes = hashes
        return hits

    def record_prefix_query(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_prompt_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate(
        self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens (after `cached_blocks`, if any); False
        if the pool cannot, in which case nothing changes. Blocks that this step fills are
        registered in the prefix cache at once: a sequence scheduled later in the same step may
        share them, because each layer stores the step's keys before any attention reads them."""
        cached_blocks = cached_blocks or []
        num_computed = seq.num_computed_tokens + len(cached_blocks) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_needed = -(-total_tokens // self.block_size) - len(seq.block_table) - len(cached_blocks)
        reclaimed = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if num_needed > self.num_free_blocks - reclaimed:
            if cached_blocks:
                seq.block_hashes = []
            return False
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_blocks[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        for _ in range(max(num_needed, 0)):
            seq.block_table.append(self._take_free_block())
        if seq.num_computed_tokens == 0 and self.length_salt is not None:
            seq.kv_salt = self.length_salt(seq.num_tokens)  # its keys' salt from now on
        seq.num_computed_tokens = num_computed
        self._register_full_blocks(seq, total_tokens)
        return True

    def _take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
            if self.evicted_hashes is not None and block.key is not None and block.key[0] is None:
                self.evicted_hashes.append(block.hash)
        block.reset()
        block.ref_count = 1
        return block_id

    def _register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        for index in range(len(seq.block_hashes), num_tokens // self.block_size):
            key = self._key(seq, index)
            block_hash = _block_hash(key)
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[index]]
            if block.hash is None:
                block.hash, block.key = block_hash, key
                self.hash_to_block.setdefault(block_hash, block.block_id)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first, so a prefix outlives its suffix in the LRU
        order."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_blocks[block_id] = None
                if block.hash is None:
                    self.free_blocks.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
