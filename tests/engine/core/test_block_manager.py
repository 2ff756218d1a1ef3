"""BlockManager: allocation, ref counts, prefix-cache hits and LRU reuse of freed blocks."""

from localchat.engine.core.block_manager import BlockManager, chain_hash
from localchat.engine.core.sequence import Request
from localchat.engine.sampling.sampling_params import SamplingParams

BS = 4


def make_seq(tokens, request_id="r", n=1):
    return Request(request_id, list(tokens), SamplingParams(n=n)).seqs


def admit(bm, seq):
    cached = bm.find_cached_prefix(seq)
    assert bm.allocate(seq, seq.num_tokens - len(cached) * BS, cached)
    return len(cached) * BS


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(8, BS)
    (seq,) = make_seq(range(10))
    assert admit(bm, seq) == 0
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []


def test_prefix_hit_reuses_full_blocks_but_never_the_last_token():
    bm = BlockManager(16, BS)
    (first,) = make_seq(range(10), "a")
    admit(bm, first)
    bm.free(first)
    (second,) = make_seq([*range(10), 99, 98], "b")
    assert admit(bm, second) == 8  # two full blocks of the shared 10-token prefix
    assert second.block_table[:2] == first_blocks_of(bm, range(8))
    # A prompt that is exactly the cached blocks still computes its last token.
    (third,) = make_seq(range(8), "c")
    assert admit(bm, third) == 4


def first_blocks_of(bm, tokens):
    tokens = list(tokens)
    found, parent = [], 0
    for i in range(len(tokens) // BS):
        parent = chain_hash(parent, tuple(tokens[i * BS : (i + 1) * BS]))
        found.append(bm.hash_to_block[parent])
    return found


def test_shared_blocks_are_ref_counted():
    bm = BlockManager(16, BS)
    (a,) = make_seq(range(9), "a")
    admit(bm, a)
    (b,) = make_seq(range(9), "b")
    assert admit(bm, b) == 8
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared
    assert all(bm.blocks[i].ref_count == 2 for i in shared)
    bm.free(a)
    assert all(bm.blocks[i].ref_count == 1 for i in shared)
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_freed_cached_blocks_are_evicted_last_tail_first_and_lose_their_hash_when_reused():
    bm = BlockManager(5, BS)
    (a,) = make_seq(range(9), "a")  # blocks 0, 1 (full, hashed) and 2 (partial)
    admit(bm, a)
    assert a.block_table == [0, 1, 2]
    bm.free(a)
    # one block: a's unhashed one goes first, before a fresh one
    (b,) = make_seq(range(100, 103), "b")
    admit(bm, b)
    assert b.block_table == [2] and len(bm.hash_to_block) == 2
    # two blocks: the fresh ones (3, 4) before any cached block
    (c,) = make_seq(range(200, 207), "c")
    admit(bm, c)
    assert c.block_table == [3, 4] and set(bm.hash_to_block.values()) == {0, 1, 3}
    # free list now: c's unhashed 4, then cached blocks least recently freed first: 1, 0, 3
    bm.free(c)
    # two blocks: 4, then a's tail block 1 (its head 0 outlives it)
    (e,) = make_seq(range(300, 307), "e")
    admit(bm, e)
    assert e.block_table == [4, 1]
    assert set(bm.hash_to_block.values()) == {0, 3, 4}  # block 1 lost a's hash when it was reused
    bm.free(b), bm.free(e)
    (d,) = make_seq(range(9), "d")
    assert admit(bm, d) == 4  # a's first block survived; its second was evicted


def test_allocation_failure_changes_nothing():
    bm = BlockManager(2, BS)
    (a,) = make_seq(range(20))
    assert not bm.allocate(a, 20)
    assert bm.num_free_blocks == 2 and a.block_table == []


def test_without_prefix_caching_only_samples_of_one_request_share():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    a0, a1 = make_seq(range(9), "a", n=2)
    admit(bm, a0)
    assert admit(bm, a1) == 8
    (b,) = make_seq(range(9), "b")
    assert admit(bm, b) == 0
    bm.free(a0)
    bm.free(a1)
    (again,) = make_seq(range(9), "a")  # a finished request's id, reused
    assert admit(bm, again) == 0


def test_prefix_query_counters_count_prompt_tokens_and_hits_once_per_sequence():
    from localchat.engine.core.scheduler import Scheduler

    bm = BlockManager(16, BS)
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    (a,) = make_seq(range(10), "a")
    scheduler.add(a)
    scheduler.schedule()
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (10, 0)
    a.num_computed_tokens = a.num_tokens
    scheduler.finish(a)
    (b,) = make_seq([*range(10), 50, 51], "b")
    scheduler.add(b)
    scheduler.schedule()
    # b's 12 tokens, 8 of them cached
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (22, 8)
    assert b.num_cached_tokens == 8
    scheduler.schedule()  # b runs on: nothing is counted twice
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (22, 8)
