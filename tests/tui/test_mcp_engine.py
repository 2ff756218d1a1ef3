"""MCP tools in the chat on the real in-process engine (the default model), with the test server
tests/tui/mcp_server.py over stdio, driven through Pilot. A forced tool_choice (the session's test
hook, for the first reply to a message) makes the tiny model's call well formed; the reply to the
tool's result is the model's own."""

from __future__ import annotations

import json

import pytest

from localchat.tui.app import ChatApp
from localchat.tui.http_backend import OpenAIBackend
from localchat.tui.messages import AssistantMessage, Notice
from localchat.tui.screens import TextScreen
from localchat.tui.store import ConversationStore, default_db_path
from localchat.tui.tool_round import DECLINED, STOPPED
from localchat.tui.tool_views import ToolCallView
from tests.serve_process import serve_process

from .conftest import greedy_conversation, reply_done, send, wait_until
from .mcp_helpers import (
    ask,
    forced,
    last_tool_result,
    mcp_tools,
    question,
    roles,
    tool_views,
    tools_ready,
)
from .test_app_engine import RecordingBackend

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]
ASK = "What is 2 plus 3?"


def make_app(engine, tools, store=None, **kwargs) -> ChatApp:
    return ChatApp(
        RecordingBackend(engine),
        store or ConversationStore(None),
        conversation=greedy_conversation(max_tokens=40),
        tools=tools,
        **kwargs,
    )


def assert_answered(app) -> None:
    """The turn ended with the model's own words, after the tool's result."""
    last = app.chat.session.conversation.messages[-1]
    assert last.role == "assistant" and last.content.strip() and not last.tool_calls, last
    assert not last.meta.get("error")


async def test_an_approved_call_runs_and_its_result_goes_back_to_the_model(chat_engine, data_dir):
    store = ConversationStore(default_db_path())
    app = make_app(chat_engine, mcp_tools(), store)
    async with app.run_test(size=(110, 36)) as pilot:
        await tools_ready(pilot)
        await send(pilot, "/tools")
        assert isinstance(app.screen, TextScreen)
        listing = app.screen.text
        for line in ("calc  (stdio: ", "  ready", "  • add", "Add two integers.", "  • sleep"):
            assert line in listing, listing
        await pilot.press("escape")

        await ask(pilot, ASK, "add")
        screen = await question(pilot)
        # the call is shown and waits: nothing ran, no result yet
        assert roles(app) == ["user", "assistant"]
        (call,) = app.chat.session.conversation.messages[1].tool_calls
        arguments = json.loads(call["arguments"])
        assert call["name"] == "add" and set(arguments) == {"a", "b"}
        assert screen.name_ == "add" and json.loads(screen.arguments) == arguments
        (view,) = tool_views(app)
        assert view.state == "waiting" and "add(" in str(view.arguments.render())
        await pilot.press("y")
        await reply_done(pilot)

        assert roles(app) == ["user", "assistant", "tool", "assistant"]
        result = last_tool_result(app)
        assert result.content == str(arguments["a"] + arguments["b"])
        assert result.meta["tool_call_id"] == call["id"] and result.meta["status"] == "done"
        assert view.state == "done" and str(view.result_text.render()) == result.content
        assert_answered(app)
        # the second reply read the call and its result; only the first was forced
        first, second = app.backend.requests[-2:]
        assert first.tool_choice == forced("add") and second.tool_choice is None
        assert [t["function"]["name"] for t in second.tools] == ["add", "fail", "sleep", "crash"]
        assert second.messages[-2]["tool_calls"][0]["id"] == call["id"]
        assert second.messages[-1] == {
            "role": "tool",
            "content": result.content,
            "tool_call_id": call["id"],
        }
        saved = app.chat.session.conversation
    store.close()

    store = ConversationStore(default_db_path())  # --resume, and no --mcp this time
    app = ChatApp(RecordingBackend(chat_engine), store, resume=True)
    async with app.run_test(size=(110, 36)) as pilot:
        await reply_done(pilot)
        assert app.chat.session.conversation.messages == saved.messages
        (view,) = tool_views(app)
        assert view.state == "done" and str(view.result_text.render()) == result.content
        assert len(app.chat.query(AssistantMessage)) == 2
        await ask(pilot, "Thanks!")  # the history with the call goes to the template again
        await reply_done(pilot)
        assert_answered(app)
    store.close()


