"""Greedy output of the engine on float32 weights equals Hugging Face transformers token for token,
whatever the batching. (The quantized path is checked against the float32 one in tests/quant.)"""

from __future__ import annotations

import pytest

from localchat import LLM
from tests.engine.conftest import greedy_params

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def llm(float_llm):
    """Parity with transformers holds on the float32 path (GGUF weights dequantized)."""
    return float_llm


def generate_ids(llm, prompts):
    return [out.token_ids for out in llm.generate(prompts, greedy_params())]


def _first_difference(a: list[int], e: list[int]) -> int:
    """The first position where the token ids differ (or where the shorter list ends)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, e, strict=False)) if x != y), min(len(a), len(e))
    )


def assert_same(actual, expected):
    for index, (a, e) in enumerate(zip(actual, expected, strict=False)):
        assert a == e, f"prompt {index} diverges at token {_first_difference(a, e)}"
    assert len(actual) == len(expected)


def assert_all_blocks_free(llm):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert not llm.engine.has_unfinished()


def test_greedy_matches_hf_in_one_mixed_batch(llm, parity_prompts, hf_parity_outputs):
    assert len(parity_prompts) >= 8 and len({len(p) for p in parity_prompts}) >= 6
    assert_same(generate_ids(llm, parity_prompts), hf_parity_outputs)
    assert_all_blocks_free(llm)


def test_preemption_keeps_outputs(parity_prompts, hf_parity_outputs):
    # 24 blocks of 16 tokens: one long prompt and its output fit, the whole batch does not.
    llm = LLM(quantization="none", max_model_len=384, kv_cache_memory=24 * 16 * 2 * 30 * 3 * 64 * 4)
    assert_same(generate_ids(llm, parity_prompts), hf_parity_outputs)
    assert llm.engine.scheduler.num_preemptions > 0
    assert_all_blocks_free(llm)


def test_chunked_prefill_keeps_outputs(parity_prompts, hf_parity_outputs):
    llm = LLM(quantization="none", max_num_batched_tokens=16, max_num_seqs=16)
    engine = llm.engine
    chunked = []
    original = engine.scheduler.schedule

    def spy():
        batch = original()
        chunked.extend(
            n
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if n > 1 and seq.num_computed_tokens + n < seq.num_prompt_tokens
        )
        assert batch.num_tokens <= 16
        return batch

    engine.scheduler.schedule = spy
    assert_same(generate_ids(llm, parity_prompts), hf_parity_outputs)
    assert chunked, "no prompt was split across steps"
    assert_all_blocks_free(llm)


def test_prefix_caching_off_keeps_outputs(parity_prompts, hf_parity_outputs):
    llm = LLM(quantization="none", enable_prefix_caching=False)
    assert_same(generate_ids(llm, parity_prompts), hf_parity_outputs)
    assert llm.engine.block_manager.prefix_cache_hits == 0


def test_request_added_mid_decode_keeps_outputs(llm, parity_prompts, hf_parity_outputs):
    engine = llm.engine
    results: dict[str, list[int]] = {}
    for i in range(4):
        engine.add_request(f"early-{i}", parity_prompts[i], greedy_params())
    for _ in range(5):
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    assert all(len(results.get(f"early-{i}", [])) >= 3 for i in range(4))  # mid-decode
    for i in range(4, len(parity_prompts)):
        engine.add_request(f"late-{i}", parity_prompts[i], greedy_params())
    while engine.has_unfinished():
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    ordered = [results[f"early-{i}"] for i in range(4)] + [
        results[f"late-{i}"] for i in range(4, len(parity_prompts))
    ]
    assert_same(ordered, hf_parity_outputs)
    assert_all_blocks_free(llm)
