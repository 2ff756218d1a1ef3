"""Online mode: the workload against any OpenAI-compatible server over streaming /v1/completions
(or, with `endpoint`, Anthropic's /v1/messages or OpenAI's /v1/responses: `online_text`).

Like `vllm bench serve`: requests are released at a Poisson rate (or all at once), at most
`concurrency` in flight; TTFT is the time to the first streamed chunk, ITL the gaps between chunks,
TPOT (latency - TTFT) / (output tokens - 1) with the token count from the final usage chunk
(`stream_options.include_usage`), or the chunk count when a server sends no usage. Prompts go as
token ids with `ignore_eos`, greedy, so each request produces exactly its requested number of
tokens. The text endpoints take the prompt as text (with `ignore_eos` too, localchat's extension
there): their token counts are the server's (see `online_text`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass

import httpx

from localchat.bench import online_messages, online_responses
from localchat.bench.offline import Advance, _noop
from localchat.bench.online_text import TextProtocol, send_text
from localchat.bench.records import RequestRecord, RunResult
from localchat.bench.workloads import BenchRequest
from localchat.client import APIError, AsyncClient
from localchat.errors import LocalchatError

# the text endpoints, by their --endpoint name; "completions" is /v1/completions with token ids
TEXT_ENDPOINTS: dict[str, TextProtocol] = {
    "messages": online_messages.PROTOCOL,
    "responses": online_responses.PROTOCOL,
}
ENDPOINTS = ("completions", *TEXT_ENDPOINTS)


@dataclass(frozen=True)
class OnlineOptions:
    """How online mode reaches the server and paces the requests: built once from the command
    line and passed through to the run."""

    url: str
    concurrency: int | None = None  # the most requests in flight (None: all of them)
    request_rate: float = math.inf  # Poisson arrivals per second (inf: all at once)
    model: str | None = None  # the model to name (None: the server's first in /v1/models)
    api_key: str | None = None
    timeout: float = 600.0  # seconds to wait for any one read
    endpoint: str = "completions"  # one of ENDPOINTS

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise LocalchatError(f"--concurrency must be >= 1, got {self.concurrency}")
        if not self.request_rate > 0:
            raise LocalchatError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if self.endpoint not in ENDPOINTS:
            raise LocalchatError(
                f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}"
            )

    @property
    def path(self) -> str:
        """Where the requests go, under the server's root."""
        text = TEXT_ENDPOINTS.get(self.endpoint)
        return text.path if text else "/v1/completions"

    def describe(self) -> str:
        mode = f"concurrency {self.concurrency}" if self.concurrency else "unbounded concurrency"
        if math.isfinite(self.request_rate):
            mode += f", {self.request_rate:g} req/s Poisson"
        return mode


async def served_model(client: AsyncClient) -> str:
    """The first model the server lists at /v1/models."""
    try:
        return (await client.models())[0]
    except (APIError, IndexError, KeyError, ValueError) as exc:
        reason = exc.describe() if isinstance(exc, APIError) else f"{type(exc).__name__}: {exc}"
        raise LocalchatError(
            f"cannot list the models of {client.base_url} ({reason}); is the server up? "
            "(or name the model with --served-model-name)"
        ) from None


async def _send(
    client: AsyncClient,
    endpoint: str,
    request: BenchRequest,
    record: RequestRecord,
    advance: Advance,
) -> None:
    """One streamed request; every chunk's arrival is timed into `record`, a failure kept in
    `record.error`."""
    if (text := TEXT_ENDPOINTS.get(endpoint)) is not None:
        if request.prompt_text is None:
            raise LocalchatError(f"--endpoint {endpoint} needs the prompts as text")
        await send_text(client, text, request.prompt_text, request.output_len, record, advance)
        return
    record.start = time.perf_counter()
    try:
        async for delta in client.complete(
            request.prompt_token_ids,
            stream=True,
            max_tokens=request.output_len,
            ignore_eos=True,
            temperature=0.0,
        ):
            if delta.usage is not None:
                record.num_output_tokens = delta.usage.completion_tokens
                continue
            record.token_times.append(time.perf_counter())
            advance(1)
    except APIError as exc:
        record.error = (f"HTTP {exc.status}: {exc.message}" if exc.status else exc.message)[:300]
        return
    except ValueError as exc:  # a chunk that is not JSON
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    if not record.token_times:
        record.error = "the stream ended without any output"


async def _run(
    options: OnlineOptions, requests: list[BenchRequest], seed: int, advance: Advance
) -> RunResult:
    concurrency, request_rate = options.concurrency, options.request_rate
    limits = httpx.Limits(
        max_connections=concurrency or len(requests) + 1, max_keepalive_connections=None
    )
    async with AsyncClient(
        options.url,
        api_key=options.api_key,
        model=options.model,
        timeout=httpx.Timeout(options.timeout, connect=10.0),
        limits=limits,
    ) as client:
        client.model = options.model or await served_model(client)
        # one short request first (as vllm bench serve does): fails fast on a wrong URL, warms the
        # server
        probe = RequestRecord(1, 2)
        first = requests[0]
        short = BenchRequest(
            first.prompt_token_ids[:8], 2, first.prompt_text and first.prompt_text[:32]
        )
        await _send(client, options.endpoint, short, probe, _noop)
        if probe.error:
            raise LocalchatError(
                f"the test request to {client.root_url}{options.path} failed: {probe.error}"
            )
        records = [RequestRecord(len(r.prompt_token_ids), r.output_len) for r in requests]
        gate = asyncio.Semaphore(concurrency) if concurrency else None
        rng = random.Random(seed)

        async def one(request: BenchRequest, record: RequestRecord) -> None:
            if gate is None:
                await _send(client, options.endpoint, request, record, advance)
                return
            async with gate:
                await _send(client, options.endpoint, request, record, advance)

        start = time.perf_counter()
        tasks = []
        for index, (request, record) in enumerate(zip(requests, records, strict=True)):
            if index and math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.create_task(one(request, record)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    label = f"{client.model} @ {client.root_url}{options.path} ({options.describe()})"
    return RunResult("server", label, records, duration)


def run_online(
    options: OnlineOptions,
    requests: list[BenchRequest],
    *,
    seed: int = 0,
    advance: Advance = _noop,
) -> RunResult:
    """Send the requests and time every streamed chunk; failures are counted, not raised."""
    return asyncio.run(_run(options, requests, seed, advance))