async def test_no_sends_a_refusal_and_always_stops_asking(chat_engine, monkeypatch):
    app = make_app(chat_engine, mcp_tools())
    async with app.run_test(size=(110, 36)) as pilot:
        await ask(pilot, ASK, "add")
        await question(pilot)
        await pilot.press("n")
        await reply_done(pilot)
        refused = last_tool_result(app)
        assert (refused.content, refused.meta["status"]) == (DECLINED, "declined")
        assert tool_views(app)[-1].state == "declined"
        assert_answered(app)

        await ask(pilot, "And 4 plus 4?", "add")
        await question(pilot)
        await pilot.press("a")
        await reply_done(pilot)
        assert last_tool_result(app).meta["status"] == "done"
        assert app.chat.tools.always == {"add"}

        asked = []
        monkeypatch.setattr(type(app.chat.tools), "call", _spy(asked, type(app.chat.tools).call))
        await ask(pilot, "And 5 plus 5?", "add")
        await reply_done(pilot)  # no question this time: it would wait forever
        assert len(asked) == 1, app.chat.session.conversation.messages[-3:]
        assert last_tool_result(app).meta["status"] == "done"
        assert_answered(app)
        await send(pilot, "/tools")
        assert "  • add  [always allowed]" in app.screen.text
        assert "  • fail\n" in app.screen.text


def _spy(calls: list, call):
    async def spy(self, name, arguments):
        calls.append(name)
        return await call(self, name, arguments)

    return spy


async def test_a_tool_error_and_a_timeout_are_shown_and_the_chat_goes_on(chat_engine):
    app = make_app(chat_engine, mcp_tools(timeout=2.0))
    async with app.run_test(size=(110, 36)) as pilot:
        for name, status, said, shown in [
            ("fail", "error", "the disk is on fire", "✗ failed"),
            ("sleep", "timeout", "gave no answer within 2 s", "✗ timed out"),
        ]:
            await ask(pilot, ASK, name)
            await question(pilot)
            await pilot.press("y")
            await reply_done(pilot)
            result = last_tool_result(app)
            assert result.meta["status"] == status and said in result.content, result
            view = tool_views(app)[-1]
            assert str(view.status.render()) == shown and said in str(view.result_text.render())
            assert view.result.title == "Error"
            assert_answered(app)
        assert app.is_running and not [n for n in app.chat.query(Notice) if n.has_class("error")]
        app.chat.session.tool_choice = "auto"
        await ask(pilot, "Say hi.")
        await reply_done(pilot)
        assert_answered(app)


async def test_escape_stops_the_question_and_a_running_call(chat_engine):
    app = make_app(chat_engine, mcp_tools())
    async with app.run_test(size=(110, 36)) as pilot:
        await ask(pilot, ASK, "add")
        await question(pilot)
        await pilot.press("escape")
        await reply_done(pilot)
        assert roles(app) == ["user", "assistant", "tool"]
        assert (last_tool_result(app).content, tool_views(app)[-1].state) == (STOPPED, "stopped")
        assert str(app.chat.query(Notice).last().render()) == "Stopped at the tool call."

        await ask(pilot, "Wait.", "sleep")
        await question(pilot)
        await pilot.press("y")
        view = tool_views(app)[-1]
        await wait_until(pilot, lambda: view.state == "running", what="the call to run")
        await pilot.press("escape")
        await reply_done(pilot)
        assert roles(app)[-2:] == ["assistant", "tool"]
        assert last_tool_result(app).meta["status"] == "stopped" and view.state == "stopped"

        await ask(pilot, "And now 1 plus 1?", "add")  # the chat and the server go on
        await question(pilot)
        await pilot.press("y")
        await reply_done(pilot)
        assert last_tool_result(app).meta["status"] == "done"
        assert_answered(app)
        assert isinstance(tool_views(app)[-1], ToolCallView)


@pytest.fixture(scope="module")
def server_url(default_gguf, tmp_path_factory):
    """A `localchat serve` process on the default model (its base URL, until the module ends)."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    args = ("--max-model-len", "2048", "--kv-cache-memory", "128MiB", "--threads", "1")
    with serve_process(log_path, *args, timeout=180) as server:
        yield server.base_url


async def test_an_approved_call_with_url(server_url):
    """The same turn through a real server (`--url`): it renders the tools, forces the call
    through its grammar and parses it; the chat runs it and sends the result back."""
    backend = OpenAIBackend(server_url)
    app = ChatApp(
        backend,
        ConversationStore(None),
        conversation=greedy_conversation(max_tokens=40),
        tools=mcp_tools(),
    )
    async with app.run_test(size=(110, 36)) as pilot:
        await reply_done(pilot)
        await tools_ready(pilot)
        await ask(pilot, ASK, "add")
        await question(pilot)
        (call,) = app.chat.session.conversation.messages[1].tool_calls
        forced_body = backend.last_body
        assert forced_body is not None and forced_body["tool_choice"] == forced("add")
        await pilot.press("y")
        await reply_done(pilot)
        assert roles(app) == ["user", "assistant", "tool", "assistant"]
        arguments = json.loads(call["arguments"])
        assert last_tool_result(app).content == str(arguments["a"] + arguments["b"])
        assert_answered(app)
        body = backend.last_body
        assert "tool_choice" not in body and len(body["tools"]) == 4
        assert body["messages"][-1] == {
            "role": "tool",
            "content": last_tool_result(app).content,
            "tool_call_id": call["id"],
        }
