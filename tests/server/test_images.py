"""Images in API requests (server/images.py): data: URLs of PNG, JPEG, WebP and still GIF files
decode to RGB pictures; every bad image is a 400 naming the part: truncated, an oversized header
(20,000 x 20,000, refused before a pixel is decoded), an animated GIF, a PDF under an image's
name, bad base64, and http(s) URLs, which this server does not fetch."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from localchat.errors import InvalidParameterError
from localchat.server.images import image_from_url

FIELD = "messages[0].content[1].image_url"


def _file(fmt: str, size=(12, 8), **options) -> bytes:
    buffer = io.BytesIO()
    noise = Image.frombytes(
        "RGB", size, bytes((i * 7919) % 251 for i in range(3 * size[0] * size[1]))
    )
    noise.save(buffer, fmt, **options)
    return buffer.getvalue()


def _url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _refused(url: str) -> str:
    with pytest.raises(InvalidParameterError) as error:
        image_from_url(url, FIELD)
    assert error.value.param == FIELD
    return str(error.value)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_decode_to_rgb_pictures(fmt):
    picture = image_from_url(_url(_file(fmt), f"image/{fmt.lower()}"), FIELD)
    assert picture.mode == "RGB" and picture.size == (12, 8)


def test_one_pixel_is_a_picture():
    assert image_from_url(_url(_file("PNG", (1, 1))), FIELD).size == (1, 1)


def test_a_truncated_file_is_refused():
    data = _file("JPEG", (64, 64), quality=95)
    assert "truncated" in _refused(_url(data[: len(data) // 2], "image/jpeg"))


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (its one IDAT holds a single row)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" + b"\x00" * 3 * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", row) + chunk(b"IEND", b"")


def test_a_huge_image_is_refused_from_its_header():
    assert "more than 50,000,000 pixels" in _refused(_url(_png_header(20_000, 20_000)))
    assert "9000 x 6000 pixels" in _refused(_url(_png_header(9000, 6000)))


def test_an_animated_gif_is_refused():
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert "animated" in _refused(_url(buffer.getvalue(), "image/gif"))


def test_a_pdf_named_as_an_image_is_refused():
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    assert "not an image" in _refused(_url(pdf, "image/png"))


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://example.com/cat.png", "fetches no image URLs"),
        ("http://10.0.0.1/cat.png", "fetches no image URLs"),
        ("data:image/png,rawbytes", "base64"),
        ("data:image/png;base64,@@@not-base64@@@", "not valid base64"),
        ("file:///etc/passwd", "data: URL"),
    ],
)
def test_urls_other_than_base64_data_urls_are_refused(url, words):
    assert words in _refused(url)


def test_tiles_the_vision_tower_does_not_take_are_refused_by_name():
    import numpy as np

    from localchat.errors import UnsupportedModelError
    from localchat.server.vision_prompt import _tiles

    pixels = np.zeros((1, 2, 3, 48, 48), np.float32)  # [prompts, tiles, ...]
    with pytest.raises(UnsupportedModelError, match=r"48 x 48 pixel .* tower takes 32 x 32"):
        _tiles({"pixel_values": pixels}, 32)
    mask = np.ones((1, 2, 48, 48), np.int64)
    mask[0, 1, 40:] = 0
    with pytest.raises(UnsupportedModelError, match="padded an image tile"):
        _tiles({"pixel_values": pixels, "pixel_attention_mask": mask}, 48)
    assert _tiles({"pixel_values": pixels}, 48).shape == (2, 3, 48, 48)


def test_a_processor_that_cannot_be_built_is_refused_by_name(tmp_path, monkeypatch):
    """An ImportError (a package it wants) is a clear refusal; SmolVLM's gets its stand-in."""
    import transformers

    from localchat.errors import UnsupportedModelError
    from localchat.server.vision_prompt import load_processor

    def missing(*args, **kwargs):
        raise ImportError("FooProcessor requires the Torchvision library")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", missing)
    transformers.Idefics3Config().save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="processor cannot be loaded: FooProcessor"):
        load_processor(str(tmp_path))


# --- through a real server on a tiny Gemma 3 VLM (and SmolVLM) and the openai client -------------


