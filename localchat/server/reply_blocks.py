"""A chat reply as a list of typed blocks (thinking, text, tool calls) in the order the model wrote
them, built as the reply streams: what Anthropic's content blocks and the Responses API's output
items are made of. Each delta of text goes through the reply's ReplyParser (reasoning and tool
calls split off) and comes out as block events: a block starts, grows, stops.

Text that is only whitespace is held until more text follows: the newline a model writes before a
tool call is no block of its own (a reply that is only whitespace is still its text)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from localchat.server.chat_reply import ReplyParser
from localchat.server.generation import Generation

THINKING, TEXT, CALL = "thinking", "text", "call"


@dataclass
class Block:
    kind: str  # THINKING, TEXT or CALL
    text: str = ""  # the thinking, the text, or a call's arguments (JSON text)
    name: str | None = None  # a call's function
    call_id: str | None = None

    def arguments(self) -> dict[str, Any]:
        """A call's arguments as an object ({} when the reply was cut before they were whole)."""
        try:
            value = json.loads(self.text)
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class BlockEvent:
    kind: Literal["start", "delta", "stop"]
    index: int  # the block's position in the reply
    block: Block
    text: str = ""  # a delta's text


@dataclass
class ReplyBlocks:
    """One reply's blocks, fed the reply's text deltas; after the last, `finish_reason` (stop,
    length, tool_calls or abort) and `stop_reason` (the stop string or token that ended it)."""

    parser: ReplyParser
    blocks: list[Block] = field(default_factory=list)
    reasoning_tokens: int = 0  # the tokens of the deltas that carried only reasoning
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    _open: int | None = None  # the block that grows
    _calls: dict[int, int] = field(default_factory=dict)  # a call's index → its block
    _space: str = ""  # whitespace-only text held back
    _uncounted: int = 0  # tokens of deltas that showed nothing yet

    def feed(
        self,
        text: str,
        tokens: int = 0,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
    ) -> list[BlockEvent]:
        """The events of one delta (`tokens`: how many tokens it carried); the reply's last delta
        has its `finish_reason`."""
        final = finish_reason is not None
        piece = self.parser.feed(text, final=final)
        events: list[BlockEvent] = []
        if piece.reasoning:
            self._grow(THINKING, piece.reasoning, events)
        if piece.content:
            self._text(piece.content, events)
        for delta in piece.calls:
            if delta.id is not None:
                self._close(events)
                self._calls[delta.index] = self._start(
                    Block(CALL, name=delta.name, call_id=delta.id), events
                )
            if delta.arguments:
                self._append(self._calls[delta.index], delta.arguments, events)
        self._count(tokens, piece.reasoning, bool(piece.content or piece.calls))
        if final:
            if self._space and not self.blocks:
                self._grow(TEXT, self._space, events)
            self._space = ""
            self._close(events)
            self.finish_reason = self.parser.finish_reason(finish_reason)
            self.stop_reason = stop_reason
        return events

    def _count(self, tokens: int, reasoning: str, answer: bool) -> None:
        self._uncounted += tokens
        if answer:
            self._uncounted = 0
        elif reasoning:
            self.reasoning_tokens += self._uncounted
            self._uncounted = 0

    def _text(self, text: str, events: list[BlockEvent]) -> None:
        if not (self._space + text).strip():
            self._space += text
            return
        text, self._space = self._space + text, ""
        self._grow(TEXT, text, events)

    def _grow(self, kind: str, text: str, events: list[BlockEvent]) -> None:
        """`text` added to the open block of `kind`, or to a new one."""
        if self._open is None or self.blocks[self._open].kind != kind:
            self._close(events)
            self._start(Block(kind), events)
        assert self._open is not None
        self._append(self._open, text, events)

    def _start(self, block: Block, events: list[BlockEvent]) -> int:
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        events.append(BlockEvent("start", self._open, block))
        return self._open

    def _append(self, index: int, text: str, events: list[BlockEvent]) -> None:
        self.blocks[index].text += text
        events.append(BlockEvent("delta", index, self.blocks[index], text))

    def _close(self, events: list[BlockEvent]) -> None:
        if self._open is not None:
            events.append(BlockEvent("stop", self._open, self.blocks[self._open]))
            self._open = None


async def reply_events(
    generation: Generation, reply: ReplyBlocks
) -> AsyncIterator[list[BlockEvent]]:
    """The block events of a one-sample generation, one list per engine delta (empty when a delta
    showed nothing yet); `generation` counts the tokens on the way."""
    async for _, delta in generation.deltas():
        for out in delta.outputs:
            yield reply.feed(out.text, len(out.token_ids), out.finish_reason, out.stop_reason)


async def whole_reply(generation: Generation, reply: ReplyBlocks) -> ReplyBlocks:
    """Run the generation to its end; `reply` holds its blocks."""
    async for _ in reply_events(generation, reply):
        pass
    return reply
