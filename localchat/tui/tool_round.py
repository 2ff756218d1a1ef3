"""ToolRound: the MCP tool calls of one reply, each shown, asked about (yes / no / always for this
tool), run with the timeout of --mcp-timeout and answered with a `tool` message, which the next
reply reads."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Protocol

from localchat.tui.mcp_connection import ToolOutcome
from localchat.tui.mcp_tools import McpTools
from localchat.tui.tool_views import ToolApprovalScreen, ToolCallView

if TYPE_CHECKING:
    from textual.app import App

    from localchat.tui.messages import ConversationView
    from localchat.tui.session import ChatSession

DECLINED = "The user declined to run this tool call."
STOPPED = "The user stopped this tool call."


def parse_arguments(text: str) -> tuple[dict[str, Any] | None, str]:
    """A call's arguments as an object, or None and why they are not one."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        return None, f"its arguments are not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return None, f"its arguments are a JSON {type(value).__name__}, not an object"
    return value, ""


class ToolChat(Protocol):
    """What a tool round needs of the chat screen (chat_core.ChatCore): the app (for the approval
    screen), the conversation view (for each call's view) and the session (for the results)."""

    @property
    def app(self) -> App[Any]: ...

    @property
    def messages_view(self) -> ConversationView: ...

    @property
    def session(self) -> ChatSession: ...


class ToolRound:
    """Runs the calls of one reply in order. `run()` is True when every call has its result (the
    model is asked again), False when the user stopped at the question (Esc); a stop while a call
    runs (the reply's worker cancelled) ends the call as stopped and goes on as the cancel."""

    def __init__(self, chat: ToolChat, tools: McpTools):
        self.chat, self.tools = chat, tools

    async def run(self, calls: list[dict]) -> bool:
        for call in calls:
            view = ToolCallView(
                call.get("name") or "?", call.get("arguments") or "", self._server(call)
            )
            await self.chat.messages_view.add(view)
            try:
                outcome = await self._one(call, view)
            except asyncio.CancelledError:
                self._answer(call, view, ToolOutcome("stopped", STOPPED))
                raise
            self._answer(call, view, outcome or ToolOutcome("stopped", STOPPED))
            if outcome is None:
                return False
        return True

    def _server(self, call: dict) -> str | None:
        tool = self.tools.by_name.get(call.get("name") or "")
        return tool.server if tool is not None else None

    async def _one(self, call: dict, view: ToolCallView) -> ToolOutcome | None:
        """The outcome of one call (None: the user stopped)."""
        name = call.get("name") or ""
        tool = self.tools.by_name.get(name)
        if tool is None:
            offered = ", ".join(self.tools.by_name) or "none"
            return ToolOutcome("error", f"there is no tool {name!r} (the tools: {offered})")
        arguments, problem = parse_arguments(call.get("arguments") or "")
        if arguments is None:
            return ToolOutcome("error", f"the call was not run: {problem}")
        if name not in self.tools.always:
            view.set_state("waiting")
            answer = await self._ask(
                name, call.get("arguments") or "", tool.server, tool.description
            )
            if answer == "stop":
                return None
            if answer == "no":
                return ToolOutcome("declined", DECLINED)
            if answer == "always":
                self.tools.always.add(name)
        view.set_state("running")
        return await self.tools.call(name, arguments)

    async def _ask(self, name: str, arguments: str, server: str, description: str) -> str:
        """The user's answer from the approval screen ("stop" if the reply is stopped first)."""
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def done(answer: str | None) -> None:
            if not answered.done():
                answered.set_result(answer or "stop")

        screen = ToolApprovalScreen(name, arguments, server, description)
        app = self.chat.app
        app.push_screen(screen, done)
        try:
            return await answered
        finally:
            if app.screen is screen:  # the reply was stopped while the question was open
                app.pop_screen()

    def _answer(self, call: dict, view: ToolCallView, outcome: ToolOutcome) -> None:
        """Show the outcome and store it as the call's `tool` message."""
        view.show_result(outcome.text, outcome.status)
        self.chat.session.add_tool_result(
            outcome.text,
            {
                "tool_call_id": call.get("id") or "",
                "name": call.get("name") or "",
                "arguments": call.get("arguments") or "",
                "server": self._server(call),
                "status": outcome.status,
            },
        )
