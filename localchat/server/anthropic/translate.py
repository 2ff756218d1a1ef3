"""An Anthropic Messages request as the chat completion it asks for.

`system` is the first message; a user message's `tool_result` blocks become `tool` messages (in
block order, its text blocks a user message between them); an assistant message's `tool_use`
blocks are its tool calls and its `thinking` its reasoning. A conversation that ends with an
assistant message is continued, as Anthropic does. Tools become functions whose parameters are
their input schemas; tool_choice any and tool are forced by the chat path's grammars. `thinking`
turns the chat template's enable_thinking on or off (left to the template when absent)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

from localchat.errors import InvalidParameterError
from localchat.server.anthropic.protocol import (
    DocumentBlock,
    ImageBlock,
    MessagesInput,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from localchat.server.field_names import api_field_names
from localchat.server.images import image_from_url, is_remote
from localchat.server.media_fetch import fetched_data_url
from localchat.server.protocol import ChatCompletionRequest, ChatMessage, ContentPart, ImageURL

# the chat path's fields that have other names here (see api_field_names)
FIELDS = {"stop": "stop_sequences", "chat_template_kwargs": "thinking"}
PATHS = ((r"(tools\[\d+\])\.function\.parameters", r"\1.input_schema"),)
MIN_THINKING_BUDGET = 1024  # Anthropic's
Input = TypeVar("Input", bound=MessagesInput)


def field_names():
    """Errors of the chat path, inside, name this API's fields."""
    return api_field_names(FIELDS, PATHS)


def _unsupported(block: Any, where: str) -> None:
    if isinstance(block, ImageBlock):
        raise InvalidParameterError(
            f"{where}: image blocks are read only in a user message's content",
            param=where,
        )
    if isinstance(block, DocumentBlock):
        raise InvalidParameterError(
            f"{where}: document blocks are not supported (send the document's text)", param=where
        )


def _text(blocks: str | list | None, where: str) -> str:
    """The text of a string or of text blocks (a tool result's, or the system prompt's)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    for position, block in enumerate(blocks):
        _unsupported(block, f"{where}[{position}]")
    return "\n".join(block.text for block in blocks if isinstance(block, TextBlock))


def _image_part(block: ImageBlock, where: str, takes_images: bool) -> ContentPart:
    """A base64 image block, or a URL one fetched (fetch_images), as the chat path's image_url
    part (checked here, so that a bad image is named by this API's field)."""
    if not takes_images:
        raise InvalidParameterError(
            f"{where}: the served model takes no images (image blocks need a vision-language "
            "model)",
            param=where,
        )
    source = block.source or {}
    field = where
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        url, field = source["url"], f"{where}.source.url"  # a data: URL, what fetch_images fetched
    elif source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    else:
        raise InvalidParameterError(
            f"{where}: an image block's source must be base64 (type, media_type, data) or url "
            "(type, url)",
            param=where,
        )
    image_from_url(url, field)
    return ContentPart(type="image_url", image_url=ImageURL(url=url))


async def fetch_images(data: Input, allowed: frozenset[str]) -> Input:
    """`data` with each user image block's URL source (`{"type": "url", "url": "https://..."}`)
    holding the file it names, fetched as the chat path's image URLs are (server/media_fetch.py:
    only from the hosts `allowed`), each refusal a 400 naming the URL
    (`messages[0].content[1].source.url`)."""
    messages = list(data.messages)
    for position, message in enumerate(messages):
        if message.role != "user" or isinstance(message.content, str):
            continue
        content = list(message.content)
        for index, block in enumerate(content):
            source = block.source if isinstance(block, ImageBlock) else None
            if not source or source.get("type") != "url":
                continue
            field = f"messages[{position}].content[{index}].source.url"
            url = source.get("url")
            if not isinstance(url, str) or not is_remote(url):
                raise InvalidParameterError(
                    f"{field}: a URL source's url must be an http(s) URL", param=field
                )
            source = {**source, "url": await fetched_data_url(url, field, allowed)}
            content[index] = msgspec.structs.replace(block, source=source)
        messages[position] = msgspec.structs.replace(message, content=content)
    return msgspec.structs.replace(data, messages=messages)


def _user_content(parts: list[ContentPart]) -> str | list[ContentPart]:
    """Text blocks joined, or the parts as they are where an image is among them."""
    if any(part.image_url is not None for part in parts):
        return parts
    return "\n".join(part.text or "" for part in parts)


def _user(content: list, where: str, takes_images: bool) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    texts: list[ContentPart] = []
    for position, block in enumerate(content):
        if isinstance(block, ImageBlock):
            texts.append(_image_part(block, f"{where}[{position}]", takes_images))
            continue
        _unsupported(block, f"{where}[{position}]")
        if isinstance(block, TextBlock):
            texts.append(ContentPart(type="text", text=block.text))
        elif isinstance(block, ToolResultBlock):
            if texts:
                messages.append(ChatMessage(role="user", content=_user_content(texts)))
                texts = []
            text = _text(block.content, f"{where}[{position}].content")
            messages.append(ChatMessage(role="tool", content=text, tool_call_id=block.tool_use_id))
        elif not isinstance(block, ThinkingBlock):
            raise InvalidParameterError(
                f"{where}[{position}]: a user message cannot hold {type(block).__name__} blocks",
                param=f"{where}[{position}].type",
            )
    if texts or not messages:
        messages.append(ChatMessage(role="user", content=_user_content(texts)))
    return messages


def _assistant(content: list, where: str) -> ChatMessage:
    texts, thinking, calls = [], [], []
    for position, block in enumerate(content):
        _unsupported(block, f"{where}[{position}]")
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock):
            raise InvalidParameterError(
                f"{where}[{position}]: tool_result blocks belong in user messages",
                param=f"{where}[{position}].type",
            )
    return ChatMessage(
        role="assistant",
        content="".join(texts),
        tool_calls=calls or None,
        reasoning_content="\n".join(thinking) or None,
    )


