"""POST /v1/chat/completions: messages rendered with the chat template, answered whole or
streamed; reasoning and tool calls parsed out of the reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from litestar import Request, Response, post

from localchat.engine.outputs import CompletionOutput, RequestOutput
from localchat.harmony import harmony_stop_ids
from localchat.reasoning import HARMONY, new_splitter, reply_thinking
from localchat.server.chat_reply import ReplyParser, ReplyPiece
from localchat.server.logprobs import TokenStrings, chat_logprobs
from localchat.server.protocol import JSON_BODY, ChatCompletionRequest
from localchat.server.sampling import chat_sampling_params
from localchat.server.state import ServerState, require_api_key, server_for
from localchat.server.streaming import respond, start_generation
from localchat.server.structured import checked_grammar
from localchat.server.tools import plan_tools


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


def _parser_factory(
    server: ServerState, reasoning: str | None, tail: str, parse_tools: bool
) -> Callable[[], ReplyParser]:
    tools = server.tools if parse_tools else None

    def new_parser() -> ReplyParser:
        return ReplyParser(new_splitter(reasoning, tail) if reasoning else None, tools)

    return new_parser


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
    plan = plan_tools(data, server.tools, server.special_token_id)
    tool_grammar = (plan.grammar, str(data.tool_choice)) if plan.grammar else None
    prompt = server.render_chat(data, plan.template_tools)
    role = "assistant" if data.add_generation_prompt else data.messages[-1].role
    reasoning = server.reasoning if role == "assistant" else None
    tail = server.engine.detokenize(prompt[-8:], skip_special_tokens=False) if reasoning else ""
    defaults = server.engine.model_info.generation_defaults  # generation_config.json
    grammar, grammar_param = await checked_grammar(
        data, tool_grammar, reply_thinking(reasoning, tail), server.special_token_id
    ) or (None, None)
    params = chat_sampling_params(defaults.fill_request(data), grammar)
    if reasoning == HARMONY:  # the reply's structure is its special tokens
        params.skip_special_tokens = False
        params.stop_token_ids = harmony_stop_ids(
            params.stop_token_ids, server.special_token_id, server.engine.model_info.eos_token_ids
        )
    elif plan.parse and not server.tools.skip_special_tokens:
        params.skip_special_tokens = False  # the call marker is a special token
    generation = await start_generation(
        request, server, "chatcmpl", params, [prompt], grammar_param
    )
    dialect = ChatDialect(
        server.token_str,
        data.logprobs,
        role,
        _echo_text(data, role),
        _parser_factory(server, reasoning, tail, plan.parse),
        reasoning=reasoning is not None,
    )
    return await respond(
        request, generation, dialect, data, model=server.model_name, object_name="chat.completion"
    )
