"""POST /v1/chat/completions: messages rendered with the chat template, answered whole or
streamed; reasoning and tool calls parsed out of the reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from litestar import Request, Response, post

from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.server.chat_reply import ReplyParser, ReplyPiece
from localchat.server.chat_run import start_chat
from localchat.server.logprobs import TokenStrings, chat_logprobs
from localchat.server.protocol import JSON_BODY, ChatCompletionRequest
from localchat.server.state import require_api_key, server_for
from localchat.server.streaming import respond


class ChatDialect:
    """Chat's choice objects: `delta`/`message` with a role, logprobs as `{"content": [...]}`,
    reasoning and tool calls split from the content by one ReplyParser per choice."""

    def __init__(
        self,
        token_str: TokenStrings,
        logprobs: bool,
        role: str,
        echo: str,
        new_parser: Callable[[], ReplyParser],
        reasoning: bool,
    ):
        self.token_str, self.logprobs, self.role, self.echo = token_str, logprobs, role, echo
        self.new_parser, self.reasoning = new_parser, reasoning
        self.parsers: dict[int, ReplyParser] = {}

    def _logprobs(self, entries) -> dict | None:
        return {"content": chat_logprobs(entries or [], self.token_str)} if self.logprobs else None

    def _fields(self, piece: ReplyPiece, parser: ReplyParser, whole: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.reasoning and (piece.reasoning or whole):
            fields["reasoning_content"] = fields["reasoning"] = piece.reasoning or None
        if whole and parser.calls:
            fields["tool_calls"] = [call.to_dict() for call in parser.calls]
        elif not whole and piece.calls:
            fields["tool_calls"] = [delta.to_dict() for delta in piece.calls]
        return fields

    def stream_choice(
        self, index: int, position: int, delta: RequestOutput, out: CompletionOutput, first: bool
    ) -> dict | None:
        parser = self.parsers.setdefault(index, self.new_parser())
        piece = parser.feed(out.text, final=out.finish_reason is not None)
        text = self.echo + piece.content if first else piece.content
        fields = self._fields(piece, parser, whole=False)
        if not (first or text or fields or out.finish_reason or out.logprobs):
            return None
        message: dict[str, Any] = {"role": self.role} if first else {}
        if text or first or not fields:
            message["content"] = text
        message.update(fields)
        return {
            "index": index,
            "delta": message,
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": parser.finish_reason(out.finish_reason),
            "stop_reason": out.stop_reason,
        }

    def final_choice(
        self, index: int, position: int, output: RequestOutput, out: CompletionOutput
    ) -> dict:
        parser = self.new_parser()
        piece = parser.feed(out.text, final=True)
        content = self.echo + piece.content
        message: dict[str, Any] = {
            "role": self.role,
            "content": content if content or not parser.calls else None,
        }
        message.update(self._fields(piece, parser, whole=True))
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": parser.finish_reason(out.finish_reason),
            "stop_reason": out.stop_reason,
        }


def _echo_text(data: ChatCompletionRequest, role: str) -> str:
    """With `echo`, the last message's text is repeated in the reply when it has the reply's
    role."""
    last = data.messages[-1] if data.messages else None
    if not data.echo or last is None or last.role != role:
        return ""
    if isinstance(last.content, str):
        return last.content
    return "\n".join(part.text or "" for part in last.content or [])


@post(
    "/v1/chat/completions",
    status_code=200,
    guards=[require_api_key],
    summary="Create a chat completion",
)
async def create_chat_completion(
    request: Request, data: Annotated[ChatCompletionRequest, JSON_BODY]
) -> Response:
    server = server_for(request, data.model)
    run = await start_chat(request, server, data, server.new_id("chatcmpl"))
    dialect = ChatDialect(
        server.token_str,
        data.logprobs,
        run.role,
        _echo_text(data, run.role),
        run.new_parser,
        reasoning=run.reasoning is not None,
    )
    return await respond(
        request,
        run.generation,
        dialect,
        data,
        model=server.model_name,
        object_name="chat.completion",
    )
