"""Images under tensor parallelism: the tiny Gemma 3 VLM (tests/vision_models.py: 4 query heads
and 2 KV heads, one of each pair per rank) on 2 spawned ranks, its image encoder on rank 0 alone.
Greedy tokens for one and two images batched with a text-only request, in prefill chunks beside
decodes, equal transformers' (and so the single-process engine's, tests/engine/modeling/
test_vision.py); every prompt logprob, the image tokens' own that attend to their whole image on
each rank's heads included, equals transformers' and one process's. SmolVLM from a text GGUF and
its mmproj file (causal image tokens, a picture in tiles) gives transformers' tokens too."""

from __future__ import annotations

import pytest
import torch

from tests.vision_models import (
    chat_inputs,
    hf_greedy,
    image_request,
    images,
    prompt_logprobs,
    run_engine,
    save,
    tiny_llm,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NEW_TOKENS = 6
# prefills in chunks (an image whole in one: Gemma 3's attend both ways), decodes beside them
OPTIONS = {"tensor_parallel_size": 2, "max_num_batched_tokens": 24, "kv_cache_dtype": "float32"}


def _tokens(llm, model, batch: list[dict], tokens_per_image: int) -> list[list[int]]:
    requests = [image_request(model, inputs, tokens_per_image) for inputs in batch]
    return run_engine(llm, requests, NEW_TOKENS)


# first: a process holds one tensor-parallel group at a time, and the module's Gemma 3 engine
# holds its group from its first test to the module's end
def test_tp2_smolvlm_from_gguf_and_mmproj_equals_transformers(tmp_path):
    """A text GGUF and llama.cpp's mmproj file beside it, a picture of 2 x 2 tiles plus the
    whole."""
    from tests.idefics3_models import TILE_TOKENS
    from tests.mmproj_models import write_pair

    model, processor, text, mmproj = write_pair("smolvlm", tmp_path, ftype="f32")
    batch = [
        chat_inputs(processor, "Describe it.", images(1)),
        chat_inputs(processor, "no picture here, text alone", []),
    ]
    expected = [hf_greedy(model, inputs, NEW_TOKENS) for inputs in batch]
    llm = tiny_llm(text, mmproj=str(mmproj), **OPTIONS)
    try:
        assert _tokens(llm, model, batch, TILE_TOKENS) == expected
        assert llm.engine.runner.encoder_cache.num_encoded == 5
    finally:
        llm.engine.runner.close()


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """The tiny Gemma 3 VLM's directory, the model, its processor, and an engine of it on 2
    ranks."""
    directory = tmp_path_factory.mktemp("gemma3-vlm-tp")
    model, processor = save(directory)
    llm = tiny_llm(directory, **OPTIONS)
    yield directory, model, processor, llm
    llm.engine.runner.close()


def test_tp2_images_batched_with_text_equal_transformers(gemma3):
    _, model, processor, llm = gemma3
    pictures = images(3)
    batch = [
        chat_inputs(processor, "What is in this picture?", pictures[:1]),
        chat_inputs(processor, "plain text, no picture at all", []),
        chat_inputs(processor, "Compare the two pictures, please.", pictures[1:]),
    ]
    expected = [hf_greedy(model, inputs, NEW_TOKENS) for inputs in batch]
    assert _tokens(llm, model, batch, model.config.mm_tokens_per_image) == expected
    assert llm.engine.runner.encoder_cache.num_encoded == 3
    assert llm.engine.model_info.takes_images


def test_tp2_prompt_logprobs_equal_one_process_and_transformers(gemma3):
    """The image tokens attend to their whole image on each rank's own heads: where they did
    not, the text after them would read other keys."""
    directory, model, processor, llm = gemma3
    inputs = chat_inputs(processor, "Two pictures; which one is brighter?", images(2, seed=7))
    ours, expected = prompt_logprobs(llm, model, inputs)
    one, _ = prompt_logprobs(tiny_llm(directory, kv_cache_dtype="float32"), model, inputs)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours, one, rtol=1e-4, atol=1e-4)
