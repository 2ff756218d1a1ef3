"""A Responses API request as the chat completion it asks for.

`input` is a string (one user message) or items: messages (role user, assistant, system or
developer; content a string or input_text / output_text parts), function_call and
function_call_output items, and reasoning items (the next assistant turn's reasoning). Items are
checked one by one, each malformed one a 400 naming it (`input[2].call_id`), and kept with an id
each (what `GET /v1/responses/{id}/input_items` lists). An assistant turn's reasoning, text and
calls join into one chat message; `instructions` and the system and developer messages that open
the conversation are its system message. `text.format` is the chat's response_format,
`reasoning.effort` the chat template's enable_thinking (off for none and minimal) and
reasoning_effort (gpt-oss's)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import msgspec

from localchat.errors import InvalidParameterError
from localchat.server.field_names import api_field_names
from localchat.server.images import image_from_url, is_remote
from localchat.server.media_fetch import fetched_data_url
from localchat.server.protocol import ChatCompletionRequest, ChatMessage, ContentPart, ImageURL
from localchat.server.responses.protocol import ResponsesRequest

# the chat path's fields that have other names here (see api_field_names)
FIELDS = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "chat_template_kwargs": "reasoning",
}
PATHS = (
    (r"response_format\.json_schema\.", "text.format."),
    (r"(tools\[\d+\])\.function\.", r"\1."),
)
MAX_METADATA = 16  # OpenAI's: pairs, with keys of at most 64 characters and values of 512
ITEM_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def field_names():
    """Errors of the chat path, inside, name this API's fields."""
    return api_field_names(FIELDS, PATHS)


def new_item_id(kind: str) -> str:
    return f"{ITEM_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"


class _Text(msgspec.Struct, kw_only=True):
    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file"]
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None  # an input_image's (a data: URL, or an http(s) one fetched)
    file_id: str | None = None  # an input_image's other source, refused (no Files API here)
    detail: str | None = None  # an input_image's (low, high, auto): ignored


class _Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[_Text]


class _FunctionCall(msgspec.Struct, kw_only=True):
    call_id: str
    name: str
    arguments: str


class _FunctionCallOutput(msgspec.Struct, kw_only=True):
    call_id: str
    output: str | list[_Text]


class _ReasoningText(msgspec.Struct, kw_only=True):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class _Reasoning(msgspec.Struct, kw_only=True):
    summary: list[_ReasoningText] = []
    content: list[_ReasoningText] | None = None


_ITEMS: dict[str, type] = {
    "message": _Message,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
    "reasoning": _Reasoning,
}


def _item(item: Any, where: str, takes_images: bool = False) -> Any:
    """One input item, checked: a 400 naming the field it gets wrong."""
    if not isinstance(item, dict):
        raise InvalidParameterError(f"{where} must be an object", param=where)
    kind = item.get("type", "message")
    if kind not in _ITEMS:
        raise InvalidParameterError(
            f"{where}.type {kind!r} is not supported: give one of {', '.join(_ITEMS)}",
            param=f"{where}.type",
        )
    try:
        value: Any = msgspec.convert(item, _ITEMS[kind])
    except msgspec.ValidationError as exc:
        problem, _, path = str(exc).partition(" - at `$")
        field = where + path.rstrip("`")
        if problem.startswith("Object missing required field") and "`" in problem:
            field += "." + problem.split("`")[1]
        raise InvalidParameterError(f"{field}: {problem}", param=field) from None
    user = isinstance(value, _Message) and value.role == "user"
    for position, part in enumerate(_parts(value)):
        place = f"{where}.{'output' if kind == 'function_call_output' else 'content'}"
        if part.type == "input_image" and user and takes_images:
            _check_image(part, f"{place}[{position}]")
        elif part.type in ("input_image", "input_file"):
            why = (
                "the served model takes no images"
                if part.type == "input_image" and user
                else "only a user message's input_image parts are read"
                if part.type == "input_image"
                else "input_file parts are not supported yet"
            )
            raise InvalidParameterError(f"{place}[{position}]: {why}", param=f"{place}[{position}]")
    return value


