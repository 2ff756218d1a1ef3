"""The chat without a terminal (`echo "hi" | localchat chat`): stdin is one message, the reply
streams to stdout."""

from __future__ import annotations

import sys
from typing import TextIO

from localchat.tui.backends import ChatBackend, ReplyStats
from localchat.tui.conversation import (
    Conversation,
    StoredMessage,
    ToolCallFold,
    tool_call_line,
)
from localchat.tui.session import ChatSession
from localchat.tui.store import ConversationStore


async def run_pipe(
    backend: ChatBackend,
    store: ConversationStore,
    text: str,
    *,
    conversation: Conversation | None = None,
    resume: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> None:
    """Send `text` as the next user message and stream the answer (thinking goes to stderr, and the
    tool calls a server parsed out of it follow it, a line each). The turn is stored like a TUI
    turn, so `localchat chat --resume` continues it."""
    session = ChatSession(backend, store, conversation)
    try:
        await backend.start()
        if resume and (last := store.last_id()) is not None:
            session.open(last)
        session.add_user(text)
        plan = await session.plan_turn()
        if plan.dropped:
            err.write(
                f"[{plan.dropped} earlier message(s) no longer fit in the context "
                "and were left out]\n"
            )
        message, stats = (
            StoredMessage("assistant", "", meta={"model": backend.model_name}),
            ReplyStats(),
        )
        position = session.add_reply(message)
        calls = ToolCallFold(message)
        try:
            async for delta in backend.stream(plan.request):
                if delta.thinking:
                    err.write(delta.thinking)
                    err.flush()
                if delta.text:
                    out.write(delta.text)
                    out.flush()
                message.content += delta.text
                message.thinking += delta.thinking
                calls.add(delta.tool_calls)
                stats.apply(delta)
        except BaseException:
            message.stopped = True
            raise
        finally:
            message.meta.update(stats.as_meta())
            if message.content or message.thinking or message.tool_calls:
                session.save_message(position)
            else:
                session.remove_from(position)
        for call in message.tool_calls:
            out.write(f"\n{tool_call_line(call)}")
        out.write("\n")
        out.flush()
    finally:
        await backend.close()
