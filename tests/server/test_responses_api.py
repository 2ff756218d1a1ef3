"""OpenAI's Responses API through the official `openai` SDK against a real server of its own (the
default model, responses kept in SQLite with --responses-store): whole and streamed responses
(the SDK's stream helper checks the events' order and identities), function calls forced by the
grammar, structured text, stored responses continued with previous_response_id (the prefix cache
serving the earlier turns), and errors naming this API's fields."""

from __future__ import annotations

import json
import sqlite3

import httpx
import jsonschema
import pytest

from tests.serve_process import serve_process

from .test_tool_calls import WEATHER

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER,
        "strict": True,
    }
]
# long enough that the prompt's first blocks are the same from turn to turn
INSTRUCTIONS = "You are a terse assistant. Answer questions about the weather in one short line."
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def served(default_gguf, tmp_path_factory):
    directory = tmp_path_factory.mktemp("responses")
    store = directory / "responses.sqlite"
    args = ["--max-model-len", "1024", "--kv-cache-memory", "128MiB", "--threads", "1"]
    with serve_process(
        directory / "serve.log", *args, "--responses-store", str(store), timeout=600
    ) as server:
        yield server.base_url, store


@pytest.fixture(scope="module")
def client(served):
    import openai

    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="x", max_retries=0, timeout=120)


def _ask(**fields) -> dict:
    return {
        "model": MODEL,
        "input": ASK,
        "instructions": INSTRUCTIONS,
        "max_output_tokens": 24,
        "temperature": 0,
        **fields,
    }


def test_a_response_whole_and_streamed(client):
    whole = client.responses.create(**_ask())
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.model == MODEL
    assert whole.status in ("completed", "incomplete") and whole.output_text
    (message,) = whole.output
    assert (message.type, message.role) == ("message", "assistant")
    usage = whole.usage
    assert 1 <= usage.output_tokens <= 24 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    with client.responses.stream(**_ask()) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert streamed.status in ("completed", "incomplete") and streamed.id != whole.id
    assert "".join(deltas) == streamed.output_text and len(deltas) > 1


def test_max_output_tokens_leaves_it_incomplete(client):
    cut = client.responses.create(**_ask(max_output_tokens=1))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 1 and cut.output[0].status == "incomplete"


def test_ignore_eos_generates_every_token(client):
    """localchat's extension: max_output_tokens tokens past the end of sequence (the reply to a
    "Say OK" ends within a few tokens without it)."""
    short = client.responses.create(**_ask(input="Say OK.", max_output_tokens=200))
    assert short.status == "completed" and short.usage.output_tokens < 200
    full = client.responses.create(
        **_ask(input="Say OK.", max_output_tokens=200, extra_body={"ignore_eos": True})
    )
    assert (full.status, full.usage.output_tokens) == ("incomplete", 200)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_function_calls_forced_by_the_grammar(client, tool_choice):
    fields = _ask(
        tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False, max_output_tokens=80
    )
    whole = client.responses.create(**fields)
    with client.responses.stream(**fields) as stream:
        argument_deltas = [e for e in stream if e.type == "response.function_call_arguments.delta"]
        streamed = stream.get_final_response()
    for response in (whole, streamed):
        assert response.status == "completed", response
        (call,) = [item for item in response.output if item.type == "function_call"]
        assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert "".join(e.delta for e in argument_deltas) == streamed.output[-1].arguments


def test_a_conversation_continues_from_the_store(client, served):
    first = client.responses.create(
        **_ask(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=80)
    )
    call = first.output[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    second = client.responses.create(
        **_ask(input=[output], previous_response_id=first.id, tools=TOOLS)
    )
    assert second.previous_response_id == first.id and second.output_text
    # the earlier turns came from the prefix cache
    assert second.usage.input_tokens_details.cached_tokens >= 16
    assert second.usage.input_tokens > first.usage.input_tokens
    # the same prompt as the chat completion of the whole conversation
    chat = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
    ]
    chat_tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS
    ]
    tokens = httpx.post(
        f"{served[0]}/tokenize", json={"messages": chat, "tools": chat_tools}
    ).json()["count"]
    assert second.usage.input_tokens == tokens
    third = client.responses.create(
        **_ask(input="And tomorrow?", previous_response_id=second.id, max_output_tokens=8)
    )
    cached = third.usage.input_tokens_details.cached_tokens
    assert cached >= second.usage.input_tokens_details.cached_tokens


def test_stored_responses(client, served):
    created = client.responses.create(**_ask(metadata={"run": "1"}))
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    items = client.responses.input_items.list(created.id).data
    assert [(i.type, i.role) for i in items] == [("message", "user")]
    assert items[0].content[0].text == ASK
    with sqlite3.connect(served[1]) as db:  # kept by --responses-store
        (count,) = db.execute(
            "SELECT COUNT(*) FROM responses WHERE id = ?", (created.id,)
        ).fetchone()
    assert count == 1
    client.responses.delete(created.id)
    import openai

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    unstored = client.responses.create(**_ask(store=False, max_output_tokens=2))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(**_ask(previous_response_id=unstored.id))
    assert missing.value.body["param"] == "previous_response_id"


def test_structured_text(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}}
    response = client.responses.create(**_ask(text=text, max_output_tokens=60))
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_errors_name_this_apis_fields(client):
    import openai

    cases = [
        ({"max_output_tokens": 0}, "max_output_tokens"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}},
            "text.format",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(**_ask(**fields))
        assert bad.value.body["param"] == param, bad.value.body
    with pytest.raises(openai.NotFoundError):
        client.responses.create(**_ask(model="gpt-9"))
