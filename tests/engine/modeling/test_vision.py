"""Gemma 3 with images, against transformers' own Gemma3ForConditionalGeneration on the same tiny
random weights (tests/vision_models.py): greedy tokens for one and two images equal transformers'
(its image tokens attend to each other both ways, under the sliding window too), batched with
text-only requests, in prefill chunks that start inside an image, and from the prefix cache,
which keys image blocks by the picture so another picture behind the same tokens never hits; the
encoder runs once per picture."""

from __future__ import annotations

import pytest
import torch

from localchat import LLM, SamplingParams
from localchat.engine.core.multimodal import EncoderCache, ImageInput
from localchat.errors import InvalidParameterError
from tests.vision_models import (
    IMAGE_TOKENS,
    chat_inputs,
    hf_greedy,
    image_request,
    images,
    prompt_logprobs,
    run_engine,
    save,
    tiny_llm,
)

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3-vlm")
    model, processor = save(directory)
    return directory, model, processor


def _inputs(processor, text: str, pictures: list) -> dict:
    return chat_inputs(processor, text, pictures)


def _hf_greedy(model, inputs) -> list[int]:
    return hf_greedy(model, inputs, NEW_TOKENS)


def _run(llm: LLM, requests: list[tuple[list[int], tuple]]) -> list[list[int]]:
    return run_engine(llm, requests, NEW_TOKENS)


def test_one_and_two_images_batched_with_text_equal_transformers(vlm):
    directory, model, processor = vlm
    pictures = images(3)
    batch = [
        _inputs(processor, "What is in this picture?", pictures[:1]),
        _inputs(processor, "plain text, no picture at all", []),
        _inputs(processor, "Compare the two pictures, please.", pictures[1:]),
    ]
    expected = [_hf_greedy(model, inputs) for inputs in batch]
    llm = tiny_llm(directory)
    assert _run(llm, [image_request(model, inputs) for inputs in batch]) == expected
    assert llm.engine.runner.encoder_cache.num_encoded == 3
    assert llm.engine.model_info.takes_images


def test_images_over_a_q8_0_kv_cache_stay_near_transformers(tmp_path):
    """The bidirectional image spans read their keys back from a q8_0 pool too, dequantized
    (head_dim 32, the smallest q8_0 takes): every prompt logprob within q8_0's rounding of
    transformers', in chunks that read earlier images from the pool."""
    model, processor = save(tmp_path, head_dim=32)
    inputs = _inputs(processor, "Two pictures; which one is brighter?", images(2, seed=7))
    llm = tiny_llm(tmp_path, kv_cache_dtype="q8_0", max_num_batched_tokens=9)
    ours, expected = prompt_logprobs(llm, model, inputs)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0.05)


def test_prompt_logprobs_equal_transformers_with_image_tokens_seeing_their_whole_image(vlm):
    """Every prompt position's logprob, the image tokens' own included: where those attended only
    causally, the text after them would read other keys."""
    directory, model, processor = vlm
    inputs = _inputs(processor, "Two pictures; which one is brighter?", images(2, seed=7))
    llm = tiny_llm(directory, max_num_batched_tokens=9)  # in chunks, each image whole
    ours, expected = prompt_logprobs(llm, model, inputs)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_keeps_each_image_whole(vlm):
    directory, model, processor = vlm
    pictures = images(2, seed=3)
    batch = [
        _inputs(processor, "Two pictures, one question.", pictures),
        _inputs(processor, "text alone, " * 3, []),
    ]
    expected = [_hf_greedy(model, inputs) for inputs in batch]
    for budget in (5, 7, 11):  # chunks that would end inside an image shrink to its start
        llm = tiny_llm(directory, max_num_batched_tokens=budget, max_num_seqs=2)
        assert _run(llm, [image_request(model, inputs) for inputs in batch]) == expected, budget


def test_prefix_cache_keys_image_blocks_by_the_picture(vlm):
    directory, model, processor = vlm
    first, other = images(2, seed=5)
    llm = tiny_llm(directory)
    cache = llm.engine.runner.encoder_cache
    turn = _inputs(processor, "Describe the picture in detail, please.", [first])
    expected = _hf_greedy(model, turn)
    assert _run(llm, [image_request(model, turn)]) == [expected]
    assert cache.num_encoded == 1
    # the same picture again: its blocks come from the cache, and it is not encoded again
    request = image_request(model, turn)
    hits_before = llm.engine.block_manager.prefix_cache_hits
    assert _run(llm, [request]) == [expected]
    assert llm.engine.block_manager.prefix_cache_hits - hits_before >= request[1][0].end
    assert cache.num_encoded == 1
    assert llm.engine.requests == {}
    # another picture behind the same placeholder tokens: no block holding its tokens is served
    swapped = _inputs(processor, "Describe the picture in detail, please.", [other])
    assert swapped["input_ids"].tolist() == turn["input_ids"].tolist()
    ids, pictures = image_request(model, swapped)
    hits_before = llm.engine.block_manager.prefix_cache_hits
    assert _run(llm, [(ids, pictures)]) == [_hf_greedy(model, swapped)]
    hit = llm.engine.block_manager.prefix_cache_hits - hits_before
    assert hit <= pictures[0].offset
    assert cache.num_encoded == 2


def test_the_encoder_cache_is_bounded():
    calls = []

    def encode(pixels: torch.Tensor) -> torch.Tensor:
        calls.append(len(pixels))
        return pixels.flatten(1)[:, None, :].repeat(1, 2, 1)

    cache = EncoderCache(encode, capacity=3 * 2 * 12 * 4)  # three images' rows of float32
    pictures = [ImageInput.of(torch.full((3, 2, 2), float(i)), 0, 2) for i in range(5)]
    for picture in pictures:
        cache.get([picture])
    assert len(cache.entries) == 3 and cache.size <= cache.capacity
    assert cache.get([pictures[0]])[0][0, 0] == 0.0 and calls[-1] == 1  # dropped: encoded again
    assert cache.num_encoded == 6
    cache.get([pictures[4]])
    assert cache.num_encoded == 6  # kept


def test_a_text_model_refuses_images(tmp_path):
    from tests.family_models import save as save_text

    save_text("gemma3", tmp_path)
    llm = LLM(str(tmp_path), max_model_len=64, kv_cache_memory="8MiB")
    picture = ImageInput.of(torch.zeros(3, 32, 32), 1, IMAGE_TOKENS)
    with pytest.raises(InvalidParameterError) as error:
        llm.engine.add_request("x", [5] * 8, SamplingParams(max_tokens=2), images=(picture,))
    assert error.value.param == "images"
    assert not llm.engine.model_info.takes_images
