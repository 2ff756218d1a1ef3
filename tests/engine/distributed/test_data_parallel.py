"""`localchat serve --data-parallel-size 2` on the default model: two real replica processes behind
one server, driven through the openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve_process import ServeProcess, serve_process
from tests.stream_timing import Answered, beside_streams

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HUNG_AFTER = 20  # LOCALCHAT_DP_TIMEOUT of the server under test (8 s declared busy replicas
# hung on a slow 2-vCPU host, where the test workers and both replicas share two cores)
SUMMED = (
    "num_requests_running",
    "num_requests_waiting",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens",
    "generation_tokens",
    "num_preemptions",
)


@pytest.fixture(scope="module")
def server(default_gguf, tmp_path_factory):
    """One DP=2 server for the module; the last test kills its replicas (which are not started
    again: test_data_parallel_restart.py)."""
    os.environ["LOCALCHAT_DP_TIMEOUT"] = str(HUNG_AFTER)
    os.environ["LOCALCHAT_DP_RESTARTS"] = "0"
    try:
        log = tmp_path_factory.mktemp("dp") / "serve.log"
        args = ("-dp", "2", "--threads", "1", "--kv-cache-memory", "128MiB")
        with serve_process(log, *args, "--max-model-len", "1024") as process:
            yield process
    finally:
        del os.environ["LOCALCHAT_DP_TIMEOUT"], os.environ["LOCALCHAT_DP_RESTARTS"]


def _metrics(server: ServeProcess) -> dict[str, dict[tuple, float]]:
    """sample name -> {sorted label items: value} of one /metrics scrape."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _per_replica(samples: dict, name: str) -> dict[str, float]:
    series = samples[f"localchat_replica_{name}"]
    return {dict(labels)["replica"]: value for labels, value in series.items()}


def _sample_name(name: str) -> str:
    return name if name.startswith("num_requests") else f"{name}_total"


def test_16_streams_complete_and_each_second_turn_hits_its_replicas_cache(server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=120)
    model = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]

    async def stream(messages: list[dict]) -> str:
        pieces = []
        chunks = await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        return "".join(pieces)

    async def turn(messages: list[dict]) -> tuple[str, int]:
        reply = await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        details = reply.usage.prompt_tokens_details
        return reply.choices[0].message.content or "", details.cached_tokens or 0

    conversations = [
        [
            {
                "role": "user",
                "content": f"Conversation {i}: remember the code word {i * 7919} and the color "
                f"number {i}; then tell me a short fact about the number {i * 13 + 5}.",
            }
        ]
        for i in range(16)
    ]

    async def main():
        replies = await asyncio.gather(*(stream(c) for c in conversations))
        assert all(replies), replies  # all 16 streams ran to the end with text
        before = _metrics(server)
        landed = []
        for conversation, reply in zip(conversations, replies, strict=True):
            conversation += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "And what was the code word?"},
            ]
            hits = _per_replica(_metrics(server), "prefix_cache_hits_total")
            _, cached = await turn(conversation)
            after = _per_replica(_metrics(server), "prefix_cache_hits_total")
            moved = {r: after[r] - hits[r] for r in after if after[r] != hits[r]}
            # one replica served it, from its cache: the first turn's prompt at least (the other
            # replica never saw this conversation's words, only the chat template's system prompt)
            assert len(moved) == 1 and list(moved.values()) == [cached], (moved, cached)
            assert cached >= 48
            landed.append(next(iter(moved)))
        await client.close()
        return before, landed

    before, landed = asyncio.run(main())
    assert set(landed) == {"0", "1"}  # the first turns were spread over both replicas
    routed = _metrics(server)["localchat_replica_routed_requests_total"]
    prefix_routed = sum(v for labels, v in routed.items() if ("route", "prefix") in labels)
    prefix_before = sum(
        v
        for labels, v in before["localchat_replica_routed_requests_total"].items()
        if ("route", "prefix") in labels
    )
    assert prefix_routed - prefix_before == 16


def test_metrics_sum_the_replicas(server):
    httpx.post(
        f"{server.base_url}/v1/completions",
        json={"prompt": "Hello there", "max_tokens": 3, "temperature": 0},
        timeout=60,
    ).raise_for_status()
    samples = _metrics(server)
    for name in SUMMED:
        total = samples[f"localchat_{_sample_name(name)}"][()]
        replicas = _per_replica(samples, _sample_name(name))
        assert set(replicas) == {"0", "1"}
        assert total == sum(replicas.values()), name
    assert samples["localchat_prompt_tokens_total"][()] > 0
    assert _per_replica(samples, "up") == {"0": 1.0, "1": 1.0}
    usage = samples["localchat_kv_cache_usage_perc"][()]
    assert 0.0 <= usage <= 1.0


