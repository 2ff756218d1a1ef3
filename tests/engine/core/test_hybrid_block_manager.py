"""BlockManager with KV groups (engine/core/kv_groups.py): a full-attention group and sliding-window
groups drawing from one pool. Blocks a window has left are given back as the sequence advances and
stay findable by their hash until reused; a prefix hit is the longest one every group serves; and
every block is free again when nothing runs."""

from __future__ import annotations

import random

import pytest

from localchat.engine.core.block_manager import BlockManager, chain_hash
from localchat.engine.core.kv_groups import kv_layout
from localchat.engine.core.scheduler import Scheduler
from localchat.engine.core.sequence import Request
from localchat.engine.sampling.sampling_params import SamplingParams

BS = 4
W = 6  # a query at p reads keys p-5..p: after c tokens, blocks before (c - 5) // 4 are unread


def make_seq(tokens, request_id="r", n=1):
    return Request(request_id, list(tokens), SamplingParams(n=n)).seqs


def admit(bm, seq, num_new=None):
    """Allocate a fresh sequence after its cached prefix; the hit's tokens."""
    hit = bm.find_cached_prefix(seq)
    cached = len(hit) * BS
    assert bm.allocate(seq, (seq.num_tokens - cached) if num_new is None else num_new, hit)
    return cached


def advance(bm, seq, num_new):
    """One step of `num_new` tokens (past the prompt, a sampled token each): allocate, then what
    the engine does after the forward pass."""
    while seq.num_tokens < seq.num_computed_tokens + num_new:
        seq.append_token(7)
    assert bm.allocate(seq, num_new)
    seq.num_computed_tokens += num_new


def check_invariants(bm: BlockManager, seqs) -> None:
    """Each block is held exactly ref_count times over the live sequences' tables, in one group
    only, and is in the free list exactly when nobody holds it."""
    held: dict[int, int] = {}
    group_of: dict[int, int] = {}
    for seq in seqs:
        for group, table in enumerate(seq.block_tables):
            for block in table:
                if block < 0:
                    continue
                held[block] = held.get(block, 0) + 1
                assert group_of.setdefault(block, group) == group, f"block {block} in two groups"
    for block in bm.blocks:
        assert block.ref_count == held.get(block.block_id, 0), block.block_id
        assert (block.block_id in bm.free_blocks) == (block.ref_count == 0), block.block_id
    for group, cache in enumerate(bm.cached_blocks):
        for block_hash, block_id in cache.items():
            assert bm.blocks[block_id].hash == block_hash and bm.blocks[block_id].group == group


def hybrid(num_blocks, **options):
    return BlockManager(num_blocks, BS, windows=(None, W), **options)


def test_a_sliding_group_gives_back_each_block_once_the_window_has_left_it():
    bm = hybrid(32)
    (seq,) = make_seq(range(10))
    admit(bm, seq)
    seq.num_computed_tokens = 10
    for computed in range(10, 40):
        advance(bm, seq, 1)  # allocates for token `computed`, whose query reads from computed-5
        full, sliding = seq.block_tables
        released = [i for i, block in enumerate(sliding) if block < 0]
        # block i holds positions 4i..4i+3: unread once 4i + 3 < computed - 5
        assert released == [i for i in range(len(sliding)) if 4 * i + 3 < computed - W + 1]
        assert -1 not in full and len(full) == len(sliding) == computed // BS + 1
        check_invariants(bm, [seq])
    # 40 tokens held: all ten blocks in the full group, the window's last two in the sliding one
    assert bm.num_free_blocks == 32 - 10 - 2
    bm.free(seq)
    assert bm.num_free_blocks == 32


def test_a_long_prefill_chunk_holds_its_blocks_until_the_next_step():
    bm = hybrid(32)
    (seq,) = make_seq(range(30))
    assert bm.allocate(seq, 20)  # every key of the chunk is read by its own later queries
    assert len(seq.block_tables[1]) == 5 and -1 not in seq.block_tables[1]
    seq.num_computed_tokens += 20
    assert bm.allocate(seq, 10)  # the next chunk reads from position 15: blocks 0-2 go back
    assert seq.block_tables[1][:4] == [-1, -1, -1, seq.block_tables[1][3]]
    check_invariants(bm, [seq])


