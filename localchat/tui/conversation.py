"""A conversation as data: its messages, system prompt and sampling settings, and its Markdown/JSON
export."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from localchat.client import Delta, StreamAssembler
from localchat.tui.attachments import shown_text, wire_content
from localchat.tui.json_mode import JsonMode

if TYPE_CHECKING:
    from localchat.client import ToolCallDelta

DEFAULT_SETTINGS: dict = {
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 0,
    "max_tokens": 1024,
    "seed": None,
    "repetition_penalty": 1.0,
}
SETTING_NAMES = tuple(DEFAULT_SETTINGS)


@dataclass
class StoredMessage:
    """One message of a conversation as the TUI keeps it (a row of the store's `messages` table),
    not the API's wire message (`server.protocol.ChatMessage`). Assistant messages keep their
    thinking apart from the answer, whether the user stopped them, and `meta`: prompt/cached/
    completion tokens, ttft, tokens_per_s, finish_reason, error, and the tool calls a server
    parsed out of the reply (`tool_calls`: [{id, name, arguments}]). A user message's `meta`
    keeps the pictures `/image` attached to it (`images`: tui/attachments.py)."""

    role: str
    content: str
    thinking: str = ""
    stopped: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def tool_calls(self) -> list[dict]:
        return self.meta.get("tool_calls") or []

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Conversation:
    """A chat: `id` is its SQLite row (None until first stored). `think` is the enable_thinking flag
    passed to the chat template (None: the template's default); `json_mode` what `/json` turned on
    for its replies (None: free text)."""

    id: int | None = None
    title: str = "New chat"
    messages: list[StoredMessage] = field(default_factory=list)
    system_prompt: str | None = None
    settings: dict = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    think: bool | None = None
    json_mode: JsonMode | None = None

    def template_messages(self, first: int = 0, end: int | None = None) -> list[dict]:
        """What goes into the chat template, in OpenAI's wire shape: the system prompt, then
        messages[first:end] (answers only, without their thinking); a reply's tool calls go with it
        where their results do (the calls of a reply that no tool answered stay out: an API would
        refuse them)."""
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages = self.messages[first:end]
        answered = {m.meta.get("tool_call_id") for m in messages if m.role == "tool"}
        return head + [_wire_message(m, answered) for m in messages]

    def chat_template_kwargs(self) -> dict | None:
        return None if self.think is None else {"enable_thinking": self.think}

    def user_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.role == "user"]

    def last_reply(self) -> StoredMessage | None:
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)

    def to_json(self) -> str:
        return json.dumps(
            {
                "title": self.title,
                "system_prompt": self.system_prompt,
                "settings": self.settings,
                "think": self.think,
                "json_mode": self.json_mode.to_dict() if self.json_mode else None,
                "messages": [m.to_dict() for m in self.messages],
            },
            indent=2,
            ensure_ascii=False,
        )

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        if self.system_prompt:
            lines += ["**System:**", "", self.system_prompt, ""]
        for message in self.messages:
            if message.role == "tool":
                meta = message.meta
                heading = f"## Tool result: {meta.get('name') or '?'} ({meta.get('status')})"
                lines += [heading, "", "```", message.content, "```", ""]
                continue
            lines += [f"## {'You' if message.role == 'user' else 'Assistant'}", ""]
            if message.thinking:
                lines += [
                    "<details><summary>Thinking</summary>",
                    "",
                    message.thinking.strip(),
                    "",
                    "</details>",
                    "",
                ]
            text = message.content
            if message.role == "user":
                text = shown_text(text, message.meta)
            lines += [text, ""]
            for call in message.tool_calls:
                lines += [f"**Tool call:** `{tool_call_text(call)}`", ""]
            if message.stopped:
                lines += ["*(stopped)*", ""]
        return "\n".join(lines)


def _wire_message(message: StoredMessage, answered: set) -> dict:
    content: str | list[dict] = message.content
    if message.role == "user":
        content = wire_content(message.content, message.meta)  # with its /image pictures
    wire: dict = {"role": message.role, "content": content}
    if message.role == "tool":
        wire["tool_call_id"] = message.meta.get("tool_call_id") or ""
    calls = [call for call in message.tool_calls if call.get("id") in answered]
    if calls:
        wire["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call.get("arguments") or "{}"},
            }
            for call in calls
        ]
    return wire


class ToolCallFold:
    """Joins the tool-call pieces of a streamed reply into its `meta["tool_calls"]`."""

    def __init__(self, message: StoredMessage):
        self.message = message
        self._assembler = StreamAssembler()

    def add(self, pieces: list[ToolCallDelta]) -> None:
        if not pieces:
            return
        self._assembler.add(Delta("", tool_calls=pieces))
        calls = self._assembler.completion().tool_calls
        self.message.meta["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
        ]


def tool_call_text(call: dict) -> str:
    """A tool call as one line: `name(arguments)`."""
    return f"{call.get('name') or '?'}({call.get('arguments') or ''})"


def tool_call_line(call: dict) -> str:
    """A tool call as the chat shows it."""
    return f"⚙ tool call  {tool_call_text(call)}"


def title_from(text: str, width: int = 40) -> str:
    """A conversation title from its first message: the first line, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"
