"""A reply in the Responses API's words: the response object (output items: reasoning, message with
output_text, function_call; status completed, or incomplete when max_output_tokens cut it; usage
with cached and reasoning tokens), and the events that stream it, each with its sequence_number:
response.created, response.in_progress, then per item output_item.added, content_part.added,
output_text.delta / reasoning_text.delta / function_call_arguments.delta and their .done,
content_part.done, output_item.done, and last response.completed or response.incomplete (an error
mid-stream: `error`, then response.failed)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from localchat.server.errors import error_from_exception
from localchat.server.generation import Generation
from localchat.server.reply_blocks import CALL, THINKING, Block, BlockEvent, ReplyBlocks
from localchat.server.reply_blocks import reply_events as block_events
from localchat.server.responses.protocol import ResponsesRequest
from localchat.server.responses.translate import new_item_id

_encode = msgspec.json.Encoder().encode
_KINDS = {THINKING: "reasoning", CALL: "function_call"}
_DELTAS = {
    THINKING: "response.reasoning_text.delta",
    CALL: "response.function_call_arguments.delta",
}


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def echo_fields(data: ResponsesRequest) -> dict[str, Any]:
    """What a response object repeats of its request."""
    text = msgspec.to_builtins(data.text) if data.text is not None else {}
    reasoning = msgspec.to_builtins(data.reasoning) if data.reasoning is not None else {}
    return {
        "instructions": data.instructions,
        "max_output_tokens": data.max_output_tokens,
        "metadata": data.metadata or {},
        "parallel_tool_calls": data.parallel_tool_calls,
        "previous_response_id": data.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": data.store,
        "temperature": data.temperature,
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": data.tool_choice or "auto",
        "tools": [msgspec.to_builtins(tool) for tool in data.tools or []],
        "top_p": data.top_p,
        "truncation": "disabled",
        "background": False,
    }


def _part(block: Block, text: str) -> dict[str, Any]:
    if block.kind == THINKING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_item(block: Block, item_id: str, status: str, whole: bool = True) -> dict[str, Any]:
    """A block as an output item: whole, or empty as output_item.added announces it."""
    text = block.text if whole else ""
    kind = _KINDS.get(block.kind, "message")
    item: dict[str, Any] = {"type": kind, "id": item_id, "status": status}
    if block.kind == CALL:
        item.update(call_id=block.call_id, name=block.name, arguments=text)
    elif block.kind == THINKING:
        item.update(summary=[], content=[_part(block, text)] if whole else [])
    else:
        item.update(role="assistant", content=[_part(block, text)] if whole else [])
    return item


class ResponseReply:
    """One response: its object at any point, and its event stream. `on_done` gets the finished
    response object before its last event goes out (to store it)."""

    def __init__(
        self,
        response_id: str,
        model: str,
        fields: dict[str, Any],
        generation: Generation,
        reply: ReplyBlocks,
        on_done: Callable[[dict[str, Any]], Awaitable[None]],
    ):
        self.id, self.model, self.fields = response_id, model, fields
        self.generation, self.reply, self.on_done = generation, reply, on_done
        self.created_at = int(time.time())
        self.item_ids: dict[int, str] = {}
        self.sequence = 0

    def _item_id(self, index: int) -> str:
        if index not in self.item_ids:
            kind = _KINDS.get(self.reply.blocks[index].kind, "message")
            self.item_ids[index] = new_item_id(kind)
        return self.item_ids[index]

    def _status(self, index: int) -> str:
        cut = self.reply.finish_reason == "length" and index == len(self.reply.blocks) - 1
        return "incomplete" if cut else "completed"

    def output(self) -> list[dict[str, Any]]:
        return [
            output_item(block, self._item_id(index), self._status(index))
            for index, block in enumerate(self.reply.blocks)
        ]

    def usage(self) -> dict[str, Any]:
        generation = self.generation
        return {
            "input_tokens": generation.prompt_tokens,
            "input_tokens_details": {"cached_tokens": sum(generation.cached_tokens)},
            "output_tokens": generation.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reply.reasoning_tokens},
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        }

    def response(self, status: str | None = None) -> dict[str, Any]:
        """The response object; finished unless `status` says otherwise (in_progress, failed)."""
        cut = self.reply.finish_reason == "length"
        finished = status is None
        status = status or ("incomplete" if cut else "completed")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if finished and cut else None,
            "model": self.model,
            "output": self.output() if finished else [],
            "usage": self.usage() if finished else None,
            **self.fields,
        }

    async def finish(self) -> dict[str, Any]:
        response = self.response()
        await self.on_done(response)
        return response

    def _event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(body) + b"\n\n"

    def _block_event(self, event: BlockEvent) -> list[bytes]:
        index, block = event.index, event.block
        item_id = self._item_id(index)
        where = {"item_id": item_id, "output_index": index}
        if event.kind == "start":
            item = output_item(block, item_id, "in_progress", whole=False)
            events = [self._event("response.output_item.added", output_index=index, item=item)]
            if block.kind != CALL:
                part = _part(block, "")
                events.append(
                    self._event("response.content_part.added", **where, content_index=0, part=part)
                )
            return events
        if event.kind == "delta":
            if block.kind == CALL:
                return [self._event(_DELTAS[CALL], **where, delta=event.text)]
            if block.kind == THINKING:
                return [self._event(_DELTAS[THINKING], **where, content_index=0, delta=event.text)]
            return [
                self._event(
                    "response.output_text.delta",
                    **where,
                    content_index=0,
                    delta=event.text,
                    logprobs=[],
                )
            ]
        events = []
        if block.kind == CALL:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=block.name,
                    arguments=block.text,
                )
            )
        else:
            done = (
                "response.reasoning_text.done"
                if block.kind == THINKING
                else "response.output_text.done"
            )
            extra: dict[str, Any] = {} if block.kind == THINKING else {"logprobs": []}
            events.append(self._event(done, **where, content_index=0, text=block.text, **extra))
            part = _part(block, block.text)
            events.append(
                self._event("response.content_part.done", **where, content_index=0, part=part)
            )
        item = output_item(block, item_id, self._status(index))
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    async def events(self) -> AsyncIterator[bytes]:
        """The event stream; a client that leaves cancels it, which aborts the generation."""
        try:
            start = self.response("in_progress")
            yield self._event("response.created", response=start) + self._event(
                "response.in_progress", response=start
            )
            async for events in block_events(self.generation, self.reply):
                parts = [data for event in events for data in self._block_event(event)]
                if parts:
                    yield b"".join(parts)
            response = await self.finish()
            yield self._event(f"response.{response['status']}", response=response)
        except Exception as exc:
            body, _ = error_from_exception(exc)
            error = body["error"]
            code = str(error["type"])
            yield self._event(
                "error", code=code, message=error["message"], param=error["param"]
            ) + self._event(
                "response.failed",
                response={
                    **self.response("failed"),
                    "error": {"code": code, "message": error["message"]},
                },
            )
        finally:
            await self.generation.close()
