"""Tool calls on the in-process engine, done as `serve` does them: the request's messages in the
shape chat templates read, its tools and tool_choice planned by the server's own code (what the
template sees, whether the reply is parsed, the grammar of a forced call), and the parsed calls
handed to the chat as the HTTP client hands a server's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from localchat.client import ToolCallDelta
from localchat.server import chat_reply
from localchat.server.protocol import ChatCompletionRequest, ChatMessage
from localchat.server.tool_parsers import ToolParser
from localchat.server.tools import ToolPlan, plan_tools, template_messages
from localchat.tui.backends import ChatRequest

NO_TOOLS = ToolPlan(None, False, None)


def wire_to_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages as chat templates read them (a call's arguments as an object)."""
    return template_messages([msgspec.convert(m, ChatMessage) for m in messages])


def tool_plan(
    request: ChatRequest, parser: ToolParser, token_id: Callable[[str], int | None]
) -> ToolPlan:
    """The request's tools planned as serve plans a chat completion's (one call at a time)."""
    if not request.tools:
        return NO_TOOLS
    data = ChatCompletionRequest(
        messages=[],
        tools=request.tools,
        tool_choice=request.tool_choice,
        parallel_tool_calls=False,
    )
    return plan_tools(data, parser, token_id)


def client_deltas(pieces: list[chat_reply.ToolCallDelta]) -> list[ToolCallDelta]:
    """The server's pieces of streamed calls as the client's (what ReplyDelta carries)."""
    return [ToolCallDelta(p.index, p.id, p.name, p.arguments) for p in pieces]
