"""POST /v1/messages and POST /v1/messages/count_tokens, in a Router whose errors take Anthropic's
shape. The `anthropic-version` and `anthropic-beta` headers are accepted and change nothing."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Request, Response, Router, post

from localchat.server.anthropic.errors import handle_anthropic_exception, require_anthropic_key
from localchat.server.anthropic.protocol import MessagesInput, MessagesRequest
from localchat.server.anthropic.reply import MessageReply
from localchat.server.anthropic.translate import chat_request, fetch_images, field_names
from localchat.server.chat_run import render_prompt, start_chat
from localchat.server.generation import until_disconnect
from localchat.server.openapi_errors import AnthropicError, document_errors
from localchat.server.protocol import JSON_BODY, ChatCompletionRequest
from localchat.server.reply_blocks import ReplyBlocks, whole_reply
from localchat.server.state import ServerState, server_for
from localchat.server.streaming import sse_response


async def _chat_request(server: ServerState, data: MessagesInput) -> ChatCompletionRequest:
    """The chat completion of `data`, its image blocks' URL sources fetched (where the served model
    takes images: chat_request refuses image blocks otherwise)."""
    takes_images = server.engine.model_info.takes_images
    if takes_images:
        data = await fetch_images(data, server.media_domains)  # --allowed-media-domains
    return chat_request(data, takes_images)


@post("/v1/messages", status_code=200, summary="Create a message (Anthropic's Messages API)")
async def create_message(request: Request, data: Annotated[MessagesRequest, JSON_BODY]) -> Response:
    server = server_for(request, data.model)
    with field_names():
        chat = await _chat_request(server, data)
        message_id = f"msg_{uuid.uuid4().hex}"
        run = await start_chat(request, server, chat, message_id, max_tokens_ceiling=True)
    reply = MessageReply(
        message_id,
        server.model_name,
        run.generation,
        ReplyBlocks(run.new_parser()),
        data.stop_sequences,
    )
    if data.stream:
        return sse_response(reply.events(), run.generation)
    await until_disconnect(request.receive, whole_reply(run.generation, reply.reply))
    return Response(reply.message())


@post(
    "/v1/messages/count_tokens",
    status_code=200,
    summary="Count a message's input tokens (Anthropic's Messages API)",
)
async def count_tokens(request: Request, data: Annotated[MessagesInput, JSON_BODY]) -> dict:
    """The prompt's tokens: what a /v1/messages request of the same conversation reports as
    input_tokens + cache_read_input_tokens."""
    server = server_for(request, data.model)
    with field_names():
        chat = await _chat_request(server, data)
        prompt = render_prompt(server, chat)
    return {"input_tokens": len(prompt.tokens)}


document_errors([create_message, count_tokens], AnthropicError)
anthropic_router = Router(
    path="/",
    route_handlers=[create_message, count_tokens],
    guards=[require_anthropic_key],
    exception_handlers={Exception: handle_anthropic_exception},
)
