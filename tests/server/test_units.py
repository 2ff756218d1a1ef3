"""Fast tests without a model: the app over a scripted fake engine (engine failures), and pure
helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from litestar.testing import AsyncTestClient

from localchat.client import APIError, _deltas
from localchat.engine.core.outputs import CompletionOutput, RequestOutput
from localchat.engine.loading.model_info import ModelInfo
from localchat.errors import EngineDeadError, InvalidParameterError
from localchat.server.app import build_app
from localchat.server.metrics import Histogram
from localchat.server.routes_completions import parse_prompts
from localchat.server.state import ServerState


class FakeStream:
    """Yields scripted deltas, then raises `error` if one is given."""

    def __init__(self, request_id, deltas, error=None):
        self.request_id, self.deltas, self.error = request_id, deltas, error
        self.prompt_token_ids = [1, 2, 3]
        self.closed = False

    async def _iterate(self):
        for delta in self.deltas:
            yield delta
        if self.error is not None:
            raise self.error

    def __aiter__(self):
        return self._iterate()

    async def aclose(self):
        self.closed = True


class FakeEngine:
    """Enough of AsyncEngine for the app: every request says "Hi" then fails if `fail` is set."""

    tokenizer, chat_template, is_ready, is_dead, error = None, None, True, False, None
    model_info = ModelInfo(
        name="fake",
        source_kind="hf_dir",
        source_path=Path("fake"),
        config_dir=Path("fake"),
        load_format="dummy",
        vocab_size=64,
        max_model_len=64,
        dtype=torch.float32,
        device="cpu",
        eos_token_ids=(0,),
    )

    def __init__(self, fail: bool):
        self.fail = fail
        self.streams = []

    async def add_request(self, prompt, params, request_id):
        delta = RequestOutput(request_id, None, [1, 2, 3], [CompletionOutput(0, "Hi", [7])])
        error = EngineDeadError("the engine stopped after an error: boom") if self.fail else None
        finished = RequestOutput(
            request_id,
            None,
            [1, 2, 3],
            [CompletionOutput(0, "!", [8], None, "stop")],
            finished=True,
        )
        stream = FakeStream(request_id, [delta] if self.fail else [delta, finished], error)
        self.streams.append(stream)
        return stream

    def render_chat(self, messages, **kwargs):
        return [1, 2, 3]

    def stats(self):
        return None

    def replica_metrics(self):
        return ()


def _client(fail: bool) -> tuple[AsyncTestClient, FakeEngine]:
    engine = FakeEngine(fail)
    return AsyncTestClient(app=build_app(ServerState(engine, "fake"))), engine


async def test_engine_error_mid_stream_sends_error_chunk_then_done():
    client, engine = _client(fail=True)
    async with client:
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "stream": True},
        )
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}
    assert (
        json.loads(events[1])["error"]["code"] == 503
        and "boom" in json.loads(events[1])["error"]["message"]
    )
    assert events[2] == "[DONE]" and len(events) == 3
    assert engine.streams[0].closed


async def test_engine_error_without_stream_is_503():
    client, _ = _client(fail=True)
    async with client:
        response = await client.post("/v1/completions", json={"prompt": "x"})
    assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable"


async def test_whole_answer_from_deltas():
    client, _ = _client(fail=False)
    async with client:
        body = (
            await client.post("/v1/completions", json={"prompt": ["a", "b"], "echo": True})
        ).json()
    assert [c["text"] for c in body["choices"]] == ["aHi!", "bHi!"]
    assert body["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 4,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_parse_prompts():
    assert parse_prompts("hi") == ["hi"]
    assert parse_prompts([1, 2]) == [[1, 2]]
    assert parse_prompts(["a", "b"]) == ["a", "b"]
    assert parse_prompts([[1], [2, 3]]) == [[1], [2, 3]]
    for bad in ([], [True], [[1], "a"], [[]], [1.5]):
        with pytest.raises(InvalidParameterError):
            parse_prompts(bad)


def test_histogram_buckets_are_cumulative():
    histogram = Histogram("h", "doc", (0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    [sample_family] = [histogram.family()]
    buckets = {s.labels["le"]: s.value for s in sample_family.samples if s.name == "h_bucket"}
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}


def test_client_parses_sse_lines():
    assert _deltas("data: [DONE]") is None
    assert _deltas(": keep-alive") == []
    [delta] = _deltas(
        'data: {"choices": [{"index": 1, "delta": {"content": "a"}, "finish_reason": "stop"}]}'
    )
    assert (delta.text, delta.index, delta.finish_reason) == ("a", 1, "stop")
    [usage] = _deltas(
        'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, '
        '"total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}}'
    )
    assert usage.usage.cached_tokens == 1 and usage.text == ""
    with pytest.raises(APIError) as error:
        _deltas('data: {"error": {"message": "boom", "type": "service_unavailable", "code": 503}}')
    assert error.value.status == 503


async def test_cors_origin():
    app = build_app(ServerState(FakeEngine(fail=False), "fake"), cors_origins=["https://app.test"])
    async with AsyncTestClient(app=app) as client:
        response = await client.options(
            "/v1/models",
            headers={
                "Origin": "https://app.test",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
    assert response.status_code in (200, 204)
    assert response.headers["access-control-allow-origin"] == "https://app.test"