def _check_image(part: _Text, where: str) -> None:
    if part.image_url is None:
        field = f"{where}.{'file_id' if part.file_id is not None else 'image_url'}"
        why = (
            "file ids are not supported (this server has no Files API)"
            if part.file_id is not None
            else "an input_image needs its image_url"
        )
        raise InvalidParameterError(
            f"{field}: {why}; send the image as image_url, a data: URL "
            "(data:image/png;base64,...) or an http(s) URL of a host in --allowed-media-domains",
            param=field,
        )
    if not is_remote(part.image_url):  # an http(s) one is checked once fetched (fetch_images)
        image_from_url(part.image_url, where)  # a bad image is named by this API's field


def _user_content(content: str | list[_Text]) -> str | list[ContentPart]:
    """A user message's text, or its parts where an image is among them."""
    if isinstance(content, str) or not any(part.type == "input_image" for part in content):
        return _text(content)
    return [
        ContentPart(type="image_url", image_url=ImageURL(url=part.image_url or ""))
        if part.type == "input_image"
        else ContentPart(type="text", text=part.text or part.refusal or "")
        for part in content
    ]


def _parts(value: Any) -> list[_Text]:
    if isinstance(value, _Message):
        content = value.content
    elif isinstance(value, _FunctionCallOutput):
        content = value.output
    else:
        return []
    return content if isinstance(content, list) else []


def _text(content: str | list[_Text]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.text or part.refusal or "" for part in content)


def input_items(data: ResponsesRequest, takes_images: bool = False) -> list[dict[str, Any]]:
    """The request's input as items, each checked and given an id if it has none (a user's
    input_image parts refused unless the served model `takes_images`)."""
    if isinstance(data.input, str):
        content = [{"type": "input_text", "text": data.input}]
        return [
            {"type": "message", "role": "user", "content": content, "id": new_item_id("message")}
        ]
    if not data.input:
        raise InvalidParameterError("input must hold at least one item", param="input")
    items = []
    for position, item in enumerate(data.input):
        _item(item, f"input[{position}]", takes_images)
        kind = item.get("type", "message")
        items.append({"type": kind, **item, "id": item.get("id") or new_item_id(kind)})
    return items


async def fetch_images(
    items: list[dict[str, Any]], allowed: frozenset[str]
) -> list[dict[str, Any]]:
    """`items` (checked ones, from `input_items`) with each user input_image's http(s) image_url
    replaced by the data: URL of the file it names, fetched as the chat path's are
    (server/media_fetch.py: only from the hosts `allowed`), each refusal, and a file that is not
    an image, a 400 naming the part's image_url (`input[0].content[1].image_url`)."""
    fetched = []
    for position, item in enumerate(items):
        content = item.get("content")
        if item.get("type") == "message" and item["role"] == "user" and isinstance(content, list):
            content = list(content)
            for index, part in enumerate(content):
                url = part.get("image_url")
                if part["type"] == "input_image" and isinstance(url, str) and is_remote(url):
                    field = f"input[{position}].content[{index}].image_url"
                    url = await fetched_data_url(url, field, allowed)
                    image_from_url(url, field)
                    content[index] = {**part, "image_url": url}
            item = {**item, "content": content}
        fetched.append(item)
    return fetched


