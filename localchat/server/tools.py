"""`tools` and `tool_choice` of a chat request: what the template sees, whether the reply is parsed
for calls, and the grammar that forces a call for "required" or a named function."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.engine.sampling.request_limits import check_most
from localchat.errors import InvalidParameterError
from localchat.server.protocol import ChatCompletionRequest, ChatMessage
from localchat.server.structured import strict_schema
from localchat.server.tool_parsers import ToolParser

STRICT_EMPTY: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    template_tools: list[dict[str, Any]] | None  # passed to the chat template
    parse: bool  # look for tool calls in the reply
    grammar: str | None  # forces a call (tool_choice "required" or a named function)


def _functions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    functions = []
    for position, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise InvalidParameterError(
                f"tools[{position}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param="tools",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidParameterError(
                f"tools[{position}].function.parameters must be a JSON schema object",
                param="tools",
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidParameterError(
                f"tools[{position}].function.strict must be a boolean", param="tools"
            )
        if strict:  # OpenAI's strict mode: no properties beyond those the schema names
            where = f"tools[{position}].function.parameters"
            parameters = strict_schema(parameters or STRICT_EMPTY, "tools", where)
            function = {**function, "parameters": parameters}
        functions.append(function)
    return functions


def _named(choice: dict[str, Any], functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidParameterError(
            "tool_choice must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise InvalidParameterError(
            f"tool_choice names {name!r}, which is not among the tools", param="tool_choice"
        )
    return chosen


def check_tools(tools: list[Any] | None) -> None:
    """At most limits().tools tools, their JSON at most its tools_bytes (before any is rendered or
    turned into a grammar); past either, a 400 naming `tools`."""
    if not tools:
        return
    check_most("tools", len(tools), "tools", "tools")
    size = len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode())
    check_most("tools", size, "tools_bytes", "bytes of JSON")


def plan_tools(
    request: ChatCompletionRequest, parser: ToolParser, token_id: Callable[[str], int | None]
) -> ToolPlan:
    check_tools(request.tools)
    tools, choice = request.tools or [], request.tool_choice
    functions = _functions(tools)
    if choice is None:
        choice = "auto" if functions else "none"
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise InvalidParameterError(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
            param="tool_choice",
        )
    if choice != "none" and not functions:
        raise InvalidParameterError("tool_choice needs tools", param="tool_choice")
    if choice == "none":
        return ToolPlan(None, False, None)
    if choice == "auto":
        return ToolPlan(tools, True, None)
    if choice == "required":
        grammar = parser.grammar(functions, request.parallel_tool_calls, token_id)
    else:
        assert isinstance(choice, dict)
        grammar = parser.grammar(_named(choice, functions), False, token_id)
    return ToolPlan(tools, True, grammar)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: an assistant's tool-call arguments as objects (the
    API carries them as JSON text), as transformers' and vLLM's templates read them; a message
    without content (an assistant's tool calls, `content: null`) has "" as vLLM gives it, for
    templates that add `message['content']` to a string (SmolLM2's); an assistant's reasoning
    (`reasoning_content`, or `reasoning`) is also its `thinking`, where gpt-oss's template reads
    it (Qwen3's reads `reasoning_content`)."""
    result = []
    for message in messages:
        data = message.to_dict()
        data.setdefault("content", "")
        reasoning = data.pop("reasoning", None)
        if reasoning and not data.get("reasoning_content"):
            data["reasoning_content"] = reasoning
        if data.get("reasoning_content") and message.role == "assistant":
            data["thinking"] = data["reasoning_content"]
        for call in data.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):
                    function["arguments"] = json.loads(function["arguments"])
        result.append(data)
    return result
