"""Every model family we run, against transformers' own model class on the same tiny random weights
(float32): the logits of a prompt longer than the sliding window, and greedy tokens equal to
transformers' generate, in one mixed batch, with chunked prefill, and from the prefix cache."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM
from localchat.engine.modeling.registry import family_name
from tests.family_models import (
    FAMILIES,
    WINDOW,
    WINDOWED,
    greedy,
    hf_greedy,
    random_prompts,
    save,
)

# dynamic NTK stretches its rotary base by the sequence's length, as transformers computes it: keys
# computed for one length past the original context are not another length's, so the prefix cache
# does not share them (test_dynamic_ntk_shares_no_blocks_across_lengths)
LENGTH_DEPENDENT = {"llama-dynamic"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    hf = save(name, directory)
    return name, directory, hf


def test_prompt_logits_equal_transformers(family):
    _, directory, hf = family
    llm = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB")
    prompt = random_prompts([4 * WINDOW + 7])[0]  # past every window and every original context
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(llm.engine.prompt_logits(prompt), expected, rtol=1e-4, atol=1e-4)
    assert llm.engine.model_info.family == family_name(hf.config) != ""


def test_greedy_tokens_equal_transformers_in_one_batch(family):
    _, directory, hf = family
    # lengths below, across and past the window (and past longrope's and dynamic NTK's original
    # context of 48 while generating)
    prompts = random_prompts([5, WINDOW + 3, 40, 3 * WINDOW])
    expected = [hf_greedy(hf, p) for p in prompts]
    llm = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB")
    assert greedy(llm, prompts) == expected


@pytest.mark.parametrize(
    "chunked",
    [pytest.param(False, id="prefix-cached"), pytest.param(True, id="chunked-and-prefix-cached")],
)
def test_chunked_prefill_and_the_prefix_cache_keep_the_tokens(family, chunked):
    name, directory, hf = family
    if name in LENGTH_DEPENDENT:
        pytest.skip(f"{name}: no blocks are shared between lengths (see above)")
    shared = random_prompts([2 * WINDOW + 5], seed=2)[0]
    prompts = [shared + tail for tail in random_prompts([3, 17], seed=3)]
    expected = [hf_greedy(hf, p) for p in prompts]
    options = dict(max_num_batched_tokens=16, max_num_seqs=4) if chunked else {}
    llm = LLM(str(directory), max_model_len=192, kv_cache_memory="16MiB", **options)
    assert greedy(llm, prompts[:1]) == expected[:1]
    hits_before = llm.engine.block_manager.prefix_cache_hits
    assert greedy(llm, prompts[1:]) == expected[1:]  # the shared blocks come from the cache
    assert llm.engine.block_manager.prefix_cache_hits > hits_before


def test_windowed_families_have_windows():
    """The families above that have sliding windows do window (a guard on the table)."""
    from localchat.engine.modeling.registry import spec_from_config
    from tests.family_models import build

    for name in WINDOWED:
        spec = spec_from_config(build(name).config)
        assert any(layer.sliding_window == WINDOW for layer in spec.layers), name


def test_dynamic_ntk_shares_no_blocks_across_lengths_and_chunks_like_one_pass(tmp_path):
    hf = save("llama-dynamic", tmp_path)
    shared = random_prompts([60], seed=4)[0]  # past the original context of 48
    prompts = [shared + tail for tail in random_prompts([3, 9], seed=5)]
    expected = [hf_greedy(hf, p) for p in prompts]
    llm = LLM(str(tmp_path), max_model_len=192, kv_cache_memory="16MiB", max_num_batched_tokens=16)
    assert greedy(llm, prompts[:1]) == expected[:1]  # chunks of 16: the whole length's base
    assert greedy(llm, prompts[1:]) == expected[1:]
    assert llm.engine.block_manager.prefix_cache_hits == 0
    assert greedy(llm, prompts[1:]) == expected[1:]  # the same length: its own blocks again
    assert llm.engine.block_manager.prefix_cache_hits > 0