class _Turns:
    """Chat messages from items: an assistant turn's reasoning, text and calls join."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.assistant: ChatMessage | None = None

    def _turn(self, fresh: bool) -> ChatMessage:
        if self.assistant is None or fresh:
            self.assistant = ChatMessage(role="assistant", content="")
            self.messages.append(self.assistant)
        return self.assistant

    def add(self, value: Any) -> None:
        turn = self.assistant
        said = turn is not None and bool(turn.content or turn.tool_calls)
        if isinstance(value, _Reasoning):
            texts = [part.text for part in value.content or value.summary]
            message = self._turn(fresh=said)
            message.reasoning_content = "\n".join(filter(None, [message.reasoning_content, *texts]))
        elif isinstance(value, _FunctionCall):
            function = {"name": value.name, "arguments": value.arguments}
            call = {"id": value.call_id, "type": "function", "function": function}
            message = self._turn(fresh=False)
            message.tool_calls = [*(message.tool_calls or []), call]
        elif isinstance(value, _Message) and value.role == "assistant":
            self._turn(fresh=said).content = _text(value.content)
        else:
            self.assistant = None
            if isinstance(value, _FunctionCallOutput):
                self.messages.append(
                    ChatMessage(
                        role="tool", content=_text(value.output), tool_call_id=value.call_id
                    )
                )
            else:
                role = "system" if value.role == "developer" else value.role
                content = _user_content(value.content) if role == "user" else _text(value.content)
                self.messages.append(ChatMessage(role=role, content=content))


def chat_messages(
    instructions: str | None, items: list[dict[str, Any]], takes_images: bool = False
) -> list[ChatMessage]:
    """The conversation of `items` (checked ones: a stored response's, then the request's),
    opened by `instructions`."""
    turns = _Turns()
    for position, item in enumerate(items):
        turns.add(_item(item, f"input[{position}]", takes_images))
    messages = turns.messages
    system = [instructions] if instructions else []
    while messages and messages[0].role == "system":
        system.append(str(messages.pop(0).content or ""))
    if system:
        messages.insert(0, ChatMessage(role="system", content="\n\n".join(system)))
    if not any(message.role != "system" for message in messages):
        raise InvalidParameterError("input must hold a message to answer", param="input")
    return messages


def _tools(data: ResponsesRequest) -> list[dict[str, Any]] | None:
    if data.tools is None:
        return None
    functions = []
    for position, tool in enumerate(data.tools):
        if tool.type != "function":
            raise InvalidParameterError(
                f"tools[{position}].type {tool.type!r} is not supported: only function tools",
                param=f"tools[{position}].type",
            )
        if not tool.name:
            raise InvalidParameterError(
                f"tools[{position}].name is required", param=f"tools[{position}].name"
            )
        function = {k: v for k, v in msgspec.to_builtins(tool).items() if v is not None}
        del function["type"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice  # "none", "auto", "required" (others are refused by the chat path)
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidParameterError(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def _response_format(data: ResponsesRequest) -> dict[str, Any] | None:
    form = data.text.format if data.text is not None else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "json_object"}
    if form.schema is None:
        raise InvalidParameterError(
            "text.format of type json_schema needs a schema", param="text.format.schema"
        )
    spec = {"name": form.name or "response", "schema": form.schema, "strict": form.strict}
    return {"type": "json_schema", "json_schema": spec}


def _thinking(data: ResponsesRequest) -> dict[str, Any] | None:
    effort = data.reasoning.effort if data.reasoning is not None else None
    if effort is None:
        return None
    level = {"none": "low", "minimal": "low", "xhigh": "high"}.get(effort, effort)
    return {"enable_thinking": effort not in ("none", "minimal"), "reasoning_effort": level}


def _check(data: ResponsesRequest) -> None:
    if data.background:
        raise InvalidParameterError("background responses are not supported", param="background")
    metadata = data.metadata or {}
    if len(metadata) > MAX_METADATA:
        raise InvalidParameterError(
            f"metadata holds at most {MAX_METADATA} pairs", param="metadata"
        )
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise InvalidParameterError(
                f"metadata[{key[:64]!r}]: keys hold at most 64 characters, values 512",
                param="metadata",
            )


def chat_request(
    data: ResponsesRequest,
    history: list[dict[str, Any]],
    items: list[dict[str, Any]],
    takes_images: bool = False,
) -> ChatCompletionRequest:
    """The chat completion of a request whose input `items` (from `input_items`) follow `history`
    (the items of the response it continues, if any)."""
    _check(data)
    return ChatCompletionRequest(
        messages=chat_messages(data.instructions, [*history, *items], takes_images),
        model=data.model,
        max_tokens=data.max_output_tokens,
        ignore_eos=data.ignore_eos,
        temperature=data.temperature,
        top_p=data.top_p,
        tools=_tools(data),
        tool_choice=_tool_choice(data.tool_choice),
        parallel_tool_calls=data.parallel_tool_calls,
        response_format=_response_format(data),
        chat_template_kwargs=_thinking(data),
    )
