"""A small scripting client for a `localchat serve` server (or any OpenAI-compatible one), on httpx.

>>> with Client("http://127.0.0.1:8000") as client:   # or .../v1, or .../v1/chat/completions
...     print(client.chat([{"role": "user", "content": "Hi!"}], max_tokens=32).text)
...     for delta in client.chat([{"role": "user", "content": "Hi!"}], stream=True):
...         print(delta.text, end="")
...     reply = client.chat(messages, tools=[...], tool_choice="required")  # reply.tool_calls
...     whole = collect(client.chat(messages, stream=True, tools=[...]))   # the same, streamed

AsyncClient has the same methods: `await client.chat(...)`, and
`async for delta in client.chat(..., stream=True)`. A failed request raises APIError carrying the
HTTP status and the server's message (APIConnectionError when the server cannot be reached). The
TUI's remote backend and `localchat bench --url` are built on AsyncClient, so this module is the one
place that derives the API root, builds the Bearer header and reads OpenAI error bodies.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from localchat import envs
from localchat.sse import sse_chunk

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
_ENDPOINT_SUFFIXES = ("/chat/completions", "/completions")


def api_base(url: str) -> str:
    """The /v1 root of a server given as host:port, http://host:port, .../v1, or one of its
    completion endpoints (.../v1/chat/completions, .../v1/completions), as people paste them."""
    base = url.strip().rstrip("/")
    if "://" not in base:
        base = "http://" + base
    for suffix in _ENDPOINT_SUFFIXES:
        if base.endswith(suffix):
            base = base.removesuffix(suffix).rstrip("/")
            break
    return base if base.endswith("/v1") else base + "/v1"


def auth_headers(api_key: str | None) -> dict:
    """The Bearer header for `api_key`; None falls back to $LOCALCHAT_API_KEY, "" sends none."""
    api_key = api_key if api_key is not None else envs.API_KEY.get()
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class APIError(Exception):
    """An HTTP error from the server: `status`, `message`, and the OpenAI error `type` and
    `param`."""

    def __init__(
        self, status: int, message: str, error_type: str | None = None, param: str | None = None
    ):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.type, self.param = status, message, error_type, param

    def describe(self) -> str:
        """One line for a person: who answered what."""
        return f"the server answered {self.status}: {self.message}"


class APIConnectionError(APIError):
    """The server could not be reached, or the connection broke (status 0)."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(0, f"cannot reach {url}: {cause or type(cause).__name__}")

    def describe(self) -> str:
        return self.message


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def from_dict(cls, usage: dict) -> Usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return cls(
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
            usage.get("total_tokens", 0),
            cached,
        )


@dataclass
class ToolCall:
    """A function call in an answer (chat with `tools=`): `arguments` is its JSON text, as the API
    carries it."""

    id: str
    name: str
    arguments: str
    type: str = "function"

    def parsed_arguments(self) -> Any:
        return json.loads(self.arguments)

    @classmethod
    def from_dict(cls, call: dict) -> ToolCall:
        function = call.get("function") or {}
        return cls(
            call.get("id") or "",
            function.get("name") or "",
            function.get("arguments") or "",
            call.get("type") or "function",
        )


