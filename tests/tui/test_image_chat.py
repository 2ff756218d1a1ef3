"""`/image PATH [text]` in the chat, through Pilot on the real in-process engine with the tiny
random Gemma 3 vision model (tests/vision_models.py): the picture reaches the model (the reply
equals transformers' for the same picture and text, and differs from the reply without it), the
message shows its marker, the history database keeps the picture and a reopened chat sends it
again; a missing file, a directory, a file that is not an image and a model that takes no images
are each one line in the chat."""

from __future__ import annotations

import io

import pytest
import pytest_asyncio

from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.messages import Notice, UserMessage
from localchat.tui.store import ConversationStore

from .conftest import greedy_conversation, reply_done, send, wait_until

SLOW, ON_LOOP = pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")
QUESTION = "What do you see?"


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from tests.vision_models import save

    directory = tmp_path_factory.mktemp("gemma3-vlm")
    model, processor = save(directory)
    return directory, model, processor


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vlm_engine(vlm_dir):
    from localchat.config import EngineConfig
    from localchat.engine.core.async_engine import AsyncEngine

    config = EngineConfig(
        model=str(vlm_dir[0]), max_model_len=256, kv_cache_memory="16MiB", num_threads=1
    )
    engine = AsyncEngine(config)
    await engine.start()
    yield engine
    await engine.shutdown()


class RecordingBackend(EngineBackend):
    def __init__(self, engine):
        super().__init__(engine=engine)
        self.requests = []

    async def stream(self, request):
        self.requests.append(request)
        async for delta in super().stream(request):
            yield delta


def _app(engine, store) -> ChatApp:
    conversation = greedy_conversation(max_tokens=8, ignore_eos=True)
    return ChatApp(RecordingBackend(engine), store, conversation=conversation)


def _png(tmp_path, seed: int, name: str):
    from tests.vision_models import images

    picture = images(1, seed=seed)[0]
    path = tmp_path / name
    picture.save(path, "PNG")
    return path, picture


def _expected(vlm_dir, pictures) -> str:
    """transformers' greedy 8 tokens for QUESTION after `pictures`."""
    import torch

    _, model, processor = vlm_dir
    parts = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": parts}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=rendered, images=pictures or None, return_tensors="pt")
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    return processor.tokenizer.decode(new, skip_special_tokens=True)


def _agrees(reply: str, expected: str) -> bool:
    # the tiny model's bytes may end inside a UTF-8 character, which the reply leaves out
    return bool(reply.strip()) and expected.startswith(reply.rstrip("\ufffd"))


async def _last_reply(pilot) -> str:
    await reply_done(pilot)
    message = pilot.app.chat.session.conversation.messages[-1]
    assert message.role == "assistant", message
    return message.content


