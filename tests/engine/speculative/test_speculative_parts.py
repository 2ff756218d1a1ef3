"""The parts of speculative decoding: the config as vLLM's --speculative-config takes it, prompt
lookup against a naive search, and adaptive draft lengths."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.speculative.config import SpeculativeConfig
from localchat.engine.speculative.draft_length import MAX_PAUSE, DraftLength
from localchat.engine.speculative.ngram import NgramIndex
from localchat.engine.speculative.suffix import SuffixCache, SuffixDrafter, SuffixTrie
from localchat.errors import InvalidParameterError


def test_config_parses_vllms_json():
    config = SpeculativeConfig.parse(
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, '
        '"prompt_lookup_max": 4}'
    )
    assert config == SpeculativeConfig("ngram", 5, 2, 4, True)
    assert SpeculativeConfig.parse({"prompt_lookup_max": 3}).prompt_lookup_min == 2
    assert SpeculativeConfig.parse({"prompt_lookup_min": 3}).prompt_lookup_max == 3
    assert SpeculativeConfig.parse("off") is None
    # vLLM's draft model: a model without a method is one
    draft = SpeculativeConfig.parse({"model": "small.gguf", "num_speculative_tokens": 3})
    assert (draft.method, draft.model) == ("draft_model", "small.gguf")
    assert draft.num_speculative_tokens == 3
    assert SpeculativeConfig.parse(draft.to_dict()) == draft
    assert SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        ({"method": "eagle"}, "speculative_config.method: method 'eagle' is not supported yet"),
        ({"method": "draft_model"}, "speculative_config.model: the draft model's name"),
        ({"method": "ngram", "model": "x"}, "speculative_config.model: is for method draft_model"),
        ({"model": "x", "quantization": "q2"}, "speculative_config.quantization"),
        ({"method": "guess"}, "speculative_config.method"),
        ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
        ({"num_speculative_tokens": "5"}, "speculative_config.num_speculative_tokens"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 3}, "speculative_config.prompt_lookup_min"),
        ({"draft_model": "x"}, "speculative_config.draft_model: unknown field"),
        ({"adaptive": "yes"}, "speculative_config.adaptive"),
    ],
)
def test_config_errors_name_the_field(value, named):
    with pytest.raises(InvalidParameterError, match=named.replace("(", r"\(")) as caught:
        SpeculativeConfig.parse(value)
    assert caught.value.param == "speculative_config"


def naive_candidates(tokens, min_n, max_n):
    """Every position after an earlier occurrence of an n-gram (min_n..max_n) that ends tokens."""
    end = len(tokens)
    found = set()
    for n in range(min_n, min(max_n, end - 1) + 1):
        suffix = tokens[end - n :]
        for stop in range(n, end):
            if tokens[stop - n : stop] == suffix:
                found.add((n, stop))
    return found


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=60),
    st.lists(st.integers(1, 4), min_size=1, max_size=8),
)
def test_lookup_proposes_what_followed_an_earlier_occurrence(tokens, steps):
    """Grown step by step, the index proposes the continuation of a real earlier occurrence of the
    longest recurring suffix n-gram, the latest one unless it follows its last source."""
    index = NgramIndex(2, 4)
    grown: list[int] = []
    for size in [*steps, len(tokens)]:
        grown.extend(tokens[len(grown) : len(grown) + size])
        proposal = index.propose(grown, 3)
        candidates = naive_candidates(grown, 2, 4)
        if not candidates:
            assert proposal == []
            continue
        assert proposal, (grown, candidates)
        assert any(grown[stop : stop + 3] == proposal for _, stop in candidates)
        longest = max(n for n, _ in candidates)
        latest = max(stop for n, stop in candidates if n == longest)
        assert proposal == grown[latest : latest + 3] or index._anchor is not None


def test_lookup_follows_the_text_it_copies():
    """The source of the last draft is kept while the sequence keeps to it, though the same n-gram
    occurs again later."""
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 11, 12, 20]
    index = NgramIndex(2, 2)
    copy = [*source, 99, 10, 11]
    assert index.propose(copy, 3) == [12, 13, 14]
    copy.append(12)  # (11, 12) now also ends at 12, where 20 followed: the copy goes on
    assert index.propose(copy, 3) == [13, 14, 15]
    assert NgramIndex(2, 2).propose(copy, 3) == [20, 99, 10]  # without the history: the latest


def test_draft_length_adapts_and_pauses():
    length = DraftLength(5)
    assert length.next() == 5
    length.record(5, 2)
    assert length.next() == 3
    length.record(3, 3)
    assert length.next() == 5
    for _ in range(10):
        length.record(length.next() or 1, 0)
        while length.pause:
            assert length.next() == 0
    assert length.pause == 0 and length.misses == 10
    length.record(1, 0)
    assert length.pause == MAX_PAUSE
    fixed = DraftLength(4, adaptive=False)
    fixed.record(4, 0)
    assert fixed.next() == 4


def naive_counts(texts, depth):
    """How many windows (of up to `depth` tokens, one per start) of `texts` begin with each path."""
    counts: dict[tuple[int, ...], int] = {}
    for tokens in texts:
        for first in range(len(tokens)):
            window = tokens[first : first + depth]
            for end in range(1, len(window) + 1):
                counts[tuple(window[:end])] = counts.get(tuple(window[:end]), 0) + 1
    return counts


def trie_counts(trie):
    found: dict[tuple[int, ...], int] = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            found[(*path, token)] = child.count
            stack.append(((*path, token), child))
    return found


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
    st.lists(st.integers(1, 5), max_size=6),
)
def test_suffix_trie_counts_windows_as_a_naive_count(texts, steps):
    """Grown token by token (extend) or added whole, the trie counts each path as often as windows
    start with it; removing a text takes its windows out again."""
    trie = SuffixTrie(5)
    grown: list[int] = []
    old = 0
    for size in [*steps, len(texts[0])]:
        grown.extend(texts[0][len(grown) : len(grown) + size])
        trie.extend(grown, old)
        old = len(grown)
    for tokens in texts[1:]:
        trie.add(tokens)
    assert trie_counts(trie) == naive_counts([grown, *texts[1:]], 5)
    for tokens in texts[1:]:
        trie.add(tokens, sign=-1)
    assert trie_counts(trie) == naive_counts([grown], 5)


def test_suffix_drafts_the_most_frequent_continuation():
    cache = SuffixCache(depth=8, max_requests=2)
    drafter = SuffixDrafter(cache, factor=2.0, min_prob=0.1)
    # "5 6" was followed by 7 8 twice and by 9 once: the draft follows the majority
    tokens = [5, 6, 7, 8, 1, 5, 6, 7, 8, 2, 5, 6, 9, 3, 5, 6]
    assert drafter.propose(tokens, 8) == [7, 8, 1, 5]  # a 2-token match earns 2 x 2 tokens
    assert drafter.propose(tokens, 2) == [7, 8]
    # 7 followed two of the four times: not the 60% asked for
    assert SuffixDrafter(cache, 2.0, min_prob=0.6).propose(tokens, 8) == []
    # another request's output, from the shared cache
    cache.add_output(1, [40, 41, 42, 43, 44, 45])
    fresh = SuffixDrafter(cache, factor=1.0, min_prob=0.1)
    assert fresh.propose([9, 40, 41, 42], 8) == [43, 44, 45]
    cache.add_output(2, [1])
    cache.add_output(3, [2])  # the first output is evicted (two requests at most)
    assert SuffixDrafter(cache, 1.0, 0.1).propose([9, 40, 41, 42], 8) == []


def test_suffix_config_fields():
    config = SpeculativeConfig.parse(
        {
            "method": "suffix",
            "suffix_decoding_max_tree_depth": 16,
            "suffix_decoding_min_token_prob": 0,
        }
    )
    assert config.num_speculative_tokens == 8 and config.suffix_decoding_max_tree_depth == 16
    assert SpeculativeConfig.parse(config.to_dict()) == config
    with pytest.raises(InvalidParameterError, match="suffix_decoding_max_tree_depth: is for"):
        SpeculativeConfig.parse({"method": "ngram", "suffix_decoding_max_tree_depth": 8})
    with pytest.raises(InvalidParameterError, match="suffix_decoding_max_spec_factor: must be"):
        SpeculativeConfig.parse({"method": "suffix", "suffix_decoding_max_spec_factor": "x"})
