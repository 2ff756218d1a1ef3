"""Speculative decoding (prompt lookup) changes how fast tokens come, never which: greedy and seeded
outputs equal the engine's without it, under every sampling option, and sampled outputs follow the
same distribution."""

from __future__ import annotations

import collections
import math

import llguidance
import pytest

from localchat import LLM, SamplingParams

SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2}
CODE = """def merge(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result
"""
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def spec_llm(default_gguf):
    return LLM(speculative_config=SPEC)


def prompts(llm):
    copy = "Repeat this code exactly, then stop:\n\n" + CODE
    return [
        llm.engine.render_chat([{"role": "user", "content": copy}]),
        llm.engine.render_chat([{"role": "user", "content": "List the numbers 1 to 30."}]),
        "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,",
        "The capital of France is",
    ]


def tokens(outputs):
    return [[list(o.token_ids) for o in out.outputs] for out in outputs]


def run_both(llm, spec_llm, params, which=None):
    batch = prompts(llm) if which is None else [prompts(llm)[i] for i in which]
    before = spec_llm.engine.stats().spec_accepted_tokens_total
    plain = llm.generate(batch, params)
    spec = spec_llm.generate(batch, params)
    return plain, spec, spec_llm.engine.stats().spec_accepted_tokens_total - before


def test_greedy_tokens_and_logprobs_are_the_same(llm, spec_llm):
    params = SamplingParams(temperature=0, max_tokens=80, logprobs=3)
    plain, spec, accepted = run_both(llm, spec_llm, params)
    assert tokens(spec) == tokens(plain)
    assert accepted > 40  # the copy and the counting were mostly drafted
    for a, b in zip(plain, spec, strict=True):
        assert [o.text for o in a.outputs] == [o.text for o in b.outputs]
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert x.token_id == y.token_id and x.rank == y.rank
            # a verification computes several positions in one forward, a decode one: the
            # activations' quantization differs slightly between those paths
            assert x.logprob == pytest.approx(y.logprob, abs=1e-2)
            # (near ties among the alternatives may swap places)
            assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], rel=5e-3, abs=1e-2)


def test_greedy_is_the_same_one_request_at_a_time(llm, spec_llm):
    """Alone, a sequence's drafts run through the single-sequence path."""
    params = SamplingParams(temperature=0, max_tokens=60)
    for i in range(2):
        plain, spec, _ = run_both(llm, spec_llm, params, which=[i])
        assert tokens(spec) == tokens(plain)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=60, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=60, frequency_penalty=0.6, presence_penalty=0.4),
        SamplingParams(temperature=0, max_tokens=60, stop=["result.extend", "25"]),
        SamplingParams(temperature=0, max_tokens=7),  # drafts cut to the tokens left
        SamplingParams(temperature=0, max_tokens=40, min_tokens=30, n=2),
        SamplingParams(temperature=0, max_tokens=60, bad_words=["append"]),
    ],
    ids=["repetition", "frequency", "stop", "max_tokens", "min_tokens_n2", "bad_words"],
)
def test_greedy_is_the_same_under_sampling_options(llm, spec_llm, params):
    plain, spec, _ = run_both(llm, spec_llm, params, which=[0, 1])
    assert tokens(spec) == tokens(plain)
    assert [[o.finish_reason for o in out.outputs] for out in spec] == [
        [o.finish_reason for o in out.outputs] for out in plain
    ]


def test_seeded_sampling_draws_the_same_tokens(llm, spec_llm):
    """One draw per position from the request's generator, in the same order, with or without
    drafts: a seeded request's text does not depend on speculation."""
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=60, n=2)
    plain, spec, accepted = run_both(llm, spec_llm, params)
    assert tokens(spec) == tokens(plain)
    assert accepted > 10


def test_a_grammar_accepts_only_what_it_allows(llm, spec_llm):
    schema = llguidance.LLMatcher.grammar_from_json_schema(PERSON)
    prompt = llm.engine.render_chat(
        [{"role": "user", "content": 'Copy this JSON: {"name": "Ada Lovelace", "age": 36}'}]
    )
    params = SamplingParams(temperature=0, max_tokens=40, grammar=schema)
    plain = llm.generate([prompt], params)
    spec = spec_llm.generate([prompt], params)
    assert tokens(spec) == tokens(plain)