def test_a_released_block_is_found_by_its_hash_until_reused():
    bm = hybrid(12)
    prompt = list(range(100, 110))  # 10 tokens: blocks 0, 1 full
    (a,) = make_seq(prompt, "a")
    admit(bm, a)
    a.num_computed_tokens = 10
    for _ in range(6):
        advance(bm, a, 1)  # 16 tokens computed: the sliding group gave back blocks 0 and 1
    released = a.block_table[:2]  # the full group's
    assert a.block_tables[1][:2] == [-1, -1]
    # another sequence of the same 10 tokens: the full group shares a's blocks, the sliding one
    # finds the blocks it gave back (the cut after 2 blocks reads positions 3..)
    (c,) = make_seq([*prompt, 5], "c")
    assert admit(bm, c) == 8
    assert c.block_tables[0][:2] == released
    assert all(block >= 0 for block in c.block_tables[1][:2])  # the window reaches back to block 0
    check_invariants(bm, [a, c])
    bm.free(c)
    # fill the pool: the free list serves blocks without a hash first, then the least recently
    # freed, c's sliding blocks among them; once they are reused the sliding group cannot serve
    # that cut, and nothing else may be
    hogs = []
    for i in range(bm.num_free_blocks // 2):
        (hog,) = make_seq(range(1000 + 10 * i, 1000 + 10 * i + 3), f"hog{i}")
        admit(bm, hog)
        hogs.append(hog)
    check_invariants(bm, [a, *hogs])
    (d,) = make_seq([*prompt, 5], "d")
    assert len(bm.find_cached_prefix(d)) == 0  # the full group still has both blocks (a's)
    assert a.block_tables[0][:2] == released and bm.blocks[released[1]].hash is not None


def test_a_prefix_hit_stops_where_a_sliding_group_lacks_its_window():
    bm = hybrid(14)
    prompt = list(range(200, 225))  # 25 tokens: six full blocks
    (a,) = make_seq(prompt, "a")
    a_blocks = []
    for start in range(0, 25, BS):  # in chunks of a block: the sliding group gives back as it goes
        num_new = min(BS, 25 - start)
        assert bm.allocate(a, num_new)
        a.num_computed_tokens += num_new
        a_blocks.append(a.block_tables[1][-1])  # the sliding block this chunk filled
    assert a.block_tables[1][:4] == [-1, -1, -1, -1]  # 0-3 given back, oldest first
    bm.free(a)
    assert bm.num_free_blocks == 14
    # free list: a's two partial blocks (no hash), then the sliding blocks 0-3 in the order given
    # back, then a's other blocks tail first; four blocks take the two partial ones and sliding
    # blocks 0 and 1
    (filler,) = make_seq(range(900, 908), "filler")
    assert admit(bm, filler) == 0 and len(filler.block_tables[0]) == 2
    evicted = set(a_blocks[:2])
    assert evicted <= set(filler.block_tables[0] + filler.block_tables[1])
    # a cut after 4 blocks reads blocks 2 and 3 (positions 11..): still cached
    (b,) = make_seq([*prompt[:16], 1], "b")
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 4 and hit.tables[1][:2] == [-1, -1]
    assert hit.tables[1][2:] == a_blocks[2:4]
    # a cut after 3 blocks would read block 1 (positions 7..), which is gone: the full group
    # holds 3 blocks, yet nothing is served
    (c,) = make_seq([*prompt[:12], 1], "c")
    assert len(bm.find_cached_prefix(c)) == 0
    # the whole prompt again: the cut after 6 blocks reads blocks 4 and 5 only
    (d,) = make_seq(prompt, "d")
    assert admit(bm, d) == 24
    assert d.block_tables[1][:4] == [-1, -1, -1, -1]
    check_invariants(bm, [filler, d])


def test_every_group_s_hit_is_claimed_before_any_group_takes_a_free_block():
    """A sliding group's hit block at the front of the free list is not handed out as the full
    group's new block in the same allocation."""
    bm = hybrid(12)
    prompt = list(range(300, 308))  # two full blocks
    (a,) = make_seq(prompt, "a")
    admit(bm, a)
    a.num_computed_tokens = 8
    for _ in range(6):
        advance(bm, a, 1)  # the sliding group gives back blocks 0 and 1
    (e,) = make_seq(range(600, 608), "e")
    admit(bm, e)  # the four blocks never used
    bm.free(e)
    # free list: a's sliding blocks 0, 1 (given back first), then e's four, all with hashes
    (b,) = make_seq([*prompt, 1], "b")
    hit = bm.find_cached_prefix(b)
    assert len(hit) == 2 and list(bm.free_blocks)[:2] == hit.tables[1]
    assert not bm.allocate(b, 1 + 4 * 4, hit)  # 2 + 2 + 4 + 4 new blocks: no; nothing changes
    assert b.block_tables == [] and list(bm.free_blocks)[:2] == hit.tables[1]
    hit = bm.find_cached_prefix(b)
    assert bm.allocate(b, 1, hit)  # one new block per group, from e's
    check_invariants(bm, [a, b])
    assert b.block_tables[1][:2] == hit.tables[1] and bm.num_free_blocks == 2


def test_only_a_full_group_s_evictions_are_reported_in_the_router_s_hashes():
    bm = hybrid(8)
    bm.evicted_hashes = []
    prompt = list(range(400, 409))
    (a,) = make_seq(prompt, "a")
    admit(bm, a)
    bm.free(a)
    (b,) = make_seq(range(500, 532), "b")
    assert bm.allocate(b, 16)  # 4 blocks per group: the whole pool, every cached block
    full_hashes = [chain_hash(0, tuple(prompt[:4]))]
    full_hashes.append(chain_hash(full_hashes[0], tuple(prompt[4:8])))
    assert sorted(bm.evicted_hashes) == sorted(full_hashes)  # once each, for the full group


@pytest.mark.parametrize(
    ("windows", "num_blocks"), [((None, W), 16), ((None, W, W), 20), ((W,), 8), ((None, 5, 9), 20)]
)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_every_block_is_free_when_nothing_runs(windows, num_blocks, prefix_caching):
    """A random mix of shared prompts, n > 1 samples, chunked prefills and preemptions on a tight
    pool: the tables stay consistent at every step, and every block is free at the end."""
    rng = random.Random(0)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix_caching, windows=windows)
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=10)
    shared = [rng.randrange(50) for _ in range(13)]
    requests = []
    for i in range(12):
        prompt = (shared if i % 2 else []) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        request = Request(f"r{i}", prompt, SamplingParams(n=1 + (i % 3 == 0), max_tokens=12))
        requests.append(request)
        for seq in request.seqs:
            scheduler.add(seq)
    steps = 0
    while scheduler.has_unfinished():
        steps += 1
        assert steps < 500
        batch = scheduler.schedule()
        check_invariants(bm, scheduler.running)
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens == seq.num_tokens:
                seq.append_token(rng.randrange(50))
                if seq.num_output_tokens >= 12:
                    scheduler.finish(seq)
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)
    assert scheduler.num_preemptions > 0 and bm.prefix_cache_hits > 0


