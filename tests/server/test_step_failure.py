"""A failed engine step through HTTP: the server's app and a real engine on the default model, run
by uvicorn on a free port in this process (the only way to make the engine's forward fail on
purpose: it raises when a prompt holds the tokens POISON, as in
tests/engine/core/test_step_failure.py). A streamed request that was in the failed step ends with
an error event (code 500), a whole one is a 500 in OpenAI's error shape (the official client's
InternalServerError), an embeddings call too; the server stays healthy and answers the next
requests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn

from localchat import AsyncEngine, EngineConfig
from localchat.server.app import build_asgi_app
from localchat.server.state import ServerState
from tests.engine.core.test_step_failure import POISON, poisoned

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(default_gguf) -> Iterator[str]:
    config = EngineConfig(max_model_len=512, kv_cache_memory="32MiB", num_threads=1)
    engine = asyncio.run(AsyncEngine(config, max_waiting=8).start())
    assert engine.engine is not None
    server = uvicorn.Server(
        uvicorn.Config(build_asgi_app(ServerState(engine, "m")), log_level="warning")
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        with poisoned(engine.engine):
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        asyncio.run(engine.shutdown())


def _complete(base_url: str, prompt: list[int], **body) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, **body}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)


def test_a_request_in_a_failed_step_is_a_500_and_the_server_serves_on(base_url):
    failed = _complete(base_url, [1, 2, 3, *POISON])
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "server_error" and error["code"] == 500
    assert "engine step" in error["message"] and "injected fault" in error["message"]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=120)
    with pytest.raises(openai.InternalServerError, match="engine step"):
        client.completions.create(model="m", prompt=[[4, *POISON, 5]], max_tokens=4)
    embedded = httpx.post(f"{base_url}/v1/embeddings", json={"input": [[7, 8], POISON]})
    assert embedded.status_code == 500 and "engine step" in embedded.json()["error"]["message"]

    assert httpx.get(f"{base_url}/health").status_code == 200
    served = _complete(base_url, [1, 2, 3, 4], ignore_eos=True)
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 8
    vectors = httpx.post(f"{base_url}/v1/embeddings", json={"input": [[7, 8], [9]]})
    assert vectors.status_code == 200 and len(vectors.json()["data"]) == 2


def test_a_stream_in_a_failed_step_ends_with_an_error_event(base_url):
    body = {"prompt": [5, 6, 7, *POISON], "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == 500 and "engine step" in error["message"]
    assert _complete(base_url, [5, 6, 7, 8]).status_code == 200