def test_prefix_cache_and_chunked_prefill_keep_the_tokens(llm, default_gguf):
    """A small token budget trims drafts and chunks prompts; a second turn reads the blocks the
    first one wrote (with its rejected drafts' keys past them) from the prefix cache."""
    small = LLM(speculative_config=SPEC, max_num_batched_tokens=24, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=50)
    first = prompts(llm)[:2]
    assert tokens(small.generate(first, params)) == tokens(llm.generate(first, params))
    # the next turn: the first prompt and its answer, then more
    answer = llm.generate(first[:1], params)[0].outputs[0].token_ids
    follow = [list(first[0]) + list(answer) + list(first[0][-20:])]
    hits = small.engine.stats().prefix_cache_hits
    assert tokens(small.generate(follow, params)) == tokens(llm.generate(follow, params))
    assert small.engine.stats().prefix_cache_hits > hits


def test_the_context_limit_is_kept(llm):
    """Drafts never run past max_model_len: a sequence near it ends as it would without them (as
    the plain engine's with as many new tokens as the context leaves)."""
    spec = LLM(max_model_len=96, speculative_config=SPEC)
    prompt = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,"
    left = 96 - len(llm.engine.tokenize(prompt))
    a = llm.generate([prompt], SamplingParams(temperature=0, ignore_eos=True, max_tokens=left))
    b = spec.generate([prompt], SamplingParams(temperature=0, ignore_eos=True))
    assert tokens(a) == tokens(b)
    assert b[0].outputs[0].finish_reason == "length"
    assert spec.engine.stats().spec_accepted_tokens_total > 0


def test_sampled_tokens_follow_the_same_distribution(llm, spec_llm):
    """Unseeded: the token after a drafted run is drawn as often with drafts as without (a
    two-sample chi-square test over 240 samples each, top_k=4 keeping the vocabulary small)."""
    prompt = "a b c d a b c d a b c d a b c d a b"
    params = SamplingParams(temperature=1.0, top_k=4, max_tokens=4, n=60)
    counts: list[collections.Counter] = []
    for engine in (llm, spec_llm):
        seen: collections.Counter = collections.Counter()
        for _ in range(4):
            for output in engine.generate([prompt], params)[0].outputs:
                seen[tuple(output.token_ids[2:4])] += 1
        counts.append(seen)
    assert spec_llm.engine.stats().spec_accepted_tokens_total > 0
    keys = [k for k in set(counts[0]) | set(counts[1]) if counts[0][k] + counts[1][k] >= 10]
    rest = [sum(c[k] for k in c if k not in keys) for c in counts]
    table = [[c[k] for k in keys] + [r] for c, r in zip(counts, rest, strict=True)]
    statistic = 0.0
    total = sum(map(sum, table))
    for column in zip(*table, strict=True):
        for row, observed in zip(table, column, strict=True):
            expected = sum(row) * sum(column) / total
            if expected:
                statistic += (observed - expected) ** 2 / expected
    dof = len(keys)
    # the chi-square quantile at 0.999 is below dof + 3.1 * sqrt(2 dof) + 7 for these sizes
    assert statistic < dof + 3.1 * math.sqrt(2 * dof) + 7, (statistic, dof, table)


def test_suffix_decoding_keeps_the_tokens_and_learns_from_earlier_answers(llm, default_gguf):
    """The suffix method drafts from the request's own text and, for a question asked again, from
    the earlier answer in its shared tree: more of the second answer is drafted and kept."""
    suffix = LLM(speculative_config={"method": "suffix"})
    params = SamplingParams(temperature=0, max_tokens=60)
    batch = prompts(llm)[:2]
    assert tokens(suffix.generate(batch, params)) == tokens(llm.generate(batch, params))
    question = [llm.engine.render_chat([{"role": "user", "content": "Describe a cat in detail."}])]
    kept = []
    for _ in range(2):
        before = suffix.engine.stats().spec_accepted_tokens_total
        assert tokens(suffix.generate(question, params)) == tokens(llm.generate(question, params))
        kept.append(suffix.engine.stats().spec_accepted_tokens_total - before)
    assert kept[1] > kept[0] + 20, kept
