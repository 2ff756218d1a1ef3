"""Structured outputs: turn a request's `response_format`, `structured_outputs` or `guided_*` field
into one llguidance grammar for the engine, rejecting malformed ones with a 400 naming the field.

JSON is generated compactly (no free whitespace), which keeps small models from wandering in
indentation. A grammar is validated here without a tokenizer (cheap); the engine compiles it for
the model's vocabulary off its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

from localchat.engine.sampling.guided_decoding import validate_grammar
from localchat.engine.sampling.request_limits import limits
from localchat.errors import InvalidParameterError
from localchat.harmony import final_lark
from localchat.reasoning import HARMONY
from localchat.server.protocol import SamplingFields

JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions
ANY_OBJECT: dict[str, Any] = {"type": "object"}
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "not", "if", "then", "else", "contains")


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return "object" in kinds or "properties" in schema


def strict_schema(schema: Any, param: str, where: str) -> dict[str, Any]:
    """A copy of `schema` with `additionalProperties: false` on every object in it, nested ones
    too, as OpenAI's strict mode makes it; a schema strict mode cannot take (not an object at the
    top, an object that allows other properties, an object whose `required` does not list every
    one of its properties) is a 400 naming `param` and the place (`where`, e.g.
    "tools[0].function.parameters")."""
    if not isinstance(schema, dict) or not _is_object(schema):
        raise InvalidParameterError(
            f"{where} must be an object schema ({{'type': 'object', ...}}) with strict",
            param=param,
        )
    return _strict(schema, param, where)


def _strict(node: Any, param: str, path: str) -> Any:
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if _is_object(node):
        if node.get("additionalProperties", False) is not False:
            raise InvalidParameterError(
                f"{path}.additionalProperties must be false with strict", param=param
            )
        node["additionalProperties"] = False
        _check_all_required(node, param, path)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {
                name: _strict(sub, param, f"{path}.{key}.{name}") for name, sub in node[key].items()
            }
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            subs = enumerate(node[key])
            node[key] = [_strict(sub, param, f"{path}.{key}[{i}]") for i, sub in subs]
    for key in _SCHEMA_ONE:
        if key in node:
            node[key] = _strict(node[key], param, f"{path}.{key}")
    return node


def _check_all_required(node: dict[str, Any], param: str, path: str) -> None:
    """OpenAI's strict mode: every property of an object is listed in its `required` (an optional
    field is written as a required one that may be null)."""
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties:
        return
    required = node.get("required", [])
    if not isinstance(required, list):
        raise InvalidParameterError(
            f"{path}.required must be a list of every property's name with strict", param=param
        )
    if missing := [name for name in properties if name not in required]:
        names = ", ".join(repr(name) for name in missing)
        raise InvalidParameterError(
            f"{path}.required must list every property with strict; missing {names}", param=param
        )


def _depth(node: Any, most: int) -> int:
    """How deep `node` nests (objects and arrays counted together), counted without recursion (a
    hostile one nests thousands deep) and no further than one level past `most`."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= most:  # deep enough to refuse: no need to walk further
                stack.extend(
                    (child, depth + 1)
                    for child in (item.values() if isinstance(item, dict) else item)
                )
    return deepest


def _loaded(schema: str, param: str) -> Any:
    try:
        return json.loads(schema)
    except json.JSONDecodeError as exc:
        raise InvalidParameterError(f"{param} must be a JSON schema: {exc}", param=param) from None


def json_grammar(schema: Any, param: str) -> str:
    """An llguidance grammar for JSON matching `schema` (a dict or its JSON text)."""
    import llguidance

    if isinstance(schema, str):
        schema = _loaded(schema, param)
    if not isinstance(schema, dict):
        raise InvalidParameterError(f"{param} must be a JSON schema object", param=param)
    most = limits().schema_depth
    if _depth(schema, most) > most:
        raise InvalidParameterError(
            f"{param} nests deeper than {most} levels (the server's --limit schema_depth)",
            param=param,
        )
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


