"""What the MCP chat tests share: the servers file of tests/tui/mcp_server.py, the tools built
from it, a backend whose replies call tools, and waits on the chat's tool calls."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

from localchat.client import ToolCallDelta
from localchat.tui.backends import ChatRequest, ReplyDelta
from localchat.tui.mcp_config import parse_mcp_config
from localchat.tui.mcp_tools import McpTools
from localchat.tui.tool_views import ToolApprovalScreen, ToolCallView

from .conftest import send, wait_until
from .fakes import FakeBackend

SERVER = Path(__file__).with_name("mcp_server.py")
STDIO = {"command": sys.executable, "args": [str(SERVER)]}


def mcp_tools(timeout: float = 120.0, **servers: dict) -> McpTools:
    """The test server as the stdio server "calc" (and `servers`), its calls stopped after
    `timeout` seconds."""
    config = {"mcpServers": {"calc": STDIO, **servers}}
    return McpTools(parse_mcp_config(config, "test"), timeout=timeout)


def forced(name: str) -> dict:
    """tool_choice naming `name`: the grammar makes even the tiny model call it, well formed."""
    return {"type": "function", "function": {"name": name}}


async def ask(pilot, text: str, tool: str | None = None) -> None:
    """Send `text` (the model's first reply forced to call `tool`, if given) and wait until its
    reply has started (a turn whose tool runs without asking may be over by then)."""
    chat = pilot.app.chat
    if tool is not None:
        chat.session.tool_choice = forced(tool)
    before = chat.reply_worker
    await send(pilot, text)
    await wait_until(pilot, lambda: chat.reply_worker is not before, what="the reply to start")


async def tools_ready(pilot) -> None:
    await wait_until(pilot, pilot.app.chat.tools_ready.is_set, what="the MCP servers")


async def question(pilot, timeout: float = 180.0) -> ToolApprovalScreen:
    """The approval screen, once it asks (an error if the turn ends without asking)."""
    app = pilot.app
    await wait_until(
        pilot,
        lambda: isinstance(app.screen, ToolApprovalScreen) or not app.chat.generating,
        timeout,
        what="the question",
    )
    await pilot.pause()
    screen = app.screen
    messages = app.chat.session.conversation.messages
    assert isinstance(screen, ToolApprovalScreen), [(m.role, m.content, m.meta) for m in messages]
    return screen


def tool_views(app) -> list[ToolCallView]:
    return list(app.chat.query(ToolCallView))


def last_tool_result(app):
    """The latest `tool` message of the conversation."""
    return next(m for m in reversed(app.chat.session.conversation.messages) if m.role == "tool")


def roles(app) -> list[str]:
    return [m.role for m in app.chat.session.conversation.messages]


class ToolCallingBackend(FakeBackend):
    """The fake backend, calling the tool a request forces (tool_choice naming it) with
    `arguments[name]` (default {}); every other reply is scripted or an echo."""

    def __init__(self, arguments: dict[str, dict] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.arguments = arguments or {}
        self.calls = 0

    async def stream(self, request: ChatRequest) -> AsyncGenerator[ReplyDelta, None]:
        choice = request.tool_choice
        if not isinstance(choice, dict):
            async for delta in super().stream(request):
                yield delta
            return
        self.requests.append(request)
        name = choice["function"]["name"]
        self.calls += 1
        call = ToolCallDelta(
            0, f"call_{self.calls}", name, json.dumps(self.arguments.get(name, {}))
        )
        yield ReplyDelta(finish_reason="tool_calls", completion_tokens=9, tool_calls=[call])
