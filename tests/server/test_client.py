"""localchat.client against the real server: Client and AsyncClient, plain and streamed, and
errors."""

from __future__ import annotations

import jsonschema
import pytest

from localchat.client import (
    APIError,
    AsyncClient,
    Client,
    Delta,
    ToolCall,
    ToolCallDelta,
    acollect,
    collect,
)

from .conftest import API_KEY, MAX_MODEL_LEN

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Say hello."}]


def test_client(base_url):
    with Client(base_url, api_key=API_KEY) as client:
        assert client.health() is True
        assert len(client.models()) == 1
        first = client.chat(MESSAGES, max_tokens=6, temperature=0)
        assert first.text and first.finish_reason in ("stop", "length")
        # the streamed request below finds the prompt in the prefix cache; the uncached tail of a
        # quantized model's prompt rounds differently from a full prefill (a near-tie can flip), so
        # compare against a non-streamed reply made from the same cache state
        reply = client.chat(MESSAGES, max_tokens=6, temperature=0)
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        deltas = list(client.chat(MESSAGES, stream=True, max_tokens=6, temperature=0))
        assert all(isinstance(d, Delta) for d in deltas)
        assert "".join(d.text for d in deltas) == reply.text
        assert (
            deltas[-1].usage is not None
            and deltas[-1].usage.completion_tokens == reply.usage.completion_tokens
        )
        assert [d.finish_reason for d in deltas if d.finish_reason] == [reply.finish_reason]
        completion = client.complete("The sky is", max_tokens=3, temperature=0)
        streamed = "".join(
            d.text for d in client.complete("The sky is", stream=True, max_tokens=3, temperature=0)
        )
        assert completion.text == streamed
        tokens = client.tokenize("Hello world")
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
        assert client.detokenize(tokens["tokens"]) == "Hello world"
        assert client.tokenize(messages=MESSAGES)["count"] > tokens["count"]
        with pytest.raises(APIError) as error:
            client.chat(MESSAGES, temperature=-1)
        assert error.value.status == 400 and "temperature" in error.value.message
        with pytest.raises(APIError) as error:
            list(client.chat(MESSAGES, stream=True, model="other"))
        assert error.value.status == 404
    with Client(base_url, api_key="wrong") as client, pytest.raises(APIError) as error:
        client.models()
    assert error.value.status == 401
    with Client("http://127.0.0.1:9") as client:
        assert client.health() is False


async def test_async_client(base_url):
    async with AsyncClient(base_url, api_key=API_KEY) as client:
        assert await client.health() is True
        assert len(await client.models()) == 1
        reply = await client.chat(MESSAGES, max_tokens=5, temperature=0)
        texts = [
            d.text async for d in client.chat(MESSAGES, stream=True, max_tokens=5, temperature=0)
        ]
        assert "".join(texts) == reply.text
        completion = await client.complete("Hello", max_tokens=3, n=2, seed=3, temperature=0.7)
        assert len(completion.texts) == 2
        assert (await client.tokenize("Hi"))["count"] >= 1
        with pytest.raises(APIError) as error:
            await client.complete("x", logprobs=99)
        assert error.value.status == 400 and error.value.param == "logprobs"


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = dict(
    tools=TOOLS,
    tool_choice="required",
    parallel_tool_calls=False,
    max_tokens=100,
    temperature=0.7,
    seed=4,
)


def test_tool_calls_whole_and_streamed(base_url):
    with Client(base_url, api_key=API_KEY) as client:
        reply = client.chat(ASK, **FORCED)
        assert reply.finish_reason == "tool_calls" and reply.text == ""
        assert [c.name for c in reply.tool_calls] == ["get_weather"]
        call = reply.tool_calls[0]
        assert (
            isinstance(call, ToolCall) and call.type == "function" and call.id.startswith("call_")
        )
        jsonschema.validate(call.parsed_arguments(), WEATHER)
        deltas = list(client.chat(ASK, stream=True, **FORCED))
        pieces = [p for d in deltas for p in d.tool_calls]
        assert all(isinstance(p, ToolCallDelta) for p in pieces) and len(pieces) > 2
        streamed = collect(deltas)
        assert streamed.finish_reason == "tool_calls" and streamed.usage.completion_tokens > 0
        assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(call.name, call.arguments)]
        assert streamed.tool_calls[0].id.startswith("call_")


async def test_async_tool_calls_streamed(base_url):
    async with AsyncClient(base_url, api_key=API_KEY) as client:
        reply = await client.chat(ASK, **FORCED)
        streamed = await acollect(client.chat(ASK, stream=True, **FORCED))
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [
        (c.name, c.arguments) for c in reply.tool_calls
    ]
    jsonschema.validate(streamed.tool_calls[0].parsed_arguments(), WEATHER)
