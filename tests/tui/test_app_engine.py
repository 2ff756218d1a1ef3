"""The chat app on the real in-process engine (the default model, one engine for all these
tests)."""

from __future__ import annotations

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.engine_backend import EngineBackend
from localchat.tui.messages import AssistantMessage, UserMessage
from localchat.tui.screens import InputScreen
from localchat.tui.store import ConversationStore, default_db_path

from .conftest import greedy_conversation, reply_done, send, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


class RecordingBackend(EngineBackend):
    """The engine backend, keeping every request and every delta it streamed."""

    def __init__(self, engine):
        super().__init__(engine=engine)
        self.requests, self.deltas = [], []

    async def stream(self, request):
        self.requests.append(request)
        async for delta in super().stream(request):
            self.deltas.append(delta)
            yield delta


def make_app(engine, store=None, **settings) -> ChatApp:
    return ChatApp(
        RecordingBackend(engine),
        store or ConversationStore(None),
        conversation=greedy_conversation(**settings),
    )


async def test_a_streamed_reply_then_a_second_turn_served_from_the_prefix_cache(chat_engine):
    app = make_app(chat_engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "Hello! What is your name?")
        await reply_done(pilot)
        first = app.chat.session.conversation.messages[-1]
        assert first.role == "assistant" and first.content.strip()
        assert len([d for d in app.backend.deltas if d.text]) >= 2  # streamed piece by piece
        assert app.query_one(AssistantMessage).markdown.source == first.content
        turn1_prompt = first.meta["prompt_tokens"]

        await send(pilot, "And what can you do?")
        await reply_done(pilot)
        second = app.chat.session.conversation.messages[-1]
        request = app.backend.requests[-1]
        assert [m["content"] for m in request.messages][:2] == [
            "Hello! What is your name?",
            first.content,
        ]
        assert second.meta["prompt_tokens"] > turn1_prompt + first.meta["completion_tokens"]
        assert second.meta["cached_tokens"] >= (turn1_prompt // 16) * 16 > 0
        meta_line = str(app.query(AssistantMessage).last().meta.render())
        assert f"{second.meta['cached_tokens']} cached" in meta_line
        assert "prefix hits" in str(app.query_one("#status").render())


async def test_escape_aborts_the_engine_request_and_keeps_the_partial_reply(chat_engine):
    # A reply that cannot end by itself (no EOS) for far longer than Esc takes to arrive, even on a
    # loaded machine: 200 tokens were once written before a busy UI saw the first words.
    app = make_app(chat_engine, max_tokens=1500, ignore_eos=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "Write a long story about a dragon.")
        await wait_until(
            pilot,
            lambda: (
                len(app.chat.session.conversation.messages) == 2
                and app.chat.session.conversation.messages[1].content
            ),
            what="the first words",
        )
        await pilot.press("escape")
        await reply_done(pilot)
        reply = app.chat.session.conversation.messages[-1]
        assert reply.stopped and reply.content and reply.meta["completion_tokens"] < 1500
        assert app.query_one(AssistantMessage).has_class("stopped")
        await wait_until(
            pilot,
            lambda: chat_engine.stats().num_running == 0,
            10,
            "the engine to drop the request",
        )
        assert chat_engine.stats().num_waiting == 0


async def test_regenerate_and_edit_resend(chat_engine):
    store = ConversationStore(None)
    app = make_app(chat_engine, store)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "Say hi.")
        await reply_done(pilot)
        first = app.chat.session.conversation.messages[-1].content
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        messages = app.chat.session.conversation.messages
        assert [m.role for m in messages] == ["user", "assistant"] and messages[
            1
        ].content == first  # greedy
        assert len(app.query(AssistantMessage)) == 1
        # a regenerated reply re-uses the whole cached prompt
        assert messages[1].meta["cached_tokens"] >= (messages[1].meta["prompt_tokens"] // 16) * 16

        original_id = app.chat.session.conversation.id
        await pilot.press("ctrl+t")
        assert isinstance(app.screen, InputScreen)
        app.screen.query_one("#input-text").load_text("Say bye.")
        await pilot.press("ctrl+s")
        await reply_done(pilot)
        branch = app.chat.session.conversation
        assert branch.id != original_id and branch.messages[0].content == "Say bye."
        assert branch.messages[1].role == "assistant" and branch.messages[1].content
        assert [m.content for m in store.load(original_id).messages] == ["Say hi.", first]


async def test_slash_commands_set_the_sampling_params_the_engine_receives(chat_engine, monkeypatch):
    received = []
    add_request = chat_engine.add_request

    async def spy(prompt, params=None, request_id=None, **kwargs):
        received.append(params)
        return await add_request(prompt, params, request_id, **kwargs)

    monkeypatch.setattr(chat_engine, "add_request", spy)
    app = make_app(chat_engine)
    async with app.run_test(size=(100, 30)) as pilot:
        for command in (
            "/set temperature 0.5",
            "/set top_p 0.8",
            "/set top_k 20",
            "/set max_tokens 4",
            "/set seed 1234",
            "/set repetition_penalty 1.1",
        ):
            await send(pilot, command)
        await send(pilot, "Hi there")
        await reply_done(pilot)
    params = received[-1]
    assert (
        params.temperature,
        params.top_p,
        params.top_k,
        params.max_tokens,
        params.seed,
        params.repetition_penalty,
    ) == (0.5, 0.8, 20, 4, 1234, 1.1)
    assert app.chat.session.conversation.messages[-1].meta["completion_tokens"] <= 4


async def test_a_conversation_survives_a_restart(chat_engine, data_dir):
    store = ConversationStore(default_db_path())
    app = make_app(chat_engine, store)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "/system You are terse.")
        await send(pilot, "/set temperature 0.25")
        await send(pilot, "Name a color.")
        await reply_done(pilot)
        saved = app.chat.session.conversation
    store.close()
    assert (data_dir / "conversations.sqlite3").exists()

    store = ConversationStore(default_db_path())
    app = ChatApp(RecordingBackend(chat_engine), store, resume=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_done(pilot)
        loaded = app.chat.session.conversation
        assert loaded.id == saved.id and loaded.title == saved.title == "Name a color."
        assert loaded.messages == saved.messages
        assert loaded.system_prompt == "You are terse." and loaded.settings["temperature"] == 0.25
        assert [w.position for w in app.query(UserMessage)] == [0]
        assert app.query_one(AssistantMessage).markdown.source == saved.messages[1].content
    store.close()
