"""Request body of OpenAI's Responses API as msgspec Structs: a malformed field fails decoding with
a 400 naming its path. `input` items are read one by one in `translate.py` (they have no common
shape to decode into: a message may come without its `type`). Unknown fields (include, user,
truncation, prompt_cache_key, service_tier, ...) are ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


class FunctionTool(msgspec.Struct, kw_only=True):
    """A tool of the request; only `type: "function"` is served."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """POST /v1/responses."""

    input: str | list[Any]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    background: bool = False
    # localchat's extension (vLLM's sampling field): generate max_output_tokens tokens, past the
    # end of sequence; benchmarks use it so every API does the same work
    ignore_eos: bool = False
