"""Data-parallel failure handling on a real DP=2 server (the default model, small KV pools): the
router learns the replicas' evictions, and a request whose replica dies before accepting it is
retried on the other one."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.engine.distributed.test_data_parallel import _metrics, _per_replica, _replica_pids
from tests.serve_process import ServeProcess, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# 8 MiB holds 22 blocks of 16 tokens (the default model's KV pool is float16): two prompts of 200
# tokens evict a replica's older blocks
ARGS = ("-dp", "2", "--threads", "1", "--kv-cache-memory", "8MiB", "--max-model-len", "256")
POOL_BLOCKS = 22


@pytest.fixture(scope="module")
def server(default_gguf, tmp_path_factory):
    """One DP=2 server for the module; the last test kills a replica."""
    with serve_process(tmp_path_factory.mktemp("dp") / "serve.log", *ARGS) as process:
        yield process


def _prompt(words: int, seed: int) -> list[int]:
    """`words` token ids no other prompt of the test starts with."""
    return [1000 + seed * 7] + [(seed * 131 + i * 17) % 40000 + 2000 for i in range(words - 1)]


def _complete(server: ServeProcess, prompt: list[int]) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)


def _routed(server: ServeProcess) -> dict[str, float]:
    series = _metrics(server)["localchat_replica_routed_requests_total"]
    totals = {"prefix": 0.0, "load": 0.0}
    for labels, value in series.items():
        totals[dict(labels)["route"]] += value
    return totals


def _serving_replica(server: ServeProcess, prompt: list[int]) -> str:
    """Run `prompt`; the replica whose prompt-token count moved."""
    before = _per_replica(_metrics(server), "prompt_tokens_total")
    assert _complete(server, prompt).status_code == 200
    after = _per_replica(_metrics(server), "prompt_tokens_total")
    moved = [r for r in after if after[r] != before[r]]
    assert len(moved) == 1, (before, after)
    return moved[0]


def test_a_prefix_the_replica_evicted_no_longer_routes_by_prefix(server):
    conversation = _prompt(100, seed=1)
    holder = _serving_replica(server, conversation)
    before = _routed(server)
    assert _serving_replica(server, conversation) == holder  # cached there: routed by prefix
    assert _routed(server)["prefix"] == before["prefix"] + 1
    for seed in range(2, 8):  # three prompts per replica, each 13 blocks: the pools turn over
        assert _complete(server, _prompt(200, seed)).status_code == 200
    # the router has sent the holder 6 + 3 x 12 full blocks, more than its 22; the replicas report
    # what they evict at most once a second: wait for the report that brings it back within them
    deadline = time.monotonic() + 30
    while (held := _per_replica(_metrics(server), "prefix_blocks")[holder]) > POOL_BLOCKS:
        assert time.monotonic() < deadline, f"the router still counts {held} blocks at {holder}"
        time.sleep(0.1)
    before = _routed(server)
    assert _complete(server, conversation).status_code == 200
    after = _routed(server)
    assert after["prefix"] == before["prefix"], "routed to a replica that evicted the prefix"
    assert after["load"] == before["load"] + 1


def test_a_request_whose_replica_dies_before_accepting_it_runs_on_the_other(server):
    pids = _replica_pids(server)
    assert set(pids) == {"0", "1"}
    prompt = _prompt(60, seed=20)
    holder = _serving_replica(server, prompt)
    other = "1" if holder == "0" else "0"
    os.kill(pids[holder], signal.SIGSTOP)  # it cannot read its commands now
    replies: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: replies.append(_complete(server, prompt)))
    before = _per_replica(_metrics(server), "prompt_tokens_total")
    thread.start()
    deadline = time.monotonic() + 10
    # routed by its prefix to the stopped replica, where it waits unaccepted
    while _per_replica(_metrics(server), "requests_in_flight")[holder] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(pids[holder], signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert replies[0].status_code == 200, replies[0].text
    after = _per_replica(_metrics(server), "prompt_tokens_total")
    assert after[other] > before[other]  # the other replica ran it
    assert f"data-parallel replica {holder} failed before accepting it; retried on {other}" in (
        server.log()
    )
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 503
