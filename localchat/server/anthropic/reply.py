"""A reply in Anthropic's words: the message object (content blocks, stop_reason, usage), and the
server-sent events that stream it: message_start (once the first delta says how much of the prompt
was cached), ping, content_block_start / content_block_delta (text_delta, thinking_delta,
input_json_delta) / content_block_stop per block, message_delta (stop_reason, usage), message_stop;
an error mid-stream is an `error` event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from localchat.server.anthropic.errors import error_event
from localchat.server.generation import Generation
from localchat.server.reply_blocks import CALL, THINKING, Block, ReplyBlocks, reply_events

_encode = msgspec.json.Encoder().encode
_DELTAS = {THINKING: ("thinking_delta", "thinking"), CALL: ("input_json_delta", "partial_json")}


def content_block(block: Block, whole: bool = True) -> dict[str, Any]:
    """A block as Anthropic writes it: whole, or empty as a content_block_start announces it."""
    if block.kind == THINKING:
        return {"type": "thinking", "thinking": block.text if whole else "", "signature": ""}
    if block.kind == CALL:
        arguments = block.arguments() if whole else {}
        return {"type": "tool_use", "id": block.call_id, "name": block.name, "input": arguments}
    return {"type": "text", "text": block.text if whole else ""}


def stop_reason(
    reply: ReplyBlocks, stop_sequences: list[str] | None
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished reply."""
    if reply.finish_reason == "tool_calls":
        return "tool_use", None
    if reply.finish_reason == "length":
        return "max_tokens", None
    if isinstance(reply.stop_reason, str) and reply.stop_reason in (stop_sequences or []):
        return "stop_sequence", reply.stop_reason
    return ("end_turn" if reply.finish_reason is not None else None), None


def usage(generation: Generation) -> dict[str, int]:
    """Anthropic's usage: input_tokens are the prompt's tokens not read from the prefix cache
    (cache_read_input_tokens), as Anthropic counts them; no cache is written on request."""
    cached = sum(generation.cached_tokens)
    return {
        "input_tokens": generation.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": generation.completion_tokens,
    }


class MessageReply:
    """One reply of a Messages request, whole or as events."""

    def __init__(
        self, message_id: str, model: str, generation: Generation, reply: ReplyBlocks, stops
    ):
        self.id, self.model, self.generation, self.reply = message_id, model, generation, reply
        self.stop_sequences: list[str] | None = stops

    def message(self, content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        reason, sequence = stop_reason(self.reply, self.stop_sequences)
        if content is None:
            content = [content_block(block) for block in self.reply.blocks]
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(self.generation),
        }

    async def events(self) -> AsyncIterator[bytes]:
        """The event stream; a client that leaves cancels it, which aborts the generation."""
        started = False
        try:
            async for events in reply_events(self.generation, self.reply):
                parts = []
                if not started:
                    started = True
                    parts.append(_event("message_start", {"message": self.message([])}))
                    parts.append(_event("ping", {}))
                for event in events:
                    if event.kind == "start":
                        block = content_block(event.block, whole=False)
                        parts.append(
                            _event(
                                "content_block_start",
                                {"index": event.index, "content_block": block},
                            )
                        )
                    elif event.kind == "delta":
                        kind, key = _DELTAS.get(event.block.kind, ("text_delta", "text"))
                        delta = {"type": kind, key: event.text}
                        parts.append(
                            _event("content_block_delta", {"index": event.index, "delta": delta})
                        )
                    else:
                        parts.append(_event("content_block_stop", {"index": event.index}))
                if parts:
                    yield b"".join(parts)
            reason, sequence = stop_reason(self.reply, self.stop_sequences)
            yield _event(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(self.generation),
                },
            ) + _event("message_stop", {})
        except Exception as exc:
            yield _event("error", error_event(exc))
        finally:
            await self.generation.close()


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode({"type": name, **data}) + b"\n\n"