def chat_messages(data: MessagesInput, takes_images: bool = False) -> list[ChatMessage]:
    if not data.messages:
        raise InvalidParameterError("messages must hold at least one message", param="messages")
    messages = []
    system = _text(data.system, "system")
    if system:
        messages.append(ChatMessage(role="system", content=system))
    for position, message in enumerate(data.messages):
        where = f"messages[{position}].content"
        content = message.content
        if isinstance(content, str):
            messages.append(ChatMessage(role=message.role, content=content))
        elif message.role == "user":
            messages.extend(_user(content, where, takes_images))
        else:
            messages.append(_assistant(content, where))
    return messages


def _tools(data: MessagesInput) -> list[dict[str, Any]] | None:
    if data.tools is None:
        return None
    functions = []
    for position, tool in enumerate(data.tools):
        if tool.type not in (None, "custom"):
            raise InvalidParameterError(
                f"tools[{position}].type {tool.type!r} is not supported: only client tools "
                "(name, description, input_schema)",
                param=f"tools[{position}].type",
            )
        if tool.input_schema is None:
            raise InvalidParameterError(
                f"tools[{position}].input_schema is required", param=f"tools[{position}]"
            )
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(data: MessagesInput) -> tuple[str | dict[str, Any] | None, bool]:
    """The chat tool_choice and parallel_tool_calls of Anthropic's tool_choice."""
    choice = data.tool_choice
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise InvalidParameterError(
                "tool_choice of type tool needs the tool's name", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _thinking(data: MessagesInput, max_tokens: int | None) -> dict[str, Any] | None:
    thinking = data.thinking
    if thinking is None:
        return None
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None or budget < MIN_THINKING_BUDGET:
            raise InvalidParameterError(
                f"thinking.budget_tokens must be at least {MIN_THINKING_BUDGET}, got {budget}",
                param="thinking.budget_tokens",
            )
        if max_tokens is not None and budget >= max_tokens:
            raise InvalidParameterError(
                f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})",
                param="thinking.budget_tokens",
            )
    return {"enable_thinking": thinking.type != "disabled"}


def chat_request(data: MessagesInput, takes_images: bool = False) -> ChatCompletionRequest:
    """The chat completion of a Messages request (or of a count_tokens request); a user's image
    blocks are refused unless the served model `takes_images`."""
    messages = chat_messages(data, takes_images)
    tool_choice, parallel = _tool_choice(data)
    sampling: dict[str, Any] = {}
    if isinstance(data, MessagesRequest):
        for position, stop in enumerate(data.stop_sequences or []):
            if not stop:
                raise InvalidParameterError(
                    f"stop_sequences[{position}] is empty", param=f"stop_sequences[{position}]"
                )
        sampling = {
            "max_tokens": data.max_tokens,
            "temperature": data.temperature,
            "top_p": data.top_p,
            "top_k": data.top_k,
            "stop": data.stop_sequences or None,
            "ignore_eos": data.ignore_eos,
        }
    last = messages[-1]
    continued = last.role == "assistant" and not last.tool_calls  # a prefilled reply
    return ChatCompletionRequest(
        messages=messages,
        model=data.model,
        tools=_tools(data),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs=_thinking(data, sampling.get("max_tokens")),
        add_generation_prompt=not continued,
        continue_final_message=continued,
        **sampling,
    )
