"""ChatSession: the conversation being chatted in, its persistence, and what each turn sends (no
UI)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from localchat.tui.attachments import Attachment, message_images, shown_text
from localchat.tui.backends import ChatBackend, ChatRequest
from localchat.tui.conversation import (
    DEFAULT_SETTINGS,
    Conversation,
    StoredMessage,
    title_from,
)
from localchat.tui.json_mode import JsonMode
from localchat.tui.store import ConversationStore

CONTEXT_WARNING = 0.8  # warn when the next turn would fill this much of the context


@dataclass
class TurnPlan:
    """The request for the next reply and what fitting it into the context took."""

    request: ChatRequest
    prompt_tokens: int | None
    dropped: int  # messages newly left out because they no longer fit
    context_used: float | None  # (prompt + room for the reply) / max_model_len


class ChatSession:
    """Holds the current conversation; every change is written to the store at once.

    The whole history goes into the chat template each turn; when it no longer fits in max_model_len
    (with room for max_tokens), the oldest turns are left out and `context_start` records where the
    part that is still sent begins.
    """

    def __init__(
        self,
        backend: ChatBackend,
        store: ConversationStore,
        conversation: Conversation | None = None,
    ):
        self.backend = backend
        self.store = store
        self.conversation = conversation or Conversation()
        self.context_start = 0
        self.prompt_tokens: int | None = None
        # the MCP tools the model may call (OpenAI-style `tools`; None: no --mcp), and the
        # tool_choice of the first reply to each message (the replies that follow tool results
        # are "auto": a forced call there would never end the turn). Only tests force a call, to
        # make the tiny default model's reply a well-formed one.
        self.tools: list[dict] | None = None
        self.tool_choice: str | dict = "auto"

    @property
    def json_mode(self) -> JsonMode | None:
        """/json: what the next replies must be (the conversation's, stored with it)."""
        return self.conversation.json_mode

    @json_mode.setter
    def json_mode(self, mode: JsonMode | None) -> None:
        self.conversation.json_mode = mode
        self.save_settings()

    # --- switching conversations ------------------------------------------------------------------
    def new_conversation(self) -> Conversation:
        """A fresh chat keeping the current system prompt and settings, not the /json mode (stored
        once it has a message)."""
        old = self.conversation
        return self._switch(
            Conversation(
                system_prompt=old.system_prompt, settings=dict(old.settings), think=old.think
            )
        )

    def open(self, conversation_id: int) -> Conversation | None:
        conversation = self.store.load(conversation_id)
        if conversation is not None:
            conversation.settings = {**DEFAULT_SETTINGS, **conversation.settings}
            self._switch(conversation)
        return conversation

    def _switch(self, conversation: Conversation) -> Conversation:
        self.conversation, self.context_start, self.prompt_tokens = conversation, 0, None
        return conversation

    # --- editing the history ----------------------------------------------------------------------
    def add_user(self, text: str, images: list[Attachment] | None = None) -> StoredMessage:
        """A user message, with the pictures `/image` attached to it."""
        conversation = self.conversation
        meta = {"images": [image.to_dict() for image in images]} if images else {}
        if not conversation.messages:
            conversation.title = title_from(text or shown_text("", meta))
        conversation.messages.append(StoredMessage("user", text, meta=meta))
        self.save_message(len(conversation.messages) - 1)
        return conversation.messages[-1]

    def add_tool_result(self, text: str, meta: dict) -> StoredMessage:
        """A `tool` message: what a call came to, as the model reads it (`meta`: its
        tool_call_id, the tool's name and arguments, the server, the status)."""
        self.conversation.messages.append(StoredMessage("tool", text, meta=meta))
        self.save_message(len(self.conversation.messages) - 1)
        return self.conversation.messages[-1]

    def add_reply(self, message: StoredMessage) -> int:
        self.conversation.messages.append(message)
        return len(self.conversation.messages) - 1

    def save_message(self, position: int) -> None:
        self.store.save_message(self.conversation, position)

    def remove_from(self, position: int) -> None:
        del self.conversation.messages[position:]
        self.store.truncate(self.conversation, position)
        self.context_start = min(self.context_start, position)

    def drop_last_reply(self) -> bool:
        """Remove the last reply, with the tool calls and results that led to it (to regenerate
        it); True when the history now ends with a user message."""
        messages = self.conversation.messages
        users = self.conversation.user_indices()
        if users and users[-1] < len(messages) - 1:
            self.remove_from(users[-1] + 1)
        return bool(messages) and messages[-1].role == "user"

    def clear(self) -> None:
        self.remove_from(0)

    def branch(self, position: int, text: str) -> Conversation:
        """Edit-and-resend: a new conversation with the history before `position` and `text` as the
        next user message; the original conversation stays as it was."""
        old = self.conversation
        new = Conversation(
            title=f"{old.title} (edit)",
            messages=copy.deepcopy(old.messages[:position]),
            system_prompt=old.system_prompt,
            settings=dict(old.settings),
            think=old.think,
            json_mode=old.json_mode,
        )
        self._switch(new)
        self.store.save_conversation(new)
        for index in range(len(new.messages)):
            self.save_message(index)
        self.add_user(text, message_images(old.messages[position].meta))  # its pictures kept
        return new

    def save_settings(self) -> None:
        if self.conversation.id is not None:
            self.store.save_conversation(self.conversation)

    def rename(self, title: str) -> None:
        self.conversation.title = title
        self.save_settings()

    # --- the next turn ----------------------------------------------------------------------------
    def request(
        self, start: int | None = None, end: int | None = None, *, follow_up: bool = False
    ) -> ChatRequest:
        """The history messages[start:end] (start: where the part that still fits begins) as a
        request; `follow_up`: the reply after tool results."""
        conversation = self.conversation
        start = self.context_start if start is None else start
        choice = None if follow_up or self.tool_choice == "auto" else self.tool_choice
        return ChatRequest(
            conversation.template_messages(start, end),
            dict(conversation.settings),
            conversation.chat_template_kwargs(),
            self.json_mode,
            self.tools or None,
            choice if self.tools else None,
        )

    async def plan_turn(self, *, follow_up: bool = False) -> TurnPlan:
        """The request for a reply to the history, leaving out the oldest turns that no longer
        fit (`follow_up`: the reply to tool results)."""
        limit = self.backend.max_model_len
        max_tokens = self.conversation.settings.get("max_tokens")
        start = self.context_start
        while True:
            request = self.request(start, follow_up=follow_up)
            prompt_tokens = await self.backend.count_prompt_tokens(request)
            if prompt_tokens is None or limit is None:
                break
            reserve = max_tokens or min(256, limit // 4)
            if prompt_tokens + reserve <= limit:
                break
            later = [i for i in self.conversation.user_indices() if i > start]
            if not later:  # only the newest message is left: let the reply take what room remains
                if max_tokens and prompt_tokens < limit:
                    request.sampling["max_tokens"] = min(max_tokens, limit - prompt_tokens)
                break
            start = later[0]
        dropped, self.context_start, self.prompt_tokens = (
            start - self.context_start,
            start,
            prompt_tokens,
        )
        used = None
        if prompt_tokens is not None and limit:
            used = min(1.0, (prompt_tokens + (max_tokens or 0)) / limit)
        return TurnPlan(request, prompt_tokens, dropped, used)


def reply_meta_text(meta: dict) -> str:
    """One line under a reply: the model that wrote it, prompt tokens (cached vs new), output
    tokens, speed, first-token time."""
    parts = [meta["model"]] if meta.get("model") else []
    prompt, cached = meta.get("prompt_tokens"), meta.get("cached_tokens")
    if prompt is not None:
        parts.append(
            f"prompt {prompt} tok ({cached} cached, {prompt - cached} new)"
            if cached is not None
            else f"prompt {prompt} tok"
        )
    if meta.get("completion_tokens"):
        parts.append(f"{meta['completion_tokens']} tok")
    if meta.get("tokens_per_s"):
        parts.append(f"{meta['tokens_per_s']:.1f} tok/s")
    if meta.get("ttft") is not None:
        parts.append(f"TTFT {meta['ttft']:.2f} s")
    if meta.get("finish_reason") == "length":
        parts.append("cut at max_tokens")
    return " · ".join(parts)
