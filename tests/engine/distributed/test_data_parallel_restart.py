"""A data-parallel replica that dies is started again: `localchat serve -dp 2` on the default model,
a replica killed (SIGKILL) under a stream, then again past LOCALCHAT_DP_RESTARTS."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.engine.distributed.test_data_parallel import (
    _metrics,
    _per_replica,
    _replica_pids,
    _stream_until_failure,
)
from tests.serve_process import ServeProcess, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def server(default_gguf, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("LOCALCHAT_DP_RESTARTS", "1")
    log = tmp_path_factory.mktemp("dp-restart") / "serve.log"
    args = ("-dp", "2", "--threads", "1", "--kv-cache-memory", "128MiB", "--max-model-len", "1024")
    with serve_process(log, *args) as process:
        yield process


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _health_until(server: ServeProcess, status: int, within: float) -> httpx.Response:
    deadline = time.monotonic() + within
    while (health := httpx.get(f"{server.base_url}/health", timeout=10)).status_code != status:
        assert time.monotonic() < deadline, (health.status_code, health.text, server.log()[-2000:])
        time.sleep(0.2)
    return health


def _two_streams_in_flight(server: ServeProcess) -> dict[str, float]:
    """Two long streams at once (the router sends each to the replica with less in flight), and
    the replicas' requests in flight once both have tokens: the first stream reads the metrics
    when both have 5 events, long before either can end (on a loaded host a short stream could
    end before the other began)."""
    body = {"prompt": "1, 2, 3,", "max_tokens": 200, "ignore_eos": True, "stream": True}
    flights: list[dict[str, float]] = []
    both_streaming = threading.Barrier(2, timeout=60)

    def stream(index: int) -> list[str]:
        lines = []
        with httpx.stream(
            "POST", f"{server.base_url}/v1/completions", json=body, timeout=120
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line:
                    continue
                lines.append(line)
                if len(lines) == 5:
                    both_streaming.wait()
                    if index == 0:
                        flights.append(_per_replica(_metrics(server), "requests_in_flight"))
        return lines

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(stream, range(2)))
    assert all(lines[-1] == "data: [DONE]" for lines in results)
    assert all(not any('"error"' in line for line in lines) for lines in results)
    return flights[0]


def test_a_killed_replica_is_started_again_then_left_dead_past_the_limit(server):
    pids = _replica_pids(server)
    events, _ = _stream_until_failure(server, lambda r: os.kill(pids[r], signal.SIGKILL))
    assert "failed: it exited with code -9" in events[-2] and events[-1] == "data: [DONE]"
    # the stream's replica loads again: /health is 200 once it serves, from a new process
    _health_until(server, 200, within=120)
    again = _replica_pids(server)
    assert set(again) == {"0", "1"} and again != pids
    [restarted] = [r for r in again if again[r] != pids[r]]
    assert "starting it again" in server.log()
    assert sorted(_per_replica(_metrics(server), "up").values()) == [1.0, 1.0]
    # both replicas take streams again
    assert sorted(_two_streams_in_flight(server).values()) == [1.0, 1.0]
    # killed again within ten minutes, past LOCALCHAT_DP_RESTARTS=1: it stays dead, the other
    # replica serves
    os.kill(again[restarted], signal.SIGKILL)
    health = _health_until(server, 503, within=30)
    assert "1 of 2 data-parallel replicas failed" in health.json()["detail"]
    time.sleep(2)
    assert "is not started again: it failed 2 times" in server.log()
    short = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    reply = httpx.post(f"{server.base_url}/v1/completions", json=short, timeout=60)
    assert reply.status_code == 200, reply.text
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 503
