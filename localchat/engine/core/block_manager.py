"""BlockManager: the fixed pool of KV blocks, per-sequence block tables and automatic prefix
caching.

A full block is identified by a hash of (its parent block's hash, its token ids, a salt); unsalted,
it is `chain_hash`, the hash a data-parallel router computes over the same tokens. Blocks are
ref-counted: sequences with a common prefix share them. A block whose count drops to zero keeps its
hash and joins the free list behind the blocks with no content, so it is reused last (LRU) and a
later request with the same prefix (the next chat turn, a shared system prompt) finds it again.
Without prefix caching the salt is the request id, so only the samples of one request (n > 1) share
their prompt.

A model with sliding-window layers has several KV groups (engine/core/kv_groups.py), all drawing
blocks from this one pool: a sequence has a block table per group, and each group its own prefix
cache (a block holds one group's layers). A sliding group gives back the blocks its window has left
as the sequence advances (-1 in its table from then on; no kernel reads them), and they stay
findable by their hash until reused. A prefix hit is the longest one every group can serve: a full
group needs every block before the cut, a sliding group only those its window reaches back to from
the cut.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from collections.abc import Sequence as Seq

from localchat.engine.core.kv_groups import KVGroup
from localchat.engine.core.multimodal import block_images
from localchat.engine.core.sequence import Sequence


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """The hash of a block of `tokens` after the block hashed `parent` (0 for the first); the same
    in every process (a tuple of ints hashes without the per-process string seed)."""
    return hash((parent, tokens))


def _block_hash(key: tuple) -> int:
    salt, parent, tokens = key
    return chain_hash(parent or 0, tokens) if salt is None else hash(key)


class Block:
    __slots__ = ("block_id", "group", "hash", "key", "ref_count")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.group = 0  # the KV group whose layers it holds (while it has a hash)
        self.hash: int | None = None
        self.key: tuple | None = (
            None  # (salt, parent hash, token ids) behind `hash`, checked on a hit
        )

    def reset(self) -> None:
        self.hash = None
        self.key = None


class PrefixHit:
    """A sequence's cached prefix: `num_blocks` full blocks, and per KV group the blocks that serve
    them (-1 where a sliding group's window does not reach back)."""

    __slots__ = ("num_blocks", "tables")

    def __init__(self, tables: list[list[int]]):
        self.tables = tables
        self.num_blocks = len(tables[0]) if tables else 0

    def __len__(self) -> int:
        return self.num_blocks


class BlockManager:
    """Allocates KV blocks to sequences and finds cached prefixes."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        length_salt: Callable[[int], Hashable | None] | None = None,
        recompute_on_salt_change: bool = False,
        windows: Seq[int | None] = (None,),
    ):
        """`windows`: each KV group's sliding window (None: a full-attention group), as
        KVLayout.windows gives them; one full group by default."""
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # what a sequence's keys depend on beside its tokens, by its length (a length-dependent
        # rotary table: engine/modeling/rotary.py); and whether a running sequence whose salt
        # changes is computed again (longrope)
        self.length_salt = length_salt
        self.recompute_on_salt_change = recompute_on_salt_change
        self.groups = [KVGroup(window, ()) for window in windows]
        self._sliding = [g for g, group in enumerate(self.groups) if group.window is not None]
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        # one prefix cache per group: block hash -> block
        self.cached_blocks: list[dict[int, int]] = [{} for _ in self.groups]
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found in the cache
        # when a list, the hash of each unsalted block dropped from the prefix cache of a group that
        # keeps every block is appended (a data-parallel replica reports them to its router, which
        # then stops routing by them). A sliding group's block is not: the prefixes that end past
        # its window are still served without it.
        self.evicted_hashes: list[int] | None = None

    @property
    def hash_to_block(self) -> dict[int, int]:
        """The first group's prefix cache (the only one of a model without windows)."""
        return self.cached_blocks[0]

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

    def _key(self, seq: Sequence, index: int, parent: int | None) -> tuple:
        first, last = index * self.block_size, (index + 1) * self.block_size
        tokens: tuple = tuple(seq.token_ids[first:last])
        if seq.request.images and (images := block_images(seq.request.images, first, last)):
            tokens = (*tokens, images)  # the pictures behind its placeholder tokens
        return (self._salt(seq), parent, tokens)

    def _lookup(self, group: int, key: tuple, block_hash: int) -> int | None:
        block_id = self.cached_blocks[group].get(block_hash)
        if block_id is None or self.blocks[block_id].key != key:
            return None
        return block_id

    def find_cached_prefix(self, seq: Sequence) -> PrefixHit:
        """The longest cached prefix of `seq` (a fresh sequence with no blocks yet) that every
        group serves, in whole blocks.

        The last token is never taken from the cache: its logits are needed to sample. Nothing is
        taken for a sequence that still needs its prompt's logprobs: they need the logits of every
        position.
        """
        assert not seq.block_tables and seq.num_computed_tokens == 0
        num_candidates = (
            0 if seq.prompt_logprobs is not None else (seq.num_tokens - 1) // self.block_size
        )
        keys: list[tuple] = []
        hashes: list[int] = []

        def hashed(count: int) -> None:
            """Hash the first `count` candidate blocks (as far as needed, once)."""
            while len(hashes) < count:
                key = self._key(seq, len(hashes), hashes[-1] if hashes else None)
                keys.append(key)
                hashes.append(_block_hash(key))

        found: list[dict[int, int | None]] = [{} for _ in self.groups]

        def lookup(group: int, index: int) -> int | None:
            if index not in found[group]:
                hashed(index + 1)
                found[group][index] = self._lookup(group, keys[index], hashes[index])
            return found[group][index]

        cut = num_candidates
        for g, group in enumerate(self.groups):
            if group.window is None:  # every block before the cut, from the first
                index = 0
                while index < cut and lookup(g, index) is not None:
                    index += 1
                cut = index
        settled = False
        while not settled:  # each sliding group may shorten the cut; again until none does
            settled = True
            for g in self._sliding:
                longest = self._longest_window_hit(self.groups[g], cut, lambda i, g=g: lookup(g, i))
                if longest < cut:
                    cut, settled = longest, False
        tables = []
        for g, group in enumerate(self.groups):
            first = group.first_needed_block(cut * self.block_size, self.block_size)
            table = [-1] * first
            for index in range(first, cut):
                block_id = lookup(g, index)
                assert block_id is not None  # every group serves the cut
                table.append(block_id)
            tables.append(table)
        hashed(cut)
        seq.block_hashes = hashes[:cut]
        return PrefixHit(tables)

    def _longest_window_hit(self, group: KVGroup, bound: int, lookup) -> int:
        """The most blocks (at most `bound`) after which `group` has cached every block its window
        reads."""
        cut = bound
        while cut > 0:
            first = group.first_needed_block(cut * self.block_size, self.block_size)
            missing = next((i for i in range(cut - 1, first - 1, -1) if lookup(i) is None), None)
            if missing is None:
                return cut
            cut = missing  # a cut after the missing block cannot do
        return 0

    def record_prefix_query(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_prompt_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: PrefixHit | None = None) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens (after the `cached` prefix, if any);
        False if the pool cannot, in which case nothing changes but the release of blocks the
        windows have left. Blocks that this step fills are registered in the prefix cache at once: a
        sequence scheduled later in the same step may share them, because each layer stores the
        step's keys before any attention reads them."""
        self._release_outside_windows(seq)
        tables = seq.block_tables or [[] for _ in self.groups]  # the sequence's once it fits
        hit = cached.tables if cached else [[] for _ in self.groups]
        num_computed = seq.num_computed_tokens + len(cached or ()) * self.block_size
        total_tokens = num_computed + num_new_tokens
        num_blocks = -(-total_tokens // self.block_size)
        num_needed = sum(
            max(num_blocks - len(table) - len(hit_blocks), 0)
            for table, hit_blocks in zip(tables, hit, strict=True)
        )
        reclaimed = sum(
            1 for blocks in hit for b in blocks if b >= 0 and self.blocks[b].ref_count == 0
        )
        if num_needed > self.num_free_blocks - reclaimed:
            if cached:
                seq.block_hashes = []
            return False
        seq.block_tables = tables
        # every group's hit first: a block taken for one group must not be another's hit
        for table, hit_blocks in zip(tables, hit, strict=True):
            for block_id in hit_blocks:
                if block_id >= 0:
                    block = self.blocks[block_id]
                    if block.ref_count == 0:
                        del self.free_blocks[block_id]
                    block.ref_count += 1
                table.append(block_id)
        for g, table in enumerate(tables):
            for _ in range(num_blocks - len(table)):
                table.append(self._take_free_block(g))
        if seq.num_computed_tokens == 0 and self.length_salt is not None:
            seq.kv_salt = self.length_salt(seq.num_tokens)  # its keys' salt from now on
        seq.num_computed_tokens = num_computed
        # a speculative step's drafted tokens are not the sequence's (yet): only its own tokens'
        # blocks are registered
        self._register_full_blocks(seq, min(total_tokens, seq.num_tokens))
        return True

    def _release_outside_windows(self, seq: Sequence) -> None:
        """Give back each sliding group's blocks that no query of `seq` reads again (the last one
        first, as free() does), leaving -1 in their place."""
        for g in self._sliding if seq.block_tables else ():
            table = seq.block_tables[g]
            end = min(
                self.groups[g].first_needed_block(seq.num_computed_tokens, self.block_size),
                len(table),
            )
            for index in range(end - 1, -1, -1):
                if table[index] < 0:
                    break  # the ones before were given back already
                self._unref(table[index])
                table[index] = -1

    def _take_free_block(self, group: int) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        block = self.blocks[block_id]
        self._uncache(block)
        block.group = group
        block.ref_count = 1
        return block_id

    def _uncache(self, block: Block) -> None:
        """Drop `block` from its group's prefix cache (reporting the eviction) and forget its
        hash."""
        cache = self.cached_blocks[block.group]
        if block.hash is not None and cache.get(block.hash) == block.block_id:
            del cache[block.hash]
            if (
                self.evicted_hashes is not None
                and block.key is not None
                and block.key[0] is None
                and self.groups[block.group].window is None
            ):
                self.evicted_hashes.append(block.hash)
        block.reset()

    def forget_unwritten(self, seq: Sequence) -> None:
        """Take the blocks of `seq` from its first uncomputed token on out of the prefix cache: a
        step registers the blocks it fills when it is scheduled, so after a step whose forward
        failed they hold keys never (or partly) written, which no later prompt may be served. Call
        it before the sequence's blocks are freed."""
        first = seq.num_computed_tokens // self.block_size
        for table in seq.block_tables:
            for block_id in table[first:]:
                if block_id >= 0:
                    self._uncache(self.blocks[block_id])
        del seq.block_hashes[first:]

    def _register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        for index in range(len(seq.block_hashes), num_tokens // self.block_size):
            key = self._key(seq, index, seq.block_hashes[index - 1] if index else None)
            block_hash = _block_hash(key)
            seq.block_hashes.append(block_hash)
            for g, table in enumerate(seq.block_tables):
                if table[index] < 0:
                    continue
                block = self.blocks[table[index]]
                if block.hash is None:
                    block.hash, block.key = block_hash, key
                    self.cached_blocks[g].setdefault(block_hash, block.block_id)

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free_blocks[block_id] = None
            if block.hash is None:
                self.free_blocks.move_to_end(block_id, last=False)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first, so a prefix outlives its suffix in the LRU
        order."""
        for table in seq.block_tables:
            for block_id in reversed(table):
                if block_id >= 0:
                    self._unref(block_id)
        seq.block_tables = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
