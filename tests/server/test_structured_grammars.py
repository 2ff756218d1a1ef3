"""The grammars the server builds, checked text by text on a byte-level tokenizer (no model): a
strict tool's schema takes no other properties, and a grammar behind a reasoning parser leaves the
thinking free."""

from __future__ import annotations

import json

import llguidance
import pytest

from localchat.errors import InvalidParameterError
from localchat.server.protocol import ChatCompletionRequest, ChatMessage
from localchat.server.structured import after_reasoning, json_grammar, request_grammar
from localchat.server.tool_parsers import HermesParser, MistralParser
from localchat.server.tools import plan_tools


class _Bytes:
    """One token per byte, and an end-of-sequence token."""

    def __init__(self):
        self.eos_token_id, self.bos_token_id = 256, None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text):
        return list(text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(grammar: str, text: str) -> bool:
    """Whether `text` is a whole output the grammar allows."""
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    data = list(text.encode())
    return matcher.try_consume_tokens(data) == len(data) and matcher.is_accepting()


NESTED = {  # every property required, as strict mode wants
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
        "stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}},
    },
    "required": ["city", "where", "stops"],
    "$defs": {
        "stop": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    },
}


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[ChatMessage(role="user", content="hi")], **fields)


def _tool_grammar(strict: bool | None) -> str:
    function = {"name": "go", "parameters": NESTED}
    if strict is not None:
        function["strict"] = strict
    request = _chat(tools=[{"type": "function", "function": function}], tool_choice="required")
    grammar = plan_tools(request, HermesParser(), lambda text: None).grammar
    assert grammar is not None
    return grammar


def _call(arguments: dict) -> str:
    return '<tool_call>\n{"name":"go","arguments":' + json.dumps(arguments, separators=(",", ":"))


@pytest.mark.parametrize(
    "extra",
    [
        {"city": "Oslo", "where": {"lat": 1}, "stops": [{"name": "a"}], "country": "NO"},
        {"city": "Oslo", "where": {"lat": 1, "lon": 2}, "stops": [{"name": "a"}]},
        {"city": "Oslo", "where": {"lat": 1}, "stops": [{"name": "a", "time": 3}]},
    ],
    ids=["top", "nested", "in-defs"],
)
def test_strict_tool_takes_no_other_properties(extra):
    plain = {"city": "Oslo", "where": {"lat": 1}, "stops": [{"name": "a"}]}
    strict, loose = _tool_grammar(True), _tool_grammar(None)
    assert accepts(strict, _call(plain) + "}\n</tool_call>")
    assert accepts(loose, _call(extra) + "}\n</tool_call>")
    assert not accepts(strict, _call(extra) + "}\n</tool_call>")


@pytest.mark.parametrize(
    "parameters,where",
    [
        ({"type": "object", "additionalProperties": True}, "parameters.additionalProperties"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "object", "additionalProperties": {}}},
                "required": ["a"],
            },
            "parameters.properties.a.additionalProperties",
        ),
        ({"type": "string"}, "parameters must be an object schema"),
        (
            {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]},
            "parameters.required must list every property with strict; missing 'b'",
        ),
        (
            {"type": "object", "properties": {"a": {}, "b": {}}},
            "parameters.required must list every property with strict; missing 'a', 'b'",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "required": "a"},
            "parameters.required must be a list",
        ),
        (
            {**NESTED, "properties": {**NESTED["properties"], "where": {"properties": {"x": {}}}}},
            "parameters.properties.where.required must list every property with strict; "
            "missing 'x'",
        ),
        (
            {**NESTED, "$defs": {"stop": {"type": "object", "properties": {"name": {}}}}},
            "parameters.$defs.stop.required must list every property with strict",
        ),
        (
            {
                "type": "object",
                "properties": {"p": {"anyOf": [{"type": "null"}, {"properties": {"q": {}}}]}},
                "required": ["p"],
            },
            "parameters.properties.p.anyOf[1].required must list every property",
        ),
    ],
)
def test_schemas_strict_mode_cannot_take_are_named(parameters, where):
    function = {"name": "go", "parameters": parameters, "strict": True}
    request = _chat(tools=[{"type": "function", "function": function}], tool_choice="auto")
    with pytest.raises(InvalidParameterError) as error:
        plan_tools(request, HermesParser(), lambda text: None)
    assert error.value.param == "tools" and f"tools[0].function.{where}" in str(error.value)
    bad = {"name": "go", "parameters": {"type": "object"}, "strict": "yes"}
    with pytest.raises(InvalidParameterError, match="strict must be a boolean"):
        plan_tools(_chat(tools=[{"type": "function", "function": bad}]), HermesParser(), len)


