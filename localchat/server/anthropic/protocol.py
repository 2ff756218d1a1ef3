"""Request bodies of Anthropic's Messages API as msgspec Structs: a malformed field fails decoding
with a 400 naming its path (`messages[0].content[1].tool_use_id`). Unknown fields (cache_control,
citations, service_tier, ...) are ignored, as they change nothing here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class TextBlock(msgspec.Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class ImageBlock(msgspec.Struct, tag="image", tag_field="type", kw_only=True):
    """A user's picture (source: base64 type, media_type, data) for a vision-language model;
    refused with a clear 400 elsewhere."""

    source: dict[str, Any] | None = None


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type", kw_only=True):
    """Refused with a clear 400 (PDFs and other documents are not read)."""

    source: dict[str, Any] | None = None


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(
    msgspec.Struct, tag="redacted_thinking", tag_field="type", kw_only=True
):
    data: str = ""


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(msgspec.Struct, kw_only=True):
    """A client tool (`type` absent or "custom"); Anthropic's server tools are refused."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None


class MessagesInput(msgspec.Struct, kw_only=True):
    """What a conversation's prompt is made of (all that POST /v1/messages/count_tokens takes)."""

    model: str
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(MessagesInput, kw_only=True):
    """POST /v1/messages."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: Probability | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    # localchat's extension (vLLM's sampling field): generate max_tokens tokens, past the end of
    # sequence; benchmarks use it so every API does the same work
    ignore_eos: bool = False
