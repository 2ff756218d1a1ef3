"""A request's stream of deltas as an engine client hands it to asyncio: the per-request queue the
client fills (from its engine thread or its replicas' readers) and the RequestStream a caller
iterates. Leaving the `async for` early (break, exception, task cancellation, client disconnect)
aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localchat.engine.core.outputs import RequestOutput


@dataclass
class StreamState:
    """One request's queue of deltas (or the exception that ends it) on its event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)
    finished: bool = False
    interval: float = 0.0  # hand deltas over at most once per this many seconds (0: every step)
    sequences: int = 1  # the request's n: what it takes of the queue's bound
    held: list[RequestOutput] = field(default_factory=list)  # engine thread: waiting for next_at
    next_at: float = 0.0  # engine thread: when held deltas may go (monotonic clock)
    # settled with the prompt's ids (None: the caller's own) or its error, once the engine has it
    accepted: asyncio.Future[list[int] | None] | None = None


class Aborts(Protocol):
    """What a RequestStream needs of its engine."""

    def abort(self, request_id: str) -> None: ...


class RequestStream:
    """An accepted request: iterate it for delta RequestOutputs; `aclose()` (or leaving early)
    aborts it."""

    def __init__(
        self,
        engine: Aborts,
        request_id: str,
        stream: StreamState,
        prompt_token_ids: list[int],
    ):
        """`engine`: the client that took it (its `abort(request_id)` is called on leaving)."""
        self.engine = engine
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self._stream = stream

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while True:
                item = await self._stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    self._stream.finished = True
                    return
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if not self._stream.finished:
            self._stream.finished = True
            self.engine.abort(self.request_id)


def settle(future: asyncio.Future[Any], result: object) -> None:
    """Settle `future` (on its loop) with a result, or an exception to raise; once only."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def settle_from_thread(future: asyncio.Future[Any], result: object) -> None:
    """`settle` from another thread, on the future's own event loop."""
    with contextlib.suppress(RuntimeError):  # that event loop is closed
        future.get_loop().call_soon_threadsafe(settle, future, result)


QueueItems = list[
    tuple[asyncio.Queue[RequestOutput | BaseException], RequestOutput | BaseException]
]


def put_all(items: Iterable[tuple[asyncio.Queue[Any], object]]) -> None:
    """Put each item in its queue (on the queues' event loop)."""
    for target, item in items:
        target.put_nowait(item)


def put_all_from_thread(loop: asyncio.AbstractEventLoop, items: QueueItems) -> None:
    """`put_all` on `loop`, from another thread, in one callback."""
    with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody is listening
        loop.call_soon_threadsafe(put_all, items)
