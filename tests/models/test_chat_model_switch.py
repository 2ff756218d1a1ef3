"""The chat's /model switch through Pilot on the real engine: the default model, then a second
registry name (an alias of the same GGUF file, loaded as an engine of its own), then back through
the picker (F8); the history stays, and each reply records and shows the model that wrote it."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList

from localchat.config import EngineConfig
from localchat.models.default_model import DEFAULT_MODEL_NAME
from localchat.models.registry import add_alias
from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.messages import AssistantMessage
from localchat.tui.screens import ModelPicker
from localchat.tui.store import ConversationStore
from tests.tui.conftest import greedy_conversation, reply_done, send, wait_until

pytestmark = pytest.mark.slow
REGISTRY_DEFAULT = "smollm2-135m-instruct:q4_1"


async def test_model_switch_keeps_the_history(cache_dir, default_gguf):
    add_alias("smol-again", str(default_gguf))
    backend = EngineBackend(EngineConfig(max_model_len=512, kv_cache_memory="32MiB"))
    app = ChatApp(backend, ConversationStore(None), conversation=greedy_conversation(max_tokens=6))
    async with app.run_test(size=(100, 30)) as pilot:
        chat = app.chat
        await send(pilot, "Hi")
        await reply_done(pilot)
        first_engine = backend.engine

        await send(pilot, "/model no-such-model")  # refused: nothing changes
        assert chat.backend is backend and chat.state.name == "IDLE"
        await send(pilot, "/model smol-again")
        await reply_done(pilot)
        assert chat.backend.model_name == "smol-again" and chat.load_error is None
        assert not first_engine.is_ready  # the first engine was shut down, not kept

        await send(pilot, "And you?")
        await reply_done(pilot)
        messages = chat.session.conversation.messages
        assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[1].meta["model"] == DEFAULT_MODEL_NAME
        assert messages[3].meta["model"] == "smol-again"
        # the second model was given the first one's reply
        first, second = messages[1].meta, messages[3].meta
        assert second["prompt_tokens"] > first["prompt_tokens"] + first["completion_tokens"]
        shown = [str(view.meta.render()) for view in app.query(AssistantMessage)]
        assert shown[0].startswith(f"{DEFAULT_MODEL_NAME} · prompt")
        assert shown[1].startswith("smol-again · prompt")

        # the picker lists the registry; Enter on the default model switches back
        await pilot.press("f8")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker), what="the picker")
        options = app.screen.query_one(OptionList)
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        assert {"smol-again", REGISTRY_DEFAULT} <= set(ids)
        assert options.highlighted == ids.index("smol-again")  # the current model
        options.highlighted = ids.index(REGISTRY_DEFAULT)
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.backend.model_name == REGISTRY_DEFAULT, what="switch")
        await reply_done(pilot)
        await send(pilot, "Bye")
        await reply_done(pilot)
        assert len(messages) == 6 and messages[5].meta["model"] == REGISTRY_DEFAULT
    assert not chat.backend.engine.is_ready  # the app closed the backend it switched to


async def test_url_mode_switches_the_servers_model(models_dir, tmp_path):
    """`chat --url` on a several-model server: the picker lists its /v1/models, the next request
    names the model picked, and the server swaps its engine (--max-loaded-models 1)."""
    from localchat.tui.http_backend import OpenAIBackend
    from tests.models.test_serve_models import _cards, _serve

    args = ["--models-dir", str(models_dir), "--max-loaded-models", "1"]
    with _serve(tmp_path / "serve.log", *args) as (url, _):
        backend = OpenAIBackend(url, model="tiny-a")
        app = ChatApp(backend, ConversationStore(None), conversation=greedy_conversation())
        async with app.run_test(size=(100, 30)) as pilot:
            chat = app.chat
            await send(pilot, "Hi")
            await reply_done(pilot)
            await pilot.press("f8")
            await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker), what="the picker")
            options = app.screen.query_one(OptionList)
            ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
            assert ids == ["smol", "tiny-a", "tiny-b"] and options.highlighted == 1
            options.highlighted = 0
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat.backend.model_name == "smol", what="switch")
            await reply_done(pilot)
            await send(pilot, "And you?")
            await reply_done(pilot)
            messages = chat.session.conversation.messages
            assert [m.meta.get("model") for m in messages] == [None, "tiny-a", None, "smol"]
            body = chat.backend.last_body
            assert body["model"] == "smol" and body["messages"][1]["content"] == messages[1].content
            cards = _cards(url)
            assert cards["smol"]["loaded"] and not cards["tiny-a"]["loaded"]
