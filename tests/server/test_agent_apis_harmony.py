"""gpt-oss's harmony format through /v1/messages and /v1/responses: the gpt-oss bigram model of
tests/chat_families.py (unsteered, it thinks " hmm" on the analysis channel; a grammar takes it to
a call of get_weather with {"city":"Paris"}, or to the answer {"ok":true}) behind a real server
that picks the harmony parsers from its chat template. The analysis channel is a thinking block /
a reasoning item, a call to a function a tool_use block / a function_call item; a conversation
sent back renders as the chat completion of the same conversation does."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.chat_families import save_harmony_bigram
from tests.serve_process import serve_process

pytestmark = pytest.mark.slow

MODEL = "gpt-oss-bigram"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
OK = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
ASK = "Weather in Paris?"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    directory = save_harmony_bigram(tmp_path_factory.mktemp("gpt-oss-bigram"))
    log = tmp_path_factory.mktemp("harmony-agents") / "serve.log"
    args = [str(directory), "--served-model-name", MODEL, "--max-model-len", "2048"]
    args += ["--kv-cache-memory", "64MiB", "--threads", "1"]
    with serve_process(log, *args, timeout=600) as server:
        yield server.base_url


def _tokens(base_url: str, messages: list[dict], tools: list[dict]) -> int:
    return httpx.post(f"{base_url}/tokenize", json={"messages": messages, "tools": tools}).json()[
        "count"
    ]


def _chat_turn(call_id: str, arguments: str) -> list[dict]:
    """The chat completion's messages of ASK, the call after thinking " hmm", and its result."""
    call = {"name": "get_weather", "arguments": arguments}
    return [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": " hmm",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": '{"sunny": true}'},
    ]


CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def test_a_forced_tool_use_after_thinking(base_url):
    import anthropic

    claude = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    fields = {
        "model": MODEL,
        "max_tokens": 40,
        "messages": [{"role": "user", "content": ASK}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER}],
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    whole = claude.messages.create(**fields)
    with claude.messages.stream(**fields) as stream:
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert message.stop_reason == "tool_use"
        thinking, call = message.content
        assert (thinking.type, thinking.thinking) == ("thinking", " hmm")
        assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    # sent back, the turn renders as the chat completion of the same conversation
    result = {"type": "tool_result", "tool_use_id": call.id, "content": '{"sunny": true}'}
    conversation = [
        *fields["messages"],
        {"role": "assistant", "content": [block.model_dump() for block in whole.content]},
        {"role": "user", "content": [result]},
    ]
    counted = claude.messages.count_tokens(
        model=MODEL, messages=conversation, tools=fields["tools"]
    ).input_tokens
    chat = _chat_turn(call.id, json.dumps(call.input))
    assert counted == _tokens(base_url, chat, CHAT_TOOLS)


def test_a_forced_function_call_after_reasoning(base_url):
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=120)
    fields = {
        "model": MODEL,
        "input": ASK,
        "max_output_tokens": 40,
        "temperature": 0,
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        "tool_choice": "required",
    }
    whole = client.responses.create(**fields)
    with client.responses.stream(**fields) as stream:
        reasoning_deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        streamed = stream.get_final_response()
    for response in (whole, streamed):
        reasoning, call = response.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == " hmm"
        assert (call.type, call.name, call.arguments) == (
            "function_call",
            "get_weather",
            '{"city":"Paris"}',
        )
        assert response.usage.output_tokens_details.reasoning_tokens >= 1
    assert "".join(reasoning_deltas) == " hmm"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sunny": true}'}
    second = client.responses.create(
        **{**fields, "tool_choice": "auto", "max_output_tokens": 4, "input": [output]},
        previous_response_id=whole.id,
    )
    chat = _chat_turn(whole.output[1].call_id, '{"city":"Paris"}')
    assert second.usage.input_tokens == _tokens(base_url, chat, CHAT_TOOLS)
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_a_json_answer_after_reasoning(base_url):
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=120)
    text = {"format": {"type": "json_schema", "name": "ok", "schema": OK}}
    response = client.responses.create(
        model=MODEL, input=ASK, max_output_tokens=40, temperature=0, text=text
    )
    reasoning, message = response.output
    assert reasoning.content[0].text == " hmm"
    assert (message.type, response.output_text, response.status) == (
        "message",
        '{"ok":true}',
        "completed",
    )
