"""Raw SSE over httpx: the wire format, concurrency, client disconnects and the waiting-queue
bound."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from .conftest import API_KEY, MAX_NUM_SEQS, MAX_WAITING

pytestmark = pytest.mark.slow
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _events(response: httpx.Response) -> list:
    """The decoded `data:` payloads of an SSE response; the last one is the literal [DONE]."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


def test_sse_wire_format(http):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    assert len({c["id"] for c in [*chunks, usage_chunk]}) == 1
    assert [c["choices"][0]["finish_reason"] is not None for c in chunks] == [False] * (
        len(chunks) - 1
    ) + [True]
    assert usage_chunk["choices"] == [] and set(usage_chunk["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    # without include_usage: no usage key at all, still [DONE]
    with http.stream(
        "POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": True}
    ) as response:
        events = _events(response)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


def _chat_body(position: int) -> dict:
    return {
        "messages": [{"role": "user", "content": f"Count to {position}."}],
        "max_tokens": 6,
        "temperature": 0,
    }


async def _stream_one(client: httpx.AsyncClient, position: int) -> tuple[str, str | None]:
    body = {**_chat_body(position), "stream": True}
    text, finish = "", None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
            elif line == "data: [DONE]":
                return text, finish
    raise AssertionError("the stream ended without [DONE]")


async def test_16_concurrent_streams_equal_their_solo_runs(http, base_url, wait_idle):
    solo = []
    for position in range(16):
        choice = http.post("/v1/chat/completions", json=_chat_body(position)).json()["choices"][0]
        solo.append((choice["message"]["content"], choice["finish_reason"]))
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=120) as client:
        results = await asyncio.gather(*(_stream_one(client, i) for i in range(16)))
    assert results == solo and all(text for text, _ in results)
    wait_idle()


# Far more tokens than the test needs to see: the request is still running when the client hangs up,
# on any machine (the server's context is 1024 tokens).
LONG = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}
ABORTED = 'localchat_request_success_total{finished_reason="abort"}'


def test_stream_disconnect_aborts(base_url, metrics, wait_idle):
    aborted_before = metrics()[ABORTED]
    generated_before = metrics()["localchat_generation_tokens_total"]
    with (
        httpx.Client(base_url=base_url, headers=AUTH, timeout=60) as client,
        client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # one chunk, then hang up
    after = wait_idle(timeout=10)
    assert after[ABORTED] == aborted_before + 1
    assert after["localchat_generation_tokens_total"] - generated_before < LONG["max_tokens"]
    assert after["localchat_kv_cache_usage_perc"] == 0


async def test_non_streamed_disconnect_aborts(base_url, metrics, wait_idle):
    aborted_before = metrics()[ABORTED]
    generated_before = metrics()["localchat_generation_tokens_total"]
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as client:
        request = asyncio.create_task(client.post("/v1/completions", json=LONG))
        deadline = time.monotonic() + 30
        while metrics()["localchat_generation_tokens_total"] == generated_before:  # it has started
            assert time.monotonic() < deadline and not request.done(), metrics()
            await asyncio.sleep(0.02)
        request.cancel()  # hang up before the whole answer exists
        with pytest.raises(asyncio.CancelledError):
            await request
    after = wait_idle(timeout=10)
    assert after[ABORTED] == aborted_before + 1
    assert after["localchat_generation_tokens_total"] - generated_before < LONG["max_tokens"]
    assert after["localchat_kv_cache_usage_perc"] == 0


async def test_waiting_queue_bound_gives_503(base_url, metrics, wait_idle):
    """Fill the batch and the waiting queue, then one more request is refused with 503 and
    Retry-After."""
    body = {"prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True, "stream": True}
    started = asyncio.Event()

    async def hold(client: httpx.AsyncClient):
        async with client.stream("POST", "/v1/completions", json=body) as response:
            started.set()
            async for _ in response.aiter_lines():
                pass

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(
        base_url=base_url, headers=AUTH, timeout=60, limits=limits
    ) as client:
        holders = [asyncio.create_task(hold(client)) for _ in range(MAX_NUM_SEQS + MAX_WAITING + 2)]
        try:
            deadline = time.monotonic() + 30
            while metrics()["localchat_num_requests_waiting"] < MAX_WAITING:
                assert time.monotonic() < deadline, metrics()
                await asyncio.sleep(0.05)
            response = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert response.status_code == 503
            assert response.headers["retry-after"].isdigit()
            assert response.json()["error"]["type"] == "service_unavailable"
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
    wait_idle(timeout=10)
