"""Tool calls through a real server on the default model: tool_choice required and named (forced by
the grammar, so even the 135M model returns a valid call), streamed or not, parallel, none."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [False, True])
def test_required_returns_valid_calls(openai_client, parallel):
    reply = openai_client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=120,
        temperature=0.7,
        seed=11,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_required_streamed_assembles_like_whole(openai_client):
    kwargs = dict(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
    )
    whole = openai_client.chat.completions.create(**kwargs, temperature=0).choices[0]
    stream = openai_client.chat.completions.create(**kwargs, temperature=0, stream=True)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasons.append(chunk.choices[0].finish_reason)
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or piece.id
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
    assert [r for r in reasons if r] == ["tool_calls"]
    assert sorted(calls) == list(range(len(calls)))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls
    ]
    for call in calls.values():
        assert call["id"]
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_named_function_is_called(openai_client):
    reply = openai_client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=80,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    _check_calls(calls)


def test_tool_choice_none_and_auto_answer_in_text(openai_client):
    for choice in ("none", "auto"):
        reply = openai_client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=16, temperature=0
        )
        message = reply.choices[0].message
        assert message.content and not message.tool_calls
        assert reply.choices[0].finish_reason in ("stop", "length")