def response_format_grammar(value: dict[str, Any]) -> str | None:
    """The grammar of a `response_format` value (None for text); a malformed one is a 400."""
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
        schema = spec.get("schema", ANY_OBJECT)
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidParameterError(
                "response_format.json_schema.strict must be a boolean", param="response_format"
            )
        if strict:
            if isinstance(schema, str):
                schema = _loaded(schema, "response_format")
            schema = strict_schema(schema, "response_format", "response_format.json_schema.schema")
        return json_grammar(schema, "response_format")
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
        grammar = response_format_grammar(request.response_format)
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
    if found:
        check_grammar_size(*found[0])
    return found[0] if found else None


def check_grammar_size(grammar: str, param: str) -> None:
    """A 400 naming `param` when the grammar made of it passes the grammar_bytes bound."""
    most = limits().grammar_bytes
    if len(grammar) > most:
        raise InvalidParameterError(
            f"{param} makes a grammar of {len(grammar)} bytes; at most {most} are compiled "
            "(the server's --limit grammar_bytes)",
            param=param,
        )


_FREE, _WS, _CLOSE = r"(?s:.*)", r"[ \t\r\n]*", r"<\/think>"


def _thinking_lark(thinking: str, answer: str) -> str:
    """The Lark grammar of a reply whose thinking is free: text without </think> (the reply may end
    there), or that text, </think> and whitespace, then the grammar named `answer`. With "maybe"
    the block must open first (after whitespace), or the reply answers at once."""
    opening = "" if thinking == "inside" else _WS + "<think>"
    once = rf"~/{_FREE}{_CLOSE}{_FREE}{_CLOSE}{_FREE}/"
    rules = [
        f"THINKING: /{opening}{_FREE}/ & ~/{_FREE}{_CLOSE}{_FREE}/",
        f"THOUGHT: /{opening}{_FREE}{_CLOSE}{_WS}/ & {once}",
    ]
    start = f"start: THINKING | THOUGHT @{answer}"
    if thinking == "maybe":
        start += f" | @{answer}"
    return "\n".join([start, *rules]) + "\n"


def after_reasoning(
    grammar: str, thinking: str, token_id: Callable[[str], int | None] = lambda _: None
) -> str:
    """`grammar` (llguidance's JSON form or Lark text) applied only after the reply's thinking
    (`thinking` as `reasoning.reply_thinking` says), which stays unconstrained; for a harmony reply,
    as its final message (`token_id` gives the ids of the format's special tokens)."""
    top = None
    if grammar.lstrip().startswith("{"):
        with contextlib.suppress(json.JSONDecodeError):
            top = json.loads(grammar)
    if not isinstance(top, dict) or not top.get("grammars"):
        top = {"grammars": [{"lark_grammar": grammar}]}
    grammars = [dict(g) for g in top["grammars"]]
    grammars[0]["name"] = name = grammars[0].get("name") or "answer"
    wrapper = {
        "name": "localchat_reasoning",
        "lark_grammar": final_lark(name, token_id)
        if thinking == HARMONY
        else _thinking_lark(thinking, name),
    }
    return json.dumps({**top, "grammars": [wrapper, *grammars]})


async def checked_grammar(
    request: SamplingFields,
    tool_grammar: tuple[str, str] | None = None,
    thinking: str | None = None,
    token_id: Callable[[str], int | None] = lambda _: None,
) -> tuple[str, str] | None:
    """The request's grammar (or `tool_grammar`, from a forced tool call), validated off the event
    loop, and the field that gave it; None when the output is free. With `thinking` (a reasoning
    parser is on) the grammar applies only once the thinking has ended (a harmony tool grammar
    is a whole reply already; `token_id` names the special tokens of harmony's)."""
    found = await asyncio.to_thread(request_grammar, request)  # a large schema takes a while
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
    if thinking is not None and not (thinking == HARMONY and param == "tool_choice"):
        grammar = after_reasoning(grammar, thinking, token_id)
    seconds = limits().grammar_seconds
    try:  # llguidance's fuel bounds the work; this bounds the wait
        await asyncio.wait_for(asyncio.to_thread(validate_grammar, grammar, param), seconds)
    except TimeoutError:
        raise InvalidParameterError(
            f"{param} did not compile within {seconds:g} s (the server's --limit grammar_seconds)",
            param=param,
        ) from None
    return grammar, param
