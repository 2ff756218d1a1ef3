"""PrefixRouter: block hashes, longest-prefix choice, the load fallback and forgetting a replica."""

from __future__ import annotations

from localchat.engine.distributed.replica_router import PrefixRouter

SYSTEM = list(range(1000, 1032))  # two blocks every conversation shares


def test_block_hashes_cover_full_blocks_and_chain_over_the_prefix():
    router = PrefixRouter(block_size=4)
    hashes = router.block_hashes(list(range(10)))
    assert len(hashes) == 2  # the last 2 tokens are not a full block
    assert router.block_hashes([0, 1, 2, 3, 9, 9, 9, 9])[0] == hashes[0]
    # the same second block after another first block is another block
    assert router.block_hashes([7, 1, 2, 3, 4, 5, 6, 7])[1] != hashes[1]


def test_no_match_goes_to_the_least_loaded_replica():
    router = PrefixRouter()
    assert router.choose(router.block_hashes(SYSTEM), [3, 1, 2]) == (1, False)
    assert [router.choose([], [0, 0, 0])[0] for _ in range(4)] == [1, 2, 0, 1]  # turns


def test_the_longest_cached_prefix_wins_over_a_shared_one():
    router = PrefixRouter()
    first = SYSTEM + list(range(40))
    second = SYSTEM + list(range(500, 540))
    router.record(router.block_hashes(first), 0)
    router.record(router.block_hashes(second), 1)
    # both hold the shared system prompt; each holds its own conversation
    assert router.choose(router.block_hashes(first + [7] * 30), [5, 0]) == (0, True)
    assert router.choose(router.block_hashes(second + [7] * 30), [0, 5]) == (1, True)
    # only the shared part matches: the lighter of the two holders
    assert router.choose(router.block_hashes(SYSTEM + [9] * 20), [4, 2]) == (1, True)
    assert router.matched_blocks(router.block_hashes(first), 0) == 4


def test_an_overloaded_holder_is_passed_over():
    router = PrefixRouter(balance_abs=8, balance_rel=1.5)
    prompt = router.block_hashes(SYSTEM)
    router.record(prompt, 0)
    assert router.choose(prompt, [8, 0]) == (0, True)  # 8 more in flight: still within bounds
    assert router.choose(prompt, [9, 0]) == (1, False)
    assert router.choose(prompt, [29, 20]) == (0, True)  # 9 more, but under 1.5 times as many


def test_unusable_and_forgotten_replicas_are_not_chosen():
    router = PrefixRouter()
    prompt = router.block_hashes(SYSTEM)
    router.record(prompt, 1)
    assert router.choose(prompt, [0, None]) == (0, False)
    router.record(prompt, 0)
    router.forget(1)
    assert router.matched_blocks(prompt, 1) == 0
    assert router.choose(prompt, [3, 0]) == (0, True)
    router.forget(0)
    assert not router.table


def test_the_table_is_bounded_least_recently_used_first():
    router = PrefixRouter(block_size=2, max_blocks=4)
    old, new = router.block_hashes([1, 2, 3, 4]), router.block_hashes([5, 6, 7, 8, 9, 10])
    router.record(old, 0)
    router.record(new, 1)
    assert len(router.table) == 4
    assert router.matched_blocks(old, 0) == 0  # its first block went first
    assert router.matched_blocks(new, 1) == 3


def test_evicted_blocks_stop_drawing_requests_to_the_replica():
    router = PrefixRouter()
    hashes = router.block_hashes(SYSTEM + list(range(40)))
    router.record(hashes, 0)
    router.record(hashes[:2], 1)
    assert router.choose(hashes, [0, 0]) == (0, True)
    assert (router.blocks_held(0), router.blocks_held(1)) == (len(hashes), 2)
    router.evict(hashes[2:], 0)  # replica 0 dropped everything past the shared two blocks
    assert router.matched_blocks(hashes, 0) == 2
    assert hashes[3] not in router.table  # no holder left
    router.evict(hashes[:1], 0)
    assert router.choose(hashes, [0, 0]) == (1, True)  # only replica 1 still holds the start
    assert (router.blocks_held(0), router.blocks_held(1)) == (1, 2)


def test_a_block_manager_logs_its_evictions_in_the_router_s_hashes():
    """A real BlockManager: what it drops is logged as the router's hashes of the same tokens,
    however soon after it was cached (a prefix cached and evicted between two of a replica's
    reports once stayed in the router's table)."""
    from localchat.engine.core.block_manager import BlockManager
    from localchat.engine.core.sequence import Request, Sequence
    from localchat.engine.sampling.sampling_params import SamplingParams

    manager = BlockManager(num_blocks=6, block_size=4)
    router = PrefixRouter(block_size=4)
    manager.evicted_hashes = []

    def run(tokens: list[int]) -> list[int]:
        seq = Sequence(Request(f"r{tokens[0]}", tokens, SamplingParams()), 0, tokens)
        assert manager.allocate(seq, len(tokens), manager.find_cached_prefix(seq))
        hashes = list(seq.block_hashes)
        manager.free(seq)
        return hashes

    first = list(range(100, 116))  # 4 full blocks
    assert run(first) == router.block_hashes(first)  # the engine's hashes are the router's
    assert manager.evicted_hashes == []
    run(list(range(200, 216)))  # 4 more blocks in a pool of 6: 2 of the first are evicted
    # the pool takes the least recently freed first: the first prompt's last two blocks
    assert sorted(manager.evicted_hashes) == sorted(router.block_hashes(first)[2:])
    # the first prompt's start is still cached, and found
    seq = Sequence(Request("again", first, SamplingParams()), 0, first)
    assert len(manager.find_cached_prefix(seq)) == 2


def test_salted_blocks_are_never_logged_as_evicted():
    """Without prefix caching a block is salted with its request: never shared, never routed by."""
    from localchat.engine.core.block_manager import BlockManager
    from localchat.engine.core.sequence import Request, Sequence
    from localchat.engine.sampling.sampling_params import SamplingParams

    manager = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    manager.evicted_hashes = []
    for start in (100, 200, 300):
        tokens = list(range(start, start + 16))
        seq = Sequence(Request(f"r{start}", tokens, SamplingParams()), 0, tokens)
        assert manager.allocate(seq, len(tokens), manager.find_cached_prefix(seq))
        manager.free(seq)
    assert manager.evicted_hashes == []