@dataclass
class ToolCallDelta:
    """A piece of a streamed call: the first of a call has its `id` and `name`, the rest fragments
    of its `arguments`; `index` tells the calls of one choice apart."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    @classmethod
    def from_dict(cls, piece: dict) -> ToolCallDelta:
        function = piece.get("function") or {}
        return cls(
            piece.get("index", 0),
            piece.get("id"),
            function.get("name"),
            function.get("arguments") or "",
        )


@dataclass
class Completion:
    """A whole answer: `text` of the first choice, `texts` of all (n > 1), and the usage; with
    `tools=`, the first choice's `tool_calls` (`tool_calls_per_choice` of all); `reasoning` is
    the thinking a server with a reasoning parser sends apart."""

    texts: list[str]
    finish_reasons: list[str | None]
    usage: Usage
    raw: dict = field(repr=False)
    tool_calls_per_choice: list[list[ToolCall]] = field(default_factory=list)
    reasonings: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""

    @property
    def finish_reason(self) -> str | None:
        return self.finish_reasons[0] if self.finish_reasons else None

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tool_calls_per_choice[0] if self.tool_calls_per_choice else []

    @property
    def reasoning(self) -> str:
        return self.reasonings[0] if self.reasonings else ""


@dataclass
class Delta:
    """A piece of a streamed answer; the last one of a stream has empty text and the `usage`.
    `reasoning` is what servers with a reasoning parser send apart (`reasoning_content` or
    `reasoning`); `tool_calls` are pieces of the calls (see `collect`)."""

    text: str
    index: int = 0
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


class StreamAssembler:
    """Folds the deltas of a stream into the Completion the same request would have returned whole
    (texts, reasoning, tool calls with their arguments joined, finish reasons, usage)."""

    def __init__(self) -> None:
        self._texts: dict[int, list[str]] = {}
        self._reasoning: dict[int, list[str]] = {}
        self._reasons: dict[int, str | None] = {}
        self._calls: dict[int, dict[int, ToolCall]] = {}
        self._usage = Usage()

    def add(self, delta: Delta) -> None:
        if delta.usage is not None:
            self._usage = delta.usage
            return
        index = delta.index
        self._texts.setdefault(index, []).append(delta.text)
        self._reasoning.setdefault(index, []).append(delta.reasoning)
        if delta.finish_reason is not None or index not in self._reasons:
            self._reasons[index] = delta.finish_reason
        calls = self._calls.setdefault(index, {})
        for piece in delta.tool_calls:
            call = calls.setdefault(piece.index, ToolCall("", "", ""))
            call.id = call.id or piece.id or ""
            call.name += piece.name or ""
            call.arguments += piece.arguments

    def completion(self) -> Completion:
        order = sorted(self._texts)
        return Completion(
            ["".join(self._texts[i]) for i in order],
            [self._reasons.get(i) for i in order],
            self._usage,
            {},
            [[c for _, c in sorted(self._calls.get(i, {}).items())] for i in order],
            ["".join(self._reasoning[i]) for i in order],
        )


def collect(deltas: Iterable[Delta]) -> Completion:
    """The Completion of a whole stream (`client.chat(..., stream=True)`)."""
    assembler = StreamAssembler()
    for delta in deltas:
        assembler.add(delta)
    return assembler.completion()


async def acollect(deltas: AsyncIterable[Delta]) -> Completion:
    """The Completion of a whole AsyncClient stream."""
    assembler = StreamAssembler()
    async for delta in deltas:
        assembler.add(delta)
    return assembler.completion()


# --- what both clients share: request bodies and response parsing ---------------------------------
def _payload(key: str, value, stream: bool, model: str | None, params: dict) -> dict:
    body = {key: value, **params, "stream": stream}
    if model is not None:
        body.setdefault("model", model)
    if stream:
        body.setdefault("stream_options", {"include_usage": True})
    return body


def _completion(body: dict) -> Completion:
    choices = sorted(body.get("choices", []), key=lambda c: c.get("index", 0))
    messages = [c.get("message") or {} for c in choices]
    texts = [
        m.get("content") or "" if "message" in c else c.get("text", "")
        for c, m in zip(choices, messages, strict=True)
    ]
    return Completion(
        texts,
        [c.get("finish_reason") for c in choices],
        Usage.from_dict(body.get("usage") or {}),
        body,
        [[ToolCall.from_dict(call) for call in m.get("tool_calls") or []] for m in messages],
        [m.get("reasoning_content") or m.get("reasoning") or "" for m in messages],
    )


def _deltas(line: str) -> list[Delta] | None:
    """The deltas of one SSE line; None at the end of the stream."""
    chunk = sse_chunk(line)
    if chunk is None:
        return []
    if isinstance(chunk, str):  # DONE: sse_chunk's JSON chunks are objects
        return None
    return _chunk_deltas(chunk)


def _chunk_deltas(chunk: dict) -> list[Delta]:
    """The deltas of one streamed chunk (an error chunk raises its APIError)."""
    if "error" in chunk:
        error = chunk["error"]
        raise APIError(
            error.get("code") or 500,
            error.get("message", "stream failed"),
            error.get("type"),
            error.get("param"),
        )
    deltas = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if delta is None:  # /v1/completions
            deltas.append(
                Delta(choice.get("text") or "", choice.get("index", 0), choice.get("finish_reason"))
            )
            continue
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        deltas.append(
            Delta(
                delta.get("content") or "",
                choice.get("index", 0),
                choice.get("finish_reason"),
                reasoning=reasoning,
                tool_calls=[ToolCallDelta.from_dict(p) for p in delta.get("tool_calls") or []],
            )
        )
    if chunk.get("usage"):
        deltas.append(Delta("", usage=Usage.from_dict(chunk["usage"])))
    return deltas


def _error(response: httpx.Response) -> APIError:
    """The APIError of an error response: its OpenAI error body (`{"error": {...}}`), else its
    text."""
    try:
        error = response.json()["error"]
        if not isinstance(error, dict):
            return APIError(response.status_code, str(error))
        return APIError(
            response.status_code, error.get("message", ""), error.get("type"), error.get("param")
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return APIError(response.status_code, response.text[:300] or response.reason_phrase)


def _json(response: httpx.Response) -> dict:
    """The JSON body of a successful response; the APIError of a failed one."""
    if response.status_code >= 400:
        raise _error(response)
    return response.json()


class _Base:
    """What both clients hold: the API root, the model, the headers, an httpx client of their
    kind."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
    ):
        """`model=None` lets the server use the model it serves; `base_url` takes any form
        `api_base` accepts; `transport` (of the client's kind: sync or async) and `limits` go to
        httpx."""
        self.base_url = api_base(base_url)  # .../v1
        # /health, /tokenize and /detokenize live here
        self.root_url = self.base_url.removesuffix("/v1")
        self.model = model
        self.headers = auth_headers(api_key)
        options: dict = {"base_url": self.root_url, "headers": self.headers, "timeout": timeout}
        if transport is not None:
            options["transport"] = transport
        if limits is not None:
            options["limits"] = limits
        self._open(options)

    def _open(self, options: dict) -> None:
        """Create `self._http` from httpx client options."""
        raise NotImplementedError

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turns httpx's transport errors (refused, timed out, dropped) into APIConnectionError."""
        try:
            yield
        except httpx.RequestError as exc:
            raise APIConnectionError(self.root_url, exc) from None


