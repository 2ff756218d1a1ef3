"""`localchat serve MODEL.gguf --mmproj MMPROJ.gguf`: llama.cpp's files of the tiny random SmolVLM
(tests/mmproj_models.py) through a real server and the openai client: pictures in image_url parts
are cut into tiles by the image processor made from the mmproj file's metadata, and the reply's
tokens equal transformers' on the weights the files hold."""

from __future__ import annotations

import base64
import io

import pytest

from tests.vision_models import chat_inputs, hf_greedy, images

QUESTION = "What do you see?"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests import mmproj_models
    from tests.serve_process import serve_process

    directory = tmp_path_factory.mktemp("smolvlm-gguf")
    model, processor, text, mmproj = mmproj_models.write_pair("smolvlm", directory)
    args = [str(text), "--mmproj", str(mmproj), "--served-model-name", "vlm"]
    args += ["--max-model-len", "256", "--kv-cache-memory", "16MiB", "--threads", "1"]
    args += ["--kv-cache-dtype", "float32"]  # transformers' tokens exactly
    with serve_process(directory / "serve.log", *args, timeout=180) as server:
        yield server, mmproj_models.reference(model), processor, _served_tokenizer(text)


def _served_tokenizer(text):
    """The GGUF's tokenizer, which spells the vocabulary's padding (ids past the model's own
    tokenizer's) as llama.cpp's converter names it."""
    from transformers import AutoTokenizer

    from localchat.engine.loading.model_cache import ensure_converted

    return AutoTokenizer.from_pretrained(ensure_converted(text))


def _url(picture) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"


def test_pictures_through_the_openai_client_equal_transformers(served):
    import openai

    server, reference, processor, tokenizer = served
    assert "image encoder mmproj-model-f16.gguf" in server.log()
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    pictures = images(2, seed=11)
    for count in (1, 2):
        parts = [{"type": "image_url", "image_url": {"url": _url(p)}} for p in pictures[:count]]
        reply = client.chat.completions.create(
            model="vlm",
            messages=[{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
            extra_body={"ignore_eos": True},
        )
        expected = hf_greedy(reference, chat_inputs(processor, QUESTION, pictures[:count]), 8)
        tokens = [entry.token for entry in reply.choices[0].logprobs.content]
        assert tokens == [tokenizer.decode([token]) for token in expected]
        assert reply.usage.prompt_tokens > count * 5 * 4  # five tiles of four tokens a picture