def test_kv_layout_groups_layers_of_equal_size():
    gemma3 = [None if i % 6 == 5 else 1024 for i in range(26)]  # 22 local, 4 global
    layout = kv_layout(gemma3)
    assert layout.slots == 4 and layout.windows == (None,) + (1024,) * 6
    assert layout.groups[0].layers == (5, 11, 17, 23) and layout.groups[-1].layers == (24, 25)
    assert sorted(layer for g in layout.groups for layer in g.layers) == list(range(26))
    gpt_oss = [128 if i % 2 == 0 else None for i in range(24)]
    assert [len(g.layers) for g in kv_layout(gpt_oss).groups] == [12, 12]
    uneven = [None] * 13 + [128] * 12  # close counts: one group each, the smaller padded
    assert kv_layout(uneven).slots == 13 and len(kv_layout(uneven).groups) == 2
    assert kv_layout([None] * 8).groups[0].layers == tuple(range(8))
    assert kv_layout([None] * 8).slots == 8 and kv_layout([4096] * 8).windows == (4096,)
    assert kv_layout(gpt_oss, hybrid=False).windows == (None,)
    assert kv_layout(gpt_oss, hybrid=False).slots == 24


def test_kv_layout_sizes_a_sequence_by_its_windows():
    layout = kv_layout([None, 24, 24])
    # a full group's every block, a sliding group's window plus a chunk and a block at each end
    assert layout.blocks_per_sequence(160, 16, 8) == 10 + 2 * 3
    assert layout.blocks_per_sequence(16, 16, 512) == 3
    # a prefill chunk of 512 after a window's 23 keys: 35 blocks (and a block cut at each end)
    assert layout.blocks_per_sequence(1600, 16, 512) == 100 + 2 * 35
    assert layout.longest_sequence(16, 16, 8, limit=10_000) == 160
    assert layout.longest_sequence(16, 16, 8, limit=100) == 100
    # the same memory without windows: 16 // 3 blocks of all three layers
    assert kv_layout([None] * 3).longest_sequence(16 // 3, 16, 8, limit=10_000) == 5 * 16