class Client(_Base):
    """Blocking client."""

    def _open(self, options: dict) -> None:
        self._http = httpx.Client(**options)

    def chat(
        self, messages: list[dict], stream: bool = False, **params
    ) -> Completion | Iterator[Delta]:
        """POST /v1/chat/completions; params are the OpenAI/vLLM fields (max_tokens, temperature,
        ...)."""
        return self._generate(
            "/v1/chat/completions", _payload("messages", messages, stream, self.model, params)
        )

    def complete(
        self, prompt: str | list, stream: bool = False, **params
    ) -> Completion | Iterator[Delta]:
        """POST /v1/completions: continue `prompt` (text or token ids)."""
        return self._generate(
            "/v1/completions", _payload("prompt", prompt, stream, self.model, params)
        )

    def models(self) -> list[str]:
        return [card["id"] for card in self.model_cards()]

    def model_cards(self) -> list[dict]:
        """The /v1/models entries (id, max_model_len, ...)."""
        return self._call("GET", "/v1/models").get("data") or []

    def tokenize(
        self, prompt: str | None = None, *, messages: list[dict] | None = None, **params
    ) -> dict:
        """{'tokens', 'count', 'max_model_len'} of a text or of a conversation rendered by the chat
        template."""
        body = {"prompt": prompt} if messages is None else {"messages": messages}
        return self._call("POST", "/tokenize", json={**body, **params})

    def detokenize(self, tokens: list[int], **params) -> str:
        return self._call("POST", "/detokenize", json={"tokens": tokens, **params})["prompt"]

    def health(self) -> bool:
        """True when the server is up and its engine serves."""
        try:
            return self._http.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> dict:
        with self._reaching():
            return _json(self._http.request(method, path, **kwargs))

    def _generate(self, path: str, body: dict):
        return (
            self._stream(path, body)
            if body["stream"]
            else _completion(self._call("POST", path, json=body))
        )

    def _stream(self, path: str, body: dict) -> Iterator[Delta]:
        with self._reaching(), self._http.stream("POST", path, json=body) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            for line in response.iter_lines():
                deltas = _deltas(line)
                if deltas is None:
                    return
                yield from deltas


class AsyncClient(_Base):
    """The asyncio twin of Client: `await client.chat(...)`;
    `async for d in client.chat(..., stream=True)`. Leaving a stream early closes its HTTP response,
    which aborts the request on the server."""

    def _open(self, options: dict) -> None:
        self._http = httpx.AsyncClient(**options)

    def chat(self, messages: list[dict], stream: bool = False, **params):
        return self._generate(
            "/v1/chat/completions", _payload("messages", messages, stream, self.model, params)
        )

    def complete(self, prompt: str | list, stream: bool = False, **params):
        return self._generate(
            "/v1/completions", _payload("prompt", prompt, stream, self.model, params)
        )

    async def models(self) -> list[str]:
        return [card["id"] for card in await self.model_cards()]

    async def model_cards(self) -> list[dict]:
        return (await self._call("GET", "/v1/models")).get("data") or []

    async def tokenize(
        self, prompt: str | None = None, *, messages: list[dict] | None = None, **params
    ) -> dict:
        body = {"prompt": prompt} if messages is None else {"messages": messages}
        return await self._call("POST", "/tokenize", json={**body, **params})

    async def detokenize(self, tokens: list[int], **params) -> str:
        return (await self._call("POST", "/detokenize", json={"tokens": tokens, **params}))[
            "prompt"
        ]

    async def health(self) -> bool:
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, **kwargs) -> dict:
        with self._reaching():
            return _json(await self._http.request(method, path, **kwargs))

    def _generate(self, path: str, body: dict):
        return self._stream(path, body) if body["stream"] else self._complete(path, body)

    async def _complete(self, path: str, body: dict) -> Completion:
        return _completion(await self._call("POST", path, json=body))

    async def events(self, path: str, body: dict) -> AsyncGenerator[dict, None]:
        """The JSON data of each server-sent event of a streamed POST to `path` (e.g. Anthropic's
        /v1/messages or OpenAI's /v1/responses, whose streams end without a [DONE] marker)."""
        with self._reaching():
            async with self._http.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _error(response)
                async for line in response.aiter_lines():
                    chunk = sse_chunk(line)
                    if isinstance(chunk, dict):
                        yield chunk
                    elif chunk is not None:  # [DONE]
                        return

    async def _stream(self, path: str, body: dict) -> AsyncIterator[Delta]:
        # closed with this stream, so a reader that stops early hangs up at once (an abort)
        async with contextlib.aclosing(self.events(path, body)) as chunks:
            async for chunk in chunks:
                for delta in _chunk_deltas(chunk):
                    yield delta
