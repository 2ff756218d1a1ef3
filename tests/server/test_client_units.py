"""localchat.client without a server: the one api_base rule, the Bearer header, OpenAI error bodies
and the SSE stream, through httpx's MockTransport."""

from __future__ import annotations

import json

import httpx
import pytest

from localchat.client import (
    APIConnectionError,
    APIError,
    AsyncClient,
    Client,
    ToolCall,
    api_base,
    auth_headers,
    collect,
)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("localhost:8000", "http://localhost:8000/v1"),
        ("http://h:1", "http://h:1/v1"),
        ("http://h:1/", "http://h:1/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        (" https://h/v1 ", "https://h/v1"),
        ("http://h:1/v1/chat/completions", "http://h:1/v1"),
        ("h:8000/v1/completions", "http://h:8000/v1"),
        ("http://h/openai/v1/chat/completions/", "http://h/openai/v1"),
    ],
)
def test_api_base(url, expected):
    assert api_base(url) == expected


def test_auth_headers(monkeypatch):
    monkeypatch.setenv("LOCALCHAT_API_KEY", "from-env")
    assert auth_headers("k") == {"Authorization": "Bearer k"}
    assert auth_headers(None) == {"Authorization": "Bearer from-env"}
    assert auth_headers("") == {}


def _sse(*chunks) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def test_paths_headers_and_errors_share_one_root():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization")))
        if request.url.path == "/api/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 64}]})
        if request.url.path == "/api/tokenize":
            return httpx.Response(404, text="no such route")
        return httpx.Response(
            400,
            json={
                "error": {"message": "bad top_p", "type": "invalid_request_error", "param": "top_p"}
            },
        )

    with Client(
        "http://h/api/v1/chat/completions", api_key="k", transport=httpx.MockTransport(handler)
    ) as client:
        assert client.model_cards() == [{"id": "m", "max_model_len": 64}] and client.models() == [
            "m"
        ]
        with pytest.raises(APIError) as error:
            client.tokenize("x")
        assert (error.value.status, error.value.message) == (404, "no such route")
        with pytest.raises(APIError) as error:
            client.chat([], top_p=7)
        assert (error.value.status, error.value.param) == (400, "top_p")
        assert error.value.describe() == "the server answered 400: bad top_p"
    assert [path for path, _ in seen] == [
        "/api/v1/models",
        "/api/v1/models",
        "/api/tokenize",
        "/api/v1/chat/completions",
    ]
    assert {auth for _, auth in seen} == {"Bearer k"}


async def test_async_stream_reasoning_usage_and_error_chunks():
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert (
            body["stream"]
            and body["stream_options"] == {"include_usage": True}
            and body["model"] == "m"
        )
        if body["messages"][0]["content"] == "fail":
            return httpx.Response(
                200, content=_sse({"error": {"message": "engine died", "code": 503}})
            )
        return httpx.Response(
            200,
            content=_sse(
                {
                    "choices": [
                        {"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": None}
                    ]
                },
                {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 5,
                        "completion_tokens": 2,
                        "total_tokens": 7,
                        "prompt_tokens_details": {"cached_tokens": 4},
                    },
                },
            ),
        )

    async with AsyncClient("http://h", model="m", transport=httpx.MockTransport(handler)) as client:
        deltas = [d async for d in client.chat([{"role": "user", "content": "q"}], stream=True)]
        assert [(d.reasoning, d.text, d.finish_reason) for d in deltas[:2]] == [
            ("hmm", "", None),
            ("", "Hi", "stop"),
        ]
        assert deltas[2].usage.cached_tokens == 4 and deltas[2].usage.completion_tokens == 2
        with pytest.raises(APIError) as error:
            [d async for d in client.chat([{"role": "user", "content": "fail"}], stream=True)]
        assert (error.value.status, error.value.message) == (503, "engine died")


async def test_unreachable_server_is_an_api_connection_error():
    async with AsyncClient("http://127.0.0.1:9", timeout=2.0) as client:
        assert await client.health() is False
        with pytest.raises(APIConnectionError, match=r"cannot reach http://127\.0\.0\.1:9"):
            await client.models()
        with pytest.raises(APIConnectionError):
            [d async for d in client.complete("x", stream=True)]


def _call_piece(index, arguments, call_id=None, name=None):
    piece = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        piece.update(id=call_id, type="function")
        piece["function"]["name"] = name
    return piece


def test_tool_calls_whole_and_assembled_from_a_stream():
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    whole = {
        "choices": [
            {"index": 1, "message": {"content": "hi"}, "finish_reason": "stop"},
            {
                "index": 0,
                "message": {"content": None, "tool_calls": calls, "reasoning_content": "hm"},
                "finish_reason": "tool_calls",
            },
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }

    def choice(index, delta, finish=None):
        return {"choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    chunks = [
        choice(0, {"role": "assistant", "content": "", "reasoning_content": "hm"}),
        choice(1, {"content": "hi"}, "stop"),
        choice(0, {"tool_calls": [_call_piece(0, "", "a", "f")]}),
        choice(0, {"tool_calls": [_call_piece(0, '{"x"')]}),
        choice(0, {"tool_calls": [_call_piece(0, ": 1}"), _call_piece(1, "{}", "b", "g")]}),
        choice(0, {}, "tool_calls"),
        {"choices": [], "usage": whole["usage"]},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["stream"]:
            return httpx.Response(200, content=_sse(*chunks))
        return httpx.Response(200, json=whole)

    with Client("http://h", transport=httpx.MockTransport(handler)) as client:
        reply = client.chat([{"role": "user", "content": "q"}], n=2)
        deltas = list(client.chat([{"role": "user", "content": "q"}], n=2, stream=True))
    streamed = collect(deltas)
    for completion in (reply, streamed):
        assert completion.texts == ["", "hi"] and completion.reasoning == "hm"
        assert completion.finish_reasons == ["tool_calls", "stop"]
        assert completion.tool_calls == [ToolCall("a", "f", '{"x": 1}'), ToolCall("b", "g", "{}")]
        assert completion.tool_calls_per_choice[1] == []
        assert completion.tool_calls[0].parsed_arguments() == {"x": 1}
        assert completion.usage.total_tokens == 7
    assert [p.index for d in deltas for p in d.tool_calls] == [0, 0, 0, 1]
