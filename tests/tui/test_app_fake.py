"""The chat app on a deterministic fake backend: keys, slash commands, context fitting, thinking,
errors, persistence of the conversation list, export."""

from __future__ import annotations

import asyncio
import json

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.conversation import Conversation
from localchat.tui.messages import AssistantMessage, Notice, UserMessage
from localchat.tui.screens import HelpScreen, InputScreen, SettingsScreen, TextScreen
from localchat.tui.status_bar import ChatState, StatusBar
from localchat.tui.store import ConversationStore
from localchat.tui.widgets import ChatItem, ChatList, PromptBox

from .conftest import reply_done, send, wait_until
from .fakes import FakeBackend


def make_app(backend=None, store=None, **kwargs) -> ChatApp:
    return ChatApp(backend or FakeBackend(), store or ConversationStore(None), **kwargs)


async def test_enter_sends_and_the_reply_streams_in():
    backend = FakeBackend(["one two three four"], hold=asyncio.Event())
    app = make_app(backend)
    async with app.run_test() as pilot:
        await send(pilot, "hello")
        await wait_until(pilot, lambda: app.query(AssistantMessage), what="the reply view")
        assert app.chat.generating and app.chat.state is ChatState.GENERATING
        # while the reply streams the prompt's cursor holds still: each blink is a frame drawn on
        # the engine's cores
        assert not app.query_one(PromptBox).cursor_blink
        backend.hold.set()
        await reply_done(pilot)
        assert app.query_one(PromptBox).cursor_blink
        messages = app.chat.session.conversation.messages
        assert [(m.role, m.content) for m in messages] == [
            ("user", "hello"),
            ("assistant", "one two three four"),
        ]
        assert app.query_one(AssistantMessage).markdown.source == "one two three four"
        assert app.query_one(PromptBox).text == ""
        assert "idle" in str(app.query_one(StatusBar).render())


async def test_prompt_box_keys_newline_and_history():
    app = make_app()
    async with app.run_test() as pilot:
        prompt = app.query_one(PromptBox)
        await pilot.press(*"ab", "shift+enter", "c", "ctrl+j", "d")
        assert prompt.text == "ab\nc\nd"
        assert not app.chat.session.conversation.messages
        await pilot.press("enter")
        await reply_done(pilot)
        await send(pilot, "second")
        await reply_done(pilot)
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "ab\nc\nd"
        await pilot.press("down", "down", "down")
        assert prompt.text == ""


async def test_escape_stops_the_reply_and_keeps_the_partial_text():
    backend = FakeBackend(["alpha beta gamma delta"], stall_after=2)
    app = make_app(backend)
    async with app.run_test() as pilot:
        await send(pilot, "go")
        await wait_until(
            pilot,
            lambda: "beta" in app.chat.session.conversation.messages[-1].content,
            what="two words",
        )
        await pilot.press("escape")
        await reply_done(pilot)
        reply = app.chat.session.conversation.messages[-1]
        assert (
            reply.stopped
            and reply.content.startswith("alpha beta")
            and reply.content != "alpha beta gamma delta"
        )
        assert backend.running == 0
        view = app.query_one(AssistantMessage)
        assert view.has_class("stopped") and "stopped" in str(view.meta.render())


async def test_slash_commands_change_settings_system_prompt_and_thinking():
    backend = FakeBackend()
    app = make_app(backend)
    async with app.run_test() as pilot:
        for command in (
            "/set temperature 0.3",
            "/set top_p 0.5",
            "/set top_k 7",
            "/set max_tokens 9",
            "/set seed 11",
            "/set repetition_penalty 1.2",
            "/system Be brief.",
            "/think off",
        ):
            await send(pilot, command)
        await send(pilot, "/set temperature hot")  # refused with a message, nothing changes
        await send(pilot, "/nonsense")
        await send(pilot, "hi")
        await reply_done(pilot)
        request = backend.requests[-1]
        assert request.sampling == {
            "temperature": 0.3,
            "top_p": 0.5,
            "top_k": 7,
            "max_tokens": 9,
            "seed": 11,
            "repetition_penalty": 1.2,
        }
        assert request.messages[0] == {"role": "system", "content": "Be brief."}
        assert request.chat_template_kwargs == {"enable_thinking": False}
        await send(pilot, "//literal slash")
        await reply_done(pilot)
        assert backend.requests[-1].messages[-1]["content"] == "/literal slash"


