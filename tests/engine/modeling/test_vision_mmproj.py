"""Vision-language models from llama.cpp's files: a GGUF text model and its image encoder in an
mmproj GGUF (engine/loading/mmproj.py), written from the tiny random Gemma 3, SmolVLM and Idefics3
models of the safetensors tests as llama.cpp's converter writes them (tests/mmproj_models.py).
Greedy tokens for one and two pictures (tiled, for SmolVLM and Idefics3), batched with a text-only
prompt, equal transformers' on the weights the files hold; the prompts the server makes from a chat
with pictures (the image processor made from the mmproj file's metadata, the text model's
tokenizer) equal the model's own processor's, ids and pixels; an mmproj file beside the model in
its directory is taken, and `mmproj='none'` takes none; a malformed file is refused in one line
naming the file and what is wrong."""

from __future__ import annotations

import base64
import io
import shutil

import pytest
import torch
from typer.testing import CliRunner

from localchat import LLM
from localchat.engine.core.multimodal import ImageInput
from localchat.engine.loading.model_cache import ensure_converted
from tests import mmproj_models
from tests.vision_models import chat_inputs, hf_greedy, image_request, images, run_engine

NEW_TOKENS = 8
# a GGUF's KV pool is float16 by default; float32 for transformers' tokens exactly
EXACT = dict(max_model_len=256, kv_cache_memory="16MiB", kv_cache_dtype="float32")
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module", params=mmproj_models.KINDS)
def pair(request, tmp_path_factory):
    """(kind, transformers model, its processor, text GGUF, f16 mmproj GGUF)."""
    kind = request.param
    model, processor, text, mmproj = mmproj_models.write_pair(kind, tmp_path_factory.mktemp(kind))
    return kind, model, processor, text, mmproj


def _llm(model, mmproj, **options) -> LLM:
    """Our engine on `model` with the image encoder `mmproj` (None: the one beside it)."""
    return LLM(str(model), mmproj=None if mmproj is None else str(mmproj), **{**EXACT, **options})


