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


def _ask(**fields) -> dict:
    """The keyword arguments of a chat request: ASK with TOOLS to the served model, and `fields`
    (which may replace any of them)."""
    return {"model": MODEL, "messages": ASK, "tools": TOOLS, **fields}


def _named(name: str) -> dict:
    """tool_choice forcing the function `name`."""
    return {"type": "function", "function": {"name": name}}


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


REQUIRED = {"tool_choice": "required", "max_tokens": 120, "temperature": 0.7, "seed": 11}
NAMED = {"tool_choice": _named("get_time"), "max_tokens": 80, "temperature": 0}


@pytest.mark.parametrize(
    "fields, count, name",
    [
        pytest.param({**REQUIRED, "parallel_tool_calls": False}, 1, None, id="required"),
        pytest.param({**REQUIRED, "parallel_tool_calls": True}, None, None, id="parallel"),
        pytest.param(NAMED, 1, "get_time", id="named"),
    ],
)
def test_forced_calls_are_valid(openai_client, fields, count, name):
    """tool_choice required (one call, or parallel ones) or naming a function: the reply is valid
    calls, `count` of them where it is given, all to `name` where it is given."""
    choice = openai_client.chat.completions.create(**_ask(**fields)).choices[0]
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls"
    _check_calls(calls)
    if count is not None:
        assert len(calls) == count
    if name is not None:
        assert {c.function.name for c in calls} == {name}


def _streamed_calls(stream) -> tuple[dict[int, dict], list]:
    """Calls assembled from a chat stream as the openai client's users do, with each call's
    argument fragments, and the finish reasons."""
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasons.append(chunk.choices[0].finish_reason)
        for piece in delta.tool_calls or []:
            call = calls.setdefault(
                piece.index, {"id": None, "name": "", "arguments": "", "fragments": []}
            )
            if piece.id is not None:  # the first piece of a call: id, type and the whole name
                assert call["id"] is None and piece.type == "function" and piece.function.name
            call["id"] = call["id"] or piece.id
            call["name"] += piece.function.name or ""
            if piece.function.arguments:
                call["fragments"].append(piece.function.arguments)
            call["arguments"] += piece.function.arguments or ""
    return calls, reasons


def _check_streamed(calls: dict[int, dict]) -> None:
    assert calls and sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        assert call["id"] and len(call["fragments"]) > 1, call  # token by token
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_required_streamed_assembles_like_whole(openai_client):
    kwargs = _ask(tool_choice="required", parallel_tool_calls=False, max_tokens=120)
    whole = openai_client.chat.completions.create(**kwargs, temperature=0).choices[0]
    stream = openai_client.chat.completions.create(**kwargs, temperature=0, stream=True)
    calls, reasons = _streamed_calls(stream)
    assert [r for r in reasons if r] == ["tool_calls"]
    _check_streamed(calls)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls
    ]


@pytest.mark.parametrize(
    "tool_choice", ["required", _named("get_weather")], ids=["required", "named"]
)
def test_streamed_arguments_come_token_by_token(openai_client, tool_choice):
    kwargs = _ask(tool_choice=tool_choice, max_tokens=200, temperature=0.8, seed=5)
    calls, _ = _streamed_calls(openai_client.chat.completions.create(**kwargs, stream=True))
    _check_streamed(calls)
    if tool_choice != "required":
        assert [c["name"] for c in calls.values()] == ["get_weather"]
    # the openai client's own stream helper assembles the same calls
    with openai_client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    _check_calls(final.message.tool_calls)


def test_parallel_calls_stream_with_indexes(openai_client, http):
    # the end of the reply banned, the grammar has the model call again and again
    ends = [
        http.post("/tokenize", json={"prompt": t, "add_special_tokens": False}).json()["tokens"]
        for t in ("<|im_end|>", "<|endoftext|>")
    ]
    stream = openai_client.chat.completions.create(
        **_ask(
            messages=[{"role": "user", "content": "Weather in Paris, and the time in Tokyo?"}],
            tool_choice="required",
            max_tokens=160,
            temperature=0,
            logit_bias={str(token[0]): -100 for token in ends if len(token) == 1},
            stream=True,
        )
    )
    calls, reasons = _streamed_calls(stream)
    assert reasons[-1] == "length" and len(calls) >= 3
    _check_streamed({i: calls[i] for i in range(len(calls) - 1)})  # the last one is cut off
    assert len({c["id"] for c in calls.values()}) == len(calls)


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
def test_tool_choice_none_and_auto_answer_in_text(openai_client, tool_choice):
    reply = openai_client.chat.completions.create(
        **_ask(tool_choice=tool_choice, max_tokens=16, temperature=0)
    )
    message = reply.choices[0].message
    assert message.content and not message.tool_calls
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_strict_tool_schema(openai_client, http):
    """strict: the call's arguments take no property the schema does not name (the schema says
    nothing of others; it requires its one property, as strict mode asks); a schema strict mode
    cannot take is a 400 naming the param."""
    loose = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"],
    }
    tool = {"type": "function", "function": {"name": "where", "parameters": loose, "strict": True}}
    for seed in range(3):
        reply = openai_client.chat.completions.create(
            **_ask(
                tools=[tool],
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=60,
                temperature=1.0,
                seed=seed,
            )
        )
        arguments = json.loads(reply.choices[0].message.tool_calls[0].function.arguments)
        assert set(arguments) == {"city"}
    open_ended = {**loose, "additionalProperties": True}
    for parameters in (open_ended, {"type": "array"}):
        function = {"name": "where", "parameters": parameters, "strict": True}
        response = http.post(
            "/v1/chat/completions",
            json={"messages": ASK, "tools": [{"type": "function", "function": function}]},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tools" and "tools[0].function.parameters" in error["message"]


def test_pydantic_tool_with_a_nested_model(openai_client):
    """openai.pydantic_function_tool: a strict schema whose nested model is a $ref into $defs;
    parse() gives the call's arguments back as the model."""
    import openai
    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: str = Field(max_length=16)

    class Trip(BaseModel):
        start: Place
        end: Place

    tool = openai.pydantic_function_tool(Trip)
    assert "$defs" in tool["function"]["parameters"]
    reply = openai_client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Plan a trip from Paris to Rome."}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "Trip"}},
        max_tokens=80,
        temperature=0,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Trip)


def test_a_tool_result_round_trips_on_the_default_model(openai_client):
    """The assistant's call message sent back as the openai client returns it (`content: None`)
    renders with the default model's template, which adds `message['content']` to a string."""
    reply = openai_client.chat.completions.create(**_ask(**NAMED))
    message = reply.choices[0].message
    assert message.content is None and message.tool_calls
    call = message.tool_calls[0]
    messages = [
        *ASK,
        message.model_dump(exclude_none=False),
        {"role": "tool", "tool_call_id": call.id, "content": '{"zone": "CET"}'},
    ]
    answer = openai_client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content
