"""Pictures of the main screen, the help screen and a conversation with a code block, on the fake
backend.

Update them after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

from localchat.tui.app import ChatApp
from localchat.tui.store import ConversationStore
from localchat.tui.widgets import PromptBox

from .conftest import reply_done, send, wait_until
from .fakes import CODE_REPLY, FakeBackend

SIZE = (100, 30)


def make_app(replies=()) -> ChatApp:
    return ChatApp(FakeBackend(list(replies)), ConversationStore(None))


async def loaded(pilot) -> None:
    await wait_until(
        pilot,
        lambda: pilot.app.chat.ready.is_set() and not pilot.app.query("#loading"),
        what="loading",
    )
    await pilot.pause()


async def steady_cursor(pilot) -> None:
    """The prompt's cursor stops blinking (shown): a picture must not depend on its timing."""
    for box in pilot.app.query(PromptBox):
        box.cursor_blink = False
    await pilot.pause()


def test_main_screen(snap_compare):
    async def main(pilot):
        await loaded(pilot)
        await steady_cursor(pilot)

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=main)


def test_help_screen(snap_compare):
    async def open_help(pilot):
        await loaded(pilot)
        await steady_cursor(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=open_help)


def test_conversation_with_code_block(snap_compare):
    async def chat(pilot):
        await loaded(pilot)
        await send(pilot, "How do I add two numbers in Python?")
        await reply_done(pilot)
        await pilot.wait_for_scheduled_animations()  # the view scrolls to the reply's end
        await steady_cursor(pilot)

    assert snap_compare(make_app([CODE_REPLY]), terminal_size=SIZE, run_before=chat)


def test_tool_call_waiting_for_approval(snap_compare):
    """A reply that calls an MCP tool (the test server's `add`): the call in the conversation,
    and the question over it."""
    from .mcp_helpers import ToolCallingBackend, ask, mcp_tools, question, tools_ready

    backend = ToolCallingBackend({"add": {"a": 2, "b": 3}})
    app = ChatApp(backend, ConversationStore(None), tools=mcp_tools())

    async def call(pilot):
        await loaded(pilot)
        await tools_ready(pilot)
        await ask(pilot, "What is 2 + 3?", "add")
        await question(pilot)
        pilot.app.clear_notifications()  # "4 MCP tools ready": a toast would come and go
        await wait_until(
            pilot,
            lambda: not any(s.query("Toast") for s in pilot.app.screen_stack),
            what="the toasts to go",
        )
        await steady_cursor(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=call)