def _request(model, inputs) -> tuple[list[int], tuple[ImageInput, ...]]:
    config = model.config
    if hasattr(config, "mm_tokens_per_image"):  # Gemma 3
        return image_request(model, inputs, config.mm_tokens_per_image)
    # SmolVLM's, Idefics3's tiles: (patches a side / pixel shuffle) ** 2 tokens each
    side = config.vision_config.image_size // config.vision_config.patch_size
    return image_request(model, inputs, (side // config.scale_factor) ** 2)


def test_pictures_batched_with_text_equal_transformers(pair):
    kind, model, processor, text, mmproj = pair
    reference = mmproj_models.reference(model)  # the vision weights as the f16 file holds them
    pictures = images(3)
    batch = [
        chat_inputs(processor, "Describe it.", pictures[:1]),
        chat_inputs(processor, "no picture here, text alone", []),
        chat_inputs(processor, "Which of the two is larger?", pictures[1:]),
    ]
    expected = [hf_greedy(reference, inputs, NEW_TOKENS) for inputs in batch]
    llm = _llm(text, mmproj)
    assert llm.engine.model_info.takes_images
    got = run_engine(llm, [_request(model, inputs) for inputs in batch], NEW_TOKENS)
    assert got == expected
    if kind != "gemma3":
        assert llm.engine.runner.encoder_cache.num_encoded == 15  # 2 x 2 tiles and the whole
    else:
        assert llm.engine.runner.encoder_cache.num_encoded == 3


def test_an_f32_mmproj_equals_transformers_on_the_same_weights(tmp_path):
    model, processor, text, mmproj = mmproj_models.write_pair("gemma3", tmp_path, ftype="f32")
    inputs = chat_inputs(processor, QUESTION, images(2, seed=4))
    llm = _llm(text, mmproj)
    got = run_engine(llm, [_request(model, inputs)], NEW_TOKENS)
    assert got == [hf_greedy(model, inputs, NEW_TOKENS)]


def test_a_q8_0_mmproj_equals_transformers_on_the_weights_its_blocks_hold(tmp_path):
    """A quantized mmproj (the converter's q8_0: matrices as Q8_0 blocks) is read by dequantizing
    its blocks: tokens equal transformers' with the vision weights those blocks read back as."""
    model, processor, text, mmproj = mmproj_models.write_pair("gemma3", tmp_path, ftype="q8_0")
    inputs = chat_inputs(processor, QUESTION, images(2, seed=4))
    llm = _llm(text, mmproj)
    got = run_engine(llm, [_request(model, inputs)], NEW_TOKENS)
    reference = mmproj_models.reference(model, "q8_0")
    assert got == [hf_greedy(reference, inputs, NEW_TOKENS)]


def _url(picture) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


def _served_prompt(llm: LLM, pictures: list):
    """The prompt the server makes of a chat message with `pictures` then QUESTION."""
    import msgspec

    from localchat.server.protocol import ChatCompletionRequest
    from localchat.server.tools import template_messages
    from localchat.server.vision_prompt import image_parts, render_images_with

    content = [{"type": "image_url", "image_url": {"url": _url(p)}} for p in pictures]
    content.append({"type": "text", "text": QUESTION})
    data = msgspec.convert(
        {"model": "m", "messages": [{"role": "user", "content": content}]}, ChatCompletionRequest
    )
    engine = llm.engine

    def render(marked):
        return engine.render_chat(template_messages(marked.messages), add_generation_prompt=True)

    return render_images_with(engine, render, data, image_parts(data))


def _model_processor(kind: str, processor, text):
    """The model's own processor, with the GGUF's tokenizer: Gemma 3's file has a sentencepiece
    vocabulary of its own (tests/mmproj_models.py), SmolVLM's and Idefics3's are the model's."""
    if kind != "gemma3":
        return processor
    import transformers

    roles = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        ensure_converted(text), extra_special_tokens={**roles, "image_token": "<image_soft_token>"}
    )
    return transformers.Gemma3Processor(
        image_processor=processor.image_processor,
        tokenizer=tokenizer,
        image_seq_length=processor.image_seq_length,
        chat_template=processor.chat_template,
    )


def test_chat_prompts_from_the_mmproj_metadata_equal_the_models_processor(pair):
    kind, model, processor, text, mmproj = pair
    reference = _model_processor(kind, processor, text)
    llm = _llm(text, mmproj)
    for count in (1, 2):
        pictures = images(count, seed=11)
        ids, pictures_in = _served_prompt(llm, pictures)
        inputs = chat_inputs(reference, QUESTION, pictures)
        expected_ids, expected_images = _request(model, inputs)
        assert ids == expected_ids
        assert len(pictures_in) == len(expected_images)
        for ours, theirs in zip(pictures_in, expected_images, strict=True):
            assert (ours.offset, ours.length) == (theirs.offset, theirs.length)
            torch.testing.assert_close(ours.pixel_values, theirs.pixel_values, rtol=0, atol=0)
        expected = hf_greedy(mmproj_models.reference(model), inputs, NEW_TOKENS)
        assert run_engine(llm, [(ids, pictures_in)], NEW_TOKENS) == [expected]


def test_an_mmproj_beside_the_model_is_taken_and_none_takes_none(pair, tmp_path, caplog):
    _, _, _, text, mmproj = pair
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(text, directory / "model-Q8_0.gguf")
    shutil.copy(mmproj, directory / mmproj.name)
    with caplog.at_level("INFO", logger="localchat.engine"):
        llm = _llm(directory, None)
    assert llm.engine.model_info.takes_images
    assert f"image encoder {mmproj.name} (found beside the model)" in caplog.text
    assert llm.engine.model_info.name == "model-Q8_0"
    assert not _llm(directory, "none").engine.model_info.takes_images
    # two of them, neither of the model's precision (q8_0) nor f16: bf16 before f32
    (directory / mmproj.name).rename(directory / "mmproj-model-bf16.gguf")
    shutil.copy(mmproj, directory / "mmproj-model-f32.gguf")
    with caplog.at_level("INFO", logger="localchat.engine"):
        assert _llm(directory, None).engine.model_info.takes_images
    assert "mmproj-model-bf16.gguf (found beside the model)" in caplog.text


def _gemma3_edit(metadata: dict, tensors: dict, case: str) -> None:
    if case == "projector":
        metadata["clip.projector_type"] = "llava"
    elif case == "missing":
        del tensors["v.blk.1.ffn_up.weight"]
    elif case == "unknown":
        tensors["v.blk.0.attn_q_norm.weight"] = tensors["v.post_ln.weight"]
    elif case == "shape":
        metadata["clip.vision.feed_forward_length"] = 80
    elif case == "grid":
        metadata["clip.vision.image_size"] = 30
    elif case == "count":
        metadata["clip.vision.block_count"] = 0
    elif case == "tokens":  # an Idefics3 projector's prompts, for a Gemma 3 text model
        metadata["clip.projector_type"] = "idefics3"
        metadata["clip.vision.projector.scale_factor"] = 2


MALFORMED = {
    "projector": "projector type 'llava' is not supported; supported: gemma3, idefics3",
    "missing": "tensor v.blk.1.ffn_up.weight is missing",
    "unknown": "tensor v.blk.0.attn_q_norm.weight is not part of a gemma3 image encoder",
    "shape": "tensor v.blk.0.ffn_up.weight has shape [64, 32], but its metadata and the text "
    "model make it [80, 32]",
    "grid": "a 30-pixel image in 8-pixel patches does not pool by scale factor 2",
    "count": "clip.vision.block_count must be a positive integer, is 0",
    "tokens": "the text model's tokenizer (model.gguf) has no <image> token",
    "width": "its image embeddings are 96 wide, but the text model (model.gguf) takes 64",
    "text": "is not an mmproj file (llama.cpp's image encoder of a model): its "
    "general.architecture is 'gemma3', not 'clip'",
    "cut": "is not a readable GGUF file",
}


@pytest.fixture(scope="module")
def gemma3_pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3-malformed")
    return mmproj_models.write_pair("gemma3", directory)


def _malformed(case: str, gemma3_pair, tmp_path):
    model, processor, text, mmproj = gemma3_pair
    path = tmp_path / f"mmproj-{case}.gguf"
    if case == "text":
        return text, text
    if case == "cut":
        path.write_bytes(mmproj.read_bytes()[: mmproj.stat().st_size // 2])
        return text, path
    if case == "width":  # the encoder of a model whose text is 96 wide
        wider = tmp_path / "wider"
        wider.mkdir()
        other, _ = mmproj_models.save("gemma3", wider, hidden_size=96)
        mmproj_models.write_mmproj(other, "gemma3", processor.image_processor, path)
        return text, path

    def edit(metadata, tensors):
        _gemma3_edit(metadata, tensors, case)

    mmproj_models.write_mmproj(model, "gemma3", processor.image_processor, path, edit=edit)
    return text, path


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_mmproj_is_one_line_naming_the_file_and_what_is_wrong(
    case, gemma3_pair, tmp_path
):
    from localchat.cli import app

    text, path = _malformed(case, gemma3_pair, tmp_path)
    args = ["generate", "hi", "-m", str(text), "--mmproj", str(path), "-n", "1"]
    result = CliRunner().invoke(app, [*args, "--max-model-len", "64", "--kv-cache-memory", "8MiB"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # the error's one line, last (after the first load's "reading the tokenizer" note)
    *_, line = result.stderr.strip().splitlines()
    assert sum(text.startswith("error:") for text in result.stderr.splitlines()) == 1
    assert line.startswith(f"error: {path.name}") and MALFORMED[case] in line, line


def test_mmproj_options_that_do_not_fit_the_model_are_refused(gemma3_pair, tmp_path):
    from localchat.errors import InvalidParameterError, ModelNotFoundError
    from tests.vision_models import save

    _, _, text, mmproj = gemma3_pair
    with pytest.raises(ModelNotFoundError, match=r"--mmproj .*nothing\.gguf: no such file"):
        _llm(text, tmp_path / "nothing.gguf")
    with pytest.raises(InvalidParameterError, match="random weights"):
        _llm(text, mmproj, load_format="dummy")
    save(tmp_path / "hf")
    with pytest.raises(InvalidParameterError, match="--mmproj goes with a GGUF model"):
        _llm(tmp_path / "hf", mmproj)
    with pytest.raises(Exception, match=r"is llama\.cpp's image encoder of a model"):
        _llm(mmproj, None)
    from localchat.cli import app

    several = ["serve", "--models", f"{text},{text}", "--mmproj", str(mmproj)]
    result = CliRunner().invoke(app, several)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--mmproj names one model's image encoder" in result.stderr
