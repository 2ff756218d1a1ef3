"""Models, health, version, tokenize/detokenize, Prometheus metrics and the OpenAPI docs."""

from __future__ import annotations

import time

import pytest

from localchat import __version__

from .conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.slow

METRIC_NAMES = [
    "localchat_num_requests_running",
    "localchat_num_requests_waiting",
    "localchat_kv_cache_usage_perc",
    "localchat_prefix_cache_queries_total",
    "localchat_prefix_cache_hits_total",
    "localchat_prompt_tokens_total",
    "localchat_generation_tokens_total",
    'localchat_request_success_total{finished_reason="stop"}',
    'localchat_request_success_total{finished_reason="length"}',
    'localchat_request_success_total{finished_reason="abort"}',
    "localchat_time_to_first_token_seconds_count",
    "localchat_inter_token_latency_seconds_count",
    "localchat_e2e_request_latency_seconds_count",
    'localchat_e2e_request_latency_seconds_bucket{le="+Inf"}',
]


def test_models_health_version(http):
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    [model] = models["data"]
    assert model["object"] == "model" and model["id"] and model["max_model_len"] == MAX_MODEL_LEN
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/version").json() == {"version": __version__}


def test_tokenize_detokenize(http):
    result = http.post(
        "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}
    ).json()
    assert result["count"] == len(result["tokens"]) > 0 and result["max_model_len"] == MAX_MODEL_LEN
    assert "".join(result["token_strs"]) == "Hello world"
    assert http.post("/detokenize", json={"tokens": result["tokens"]}).json() == {
        "prompt": "Hello world"
    }
    chat = http.post(
        "/tokenize", json={"messages": [{"role": "user", "content": "Hello world"}]}
    ).json()
    assert chat["count"] > result["count"]
    text = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    # the generation prompt is there
    assert "Hello world" in text and text.rstrip().endswith("assistant")
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    assert (
        http.post("/tokenize", json={"messages": [{"role": "user", "content": parts}]}).json()[
            "count"
        ]
        > 0
    )


def test_metrics_exposition(http, wait_idle):
    before = wait_idle()  # the server is shared: count from here, by exactly this request's
    body = {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    usage = http.post("/v1/completions", json=body).json()["usage"]
    samples = wait_idle()
    for name in METRIC_NAMES:
        assert name in samples, name
    generated = samples["localchat_generation_tokens_total"]
    assert (
        generated - before["localchat_generation_tokens_total"] == usage["completion_tokens"] == 2
    )
    prompt = samples["localchat_prompt_tokens_total"] - before["localchat_prompt_tokens_total"]
    assert prompt == usage["prompt_tokens"] > 0
    length = 'localchat_request_success_total{finished_reason="length"}'
    assert samples[length] - before[length] == 1
    assert samples["localchat_prompt_tokens_total"] >= 1
    assert samples["localchat_time_to_first_token_seconds_count"] >= 1
    assert 0 <= samples["localchat_kv_cache_usage_perc"] <= 1
    assert (
        samples["localchat_prefix_cache_hits_total"]
        <= samples["localchat_prefix_cache_queries_total"]
    )


def test_openapi_docs(http):
    schema = http.get("/docs/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"] and "/v1/completions" in schema["paths"]


def test_one_log_line_per_request(server, http):
    def completion_lines() -> list[str]:
        return [line for line in server.log().splitlines() if '"POST /v1/completions" 200' in line]

    versions_before, completions_before = (
        server.log().count('"GET /version" 200'),
        len(completion_lines()),
    )
    for _ in range(3):
        http.get("/version")
    http.post("/v1/completions", json={"prompt": "log me", "max_tokens": 3, "ignore_eos": True})
    with http.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "log me too", "max_tokens": 2, "ignore_eos": True, "stream": True},
    ) as response:
        response.read()
    deadline = time.monotonic() + 10  # a stream's line is written once its response has been sent
    while len(completion_lines()) < completions_before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count('"GET /version" 200') == versions_before + 3
    lines = completion_lines()
    assert len(lines) == completions_before + 2
    assert "completion=3 cached=" in lines[-2] and "completion=2 cached=" in lines[-1]
