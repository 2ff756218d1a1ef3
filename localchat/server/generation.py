"""Running requests on the AsyncEngine for a handler: queue them, follow their deltas, record
metrics.

A completions request with several prompts becomes one engine request per prompt, merged here; every
way out of a handler (finish, error, client disconnect, cancellation) closes the engine streams,
which aborts whatever still runs and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

from localchat.engine.core.multimodal import ImageInput
from localchat.engine.core.outputs import RequestOutput
from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from localchat.engine.core.engine_client import EngineClient
    from localchat.engine.core.request_stream import RequestStream


class ClientDisconnected(Exception):
    """The HTTP client went away before its response was ready."""


class Tracker:
    """Metrics of one engine request: inter-delta latency as deltas arrive, TTFT/e2e/reason at the
    end."""

    __slots__ = ("done", "last", "metrics", "reason")

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.last: float | None = None
        self.reason: str | None = None
        self.done = False

    def on_delta(self, delta: RequestOutput) -> None:
        now = time.monotonic()
        if self.last is not None:
            self.metrics.itl.observe(now - self.last)
        self.last = now
        for out in delta.outputs:
            if out.finish_reason is not None:
                self.reason = out.finish_reason
        if delta.finished:
            self.done = True
            self.metrics.finished(self.reason)
            timing = delta.metrics
            if timing is not None and timing.first_token_time is not None:
                self.metrics.ttft.observe(timing.first_token_time - timing.arrival_time)
                self.metrics.e2e.observe((timing.finished_time or now) - timing.arrival_time)

    def close(self) -> bool:
        """Count a request that ended without its final delta (the client left, the engine
        failed)."""
        if self.done:
            return False
        self.done = True
        self.metrics.finished("abort")
        return True


class Generation:
    """The engine requests behind one HTTP request (one per prompt), with their usage and
    metrics."""

    def __init__(
        self, engine: EngineClient, metrics: ServerMetrics, request_id: str, params: SamplingParams
    ):
        self.engine, self.metrics, self.request_id, self.params = (
            engine,
            metrics,
            request_id,
            params,
        )
        self.streams: list[RequestStream] = []
        self.trackers: list[Tracker] = []
        self.prompt_tokens = 0
        self.cached_tokens: list[int] = []
        self.completion_tokens = 0
        self.aborted = False

    async def start(
        self, prompts: list[str | list[int]], images: tuple[ImageInput, ...] = ()
    ) -> None:
        """Queue every prompt (each with `images`, its pictures, if any); if one is refused, abort
        those already queued and raise its error."""
        try:
            for position, prompt in enumerate(prompts):
                request_id = (
                    self.request_id if len(prompts) == 1 else f"{self.request_id}-{position}"
                )
                if images:  # a test's fake engine takes none
                    stream = await self.engine.add_request(
                        prompt, self.params, request_id, images=images
                    )
                else:
                    stream = await self.engine.add_request(prompt, self.params, request_id)
                self.streams.append(stream)
                self.trackers.append(Tracker(self.metrics))
                self.cached_tokens.append(0)
                self.prompt_tokens += len(stream.prompt_token_ids)
        except BaseException:
            await self.close()
            raise

    async def deltas(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt position, delta) pairs as the engine produces them; counts tokens and metrics on
        the way."""
        try:
            async for position, delta in self._merged():
                self.trackers[position].on_delta(delta)
                self.cached_tokens[position] = delta.num_cached_tokens
                for out in delta.outputs:
                    self.completion_tokens += len(out.token_ids)
                yield position, delta
        finally:
            await self.close()

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if len(self.streams) == 1:
            async for delta in self.streams[0]:
                yield 0, delta
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(position: int, stream: RequestStream) -> None:
            try:
                async for delta in stream:
                    queue.put_nowait((position, delta))
                queue.put_nowait((position, None))
            except Exception as exc:
                queue.put_nowait((position, exc))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                position, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield position, item
        finally:
            for task in tasks:
                task.cancel()

    async def close(self) -> None:
        """Abort what still runs (a no-op for finished requests) and count it."""
        for stream in self.streams:
            await stream.aclose()
        for tracker in self.trackers:
            self.aborted |= tracker.close()

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(self.cached_tokens)},
        }

    async def collect(self) -> dict[int, RequestOutput]:
        """Run to the end; per prompt position, its whole output (the deltas folded by
        RequestOutput.merge). A choice's response index is `position * n + output.index`."""
        results: dict[int, RequestOutput] = {}
        async for position, delta in self.deltas():
            if position in results:
                results[position].merge(delta)
            else:
                results[position] = delta
        return results


async def until_disconnect(receive, work: Awaitable):
    """Await `work`, cancelling it (and so aborting its engine requests) if the client disconnects
    first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