def _saved(tmp_path_factory, name: str, save):
    """The tiny VLM `save(directory)` writes: (model, processor, the serve log, serve's args for
    it as "vlm")."""
    directory = tmp_path_factory.mktemp(name)
    model, processor = save(directory)
    log = tmp_path_factory.mktemp("vlm") / "serve.log"
    args = [str(directory), "--served-model-name", "vlm", "--max-model-len", "256"]
    args += ["--kv-cache-memory", "16MiB", "--threads", "1"]
    return model, processor, log, args


@pytest.fixture(scope="module")
def served_vlm(tmp_path_factory):
    from tests.serve_process import serve_process
    from tests.vision_models import save

    model, processor, log, args = _saved(tmp_path_factory, "gemma3-vlm", save)
    with serve_process(log, *args, timeout=180) as server:
        yield server, model, processor


@pytest.fixture(scope="module")
def served_smolvlm(tmp_path_factory):
    import functools

    from tests.idefics3_models import save
    from tests.serve_process import serve_process

    model, processor, log, args = _saved(
        tmp_path_factory, "smolvlm", functools.partial(save, "smolvlm")
    )
    with serve_process(log, *args, timeout=180) as server:
        yield server, model, processor


def _png(picture) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return _url(buffer.getvalue())


def _expected_text(model, processor, text: str, pictures: list) -> str:
    tokens = _expected_tokens(model, processor, text, pictures)
    return processor.tokenizer.decode(tokens, skip_special_tokens=True)


def _expected_tokens(model, processor, text: str, pictures: list) -> list[int]:
    from tests.vision_models import chat_inputs, hf_greedy

    return hf_greedy(model, chat_inputs(processor, text, pictures), 8)


def _content(pictures: list, text: str) -> list[dict]:
    """A user message's content: `pictures` as image_url data: URL parts, then `text`."""
    parts = [{"type": "image_url", "image_url": {"url": _png(p)}} for p in pictures]
    return [*parts, {"type": "text", "text": text}]


def _chat(client, content: list, **extra):
    return client.chat.completions.create(
        model="vlm",
        messages=[{"role": "user", "content": content}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
        **extra,
    )


def test_openai_client_image_url_parts_equal_transformers(served_vlm):
    import openai

    from tests.vision_models import images

    server, model, processor = served_vlm
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    pictures = images(2, seed=11)
    for count in (1, 2):
        content = _content(pictures[:count], "What do you see?")
        reply = _chat(client, content)
        assert reply.choices[0].message.content == _expected_text(
            model, processor, "What do you see?", pictures[:count]
        )
    # the same picture again: its image blocks come from the prefix cache
    again = _chat(client, content)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16


def test_smolvlm_tiled_pictures_through_the_openai_client_equal_transformers(served_smolvlm):
    """SmolVLM's processor (built here without its video processor) cuts each picture into 2 x 2
    tiles and the whole picture, each a run of placeholder tokens encoded on its own."""
    import openai

    from tests.vision_models import images

    server, model, processor = served_smolvlm
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    pictures = images(2, seed=11)
    for count in (1, 2):
        reply = _chat(client, _content(pictures[:count], "What do you see?"), logprobs=True)
        # each token's text: the tiny model's bytes are seldom UTF-8 as a whole
        expected = _expected_tokens(model, processor, "What do you see?", pictures[:count])
        tokens = [entry.token for entry in reply.choices[0].logprobs.content]
        assert tokens == [processor.tokenizer.decode([token]) for token in expected]
        assert reply.usage.prompt_tokens > count * 5 * 4  # five tiles of four tokens a picture


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (_url(b"%PDF-1.4\n%%EOF\n"), "not an image"),
        ("https://example.com/cat.png", "fetches no image URLs"),
    ],
)
def test_a_bad_image_is_a_400_naming_its_part(served_vlm, url, words):
    import openai

    server, _, _ = served_vlm
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, content)
    body = error.value.body
    assert body["param"] == "messages[0].content[1].image_url"
    assert words in body["message"]


def test_a_text_model_given_an_image_is_a_400_naming_the_part(openai_client):
    import openai

    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": _url(_file("PNG"))}},
    ]
    with pytest.raises(openai.BadRequestError) as error:
        openai_client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": content}],
            max_tokens=2,
        )
    assert error.value.body["param"] == "messages[0].content[1].image_url"
    assert "takes no images" in error.value.body["message"]


