"""SmolVLM and Idefics3 with images, against transformers' own SmolVLMForConditionalGeneration and
Idefics3ForConditionalGeneration on the same tiny random weights (tests/idefics3_models.py): greedy
tokens for pictures of one tile and of several tiles plus the whole picture, one and two pictures
in a prompt, batched with a text-only request and in prefill chunks that end inside a tile (these
models' image tokens attend causally). The tower's position ids are transformers' bucketed ones,
which differ from SigLIP's plain order for some grid sizes; SmolVLM's processor is built without
its video processor, and expands prompts as transformers' Idefics3Processor does; a text model we
do not run is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from localchat import SamplingParams
from localchat.engine.core.multimodal import ImageInput
from localchat.errors import InvalidParameterError, UnsupportedModelError
from tests.idefics3_models import KINDS, TILE, TILE_TOKENS, save
from tests.vision_models import (
    chat_inputs,
    hf_greedy,
    image_request,
    images,
    run_engine,
    tiny_llm,
)

NEW_TOKENS = 8
ONE_TILE = {"size": {"longest_edge": TILE}}  # the picture scaled to a single tile


@pytest.fixture(scope="module", params=KINDS)
def vlm(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model, processor = save(request.param, directory)
    return directory, model, processor


def _request(model, inputs) -> tuple[list[int], tuple[ImageInput, ...]]:
    return image_request(model, inputs, TILE_TOKENS)  # each tile a run of its own


def test_tiled_and_single_tile_pictures_batched_with_text_equal_transformers(vlm):
    directory, model, processor = vlm
    pictures = images(3)
    batch = [
        chat_inputs(processor, "Describe it.", pictures[:1]),
        chat_inputs(processor, "no picture here, text alone", []),
        chat_inputs(processor, "Which of the two is larger?", pictures[1:]),
        chat_inputs(processor, "And scaled to one tile?", pictures[:1], **ONE_TILE),
    ]
    tiles = [len(inputs["pixel_values"][0]) if "pixel_values" in inputs else 0 for inputs in batch]
    assert tiles == [5, 0, 10, 1]  # 2 x 2 tiles and the whole picture, each; one tile
    expected = [hf_greedy(model, inputs, NEW_TOKENS) for inputs in batch]
    assert expected[0] != expected[3]  # the pictures steer the tiny model
    llm = tiny_llm(directory)
    assert run_engine(llm, [_request(model, inputs) for inputs in batch], NEW_TOKENS) == expected
    assert llm.engine.runner.encoder_cache.num_encoded == 16  # each distinct tile once
    assert llm.engine.model_info.takes_images


def test_chunked_prefill_may_end_inside_a_tile(vlm):
    directory, model, processor = vlm
    batch = [
        chat_inputs(processor, "Two pictures, one question.", images(2, seed=3)),
        chat_inputs(processor, "text alone, " * 3, []),
    ]
    expected = [hf_greedy(model, inputs, NEW_TOKENS) for inputs in batch]
    for budget in (3, 7):  # chunks end inside a tile's tokens
        llm = tiny_llm(directory, max_num_batched_tokens=budget, max_num_seqs=2)
        assert (
            run_engine(llm, [_request(model, inputs) for inputs in batch], NEW_TOKENS) == expected
        ), budget


def test_smolvlm_prompts_expand_as_idefics3_processor_does(vlm):
    import transformers

    from tests.idefics3_models import image_processor, tokenizer

    _, _, processor = vlm
    reference = transformers.Idefics3Processor(
        image_processor=image_processor("idefics3"), tokenizer=tokenizer(), image_seq_len=4
    )
    pictures = images(2, seed=9)
    text = "User:<image>one<image>two<end_of_utterance>\nAssistant:"
    ours, theirs = (
        p(text=text, images=pictures, return_tensors="pt") for p in (processor, reference)
    )
    assert ours["input_ids"].tolist() == theirs["input_ids"].tolist()
    torch.testing.assert_close(ours["pixel_values"], theirs["pixel_values"], rtol=0, atol=0)


@pytest.mark.parametrize("side", [4, 19, 25])  # 19 and 25: transformers buckets two patches alike
def test_tower_positions_equal_transformers(side):
    import transformers
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    from localchat.engine.modeling.vision.idefics3_vision import patch_positions
    from localchat.engine.modeling.vision.siglip import SiglipEmbeddings

    config = transformers.Idefics3VisionConfig(hidden_size=8, image_size=2 * side, patch_size=2)
    theirs = Idefics3VisionEmbeddings(config).eval()
    ours = SiglipEmbeddings(config, patch_positions(side))
    ours.load_state_dict(theirs.state_dict())
    pixels = torch.randn(2, 3, 2 * side, 2 * side)
    mask = torch.ones(2, side, side, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(ours(pixels), theirs(pixels, mask), rtol=0, atol=0)
    assert (patch_positions(side) == torch.arange(side * side)).all() == (side == 4)


def test_pixel_values_of_another_size_are_refused(vlm):
    directory, model, processor = vlm
    ids, (tile,) = _request(model, chat_inputs(processor, "Which?", images(1), **ONE_TILE))
    wrong = ImageInput.of(torch.zeros(3, 48, 48), tile.offset, tile.length)
    with pytest.raises(InvalidParameterError, match=r"\[3, 48, 48\], not the \[channels, 32, 32\]"):
        tiny_llm(directory).engine.add_request(
            "x", ids, SamplingParams(max_tokens=2), images=(wrong,)
        )


def test_a_text_model_we_do_not_run_is_refused_by_name(tmp_path):
    save("smolvlm", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config"] = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedModelError, match=r"SmolVLMForConditionalGeneration's text model \(gpt2\)"
    ):
        tiny_llm(tmp_path)
