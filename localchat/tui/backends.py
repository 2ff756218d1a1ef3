"""The small interface the chat UI drives: the in-process engine, an OpenAI-compatible server, or a
fake."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from localchat.errors import InvalidParameterError

if TYPE_CHECKING:
    from localchat.client import ToolCallDelta
    from localchat.tui.json_mode import JsonMode


@dataclass
class ChatRequest:
    """One turn: the messages (OpenAI's wire shape: an assistant's `tool_calls`, `tool` results
    with their `tool_call_id`), the sampling settings, the template kwargs, the JSON the reply must
    be (`/json`; None: free text), and the tools the model may call (OpenAI-style `tools`; None:
    none) with the `tool_choice` (None: auto)."""

    messages: list[dict]
    sampling: dict
    chat_template_kwargs: dict | None = None
    json_mode: JsonMode | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None


@dataclass
class ReplyDelta:
    """A piece of a streamed reply. `thinking` and `text` are new text only, `tool_calls` pieces of
    the calls a server parsed out of the reply; the counters and timings describe the reply so far
    (None where the backend cannot tell)."""

    text: str = ""
    thinking: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None
    tokens_per_s: float | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ReplyStats:
    """What is known about one reply so far, folded from its deltas in one place (None: not known
    yet). Backends report counters and timings of the reply so far, so a later delta's known values
    win and a None never overwrites a value (a server reports prompt tokens only in its last, usage
    chunk)."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int = 0
    ttft: float | None = None
    tokens_per_s: float | None = None
    finish_reason: str | None = None

    def apply(self, delta: ReplyDelta) -> None:
        self.completion_tokens = delta.completion_tokens
        for name in ("prompt_tokens", "cached_tokens", "ttft", "tokens_per_s", "finish_reason"):
            value = getattr(delta, name)
            if value is not None:
                setattr(self, name, value)

    @property
    def context_tokens(self) -> int | None:
        """Tokens the conversation takes once this reply is in it (None while the prompt size is
        unknown)."""
        return None if self.prompt_tokens is None else self.prompt_tokens + self.completion_tokens

    def as_meta(self) -> dict:
        """The known figures, as a stored message keeps them (`StoredMessage.meta`)."""
        return {name: value for name, value in asdict(self).items() if value is not None}


@dataclass
class BackendStats:
    """Engine facts for the status bar."""

    kv_cache_usage: float
    prefix_cache_hits: int
    num_running: int
    num_waiting: int
    # speculative decoding, where it is on: drafted tokens and those the model kept
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class ChatBackend:
    """What the chat needs from a model server. Subclasses set `model_name` and `max_model_len`
    (None when unknown) once `start()` returns; `stream()` is an async generator, and closing it
    stops the reply."""

    model_name: str = "?"
    max_model_len: int | None = None
    description: str = ""

    async def start(self, on_progress: Callable[[str], None] | None = None) -> None:
        """Load or connect; may take seconds (report steps through on_progress); raises on
        failure."""

    async def count_prompt_tokens(self, request: ChatRequest) -> int | None:
        """Tokens the rendered prompt takes, or None when only the server knows."""
        return None

    async def render_prompt(self, request: ChatRequest) -> str:
        """The exact text the model would see for this request (as well as this backend can
        tell)."""
        raise NotImplementedError

    def stream(self, request: ChatRequest) -> AsyncGenerator[ReplyDelta, None]:
        raise NotImplementedError

    def stats(self) -> BackendStats | None:
        return None

    @property
    def takes_images(self) -> bool | None:
        """Whether the model reads images (`/image`); None while it is not known (a server says so
        when a message with a picture reaches it)."""
        return None

    def set_speculative(self, value: str) -> str:
        """`/set speculative ngram|suffix|off` (or a JSON config): what is now on; raises
        InvalidParameterError where it cannot be set."""
        raise InvalidParameterError(
            "speculative decoding is the server's to choose (localchat serve --speculative-config)",
            param="speculative",
        )

    def for_model(self, name: str) -> ChatBackend:
        """A backend of the same kind for the model `name` (not started); raises when `name`
        cannot be one."""
        raise InvalidParameterError("this chat cannot switch models", param="model")

    async def model_choices(self) -> list[tuple[str, str]]:
        """(name, description) of the models `for_model` can switch to."""
        return []

    async def close(self) -> None:
        """Release the engine or the connection."""


class ReplyTimer:
    """Time to first token and decode speed of one reply, measured on the monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.first_token_time: float | None = None
        self.tokens = 0

    def add(self, num_tokens: int) -> None:
        if num_tokens and self.first_token_time is None:
            self.first_token_time = self.clock()
        self.tokens += num_tokens

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.start

    @property
    def tokens_per_s(self) -> float | None:
        if self.first_token_time is None or self.tokens < 2:
            return None
        elapsed = self.clock() - self.first_token_time
        return (self.tokens - 1) / elapsed if elapsed > 0 else None
