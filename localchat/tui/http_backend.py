"""The chat backend on any OpenAI-compatible server (localchat serve, vLLM, llama.cpp, ...) through httpx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx

from localchat.errors import LocalchatError
from localchat.sse import aiter_chunks, error_message
from localchat.tui.backends import ChatBackend, ChatRequest, ReplyDelta, ReplyTimer
from localchat.tui.thinking import ThinkSplitter


class ServerError(LocalchatError):
    """The server could not be reached or answered with an error."""


def api_base(url: str) -> str:
    """The /v1 root of a server given as http://host:port, .../v1 or .../v1/chat/completions."""
    base = url.strip().rstrip("/")
    if "://" not in base:
        base = "http://" + base
    base = base.removesuffix("/chat/completions")
    return base if base.endswith("/v1") else base + "/v1"


def body_for(request: ChatRequest, model: str) -> dict:
    """The streaming chat-completions body; vLLM's extensions (top_k, repetition_penalty,
    chat_template_kwargs) are sent only when they differ from the defaults."""
    sampling = request.sampling
    body = {"model": model, "messages": request.messages, "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": sampling.get("temperature", 1.0), "top_p": sampling.get("top_p", 1.0)}
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
    return body


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"the server answered {response.status_code}: {message or response.text[:300] or response.reason_phrase}"


class OpenAIBackend(ChatBackend):
    """Stream chat completions from a server. `model=None` takes the first model the server lists.
    Closing the stream closes the HTTP response, which aborts the request on the server."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = api_base(url)
        self.model_name = model or "?"
        self._model = model
        self.description = self.base_url
        self.root_url = self.base_url.removesuffix("/v1")
        self._has_tokenize = True
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=transport,
                                        timeout=httpx.Timeout(30.0, read=None))
        self.last_body: dict | None = None
        self.last_usage: dict | None = None

    async def start(self, on_progress: Callable[[str], None] | None = None) -> None:
        if on_progress is not None:
            on_progress(f"connecting to {self.base_url}")
        try:
            response = await self.client.get("/models")
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach {self.base_url}: {exc}") from None
        if response.status_code != 200:
            raise ServerError(_error_message(response))
        cards = response.json().get("data") or []
        card = next((c for c in cards if c.get("id") == self._model), None) if self._model else None
        if card is None and not self._model:
            if not cards:
                raise ServerError(f"{self.base_url} serves no model")
            card = cards[0]
        if card is not None:
            self.model_name = card["id"]
            self.max_model_len = card.get("max_model_len")

    async def _tokenize(self, request: ChatRequest) -> list[int] | None:
        """The prompt's token ids from the server's /tokenize (vLLM's and localchat's); None if it has none."""
        if not self._has_tokenize:
            return None
        body = {"model": self.model_name, "messages": request.messages, "add_generation_prompt": True}
        if request.chat_template_kwargs:
            body["chat_template_kwargs"] = request.chat_template_kwargs
        try:
            response = await self.client.post(self.root_url + "/tokenize", json=body)
        except httpx.HTTPError:
            return None
        if response.status_code in (404, 405, 501):
            self._has_tokenize = False
        if response.status_code != 200:
            return None
        return response.json().get("tokens")

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        tokens = await self._tokenize(request)
        return None if tokens is None else len(tokens)

    async def render_prompt(self, request: ChatRequest) -> str:
        tokens = await self._tokenize(request)
        if tokens is not None:
            response = await self.client.post(self.root_url + "/detokenize",
                                              json={"model": self.model_name, "tokens": tokens})
            if response.status_code == 200 and "prompt" in response.json():
                return response.json()["prompt"]
        return ("The server renders the chat template; these messages and settings are sent:\n\n"
                + json.dumps(body_for(request, self.model_name), indent=2, ensure_ascii=False))

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplyDelta]:
        body = self.last_body = body_for(request, self.model_name)
        timer, splitter = ReplyTimer(), ThinkSplitter()
        usage: dict = {}
        try:
            async with self.client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise ServerError(_error_message(response))
                async for chunk in aiter_chunks(response):
                    if (message := error_message(chunk)) is not None:
                        raise ServerError(message)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
                        thinking, text = splitter.feed(delta.get("content") or "")
                        finish = choice.get("finish_reason")
                        if finish is not None:
                            rest = splitter.flush()
                            thinking, text = thinking + rest[0], text + rest[1]
                        timer.add(1 if (reasoning or delta.get("content")) else 0)
                        yield self._delta(text, reasoning + thinking, finish, timer, usage)
                if usage:
                    self.last_usage = usage
                    yield self._delta("", "", None, timer, usage)
        except httpx.HTTPError as exc:
            raise ServerError(f"the connection to {self.base_url} failed: {exc}") from None

    @staticmethod
    def _delta(text: str, thinking: str, finish: str | None, timer: ReplyTimer, usage: dict) -> ReplyDelta:
        details = usage.get("prompt_tokens_details") or {}
        tokens = usage.get("completion_tokens") or timer.tokens
        return ReplyDelta(text, thinking, finish, tokens, usage.get("prompt_tokens"), details.get("cached_tokens"),
                          timer.ttft, timer.tokens_per_s)

    async def close(self) -> None:
        await self.client.aclose()