def test_strict_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = {"name": "x", "schema": schema}
    loose = request_grammar(_chat(response_format={"type": "json_schema", "json_schema": spec}))
    strict = request_grammar(
        _chat(response_format={"type": "json_schema", "json_schema": {**spec, "strict": True}})
    )
    assert loose is not None and strict is not None
    assert accepts(loose[0], '{"a":1,"b":2}') and not accepts(strict[0], '{"a":1,"b":2}')
    assert accepts(strict[0], '{"a":1}')
    for bad, message in [
        ({"type": "array"}, "must be an object schema"),
        ({**schema, "required": []}, "schema.required must list every property with strict"),
    ]:
        wrong = {**spec, "schema": bad, "strict": True}
        with pytest.raises(InvalidParameterError) as error:
            request_grammar(_chat(response_format={"type": "json_schema", "json_schema": wrong}))
        assert error.value.param == "response_format" and message in str(error.value)
    loose_ok = {**spec, "schema": {**schema, "required": []}}  # without strict, optional is fine
    assert request_grammar(_chat(response_format={"type": "json_schema", "json_schema": loose_ok}))


OBJECT = json_grammar({"type": "object", "properties": {"a": {"type": "integer"}}}, "test")


def test_grammar_inside_thinking_starts_after_it():
    grammar = after_reasoning(OBJECT, "inside")
    assert accepts(grammar, 'Any text {"not": json} <think>\n</think>\n\n{"a":1}')
    assert accepts(grammar, 'x</think>{"a":1}')
    assert accepts(grammar, "still thinking when the reply ends")  # the thinking is free
    assert not accepts(grammar, "done</think>\n\nnot json")
    assert not accepts(grammar, 'a</think>{"a":1}</think>')


def test_grammar_when_the_reply_may_think():
    for base in (OBJECT, HermesParser().grammar([{"name": "go"}], False, lambda text: None)):
        grammar = after_reasoning(base, "maybe")
        answer = '{"a":1}' if base is OBJECT else '<tool_call>\n{"name":"go","arguments":{}}'
        answer += "" if base is OBJECT else "\n</tool_call>"
        assert accepts(grammar, answer)  # no thinking
        assert accepts(grammar, f"\n<think>\nHm, {{ or }}.\n</think>\n\n{answer}")
        assert not accepts(grammar, f"Words first {answer}")
        assert not accepts(grammar, "<think>x</think>\nwords")


def test_tool_schemas_keep_their_refs():
    recursive = {
        "type": "object",
        "properties": {"child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["child"],
        "additionalProperties": False,
    }
    functions = [{"name": "go", "parameters": NESTED}, {"name": "tree", "parameters": recursive}]
    nested = '{"city":"Oslo","where":{"lat":1},"stops":[{"name":"a"}]}'
    for parser_class in (HermesParser, MistralParser):
        grammar = parser_class().grammar(functions, True, lambda text: None)
        if parser_class is HermesParser:
            calls = [
                f'<tool_call>\n{{"name":"go","arguments":{nested}}}\n</tool_call>',
                '<tool_call>\n{"name":"tree","arguments":{"child":{"child":null}}}\n</tool_call>',
            ]
            text = "\n".join(calls)
        else:
            text = (
                f'[TOOL_CALLS][{{"name":"go","arguments":{nested}}},'
                '{"name":"tree","arguments":{"child":{"child":null}}}]'
            )
        assert accepts(grammar, text), parser_class
        assert not accepts(grammar, text.replace('"name":"a"', '"name":1'))
