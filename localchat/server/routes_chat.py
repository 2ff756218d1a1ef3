"""POST /v1/chat/completions: messages rendered with the chat template, answered whole or
streamed."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, Response, post

from localchat.engine.outputs import CompletionOutput, RequestOutput
from localchat.server.logprobs import TokenStrings, chat_logprobs
from localchat.server.protocol import JSON_BODY, ChatCompletionRequest
from localchat.server.sampling import chat_sampling_params
from localchat.server.state import require_api_key, server_of
from localchat.server.streaming import respond, start_generation


class ChatDialect:
    """Chat's choice objects: `delta`/`message` with a role, logprobs as `{"content": [...]}`."""

    def __init__(self, token_str: TokenStrings, logprobs: bool, role: str, echo: str):
        self.token_str, self.logprobs, self.role, self.echo = token_str, logprobs, role, echo

    def _logprobs(self, entries) -> dict | None:
        return {"content": chat_logprobs(entries or [], self.token_str)} if self.logprobs else None

    def stream_choice(
        self, index: int, position: int, delta: RequestOutput, out: CompletionOutput, first: bool
    ) -> dict | None:
        text = self.echo + out.text if first else out.text
        if not (first or text or out.finish_reason or out.logprobs):
            return None
        message = {"role": self.role, "content": text} if first else {"content": text}
        return {
            "index": index,
            "delta": message,
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
        }

    def final_choice(
        self, index: int, position: int, output: RequestOutput, out: CompletionOutput
    ) -> dict:
        return {
            "index": index,
            "message": {"role": self.role, "content": self.echo + out.text},
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": out.finish_reason,
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
    server = server_of(request)
    server.check_model(data.model)
    params = chat_sampling_params(data)
    prompt = server.render_chat(
        data.messages,
        chat_template_kwargs=data.chat_template_kwargs,
        add_generation_prompt=data.add_generation_prompt,
        continue_final_message=data.continue_final_message,
        tools=data.tools,
    )
    role = "assistant" if data.add_generation_prompt else data.messages[-1].role
    generation = await start_generation(request, server, "chatcmpl", params, [prompt])
    dialect = ChatDialect(server.token_str, data.logprobs, role, _echo_text(data, role))
    return await respond(
        request, generation, dialect, data, model=server.model_name, object_name="chat.completion"
    )
