"""Request bodies of the OpenAI-compatible API as msgspec Structs (decoded and documented by
Litestar).

Types and simple bounds live here so a malformed field fails decoding with a 400 naming it; range
checks that depend on other fields happen in `sampling.py`. Unknown fields are ignored, as OpenAI's
API does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.enums import RequestEncodingType
from litestar.params import Body

# handlers: `data: Annotated[Model, JSON_BODY]`
JSON_BODY = Body(media_type=RequestEncodingType.JSON)
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
TokenId = Annotated[int, msgspec.Meta(ge=0)]


class ImageURL(msgspec.Struct, kw_only=True):
    """An `image_url` part's picture: a data: URL (server/images.py)."""

    url: str
    detail: str | None = None


class ContentPart(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One part of a message's content: text, or an image for a vision-language model."""

    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One message of a chat request as OpenAI's API sends it (the TUI keeps its own as
    `tui.conversation.StoredMessage`)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # an assistant's reasoning, sent back as the server returned it (vLLM's two names for it)
    reasoning_content: str | None = None
    reasoning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by /v1/chat/completions and /v1/completions (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    echo: bool = False
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_*
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    # ollama's: how long the model stays loaded once idle (`serve --models` acts on it; a
    # single-model server keeps its model loaded and only checks it)
    keep_alive: str | float | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/completions. `prompt` is a string, a list of strings, token ids, or lists of token
    ids."""

    prompt: str | list[Any]
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /tokenize: either `prompt` (text) or `messages` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /detokenize."""

    tokens: list[TokenId]
    model: str | None = None


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """POST /v1/embeddings: `input` is a string, a list of strings, token ids, or lists of them."""

    input: str | list[Any]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None