def test_a_client_that_disconnects_aborts_its_request_in_the_replica(server):
    body = {"prompt": "1, 2, 3,", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        running = _per_replica(_metrics(server), "num_requests_running")
        assert sorted(running.values()) == [0.0, 1.0]
    deadline = time.monotonic() + 10
    while True:  # gone from the replica's batch, and from the router's count
        samples = _metrics(server)
        flight = _per_replica(samples, "requests_in_flight")
        running = _per_replica(samples, "num_requests_running")
        if set(flight.values()) == {0.0} and set(running.values()) == {0.0}:
            break
        assert time.monotonic() < deadline, (flight, running)
        time.sleep(0.1)
    assert samples["localchat_request_success_total"][(("finished_reason", "abort"),)] >= 1


def _stream_times(
    server: ServeProcess, prompt: str, times: list[float], answered: Answered
) -> None:
    body = {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    url = f"{server.base_url}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                times.append(time.monotonic())
                if answered.hang_up(times):
                    return


def test_embeddings_run_in_a_replicas_scheduler_beside_the_streams(server):
    """/v1/embeddings on a DP server: the replica queues the inputs in its scheduler, so the stream
    it runs (one on each replica) keeps producing tokens while they are computed, instead of
    stalling until they are done; the vectors are those each input gets alone."""
    inputs = [" ".join(f"item{i}-{j}" for j in range(70)) for i in range(4)]  # ~1400 tokens
    url = f"{server.base_url}/v1/embeddings"
    alone = [httpx.post(url, json={"input": t}, timeout=60).json()["data"][0] for t in inputs]
    run = beside_streams(
        2,
        lambda i, times, answered: _stream_times(server, f"Story {i}:", times, answered),
        lambda: httpx.post(url, json={"input": inputs}, timeout=120),
    )
    together = run.result
    assert together.status_code == 200, together.text
    # answered while both streams still had tokens to come (a replica that computed the inputs
    # only once its stream was done would answer after it); how long a stream waits meanwhile
    # is the machine's: benchmarks/embeddings_beside_streams.py measures it
    after = [sum(t > run.end for t in times) for times in run.streams]
    assert all(after), f"tokens the streams had left once the embeddings were answered: {after}"
    for got, expected in zip(together.json()["data"], alone, strict=True):
        assert np.allclose(got["embedding"], expected["embedding"], atol=1e-4)
    bad = httpx.post(url, json={"input": [[10**9]]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_embeddings_count_on_metrics_as_soon_as_they_are_answered(server):
    """A replica's stats reach the server before its vectors do: a scrape right after the answer
    already counts the prompts (they used to wait for the next one-second heartbeat)."""
    url = f"{server.base_url}/v1/embeddings"
    for words in (3, 40):
        before = _metrics(server)["localchat_prompt_tokens_total"][()]
        reply = httpx.post(url, json={"input": " ".join(["word"] * words)}, timeout=60)
        assert reply.status_code == 200, reply.text
        after = _metrics(server)["localchat_prompt_tokens_total"][()]
        assert after - before == reply.json()["usage"]["prompt_tokens"]


def _replica_pids(server: ServeProcess) -> dict[str, int]:
    found = re.findall(r"data-parallel replica (\d+) \(pid (\d+)\) ready", server.log())
    return {index: int(pid) for index, pid in found}


def _stream_until_failure(server: ServeProcess, kill) -> tuple[list[str], float]:
    """Stream a long completion, call `kill(replica)` once tokens flow, and read to the end."""
    body = {"prompt": "1, 2, 3,", "max_tokens": 900, "ignore_eos": True, "stream": True}
    events: list[str] = []
    started = 0.0
    with httpx.stream(
        "POST", f"{server.base_url}/v1/completions", json=body, timeout=120
    ) as response:
        for line in response.iter_lines():
            if not line:  # the blank line between events: without this, kill ran twice
                continue
            events.append(line)
            if len(events) == 3:
                flight = _per_replica(_metrics(server), "requests_in_flight")
                busy = [r for r, n in flight.items() if n == 1]
                assert len(busy) == 1, flight
                started = time.monotonic()
                kill(busy[0])
    return events, time.monotonic() - started


def test_a_grammar_that_fails_in_the_replicas_compile_is_a_400(server):
    """The replica answers `accepted` once the grammar compiled: a failed compile is the request's
    400 (stream or not)."""
    for stream in (False, True):
        body = {
            "prompt": "x",
            "max_tokens": 4,
            "stream": stream,
            "structured_outputs": {"grammar": "start: <[99999999]>"},
        }
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "structured_outputs"
    body = {"prompt": "x", "max_tokens": 4, "structured_outputs": {"grammar": 'start: "ok"'}}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert response.json()["choices"][0]["text"] == "ok"


def test_a_killed_or_hung_replica_is_a_clean_error_and_unhealthy_no_hang(server):
    pids = _replica_pids(server)
    assert set(pids) == {"0", "1"}
    events, took = _stream_until_failure(server, lambda r: os.kill(pids[r], signal.SIGKILL))
    assert took < 20
    assert events[-1] == "data: [DONE]"
    assert re.search(r"data-parallel replica \d failed: it exited with code -9", events[-2])
    health = httpx.get(f"{server.base_url}/health", timeout=10)
    assert health.status_code == 503
    assert "1 of 2 data-parallel replicas failed" in health.json()["detail"]
    samples = _metrics(server)
    assert sorted(_per_replica(samples, "up").values()) == [0.0, 1.0]
    # the other replica still serves
    short = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    reply = httpx.post(f"{server.base_url}/v1/completions", json=short, timeout=60)
    assert reply.status_code == 200, reply.text
    # a replica that stops answering (SIGSTOP) is declared hung after LOCALCHAT_DP_TIMEOUT
    events, took = _stream_until_failure(server, lambda r: os.kill(pids[r], signal.SIGSTOP))
    assert took < HUNG_AFTER + 15
    assert "hung" in events[-2] and events[-1] == "data: [DONE]"
    reply = httpx.post(f"{server.base_url}/v1/completions", json=short, timeout=30)
    assert reply.status_code == 503
    assert "no data-parallel replica is left" in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data-parallel-size", "0"], "--data-parallel-size must be >= 1"),
        (["-dp", "2", "--models", "a,b"], "does not go with --models"),
    ],
    ids=["below-one", "with-models"],
)
def test_a_size_below_one_or_with_several_models_is_refused(flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert message in result.stderr