async def test_help_settings_and_prompt_screens():
    app = make_app()
    async with app.run_test() as pilot:
        await reply_done(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await send(pilot, "/show")
        assert isinstance(app.screen, TextScreen) and "temperature" in app.screen.text
        await pilot.press("escape")
        await send(pilot, "/prompt")
        assert isinstance(app.screen, TextScreen) and app.screen.text.endswith("<assistant>")
        await pilot.press("escape")
        await pilot.press("f2")
        assert isinstance(app.screen, SettingsScreen)
        app.screen.query_one("#setting-temperature").value = "0.25"
        await pilot.press("ctrl+s")
        assert not isinstance(app.screen, SettingsScreen)
        assert app.chat.session.conversation.settings["temperature"] == 0.25


async def test_regenerate_and_edit_resend_branch():
    backend = FakeBackend(["first answer", "second answer", "edited answer"])
    store = ConversationStore(None)
    app = make_app(backend, store)
    async with app.run_test() as pilot:
        await send(pilot, "question")
        await reply_done(pilot)
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        original = app.chat.session.conversation
        assert [m.content for m in original.messages] == ["question", "second answer"]
        assert len(app.query(AssistantMessage)) == 1
        await send(pilot, "/edit 1")
        assert isinstance(app.screen, InputScreen)
        app.screen.query_one("#input-text").load_text("better question")
        await pilot.press("ctrl+s")
        await reply_done(pilot)
        branch = app.chat.session.conversation
        assert branch.id != original.id
        assert [m.content for m in branch.messages] == ["better question", "edited answer"]
        assert [m.content for m in store.load(original.id).messages] == [
            "question",
            "second answer",
        ]
        assert len(store.list_conversations()) == 2


async def test_old_turns_are_dropped_with_a_notice_when_the_context_is_full():
    backend = FakeBackend(["x " * 20] * 4, max_model_len=120)
    app = make_app(
        backend,
        conversation=Conversation(
            settings={
                "temperature": 0,
                "top_p": 1.0,
                "top_k": 0,
                "max_tokens": 30,
                "seed": None,
                "repetition_penalty": 1.0,
            }
        ),
    )
    async with app.run_test() as pilot:
        for i in range(4):
            await send(pilot, f"message number {i} " + "words " * 20)
            await reply_done(pilot)
        notices = [str(n.render()) for n in app.query(Notice)]
        assert any("no longer fit" in n for n in notices)
        sent = backend.requests[-1].messages
        assert sent[0]["content"].startswith("message number") and not sent[0][
            "content"
        ].startswith("message number 0")
        assert sent[-1]["content"].startswith("message number 3")
        assert len(app.query(UserMessage)) == 4  # nothing disappears from the view


async def test_thinking_is_a_collapsed_block_and_not_part_of_the_answer():
    backend = FakeBackend(["<think>Let me see. Two and two.</think> It is 4."])
    app = make_app(backend)
    async with app.run_test() as pilot:
        await send(pilot, "2+2?")
        await reply_done(pilot)
        reply = app.chat.session.conversation.messages[-1]
        assert reply.content == "It is 4." and reply.thinking.strip() == "Let me see. Two and two."
        view = app.query_one(AssistantMessage)
        assert view.thinking_block.display and view.thinking_block.collapsed


async def test_backend_errors_become_messages_not_crashes():
    app = make_app(FakeBackend(fail="the engine exploded"))
    async with app.run_test() as pilot:
        await send(pilot, "hi")
        await reply_done(pilot)
        errors = [str(n.render()) for n in app.query(Notice) if n.has_class("error")]
        assert errors and "the engine exploded" in errors[0]
        assert app.is_running and app.chat.state is ChatState.IDLE


async def test_load_failure_is_shown_in_the_conversation():
    class Broken(FakeBackend):
        async def start(self, on_progress=None):
            raise RuntimeError("no such model")

    app = make_app(Broken())
    async with app.run_test() as pilot:
        await wait_until(pilot, app.chat.ready.is_set)
        await pilot.pause()
        assert app.chat.state is ChatState.ERROR
        assert any("no such model" in str(n.render()) for n in app.query(Notice))
        await send(pilot, "hello?")
        await reply_done(pilot)
        assert app.is_running


async def test_conversation_list_rename_switch_and_delete():
    store = ConversationStore(None)
    app = make_app(FakeBackend(), store)
    async with app.run_test() as pilot:
        await send(pilot, "first chat")
        await reply_done(pilot)
        first = app.chat.session.conversation.id
        await pilot.press("ctrl+n")
        await send(pilot, "second chat")
        await reply_done(pilot)
        await send(pilot, "/rename Renamed")
        assert store.load(app.chat.session.conversation.id).title == "Renamed"
        await pilot.press("ctrl+b")
        chats = app.query_one(ChatList)
        assert chats.display and len(chats.children) == 2 and app.focused is chats
        await pilot.press("down", "enter")  # the list is newest first
        await pilot.pause()
        assert app.focused is app.query_one(PromptBox)
        assert app.chat.session.conversation.messages[0].content == "first chat"
        await send(pilot, "/delete")
        assert store.load(first) is None and len(store.list_conversations()) == 1


async def test_copy_and_export(tmp_path):
    app = make_app(FakeBackend(["the answer"]))
    async with app.run_test() as pilot:
        await send(pilot, "question")
        await reply_done(pilot)
        await pilot.press("f5")
        assert app.clipboard == "the answer"
        await send(pilot, f"/save {tmp_path / 'out'}")
        data = json.loads((tmp_path / "out.json").read_text())
        assert [m["content"] for m in data["messages"]] == ["question", "the answer"]
        assert "the answer" in (tmp_path / "out.md").read_text()


async def test_command_palette_runs_chat_actions():
    app = make_app(FakeBackend(["the answer"]))
    async with app.run_test() as pilot:
        await send(pilot, "question")
        await reply_done(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"New chat")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat.session.conversation.messages == []
        assert app.query("#welcome")


async def test_quitting_mid_reply_keeps_the_partial_reply(data_dir):
    store = ConversationStore(data_dir / "c.sqlite3")
    backend = FakeBackend(["never finished story"], stall_after=1)
    app = make_app(backend, store)
    async with app.run_test() as pilot:
        await send(pilot, "tell me")
        await wait_until(
            pilot, lambda: app.chat.session.conversation.messages[-1].content, what="a word"
        )
        await pilot.press("ctrl+q")
    conversation = store.load(store.last_id())
    assert [m.role for m in conversation.messages] == ["user", "assistant"]
    assert conversation.messages[1].stopped and conversation.messages[1].content == "never "
    assert backend.closed and backend.running == 0


async def test_the_status_bar_warns_before_the_context_is_full():
    backend = FakeBackend(["ok"], max_model_len=100)
    app = make_app(backend)
    async with app.run_test() as pilot:
        app.chat.session.conversation.settings["max_tokens"] = 20
        await send(pilot, "word " * 60)
        await reply_done(pilot)
        bar = app.query_one(StatusBar)
        assert bar.info.context_warning and "nearly full" in str(bar.render())


async def test_the_view_follows_the_reply_until_the_user_scrolls_up():
    long_reply = " ".join(f"line{i}\n\n" for i in range(40))
    hold = asyncio.Event()
    backend = FakeBackend([long_reply, long_reply])
    app = make_app(backend)
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.chat.messages_view
        await send(pilot, "first")
        await reply_done(pilot)
        assert view.max_scroll_y > 0 and view.scroll_y == view.max_scroll_y
        backend.hold = hold
        await send(pilot, "second")
        hold.set()
        await wait_until(
            pilot, lambda: len(app.chat.session.conversation.messages[-1].content) > 60, what="text"
        )
        hold.clear()
        await pilot.pause(0.3)
        assert view.scroll_y == view.max_scroll_y  # pinned while streaming
        view.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        hold.set()
        await reply_done(pilot)
        await pilot.pause()
        assert view.scroll_y < view.max_scroll_y  # the user scrolled up: left there


async def test_loading_shows_progress_and_messages_typed_meanwhile_wait_for_the_model():
    loaded = asyncio.Event()

    class Slow(FakeBackend):
        async def start(self, on_progress=None):
            on_progress("reading weights")
            await loaded.wait()

    app = make_app(Slow(["ready now"]))
    async with app.run_test() as pilot:
        await pilot.pause(0.3)
        panel = app.query_one("#loading")
        assert (
            "reading weights" in str(panel.label.render()) and app.chat.state is ChatState.LOADING
        )
        await send(pilot, "early message")
        assert "waiting for the model" in str(app.query_one(AssistantMessage).meta.render())
        loaded.set()
        await reply_done(pilot)
        assert not app.query("#loading")
        assert app.chat.session.conversation.messages[-1].content == "ready now"


@pytest.mark.parametrize(("size", "expected"), [((100, 50), 16), ((80, 18), 8)])
async def test_a_streaming_reply_reserves_half_the_view_within_bounds(size, expected):
    """The tail of a streaming reply grows by half the conversation's height at a time (8 to 16
    lines): each growth is a layout of the whole screen."""
    words = " ".join(f"word{i}" for i in range(400))
    app = make_app(FakeBackend([words], delay=0.005))
    async with app.run_test(size=size) as pilot:
        await send(pilot, "write")
        await wait_until(pilot, lambda: app.query(AssistantMessage), what="the reply view")
        tail = app.query_one(AssistantMessage).tail
        await wait_until(pilot, lambda: tail.styles.min_height is not None, what="a reserve")
        assert tail.reserve_lines() == expected
        assert tail.styles.min_height.value >= expected
        await reply_done(pilot)
        assert tail.styles.min_height is None  # given back once the reply is complete


async def test_a_reply_leaves_the_footer_alone_and_says_esc_stops():
    """The footer is not recomposed for a reply (a layout each time, and Textual keeps every
    replaced footer key alive); the streaming reply's own line says Esc stops it, and Esc does."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    app = make_app(FakeBackend([" ".join(f"word{i}" for i in range(200))], stall_after=50))
    async with app.run_test(size=(100, 30)) as pilot:
        footer = app.screen.query_one(Footer)
        await wait_until(pilot, lambda: footer.query(FooterKey), what="the footer's keys")
        await pilot.pause(0.2)
        keys = list(footer.query(FooterKey))
        assert "stop" not in {key.action for key in keys}
        await send(pilot, "write")
        await wait_until(pilot, lambda: app.query(AssistantMessage), what="the reply view")
        view = app.query_one(AssistantMessage)
        await wait_until(pilot, lambda: "Esc stops" in str(view.meta.render()), what="the hint")
        assert list(footer.query(FooterKey)) == keys
        await pilot.press("escape")
        await reply_done(pilot)
        assert app.chat.session.conversation.messages[-1].stopped
        assert list(footer.query(FooterKey)) == keys


async def test_the_chat_list_keeps_its_items_and_follows_the_store():
    """New chats, renames, switches and deletes update the list in place: the items already shown
    stay the same widgets, in the store's order, with its titles."""
    store = ConversationStore(None)
    app = make_app(FakeBackend(), store)
    async with app.run_test() as pilot:
        chats = app.query_one(ChatList)

        def shown() -> list[tuple[str | None, str]]:
            return [(item.id, item.title) for item in chats.query_children(ChatItem)]

        def stored() -> list[tuple[str, str]]:
            return [(f"chat-{cid}", title) for cid, title in store.list_conversations()]

        await send(pilot, "first chat")
        await reply_done(pilot)
        first = list(chats.query_children(ChatItem))
        await pilot.press("ctrl+n")
        await send(pilot, "second chat")
        await reply_done(pilot)
        assert shown() == stored() and len(stored()) == 2
        assert first[0] in list(chats.query_children(ChatItem))  # kept, not rebuilt
        await send(pilot, "/rename Renamed")
        await pilot.pause()
        assert shown() == stored() and ("Renamed" in {title for _, title in shown()})
        kept = list(chats.query_children(ChatItem))
        await pilot.press("ctrl+b", "down", "enter")  # open the first chat again
        await pilot.pause()
        assert list(chats.query_children(ChatItem)) == kept
        await send(pilot, "/delete")
        await pilot.pause()
        assert shown() == stored() and len(stored()) == 1
