"""Online mode: the workload against any OpenAI-compatible server over streaming /v1/completions.

Like `vllm bench serve`: requests are released at a Poisson rate (or all at once), at most `concurrency`
in flight; TTFT is the time to the first streamed chunk, ITL the gaps between chunks, TPOT
(latency - TTFT) / (output tokens - 1) with the token count from the final usage chunk
(`stream_options.include_usage`), or the chunk count when a server sends no usage. Prompts go as token
ids with `ignore_eos`, greedy, so each request produces exactly its requested number of tokens.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import httpx

from localchat.bench.offline import Advance, _noop
from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest
from localchat.errors import LocalchatError
from localchat.sse import aiter_chunks, error_message


def api_base(url: str) -> str:
    """'http://host:8000', '.../v1' or '.../v1/completions' -> 'http://host:8000/v1'."""
    base = url.rstrip("/")
    base = base.removesuffix("/completions").removesuffix("/chat").rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    return base if base.endswith("/v1") else base + "/v1"


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def served_model(client: httpx.AsyncClient, base: str, api_key: str | None) -> str:
    """The first model the server lists at /v1/models."""
    try:
        response = await client.get(f"{base}/models", headers=_headers(api_key), timeout=10)
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise LocalchatError(f"cannot list the models of {base} ({exc}); is the server up? "
                             "(or name the model with --served-model-name)") from None


async def _send(client: httpx.AsyncClient, base: str, payload: dict, record: RequestRecord, api_key: str | None,
                advance: Advance) -> None:
    record.start = time.perf_counter()
    try:
        async with client.stream("POST", f"{base}/completions", json=payload, headers=_headers(api_key)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:300]}"
                return
            async for chunk in aiter_chunks(response):
                if (message := error_message(chunk)) is not None:
                    record.error = message[:300]
                    return
                if chunk.get("choices"):
                    record.token_times.append(time.perf_counter())
                    advance(1)
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    record.num_output_tokens = int(usage["completion_tokens"])
    except (httpx.HTTPError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    if not record.token_times:
        record.error = "the stream ended without any output"


def _payload(model: str, request: BenchRequest) -> dict:
    return {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.output_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


async def _run(url: str, requests: list[BenchRequest], *, concurrency: int | None, request_rate: float, seed: int,
               model: str | None, api_key: str | None, timeout: float, advance: Advance) -> RunResult:
    base = api_base(url)
    limits = httpx.Limits(max_connections=concurrency or len(requests) + 1, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as client:
        model = model or await served_model(client, base, api_key)
        # one short request first (as vllm bench serve does): fails fast on a wrong URL, warms the server
        probe = RequestRecord(1, 2)
        await _send(client, base, _payload(model, BenchRequest(requests[0].prompt_token_ids[:8], 2)), probe,
                    api_key, _noop)
        if probe.error:
            raise LocalchatError(f"the test request to {base}/completions failed: {probe.error}")
        records = [RequestRecord(len(r.prompt_token_ids), r.output_len) for r in requests]
        gate = asyncio.Semaphore(concurrency) if concurrency else None
        rng = random.Random(seed)

        async def one(request: BenchRequest, record: RequestRecord) -> None:
            if gate is None:
                await _send(client, base, _payload(model, request), record, api_key, advance)
                return
            async with gate:
                await _send(client, base, _payload(model, request), record, api_key, advance)

        start = time.perf_counter()
        tasks = []
        for index, (request, record) in enumerate(zip(requests, records)):
            if index and math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.create_task(one(request, record)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    mode = f"concurrency {concurrency}" if concurrency else "unbounded concurrency"
    if math.isfinite(request_rate):
        mode += f", {request_rate:g} req/s Poisson"
    return RunResult("server", f"{model} @ {base} ({mode})", records, duration)


def run_online(url: str, requests: list[BenchRequest], *, concurrency: int | None = None,
               request_rate: float = math.inf, seed: int = 0, model: str | None = None, api_key: str | None = None,
               timeout: float = 600.0, advance: Advance = _noop) -> RunResult:
    """Send the requests and time every streamed chunk; failures are counted, not raised."""
    if concurrency is not None and concurrency < 1:
        raise LocalchatError(f"--concurrency must be >= 1, got {concurrency}")
    if not request_rate > 0:
        raise LocalchatError(f"--request-rate must be > 0 (or inf), got {request_rate}")
    return asyncio.run(_run(url, requests, concurrency=concurrency, request_rate=request_rate, seed=seed,
                            model=model, api_key=api_key, timeout=timeout, advance=advance))