@SLOW
@ON_LOOP
async def test_an_attached_image_reaches_the_model_and_the_history(vlm_engine, vlm_dir, tmp_path):
    path, picture = _png(tmp_path, 13, "cat.png")
    other_path, other = _png(tmp_path, 16, "dog picture.png")
    with_image, without = _expected(vlm_dir, [picture]), _expected(vlm_dir, [])
    assert with_image[:2] != without[:2]  # the picture changes what the tiny model says
    store = ConversationStore(tmp_path / "chats.sqlite3")
    app = _app(vlm_engine, store)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)  # loaded
        assert app.backend.takes_images is True
        await send(pilot, f"/image {path}")
        notice = str(app.query(Notice).last().render())
        assert "[image: cat.png 40x24] goes with your next message" in notice
        assert app.backend.requests == []  # nothing sent yet
        await send(pilot, QUESTION)
        reply = await _last_reply(pilot)
        assert _agrees(reply, with_image), (reply, with_image)
        first_id = app.chat.session.conversation.id
        sent = app.backend.requests[-1].messages[-1]["content"]
        assert sent[0]["type"] == "image_url"
        assert sent[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert sent[1] == {"type": "text", "text": QUESTION}
        shown = str(app.query(UserMessage).last().render())
        assert shown.splitlines() == ["[image: cat.png 40x24]", QUESTION]

        # the same text without a picture: the reply transformers gives without one
        await send(pilot, "/new")
        await send(pilot, QUESTION)
        plain = await _last_reply(pilot)
        assert _agrees(plain, without) and plain != reply

        # `/image "PATH WITH SPACES" text` sends at once
        await send(pilot, f'/image "{other_path}" {QUESTION}')
        await wait_until(pilot, lambda: len(app.backend.requests) == 3, what="the image turn")
        assert _agrees(await _last_reply(pilot), _expected(vlm_dir, [other]))
        assert app.backend.requests[-1].messages[-1]["content"][1]["text"] == QUESTION
        assert str(app.query(UserMessage).last().render()).startswith(
            "[image: dog picture.png 40x24]"
        )

    # the history database keeps the picture: the conversation reopened sends it again
    stored = store.load(first_id)
    assert stored is not None
    image = stored.messages[0].meta["images"][0]
    assert image["name"] == "cat.png" and (image["width"], image["height"]) == (40, 24)
    assert stored.messages[0].content == QUESTION
    assert stored.template_messages()[0]["content"][0]["image_url"]["url"] == image["url"]
    assert "[image: cat.png 40x24]" in stored.to_markdown()


@SLOW
@ON_LOOP
async def test_files_that_are_not_images_are_one_line_errors(vlm_engine, tmp_path):
    pdf = tmp_path / "paper.png"
    pdf.write_bytes(b"%PDF-1.4\n%%EOF\n")
    frames = [_frame(color) for color in ((255, 0, 0), (0, 0, 255))]
    gif = tmp_path / "anim.gif"
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100)
    app = _app(vlm_engine, ConversationStore(None))
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)
        for argument, words in [
            (str(tmp_path / "missing.png"), "no such file"),
            (str(tmp_path), "not a file"),
            (str(pdf), "paper.png: not an image"),
            (str(gif), "anim.gif: animated images are not supported"),
            ("", "/image needs a file"),
        ]:
            await send(pilot, f"/image {argument}".rstrip())
            notice = app.query(Notice).last()
            assert notice.has_class("error")
            text = str(notice.render())
            assert words in text and "\n" not in text, text
        assert app.chat.attached == [] and app.backend.requests == []


def _frame(color):
    from PIL import Image

    return Image.new("RGB", (8, 8), color)


@SLOW
@ON_LOOP
async def test_a_model_without_images_says_so(chat_engine, tmp_path):
    path, _ = _png(tmp_path, 13, "cat.png")
    app = _app(chat_engine, ConversationStore(None))
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)
        await send(pilot, f"/image {path} {QUESTION}")
        notice = app.query(Notice).last()
        assert notice.has_class("error")
        assert "takes no images" in str(notice.render())
        assert app.chat.attached == [] and app.backend.requests == []


def test_a_large_photo_is_kept_as_a_smaller_jpeg(tmp_path):
    import base64

    from PIL import Image

    from localchat.tui.attachments import STORE_BYTES, load_image

    noise = Image.effect_noise((3000, 2000), 80).convert("RGB")
    path = tmp_path / "photo.png"
    noise.save(path, "PNG")
    assert path.stat().st_size > STORE_BYTES
    image = load_image(str(path))
    assert image.marker == "[image: photo.png 3000x2000]" and image.scaled
    data = base64.b64decode(image.url.split(",", 1)[1])
    assert image.url.startswith("data:image/jpeg;base64,") and len(data) < STORE_BYTES
    assert Image.open(io.BytesIO(data)).size == (2048, 1365)


@pytest.fixture(scope="module")
def vlm_server(vlm_dir, tmp_path_factory):
    from tests.serve_process import serve_process

    log = tmp_path_factory.mktemp("vlm-serve") / "serve.log"
    args = [str(vlm_dir[0]), "--max-model-len", "256", "--kv-cache-memory", "16MiB"]
    with serve_process(log, *args, "--threads", "1", timeout=180) as server:
        yield server.base_url


@SLOW
@ON_LOOP
async def test_url_mode_sends_the_image_as_an_image_url_part(vlm_server, vlm_dir, tmp_path):
    from localchat.tui.http_backend import OpenAIBackend

    path, picture = _png(tmp_path, 13, "cat.png")
    backend = OpenAIBackend(vlm_server)
    conversation = greedy_conversation(max_tokens=8)
    app = ChatApp(backend, ConversationStore(None), conversation=conversation)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)
        await send(pilot, f"/image {path} {QUESTION}")
        reply = await _last_reply(pilot)
        content = backend.last_body["messages"][-1]["content"]
        assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert content[1] == {"type": "text", "text": QUESTION}
        assert _agrees(reply, _expected(vlm_dir, [picture])), reply
