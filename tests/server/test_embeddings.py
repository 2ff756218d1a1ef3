"""/v1/embeddings through a real server on the default model: shapes, usage (also in /metrics),
base64 equal to float, the same vectors as the offline engine, and its errors; each input takes a
place of the waiting bound, and a client that disconnects aborts its call in the engine."""

from __future__ import annotations

import base64
import json
import socket
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

from tests.server.conftest import API_KEY, MAX_NUM_SEQS, MAX_WAITING
from tests.stream_timing import Answered, beside_streams

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "Paging keeps the KV cache compact.", "x"]


def _post(http, **body):
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_embeddings_shape_usage_and_encodings(http, llm):
    floats = _post(http, input=TEXTS)
    vectors = np.array([item["embedding"] for item in floats["data"]])
    assert [item["index"] for item in floats["data"]] == [0, 1, 2]
    assert vectors.shape == (3, 576)  # SmolLM2-135M's hidden size
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    ids = [llm.engine.tokenize(text) for text in TEXTS]
    assert floats["usage"] == {
        "prompt_tokens": sum(map(len, ids)),
        "total_tokens": sum(map(len, ids)),
    }
    packed = _post(http, input=TEXTS, encoding_format="base64")["data"]
    decoded = np.array([np.frombuffer(base64.b64decode(i["embedding"]), "<f4") for i in packed])
    assert np.array_equal(decoded, vectors.astype(np.float32))
    # a string alone, and token ids, give the same vectors as in the batch
    alone = _post(http, input=TEXTS[1])["data"][0]["embedding"]
    assert np.allclose(alone, vectors[1], atol=1e-4)
    by_ids = _post(http, input=ids[0])["data"][0]["embedding"]
    assert np.allclose(by_ids, vectors[0], atol=1e-4)
    offline = [v.numpy() for v in llm.engine.embed(ids, "last")]
    assert np.allclose(offline, vectors, atol=1e-4)


def test_embedding_tokens_count_in_prompt_tokens_total(http, wait_idle, metrics):
    """/metrics adds an embedding request's input tokens to localchat_prompt_tokens_total, as it
    does a generation request's prompt: by exactly its usage.prompt_tokens."""
    before = wait_idle()["localchat_prompt_tokens_total"]
    usage = _post(http, input=TEXTS)["usage"]
    assert usage["prompt_tokens"] > len(TEXTS)
    assert metrics()["localchat_prompt_tokens_total"] - before == usage["prompt_tokens"]


def test_openai_client_embeddings(openai_client):
    result = openai_client.embeddings.create(model="SmolLM2-135M-Instruct", input=TEXTS[:2])
    assert len(result.data) == 2 and len(result.data[0].embedding) == 576
    assert result.usage.prompt_tokens > 0


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": TEXTS, "dimensions": 64}, "dimensions"),
        ({"input": TEXTS, "encoding_format": "int8"}, "encoding_format"),
        ({"input": []}, "input"),
        ({"input": [[10**9]]}, "input"),
        ({"input": ""}, "input"),
        ({}, "input"),
        ({"input": ["x"] * 2049}, "input"),  # engine/sampling/request_limits.py
        # more inputs than the server runs and queues at once
        ({"input": ["x"] * (MAX_NUM_SEQS + MAX_WAITING + 1)}, "input"),
    ],
)
def test_embedding_errors(http, body, param):
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def _stream_tokens(http, prompt: str, times: list[float], answered: Answered) -> None:
    """Stream a long completion, noting when each piece of text arrives, until answered.hang_up."""
    body = {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    body["temperature"] = 0
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.monotonic())
                if answered.hang_up(times):
                    return


def test_embeddings_interleave_with_streams(http, wait_idle):
    """Embedding requests are prefilled in the scheduler's steps next to the running decodes: a
    request of about three steps' token budget (512 on the CPU), sent while three streams decode,
    is answered while every stream still has tokens to come (had it waited for the streams, it
    would come after their last), and its vectors are those it gets alone. The batches themselves
    are checked in tests/engine/core/test_embeddings.py; how long a stream waits meanwhile depends
    on the machine, and benchmarks/embeddings_beside_streams.py measures it."""
    inputs = [" ".join(f"item{i}-{j}" for j in range(70)) for i in range(4)]  # ~1400 tokens
    first = _post(http, input=inputs)
    alone = np.array([d["embedding"] for d in first["data"]])
    wait_idle()
    run = beside_streams(
        3,
        lambda i, times, answered: _stream_tokens(http, f"Story {i}:", times, answered),
        lambda: _post(http, input=inputs),
    )
    loaded = run.result
    after = [sum(t > run.end for t in times) for times in run.streams]
    assert all(after), f"tokens the streams had left once the embeddings were answered: {after}"
    vectors = np.array([d["embedding"] for d in loaded["data"]])
    assert np.allclose(vectors, alone, atol=1e-4)
    assert loaded["usage"] == first["usage"]


def _send_embeddings(base_url: str, inputs: list[list[int]]) -> socket.socket:
    """POST /v1/embeddings on a socket of its own, left unread (close it to disconnect)."""
    url = urlsplit(base_url)
    body = json.dumps({"input": inputs}).encode()
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    connection = socket.create_connection((url.hostname, url.port))
    connection.sendall(head.encode() + body)
    return connection


def test_embedding_inputs_fill_the_queue_and_a_disconnect_aborts_them(
    http, base_url, metrics, wait_idle
):
    """A call of as many inputs as the server runs and queues at once fills the queue: another
    embeddings call, or a completion, gets 503 with Retry-After. Its client hangs up: the engine
    drops the call within a few steps, where its 20,000 prompt tokens take at least 39 more steps
    of at most 512 tokens."""
    wait_idle()
    seats = MAX_NUM_SEQS + MAX_WAITING
    inputs = [[(i * 7919 + j * 31) % 40000 + 100 for j in range(1000)] for i in range(seats)]
    sent = time.monotonic()
    connection = _send_embeddings(base_url, inputs)
    try:
        deadline = sent + 120
        while metrics()["localchat_num_requests_running"] == 0:  # its first step is done
            assert time.monotonic() < deadline, "the embedding call never ran"
            time.sleep(0.02)
        first_step = time.monotonic() - sent  # no shorter than a step
        busy = metrics()
        assert busy["localchat_num_requests_running"] + busy["localchat_num_requests_waiting"] > 1
        for path, body in (
            ("/v1/embeddings", {"input": "one more"}),
            ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
        ):
            refused = http.post(path, json=body)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["type"] == "service_unavailable"
        hung_up = time.monotonic()
    finally:
        connection.close()
    wait_idle(timeout=max(10 * first_step, 10))
    assert time.monotonic() - hung_up < 5 * first_step + 1, first_step