def test_anthropic_image_blocks_equal_transformers(served_vlm):
    import anthropic

    from tests.vision_models import images

    server, model, processor = served_vlm
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    texts = []
    for seed in (13, 16):  # two pictures the tiny model answers differently
        picture = images(1, seed=seed)[0]
        data = _png(picture).split(",", 1)[1]
        source = {"type": "base64", "media_type": "image/png", "data": data}
        content = [{"type": "image", "source": source}, {"type": "text", "text": "Say what."}]
        reply = claude.messages.create(
            model="vlm",
            max_tokens=8,
            messages=[{"role": "user", "content": content}],
            extra_body={"ignore_eos": True, "temperature": 0},
        )
        # the tiny model's bytes may end inside a UTF-8 character, which the reply leaves out
        text = reply.content[0].text
        assert text and _expected_text(model, processor, "Say what.", [picture]).startswith(text)
        assert reply.usage.output_tokens == 8
        texts.append(text)
    assert texts[0][:2] != texts[1][:2]
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as error:
        claude.messages.create(
            model="vlm",
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, bad]}],
        )
    assert "messages[0].content[1]" in error.value.body["error"]["message"]


def test_responses_input_image_equals_transformers(served_vlm):
    import openai

    from tests.vision_models import images

    server, model, processor = served_vlm
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    picture = images(2, seed=11)[0]
    content = [
        {"type": "input_image", "image_url": _png(picture)},
        {"type": "input_text", "text": "What do you see?"},
    ]
    response = client.responses.create(
        model="vlm",
        input=[{"role": "user", "content": content}],
        max_output_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    expected = _expected_text(model, processor, "What do you see?", [picture])
    assert response.output_text == expected.rstrip()  # a reply's trailing space is not kept
    assert response.usage.output_tokens == 8
    bad = [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": _url(b"GIF")}]
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model="vlm", input=[{"role": "user", "content": bad}])
    assert error.value.body["param"] == "input[0].content[1]"


def test_responses_and_messages_image_urls_are_400s_without_allowed_media_domains(served_vlm):
    """This server fetches nothing (no --allowed-media-domains): an http(s) URL is a 400 naming
    the field, in each API's error shape; so is an input_image's file_id (no Files API)."""
    import anthropic
    import openai

    server, _, _ = served_vlm
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    for image, param in (
        ({"image_url": "https://example.com/cat.png", "detail": "auto"}, "image_url"),
        ({"file_id": "file-123"}, "file_id"),
    ):
        content = [{"type": "input_text", "text": "a"}, {"type": "input_image", **image}]
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(model="vlm", input=[{"role": "user", "content": content}])
        assert error.value.body["param"] == f"input[0].content[1].{param}"
        words = "fetches no image URLs" if param == "image_url" else "file ids are not supported"
        assert words in error.value.body["message"]

    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    source = {"type": "url", "url": "https://example.com/cat.png"}
    content = [{"type": "text", "text": "a"}, {"type": "image", "source": source}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model="vlm", max_tokens=8, messages=[{"role": "user", "content": content}]
        )
    message = refused.value.body["error"]["message"]
    assert message.startswith("messages[0].content[1].source.url: ")
    assert "fetches no image URLs" in message


def test_pictures_reach_data_parallel_replicas_and_equal_transformers(tmp_path_factory):
    """Under `-dp 2` the request's pictures travel with it to the replica its router picks, whose
    engine encodes them: two chats sent at once equal transformers'."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from tests.serve_process import serve_process
    from tests.vision_models import images, save

    model, processor, log, args = _saved(tmp_path_factory, "gemma3-vlm-dp", save)
    with serve_process(log, *args, "-dp", "2", timeout=240) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        pictures = images(2, seed=5)
        asks = [(pictures[:1], "What do you see?"), (pictures, "Compare them.")]
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda ask: _chat(client, _content(*ask)), asks))
        for (shown, text), reply in zip(asks, replies, strict=True):
            expected = _expected_text(model, processor, text, shown)
            assert reply.choices[0].message.content == expected
