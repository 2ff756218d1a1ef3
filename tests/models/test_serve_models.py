"""`localchat serve-models`: two models behind one server, picked by the request's `model`, loaded
on first use and evicted least-recently-used under --max-loaded-models 1."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.models.conftest import ST_NAME, ST_REPO
from tests.models.test_registry import _hand_made_cache

DEFAULT = "smollm2-135m-instruct:q4_1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.fixture
def server(hub_cache, tiny_llama_files, tmp_path):
    _hand_made_cache(hub_cache, ST_REPO, tiny_llama_files)
    port = _free_port()
    command = [sys.executable, "-m", "localchat", "serve-models", f"{DEFAULT},{ST_NAME}"]
    command += ["--max-loaded-models", "1", "--port", str(port), "--kv-cache-memory", "32MiB"]
    command += ["--max-model-len", "256", "--threads", "1"]
    log = (tmp_path / "serve.log").open("w")  # open while the server runs
    process = subprocess.Popen(command, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
        time.sleep(0.2)
    yield url, process
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def test_two_models_one_server(server, cli):
    url, process = server
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == [DEFAULT, ST_NAME]
    assert not any(m["loaded"] for m in models)
    rss = asyncio.run(_scenario(url, process.pid))
    # eviction gives the memory back: after a swap out and back, a model's RSS is within 10% of
    # what it was (an engine left behind would add its weights and KV pool, over 10%); the first
    # load is not the baseline, as the allocator keeps some of the heap it grew
    assert rss[4] <= rss[2] * 1.10 and rss[5] <= rss[3] * 1.10, rss
    loaded = [m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["loaded"]]
    assert [m["id"] for m in loaded] == [ST_NAME]
    table = [line.split() for line in cli("ps", "--url", url).stdout.splitlines()]
    assert table[0] == ["NAME", "LOADED", "CONTEXT", "IDLE"]
    assert table[1][:2] == [DEFAULT, "no"] and table[2][:3] == [ST_NAME, "yes", "256"]
    down = cli("ps", "--url", "http://127.0.0.1:9")
    assert down.exit_code == 2 and "no localchat server answered" in down.stderr


async def _scenario(url: str, pid: int) -> list[float]:
    from openai import AsyncOpenAI, NotFoundError

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)

    async def ask(model: str) -> str:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0
        )
        assert reply.model == model
        return reply.choices[0].message.content or ""

    # interleaved: every request succeeds, the engines swapped as needed
    replies = await asyncio.gather(*(ask(m) for m in [DEFAULT, ST_NAME] * 3))
    # (not compared with each other: a batch's greedy text may differ from a lone request's)
    assert len(replies) == 6 and all(replies)
    with pytest.raises(NotFoundError, match="does not exist"):
        await ask("no-such-model")
    rss = []
    for model in [DEFAULT, ST_NAME] * 3:
        await ask(model)
        rss.append(_rss_mib(pid))
    await client.close()
    return rss
