"""Anthropic's Messages API through the official `anthropic` SDK against the real server of
tests/server/conftest.py (the default model; no server of its own): whole and streamed replies,
tool use forced by the grammar (so even the 135M model's input matches the schema), tool results
sent back, stop reasons, prefix-cache reads, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from .conftest import API_KEY
from .test_tool_calls import TIME, WEATHER

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOOLS = [
    {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "description": "The time in a zone", "input_schema": TIME},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the SDK sends sampling fields as extra body fields


@pytest.fixture(scope="module")
def claude(base_url):
    import anthropic

    return anthropic.Anthropic(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=120)


def _ask(**fields) -> dict:
    return {"model": MODEL, "max_tokens": 24, "messages": ASK, "extra_body": GREEDY, **fields}


def test_a_message(claude):
    message = claude.messages.create(**_ask())
    assert message.id.startswith("msg_") and (message.type, message.role) == (
        "message",
        "assistant",
    )
    assert message.model == MODEL
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    usage = message.usage
    assert 1 <= usage.output_tokens <= 24 and usage.cache_creation_input_tokens == 0
    counted = claude.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    assert counted == usage.input_tokens + usage.cache_read_input_tokens


def test_a_streamed_message(claude, http):
    with claude.messages.stream(**_ask()) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text and message.content[0].text == text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens >= 1
    # the wire: event lines, in Anthropic's order
    body = {"model": MODEL, "max_tokens": 8, "messages": ASK, "stream": True}
    with http.stream("POST", "/v1/messages", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("event: ")]
    names = [line[7:] for line in lines]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_tool_use_forced_by_the_grammar(claude, tool_choice):
    fields = _ask(
        tools=TOOLS,
        tool_choice={**tool_choice, "disable_parallel_tool_use": True},
        max_tokens=80,
    )
    whole = claude.messages.create(**fields)
    with claude.messages.stream(**fields) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use", message
        (block,) = [b for b in message.content if b.type == "tool_use"]
        assert block.id and block.name in SCHEMAS
        jsonschema.validate(block.input, SCHEMAS[block.name])
        if tool_choice["type"] == "tool":
            assert block.name == "get_time"


def test_a_tool_result_goes_back_through_the_template(claude, http):
    first = claude.messages.create(**_ask(tools=TOOLS, tool_choice={"type": "any"}, max_tokens=80))
    call = next(block for block in first.content if block.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}
    conversation = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [result]},
    ]
    answer = claude.messages.create(**_ask(messages=conversation, tools=TOOLS))
    assert answer.content[0].type == "text" and answer.content[0].text
    # the same prompt as the chat completion of the same conversation
    counted = claude.messages.count_tokens(model=MODEL, messages=conversation, tools=TOOLS)
    chat_tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in TOOLS
    ]
    arguments = json.dumps(call.input)
    chat = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    tokens = http.post("/tokenize", json={"messages": chat, "tools": chat_tools}).json()["count"]
    assert counted.input_tokens == tokens
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == tokens


def test_the_prefix_cache_is_read(claude):
    system = "You are a terse assistant who answers questions about the weather in one line."
    claude.messages.create(**_ask(system=system, max_tokens=4))
    again = claude.messages.create(**_ask(system=system, max_tokens=4))
    assert again.usage.cache_read_input_tokens >= 16  # at least a block of the prompt
    assert (
        again.usage.input_tokens
        < claude.messages.count_tokens(model=MODEL, messages=ASK, system=system).input_tokens
    )


def test_stop_reasons(claude):
    stopped = claude.messages.create(**_ask(stop_sequences=["e"], max_tokens=40))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "e")
    assert "e" not in stopped.content[0].text
    cut = claude.messages.create(**_ask(max_tokens=1))
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 1


def test_ignore_eos_generates_every_token(claude):
    """localchat's extension: max_tokens tokens past the end of sequence (the reply to a "Say
    OK" ends within a few tokens without it)."""
    say_ok = [{"role": "user", "content": "Say OK."}]
    short = claude.messages.create(**_ask(messages=say_ok, max_tokens=200))
    assert short.stop_reason == "end_turn" and short.usage.output_tokens < 200
    full = claude.messages.create(
        **_ask(messages=say_ok, max_tokens=200, extra_body={**GREEDY, "ignore_eos": True})
    )
    assert (full.stop_reason, full.usage.output_tokens) == ("max_tokens", 200)


def test_thinking_and_metadata_are_accepted(claude):
    message = claude.messages.create(
        **_ask(
            max_tokens=2048,  # more than the context: a ceiling, the rest of it
            thinking={"type": "enabled", "budget_tokens": 1024},
            metadata={"user_id": "someone"},
            system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        )
    )
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")


def test_errors_in_anthropics_shape(claude, base_url):
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(**_ask(model="claude-opus-9"))
    assert missing.value.body["error"]["type"] == "not_found_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(**_ask(messages=[{"role": "user", "content": [image]}]))
    error = bad.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "image" in error["error"]["message"] and "messages[0].content[0]" in str(error)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude.messages.create(**_ask(max_tokens=0))
    anonymous = anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        anonymous.messages.create(**_ask())
    bearer = anthropic.Anthropic(base_url=base_url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(**_ask(max_tokens=2)).content  # Claude Code's header
    raw = httpx.post(
        f"{base_url}/v1/messages",
        json={"model": MODEL, "messages": ASK},
        headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"},
    )
    assert raw.status_code == 400 and "max_tokens" in raw.json()["error"]["message"]
