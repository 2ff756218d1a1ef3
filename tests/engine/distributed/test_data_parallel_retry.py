"""A DP=2 server whose replicas run one sequence each: when a replica dies (killed with SIGKILL),
the requests its engine had accepted fail clearly and are not sent to the other replica (one of
them may be what killed it), the one waiting for a first token as well as the one streaming; the
next request is served by the other replica."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.engine.distributed.test_data_parallel import _metrics, _per_replica, _replica_pids
from tests.engine.distributed.test_data_parallel_failover import _prompt
from tests.serve_process import ServeProcess, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ARGS = ("-dp", "2", "--threads", "1", "--max-num-seqs", "1", "--kv-cache-memory", "64MiB")


def _complete(server: ServeProcess, prompt: list[int]) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=120)


def _wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_requests_a_dead_replica_had_accepted_fail_and_are_not_sent_on(default_gguf, tmp_path):
    with serve_process(tmp_path / "serve.log", *ARGS, "--max-model-len", "1024") as server:
        pids = _replica_pids(server)
        prompt = _prompt(40, seed=30)
        before = _per_replica(_metrics(server), "prompt_tokens_total")
        first = _complete(server, prompt)
        assert first.status_code == 200, first.text
        after = _per_replica(_metrics(server), "prompt_tokens_total")
        (holder,) = [r for r in after if after[r] != before[r]]
        other = "1" if holder == "0" else "0"

        # a long stream on the holder (routed there by the shared prefix) fills its one seat
        events: list[str] = []
        flowing = threading.Event()

        def stream() -> None:
            body = {"prompt": [*prompt, 7, 8, 9], "max_tokens": 900, "ignore_eos": True}
            with httpx.stream(
                "POST",
                f"{server.base_url}/v1/completions",
                json={**body, "temperature": 0, "stream": True},
                timeout=120,
            ) as response:
                for line in response.iter_lines():
                    if line:
                        events.append(line)
                        if len(events) == 3:
                            flowing.set()

        streamer = threading.Thread(target=stream)
        streamer.start()
        assert flowing.wait(60)
        assert _per_replica(_metrics(server), "requests_in_flight")[holder] == 1
        # the same prompt again: routed to the holder, accepted there, waiting for the seat
        replies: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: replies.append(_complete(server, prompt)))
        waiter.start()
        _wait_for(
            lambda: _per_replica(_metrics(server), "num_requests_waiting")[holder] == 1,
            "the second request never waited in the holder's engine",
        )
        os.kill(pids[holder], signal.SIGKILL)
        streamer.join(timeout=60)
        waiter.join(timeout=60)
        assert not streamer.is_alive() and not waiter.is_alive()

        failure = f"data-parallel replica {holder} failed: it exited with code -9"
        not_retried = "this request was running there and is not retried"
        assert replies[0].status_code == 503, replies[0].text
        message = replies[0].json()["error"]["message"]
        assert failure in message and not_retried in message
        assert failure in events[-2] and not_retried in events[-2]
        assert events[-1] == "data: [DONE]"
        assert "retried on" not in server.log()

        before = _per_replica(_metrics(server), "prompt_tokens_total")
        again = _complete(server, prompt)
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        after = _per_replica(_metrics(server), "prompt_tokens_total")
        assert after[other] > before[other]
