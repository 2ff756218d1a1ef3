"""The chat backend on any OpenAI-compatible server (localchat serve, vLLM, llama.cpp, ...) through
`localchat.client.AsyncClient`."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import httpx

from localchat.client import APIError, AsyncClient, Usage
from localchat.errors import LocalchatError
from localchat.tui.backends import ChatBackend, ChatRequest, ReplyDelta, ReplyTimer
from localchat.tui.thinking import ThinkSplitter

# servers without /tokenize (the OpenAI API itself, llama.cpp's server)
_NO_TOKENIZE = (404, 405, 501)
TIMEOUT = httpx.Timeout(30.0, read=None)  # a thinking model may be silent for minutes


class ServerError(LocalchatError):
    """The server could not be reached or answered with an error."""

    @classmethod
    def from_api(cls, error: APIError) -> ServerError:
        return cls(error.describe(), param=error.param)


def sampling_body(request: ChatRequest) -> dict:
    """The request's sampling settings, template kwargs, JSON mode and tools as chat-completions
    fields; vLLM's extensions (top_k, repetition_penalty, chat_template_kwargs) are sent only when
    they differ from the defaults."""
    sampling = request.sampling
    body = {"temperature": sampling.get("temperature", 1.0), "top_p": sampling.get("top_p", 1.0)}
    if sampling.get("max_tokens") is not None:
        body["max_tokens"] = sampling["max_tokens"]
    if sampling.get("seed") is not None:
        body["seed"] = sampling["seed"]
    if sampling.get("top_k", 0) not in (0, -1):
        body["top_k"] = sampling["top_k"]
    if sampling.get("repetition_penalty", 1.0) != 1.0:
        body["repetition_penalty"] = sampling["repetition_penalty"]
    if request.chat_template_kwargs:
        body["chat_template_kwargs"] = request.chat_template_kwargs
    if request.json_mode is not None:
        body["response_format"] = request.json_mode.response_format
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    return body


class OpenAIBackend(ChatBackend):
    """Stream chat completions from a server. `model=None` takes the first model the server lists.
    Closing the stream closes the HTTP response, which aborts the request on the server."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        model: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.client = AsyncClient(
            url, api_key=api_key, model=model, timeout=TIMEOUT, transport=transport
        )
        self._connection = (url, api_key, transport)
        self.model_name = model or "?"
        self.description = self.client.base_url
        self._has_tokenize = True
        self.last_body: dict | None = (
            None  # the latest chat request, as sent (shown by tests and /prompt)
        )

    async def start(self, on_progress: Callable[[str], None] | None = None) -> None:
        base = self.client.base_url
        if on_progress is not None:
            on_progress(f"connecting to {base}")
        try:
            cards = await self.client.model_cards()
        except APIError as exc:
            raise ServerError.from_api(exc) from None
        wanted = self.client.model
        card = next((c for c in cards if c.get("id") == wanted), None) if wanted else None
        if card is None and not wanted:
            if not cards:
                raise ServerError(f"{base} serves no model")
            card = cards[0]
        if card is not None:
            self.model_name = self.client.model = card["id"]
            self.max_model_len = card.get("max_model_len")

    async def _tokenize(self, request: ChatRequest) -> list[int] | None:
        """The prompt's token ids from the server's /tokenize (vLLM's and localchat's); None if it
        has none."""
        if not self._has_tokenize:
            return None
        extra: dict[str, Any] = {}
        if request.chat_template_kwargs:
            extra["chat_template_kwargs"] = request.chat_template_kwargs
        if request.tools:
            extra["tools"] = request.tools
        try:
            answer = await self.client.tokenize(
                messages=request.messages,
                model=self.model_name,
                add_generation_prompt=True,
                **extra,
            )
        except APIError as exc:
            self._has_tokenize = exc.status not in _NO_TOKENIZE
            return None
        return answer.get("tokens")

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        tokens = await self._tokenize(request)
        return None if tokens is None else len(tokens)

    async def render_prompt(self, request: ChatRequest) -> str:
        tokens = await self._tokenize(request)
        if tokens is not None:
            try:
                return await self.client.detokenize(tokens, model=self.model_name)
            except (APIError, KeyError):
                pass
        body = {"model": self.model_name, "messages": request.messages, **sampling_body(request)}
        return (
            "The server renders the chat template; these messages and settings are sent:\n\n"
            + json.dumps(body, indent=2, ensure_ascii=False)
        )

    async def stream(self, request: ChatRequest) -> AsyncGenerator[ReplyDelta, None]:
        params = sampling_body(request)
        self.last_body = {
            "model": self.model_name,
            "messages": request.messages,
            "stream": True,
            **params,
        }
        timer, splitter = ReplyTimer(), ThinkSplitter()
        deltas = self.client.chat(request.messages, stream=True, **params)
        try:
            async for delta in deltas:
                if delta.usage is not None:
                    yield self._usage_delta(delta.usage, timer)
                    continue
                thinking, text = splitter.feed(delta.text)
                if delta.finish_reason is not None:
                    rest = splitter.flush()
                    thinking, text = thinking + rest[0], text + rest[1]
                timer.add(1 if (delta.reasoning or delta.text or delta.tool_calls) else 0)
                yield ReplyDelta(
                    text,
                    delta.reasoning + thinking,
                    delta.finish_reason,
                    timer.tokens,
                    ttft=timer.ttft,
                    tokens_per_s=timer.tokens_per_s,
                    tool_calls=delta.tool_calls,
                )
        except APIError as exc:
            raise ServerError.from_api(exc) from None
        finally:
            await deltas.aclose()

    @staticmethod
    def _usage_delta(usage: Usage, timer: ReplyTimer) -> ReplyDelta:
        return ReplyDelta(
            completion_tokens=usage.completion_tokens or timer.tokens,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            ttft=timer.ttft,
            tokens_per_s=timer.tokens_per_s,
        )

    def for_model(self, name: str) -> OpenAIBackend:
        """The same server, asked for `name` (checked against its /v1/models by start())."""
        url, api_key, transport = self._connection
        return OpenAIBackend(url, api_key, name, transport)

    async def model_choices(self) -> list[tuple[str, str]]:
        try:
            cards = await self.client.model_cards()
        except (APIError, httpx.HTTPError):
            return []
        return [(c["id"], "loaded" if c.get("loaded") else "") for c in cards if c.get("id")]

    async def close(self) -> None:
        await self.client.aclose()
