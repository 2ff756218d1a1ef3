"""Structured outputs: turn a request's `response_format`, `structured_outputs` or `guided_*` field
into one llguidance grammar for the engine, rejecting malformed ones with a 400 naming the field.

JSON is generated compactly (no free whitespace), which keeps small models from wandering in
indentation. A grammar is validated here without a tokenizer (cheap); the engine compiles it for
the model's vocabulary off its thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from localchat.engine.guided_decoding import validate_grammar
from localchat.errors import InvalidParameterError
from localchat.server.protocol import SamplingFields

JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions
ANY_OBJECT: dict[str, Any] = {"type": "object"}
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def json_grammar(schema: Any, param: str) -> str:
    """An llguidance grammar for JSON matching `schema` (a dict or its JSON text)."""
    import llguidance

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError(
                f"{param} must be a JSON schema: {exc}", param=param
            ) from None
    if not isinstance(schema, dict):
        raise InvalidParameterError(f"{param} must be a JSON schema object", param=param)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise InvalidParameterError(f"invalid {param}: {exc}", param=param) from None


def regex_grammar(regex: Any, param: str) -> str:
    import llguidance

    if not isinstance(regex, str) or not regex:
        raise InvalidParameterError(f"{param} must be a non-empty regular expression", param=param)
    return llguidance.LLMatcher.grammar_from_regex(regex)


def choice_grammar(choices: Any, param: str) -> str:
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise InvalidParameterError(f"{param} must be a list of non-empty strings", param=param)
    return regex_grammar("|".join(f"(?:{re.escape(c)})" for c in choices), param)


def lark_grammar(grammar: Any, param: str) -> str:
    """A Lark grammar (llguidance's dialect) or, recognized by its `::=`, a GBNF one."""
    import llguidance

    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidParameterError(f"{param} must be a non-empty grammar", param=param)
    if "::=" in grammar:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            grammar = gbnf_to_lark(grammar)
        except Exception as exc:
            raise InvalidParameterError(f"invalid {param}: {exc}", param=param) from None
    return llguidance.LLMatcher.grammar_from_lark(grammar)


def _response_format(value: dict[str, Any]) -> str | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(ANY_OBJECT, "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidParameterError(
                "response_format of type json_schema needs a 'json_schema' object",
                param="response_format",
            )
        return json_grammar(spec.get("schema", ANY_OBJECT), "response_format")
    raise InvalidParameterError(
        f"response_format type must be text, json_object or json_schema, got {kind!r}",
        param="response_format",
    )


def _structured_outputs(value: dict[str, Any]) -> str:
    given = [kind for kind in STRUCTURED_KINDS if value.get(kind) not in (None, False)]
    if len(given) != 1:
        raise InvalidParameterError(
            f"structured_outputs takes exactly one of {', '.join(STRUCTURED_KINDS)}",
            param="structured_outputs",
        )
    kind = given[0]
    param = "structured_outputs"
    if kind == "json_object":
        return json_grammar(ANY_OBJECT, param)
    builder = {
        "json": json_grammar,
        "regex": regex_grammar,
        "choice": choice_grammar,
        "grammar": lark_grammar,
    }[kind]
    return builder(value[kind], param)


def request_grammar(request: SamplingFields) -> tuple[str, str] | None:
    """The grammar a request asks for and the field that asked, or None; at most one may ask."""
    found: list[tuple[str, str]] = []
    if request.response_format is not None:
        grammar = _response_format(request.response_format)
        if grammar is not None:
            found.append((grammar, "response_format"))
    if request.structured_outputs is not None:
        found.append((_structured_outputs(request.structured_outputs), "structured_outputs"))
    legacy = (
        ("guided_json", request.guided_json, json_grammar),
        ("guided_regex", request.guided_regex, regex_grammar),
        ("guided_choice", request.guided_choice, choice_grammar),
        ("guided_grammar", request.guided_grammar, lark_grammar),
    )
    for name, value, builder in legacy:
        if value is not None:
            found.append((builder(value, name), name))
    if len(found) > 1:
        raise InvalidParameterError(
            f"{found[1][1]} cannot be combined with {found[0][1]}", param=found[1][1]
        )
    return found[0] if found else None


async def checked_grammar(
    request: SamplingFields, tool_grammar: tuple[str, str] | None = None
) -> str | None:
    """The request's grammar (or `tool_grammar`, from a forced tool call), validated off the event
    loop; None when the output is free."""
    found = request_grammar(request)
    if tool_grammar is not None:
        if found is not None:
            raise InvalidParameterError(
                f"{found[1]} cannot be combined with tool_choice {tool_grammar[1]!r}",
                param=found[1],
            )
        found = (tool_grammar[0], "tool_choice")
    if found is None:
        return None
    grammar, param = found
    await asyncio.to_thread(validate_grammar, grammar, param)
    return grammar
